"""Did a benchmark case get slower than its baseline? A factor and a rank test must both say so.

Each case of a benchmark run yields a *sample* of figures of merit, one per timed round: the
fraction of the machine's GEMM ceiling that the round achieved (higher is better). A case of the
current run is a regression against the same case of a stored baseline run only when both hold:

1. its median fell by more than ``factor`` (default 1.1): ``current median < baseline median / factor``;
2. a one-sided Mann-Whitney U test on the two raw samples finds the current sample stochastically
   smaller than the baseline one, with ``p < alpha`` (default 0.002).

This is the rule of airspeed velocity (asv): ``asv compare`` and ``asv continuous`` report a
benchmark as changed only when it moved by more than ``--factor`` (default 1.1,
https://asv.readthedocs.io/en/stable/commands.html) and when the Mann-Whitney U test on the raw
samples agrees at ``p < 0.002`` (``asv.statistics.is_different``, ``p_threshold=0.002``). asv tests
two-sided; here the question has a direction (did it get slower?), so the test is one-sided, which
at the same threshold is the two-sided test at 0.004 restricted to drops. The factor keeps a tiny
but consistent drop (a quieter neighbour, a warmer cache) from failing a run; the test keeps one
unlucky round from doing so.

Samples too small for the test to reach ``alpha`` at all (3 rounds against 3 give at best
p = 1/20) are *undecided*: not a regression, and said so in the verdict, as asv also declines to
trust the test there.

The test: Mann, H. B. and Whitney, D. R. (1947), "On a test of whether one of two random variables
is stochastically larger than the other", Ann. Math. Statist. 18(1), 50-60. Exact null
distribution when the pooled sample has no ties and both sizes are at most ``EXACT_MAX_SIZE``;
otherwise the normal approximation with continuity correction and tie-corrected variance.

Against K >= 3 baseline runs the unit is the run instead of the round (:func:`compare_case_runs`): the rounds
of one run share that run's state of a shared machine, and two runs of unchanged code can differ by more than
the rank test on rounds allows. A case then regressed when its median fell below the normal prediction bound of
the K runs' medians, at ``alpha`` shared among the cases, and beyond the factor (:func:`run_level_bound`).

Pure computation: no timing and no I/O; the same inputs always give the same verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import numpy as np

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_FACTOR",
    "DEFAULT_MARGIN",
    "DUET_ALPHA",
    "DuetVerdict",
    "duet_blocks",
    "duet_case",
    "duet_compare",
    "sign_bound_rank",
    "EXACT_MAX_SIZE",
    "EXIT_INCOMPATIBLE",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "CaseVerdict",
    "Comparison",
    "compare_case",
    "compare_case_runs",
    "compare_runs_samples",
    "compare_samples",
    "exit_status",
    "incompatible",
    "mann_whitney_less",
    "run_level_bound",
    "smallest_p",
    "student_t_quantile",
    "student_t_upper_tail",
]

DEFAULT_FACTOR = 1.1  # asv's --factor default
DEFAULT_ALPHA = 0.002  # asv.statistics.is_different's p_threshold
EXACT_MAX_SIZE = 50  # both samples at most this long (and no ties): exact null distribution

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INCOMPATIBLE = 4


def _as_sample(values: Sequence[float], name: str) -> np.ndarray:
    """``values`` as a 1-D float64 array; ValueError naming ``name`` unless non-empty and finite."""
    try:
        sample = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a sequence of numbers, got {values!r}") from None
    if sample.ndim != 1:
        raise ValueError(f"{name}: expected a flat sequence of numbers, got shape {sample.shape}")
    if sample.size == 0:
        raise ValueError(f"{name}: expected at least one round, got an empty sample")
    bad = np.flatnonzero(~np.isfinite(sample))
    if bad.size:
        raise ValueError(f"{name}: expected finite numbers, got {sample[bad[0]]} at round {bad[0]}")
    return sample


def _u_statistic(current: np.ndarray, baseline: np.ndarray) -> float:
    """Pairs (c, b) with c > b, plus 0.5 per pair with c == b (Mann & Whitney 1947's U of ``current``)."""
    ordered = np.sort(baseline)
    below = np.searchsorted(ordered, current, side="left")  # baseline values < c
    at_or_below = np.searchsorted(ordered, current, side="right")  # baseline values <= c
    return float(below.sum() + 0.5 * (at_or_below - below).sum())


@cache
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings of two untied samples of sizes n and m give U = 0, 1, ..., n m.

    Mann & Whitney (1947) count them with the recursion r(n, m, u) = r(n-1, m, u-m) + r(n, m-1, u)
    (the largest value belongs to the first sample, beating all m of the second, or to the second).
    Its solution is the Gaussian binomial coefficient [n+m choose n]_q, whose coefficient of q^u is
    r(n, m, u) (Di Bucchianico, A. (1999), "Combinatorics, computer algebra and the Wilcoxon-Mann-
    Whitney test", J. Statist. Plann. Inference 79, 349-364), built here as the product over
    i = 1..n of (1 - q^(m+i)) / (1 - q^i): each factor is exact in Python integers, O(n m) steps.
    """
    counts = [1] + [0] * (n * m)
    for i in range(1, n + 1):
        for u in range(n * m, m + i - 1, -1):  # times (1 - q^(m+i)), highest power first
            counts[u] -= counts[u - m - i]
        for u in range(i, n * m + 1):  # divided by (1 - q^i): a running sum with stride i
            counts[u] += counts[u - i]
    return tuple(counts)


def _exact_p_less(u: float, n: int, m: int) -> float:
    """P(U <= u) under the null hypothesis, from the exact counts (``u`` an integer: no ties)."""
    counts = _u_counts(n, m)
    return sum(counts[: int(u) + 1]) / math.comb(n + m, n)


def _normal_p_less(u: float, n: int, m: int, pooled: np.ndarray) -> float:
    """P(U <= u) by the normal approximation, with continuity correction and tie-corrected variance.

    Mean n m / 2; variance n m / 12 * ((N + 1) - sum(t^3 - t) / (N (N - 1))), N = n + m, t the size of
    each group of tied values (Lehmann, E. L. (1975), Nonparametrics: Statistical Methods Based on
    Ranks, Ch. 1, the normal approximation and its treatment of ties). The same formula is
    scipy.stats.mannwhitneyu's "asymptotic" method. When every value is tied the variance is zero,
    U sits at its mean and there is no evidence either way: p = 1.
    """
    total = n + m
    _, tie_sizes = np.unique(pooled, return_counts=True)
    ties = float(np.sum(tie_sizes.astype(np.float64) ** 3 - tie_sizes))
    variance = n * m / 12.0 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0.0:
        return 1.0
    z = (u - n * m / 2.0 + 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def mann_whitney_less(
    current: Sequence[float], baseline: Sequence[float], *, method: Literal["auto", "exact", "normal"] = "auto"
) -> tuple[float, float]:
    """Mann-Whitney U of ``current`` against ``baseline`` and the one-sided p that current is smaller.

    U counts the pairs (c, b) with c > b, plus 0.5 per tied pair; a small U means current values
    tend to lie below baseline ones. p = P(U <= observed U) when both samples come from one
    distribution (Mann & Whitney 1947): small p is evidence that ``current`` is stochastically
    smaller. ``method="auto"`` uses the exact null distribution when the pooled sample has no ties
    and both sizes are at most ``EXACT_MAX_SIZE``, otherwise the normal approximation;
    ``"exact"`` (no ties allowed) and ``"normal"`` force one.
    """
    current = _as_sample(current, "current")
    baseline = _as_sample(baseline, "baseline")
    n, m = current.size, baseline.size
    pooled = np.concatenate([current, baseline])
    untied = np.unique(pooled).size == pooled.size
    if method == "auto":
        method = "exact" if untied and max(n, m) <= EXACT_MAX_SIZE else "normal"
    if method == "exact" and not untied:
        raise ValueError("method: 'exact' needs a pooled sample without ties; use 'normal' or 'auto'")
    if method not in ("exact", "normal"):
        raise ValueError(f"method: expected 'auto', 'exact' or 'normal', got {method!r}")
    u = _u_statistic(current, baseline)
    p = _exact_p_less(u, n, m) if method == "exact" else _normal_p_less(u, n, m, pooled)
    return u, min(1.0, p)


def smallest_p(n: int, m: int) -> float:
    """The smallest one-sided p the exact test can give for samples of sizes n and m: 1 / C(n+m, n).

    It is reached when every value of one sample lies below every value of the other (U = 0). When
    it is not below the threshold, no outcome of the test can count as significant.
    """
    if n < 1 or m < 1:
        raise ValueError(f"n, m: expected sample sizes of at least 1, got {n} and {m}")
    return 1.0 / math.comb(n + m, n)


@dataclass(frozen=True)
class CaseVerdict:
    """One case's figure in both runs, the test's p, and whether it counts as a regression.

    ``change`` is current_median / baseline_median - 1 (negative: slower). ``undecided`` marks a
    drop beyond the factor whose samples are too small for the test to reach ``alpha``: not a
    regression, but not cleared either. ``reason`` says all of it in one line.
    """

    case: str
    baseline_median: float
    current_median: float
    change: float
    p: float
    regressed: bool
    undecided: bool
    reason: str


def _check_thresholds(factor: float, alpha: float) -> None:
    """ValueError naming the argument unless 1 <= factor < inf and 0 < alpha < 1."""
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ValueError(f"factor: expected a finite number >= 1 (1.1 allows a 10% drop), got {factor!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: expected a p-value threshold strictly between 0 and 1, got {alpha!r}")


def compare_case(
    case: str,
    baseline: Sequence[float],
    current: Sequence[float],
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
) -> CaseVerdict:
    """The verdict on one case: regressed only if its median fell beyond ``factor`` and ``p < alpha``.

    Checked in this order: a median within the factor is not a regression whatever the test says;
    a drop beyond it with samples whose smallest possible p is not below ``alpha`` is undecided;
    otherwise the test decides.
    """
    _check_thresholds(factor, alpha)
    baseline = _as_sample(baseline, f"baseline (case {case!r})")
    current = _as_sample(current, f"current (case {case!r})")
    baseline_median, current_median = float(np.median(baseline)), float(np.median(current))
    if baseline_median <= 0.0:
        raise ValueError(f"baseline (case {case!r}): expected a positive median figure, got {baseline_median}")
    change = current_median / baseline_median - 1.0
    _, p = mann_whitney_less(current, baseline)
    head = f"ratio {baseline_median:.3g} -> {current_median:.3g} ({change:+.1%})"
    floor = smallest_p(current.size, baseline.size)
    regressed = undecided = False
    if not current_median < baseline_median / factor:
        reason = f"{head} within the factor {factor:g}: not a regression"
    elif floor >= alpha:
        undecided = True
        reason = (
            f"{head}, but samples of {baseline.size} and {current.size} rounds cannot reach p < {alpha:g} "
            f"(smallest p {floor:.2g}): undecided, not a regression"
        )
    elif p < alpha:
        regressed = True
        reason = f"{head}, Mann-Whitney p = {p:.2g} < {alpha:g}: regressed"
    else:
        reason = f"{head}, Mann-Whitney p = {p:.2g} >= {alpha:g}: not significant"
    return CaseVerdict(case, baseline_median, current_median, change, p, regressed, undecided, reason)


@dataclass(frozen=True)
class Comparison:
    """Verdicts on the cases both runs measured (sorted by case), and the cases only one run has.

    With several baseline runs: ``only_baseline`` are cases some baseline run has and the current run lacks,
    ``only_current`` cases no baseline run has, and ``in_some_baselines`` cases the current run has but only some
    of the baseline runs (no bound: not compared)."""

    verdicts: tuple[CaseVerdict, ...]
    only_baseline: tuple[str, ...]
    only_current: tuple[str, ...]
    in_some_baselines: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[CaseVerdict, ...]:
        """The verdicts that count as regressions."""
        return tuple(v for v in self.verdicts if v.regressed)

    @property
    def undecided(self) -> tuple[CaseVerdict, ...]:
        """The verdicts whose samples were too small to decide a drop beyond the factor."""
        return tuple(v for v in self.verdicts if v.undecided)


def compare_samples(
    baseline: Mapping[str, Sequence[float]],
    current: Mapping[str, Sequence[float]],
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    """``compare_case`` on every case in both runs; the cases only one run has are listed, not dropped."""
    _check_thresholds(factor, alpha)
    common = sorted(baseline.keys() & current.keys())
    verdicts = tuple(compare_case(case, baseline[case], current[case], factor, alpha) for case in common)
    return Comparison(
        verdicts=verdicts,
        only_baseline=tuple(sorted(baseline.keys() - current.keys())),
        only_current=tuple(sorted(current.keys() - baseline.keys())),
    )


_ENVIRONMENT_KEYS = {
    "machine": "baseline from another machine",
    "host": "baseline from another host (ratios move by tens of percent between VMs of one kind)",
    "device": "baseline from another device",
    "threads": "baseline ran with another thread count",
}


def _recorded(env: Mapping[str, Any], key: str) -> str:
    """``env[key]`` as it reads in a message, or "(not recorded)"."""
    return repr(env[key]) if key in env else "(not recorded)"


def _library_differences(baseline_libraries: Mapping[str, Any], current_libraries: Mapping[str, Any]) -> str | None:
    """The libraries both runs used whose version/build strings differ, baseline first; None if none."""
    shared = sorted(baseline_libraries.keys() & current_libraries.keys())
    differing = [k for k in shared if baseline_libraries[k] != current_libraries[k]]
    if not differing:
        return None
    before = ", ".join(f"{k} {baseline_libraries[k]}" for k in differing)
    after = ", ".join(f"{k} {current_libraries[k]}" for k in differing)
    return f"baseline from another library build: {before} vs {after}"


def incompatible(baseline_env: Mapping[str, Any], current_env: Mapping[str, Any]) -> str | None:
    """None when the baseline may be compared with the current run, else one line saying why not.

    Ceiling ratios are comparable only on the same kind of machine and device, at the same thread
    count, with the same library builds. The keys read (each optional):

    - ``"machine"``: the CPU model or machine kind, a string;
    - ``"host"``: the host (VM) identity, a string (``benchmarks/conftest.py`` ``host``);
    - ``"device"``: where the cases ran (``"cpu"``, ``"cuda:0"``, ...);
    - ``"threads"``: the thread count the run pinned;
    - ``"libraries"``: a mapping of library name to version/build string (``{"numpy": "2.4.6
      (openblas 0.3.29)"}``).

    ``machine``, ``host``, ``device`` and ``threads`` must be equal when either run recorded them (recorded
    in one run only is a difference); absent from both is fine. Of ``libraries``, those both runs
    name must be equal; a library only one run names is fine (it served no case of the other).
    Every difference found goes on the one line, separated by "; ", baseline's value first.
    """
    reasons = [
        f"{why}: {_recorded(baseline_env, key)} vs {_recorded(current_env, key)}"
        for key, why in _ENVIRONMENT_KEYS.items()
        if (key in baseline_env or key in current_env) and baseline_env.get(key) != current_env.get(key)
    ]
    libraries = _library_differences(baseline_env.get("libraries", {}), current_env.get("libraries", {}))
    if libraries is not None:
        reasons.append(libraries)
    return "; ".join(reasons) or None


def exit_status(comparison: Comparison, incompatible_reason: str | None) -> int:
    """The exit status of a comparison: 4 if the runs may not be compared, else 1 on any regression, else 0."""
    if incompatible_reason is not None:
        return EXIT_INCOMPATIBLE
    return EXIT_REGRESSION if comparison.regressions else EXIT_OK


def _check_df(df: int) -> None:
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"df: expected a whole number of degrees of freedom >= 1, got {df!r}")


def student_t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t distribution with ``df`` degrees of freedom.

    For t >= 0 it is I_x(df/2, 1/2) / 2 with x = df / (df + t^2), I the regularized incomplete beta function
    (Abramowitz, M. and Stegun, I. A. (1964), Handbook of Mathematical Functions, 26.7.1 with 26.5.27), evaluated
    by mpmath; by symmetry P(T > -t) = 1 - P(T > t).
    """
    import mpmath

    _check_df(df)
    if not math.isfinite(t):
        return 0.0 if t > 0 else 1.0
    tail = float(mpmath.betainc(df / 2.0, 0.5, 0, df / (df + t * t), regularized=True)) / 2.0
    return tail if t >= 0 else 1.0 - tail


@cache
def student_t_quantile(q: float, df: int) -> float:
    """The ``q``-quantile of Student's t distribution with ``df`` degrees of freedom, for 0.5 <= q < 1: the t
    with :func:`student_t_upper_tail` equal to 1 - q, found by bisection to the resolution of a float."""
    _check_df(df)
    if not 0.5 <= q < 1.0:
        raise ValueError(f"q: expected a quantile in [0.5, 1), got {q!r}")
    lo, hi = 0.0, 1.0
    while student_t_upper_tail(hi, df) > 1.0 - q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if student_t_upper_tail(mid, df) > 1.0 - q else (lo, mid)
    return hi


def run_level_bound(
    changes: Sequence[float], cases: int, factor: float = DEFAULT_FACTOR, alpha: float = DEFAULT_ALPHA
) -> float:
    """The lowest change of one case's median that a new run of the unchanged code should reach, from earlier runs.

    ``changes`` are that case's median changes (current / baseline - 1) in K >= 3 earlier runs of the unchanged
    code against one baseline. The rounds of one run share that run's state of the machine (its neighbours, its
    clocks), so the run, not the round, is the unit of replication: the logs of the changes are treated as K
    draws from a normal distribution, and a new run's log change falls below the one-sided prediction bound

        mean - t_{K-1}(1 - alpha / cases) * sd * sqrt(1 + 1/K)

    with probability alpha / cases (the prediction interval for one new observation, Hahn, G. J. and Meeker,
    W. Q. (1991), Statistical Intervals, section 4.6); Bonferroni over the ``cases`` of a run keeps the chance
    that any case of an unchanged run falls below its bound at most ``alpha``. The bound is never closer to the
    mean than the factor (``mean - log(factor)``), as the factor rule has it. Returned as a change (negative).
    """
    _check_thresholds(factor, alpha)
    sample = _as_sample(changes, "changes")
    if sample.size < 3:
        raise ValueError(f"changes: expected at least 3 earlier runs to estimate a spread, got {sample.size}")
    if np.any(sample <= -1.0):
        raise ValueError(f"changes: expected changes above -1 (a positive figure), got {sample.min()}")
    if not (isinstance(cases, int) and cases >= 1):
        raise ValueError(f"cases: expected the number of cases in a run (>= 1), got {cases!r}")
    logs = np.log1p(sample)
    k = logs.size
    spread = student_t_quantile(1.0 - alpha / cases, k - 1) * float(np.std(logs, ddof=1)) * math.sqrt(1.0 + 1.0 / k)
    return math.expm1(float(np.mean(logs)) - max(math.log(factor), spread))


def compare_case_runs(
    case: str,
    baseline_medians: Sequence[float],
    current: Sequence[float],
    cases: int,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
) -> CaseVerdict:
    """The verdict on one case against K >= 3 baseline runs, with the run as the unit: regressed only if the
    current median falls below the case's :func:`run_level_bound` from the baseline runs' medians.

    The baseline figure is the geometric mean of the K medians (the centre of the bound); ``p`` is the one-sided
    p-value of the current run's log median under the same normal model, P(T_{K-1} <= (log c - mean) /
    (sd sqrt(1 + 1/K))), so a case below its bound has p < alpha / cases (when the bound is not the factor's).
    """
    _check_thresholds(factor, alpha)
    medians = _as_sample(baseline_medians, f"baseline medians (case {case!r})")
    current = _as_sample(current, f"current (case {case!r})")
    if medians.size < 3:
        raise ValueError(f"baseline medians (case {case!r}): expected at least 3 baseline runs, got {medians.size}")
    if np.any(medians <= 0.0):
        raise ValueError(f"baseline medians (case {case!r}): expected positive figures, got {medians.min()}")
    logs = np.log(medians)
    k = logs.size
    centre = math.exp(float(np.mean(logs)))
    current_median = float(np.median(current))
    change = current_median / centre - 1.0
    bound = run_level_bound(np.expm1(logs - np.mean(logs)), cases, factor, alpha)
    scale = float(np.std(logs, ddof=1)) * math.sqrt(1.0 + 1.0 / k)
    if current_median <= 0.0:
        p = 0.0
    elif scale > 0.0:
        p = 1.0 - student_t_upper_tail((math.log(current_median) - float(np.mean(logs))) / scale, k - 1)
    else:
        p = 0.0 if current_median < centre else 1.0
    head = f"ratio {centre:.3g} (geometric mean of {k} baseline runs) -> {current_median:.3g} ({change:+.1%})"
    regressed = change < bound
    if regressed:
        reason = f"{head}, below the bound {bound:+.1%} of the baseline runs (p = {p:.2g}): regressed"
    else:
        reason = f"{head}, within the bound {bound:+.1%} of the baseline runs: not a regression"
    return CaseVerdict(case, centre, current_median, change, p, regressed, False, reason)


def compare_runs_samples(
    baselines: Sequence[Mapping[str, Sequence[float]]],
    current: Mapping[str, Sequence[float]],
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    """:func:`compare_case_runs` on every case in all K >= 3 baseline runs and the current run (Bonferroni over
    those cases); a case missing from some baseline run or from the current run is listed, not dropped
    (:class:`Comparison` says in which list)."""
    _check_thresholds(factor, alpha)
    if len(baselines) < 3:
        raise ValueError(f"baselines: expected at least 3 baseline runs for a run-level verdict, got {len(baselines)}")
    in_every = set.intersection(*(set(b) for b in baselines))
    in_any = set.union(*(set(b) for b in baselines))
    common = sorted(in_every & current.keys())
    verdicts = tuple(
        compare_case_runs(
            case, [float(np.median(b[case])) for b in baselines], current[case], len(common), factor, alpha
        )
        for case in common
    )
    return Comparison(
        verdicts=verdicts,
        only_baseline=tuple(sorted(in_any - current.keys())),
        only_current=tuple(sorted(current.keys() - in_any)),
        in_some_baselines=tuple(sorted((in_any - in_every) & current.keys())),
    )


# --------------------------------------------------------------------------------------------
# the duet: paired rounds of two sides in one run (``aiayn.benchmarks.duet``)

#: A duet's case regressed only if it is slower by more than this fraction with confidence: the smallest change a
#: verdict is drawn on (the rounds of one host resolve about 1%; ``aiayn bench-noise --duet`` measures the rates).
DEFAULT_MARGIN = 0.02
#: The duet's level, shared among the cases (Bonferroni): the chance that a run of unchanged code flags any case,
#: were the rounds' block ratios independent.
DUET_ALPHA = 0.01


@dataclass(frozen=True)
class DuetVerdict:
    """One case of a duet: ``ratio``, the median of its blocks' new / old time ratios (above 1: the new side is
    slower); ``lower``, a lower confidence bound of that median (None: too few blocks for the level); regressed when
    ``lower`` exceeds 1 + margin."""

    case: str
    blocks: int
    ratio: float
    lower: float | None
    regressed: bool
    reason: str

    @property
    def undecided(self) -> bool:
        return self.lower is None


def duet_blocks(ratios: Sequence[float]) -> list[float]:
    """The rounds' ratios in blocks of two (new first, then old first): each block's geometric mean, in which the
    advantage of going first in a round cancels (it divides one ratio and multiplies the other). An odd last round
    is left out."""
    r = _as_sample(ratios, "ratios")
    if np.any(r <= 0):
        raise ValueError(f"ratios: expected positive time ratios, got {r[r <= 0][:3].tolist()}")
    return [math.sqrt(float(r[i] * r[i + 1])) for i in range(0, len(r) - 1, 2)]


def sign_bound_rank(m: int, alpha: float) -> int | None:
    """The rank k (1-based) of the order statistic x_(k) of ``m`` independent draws that is a lower confidence bound
    of their median at level ``1 - alpha``: the largest k with P(Binomial(m, 1/2) <= k - 1) <= alpha (x_(k) lies
    above the median only if at most k - 1 draws fall below it). None when even the smallest draw is not such a bound
    (2^-m > alpha): too few draws for the level."""
    if not (isinstance(m, int) and m >= 1):
        raise ValueError(f"m: expected a positive whole number of draws, got {m!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: expected a level strictly between 0 and 1, got {alpha!r}")
    k, cdf = 0, 0.0
    for j in range(m + 1):
        cdf += math.comb(m, j) / 2.0**m
        if cdf > alpha:
            break
        k = j + 1
    return k or None


def duet_case(case: str, ratios: Sequence[float], margin: float, alpha: float) -> DuetVerdict:
    """The verdict on one case from its rounds' ratios (new / old time, in the order they ran): regressed when the
    distribution-free lower bound of the median block ratio (:func:`sign_bound_rank`, level ``1 - alpha``) exceeds
    ``1 + margin``."""
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin: expected a fraction >= 0, got {margin!r}")
    blocks = sorted(duet_blocks(ratios))
    if not blocks:
        raise ValueError(f"ratios of {case}: expected at least 2 rounds, got {len(ratios)}")
    median = float(np.median(blocks))
    k = sign_bound_rank(len(blocks), alpha)
    if k is None:
        return DuetVerdict(case, len(blocks), median, None, False, f"{len(blocks)} blocks: too few for p < {alpha:.2g}")
    lower = blocks[k - 1]
    regressed = lower > 1.0 + margin
    reason = (
        f"new/old time {median:.3f} (median of {len(blocks)} blocks), at least {lower:.3f} at level "
        f"{1 - alpha:.4g}: {'beyond' if regressed else 'within'} the margin {1 + margin:.3f}"
    )
    return DuetVerdict(case, len(blocks), median, lower, regressed, reason)


def duet_compare(
    cases: Mapping[str, Sequence[float]], margin: float = DEFAULT_MARGIN, alpha: float = DUET_ALPHA
) -> list[DuetVerdict]:
    """Every case's verdict, ``alpha`` shared among them (each at ``alpha / len(cases)``), in the cases' order."""
    if not cases:
        raise ValueError("cases: a duet of no case decides nothing")
    return [duet_case(case, ratios, margin, alpha / len(cases)) for case, ratios in cases.items()]
