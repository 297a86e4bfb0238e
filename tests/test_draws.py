"""The statistical checks of dropout's masks (``conformance/budgets/draws.py``): their acceptance regions are the exact
binomial ones, their false-alarm rate is what is stated, measured on correct draws, and their power against the
departures they exist for is computed.

- the regions agree with scipy's binomial distribution (an independent computation of the tails);
- 1,000 correct masks (NumPy's generator, seeds 0..999, p = 0.1 on the 65,536 elements a check draws): none falls
  outside the region at the suite's ALPHA = 1e-6, and at a rate of 5% the number outside is what 5% predicts (within
  that count's own region at 1e-6): the test is calibrated, not merely lenient;
- power: p = 0.11 drawn where 0.1 is meant is caught with probability >= 0.999 by one call; p taken as the keep
  probability (0.9 where 0.1 is meant) with probability 1 to within 1e-9 (the precision of the pmf's logarithms).
  An unscaled mask needs no statistics:
  the agreement given the mask the call returned fails on every kept element.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aiayn.conformance.budgets.draws import ALPHA, binomial_region, outside_region
from aiayn.conformance.inputs.strategies import DRAW_SHAPE

N = int(np.prod(DRAW_SHAPE))  # the elements of one statistical check: 65,536


@pytest.mark.parametrize(("n", "q"), [(N, 0.9), (N, 0.7), (N // 2, 0.82), (1000, 0.5), (50, 0.99), (10, 0.1)])
def test_the_region_is_scipys_binomial_tails(n: int, q: float) -> None:
    lo, hi = binomial_region(n, q)
    assert stats.binom.cdf(lo - 1, n, q) <= ALPHA / 2 < stats.binom.cdf(lo, n, q)
    assert stats.binom.sf(hi, n, q) <= ALPHA / 2 < stats.binom.sf(hi - 1, n, q)
    assert outside_region(n, q, (lo, hi)) <= ALPHA


def test_the_false_alarm_rate_measured_on_a_thousand_correct_masks() -> None:
    p, draws = 0.1, 1000
    counts = np.array([np.sum(np.random.default_rng(seed).random(N) >= p) for seed in range(draws)])
    lo, hi = binomial_region(N, 1 - p)
    assert np.sum((counts < lo) | (counts > hi)) == 0  # expected 1000 x 1e-6 = 0.001
    wide = binomial_region(N, 1 - p, alpha=0.05)
    rate = outside_region(N, 1 - p, wide)  # exact, at most 0.05
    outside = int(np.sum((counts < wide[0]) | (counts > wide[1])))
    expected_lo, expected_hi = binomial_region(draws, rate)
    assert expected_lo <= outside <= expected_hi, (outside, rate, (expected_lo, expected_hi))


def test_the_power_against_the_departures() -> None:
    region = binomial_region(N, 0.9)
    assert outside_region(N, 0.89, region) >= 0.999  # p = 0.11 where 0.1 is meant
    assert outside_region(N, 0.91, region) >= 0.999
    assert outside_region(N, 0.1, region) >= 1 - 1e-9  # p taken as the keep probability (1 to the sums' precision)
