"""How often the regression gate of ``aiayn bench --baseline`` is wrong on this machine: ``aiayn bench-noise``.

Two rates, measured by running the gate for real (``aiayn bench`` as a subprocess, one thread, as a user's CI runs
it) against one baseline of the unchanged code:

- the *false-regression rate*: of ``--repeats`` runs of the unchanged implementation, the fraction that exit 1
  (goal 0);
- the *detection rate* at each slowdown in ``--slowdowns``: of ``--repeats`` runs of a copy doing that fraction
  more work per call (``aiayn.benchmarks.slowed``: the same Eq. (1) again on that fraction of the query rows, real
  work, not a sleep), the fraction that exit 1 (goal >= 0.95 at 20%).

The runs are interleaved (unchanged, 5%, 10%, 20%, unchanged, ...), so that a slow hour of the machine falls on
every kind alike; each records the load average before it starts. Every finished run is stored in ``--work`` and
found again by a later call with the same settings (an interrupted measurement resumes). The report,
``benchmarks-noise.{md,json}``, states the rates, the measured change of each slowed copy (its median ratio
against the baseline's), the loads, and the smallest slowdown the gate detected in at least 95% of its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.benchmarks.slowed import EXTRA_WORK_VAR

__all__ = ["DEFAULT_SLOWDOWNS", "DEFAULT_SPEC", "add_arguments", "measure", "run"]

DEFAULT_SPEC = "aiayn.benchmarks.slowed:numpy"
DEFAULT_SLOWDOWNS = (0.05, 0.10, 0.20)
#: The cases of each run: one dtype, two lengths, both masks, the forward and forward+backward passes.
DEFAULT_CASES = {"sizes": "512,2048", "dtypes": "float32", "passes": "forward,forward+backward"}
DETECTED = 0.95  # "reliably": detected in at least this fraction of the runs


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``aiayn bench-noise``."""
    p.add_argument("--repeats", type=int, default=20, help="runs of the unchanged code and of each slowed copy")
    p.add_argument(
        "--slowdowns",
        default=",".join(f"{x:g}" for x in DEFAULT_SLOWDOWNS),
        help="extra work of the slowed copies, fractions of a call",
    )
    p.add_argument("--spec", default=DEFAULT_SPEC, help="a slowable implementation (aiayn.benchmarks.slowed:NAME)")
    p.add_argument("--sizes", default=DEFAULT_CASES["sizes"], help="sequence lengths of each run")
    p.add_argument("--dtypes", default=DEFAULT_CASES["dtypes"], help="dtypes of each run")
    p.add_argument("--passes", default=DEFAULT_CASES["passes"], help="passes of each run")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where each finished run is stored and found again (default: aiayn's cache, bench-noise/)",
    )


def _settings(args: argparse.Namespace, slowdowns: list[float]) -> dict[str, Any]:
    return {
        "spec": args.spec,
        "sizes": args.sizes,
        "dtypes": args.dtypes,
        "passes": args.passes,
        "repeats": args.repeats,
        "slowdowns": slowdowns,
    }


def _bench(settings: dict[str, Any], extra: float, out: Path, baseline: Path | None, save: Path | None) -> int:
    """One ``aiayn bench`` of ``settings['spec']`` doing ``extra`` more work; its exit status."""
    cmd = [sys.executable, "-m", "aiayn", "bench", settings["spec"], "--out", str(out), "--force"]
    cmd += ["--sizes", settings["sizes"], "--dtypes", settings["dtypes"], "--passes", settings["passes"]]
    if baseline is not None:
        cmd += ["--baseline", str(baseline)]
    if save is not None:
        cmd += ["--save", str(save)]
    env = dict(os.environ, **{EXTRA_WORK_VAR: f"{extra:g}"})
    proc = subprocess.run(cmd + ["--", "-q"], env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        tail = (proc.stdout[-2000:] + proc.stderr[-2000:]).strip()
        raise RuntimeError(f"aiayn bench exited {proc.returncode} (extra work {extra:g}):\n{tail}")
    return proc.returncode


def measure(settings: dict[str, Any], work: Path) -> dict[str, Any]:
    """Every run of the measurement (resumed from ``work``): the baseline, then the interleaved runs."""
    from aiayn.benchmarks.compare import load_run

    work.mkdir(parents=True, exist_ok=True)
    stamp = work / "settings.json"
    if stamp.exists() and json.loads(stamp.read_text(encoding="utf-8")) != settings:
        raise SystemExit(f"aiayn bench-noise: --work {work} holds runs of other settings; give another --work")
    stamp.write_text(json.dumps(settings, indent=1), encoding="utf-8")
    baseline = work / "baseline.json"
    if not baseline.exists():
        print("baseline: the unchanged code, saved", flush=True)
        _bench(settings, 0.0, work / "reports", None, baseline)
    kinds = [0.0, *settings["slowdowns"]]
    runs = []
    total = settings["repeats"] * len(kinds)
    for repeat in range(settings["repeats"]):
        for extra in kinds:
            path = work / f"run-{repeat:03d}-extra-{extra:g}.json"
            if not path.exists():
                load = list(os.getloadavg())
                start = time.monotonic()
                status = _bench(settings, extra, work / "reports", baseline, None)
                report = json.loads((work / "reports" / f"{_stem(settings)}.json").read_text(encoding="utf-8"))
                record = {
                    "repeat": repeat,
                    "extra": extra,
                    "exit": status,
                    "loadavg_before": load,
                    "seconds": time.monotonic() - start,
                    "verdicts": report["comparison"]["verdicts"],
                }
                path.write_text(json.dumps(record, indent=1), encoding="utf-8")
                print(
                    f"[{len(runs) + 1}/{total}] extra work {extra:.0%}: exit {status} "
                    f"(load {load[0]:.2f}, {record['seconds']:.0f} s)",
                    flush=True,
                )
            runs.append(json.loads(path.read_text(encoding="utf-8")))
    return {"settings": settings, "baseline": load_run(baseline).get("aiayn", {}), "runs": runs}


def _stem(settings: dict[str, Any]) -> str:
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in settings["spec"])
    return f"bench-{safe}"[:120]


def summarise(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kind of run (extra work 0, then each slowdown): runs, runs flagged, the rate, the measured changes."""
    out = []
    for extra in [0.0, *measured["settings"]["slowdowns"]]:
        runs = [r for r in measured["runs"] if r["extra"] == extra]
        changes = [v["change"] for r in runs for v in r["verdicts"]]
        flagged_cases = [v["regressed"] for r in runs for v in r["verdicts"]]
        loads = [r["loadavg_before"][0] for r in runs]
        out.append(
            {
                "extra_work": extra,
                "runs": len(runs),
                "flagged": sum(r["exit"] == 1 for r in runs),
                "rate": sum(r["exit"] == 1 for r in runs) / len(runs) if runs else None,
                "case_rate": sum(flagged_cases) / len(flagged_cases) if flagged_cases else None,
                "median_change": float(np.median(changes)) if changes else None,
                "change_range": [min(changes), max(changes)] if changes else None,
                "load_range": [min(loads), max(loads)] if loads else None,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    """``aiayn bench-noise``: measure (resuming), then write ``benchmarks-noise.{md,json}``."""
    from aiayn.environment import UsageError, cache_dir, check_range, out_dir
    from aiayn.kit import Report, md_table, write_report

    check_range("--repeats", args.repeats, least=1)
    try:
        slowdowns = sorted(float(x) for x in args.slowdowns.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--slowdowns: expected comma-separated fractions, got {args.slowdowns!r}") from None
    if not slowdowns or min(slowdowns) <= 0 or max(slowdowns) > 1:
        raise UsageError(f"--slowdowns: expected fractions in (0, 1], got {args.slowdowns!r}")
    out = out_dir(args.out)
    settings = _settings(args, slowdowns)
    measured = measure(settings, Path(args.work) if args.work else cache_dir() / "bench-noise")
    rows = summarise(measured)
    unchanged, slowed = rows[0], rows[1:]
    reliable = [r["extra_work"] for r in slowed if r["rate"] is not None and r["rate"] >= DETECTED]
    report = Report(
        name="benchmarks-noise",
        title="The regression gate of aiayn bench on this machine: false regressions and detections",
        precision=settings["dtypes"],
        seed="0",
        packages=("numpy", "torch", "pytest-benchmark"),
    )
    report.verdict = (
        f"{unchanged['flagged']} of {unchanged['runs']} runs of the unchanged code flagged a regression "
        f"(false-regression rate {unchanged['rate']:.0%}, goal 0); detection "
        + ", ".join(f"{r['rate']:.0%} at {r['extra_work']:.0%} more work" for r in slowed)
        + f" (goal >= {DETECTED:.0%} at 20%); the smallest slowdown detected in >= {DETECTED:.0%} of runs here: "
        + (f"{min(reliable):.0%}." if reliable else "none of those measured.")
    )
    record = measured["baseline"]
    report.add(
        "",
        f"Each run is `aiayn bench {settings['spec']} --sizes {settings['sizes']} --dtypes {settings['dtypes']} "
        f"--passes {settings['passes']} --baseline baseline.json` (one thread), with `{EXTRA_WORK_VAR}` set to the "
        "extra work (0 for the unchanged code), against one baseline of the unchanged code; a run counts as flagged "
        "when it exits 1 (some case regressed: its median ratio fell beyond the factor 1.1 and a one-sided "
        "Mann-Whitney U test on the rounds gave p < 0.002). Runs were interleaved across the kinds. Machine: "
        f"{record.get('cpu_model', 'n/a')}, {record.get('cpu_count', 'n/a')} CPUs.",
    )
    body = [
        [
            "unchanged" if r["extra_work"] == 0 else f"{r['extra_work']:.0%} more work",
            r["runs"],
            r["flagged"],
            f"{r['rate']:.0%}",
            f"{r['case_rate']:.0%}",
            f"{r['median_change']:+.1%}",
            f"{r['change_range'][0]:+.1%} to {r['change_range'][1]:+.1%}",
            f"{r['load_range'][0]:.2f} - {r['load_range'][1]:.2f}",
        ]
        for r in rows
    ]
    report.section(
        "Noise table",
        *md_table(
            [
                "code",
                "runs",
                "runs flagged (exit 1)",
                "rate",
                "cases flagged",
                "median change of the ratio",
                "range of the change",
                "1-min load before the runs",
            ],
            body,
            "lrrrrrrr",
        ),
        "",
        "Rate: of the unchanged runs, the false-regression rate; of a slowed copy, the detection rate. Change: each "
        "case's median ratio against the baseline's, over every case of every run of that kind (a copy doing x more "
        "work reads about -x/(1+x), plus the repeated call's fixed overhead).",
    )
    report.data.update(settings=settings, summary=rows, runs=measured["runs"], baseline_setup=record)
    write_report(out, report, "benchmarks-noise", force=args.force)
    print(report.verdict)
    return 0
