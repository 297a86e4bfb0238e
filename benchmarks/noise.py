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

The report then asks where the false regressions come from: per case, the spread of the rounds within one run (what
the rank test sees) beside the spread of the medians from run to run (what it cannot see), and the rates of a gate
that takes the run as its unit (:func:`aiayn.benchmarks.verdict.run_level_bound`), measured on the same stored runs
by cross-validation: each run is judged by bounds estimated from unchanged runs of the other fold only.
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

__all__ = [
    "DEFAULT_SLOWDOWNS",
    "DEFAULT_SPEC",
    "FOLDS",
    "add_arguments",
    "cross_validated",
    "duet_measure",
    "duet_run",
    "measure",
    "run",
    "spread_by_case",
    "summarise",
]

DEFAULT_SPEC = "aiayn.benchmarks.slowed:numpy"
DEFAULT_SLOWDOWNS = (0.05, 0.10, 0.20)
#: The cases of each run: one dtype, two lengths, both masks, the forward and forward+backward passes.
DEFAULT_CASES = {"sizes": "512,2048", "dtypes": "float32", "passes": "forward,forward+backward"}
DETECTED = 0.95  # "reliably": detected in at least this fraction of the runs
FOLDS = 2  # the run-level gate's cross-validation: runs split by repeat number, even and odd
SMALL_K = 5  # ... and what a baseline of only this many runs gives


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
    p.add_argument(
        "--duet",
        action="store_true",
        help="measure the duet instead (aiayn bench --against): each run a duet of a slowed copy (or the unchanged "
        "code) against the unchanged code, in one run, no stored history -> benchmarks-noise-duet.{md,json} "
        "(default: the stored-baseline gates)",
    )
    p.add_argument("--rounds", type=int, default=None, help="paired rounds per case of each duet (default: 40)")
    p.add_argument(
        "--causal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the causal cases (--no-causal: only the unmasked ones; default: both)",
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
    from aiayn.benchmarks.compare import case_samples, load_run

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
    base = load_run(baseline)
    return {
        "settings": settings,
        "baseline": base.get("aiayn", {}),
        "baseline_samples": case_samples(base),
        "runs": runs,
    }


def _stem(settings: dict[str, Any]) -> str:
    from aiayn.benchmarks.report import spec_stem

    return spec_stem([settings["spec"]])


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


def _log_spread(values: list[float]) -> float | None:
    """A robust relative spread of positive ``values``: 1.4826 times the median absolute deviation of their logs
    (the standard deviation for normal logs, and not moved by a few stray rounds), or None below 2 values."""
    if len(values) < 2:
        return None
    logs = np.log(values)
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


def spread_by_case(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Per case: the spread of the baseline's rounds (within one run) and of the unchanged runs' medians (between
    runs), both as :func:`_log_spread`, and how many unchanged runs flagged that case."""
    unchanged = [r for r in measured["runs"] if r["extra"] == 0.0]
    samples = measured.get("baseline_samples", {})
    cases = sorted({v["case"] for r in unchanged for v in r["verdicts"]})
    out = []
    for case in cases:
        verdicts = [v for r in unchanged for v in r["verdicts"] if v["case"] == case]
        out.append(
            {
                "case": case,
                "rounds": len(samples.get(case, [])),
                "within_run_spread": _log_spread(samples.get(case, [])),
                "between_run_spread": _log_spread([1.0 + v["change"] for v in verdicts]),
                "runs": len(verdicts),
                "flagged": sum(v["regressed"] for v in verdicts),
            }
        )
    return out


def cross_validated(
    measured: dict[str, Any],
    folds: int = FOLDS,
    factor: float | None = None,
    alpha: float | None = None,
    k: int | None = None,
) -> dict[str, Any] | None:
    """The rates of the run-level gate on the stored runs, each run judged by bounds from the other folds.

    Runs fall into ``folds`` folds by repeat number (repeat % folds), so each fold spans the whole measurement
    in time. For a fold, each case's bound (:func:`verdict.run_level_bound`) comes from the changes of that case
    in the unchanged runs of the other folds; a run of the fold (unchanged or slowed) is flagged when some case's
    change falls below its bound. With ``k``, only the first ``k`` of those runs (by repeat number) are learnt
    from: what a baseline of k runs gives. Returns the rows (per kind of run: runs, flagged, rate) and each fold's
    bounds, or None when some fold would have fewer than 3 (or ``k``) unchanged runs to learn from.
    """
    from aiayn.benchmarks import verdict as V

    factor = V.DEFAULT_FACTOR if factor is None else factor
    alpha = V.DEFAULT_ALPHA if alpha is None else alpha
    runs = measured["runs"]
    cases = sorted({v["case"] for r in runs for v in r["verdicts"]})
    flagged: dict[int, bool] = {}
    bounds = []
    for fold in range(folds):
        train = sorted(
            (r for r in runs if r["extra"] == 0.0 and r["repeat"] % folds != fold), key=lambda r: r["repeat"]
        )
        if len(train) < max(3, k or 0):
            return None
        train = train[:k] if k else train
        changes = {c: [v["change"] for r in train for v in r["verdicts"] if v["case"] == c] for c in cases}
        bound = {c: V.run_level_bound(changes[c], len(cases), factor, alpha) for c in cases}
        bounds.append({"fold": fold, "training_runs": len(train), "bounds": bound})
        for i, r in enumerate(runs):
            if r["repeat"] % folds == fold:
                flagged[i] = any(v["change"] < bound[v["case"]] for v in r["verdicts"])
    rows = []
    for extra in [0.0, *measured["settings"]["slowdowns"]]:
        mine = [i for i, r in enumerate(runs) if r["extra"] == extra]
        hits = sum(flagged[i] for i in mine)
        rows.append(
            {"extra_work": extra, "runs": len(mine), "flagged": hits, "rate": hits / len(mine) if mine else None}
        )
    return {"folds": folds, "k": k, "factor": factor, "alpha": alpha, "rows": rows, "bounds": bounds}


def _rates(unchanged: dict[str, Any], slowed: list[dict[str, Any]], unit: str, goal: str) -> str:
    """The verdict of a noise report: false regressions of the unchanged ``unit`` (runs, duets), detection at each
    slowdown against the goal at ``goal``, and the smallest slowdown detected reliably."""
    reliable = [r["extra_work"] for r in slowed if r["rate"] is not None and r["rate"] >= DETECTED]
    return (
        f"{unchanged['flagged']} of {unchanged['runs']} {unit} of the unchanged code flagged a regression "
        f"(false-regression rate {unchanged['rate']:.0%}, goal 0); detection "
        + ", ".join(f"{r['rate']:.0%} at {r['extra_work']:.0%} more work" for r in slowed)
        + f" (goal >= {DETECTED:.0%} at {goal}); the smallest slowdown detected in >= {DETECTED:.0%} of {unit} here: "
        + (f"{min(reliable):.0%}." if reliable else "none of those measured.")
    )


def _kind(extra: float) -> str:
    return "unchanged" if extra == 0 else f"{extra:.0%} more work"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


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
    if args.duet:
        from aiayn.benchmarks.duet import DEFAULT_ROUNDS
        from aiayn.benchmarks.verdict import DEFAULT_MARGIN

        rounds = DEFAULT_ROUNDS if args.rounds is None else args.rounds
        check_range("--rounds", rounds, least=4)
        return duet_run(args, {**settings, "rounds": rounds, "margin": DEFAULT_MARGIN, "causal": args.causal}, out)
    if args.rounds is not None or args.causal is not None:
        raise UsageError("--rounds, --causal: settings of a duet's measurement; give --duet with them")
    measured = measure(settings, Path(args.work) if args.work else cache_dir() / "bench-noise")
    rows = summarise(measured)
    unchanged, slowed = rows[0], rows[1:]
    report = Report(
        name="benchmarks-noise",
        title="The regression gate of aiayn bench on this machine: false regressions and detections",
        precision=settings["dtypes"],
        seed="0",
        packages=("numpy", "torch", "pytest-benchmark"),
    )
    report.verdict = _rates(unchanged, slowed, "runs", "20%")
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
    spread = spread_by_case(measured)
    cv = cross_validated(measured)
    cv_small = cross_validated(measured, k=SMALL_K)
    report.section(
        "Where the false regressions come from",
        "The rank test compares the rounds of two runs; the rounds of one run share that run's state of the "
        "machine, so the test sees the spread within a run but not the spread from one run to the next. Per case, "
        "both spreads as 1.4826 times the median absolute deviation of the log of the ratio (the standard "
        "deviation for normal logs, unmoved by a few stray rounds; of the baseline's rounds, and of the unchanged "
        "runs' medians), and how many unchanged runs the asv rule flagged on that case:",
        "",
        *md_table(
            ["case", "rounds (baseline)", "within one run", "between runs", "unchanged runs flagged on it"],
            [
                [
                    r["case"],
                    r["rounds"],
                    _pct(r["within_run_spread"]),
                    _pct(r["between_run_spread"]),
                    f"{r['flagged']} of {r['runs']}",
                ]
                for r in spread
            ],
            "lrrrr",
        ),
    )
    cases = len(spread)
    if cv is not None:
        first, *rest = cv["rows"]
        report.verdict += (
            f" A gate with the run as its unit (bounds from earlier unchanged runs, cross-validated on these runs): "
            f"{first['flagged']} of {first['runs']} unchanged runs flagged; detection "
            + ", ".join(f"{r['rate']:.0%} at {r['extra_work']:.0%}" for r in rest)
            + "."
        )
    if cv is None:
        report.section(
            "A gate with the run as its unit",
            f"Not measured: its cross-validation needs at least 3 unchanged runs outside each of {FOLDS} folds "
            f"(--repeats {2 * FOLDS} or more at {FOLDS} folds; this run had {unchanged['runs']}).",
        )
    else:
        report.section(
            "A gate with the run as its unit: `--baseline` with K runs (cross-validated on the same runs)",
            f"Each case gets a bound from K earlier unchanged runs: the one-sided normal prediction bound on "
            f"the log of its median change, mean - t(K-1, 1 - {cv['alpha']:g}/{cases}) sd sqrt(1 + 1/K), never "
            f"nearer the mean than the factor {cv['factor']:g} (Bonferroni over the {cases} cases: under the model "
            f"an unchanged run falls below some bound with probability at most {cv['alpha']:g}; "
            "`aiayn.benchmarks.verdict.run_level_bound`). A run is flagged when a case falls below its bound. "
            f"Measured here without new runs: the stored runs split into {cv['folds']} folds by repeat number, and "
            "every run is judged by bounds from the unchanged runs of the other fold only (never from itself). It "
            "is the rule of `aiayn bench SPEC --baseline R1 ... RK` given K >= 3 stored runs "
            "(`aiayn.benchmarks.verdict.compare_case_runs`: the same bound on the same logs, all shifted by the one "
            "baseline's), with K the training runs of each fold (the bounds' table).",
            "",
            *md_table(
                [
                    "code",
                    "runs",
                    "one baseline run (asv's rule, above)",
                    f"K = {cv['bounds'][0]['training_runs']} runs",
                    *([f"K = {SMALL_K} runs"] if cv_small else []),
                ],
                [
                    [
                        _kind(r["extra_work"]),
                        r["runs"],
                        f"{a['flagged']} ({a['rate']:.0%})",
                        f"{r['flagged']} ({r['rate']:.0%})",
                        *([f"{sm['flagged']} ({sm['rate']:.0%})"] if cv_small else []),
                    ]
                    for r, a, sm in zip(cv["rows"], rows, cv_small["rows"] if cv_small else cv["rows"])
                ],
                "lrrr" + ("r" if cv_small else ""),
            ),
            "",
            "Runs flagged (rate): of the unchanged runs, false regressions; of a slowed copy, detections.",
            "",
            "The bounds of each fold (change of the median against the one baseline):",
            "",
            *md_table(
                ["case", *[f"fold {b['fold']} ({b['training_runs']} runs)" for b in cv["bounds"]]],
                [[c, *[f"{b['bounds'][c]:+.1%}" for b in cv["bounds"]]] for c in sorted(cv["bounds"][0]["bounds"])],
                "l" + "r" * len(cv["bounds"]),
            ),
        )
    report.data.update(
        settings=settings,
        summary=rows,
        runs=measured["runs"],
        baseline_setup=record,
        spread_by_case=spread,
        run_level_gate=cv,
        run_level_gate_small=cv_small,
    )
    write_report(out, report, "benchmarks-noise", force=args.force)
    print(report.verdict)
    return 0


# --------------------------------------------------------------------------------------------
# the duet's rates


def duet_measure(settings: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """Every duet of the measurement (resumed from ``work``): per repeat, the unchanged code against itself, then
    each slowed copy against the unchanged code, each a duet of its own two processes (``aiayn.benchmarks.duet``)."""
    from aiayn.benchmarks import duet
    from aiayn.benchmarks.cases import build_cases
    from aiayn.benchmarks.verdict import duet_compare

    work.mkdir(parents=True, exist_ok=True)
    stamp = work / "settings.json"
    if stamp.exists() and json.loads(stamp.read_text(encoding="utf-8")) != settings:
        raise SystemExit(f"aiayn bench-noise --duet: --work {work} holds runs of other settings; give another --work")
    stamp.write_text(json.dumps(settings, indent=1), encoding="utf-8")
    masks = ("causal", "full") if settings["causal"] is None else (("causal",) if settings["causal"] else ("full",))
    cases = build_cases(
        [settings["spec"]],
        settings["dtypes"].split(","),
        [int(n) for n in settings["sizes"].split(",")],
        (),
        (),
        masks=masks,
        passes=tuple(settings["passes"].split(",")),
    )
    kinds = [0.0, *settings["slowdowns"]]
    total, runs = settings["repeats"] * len(kinds), []
    old = duet.Side(settings["spec"], "unchanged", None, {EXTRA_WORK_VAR: "0"})
    for repeat in range(settings["repeats"]):
        for extra in kinds:
            path = work / f"duet-{repeat:03d}-extra-{extra:g}.json"
            if not path.exists():
                load, start = list(os.getloadavg()), time.monotonic()
                new = duet.Side(settings["spec"], _kind(extra), None, {EXTRA_WORK_VAR: f"{extra:g}"})
                measured = duet.run(new, old, cases, settings["rounds"])
                verdicts = duet_compare({c["case"]: c["ratios"] for c in measured["cases"]}, settings["margin"])
                record = {
                    "repeat": repeat,
                    "extra": extra,
                    "flagged": any(v.regressed for v in verdicts),
                    "loadavg_before": load,
                    "seconds": time.monotonic() - start,
                    "verdicts": [
                        {"case": v.case, "ratio": v.ratio, "lower": v.lower, "regressed": v.regressed} for v in verdicts
                    ],
                    "ratios": {c["case"]: c["ratios"] for c in measured["cases"]},
                }
                path.write_text(json.dumps(record, indent=1), encoding="utf-8")
                print(
                    f"[{len(runs) + 1}/{total}] duet, {_kind(extra)}: "
                    f"{'flagged' if record['flagged'] else 'not flagged'} (load {load[0]:.2f}, "
                    f"{record['seconds']:.0f} s)",
                    flush=True,
                )
            runs.append(json.loads(path.read_text(encoding="utf-8")))
    return runs


def duet_run(args: argparse.Namespace, settings: dict[str, Any], out: Path) -> int:
    """``aiayn bench-noise --duet``: measure the duets (resuming), then write ``benchmarks-noise-duet.{md,json}``."""
    from aiayn.environment import cache_dir
    from aiayn.kit import Report, md_table, write_report

    runs = duet_measure(settings, Path(args.work) if args.work else cache_dir() / "bench-noise-duet")
    rows = []
    for extra in [0.0, *settings["slowdowns"]]:
        mine = [r for r in runs if r["extra"] == extra]
        ratios = [v["ratio"] for r in mine for v in r["verdicts"]]
        loads = [r["loadavg_before"][0] for r in mine]
        rows.append(
            {
                "extra_work": extra,
                "runs": len(mine),
                "flagged": sum(r["flagged"] for r in mine),
                "rate": sum(r["flagged"] for r in mine) / len(mine),
                "median_ratio": float(np.median(ratios)),
                "ratio_range": [min(ratios), max(ratios)],
                "load_range": [min(loads), max(loads)],
                "seconds_median": float(np.median([r["seconds"] for r in mine])),
            }
        )
    unchanged, slowed = rows[0], rows[1:]
    report = Report(
        name="benchmarks-noise-duet",
        title="The duet of aiayn bench --against on this machine: false regressions and detections in one run",
        precision=settings["dtypes"],
        seed="0",
        packages=("numpy", "torch"),
    )
    report.verdict = (
        _rates(unchanged, slowed, "duets", "5%") + " No stored history: each duet decides on its own rounds."
    )
    cases = len(runs[0]["verdicts"]) if runs else 0
    report.add(
        "",
        f"Each duet is `aiayn bench {settings['spec']} --against {settings['spec']}` on {cases} cases (sizes "
        f"{settings['sizes']}, {settings['dtypes']}, passes {settings['passes']}, masks "
        f"{'both' if settings['causal'] is None else 'causal' if settings['causal'] else 'full'}), "
        f"{settings['rounds']} paired rounds a case, one thread, with `{EXTRA_WORK_VAR}` set on the new side only "
        "(0 for the unchanged code). A duet counts as flagged when some case regressed: the distribution-free lower "
        f"confidence bound of its median block ratio (new/old time) exceeded {1 + settings['margin']:.3f}, the level "
        "0.01 shared among the cases (`aiayn.benchmarks.verdict.duet_compare`). The kinds were interleaved.",
    )
    report.section(
        "Noise table",
        *md_table(
            ["code", "duets", "flagged", "rate", "median new/old", "range of new/old", "1-min load", "s a duet"],
            [
                [
                    _kind(r["extra_work"]),
                    r["runs"],
                    r["flagged"],
                    f"{r['rate']:.0%}",
                    f"{r['median_ratio']:.3f}",
                    f"{r['ratio_range'][0]:.3f} to {r['ratio_range'][1]:.3f}",
                    f"{r['load_range'][0]:.2f} - {r['load_range'][1]:.2f}",
                    f"{r['seconds_median']:.0f}",
                ]
                for r in rows
            ],
            "lrrrrrrr",
        ),
        "",
        "Rate: of the unchanged duets, the false-regression rate; of a slowed copy, the detection rate. New/old: each "
        "case's median block ratio, over every case of every duet of that kind (a copy doing x more work reads about "
        "1 + x).",
    )
    report.data.update(settings=settings, summary=rows, runs=runs)
    write_report(out, report, "benchmarks-noise-duet", force=args.force)
    print(report.verdict)
    return 0
