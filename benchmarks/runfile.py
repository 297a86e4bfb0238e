"""The files ``aiayn bench`` reads, checked field by field: stored runs and the lines of a history file.

A stored run is the pytest-benchmark JSON of one run of ``aiayn bench`` (given as ``--baseline``, as ``--from-run``,
or found at the ``--save`` destination); a history line is one entry of ``--history`` (:mod:`aiayn.benchmarks.history`).
The comparison, the report and the history read many of their fields and divide by some of them, so every field they
read is checked here when the file is read, by type and by range. A damaged or crafted file is one
:class:`aiayn.environment.UsageError` naming the option, the file and the field, e.g.
``--baseline: base.json: benchmarks[3].extra_info.round_times_s[2]: expected a time in seconds in [1e-12, 1e+07],
got -1.0``; never a traceback further on. Anywhere in a file, a NaN or an infinity is refused (the reports are strict
JSON), and so is a number of more digits than Python converts or nesting deeper than its parser goes.

The ranges are generous physical bounds, not expectations: no call of Eq. (1) takes less than a picosecond or more
than four months, no GEMM ceiling is below a kiloflop/s. They keep every quotient the readers form (flops over a
round's time over the ceiling, a ceiling's drift, a peak-memory growth exponent) finite.

A run's scope (:func:`run_scope`) is the report writer's: its number of timed attention cases, and whether it was
the smoke subset; :func:`aiayn.kit.smaller` decides which of two scopes covers less. ``aiayn bench --save`` keeps a
stored run of larger scope (:func:`save_refusal`), as the report writer keeps a larger report.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiayn.benchmarks.cases import PASSES
from aiayn.environment import UsageError
from aiayn.kit import Scope, smaller

__all__ = [
    "check_history_entry",
    "check_run",
    "load_run",
    "parse_json",
    "read_json",
    "run_scope",
    "save_refusal",
    "store",
    "timed_cases",
]


@dataclass(frozen=True)
class _Range:
    """What a number field holds: its words, its bounds (inclusive), and whether it must be a whole number."""

    words: str
    low: float
    high: float
    integer: bool = False

    @property
    def expected(self) -> str:
        if self.integer:
            return f"an integer ({self.words}) in [{self.low}, {self.high}]"
        return f"a number ({self.words}) in [{self.low:g}, {self.high:g}]"


SECONDS = _Range("a time in seconds", 1e-12, 1e7)
SECONDS_OR_ZERO = _Range("a time in seconds", 0.0, 1e7)
CEILING = _Range("a GEMM ceiling in GFLOP/s", 1e-6, 1e9)
GFLOPS = _Range("a throughput in GFLOP/s", 1e-12, 1e9)
FLOPS = _Range("an operation count", 1.0, 1e24)
RATIO = _Range("a fraction of the GEMM ceiling", 1e-12, 1e6)
TOKENS_PER_S = _Range("tokens per second", 1e-9, 1e15)
BYTES = _Range("a byte count", 0, 2**62, integer=True)
SCORE_BYTES = _Range("a byte count", 1, 2**62, integer=True)
LENGTH = _Range("a sequence length", 1, 2**31, integer=True)
COUNT = _Range("a count", 1, 2**31, integer=True)
LOAD = _Range("a load average", 0.0, 1e6)
SETTING = _Range("a setting", 0.0, 1e9)


def _show(value: Any) -> str:
    """A value as the one-line error shows it: JSON's words, a short repr, never a long one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _At:
    """Where a check is: ``--baseline: base.json`` and the field's path inside the file."""

    def __init__(self, where: str, field: str = "") -> None:
        self.where, self.field = where, field

    def __truediv__(self, key: str | int) -> _At:
        if isinstance(key, str) and (not key.isprintable() or len(key) > 80):  # the error stays one short line
            key = _show(key)
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.field else key)
        return _At(self.where, self.field + step)

    def _prefix(self) -> str:
        return f"{self.where}: {self.field}" if self.field else self.where

    def fail(self, expected: str, value: Any) -> UsageError:
        return UsageError(f"{self._prefix()}: expected {expected}, got {_show(value)}")

    def missing(self, expected: str) -> UsageError:
        return UsageError(f"{self._prefix()}: missing (expected {expected})")


_ABSENT = object()


def _in_range(value: Any, kind: _Range, at: _At, alternative: str = "") -> None:
    ok = isinstance(value, int if kind.integer else (int, float)) and not isinstance(value, bool)
    if not ok or not kind.low <= value <= kind.high:
        raise at.fail(kind.expected + alternative, value)


def _field(obj: Mapping[str, Any], key: str, at: _At, expected: str, required: bool) -> Any:
    value = obj.get(key, _ABSENT)
    if value is _ABSENT and required:
        raise (at / key).missing(expected)
    return value


def _number(
    obj: Mapping[str, Any], key: str, at: _At, kind: _Range, *, required: bool = True, nullable: bool = False
) -> None:
    value = _field(obj, key, at, kind.expected, required)
    if value is _ABSENT or (value is None and nullable):
        return
    _in_range(value, kind, at / key, " or null" if nullable else "")


def _typed(
    obj: Mapping[str, Any], key: str, at: _At, kind: type, expected: str, required: bool, nullable: bool = False
) -> Any:
    """Field ``key`` of ``obj``, a ``kind`` (``expected`` says so in an error), or null where ``nullable``; None
    where it is absent and not required."""
    value = _field(obj, key, at, expected, required)
    if value is _ABSENT or (value is None and nullable):
        return None
    if not isinstance(value, kind):
        raise (at / key).fail(expected + (" or null" if nullable else ""), value)
    return value


def _string(obj: Mapping[str, Any], key: str, at: _At, *, required: bool = True, nullable: bool = False) -> None:
    _typed(obj, key, at, str, "a string", required, nullable)


def _boolean(obj: Mapping[str, Any], key: str, at: _At, *, required: bool = True, nullable: bool = False) -> None:
    _typed(obj, key, at, bool, "true or false", required, nullable)


def _object(obj: Mapping[str, Any], key: str, at: _At, *, required: bool = False) -> dict[str, Any] | None:
    return _typed(obj, key, at, dict, "an object", required)


def _list(obj: Mapping[str, Any], key: str, at: _At, *, required: bool = False) -> list[Any] | None:
    return _typed(obj, key, at, list, "a list", required)


def _objects(obj: Mapping[str, Any], key: str, at: _At) -> list[tuple[dict[str, Any], _At]]:
    """The items of the list ``obj[key]`` (absent: none), each an object, with where each is."""
    items = _list(obj, key, at) or []
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise (at / key / i).fail("an object", item)
        out.append((item, at / key / i))
    return out


# ---------------------------------------------------------------------------------------------
# reading a file


def _finite_everywhere(data: Any, at: _At) -> None:
    """A one-line error at the first NaN or infinity anywhere in ``data`` (walked without recursion)."""
    stack = [(data, at)]
    while stack:
        value, here = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise here.fail("a finite number", value)
        if isinstance(value, dict):
            stack.extend((v, here / str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, here / i) for i, v in enumerate(value))


def parse_json(text: str, where: str) -> Any:
    """``text`` as JSON with every number finite; else a one-line UsageError that starts with ``where``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UsageError(f"{where} is not JSON that can be read ({str(exc).split(';')[0]})") from None
    except RecursionError:
        raise UsageError(f"{where} is not JSON that can be read (nested too deeply)") from None
    _finite_everywhere(data, _At(where))
    return data


def read_json(path: Path, option: str) -> Any:
    """The JSON file ``path`` given as ``option``; else a one-line UsageError naming both: missing, a folder,
    unreadable, not UTF-8, not JSON, or holding a NaN or an infinity."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{option}: {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{option}: {path} is a folder, expected a file") from None
    except OSError as exc:
        raise UsageError(f"{option}: {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option}: {path} is not JSON (not UTF-8 text: byte {exc.start})") from None
    return parse_json(text, f"{option}: {path}")


# ---------------------------------------------------------------------------------------------
# a stored run


def _check_ceiling_fields(info: dict[str, Any], at: _At) -> None:
    """What :func:`aiayn.benchmarks.measure.apply_session_ceiling` reads of any entry with a ceiling."""
    for key in ("library", "device"):
        _string(info, key, at, required=False)
    if "ceiling_gflops" not in info:
        return
    _string(info, "dtype", at)
    for key in ("ceiling_gflops", "ceiling_before_gflops", "ceiling_after_gflops", "ceiling_adjacent_gflops"):
        _number(info, key, at, CEILING, required=key == "ceiling_gflops")
    for key in ("gflops", "gflops_full", "gflops_useful"):
        _number(info, key, at, GFLOPS, required=False)


def _check_attention(info: dict[str, Any], at: _At) -> None:
    """A timed attention case: what the comparison, the history and the report read of it."""
    for key in ("impl", "dtype", "library"):
        _string(info, key, at)
    _string(info, "device", at, required=False)
    _number(info, "n", at, LENGTH)
    _boolean(info, "causal", at)
    pass_ = info.get("pass_", "forward")
    if pass_ not in PASSES:
        raise (at / "pass_").fail(f"one of {', '.join(PASSES)}", pass_)
    for key in ("ratio_full", "ratio_useful"):
        _number(info, key, at, RATIO)
    for key in ("gflops_full", "gflops_useful"):
        _number(info, key, at, GFLOPS)
    for key in ("flops_full", "flops_useful"):
        _number(info, key, at, FLOPS)
    _number(info, "time_min_s", at, SECONDS)
    _number(info, "time_median_s", at, SECONDS, required=False)
    _number(info, "score_bytes", at, SCORE_BYTES)
    _number(info, "peak_bytes", at, BYTES, required=False, nullable=True)
    rounds = _list(info, "round_times_s", at)
    for i, t in enumerate(rounds or []):
        _in_range(t, SECONDS, at / "round_times_s" / i)


def _check_stage(info: dict[str, Any], at: _At) -> None:
    for key in ("stage", "dtype", "layout", "name"):
        _string(info, key, at)
    _number(info, "n", at, LENGTH)
    _number(info, "time_min_s", at, SECONDS)
    _number(info, "ceiling_gflops", at, CEILING)


def _check_training(info: dict[str, Any], at: _At) -> None:
    for key in ("training", "model"):
        _string(info, key, at)
    for key in ("batch", "n", "vocab", "d_model", "n_layers"):
        _number(info, key, at, COUNT)
    _number(info, "time_min_s", at, SECONDS)
    _number(info, "tokens_per_s", at, TOKENS_PER_S)
    _number(info, "flops", at, FLOPS)
    _number(info, "gflops", at, GFLOPS)
    _number(info, "ceiling_gflops", at, CEILING)
    _number(info, "mfu", at, RATIO)
    profile = _object(info, "profile", at)
    if profile is None:
        return
    here = at / "profile"
    _number(profile, "total_s", here, SECONDS)
    _number(profile, "gemm_s", here, SECONDS)
    if profile["gemm_s"] > profile["total_s"]:
        raise (here / "gemm_s").fail(f"at most total_s ({profile['total_s']:g})", profile["gemm_s"])
    for i, item in enumerate(_list(profile, "top_other", here, required=True) or []):
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
        if not ok:
            raise (here / "top_other" / i).fail("a pair [operation, seconds]", item)
        _in_range(item[1], SECONDS_OR_ZERO, here / "top_other" / i / 1)


def _check_memory(info: dict[str, Any], at: _At) -> None:
    _string(info, "memory_model", at)
    _number(info, "n", at, LENGTH)
    _number(info, "peak_bytes", at, BYTES, required=False, nullable=True)


def _check_entry(entry: Any, at: _At) -> None:
    if not isinstance(entry, dict):
        raise UsageError(f"{at.where}: {at.field} is not a pytest-benchmark entry (an object), got {_show(entry)}")
    _string(entry, "name", at)
    info = entry.get("extra_info", {})
    if not isinstance(info, dict):
        raise (at / "extra_info").fail("an object", info)
    here = at / "extra_info"
    _check_ceiling_fields(info, here)
    _string(info, "case", here, required=False)
    if "case" in info and "ratio_full" in info:
        _check_attention(info, here)
    if "stage" in info and "time_min_s" in info:
        _check_stage(info, here)
    if "training" in info and "mfu" in info:
        _check_training(info, here)
    if "memory_model" in info:
        _check_memory(info, here)


def _check_record(run: dict[str, Any], at: _At) -> None:
    """The run's own record (key ``"aiayn"``): every key optional, each of its type when present."""
    record = _object(run, "aiayn", at)
    if record is None:
        return
    here = at / "aiayn"
    for key in ("cpu_model", "host", "training_step"):
        _string(record, key, here, required=False, nullable=key == "training_step")
    for key in ("smoke", "threadpoolctl"):
        _boolean(record, key, here, required=False)
    _number(record, "threads", here, COUNT, required=False)
    _number(record, "cpu_count", here, COUNT, required=False, nullable=True)
    for key in ("gemm_n", "min_rounds", "max_rounds", "gemm_repeats", "adjacent_repeats", "budget_s"):
        _number(record, key, here, SETTING, required=False, nullable=True)
    for i, name in enumerate(_list(record, "cuda_devices", here) or []):
        if not isinstance(name, str):
            raise (here / "cuda_devices" / i).fail("a string", name)
    for key in ("loadavg_start", "loadavg_end"):
        for i, x in enumerate(_list(record, key, here) or []):
            _in_range(x, LOAD, here / key / i)
    for key in ("libraries", "blas_env"):
        for name, value in (_object(record, key, here) or {}).items():
            if not (isinstance(value, str) or (value is None and key == "blas_env")):
                raise (here / key / name).fail("a string", value)
    for name, impl in (_object(record, "implementations", here) or {}).items():
        if not isinstance(impl, dict):
            raise (here / "implementations" / name).fail("an object", impl)
        for key in ("version", "device"):
            _string(impl, key, here / "implementations" / name)
    _objects(record, "threadpools", here)
    for key in ("ceilings_start", "ceilings_end", "ceilings_best"):
        for ceiling, where in _objects(record, key, here):
            for name in ("library", "dtype", "device"):
                _string(ceiling, name, where, required=name != "device" or key == "ceilings_best")
            _number(ceiling, "gflops", where, CEILING)
            if key != "ceilings_best":
                _number(ceiling, "n", where, LENGTH)
                _number(ceiling, "gflops_median", where, CEILING)


def _check_unique(run: dict[str, Any], at: _At) -> None:
    """Each timed attention case once: by its id, and by what it times (implementation, dtype, n, mask, pass)."""
    seen: dict[Any, int] = {}
    for i, entry in enumerate(run["benchmarks"]):
        info = entry.get("extra_info", {})
        if "case" not in info or "ratio_full" not in info:
            continue
        what = (info["impl"], info["dtype"], info["n"], info["causal"], info.get("pass_", "forward"))
        for key, field in ((("id", info["case"]), "case"), (what, "impl")):
            if key in seen:
                raise (at / "benchmarks" / i / "extra_info" / field).fail(
                    f"a case not timed before (benchmarks[{seen[key]}] times it too)", info[field]
                )
            seen[key] = i


def check_run(data: Any, where: str) -> dict[str, Any]:
    """``data`` (a parsed stored run) when every field aiayn bench reads is of its type and range; else a one-line
    UsageError starting with ``where`` (``--baseline: base.json``) and naming the field."""
    at = _At(where)
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise UsageError(f"{where} is not a pytest-benchmark JSON (no 'benchmarks' list)")
    for key in ("datetime", "version"):
        _string(data, key, at, required=False, nullable=True)
    commit = _object(data, "commit_info", at)
    if commit is not None:
        for key in ("id", "branch", "error"):
            _string(commit, key, at / "commit_info", required=False, nullable=True)
        _boolean(commit, "dirty", at / "commit_info", required=False, nullable=True)
    for i, entry in enumerate(data["benchmarks"]):
        _check_entry(entry, at / "benchmarks" / i)
    _check_record(data, at)
    _check_unique(data, at)
    return data


def load_run(path: Path, option: str) -> dict[str, Any]:
    """The stored run at ``path`` (given as ``option``), every field checked (:func:`check_run`); UsageError also when
    it holds no case of aiayn bench (a pytest-benchmark JSON of another suite)."""
    where = f"{option}: {path}"
    run = check_run(read_json(path, option), where)
    ours = ("case", "stage", "training", "memory_model")
    if not any(key in b.get("extra_info", {}) for b in run["benchmarks"] for key in ours):
        raise UsageError(f"{where} holds no case of aiayn bench (a run of aiayn's benchmarks is expected)")
    return run


# ---------------------------------------------------------------------------------------------
# a history line


HISTORY_FIGURE = _Range("a fraction of the GEMM ceiling", 0.0, 1e6)


def check_history_entry(entry: Any, where: str) -> dict[str, Any]:
    """One parsed line of a history file, every field :mod:`aiayn.benchmarks.history` reads checked; else a one-line
    UsageError starting with ``where`` (``--history: h.jsonl: line 3``)."""
    if not isinstance(entry, dict) or "datetime" not in entry or not isinstance(entry.get("cases"), dict):
        raise UsageError(f"{where} is not a history entry (expected an object with 'datetime' and 'cases')")
    at = _At(where)
    _string(entry, "datetime", at, nullable=True)
    for key in ("commit", "branch"):
        _string(entry, key, at, required=False, nullable=True)
    _boolean(entry, "dirty", at, required=False, nullable=True)
    env = _object(entry, "environment", at, required=False) or {}
    for key in ("machine", "device"):
        _string(env, key, at / "environment", required=False)
    _number(env, "threads", at / "environment", COUNT, required=False)
    for name, value in (_object(env, "libraries", at / "environment") or {}).items():
        if not isinstance(value, str):
            raise (at / "environment" / "libraries" / name).fail("a string", value)
    for case, stats in entry["cases"].items():
        here = at / "cases" / case
        if not isinstance(stats, dict):
            raise here.fail("an object with median, min, max and rounds", stats)
        for key in ("median", "min", "max"):
            _number(stats, key, here, HISTORY_FIGURE)
        _number(stats, "rounds", here, COUNT)
    return entry


# ---------------------------------------------------------------------------------------------
# scope, and storing a run as a baseline


def timed_cases(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``extra_info`` of every timed attention case of ``run`` (what the report's rows and its scope count)."""
    return [b["extra_info"] for b in run["benchmarks"] if {"case", "ratio_full"} <= b.get("extra_info", {}).keys()]


def run_scope(run: Mapping[str, Any], smoke: bool = False) -> Scope:
    """The scope of ``run`` as the report writer compares scopes: its timed attention cases, and whether it was the
    smoke subset (``smoke``, or as the run recorded it)."""
    smoke = smoke or bool((run.get("aiayn") or {}).get("smoke"))
    count = len(timed_cases(run))
    return Scope(label="smoke cases" if smoke else f"{count} cases", size=float(count), full=not smoke)


def save_refusal(dest: Path, scope: Scope | None, force: bool) -> str | None:
    """Why the run of ``scope`` may not replace the file at ``dest`` (None: it may): a stored run of larger scope
    (:func:`aiayn.kit.smaller`), or a file that is no stored run of aiayn bench. ``scope`` None: the run is not
    measured yet, only the file is looked at. ``force``: it may always."""
    if force or not dest.exists():
        return None
    try:
        stored = run_scope(load_run(dest, "--save"))
    except UsageError as exc:
        reason = str(exc).removeprefix(f"--save: {dest}").lstrip(": ")
        return f"{dest} is not a stored run of aiayn bench ({reason}): not replaced (--force to replace)"
    if scope is None or not smaller(scope, asdict(stored)):
        return None
    return (
        f"{dest} holds {_cases(stored)}, this run {_cases(scope).removesuffix(' cases')}: not replaced "
        "(--force to replace)"
    )


def _cases(scope: Scope) -> str:
    return f"{scope.size:g} cases" + ("" if scope.full else " (the smoke subset)")


def store(run_path: Path, dest: Path) -> Path:
    """Copy the run at ``run_path`` to ``dest`` atomically (a temporary file beside it, then a rename): an
    interrupted copy never leaves a half-written baseline. Nothing to do when both name one file."""
    run_path, dest = Path(run_path), Path(dest)
    if dest.exists() and os.path.samefile(run_path, dest):
        return dest
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name[:200]}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(run_path, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
