#!/usr/bin/env bash
# The regression gate of `aiayn bench --baseline` as a user meets it, from outside the checkout:
#
#   1. a package `mypkg` with an attention class `Mine` (the NumPy built-in's Eq. (1), wrapped) is
#      benchmarked five times, each run saved as a baseline;
#   2. the same code against the first baseline (the rank test on its rounds), then against all five
#      (the run as the unit): expected exit 0 both times;
#   3. `Mine` edited to do 30% more work per call (Eq. (1) again on 30% of the query rows): expected
#      exit 1 both ways, naming the cases;
#   4. the baseline edited to say it ran on another NumPy build: expected exit 4, in one line.
#
# Timing on a shared machine: run it when the machine is otherwise idle (the load average is printed).
# AIAYN (default: the aiayn on PATH) is the command; SIZES the sequence lengths (default 512).
set -euo pipefail
AIAYN=${AIAYN:-aiayn}
SIZES=${SIZES:-512}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/mypkg"
cd "$work"
touch mypkg/__init__.py
write_mine() {  # $1: the fraction of extra work per call
  cat > mypkg/attention.py <<EOF
from aiayn.implementations.registry import load

EXTRA = $1


class Mine:
    """Someone's attention: the NumPy built-in's Eq. (1), with EXTRA more work per call when EXTRA > 0."""

    def __init__(self):
        self._inner = load("numpy")

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        out = self._inner.scaled_dot_product_attention(q, k, v, mask)
        rows = round(EXTRA * q.shape[-2])
        if rows:
            self._inner.scaled_dot_product_attention(q[..., :rows, :], k, v, None if mask is None else mask[:rows])
        return out
EOF
}
bench() {  # the user's command; prints its exit status
  set +e
  PYTHONPATH="$work" "$AIAYN" bench mypkg.attention:Mine --sizes "$SIZES" --dtypes float32 --passes forward \
    --out "$work/out" "$@" -- -q > "$work/log" 2>&1
  status=$?
  set -e
  grep -E "regressed|REGRESSED|not compared|baseline from|no case" "$work/log" | sed 's/^/    /' || true
  echo "    exit $status (load average $(cut -d' ' -f1-3 /proc/loadavg))"
}
write_mine 0
echo "1. five baseline runs of the unchanged code"
for i in 1 2 3 4 5; do bench --save "base-$i.json"; done
cp base-1.json base.json
echo "2. the same code against one of them, then against all five (expected exit 0, exit 0)"
bench --baseline base.json
bench --baseline base-?.json
write_mine 0.3
echo "3. a copy doing 30% more work per call, against one, then five (expected exit 1, exit 1)"
bench --baseline base.json
bench --baseline base-?.json
write_mine 0
python3 - <<'EOF'
import json
run = json.load(open("base.json"))
run["aiayn"]["libraries"]["numpy"] = "1.26.4"  # as if the baseline ran on another NumPy build
json.dump(run, open("other-build.json", "w"))
EOF
echo "4. the unchanged code against a baseline from another NumPy build (expected exit 4)"
bench --baseline other-build.json
