"""Compare two benchmark runs by their ceiling ratios, not their times (the report's "against the baseline").

pytest-benchmark's own ``--benchmark-compare`` (and ``--benchmark-compare-fail``) compare *times*
(min, mean, ...), which drift between machines and with the load of a shared VM. Our figure of
merit is the fraction of the machine's GEMM ceiling, measured in the same run and stored by each
case in pytest-benchmark's ``extra_info`` (``ratio_full``; ``ratio_useful`` for causal work), which
pytest-benchmark does not compare. This module does: for every case in both runs it gives the
baseline ratio, the current ratio and the relative change, and names every case that lost more
than ``max_drop`` (default 10%) of its ratio; the benchmark report shows that table and verdict.
``aiayn bench`` also passes the baseline to ``--benchmark-compare``, so pytest-benchmark's time
table appears beside it for reference.

Ratios are comparable across machines only for the same thread count (checked) and the same
library build; the BLAS kernel each run used is printed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.environment import UsageError

__all__ = ["Comparison", "case_figures", "compare_runs", "format_comparison", "load_run"]

FIGURES = ("ratio_full", "ratio_useful")
DEFAULT_MAX_DROP = 0.10


def load_run(path: Path) -> dict[str, Any]:
    """A pytest-benchmark JSON file written with ``--benchmark-json`` (or saved by ``--benchmark-save``)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read a pytest-benchmark JSON file ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise UsageError(f"{path}: expected pytest-benchmark JSON with a 'benchmarks' list")
    return with_session_ceiling(data)


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
    """``{case id: figure}`` for the attention cases of ``run`` that recorded ``figure``."""
    out = {}
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        if "case" in info and isinstance(info.get(figure), (int, float)):
            out[info["case"]] = float(info[figure])
    return out


def _threads(run: dict[str, Any]) -> int | None:
    return run.get("aiayn", {}).get("threads")


@dataclass
class Comparison:
    """Per common case: (baseline, current, relative change); plus what only one side has."""

    figure: str
    max_drop: float
    rows: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    only_baseline: list[str] = field(default_factory=list)
    only_current: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[str]:
        """Cases whose figure fell by more than ``max_drop`` (relative)."""
        return [case for case, (_, _, change) in self.rows.items() if change < -self.max_drop]


def compare_runs(
    baseline: dict[str, Any], current: dict[str, Any], figure: str = "ratio_full", max_drop: float = DEFAULT_MAX_DROP
) -> Comparison:
    """Compare ``figure`` case by case; relative change = current / baseline - 1."""
    if figure not in FIGURES:
        raise ValueError(f"figure: expected one of {FIGURES}, got {figure!r}")
    if not max_drop >= 0:
        raise ValueError(f"max_drop: expected a fraction >= 0, got {max_drop!r}")
    base, cur = case_figures(baseline, figure), case_figures(current, figure)
    result = Comparison(figure, max_drop)
    for case in sorted(base.keys() & cur.keys()):
        result.rows[case] = (base[case], cur[case], cur[case] / base[case] - 1.0 if base[case] else float("inf"))
    result.only_baseline = sorted(base.keys() - cur.keys())
    result.only_current = sorted(cur.keys() - base.keys())
    if _threads(baseline) != _threads(current):
        result.warnings.append(
            f"thread counts differ: baseline {_threads(baseline)}, current {_threads(current)}; ratios are not "
            "comparable"
        )
    return result


def format_comparison(result: Comparison) -> list[str]:
    """Plain-text lines: one per common case, then the regressions and the one-sided cases."""
    lines = [
        f"{'case':45s} {'baseline':>9s} {'current':>9s} {'change':>8s}  ({result.figure}, fraction of the GEMM ceiling)"
    ]
    for case, (b, c, change) in result.rows.items():
        flag = "  REGRESSION" if case in result.regressions else ""
        lines.append(f"{case:45s} {b:9.3f} {c:9.3f} {change:+8.1%}{flag}")
    lines += [f"warning: {w}" for w in result.warnings]
    if result.only_baseline:
        lines.append(f"only in the baseline: {', '.join(result.only_baseline)}")
    if result.only_current:
        lines.append(f"only in this run: {', '.join(result.only_current)}")
    verdict = (
        f"{len(result.regressions)} of {len(result.rows)} cases lost more than {result.max_drop:.0%} of their ratio: "
        f"{', '.join(result.regressions)}"
        if result.regressions
        else f"no case lost more than {result.max_drop:.0%} of its ratio ({len(result.rows)} compared)"
    )
    return lines + [verdict]
