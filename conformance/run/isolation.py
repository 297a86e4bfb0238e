"""A broken implementation never takes the run down: a time limit on every call, and a record of the call in flight.

Every call into an implementation (``harness.Case.guard``) runs under :func:`calling`:

- **In a worker process** (``aiayn check``, or ``pytest -n N``): before the call, the check's
  inputs are saved (``<record dir>/<worker>.npz``, once per example) and the call is described in
  ``<worker>.json`` (test, equation, implementation, dtype, check, the call with its shapes). That
  file is memory-mapped (:class:`_Slot`): describing a call is a memory copy, not a file write, and
  the pages belong to the file, so the description outlives a worker that dies.
  A C-level watchdog (``faulthandler.dump_traceback_later(limit, exit=True)``) ends the worker if
  the call does not return within the limit, and a segfault, an abort or a process exit
  (``os._exit`` with any code, 0 included) ends it anyway. The controller then finds the record
  (``plugin.pytest_handlecrashitem``), turns the crash into that check's failure (equation,
  shapes, a replay file) and pytest-xdist starts a new worker: the other checks go on and the
  report is still written.
- **In the pytest process itself** (no workers): a Python-level alarm (SIGALRM, main thread
  only) raises :class:`CallTimedOut` when the limit passes. It stops hangs in Python code; a hang
  inside C code, a segfault, or ``os._exit`` (which ends the process at once, with the status the
  implementation chose) can only be contained by worker processes. ``sys.exit`` is an exception
  (``SystemExit``), caught in every mode: that check's failure (``harness.Case.guard``).

:class:`CallTimedOut` derives from BaseException, so Hypothesis does not retry or shrink the
hanging example (each retry would wait the whole limit again): the first example that hangs is
the one reported.

**A hang is paid once per method.** Once a call of a method (the implementation's spec and the
method's name, e.g. ``softmax`` or ``from_numpy``; any dtype) has run past the limit, every later
call of that method in the run raises :class:`CallTimedOut` at once, with a message that names
the first hang (test, check, call, limit) and its replay file; the plugin reports such a check as
a hang too. Without workers the first hang is remembered in this process. With workers the
controller, handling the crash of a worker the watchdog ended (:func:`mark_hung`), adds it to
``<record dir>/hung.json`` before pytest-xdist starts the replacement worker, and every worker
looks at that file before each call (one ``stat``; the file is read again only when it changed).
A call that started before the mark was written still runs to the limit, and a worker has one
call in flight: a method that hangs costs at most one limit per worker, so a hanging
implementation adds at most (methods that hang) x (workers) x limit to a run, plus one worker
restart per such limit (without workers: (methods that hang) x limit).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import mmap
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "CallTimedOut",
    "ProcessCrashed",
    "DEFAULT_LIMIT_S",
    "calling",
    "configure",
    "crash_record",
    "mark_hung",
    "method_of",
    "record_dir",
    "test_started",
]

#: The default time limit of one call into an implementation (seconds). A call on the suite's
#: small inputs takes milliseconds; the first call on a GPU can take seconds (context creation).
DEFAULT_LIMIT_S = 120.0


class CallTimedOut(BaseException):
    """A call into the implementation did not return within the time limit (in-process mode), or was not made
    because a call of the same method did so earlier in the run (in any mode)."""


class ProcessCrashed(BaseException):
    """The implementation's own process (``run/boundary.py``) ended during a call: that check's failure, with ``cause``
    ("exit 0", "killed by SIGSEGV"). A BaseException, like :class:`CallTimedOut`: Hypothesis neither retries nor
    shrinks the example (each try would start a new process only to end it again)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class _Slot:
    """A file of fixed size, memory-mapped, that holds the latest record of a worker.

    Layout: 8 bytes (little-endian length n), then n bytes of UTF-8 JSON. A write copies the JSON
    first and the length last, so a reader sees the previous record or the new one. Pages of a
    shared mapping belong to the file: what was written stays readable after the process dies
    (a segfault, the watchdog's exit, a kill), which is the only time the controller reads it.
    The file write it replaces (write a temporary file, rename it) cost about 0.15 ms a call, and
    a check makes thousands of calls.
    """

    SIZE = 1 << 18  # 256 KiB: a record is a few hundred bytes; the inputs' description is cut to fit

    def __init__(self, path: Path) -> None:
        with open(path, "wb") as handle:
            handle.truncate(self.SIZE)
        self._handle = open(path, "r+b")  # noqa: SIM115 (lives with the process)
        self._map = mmap.mmap(self._handle.fileno(), self.SIZE)

    def write(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, default=str).encode("utf-8")
        if len(data) > self.SIZE - 8:
            # Cut every key and value to an equal share of characters. json.dumps writes at most 12 bytes a
            # character (a surrogate pair, escaped), so an entry takes at most 24 (share + 10) + 6 bytes: with
            # share = SIZE / (32 n) - 16, n entries take at most 3/4 of the slot.
            share = (self.SIZE - 8) // (32 * max(1, len(record))) - 16
            record = {
                str(k)[:share]: (v if isinstance(v, (int, float, bool)) or v is None else _cut(str(v), share))
                for k, v in record.items()
            }
            data = json.dumps(record, default=str).encode("utf-8")
        self._map[8 : 8 + len(data)] = data
        self._map[:8] = len(data).to_bytes(8, "little")

    @staticmethod
    def read(path: Path) -> dict[str, Any] | None:
        """The record in the slot file at ``path`` (None if there is none, or it cannot be parsed)."""
        try:
            raw = path.read_bytes()
            return json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")].decode("utf-8"))
        except (OSError, ValueError):
            return None


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + " ... (cut)"


class _State:
    limit: float = DEFAULT_LIMIT_S
    worker: str | None = None  # the xdist worker id, when this process is a worker
    directory: Path | None = None  # where a worker writes its record of the call in flight
    slot: _Slot | None = None  # <directory>/<worker>.json, memory-mapped
    test: dict[str, Any] = {}
    saved_for: int | None = None  # id() of the case whose inputs are saved in <worker>.npz
    traceback_file: Any = None
    hung: dict[tuple[str, str], dict[str, Any]] = {}  # (spec, method) -> its first hang, as hung.json holds it
    hung_file: Path | None = None  # <directory>/hung.json, written by the controller (in a worker)
    hung_seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of hung.json when it was last read


_STATE = _State()


def record_dir(testrunuid: str) -> Path:
    """The folder a run's workers write their records to (shared with the controller by the run's uid)."""
    return Path(tempfile.gettempdir()) / f"aiayn-inflight-{testrunuid}"


def configure(limit: float | None, *, worker: str | None = None, testrunuid: str | None = None) -> None:
    """Set the per-call limit (None or 0: no limit); in a worker, prepare its record files."""
    _STATE.limit = float(limit or 0)
    _STATE.worker = worker
    _STATE.hung, _STATE.hung_file, _STATE.hung_seen = {}, None, None
    if worker and testrunuid:
        directory = record_dir(testrunuid)
        directory.mkdir(parents=True, exist_ok=True)
        _STATE.directory = directory
        _STATE.hung_file = directory / _HUNG
        _STATE.slot = _Slot(directory / f"{worker}.json")
        _STATE.traceback_file = open(directory / f"{worker}.traceback", "w", encoding="utf-8")  # noqa: SIM115 (lives with the process)
        faulthandler.enable(file=_STATE.traceback_file)  # a segfault's traceback goes where the controller looks


def test_started(info: dict[str, Any]) -> None:
    """Remember which test runs now (nodeid, equation, spec, dtype, test) and record it."""
    _STATE.test = dict(info)
    _STATE.saved_for = None
    _write({**_STATE.test, "call": None})


def _write(record: dict[str, Any]) -> None:
    if _STATE.slot is not None:
        _STATE.slot.write(record)


@contextlib.contextmanager
def calling(case: Any, what: str, save: Callable[[Any, Path], Path]) -> Iterator[None]:
    """Run one call into the implementation under the time limit, recorded first when in a worker.

    ``save(case, path)`` writes the case's inputs as a replay file (``failures.save_case``). A call
    of a method that already hung in this run is not made: it raises :class:`CallTimedOut` at once.
    """
    __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
    key = (_spec(case), method_of(case, what))
    first = _first_hang(key)
    if first is not None:
        raise CallTimedOut(_hung_message(case, what, first))
    if _STATE.directory is not None:
        if _STATE.saved_for != id(case):
            save(case, _STATE.directory / f"{_STATE.worker}.npz")
            _STATE.saved_for = id(case)
        _write(
            {
                **_STATE.test,
                "call": what,
                "method": key[1],
                "check": case.check,
                "inputs": case.describe_inputs(),
                "limit_s": _STATE.limit,
            }
        )
        with _hard_limit():
            yield
    else:
        with _soft_limit(case, what, key):
            yield


@contextlib.contextmanager
def _hard_limit() -> Iterator[None]:
    if not _STATE.limit:
        yield
        return
    faulthandler.dump_traceback_later(_STATE.limit, exit=True, file=_STATE.traceback_file)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def _soft_limit(case: Any, what: str, key: tuple[str, str]) -> Iterator[None]:
    usable = _STATE.limit and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        message = case.timeout_message(what, _STATE.limit)
        replay = re.search(r"replay: aiayn replay (.+)$", message, re.MULTILINE)
        _STATE.hung[key] = _hang_entry(
            {**_STATE.test, "call": what, "check": case.check, "limit_s": _STATE.limit},
            key,
            replay.group(1).strip() if replay else None,
        )
        raise CallTimedOut(message)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, _STATE.limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------------
# a hang is paid once per method

_HUNG = "hung.json"  # in the record folder: {"<spec> <method>": first hang} (written by the controller only)


def method_of(case: Any, what: str) -> str:
    """The method of the implementation that ``what`` calls: "softmax" for "numpy.softmax(<float32 (2, 3)>, -1)",
    "from_numpy" for "from_numpy(<float64 (2, 3)>, 'float32')" (``harness.Case``'s descriptions of its calls)."""
    name = getattr(case.impl, "name", None)
    if isinstance(name, str) and name and what.startswith(name + "."):
        what = what[len(name) + 1 :]
    return what.split("(", 1)[0].strip()


def _spec(case: Any) -> str:
    """The implementation of a call as the plugin names it (the spec it was loaded from), else its name."""
    return str(_STATE.test.get("spec") or getattr(case.impl, "name", None) or type(case.impl).__qualname__)


def _hang_entry(record: dict[str, Any], key: tuple[str, str], replay: str | None) -> dict[str, Any]:
    fields = ("test", "nodeid", "equation", "dtype", "check", "call", "limit_s")
    return {"spec": key[0], "method": key[1], **{k: record.get(k) for k in fields}, "replay": replay}


def _first_hang(key: tuple[str, str]) -> dict[str, Any] | None:
    """The first hang of method ``key`` in this run, or None (a worker reads hung.json again only when it changed)."""
    path = _STATE.hung_file
    if path is not None:
        try:
            st = os.stat(path)
        except OSError:
            pass
        else:
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if seen != _STATE.hung_seen:
                marks = _read_hung(path)
                _STATE.hung = {(m["spec"], m["method"]): m for m in marks.values()}
                _STATE.hung_seen = seen
    return _STATE.hung.get(key)


def _read_hung(path: Path) -> dict[str, dict[str, Any]]:
    try:
        marks = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: m for k, m in marks.items() if isinstance(m, dict) and "spec" in m and "method" in m}


def mark_hung(testrunuid: str, record: dict[str, Any], replay: str | None) -> None:
    """(the controller) Method ``record["method"]`` of ``record["spec"]`` hung: every later call of it fails at once.

    ``record`` is a :func:`crash_record` whose cause is "timeout"; the first hang of a method is kept.
    The file is replaced whole (a new inode), so a worker's ``stat`` sees every change.
    """
    if not record.get("method"):
        return
    path = record_dir(testrunuid) / _HUNG
    marks = _read_hung(path)
    key = f"{record.get('spec', '-')} {record['method']}"
    if key in marks:
        return
    marks[key] = _hang_entry(record, (str(record.get("spec", "-")), str(record["method"])), replay)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{_HUNG}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(marks, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _hung_message(case: Any, what: str, first: dict[str, Any]) -> str:
    """The failure of a call not made because its method hung earlier in the run: names that first hang."""
    title = getattr(case, "title", None) or getattr(case, "equation", "?")
    limit = float(first.get("limit_s") or 0)
    lines = [
        f"{title}: {what} was not called: {first['method']} of {first['spec']} already hung in this run "
        f"(no return within {limit:g} s, in {first.get('test') or first.get('nodeid')} [{first.get('dtype')}]); "
        "a method that hangs costs one time limit, later calls of it fail at once (aiayn check --timeout)",
        f"  first hang: {first.get('call')}, test {first.get('nodeid') or first.get('test')}"
        + (f", check {first['check']}" if first.get("check") else ""),
    ]
    if first.get("replay"):
        lines.append(f"  replay of the first hang: aiayn replay {first['replay']}   (expect the same hang)")
    lines.append(
        f"  this call: implementation {getattr(case.impl, 'name', '?')}, dtype {case.dtype}; check {case.check}"
    )
    return "\n".join(lines)


def crash_record(testrunuid: str, worker: str, nodeid: str) -> dict[str, Any] | None:
    """What a crashed worker was doing when it died, read by the controller (None if it left no record for ``nodeid``).

    Adds ``"cause"``: "timeout" (the watchdog ended it), "fatal error: <what faulthandler saw>"
    (a segfault, an abort) or "exited" (the process ended without saying why, e.g. killed for
    memory), and ``"inputs_file"`` when the inputs of the call were saved.
    """
    directory = record_dir(testrunuid)
    record = _Slot.read(directory / f"{worker}.json")
    if record is None or record.get("nodeid") != nodeid:
        return None
    try:
        dump = (directory / f"{worker}.traceback").read_text(encoding="utf-8", errors="replace")
    except OSError:
        dump = ""
    first = dump.strip().splitlines()[0] if dump.strip() else ""
    if first.startswith("Timeout ("):
        record["cause"] = "timeout"
    elif first:
        record["cause"] = "fatal error: " + first.removeprefix("Fatal Python error: ")
    else:
        record["cause"] = "exited"
    record["traceback"] = dump[:4000]
    inputs = directory / f"{worker}.npz"
    if record.get("call") and inputs.exists():
        record["inputs_file"] = str(inputs)
    return record


def remove(testrunuid: str) -> None:
    """Delete a run's record folder (the controller, at the end of the run)."""
    shutil.rmtree(record_dir(testrunuid), ignore_errors=True)
