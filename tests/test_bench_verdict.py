"""The regression verdict of ``aiayn bench --baseline``: Mann-Whitney p-values, the factor rule, what it flags.

p-values are checked on cases computed by hand, against a brute-force count over every split of a
small pooled sample, between the exact and the normal branch, and against scipy where it is
installed. The rule's error rates are checked on simulated samples (fixed seeds, no timing): runs
from one distribution are not flagged, a 30% slowdown is, a 5% drop is not (the factor), and
samples too small for the threshold are reported as undecided.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from aiayn.benchmarks import verdict

ROUNDS = 10
SIMULATIONS = 200


def _ratios(rng: np.random.Generator, tails: str, size: int = ROUNDS) -> np.ndarray:
    """A sample of ceiling ratios around 0.5 with 3% spread: normal noise, or Student t with 3 degrees of freedom."""
    noise = rng.standard_normal(size) if tails == "normal" else rng.standard_t(3, size)
    return 0.5 * (1.0 + 0.03 * noise)


def _brute_force_p_less(current: list[float], baseline: list[float]) -> float:
    """P(U <= observed U) by counting every way to split the pooled sample into two of the same sizes."""
    observed, _ = verdict.mann_whitney_less(current, baseline)
    pooled = current + baseline
    splits = list(itertools.combinations(range(len(pooled)), len(current)))
    at_most = 0
    for chosen in splits:
        c = [pooled[i] for i in chosen]
        b = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        at_most += sum(x > y for x in c for y in b) <= observed
    return at_most / len(splits)


# --- Mann-Whitney U and its p-value -------------------------------------------------------------


def test_mann_whitney_current_entirely_below_baseline():
    # U = 0; only 1 of the C(6, 3) = 20 orderings puts all of current lowest.
    assert verdict.mann_whitney_less([1, 2, 3], [4, 5, 6]) == (0.0, pytest.approx(1 / 20))


def test_mann_whitney_current_entirely_above_baseline():
    # U = 9 = n m, the largest value: every ordering has U <= 9.
    assert verdict.mann_whitney_less([4, 5, 6], [1, 2, 3]) == (9.0, pytest.approx(1.0))


def test_mann_whitney_mixed_cases_by_hand():
    # For sizes 3 and 3 the orderings with U = 0..9 number 1, 1, 2, 3, 3, 3, 3, 2, 1, 1 (partitions of u
    # into at most 3 parts of at most 3 each), 20 in all.
    # current [1, 2, 4] vs baseline [3, 5, 6]: only 4 > 3, U = 1, p = (1 + 1) / 20.
    assert verdict.mann_whitney_less([1, 2, 4], [3, 5, 6]) == (1.0, pytest.approx(0.1))
    # current [1, 3, 6] vs baseline [2, 4, 5]: 3 > 2 and 6 > 2, 4, 5, U = 4, p = (1 + 1 + 2 + 3 + 3) / 20.
    assert verdict.mann_whitney_less([1, 3, 6], [2, 4, 5]) == (4.0, pytest.approx(0.5))


def test_smallest_p_is_one_over_the_orderings():
    assert verdict.smallest_p(3, 3) == pytest.approx(1 / 20)
    assert verdict.smallest_p(10, 10) == pytest.approx(1 / 184756)
    assert verdict.smallest_p(1, 4) == pytest.approx(1 / 5)


@pytest.mark.parametrize("sizes", [(4, 5), (6, 6), (2, 7), (7, 1)])
def test_mann_whitney_exact_matches_brute_force_count(sizes):
    rng = np.random.default_rng(sum(sizes))
    for _ in range(5):
        current = rng.normal(0.0, 1.0, sizes[0]).tolist()
        baseline = rng.normal(0.3, 1.0, sizes[1]).tolist()
        _, p = verdict.mann_whitney_less(current, baseline, method="exact")
        assert p == pytest.approx(_brute_force_p_less(current, baseline), rel=1e-12)


def test_mann_whitney_exact_and_normal_agree_on_moderate_samples():
    # 20 rounds each, no ties: here the continuity-corrected normal approximation is within 0.002 of
    # the exact tail (largest near p = 0.7); 0.01 is the agreement asked of it, with room to spare.
    rng = np.random.default_rng(7)
    for shift in (0.0, 0.3, 0.6, 1.0):
        current = rng.normal(-shift, 1.0, 20)
        baseline = rng.normal(0.0, 1.0, 20)
        u_exact, p_exact = verdict.mann_whitney_less(current, baseline, method="exact")
        u_normal, p_normal = verdict.mann_whitney_less(current, baseline, method="normal")
        assert u_exact == u_normal
        assert abs(p_exact - p_normal) < 0.01


def test_mann_whitney_auto_uses_normal_branch_above_the_exact_limit():
    rng = np.random.default_rng(11)
    current = rng.normal(0.0, 1.0, verdict.EXACT_MAX_SIZE + 1)
    baseline = rng.normal(0.2, 1.0, 30)
    assert verdict.mann_whitney_less(current, baseline) == verdict.mann_whitney_less(current, baseline, method="normal")


def test_mann_whitney_ties_count_half_and_use_the_normal_branch():
    # current [1, 2, 2] vs baseline [2, 3, 3]: each 2 of current ties the 2 of baseline, U = 2 * 0.5 = 1.
    # Pooled [1, 2, 2, 2, 3, 3]: tie groups of 3 and 2, sum(t^3 - t) = 24 + 6 = 30, N = 6;
    # variance = 9 / 12 * (7 - 30 / 30) = 4.5, z = (1 - 4.5 + 0.5) / sqrt(4.5), p = Phi(z).
    u, p = verdict.mann_whitney_less([1, 2, 2], [2, 3, 3])
    assert u == 1.0
    assert p == pytest.approx(0.5 * math.erfc(3.0 / math.sqrt(4.5) / math.sqrt(2.0)), rel=1e-12)
    with pytest.raises(ValueError, match="method"):
        verdict.mann_whitney_less([1, 2, 2], [2, 3, 3], method="exact")


def test_mann_whitney_all_values_tied_gives_no_evidence():
    assert verdict.mann_whitney_less([0.5, 0.5], [0.5, 0.5, 0.5]) == (3.0, 1.0)


def test_mann_whitney_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    samples = [
        (rng.normal(0.0, 1.0, 8), rng.normal(0.5, 1.0, 9)),  # exact branch
        (rng.normal(0.0, 1.0, 30), rng.normal(0.2, 1.0, 25)),  # exact branch, larger
        (rng.normal(0.0, 1.0, 60), rng.normal(0.3, 1.0, 40)),  # normal branch: above the exact limit
        (rng.integers(0, 5, 12).astype(float), rng.integers(1, 6, 15).astype(float)),  # normal branch: ties
    ]
    for current, baseline in samples:
        untied = np.unique(np.concatenate([current, baseline])).size == current.size + baseline.size
        exact = untied and max(current.size, baseline.size) <= verdict.EXACT_MAX_SIZE
        expected = stats.mannwhitneyu(current, baseline, alternative="less", method="exact" if exact else "asymptotic")
        u, p = verdict.mann_whitney_less(current, baseline)
        assert u == expected.statistic
        assert p == pytest.approx(expected.pvalue, rel=1e-9)


# --- The verdict on simulated runs --------------------------------------------------------------


@pytest.mark.parametrize("tails", ["normal", "student_t3"])
def test_same_distribution_is_not_flagged(tails):
    # Both runs from one distribution. The test alone would flag at most alpha = 0.2% of pairs
    # (fewer: the exact test is conservative), about 0.4 of 200 expected; the factor removes nearly
    # all of those, since a 9% drop of the median is about 5 standard deviations of the difference
    # of two 10-round medians at 3% spread. So 0 is expected; <= 1 leaves room for one freak pair.
    rng = np.random.default_rng(20240601)
    flagged = sum(
        verdict.compare_case("c", _ratios(rng, tails), _ratios(rng, tails)).regressed for _ in range(SIMULATIONS)
    )
    assert flagged <= 1


@pytest.mark.parametrize("tails", ["normal", "student_t3"])
def test_thirty_percent_slowdown_is_flagged(tails):
    # current = baseline's distribution / 1.3: the median drops 23%, beyond the factor. With 10 rounds
    # each, p < 0.002 needs U <= 13 of 100 pairs, while the shift is about 8 spreads: a pair crosses
    # only through a tail value, so nearly every simulation gives U near 0. >= 195 of 200 allows a
    # few heavy-tailed outliers.
    rng = np.random.default_rng(1947)
    flagged = sum(
        verdict.compare_case("c", _ratios(rng, tails), _ratios(rng, tails) / 1.3).regressed for _ in range(SIMULATIONS)
    )
    assert flagged >= 195


def test_five_percent_drop_is_significant_but_within_the_factor():
    rng = np.random.default_rng(5)
    baseline = 0.5 * (1.0 + 0.005 * rng.standard_normal(ROUNDS))
    current = 0.5 * (1.0 + 0.005 * rng.standard_normal(ROUNDS)) / 1.05
    result = verdict.compare_case("c", baseline, current)
    assert result.p < verdict.DEFAULT_ALPHA
    assert not result.regressed and not result.undecided
    assert result.change == pytest.approx(-0.05, abs=0.01)
    assert "within the factor 1.1: not a regression" in result.reason


def test_improvement_is_not_a_regression():
    rng = np.random.default_rng(6)
    result = verdict.compare_case("c", _ratios(rng, "normal"), _ratios(rng, "normal") * 1.3)
    assert not result.regressed and result.change > 0 and result.p > 0.99


def test_big_drop_with_three_rounds_each_is_undecided():
    result = verdict.compare_case("c", [0.41, 0.412, 0.415], [0.30, 0.301, 0.305])
    assert result.p == pytest.approx(1 / 20)
    assert result.undecided and not result.regressed
    assert result.reason == (
        "ratio 0.412 -> 0.301 (-26.9%), but samples of 3 and 3 rounds cannot reach p < 0.002 "
        "(smallest p 0.05): undecided, not a regression"
    )


def test_drop_beyond_factor_with_overlapping_samples_is_not_significant():
    # Medians 0.51 -> 0.40 (a 22% drop), but four current rounds beat most baseline ones: p = 0.24.
    baseline = [0.30, 0.35, 0.45, 0.50, 0.50, 0.55, 0.60, 0.65, 0.70, 0.52]
    current = [0.20, 0.25, 0.30, 0.35, 0.40, 0.40, 0.58, 0.62, 0.66, 0.71]
    result = verdict.compare_case("c", baseline, current)
    assert not result.regressed and not result.undecided
    assert result.p >= verdict.DEFAULT_ALPHA
    assert result.reason.endswith(f"Mann-Whitney p = {result.p:.2g} >= 0.002: not significant")


def test_regression_reason_reads_as_one_line():
    baseline = np.linspace(0.40, 0.42, ROUNDS)
    current = np.linspace(0.29, 0.31, ROUNDS)
    result = verdict.compare_case("attn/numpy/float32/n=512", baseline, current)
    assert result.regressed
    assert result.reason == "ratio 0.41 -> 0.3 (-26.8%), Mann-Whitney p = 5.4e-06 < 0.002: regressed"


# --- Runs, environments, exit status ------------------------------------------------------------


def test_compare_samples_sorts_common_cases_and_lists_the_rest():
    rng = np.random.default_rng(8)
    baseline = {"b": _ratios(rng, "normal"), "a": _ratios(rng, "normal"), "old": _ratios(rng, "normal")}
    current = {"a": _ratios(rng, "normal") / 1.3, "b": _ratios(rng, "normal"), "new": [0.5]}
    comparison = verdict.compare_samples(baseline, current)
    assert [v.case for v in comparison.verdicts] == ["a", "b"]
    assert comparison.only_baseline == ("old",)
    assert comparison.only_current == ("new",)
    assert [v.case for v in comparison.regressions] == ["a"]


def test_exit_status():
    rng = np.random.default_rng(9)
    baseline = {"a": _ratios(rng, "normal")}
    steady = verdict.compare_samples(baseline, {"a": _ratios(rng, "normal")})
    slower = verdict.compare_samples(baseline, {"a": _ratios(rng, "normal") / 1.3})
    assert verdict.exit_status(steady, None) == verdict.EXIT_OK == 0
    assert verdict.exit_status(slower, None) == verdict.EXIT_REGRESSION == 1
    assert verdict.exit_status(steady, "baseline from another machine: 'a' vs 'b'") == verdict.EXIT_INCOMPATIBLE == 4
    assert verdict.exit_status(slower, "baseline from another device: 'cpu' vs 'cuda:0'") == 4


@pytest.mark.parametrize(
    ("key", "before", "after", "words"),
    [
        ("machine", "Intel Xeon 8375C", "AMD EPYC 7R13", "another machine: 'Intel Xeon 8375C' vs 'AMD EPYC 7R13'"),
        ("device", "cpu", "cuda:0", "another device: 'cpu' vs 'cuda:0'"),
        ("threads", 1, 2, "another thread count: 1 vs 2"),
    ],
)
def test_incompatible_names_the_differing_key(key, before, after, words):
    reason = verdict.incompatible({key: before}, {key: after})
    assert reason is not None and words in reason and "\n" not in reason
    assert verdict.incompatible({key: before}, {}) == reason.replace(repr(after), "(not recorded)")


def test_incompatible_libraries_compares_only_those_both_runs_used():
    baseline = {"libraries": {"numpy": "2.4.6 (openblas 0.3.29)", "torch": "2.5.0"}}
    current = {"libraries": {"numpy": "2.3.0 (openblas 0.3.27)", "jax": "0.4.30"}}
    assert verdict.incompatible(baseline, current) == (
        "baseline from another library build: numpy 2.4.6 (openblas 0.3.29) vs numpy 2.3.0 (openblas 0.3.27)"
    )
    current["libraries"]["numpy"] = "2.4.6 (openblas 0.3.29)"
    assert verdict.incompatible(baseline, current) is None


def test_incompatible_joins_every_difference_on_one_line():
    reason = verdict.incompatible({"threads": 1, "device": "cpu"}, {"threads": 2, "device": "cpu", "machine": "x"})
    assert reason == (
        "baseline from another machine: (not recorded) vs 'x'; baseline ran with another thread count: 1 vs 2"
    )


def test_compatible_when_equal_or_absent():
    env = {"machine": "Intel Xeon", "device": "cpu", "threads": 1, "libraries": {"numpy": "2.4.6"}}
    assert verdict.incompatible(env, dict(env)) is None
    assert verdict.incompatible({}, {}) is None
    assert verdict.incompatible({"libraries": {"numpy": "2.4.6"}}, {}) is None


# --- Bad inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "baseline", "match"),
    [
        ([], [1.0], "current: expected at least one round"),
        ([1.0], [], "baseline: expected at least one round"),
        ([1.0, math.nan], [1.0], "current: expected finite numbers, got nan at round 1"),
        ([1.0], [math.inf], "baseline: expected finite numbers"),  # inf is a refused input: the test expects an error
        ([[1.0, 2.0]], [1.0], "current: expected a flat sequence"),
        (["fast"], [1.0], "current: expected a sequence of numbers"),
    ],
)
def test_mann_whitney_rejects_bad_samples(current, baseline, match):
    with pytest.raises(ValueError, match=match):
        verdict.mann_whitney_less(current, baseline)


def test_compare_case_names_the_case_of_a_bad_sample():
    with pytest.raises(ValueError, match=r"current \(case 'a'\): expected finite numbers"):
        verdict.compare_case("a", [0.5, 0.5], [0.5, math.nan])
    with pytest.raises(ValueError, match=r"baseline \(case 'a'\): expected a positive median"):
        verdict.compare_case("a", [0.0, 0.0], [0.5, 0.5])


# factors the verdict must refuse (an infinite factor would pass any drop): each raises, none passes
@pytest.mark.parametrize("factor", [0.9, 0.0, math.nan, math.inf])
def test_factor_below_one_or_not_finite_is_rejected(factor):
    with pytest.raises(ValueError, match="^factor:"):
        verdict.compare_case("a", [0.5], [0.5], factor=factor)
    with pytest.raises(ValueError, match="^factor:"):
        verdict.compare_samples({"a": [0.5]}, {"a": [0.5]}, factor=factor)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_alpha_outside_zero_one_is_rejected(alpha):
    with pytest.raises(ValueError, match="^alpha:"):
        verdict.compare_case("a", [0.5], [0.5], alpha=alpha)
    with pytest.raises(ValueError, match="^alpha:"):
        verdict.compare_samples({}, {}, alpha=alpha)


def test_smallest_p_rejects_empty_sizes():
    with pytest.raises(ValueError, match="n, m"):
        verdict.smallest_p(0, 3)


# Student's t quantiles from the standard table (Abramowitz and Stegun 1964, Table 26.10).
@pytest.mark.parametrize(
    ("q", "df", "t"), [(0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.995, 4, 4.604), (0.95, 30, 1.697)]
)
def test_student_t_quantile_matches_the_table(q, df, t):
    assert verdict.student_t_quantile(q, df) == pytest.approx(t, abs=5e-4)  # the table's 3 decimals


def test_student_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for q, df in [(1 - 0.002 / 8, 9), (0.999, 2), (0.9, 100)]:
        assert verdict.student_t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9)


def test_student_t_quantile_at_the_median_is_zero():
    assert verdict.student_t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("q", "df", "match"), [(1.0, 3, "q"), (0.4, 3, "q"), (0.9, 0, "df"), (0.9, 2.5, "df")])
def test_student_t_quantile_rejects_bad_arguments(q, df, match):
    with pytest.raises(ValueError, match=match):
        verdict.student_t_quantile(q, df)


def test_run_level_bound_without_spread_is_the_factor():
    # Every earlier run read -2%: no spread, so the bound is the factor below that mean.
    bound = verdict.run_level_bound([-0.02] * 5, cases=8)
    assert bound == pytest.approx(0.98 / 1.1 - 1.0)


def test_run_level_bound_covers_a_new_normal_run_as_its_interval_says():
    # Under its own model (normal log changes) a new run falls below the bound with probability alpha / cases:
    # the normal prediction interval is exact there. 4000 simulated (K=6 earlier runs, 1 new run) draws at
    # alpha / cases = 0.1: the count below is Binomial(4000, 0.1), sd 19; 5 sd each way (outside it once in about 1.7
    # million seeds).
    rng = np.random.default_rng(7)
    trials, below = 4000, 0
    for _ in range(trials):
        logs = rng.normal(0.0, 0.05, size=7)
        bound = verdict.run_level_bound(np.expm1(logs[:6]), cases=1, factor=1.0, alpha=0.1)
        below += math.expm1(logs[6]) < bound
    assert abs(below - 0.1 * trials) <= 5 * math.sqrt(trials * 0.1 * 0.9)


def test_run_level_bound_widens_with_the_spread_and_the_cases():
    calm = verdict.run_level_bound([0.01, -0.01, 0.02, -0.02, 0.0, 0.01], cases=8)
    noisy = verdict.run_level_bound([0.05, -0.05, 0.1, -0.1, 0.0, 0.05], cases=8)
    fewer = verdict.run_level_bound([0.05, -0.05, 0.1, -0.1, 0.0, 0.05], cases=1)
    assert noisy < fewer < calm < 0.0


@pytest.mark.parametrize(
    ("changes", "cases", "match"),
    [([0.0, 0.1], 8, "at least 3"), ([0.0, -1.0, 0.1], 8, "above -1"), ([0.0, 0.1, 0.2], 0, "cases")],
)
def test_run_level_bound_rejects_bad_arguments(changes, cases, match):
    with pytest.raises(ValueError, match=match):
        verdict.run_level_bound(changes, cases)


def test_compare_case_runs_p_is_the_prediction_t_tail():
    stats = pytest.importorskip("scipy.stats")
    medians = [0.50, 0.52, 0.48, 0.51, 0.49, 0.50]
    v = verdict.compare_case_runs("x", medians, [0.40, 0.41, 0.39], cases=4)
    logs = np.log(medians)
    t = (math.log(0.40) - logs.mean()) / (logs.std(ddof=1) * math.sqrt(1 + 1 / len(logs)))
    assert v.p == pytest.approx(stats.t.cdf(t, len(logs) - 1), rel=1e-9)
    assert v.baseline_median == pytest.approx(math.exp(logs.mean()))
    assert v.regressed and v.p < verdict.DEFAULT_ALPHA / 4 and "regressed" in v.reason


def test_compare_case_runs_agrees_with_its_bound_and_p():
    # Away from the factor, "below the bound" and "p < alpha / cases" are one statement.
    rng = np.random.default_rng(11)
    for _ in range(200):
        medians = np.exp(rng.normal(0.0, 0.08, size=5))
        current = [math.exp(rng.normal(-0.5, 0.3))]
        v = verdict.compare_case_runs("x", medians, current, cases=8)
        bound = verdict.run_level_bound(medians / math.exp(np.log(medians).mean()) - 1, cases=8)
        assert v.regressed == (v.change < bound)
        if bound < 1 / 1.1 - 1:  # the spread's bound, not the factor's
            assert v.regressed == (v.p < verdict.DEFAULT_ALPHA / 8)


def test_compare_case_runs_within_the_spread_is_not_a_regression():
    v = verdict.compare_case_runs("x", [0.9, 1.0, 1.1, 0.95, 1.05], [0.88] * 5, cases=8)
    assert not v.regressed and "within the bound" in v.reason and not v.undecided


@pytest.mark.parametrize(
    ("medians", "match"), [([1.0, 1.0], "at least 3 baseline runs"), ([1.0, 0.0, 1.0], "positive")]
)
def test_compare_case_runs_rejects_bad_baselines(medians, match):
    with pytest.raises(ValueError, match=match):
        verdict.compare_case_runs("x", medians, [1.0], cases=1)


def test_compare_runs_samples_lists_cases_some_run_lacks():
    # a: everywhere; b: some baseline runs, not now; c: now only; d: now and in some baseline runs.
    bases = [{"a": [1.0], "b": [1.0], "d": [1.0]}, {"a": [1.0], "b": [1.0]}, {"a": [1.0], "d": [1.0]}]
    result = verdict.compare_runs_samples(bases, {"a": [1.0], "c": [1.0], "d": [1.0]})
    assert [v.case for v in result.verdicts] == ["a"]
    assert (result.only_baseline, result.only_current, result.in_some_baselines) == (("b",), ("c",), ("d",))
    with pytest.raises(ValueError, match="at least 3"):
        verdict.compare_runs_samples(bases[:2], {"a": [1.0]})
