"""Rerun one failed check from its saved inputs: ``python -m conformance.replay FILE.npz [--impl SPEC]``.

A failing check saves its inputs under ``.aiayn-cache/failures/`` (or ``$AIAYN_FAILURES``) and
prints this command. The file names the implementation (as given to ``--impl``), the dtype and
the check; ``--impl`` overrides the implementation (e.g. to try a fix under another name).
Exit status 0 when the check passes now, 1 when it fails (the message is printed).
"""

from __future__ import annotations

import argparse
import sys

from conformance.checks import load_all
from conformance.harness import CHECKS, ConformanceFailure, load_case, register_spec
from implementations import registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.replay", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="failure files (.npz) written by the conformance suite")
    parser.add_argument("--impl", default=None, help="check this implementation instead of the one recorded in the file")
    args = parser.parse_args(argv)
    load_all()
    status = 0
    for path in args.files:
        spec, dtype, name, inputs = load_case(path)
        spec = args.impl or spec
        impl = registry.load(spec)
        register_spec(impl, spec)
        try:
            CHECKS[name](impl, dtype, **inputs)
        except ConformanceFailure as failure:
            print(f"FAIL {path}\n{failure}")
            status = 1
        else:
            print(f"PASS {path}: check {name} of {spec} in {dtype}")
    return status


if __name__ == "__main__":
    sys.exit(main())
