"""A hang is paid once per method (``conformance/run/isolation.py``): once a call of a method has run past the time
limit, every later call of that method in the run fails at once, naming the first hang and its replay file.

- the method of a call is read from the harness's description of it, and the implementation's spec keys it;
- a worker sees a hang the controller marked (``hung.json``) at its next call, and keeps seeing it when the
  mark changes within the resolution of the file's timestamps;
- a run of the suite on an implementation whose ``softmax`` hangs ends after one limit per worker, fails the
  softmax checks as hangs that name the first one, and passes the other equations: in the pytest process
  (``--workers 0``, SIGALRM) and in worker processes (the watchdog ends a worker, the controller marks the hang);
- two workers ended together (both first checks hang) still give the report, however late the controller sees
  their ends (``plugin.pytest_xdist_make_scheduler``).
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

from aiayn.conformance.run import isolation
from aiayn.conformance.run.isolation import CallTimedOut

pytestmark = pytest.mark.slow  # make test-slow (CI's .ci/run runs it): minutes, not seconds

TESTS = Path(__file__).resolve().parent
LIMIT_S = 3.0  # the per-call limit of the runs below; the hanging softmax sleeps 30 s (tests/hanging_impl.py)
# 10 checks that reach softmax, 8 that do not
SELECTION = "(test_softmax or test_layer_norm) and not gradient and not batch_invariant"


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


def _explained(proc: subprocess.CompletedProcess[str], elapsed: float) -> str:
    """The nested run's exit status, time and the ends of its stdout and stderr, for a failure message."""
    return (
        f"aiayn check exited {proc.returncode} after {elapsed:.0f} s\n"
        f"--- stdout (last 6000 characters) ---\n{proc.stdout[-6000:]}\n"
        f"--- stderr (last 4000 characters) ---\n{proc.stderr[-4000:]}"
    )


def _check(
    tmp_path: Path, workers: int, *pytest_args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], str, dict[str, Any]]:
    """Run the selection on the hanging implementation; (the run, its explanation, its report's JSON)."""
    args = ["hanging_impl:SlowSoftmax", f"--workers={workers}", f"--timeout={LIMIT_S:g}", "--profile=smoke"]
    args += ["-k", SELECTION, f"--report={tmp_path / 'r'}", "--", "--durations=0", "--durations-min=0", *pytest_args]
    start = time.monotonic()
    folders = {"AIAYN_FAILURES": str(tmp_path / "failures"), "AIAYN_CACHE": str(tmp_path / "cache")}
    proc = aiayn_check(tmp_path, *args, **folders, **env)
    why = _explained(proc, time.monotonic() - start)
    report = tmp_path / "r" / "conformance-slow-numpy.json"
    assert report.exists(), f"no report written ({report.name} missing); {why}"
    return proc, why, json.loads(report.read_text())


#: A check whose softmax calls are refused at once takes milliseconds (at most 0.13 s here, under 4 busy processes per
#: core: it draws one example and its first call raises); one that waited for the limit takes LIMIT_S. The 20x between
#: them covers the load ``make test`` puts on 2 cores (this run's controller and 2 workers beside the other pytest
#: worker: 4 busy processes, 2 per core) with room to spare.
WAITED_S = LIMIT_S


def _failed_checks(out: str, what: str) -> set[str]:
    """The checks (test ids) whose failure says ``what``, from the line the plugin prints as each check fails."""
    return {m[1] for m in re.finditer(r"^aiayn: FAILED (\S.*?\]): (.*)$", out, re.MULTILINE) if what in m[2]}


def _call_durations(out: str) -> dict[str, float]:
    """pytest's --durations lines of the call phase: test id -> seconds (a worker the watchdog ended has none)."""
    return {m[2]: float(m[1]) for m in re.finditer(r"^(\d+(?:\.\d+)?)s call +(\S[^\n]*?) *$", out, re.MULTILINE)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hanging_method_costs_one_limit_per_worker(tmp_path: Path, workers: int) -> None:
    proc, why, data = _check(tmp_path, workers)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, why
    assert re.search(r"\b10 failed, 8 passed\b", out), f"not every softmax check failed; {why}"
    hangs = _failed_checks(out, "did not return within 3 s")
    assert 1 <= len(hangs) <= max(1, workers), f"{len(hangs)} checks waited for the limit: {sorted(hangs)}; {why}"
    refused = _failed_checks(out, "was not called: softmax of hanging_impl:SlowSoftmax already hung in this run")
    assert len(refused | hangs) == 10, f"{len(hangs)} hangs, {len(refused)} checks refused at once; {why}"
    named = set(re.findall(r"replay of the first hang: aiayn replay (\S+\.npz)", out))
    assert named and all(Path(p).exists() for p in named), f"first hang's replay file missing: {named}; {why}"
    rows = {(r["equation"], r["dtype"]): r for r in data["rows"] if r["direction"] == "forward"}
    for dtype in ("float64", "float32"):
        assert rows["softmax", dtype]["status"] == "fail", rows["softmax", dtype]
        assert rows["softmax", dtype]["measure"] == "hang (time limit)", rows["softmax", dtype]
        assert rows["layer_norm", dtype]["status"] == "pass", rows["layer_norm", dtype]
    # one limit per worker, not one per check (10 x 3 s): the refused checks' own durations (pytest's), so that the
    # time the run spends starting, collecting and replacing workers on a loaded machine does not enter
    durations = _call_durations(out)
    slow = {test: durations.get(test) for test in refused if durations.get(test, WAITED_S) >= WAITED_S}
    assert not slow, f"checks refused at once took the limit or were not timed: {slow}; {why}"


#: In the environment of a nested run that loads this module as a plugin (``-p test_hang_once``): by how many seconds
#: its controller sees each worker's unexpected end late (:func:`pytest_configure`).
SLOW_END = "HANG_ONCE_SLOW_END_S"
#: The delay of the test below. The two workers' first checks reach their hanging call within the time their first
#: few examples take, so the limit ends them that far apart: 20 to 60 ms here (the watchdog's dumps, 3 runs), a few
#: times more on a loaded machine. A delay of LIMIT_S sees the second end late whenever the first is handled, with a
#: margin of 50 over that spread.
SLOW_END_S = LIMIT_S


def pytest_configure(config: pytest.Config) -> None:
    """With $HANG_ONCE_SLOW_END_S set (only in a nested run given ``-p test_hang_once``): xdist's controller handles
    each worker's unexpected end that many seconds late, as when the thread that reads from a worker is starved on a
    loaded machine. Without it, nothing."""
    delay = float(os.environ.get(SLOW_END) or 0)
    if not delay:
        return
    from xdist.workermanage import Marker, WorkerController

    seen = WorkerController.process_from_remote

    def seen_late(self: Any, eventcall: Any) -> None:
        if eventcall is Marker.END and not self.shutting_down:  # a worker that died, not one that finished
            time.sleep(delay)
        seen(self, eventcall)

    WorkerController.process_from_remote = seen_late


def test_two_workers_ended_together_still_give_the_report(tmp_path: Path) -> None:
    """Both workers' first checks hang, so the limit ends both workers a fraction of a second apart, and the
    controller sees each end SLOW_END_S late. Handling the first, xdist hands that worker's tests to the second one,
    dead but not yet seen so: the send fails, and pytest-xdist 3.8 then ends the session in an INTERNALERROR before
    any check is reported (exit 3, no report). The run must go on: both hangs fail their checks, the report is
    written."""
    proc, why, data = _check(tmp_path, 2, "-p", "test_hang_once", **{SLOW_END: f"{SLOW_END_S:g}"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "INTERNALERROR" not in out, why
    assert re.search(r"\b10 failed, 8 passed\b", out), f"not every softmax check failed; {why}"
    hangs = _failed_checks(out, "did not return within 3 s")
    assert len(hangs) == 2, f"{len(hangs)} checks waited for the limit, not both workers' first: {sorted(hangs)}; {why}"
    rows = {(r["equation"], r["dtype"]): r for r in data["rows"] if r["direction"] == "forward"}
    assert rows["softmax", "float64"]["measure"] == "hang (time limit)", rows["softmax", "float64"]
    assert rows["layer_norm", "float64"]["status"] == "pass", rows["layer_norm", "float64"]
