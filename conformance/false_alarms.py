"""How often does the suite fail a correct implementation? ``aiayn false-alarms``.

Runs the whole suite on implementations believed correct (every built-in by default) once per
Hypothesis seed, each run exactly as ``aiayn check`` does (worker processes, the per-call time
limit), and counts what a user would see as an alarm: a failed check, an inconclusive row, a run
that did not finish. The goal is 0. Writes ``conformance-false-alarms-<profile>.md`` and ``.json``
with the count, every alarm's test and message head, and the wall time of each run.

Known deviations that still deviate are expected results, not alarms; one that no longer deviates
fails its run (strict) and is counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.conformance.runner import pytest_arguments
from aiayn.kit import Report, write_report

__all__ = ["run"]


def _one(specs: Sequence[str], profile: str, seed: int, workers: int, folder: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", *pytest_arguments(specs, profile=profile, seed=seed, workers=workers, report=folder,
                                                             extra=["--tb=line", "-rfE"])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    alarms = []
    for path in sorted(folder.glob("conformance-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        alarms += [{"impl": data["implementation"], "equation": r["equation"], "dtype": r["dtype"], "status": r["status"],
                    "tests": r["failed_tests"]} for r in data["rows"] if r["status"] in ("fail", "inconclusive")]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"seed": seed, "seconds": seconds, "exit": proc.returncode, "alarms": alarms, "failed_lines": lines[:20],
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""}


def run(specs: Sequence[str], *, profile: str, seeds: Sequence[int], workers: int, out: Path) -> int:
    """Run the suite once per seed; write the report; return the number of runs with an alarm."""
    runs = []
    for k, seed in enumerate(seeds, 1):
        print(f"[{k}/{len(seeds)}] profile {profile}, seed {seed}: {' '.join(specs)} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            result = _one(specs, profile, seed, workers, Path(tmp))
        runs.append(result)
        print(f"[{k}/{len(seeds)}] seed {seed}: exit {result['exit']}, {len(result['alarms'])} alarm rows, {result['seconds']:.0f} s "
              f"({result['summary']})", flush=True)
    alarmed = sum(1 for r in runs if r["exit"] != 0 or r["alarms"])
    total = sum(r["seconds"] for r in runs)
    rep = Report(f"conformance-false-alarms-{profile}", f"False alarms: the suite on correct implementations, profile {profile}",
                 precision="per dtype", seed=",".join(map(str, seeds)), packages=("numpy", "hypothesis", "torch"))
    rep.verdict = (f"{alarmed} of {len(runs)} runs raised an alarm on {len(specs)} implementations believed correct "
                   f"(goal 0); {total / 60:.1f} minutes in all")
    rep.add("", f"Implementations: {', '.join(f'`{s}`' for s in specs)}. Each run is `aiayn check ... --profile {profile} "
            f"--seed S --workers {workers}` (the per-call time limit and worker processes of `aiayn check`). An alarm is a failed "
            "check, an inconclusive row, or a run that did not end with exit 0.", "")
    rep.table(["seed", "exit", "alarm rows", "wall time (s)", "pytest summary"],
              [[r["seed"], r["exit"], "; ".join(f"{a['impl']} {a['equation']} [{a['dtype']}]: {a['status']} {', '.join(a['tests'])}"
                                                 for a in r["alarms"]) or "none", f"{r['seconds']:.0f}", r["summary"]] for r in runs],
              "rrlrl")
    failed = [line for r in runs for line in r["failed_lines"]]
    if failed:
        rep.section("Failed tests", *[f"- `{line}`" for line in failed])
    rep.data = {"profile": profile, "specs": list(specs), "seeds": list(seeds), "workers": workers, "runs": runs, "alarmed_runs": alarmed,
                "total_seconds": total}
    write_report(out, rep)
    return alarmed
