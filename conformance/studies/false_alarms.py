"""How often does the suite fail a correct implementation? ``aiayn false-alarms``.

Runs the whole suite on implementations believed correct (every built-in by default) once per
Hypothesis seed, each run exactly as ``aiayn check`` does (worker processes, the per-call time
limit), and counts what a user would see as an alarm: a failed check, an inconclusive row, a run
that did not finish. The goal is 0. Writes ``conformance-false-alarms-<profile>.md`` and ``.json``
with the count, every alarm's test and message head, and the wall time of each run.

Known deviations that still deviate are expected results, not alarms; one that no longer deviates
fails its run (strict) and is counted.

Resumable: the work is cut into units, one implementation under one seed, each stored when it
ends (``--work``, by default ``aiayn.environment.cache_dir()/false-alarms/<profile>``). A later
call skips a unit already stored for the same key: profile, seed, implementation, the code of the
suite (the hash of the conformance package and of the implementation's module,
:func:`aiayn.kit.code_hash`), the code of every module file the implementation loads from outside
the standard library and site-packages (found by loading it in a child process,
:func:`loaded_code`), and the version of every installed distribution it loads modules from. So a
count that takes longer than one sitting accumulates over several, and a unit stored for other
code (a changed sibling module of the implementation, an upgraded library) is run again. The report
says which files and distributions each implementation's key covers, and counts only seeds whose
every unit is stored for the current key.

A unit finished when its pytest process ended with exit 0 or 1. One that did not (killed by a
signal, interrupted, a pytest internal or usage error, or an implementation that its child process
could not load) is an alarm of this call, reported with the signal or exit, and is not stored: a
later call runs it again. A stored unit file is data: it is checked field by field before use, and
one that is not a unit file this module wrote is an error naming the file and the field
(:class:`StoredUnitError`), never a verdict.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from aiayn.conformance.report.results import Row, Status
from aiayn.conformance.run.runner import pytest_arguments
from aiayn.environment import source_checkout
from aiayn.kit import Report, Scope, code_hash, code_of, write_json, write_report

__all__ = ["StoredUnitError", "UnitNotLoaded", "loaded_code", "run", "suite_code"]


class StoredUnitError(Exception):
    """A stored unit file that is not one :func:`run` wrote; the message is one line naming the file and field."""


class UnitNotLoaded(Exception):
    """The implementation of a unit could not be loaded in a child process; the message is one line saying why."""

    def __init__(self, message: str, exit: int) -> None:
        super().__init__(message)
        self.exit = exit


def _one(specs: Sequence[str], profile: str, seed: int, workers: int, folder: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *pytest_arguments(
            specs, profile=profile, seed=seed, workers=workers, report=folder, extra=["--tb=line", "-rfE"]
        ),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    alarms = []
    for path in sorted(folder.glob("conformance-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = [Row.from_dict(r) for r in data["rows"]]
        alarms += [
            {
                "impl": data["implementation"],
                "equation": r.equation,
                "dtype": r.dtype,
                "status": r.status.value,
                "tests": r.failed_tests,
            }
            for r in rows
            if r.status in (Status.FAIL, Status.INCONCLUSIVE)
        ]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {
        "seed": seed,
        "seconds": seconds,
        "exit": proc.returncode,
        "alarms": alarms,
        "failed_lines": lines[:20],
        "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "",
    }


#: The counts this project commits, per profile (README, "How we know the suite is right"): a count of fewer seeds
#: is a smaller scope and never replaces such a report (``kit.write_report``).
FULL_SEEDS = {"dev": 20, "thorough": 3}

#: Modules of the conformance package that no unit runs: the package's docstring module and the drivers of other
#: commands (the mutants and the zoo import implementations of their own, which would tie every unit to them).
_NOT_IN_A_UNIT = frozenset({"__init__", "mutants", "zoo"})


def suite_code(spec: str) -> str:
    """The hash of the suite's code a unit runs: every module of the conformance package, plus the implementation's
    module when it is one of aiayn's (a built-in or ``aiayn.…:attr``); for an implementation outside aiayn, its spec
    and, for an entry-point name, the entry point's target and distribution. The code of an implementation outside
    aiayn is in the unit's key through the files it loads (:func:`loaded_code`)."""
    from aiayn.implementations.registry import BUILTINS

    folder = Path(__file__).resolve().parent.parent  # the conformance package, its role folders and checks/
    modules = [
        "aiayn.conformance." + ".".join(path.relative_to(folder).with_suffix("").parts)
        for path in sorted(folder.rglob("*.py"))
        if path.stem not in _NOT_IN_A_UNIT
    ]
    target = BUILTINS.get(spec, spec)
    if ":" in target and target.startswith("aiayn."):
        modules.append(target.split(":", 1)[0])
        return code_hash(*modules)
    digest = hashlib.sha256(code_hash(*modules).encode() + b"\0" + _entry_point(target))
    return digest.hexdigest()[:12]


def _entry_point(target: str) -> bytes:
    """``module:attr`` as it is; an entry-point name as its target and its distribution's name and version."""
    if ":" in target:
        return target.encode()
    found = [ep for ep in importlib.metadata.entry_points(group="aiayn.implementations") if ep.name == target]
    if not found:
        return target.encode()
    dist = found[0].dist
    return f"{found[0].value}|{dist.name if dist else '?'}|{dist.version if dist else '?'}".encode()


def _unit_path(work: Path, seed: int, spec: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)
    return work / f"seed{seed}-{safe}.json"


# --------------------------------------------------------------------------------------------
# a unit that did not finish


#: pytest's exits of a run that finished: every test passed (0), or some failed (1).
_FINISHED = (0, 1)
_PYTEST_EXITS = {2: "interrupted", 3: "pytest internal error", 4: "pytest usage error", 5: "no tests collected"}


def _did_not_finish(exit: int) -> str | None:
    """Why a process with this exit status did not finish (the signal that ended it, pytest's reason), or None."""
    if exit in _FINISHED:
        return None
    if exit < 0:
        try:
            name = signal.Signals(-exit).name
        except ValueError:
            name = "a signal without a name"
        return f"killed by signal {-exit} ({name})"
    reason = _PYTEST_EXITS.get(exit)
    return f"{reason} (exit {exit})" if reason else f"exit {exit}"


# --------------------------------------------------------------------------------------------
# what a unit's key covers beyond the suite: the files and distributions its implementation loads

#: Run in a child process from the current directory, as the unit's pytest process is: load the spec, then write
#: the file of every module it loaded (name -> path; not those of the interpreter's start) as JSON into the file
#: named by the second argument.
_PROBE = """
import json, sys
started = set(sys.modules)
from aiayn.implementations.registry import load
load(sys.argv[1])
files = {}
for name, module in list(sys.modules.items()):
    file = getattr(module, "__file__", None)
    if name not in started and isinstance(file, str):
        files[name] = file
with open(sys.argv[2], "w", encoding="utf-8") as handle:
    json.dump(files, handle)
"""


def _installed_roots() -> list[Path]:
    """The standard library and site-packages folders: modules found there are identified by version, not file."""
    paths = sysconfig.get_paths()
    return [Path(os.path.realpath(paths[k])) for k in ("stdlib", "platstdlib", "purelib", "platlib")]


def loaded_code(spec: str) -> dict[str, dict[str, str]]:
    """What a unit of ``spec`` runs beyond the conformance package, found by loading ``spec`` in a child process
    (from the current directory, as the unit's own process does): ``files``, every loaded module file outside the
    standard library and site-packages (:func:`_key_path`) with the digest of its code (:func:`_digest`), and
    ``distributions``, the version of each installed distribution it loads modules from. Raises
    :class:`UnitNotLoaded` when the child process fails."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "modules.json"
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, spec, str(listing)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
            why = _did_not_finish(proc.returncode) if proc.returncode < 0 else last or f"exit {proc.returncode}"
            raise UnitNotLoaded(f"loading {spec!r} in a child process failed: {why}", proc.returncode)
        try:
            modules = json.loads(listing.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise UnitNotLoaded(f"loading {spec!r} in a child process left no list of modules ({exc})", 0) from None
    if not isinstance(modules, dict) or not all(isinstance(f, str) for f in modules.values()):
        raise UnitNotLoaded(f"loading {spec!r} in a child process left a list of modules that is not name -> file", 0)
    roots = _installed_roots()
    files: dict[str, str] = {}
    tops: set[str] = set()
    for name, file in modules.items():
        real = Path(os.path.realpath(file))
        if any(real.is_relative_to(root) for root in roots):
            tops.add(str(name).split(".", 1)[0])
        else:
            name, digest = _key_path(real), _digest(real)
            if digest is not None and _is_key_path(name):
                files[name] = digest
    owners = importlib.metadata.packages_distributions()
    distributions = {dist: _version(dist) or "?" for top in tops for dist in owners.get(top, [])}
    return {"files": dict(sorted(files.items())), "distributions": dict(sorted(distributions.items()))}


def _digest(path: Path) -> str | None:
    """12 hex digits of SHA-256 over a module file's code (a Python source's syntax tree, :func:`aiayn.kit.code_of`,
    so comments, layout and docstrings do not count; any other file's bytes); None when it is no regular file."""
    try:
        if not path.is_file():
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if path.suffix == ".py":
        try:
            data = code_of(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass  # not Python that parses: its bytes identify it
    return hashlib.sha256(data).hexdigest()[:12]


def _key_path(file: Path) -> str:
    """A file's name in a unit's key: relative to aiayn's checkout when inside it (so committed units stay valid in
    another clone), else absolute."""
    root = source_checkout()
    if root is not None and file.is_relative_to(root.resolve()):
        return file.relative_to(root.resolve()).as_posix()
    return str(file)


def _key_file(name: str) -> Path | None:
    """The file a key names now (None: a path relative to a checkout, and aiayn runs from none)."""
    if Path(name).is_absolute():
        return Path(name)
    root = source_checkout()
    return root / name if root is not None else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# a stored unit: read, checked field by field, compared with the current key


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_str(value: Any) -> bool:
    return type(value) is str


def _is_strings(value: Any) -> bool:
    return type(value) is list and all(type(x) is str for x in value)


def _is_seconds(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _is_key_path(value: str) -> bool:
    """A module file's name (a suffix of importlib's: .py, .pyc, an extension's .so): an absolute path, or one relative
    to the checkout that stays inside it. Nothing else is read to compare a key."""
    inside = Path(value).is_absolute() or ".." not in PurePosixPath(value).parts
    return inside and value.endswith(tuple(importlib.machinery.all_suffixes()))


def _is_digests(value: Any) -> bool:
    return type(value) is dict and all(_is_key_path(k) and type(v) is str for k, v in value.items())


def _is_versions(value: Any) -> bool:
    return type(value) is dict and all(k and type(v) is str for k, v in value.items())


#: A stored unit's fields: (test, what is expected). The key's ``files`` and ``distributions`` are checked when
#: present; a unit stored without them is stored for another key (it is run again).
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": (_is_int, "an integer"),
    "spec": (_is_str, "a string"),
    "profile": (_is_str, "a string"),
    "code": (_is_str, "a string"),
    "seconds": (_is_seconds, "a finite number of seconds, at least 0"),
    "exit": (lambda v: _is_int(v) and v in _FINISHED, "0 or 1 (a unit is stored only when it finished)"),
    "alarms": (lambda v: type(v) is list, "a list of alarm rows"),
    "failed_lines": (_is_strings, "a list of strings"),
    "summary": (_is_str, "a string"),
}
_KEY_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "files": (_is_digests, "an object of file (absolute, or relative inside the checkout) -> code digest"),
    "distributions": (_is_versions, "an object of distribution -> version"),
}
_ALARM_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "impl": (_is_str, "a string"),
    "equation": (_is_str, "a string"),
    "dtype": (_is_str, "a string"),
    "status": (lambda v: v in (Status.FAIL.value, Status.INCONCLUSIVE.value), "'fail' or 'inconclusive'"),
    "tests": (_is_strings, "a list of strings"),
}
_MISSING = object()


def _bad(path: Path, field: str, value: Any, expected: str) -> StoredUnitError:
    found = "missing" if value is _MISSING else f"{type(value).__name__} {repr(value)[:60]}"
    return StoredUnitError(
        f"{path}: field {field!r} is {found}, expected {expected}: not a unit file that aiayn false-alarms wrote "
        "(remove it to run its unit again)"
    )


def _checked(path: Path, data: Mapping[str, Any], fields: Mapping[str, Any], prefix: str = "", *, needed: bool) -> None:
    for name, (test, expected) in fields.items():
        value = data.get(name, _MISSING)
        if (value is _MISSING and needed) or (value is not _MISSING and not test(value)):
            raise _bad(path, prefix + name, value, expected)


def _read_unit(path: Path) -> dict[str, Any] | None:
    """The unit stored in ``path``, checked field by field (None when there is no file); :class:`StoredUnitError`
    for a file that is not a unit."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise StoredUnitError(f"{path}: not a JSON unit file ({' '.join(str(exc).split())[:120]})") from None
    if type(data) is not dict:
        raise StoredUnitError(f"{path}: not a JSON object but {type(data).__name__}: not a unit file")
    _checked(path, data, _FIELDS, needed=True)
    _checked(path, data, _KEY_FIELDS, needed=False)
    for i, alarm in enumerate(data["alarms"]):
        if type(alarm) is not dict:
            raise _bad(path, f"alarms[{i}]", alarm, "an object")
        _checked(path, alarm, _ALARM_FIELDS, f"alarms[{i}].", needed=True)
    return data


class _CurrentKey:
    """The key of the code as it is now: file digests and distribution versions, each looked up once a call."""

    def __init__(self) -> None:
        self.digests: dict[str, str | None] = {}
        self.versions: dict[str, str | None] = {}

    def digest(self, name: str) -> str | None:
        if name not in self.digests:
            file = _key_file(name)
            self.digests[name] = _digest(file) if file is not None else None
        return self.digests[name]

    def version(self, distribution: str) -> str | None:
        if distribution not in self.versions:
            self.versions[distribution] = _version(distribution)
        return self.versions[distribution]


def _stale(unit: Mapping[str, Any], key: Mapping[str, Any], now: _CurrentKey) -> str | None:
    """Why a stored (checked) unit is not for the current key; None when it is."""
    for name in ("seed", "spec", "profile", "code"):
        if unit[name] != key[name]:
            return f"stored for {name} {unit[name]!r}, not {key[name]!r}"
    if "files" not in unit or "distributions" not in unit:
        return "stored without the files and distributions its key covers"
    changed = [name for name, digest in unit["files"].items() if now.digest(name) != digest]
    if changed:
        return f"code changed or missing: {', '.join(changed[:5])}" + (" ..." if len(changed) > 5 else "")
    moved = [f"{d} {v} -> {now.version(d)}" for d, v in unit["distributions"].items() if now.version(d) != v]
    if moved:
        return f"distributions changed: {', '.join(moved[:5])}" + (" ..." if len(moved) > 5 else "")
    return None


def _fresh(
    one: Callable[..., dict[str, Any]], key: Mapping[str, Any], workers: int
) -> tuple[dict[str, Any], str | None]:
    """Run one unit: the files and distributions of its key first (before the unit, so a file changed while it runs
    makes it stale), then ``one``. Returns (the unit, why it did not finish or None)."""
    start = time.perf_counter()
    try:
        loaded = loaded_code(key["spec"])
    except UnitNotLoaded as exc:
        unit = {"seconds": time.perf_counter() - start, "exit": exc.exit, "alarms": [], "failed_lines": []}
        return {**unit, "summary": "", **key, "files": {}, "distributions": {}}, str(exc)
    with tempfile.TemporaryDirectory() as tmp:
        result = one([key["spec"]], key["profile"], key["seed"], workers, Path(tmp))
    return {**result, **key, **loaded}, _did_not_finish(result["exit"])


def run(
    specs: Sequence[str],
    *,
    profile: str,
    seeds: Sequence[int],
    workers: int,
    out: Path,
    work: Path | None = None,
    one: Any = None,
    force: bool = False,
) -> int:
    """Run the suite once per seed and implementation, resuming from ``work``; write the report;
    return the number of seeds with an alarm. ``one`` replaces the unit runner (tests)."""
    from aiayn.environment import cache_dir

    work = Path(work) if work is not None else cache_dir() / "false-alarms" / profile
    codes = {spec: suite_code(spec) for spec in specs}
    done, reused = _units(one or _one, specs, seeds, profile, workers, work, codes)
    runs = _runs(specs, seeds, done)
    rep = _report(specs, seeds, profile, workers, work, codes, done, runs, reused)
    write_report(out, rep, force=force)
    return rep.data["alarmed_runs"]


def _units(
    one: Any, specs: Sequence[str], seeds: Sequence[int], profile: str, workers: int, work: Path, codes: dict
) -> tuple[dict[tuple[int, str], tuple[dict[str, Any], str | None]], int]:
    """Each (seed, implementation) unit: stored by an earlier call for the same key, else run now (and stored where it
    finished); (unit -> (its result, why it did not finish or None), how many were stored)."""
    units = [(seed, spec) for seed in seeds for spec in specs]
    stored = {unit: _read_unit(_unit_path(work, *unit)) for unit in units}  # every stored file checked before any run
    now = _CurrentKey()
    done: dict[tuple[int, str], tuple[dict[str, Any], str | None]] = {}
    reused = 0
    for k, (seed, spec) in enumerate(units, 1):
        path = _unit_path(work, seed, spec)
        key = {"seed": seed, "spec": spec, "profile": profile, "code": codes[spec]}
        unit = stored[(seed, spec)]
        stale = "none stored" if unit is None else _stale(unit, key, now)
        if stale is None:
            reused += 1
            print(
                f"[{k}/{len(units)}] seed {seed}, {spec}: stored ({path}): exit {unit['exit']}, "
                f"{len(unit['alarms'])} alarm rows; its key covers {len(unit['files'])} files and "
                f"{len(unit['distributions'])} distributions",
                flush=True,
            )
            done[(seed, spec)] = (unit, None)
            continue
        print(f"[{k}/{len(units)}] profile {profile}, seed {seed}, {spec} ({stale}) ...", flush=True)
        result, why = _fresh(one, key, workers)
        head = f"[{k}/{len(units)}] seed {seed}, {spec}: exit {result['exit']}, {len(result['alarms'])} alarm rows"
        if why is None:
            write_json(path, result, quiet=True)
            print(f"{head}, {result['seconds']:.0f} s ({result['summary']}); stored in {path}", flush=True)
        else:
            print(f"{head}: did not finish, {why}; not stored (a later call runs it again)", flush=True)
        done[(seed, spec)] = (result, why)
    return done, reused


def _runs(specs: Sequence[str], seeds: Sequence[int], done: dict) -> list[dict[str, Any]]:
    """One run per seed: its units over every implementation, joined (time summed, the first exit other than 0)."""
    runs = []
    for seed in seeds:
        parts = [done[(seed, spec)][0] for spec in specs]
        runs.append(
            {
                "seed": seed,
                "seconds": sum(r["seconds"] for r in parts),
                "exit": next((r["exit"] for r in parts if r["exit"] != 0), 0),
                "exits": {r["spec"]: r["exit"] for r in parts},
                "did_not_finish": [
                    {"spec": spec, "exit": done[(seed, spec)][0]["exit"], "why": done[(seed, spec)][1]}
                    for spec in specs
                    if done[(seed, spec)][1] is not None
                ],
                "alarms": [a for r in parts for a in r["alarms"]],
                "failed_lines": [x for r in parts for x in r["failed_lines"]][:20],
                "summary": "; ".join(f"{r['spec']}: {r['summary']}" for r in parts),
            }
        )
    return runs


def _report(
    specs: Sequence[str],
    seeds: Sequence[int],
    profile: str,
    workers: int,
    work: Path,
    codes: dict,
    done: dict,
    runs: list[dict[str, Any]],
    reused: int,
) -> Report:
    """The report of the runs: the verdict (runs with an alarm), the table, failed tests, what each key covers."""
    alarmed = sum(1 for r in runs if r["exit"] != 0 or r["alarms"] or r["did_not_finish"])
    unfinished = sum(len(r["did_not_finish"]) for r in runs)
    total = sum(r["seconds"] for r in runs)
    rep = Report(
        f"conformance-false-alarms-{profile}",
        f"False alarms: the suite on correct implementations, profile {profile}",
        precision="per dtype",
        seed=",".join(map(str, seeds)),
        packages=("numpy", "hypothesis", "torch"),
    )
    rep.verdict = (
        f"{alarmed} of {len(runs)} runs raised an alarm on {len(specs)} implementations believed correct "
        f"(goal 0); {total / 60:.1f} minutes of runs in all"
        + (f"; {unfinished} units did not finish (not stored: a later call runs them again)" if unfinished else "")
    )
    rep.add(
        "",
        f"Implementations: {', '.join(f'`{s}`' for s in specs)}. Each run is `aiayn check SPEC --profile {profile} "
        f"--seed S --workers {workers}`, one implementation at a time (the per-call time limit and worker processes of "
        "`aiayn check`); a run of the table is one seed over every implementation. An alarm is a failed check, an "
        "inconclusive row, or a run that did not end with exit 0 (a unit that did not finish, killed by a signal or "
        "ended by pytest with an exit other than 0 or 1, is such a run, and is not stored).",
        "",
        f"Units (seed x implementation): {len(seeds) * len(specs)}, of which {reused} were stored by an earlier call "
        f"for the same key (`{work}`); code hashes: {', '.join(f'{s} {c}' for s, c in codes.items())}; the files and "
        "distributions each key covers are listed below.",
        "",
    )
    rep.table(
        ["seed", "exit", "alarm rows", "did not finish", "wall time (s)", "pytest summary"],
        [
            [
                r["seed"],
                r["exit"],
                "; ".join(
                    f"{a['impl']} {a['equation']} [{a['dtype']}]: "
                    + " ".join([a["status"], ", ".join(a["tests"])]).strip()
                    for a in r["alarms"]
                )
                or "none",
                "; ".join(f"{u['spec']}: {u['why']}" for u in r["did_not_finish"]) or "none",
                f"{r['seconds']:.0f}",
                r["summary"],
            ]
            for r in runs
        ],
        "rrllrl",
    )
    failed = [line for r in runs for line in r["failed_lines"]]
    if failed:
        rep.section("Failed tests", *[f"- `{line}`" for line in failed])
    keys = _covered(specs, seeds, codes, done)
    rep.section(
        "What each implementation's key covers",
        "A stored unit is reused only while its suite code hash, the code of each of these files (a Python file's "
        "syntax tree: comments, layout and docstrings do not count) and the version of each of these distributions "
        "are unchanged.",
        "",
        *[
            f"- `{spec}`: code hash {key['code']}; files: {', '.join(f'`{f}`' for f in key['files']) or 'none'}; "
            f"distributions: {', '.join(f'{d} {v}' for d, v in key['distributions'].items()) or 'none'}"
            for spec, key in keys.items()
        ],
    )
    rep.data = {
        "profile": profile,
        "specs": list(specs),
        "seeds": list(seeds),
        "workers": workers,
        "runs": runs,
        "alarmed_runs": alarmed,
        "total_seconds": total,
        "codes": codes,
        "keys": keys,
        "reused_units": reused,
        "units_not_finished": unfinished,
    }
    rep.scope = Scope(
        label=f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} x {len(specs)} implementations",
        size=float(len(seeds) * len(specs)),
        full=len(seeds) >= FULL_SEEDS.get(profile, 20),
    )
    return rep


def _covered(
    specs: Sequence[str],
    seeds: Sequence[int],
    codes: Mapping[str, str],
    done: Mapping[tuple[int, str], tuple[dict[str, Any], str | None]],
) -> dict[str, dict[str, Any]]:
    """Each implementation's key: its code hash and the files and distributions of its units (all seeds)."""
    keys: dict[str, dict[str, Any]] = {}
    for spec in specs:
        units = [done[(seed, spec)][0] for seed in seeds]
        files = sorted({name for unit in units for name in unit["files"]})
        distributions = {d: v for unit in units for d, v in unit["distributions"].items()}
        keys[spec] = {"code": codes[spec], "files": files, "distributions": dict(sorted(distributions.items()))}
    return keys
