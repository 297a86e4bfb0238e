"""A hang is paid once per method (``conformance/isolation.py``): once a call of a method has run past the time
limit, every later call of that method in the run fails at once, naming the first hang and its replay file.

- the method of a call is read from the harness's description of it, and the implementation's spec keys it;
- a worker sees a hang the controller marked (``hung.json``) at its next call, and keeps seeing it when the
  mark changes within the resolution of the file's timestamps;
- a run of the suite on an implementation whose ``softmax`` hangs ends after one limit per worker, fails the
  softmax checks as hangs that name the first one, and passes the other equations: in the pytest process
  (``--workers 0``, SIGALRM) and in worker processes (the watchdog ends a worker, the controller marks the hang).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _aiayn_check import aiayn_check

from aiayn.conformance import isolation
from aiayn.conformance.isolation import CallTimedOut

TESTS = Path(__file__).resolve().parent
LIMIT_S = 3.0  # the per-call limit of the runs below; the hanging softmax sleeps 30 s (tests/hanging_impl.py)
SELECTION = "(test_softmax or test_layer_norm) and not gradient"  # 10 checks that reach softmax, 8 that do not


def _case(name: str = "mine", dtype: str = "float32") -> Any:
    return SimpleNamespace(
        impl=SimpleNamespace(name=name), dtype=dtype, check="softmax", equation="softmax", title="softmax (§3.2.1)"
    )


@pytest.mark.parametrize(
    ("what", "method"),
    [
        ("mine.softmax(<float32 (2, 3)>, -1)", "softmax"),
        ("mine.multi_head_attention(<float64 (1, 2, 4)>, <float64 (1, 2, 4)>)", "multi_head_attention"),
        ("from_numpy(<float64 (2, 3)>, 'float32')", "from_numpy"),
        ("to_numpy(mine.softmax(...))", "to_numpy"),
    ],
)
def test_the_method_of_a_call_is_read_from_its_description(what: str, method: str) -> None:
    assert isolation.method_of(_case(), what) == method


def test_a_worker_sees_every_hang_the_controller_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Marks written one after the other, faster than timestamps tick, are each seen at the next call."""
    uid = f"test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(isolation, "record_dir", lambda testrunuid: tmp_path / testrunuid)
    monkeypatch.setattr(isolation._STATE, "hung_file", tmp_path / uid / "hung.json")
    monkeypatch.setattr(isolation._STATE, "hung", {})
    monkeypatch.setattr(isolation._STATE, "hung_seen", None)
    monkeypatch.setattr(isolation._STATE, "test", {"spec": "pkg:Mine"})
    monkeypatch.setattr(isolation._STATE, "directory", None)  # no slot: the calls below are not recorded

    def call(what: str) -> None:
        with isolation.calling(_case(dtype="float64"), what, lambda case, path: path):
            pass

    call("mine.softmax(<float64 (2, 3)>, -1)")  # nothing hung yet: the call is made
    first = {"spec": "pkg:Mine", "test": "test_softmax", "nodeid": "t.py::test_softmax[mine-float32]"}
    first |= {"dtype": "float32", "check": "softmax", "call": "mine.softmax(<float32 (4, 5)>, -1)", "limit_s": 2.0}
    isolation.mark_hung(uid, {**first, "method": "softmax"}, "/x/first.npz")
    with pytest.raises(CallTimedOut) as raised:
        call("mine.softmax(<float64 (1, 2)>, -1)")  # another dtype, another shape: not called either
    message = str(raised.value)
    assert "was not called" in message and "t.py::test_softmax[mine-float32]" in message, message
    assert "within 2 s" in message and "aiayn replay /x/first.npz" in message, message
    call("mine.layer_norm(<float64 (2, 3)>)")  # another method still runs
    isolation.mark_hung(uid, {**first, "method": "layer_norm"}, None)  # at once: the same timestamp tick, likely
    with pytest.raises(CallTimedOut):
        call("mine.layer_norm(<float64 (2, 3)>)")
    isolation.mark_hung(uid, {**first, "method": "softmax", "test": "a later hang"}, None)
    marks = json.loads((tmp_path / uid / "hung.json").read_text())
    assert marks["pkg:Mine softmax"]["test"] == "test_softmax", "the first hang of a method is the one named"


def test_a_hang_in_the_pytest_process_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without workers the alarm ends the first call and the method's later calls are not made."""
    monkeypatch.setattr(isolation._STATE, "limit", 0.2)
    monkeypatch.setattr(isolation._STATE, "directory", None)
    monkeypatch.setattr(isolation._STATE, "hung_file", None)
    monkeypatch.setattr(isolation._STATE, "hung", {})
    monkeypatch.setattr(isolation._STATE, "test", {"spec": "pkg:Mine", "nodeid": "t.py::test_softmax[mine-float64]"})
    case = _case()
    case.timeout_message = lambda what, limit: f"{what} hung\n  replay: aiayn replay /x/hang.npz"
    start = time.monotonic()
    with pytest.raises(CallTimedOut), isolation.calling(case, "mine.softmax(<float32 (2, 3)>, -1)", None):
        time.sleep(30)
    with pytest.raises(CallTimedOut) as raised, isolation.calling(case, "mine.softmax(<float32 (1,)>, 0)", None):
        time.sleep(30)
    assert time.monotonic() - start < 10, "the second call waited for the limit"
    assert "t.py::test_softmax[mine-float64]" in str(raised.value) and "/x/hang.npz" in str(raised.value)


def _check(tmp_path: Path, workers: int) -> tuple[subprocess.CompletedProcess[str], float, dict[str, Any]]:
    args = ["hanging_impl:SlowSoftmax", f"--workers={workers}", f"--timeout={LIMIT_S:g}", "--profile=smoke"]
    args += ["-k", SELECTION, f"--report={tmp_path / 'r'}"]
    start = time.monotonic()
    proc = aiayn_check(tmp_path, *args, AIAYN_FAILURES=str(tmp_path / "failures"))
    elapsed = time.monotonic() - start
    data = json.loads((tmp_path / "r" / "conformance-slow-numpy.json").read_text())
    return proc, elapsed, data


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hanging_method_costs_one_limit_per_worker(tmp_path: Path, workers: int) -> None:
    proc, elapsed, data = _check(tmp_path, workers)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-4000:]}"
    hangs = set(re.findall(r"softmax\(<[^\n]*\) did not return within 3 s", out))
    assert 1 <= len(hangs) <= max(1, workers), f"{len(hangs)} calls waited for the limit:\n{out[-4000:]}"
    rows = {(r["equation"], r["dtype"]): r for r in data["rows"] if r["direction"] == "forward"}
    assert re.search(r"\b10 failed, 8 passed\b", out), f"not every softmax check failed:\n{out[-4000:]}"
    skipped = re.findall(r"was not called: softmax of hanging_impl:SlowSoftmax already hung in this run", out)
    assert len(skipped) >= 10 - len(hangs), f"{len(hangs)} hangs, {len(skipped)} calls not made:\n{out[-4000:]}"
    named = set(re.findall(r"replay of the first hang: aiayn replay (\S+\.npz)", out))
    assert named and all(Path(p).exists() for p in named), f"first hang's replay file missing: {named}"
    for dtype in ("float64", "float32"):
        assert rows["softmax", dtype]["status"] == "fail", rows["softmax", dtype]
        assert rows["softmax", dtype]["measure"] == "hang (time limit)", rows["softmax", dtype]
        assert rows["layer_norm", dtype]["status"] == "pass", rows["layer_norm", dtype]
    # one limit per worker, not one per check (10 x 3 s); startup, collection and worker restarts take the rest
    assert elapsed < 40, f"the run took {elapsed:.0f} s"
