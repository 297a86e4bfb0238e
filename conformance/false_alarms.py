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
call skips a unit already stored for the same profile, seed, implementation and code (the hash of
the conformance package and of the implementation's module, :func:`aiayn.kit.code_hash`), so a
count that takes longer than one sitting accumulates over several; a unit stored for other code
is run again. The report counts only seeds whose every unit is stored for the current code.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.conformance.results import Row, Status
from aiayn.conformance.runner import pytest_arguments
from aiayn.kit import Report, Scope, code_hash, code_of, write_json, write_report

__all__ = ["run"]


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
    """The hash of the code a unit runs: every module of the conformance package, plus the implementation's own
    code: its module when it is one of aiayn's (a built-in or ``aiayn.…:attr``); for code outside aiayn, its
    module's source (syntax tree) and the version of the distribution that installed it, if any."""
    from aiayn.implementations.registry import BUILTINS

    folder = Path(__file__).resolve().parent
    modules = [
        f"aiayn.conformance.{path.stem}" for path in sorted(folder.glob("*.py")) if path.stem not in _NOT_IN_A_UNIT
    ]
    target = BUILTINS.get(spec, spec)
    if ":" in target and target.startswith("aiayn."):
        modules.append(target.split(":", 1)[0])
        return code_hash(*modules)
    digest = hashlib.sha256(code_hash(*modules).encode() + b"\0" + _outside_code(target))
    return digest.hexdigest()[:12]


def _outside_code(target: str) -> bytes:
    """What identifies the code of an implementation outside aiayn: ``module:attr``'s module source (its syntax
    tree, ``kit.code_of``) and its distribution's name and version; an entry-point name's target likewise."""
    import importlib.metadata
    import importlib.util

    if ":" not in target:  # an entry point: identified by its distribution
        found = [ep for ep in importlib.metadata.entry_points(group="aiayn.implementations") if ep.name == target]
        if not found:
            return target.encode()
        dist = found[0].dist
        return f"{found[0].value}|{dist.name if dist else '?'}|{dist.version if dist else '?'}".encode()
    module = target.split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    parts = [target.encode()]
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        parts.append(code_of(Path(spec.origin).read_bytes()))
    top = module.split(".", 1)[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        parts.append(f"{dist}=={importlib.metadata.version(dist)}".encode())
    return b"\0".join(parts)


def _unit_path(work: Path, seed: int, spec: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)
    return work / f"seed{seed}-{safe}.json"


def _stored(path: Path, profile: str, code: str) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if data.get("profile") == profile and data.get("code") == code else None


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

    one = one or _one
    work = Path(work) if work is not None else cache_dir() / "false-alarms" / profile
    codes = {spec: suite_code(spec) for spec in specs}
    units = [(seed, spec) for seed in seeds for spec in specs]
    done: dict[tuple[int, str], dict[str, Any]] = {}
    reused = 0
    for k, (seed, spec) in enumerate(units, 1):
        path = _unit_path(work, seed, spec)
        result = _stored(path, profile, codes[spec])
        if result is not None:
            reused += 1
            print(
                f"[{k}/{len(units)}] seed {seed}, {spec}: stored ({path}): exit {result['exit']}, "
                f"{len(result['alarms'])} alarm rows",
                flush=True,
            )
        else:
            print(f"[{k}/{len(units)}] profile {profile}, seed {seed}, {spec} ...", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                result = {
                    **one([spec], profile, seed, workers, Path(tmp)),
                    "spec": spec,
                    "profile": profile,
                    "code": codes[spec],
                }
            write_json(path, result, quiet=True)
            print(
                f"[{k}/{len(units)}] seed {seed}, {spec}: exit {result['exit']}, {len(result['alarms'])} alarm rows, "
                f"{result['seconds']:.0f} s ({result['summary']}); stored in {path}",
                flush=True,
            )
        done[(seed, spec)] = result
    runs = []
    for seed in seeds:
        parts = [done[(seed, spec)] for spec in specs]
        runs.append(
            {
                "seed": seed,
                "seconds": sum(r["seconds"] for r in parts),
                "exit": max(r["exit"] for r in parts),
                "alarms": [a for r in parts for a in r["alarms"]],
                "failed_lines": [x for r in parts for x in r["failed_lines"]][:20],
                "summary": "; ".join(f"{r['spec']}: {r['summary']}" for r in parts),
            }
        )
    alarmed = sum(1 for r in runs if r["exit"] != 0 or r["alarms"])
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
    )
    rep.add(
        "",
        f"Implementations: {', '.join(f'`{s}`' for s in specs)}. Each run is `aiayn check SPEC --profile {profile} "
        f"--seed S --workers {workers}`, one implementation at a time (the per-call time limit and worker processes of "
        "`aiayn check`); a run of the table is one seed over every implementation. An alarm is a failed check, an "
        "inconclusive row, or a run that did not end with exit 0.",
        "",
        f"Units (seed x implementation): {len(units)}, of which {reused} were stored by an earlier call for the same "
        f"code (`{work}`); code hashes: {', '.join(f'{s} {c}' for s, c in codes.items())}.",
        "",
    )
    rep.table(
        ["seed", "exit", "alarm rows", "wall time (s)", "pytest summary"],
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
                f"{r['seconds']:.0f}",
                r["summary"],
            ]
            for r in runs
        ],
        "rrlrl",
    )
    failed = [line for r in runs for line in r["failed_lines"]]
    if failed:
        rep.section("Failed tests", *[f"- `{line}`" for line in failed])
    rep.data = {
        "profile": profile,
        "specs": list(specs),
        "seeds": list(seeds),
        "workers": workers,
        "runs": runs,
        "alarmed_runs": alarmed,
        "total_seconds": total,
        "codes": codes,
        "reused_units": reused,
    }
    rep.scope = Scope(
        label=f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} x {len(specs)} implementations",
        size=float(len(seeds) * len(specs)),
        full=len(seeds) >= FULL_SEEDS.get(profile, 20),
    )
    write_report(out, rep, force=force)
    return alarmed
