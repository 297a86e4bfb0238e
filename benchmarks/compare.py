"""Compare two benchmark runs by their ceiling ratios, not their times: the regression verdict of ``--baseline``.

pytest-benchmark's own ``--benchmark-compare`` (and ``--benchmark-compare-fail``) compare *times*
(min, mean, ...), which drift between machines and with the load of a shared VM, and with no
statistics. Our figure of merit is the fraction of the machine's GEMM ceiling, measured in the same
run. Each attention case keeps every timed round (``round_times_s``), so each case has a *sample*
of ratios, one per round: its flops over that round's time, over the run's session ceiling
(``measure.apply_session_ceiling``). This module turns two runs into those samples and asks
:mod:`aiayn.benchmarks.verdict` which cases regressed (a drop beyond a factor that a Mann-Whitney U
test on the two samples confirms), after checking that the two runs may be compared at all (same
machine kind, device, thread count and library builds, and some case in common: a comparison of nothing is exit 4,
never a pass).

A case of a run recorded before rounds were kept has one figure (its best round): a sample of one,
which the test cannot decide on (said as "undecided", never as a pass or a regression).

The rounds of one run share that run's state of a shared machine, so two runs of unchanged code can differ by
more than their rounds suggest (``aiayn bench-noise`` measures how often). Given K >= 3 baseline runs, the
comparison takes the run as its unit instead: each case's median against a prediction bound from the K baseline
runs' medians (:func:`aiayn.benchmarks.verdict.compare_case_runs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.benchmarks import runfile
from aiayn.benchmarks import verdict as V
from aiayn.environment import UsageError

__all__ = [
    "FIGURES",
    "RunComparison",
    "case_figures",
    "case_samples",
    "check_baseline_count",
    "compare_runs",
    "describe_cases",
    "environment",
    "format_comparison",
    "format_reference",
    "holdings",
    "load_baseline",
    "load_run",
    "summary",
]

FIGURES = ("ratio_full", "ratio_useful")


def load_run(path: Path, option: str = "--from-run") -> dict[str, Any]:
    """A stored run of ``aiayn bench`` (pytest-benchmark JSON), every field checked (:func:`aiayn.benchmarks.runfile.
    load_run`: a one-line UsageError naming ``option``, the file and the field), with the session-ceiling rule."""
    return with_session_ceiling(runfile.load_run(Path(path), option))


def with_session_ceiling(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with every ratio against its session ceiling (runs recorded before that rule get it here).

    A run recorded when each case was divided by its own adjacent ceiling carries everything needed
    (each case's before/after ceilings, the session's start/end ceilings), so its ratios are
    recomputed the way current runs compute them and old baselines stay comparable.
    """
    from aiayn.benchmarks.measure import apply_session_ceiling

    record = run.get("aiayn", {})
    best = {(c["library"], c["dtype"], c["device"]): c["gflops"] for c in record.get("ceilings_best", [])}
    best = apply_session_ceiling(run["benchmarks"], best)
    if record:
        record["ceilings_best"] = [
            {"library": k[0], "dtype": k[1], "device": k[2], "gflops": v} for k, v in best.items()
        ]
    return run


def case_figures(run: dict[str, Any], figure: str) -> dict[str, float]:
    """``{case id: figure}`` for the attention cases of ``run`` that recorded ``figure`` (the best round's)."""
    out = {}
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        if "case" in info and isinstance(info.get(figure), (int, float)):
            out[info["case"]] = float(info[figure])
    return out


def _flops_of(figure: str) -> str:
    return {"ratio_full": "flops_full", "ratio_useful": "flops_useful"}[figure]


def case_samples(run: dict[str, Any], figure: str = "ratio_full") -> dict[str, list[float]]:
    """``{case id: [the figure of each timed round]}``: flops / round time / session ceiling per round.

    A case recorded without its rounds gives its one recorded figure (a sample of one).
    """
    if figure not in FIGURES:
        raise ValueError(f"figure: expected one of {FIGURES}, got {figure!r}")
    out = {}
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        if "case" not in info or not isinstance(info.get(figure), (int, float)):
            continue
        times = info.get("round_times_s")
        if times:
            flops, ceiling = info[_flops_of(figure)], info["ceiling_gflops"] * 1e9
            out[info["case"]] = [flops / t / ceiling for t in times]
        else:
            out[info["case"]] = [float(info[figure])]
    return out


def environment(run: dict[str, Any]) -> dict[str, Any]:
    """What a ratio depends on besides the code under test, as :func:`verdict.incompatible` reads it: the machine
    kind (CPU model, and the GPUs torch saw), the host (one VM: two VMs of one kind differ by tens of percent case by
    case), the devices the cases ran on, the thread count, the library builds."""
    record = run.get("aiayn", {})
    env: dict[str, Any] = {}
    machine = record.get("cpu_model")
    if machine is not None:
        gpus = record.get("cuda_devices") or []
        env["machine"] = machine + (f" + {', '.join(gpus)}" if gpus else "")
    if "host" in record:
        env["host"] = record["host"]
    devices = sorted({b["extra_info"]["device"] for b in run["benchmarks"] if "device" in b.get("extra_info", {})})
    if devices:
        env["device"] = ",".join(devices)
    if "threads" in record:
        env["threads"] = record["threads"]
    if "libraries" in record:
        env["libraries"] = record["libraries"]
    return env


@dataclass(frozen=True)
class RunComparison:
    """The verdict on every case both runs measured, or why the runs may not be compared (``incompatible``: another
    machine, device, thread count or build, or no case in common)."""

    figure: str
    factor: float
    alpha: float
    cases: V.Comparison
    incompatible: str | None
    one_round: tuple[str, ...]  # cases whose baseline kept only its best round (recorded before rounds were kept)
    baseline_runs: int = 1  # 1: the rank test on the rounds; K >= 3: the run-level bound from K baseline runs

    @property
    def rule(self) -> str:
        """The rule that decided, in words."""
        if self.baseline_runs == 1:
            return f"a drop beyond the factor {self.factor:g} with a one-sided Mann-Whitney p < {self.alpha:g}"
        return (
            f"a median below the normal prediction bound of {self.baseline_runs} baseline runs at "
            f"{self.alpha:g} over the cases, and beyond the factor {self.factor:g}"
        )

    @property
    def exit_status(self) -> int:
        """0: no regression; 1: a case regressed; 4: the baseline is from another machine, device or build, or it
        shares no case with this run (a comparison of nothing is never a pass)."""
        return V.exit_status(self.cases, self.incompatible)


def check_baseline_count(count: int) -> None:
    """UsageError unless ``count`` baseline runs name a rule: 1 (the rank test on rounds) or at least 3 (the run
    as the unit; two runs cannot estimate a spread worth a bound)."""
    if count == 2 or count < 1:
        raise UsageError(
            "--baseline: expected one stored run (the rank test on its rounds) or at least 3 (the run-level "
            f"bound from their medians), got {count}"
        )


def compare_runs(
    baselines: Sequence[dict[str, Any]],
    current: dict[str, Any],
    figure: str = "ratio_full",
    factor: float = V.DEFAULT_FACTOR,
    alpha: float = V.DEFAULT_ALPHA,
) -> RunComparison:
    """The verdict on every common case of ``current`` against ``baselines``: one stored run (the rank test on the
    two runs' per-round samples of ``figure``, :func:`verdict.compare_case`) or K >= 3 (the run-level bound,
    :func:`verdict.compare_case_runs`). Every baseline run must be comparable with ``current``, and the comparison must
    compare some case: a baseline that shares no case with ``current`` (another implementation, other sizes) makes
    the runs incompatible, as another machine does."""
    check_baseline_count(len(baselines))
    cur = case_samples(current, figure)
    bases = [case_samples(b, figure) for b in baselines]
    reasons = [V.incompatible(environment(b), environment(current)) for b in baselines]
    incompatible = next(
        (r if len(baselines) == 1 else f"baseline run {i + 1}: {r}" for i, r in enumerate(reasons) if r), None
    )
    if len(baselines) == 1:
        cases = V.compare_samples(bases[0], cur, factor, alpha)
        one_round = tuple(sorted(c for c in bases[0].keys() & cur.keys() if len(bases[0][c]) == 1))
    else:
        cases = V.compare_runs_samples(bases, cur, factor, alpha)
        one_round = ()
    if incompatible is None and not cases.verdicts:
        incompatible = _nothing_compared(baselines, bases, current, cur)
    return RunComparison(
        figure=figure,
        factor=factor,
        alpha=alpha,
        cases=cases,
        incompatible=incompatible,
        one_round=one_round,
        baseline_runs=len(baselines),
    )


def describe_cases(cases: Sequence[Mapping[str, Any]]) -> str:
    """Attention cases (each with its ``impl``, ``dtype`` and ``n``, where known) in a few words:
    ``4 cases of numpy (float32; n = 128, 512)``."""
    impls = sorted({str(c["impl"]) for c in cases if "impl" in c})
    dtypes = sorted({str(c["dtype"]) for c in cases if "dtype" in c})
    sizes = sorted({c["n"] for c in cases if isinstance(c.get("n"), int)})
    shown = ", ".join(map(str, sizes)) if len(sizes) <= 4 else f"{sizes[0]} to {sizes[-1]}"
    details = "; ".join(x for x in (", ".join(dtypes), f"n = {shown}" if sizes else "") if x)
    return (
        f"{len(cases)} case{'' if len(cases) == 1 else 's'}"
        + (f" of {', '.join(impls)}" if impls else "")
        + (f" ({details})" if details else "")
    )


def holdings(run: dict[str, Any]) -> str:
    """What ``run`` timed, in a few words (:func:`describe_cases` of its timed attention cases)."""
    return describe_cases(
        [
            b["extra_info"]
            for b in run["benchmarks"]
            if "case" in b.get("extra_info", {}) and isinstance(b["extra_info"].get("ratio_full"), (int, float))
        ]
    )


def _nothing_compared(
    baselines: Sequence[dict[str, Any]],
    bases: Sequence[dict[str, list[float]]],
    current: dict[str, Any],
    cur: dict[str, list[float]],
) -> str:
    """Why a comparison compared no case, in one line: the baseline run that shares none with ``current``, what it
    holds and what ran; or, of several baseline runs, that no case is in all of them and this run."""
    for i, (baseline, samples) in enumerate(zip(baselines, bases, strict=True)):
        if not samples.keys() & cur.keys():
            which = "the baseline" if len(baselines) == 1 else f"baseline run {i + 1}"
            return (
                f"compared nothing: {which} holds {holdings(baseline)}, this run {holdings(current)}; no case in common"
            )
    return f"compared nothing: no case of this run ({holdings(current)}) is in all {len(baselines)} baseline runs"


def format_comparison(result: RunComparison) -> list[str]:
    """Plain-text lines: one per common case (medians, change, p, verdict), then the verdict of the whole run."""
    if result.incompatible is not None:
        return [f"{_not_compared(result.incompatible)} (exit 4); record a baseline here with --save"]
    lines = [
        f"{'case':52s} {'baseline':>9s} {'current':>9s} {'change':>8s} {'p':>9s}  verdict  "
        f"({result.figure}: median of the rounds, fraction of the GEMM ceiling"
        + (")" if result.baseline_runs == 1 else f"; baseline: geometric mean of {result.baseline_runs} runs' medians)")
    ]
    for v in result.cases.verdicts:
        word = "REGRESSED" if v.regressed else "undecided" if v.undecided else "ok"
        lines.append(
            f"{v.case:52s} {v.baseline_median:9.3f} {v.current_median:9.3f} {v.change:+8.1%} {v.p:9.2g}  {word}"
        )
    if result.cases.only_baseline:
        lines.append(f"only in the baseline (not run now): {', '.join(result.cases.only_baseline)}")
    if result.cases.only_current:
        lines.append(f"only in this run (not in the baseline): {', '.join(result.cases.only_current)}")
    if result.cases.in_some_baselines:
        lines.append(
            "not compared, missing from some of the baseline runs: " + ", ".join(result.cases.in_some_baselines)
        )
    if result.one_round:
        lines.append(
            f"{len(result.one_round)} case(s) of the baseline kept only their best round (an older record): "
            f"a drop beyond the factor there is undecided (one round cannot reach p < {result.alpha:g})"
        )
    if result.cases.regressions:
        lines.append(summary(result) + ":")
        lines += [f"  {v.case}: {v.reason}" for v in result.cases.regressions]
    else:
        lines.append(summary(result))
    return lines


def format_reference(reference: dict[str, Any], current: dict[str, Any], figure: str = "ratio_full") -> list[str]:
    """Plain-text lines: ``reference`` (a stored run) beside ``current``, case by case (the medians of their rounds'
    ``figure`` and the change), with no verdict; the last line says why none is drawn (another host, machine or
    build, as :func:`verdict.incompatible` finds, or a reference asked for as such)."""
    ref, cur = case_samples(reference, figure), case_samples(current, figure)
    common = sorted(ref.keys() & cur.keys())
    lines = [
        f"{'case':52s} {'stored':>9s} {'this run':>9s} {'change':>8s}  ({figure}: median of the rounds, fraction of "
        "the GEMM ceiling)"
    ]
    for case in common:
        a, b = float(np.median(ref[case])), float(np.median(cur[case]))
        lines.append(f"{case:52s} {a:9.3f} {b:9.3f} {b / a - 1:+8.1%}")
    why = V.incompatible(environment(reference), environment(current))
    lines.append(
        f"{len(common)} case(s) in common; no verdict: "
        + (f"not comparable ({why})" if why else "a reference run, shown beside this one")
        + "; a regression is decided against runs of this host (--baseline) or by a duet of two revisions"
    )
    return lines


def _not_compared(reason: str) -> str:
    return reason if reason.startswith("compared nothing") else f"not compared: {reason}"


def summary(result: RunComparison) -> str:
    """The verdict on the whole run in one sentence."""
    if result.incompatible is not None:
        return _not_compared(result.incompatible)
    rule = result.rule
    regressed, undecided = result.cases.regressions, result.cases.undecided
    head = (
        f"{len(regressed)} of {len(result.cases.verdicts)} cases regressed ({rule}): "
        + ", ".join(v.case for v in regressed)
        if regressed
        else f"no case regressed ({rule}); {len(result.cases.verdicts)} compared"
    )
    if undecided:
        head += f"; {len(undecided)} undecided (samples too small to reach p < {result.alpha:g})"
    return head


def load_baseline(path: Path, option: str = "--baseline") -> dict[str, Any]:
    """A stored run to compare with; UsageError naming ``option`` if it is not one of ``aiayn bench``."""
    run = load_run(path, option)
    if not case_figures(run, "ratio_full"):
        raise UsageError(f"{option}: {path} holds no timed attention case of aiayn bench")
    return run
