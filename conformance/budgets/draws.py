"""How far a count drawn at random may be from what its probability says: the acceptance regions of the suite's
statistical checks (dropout's masks, §5.4), from exact binomial tails at a stated false-alarm rate.

A statistical check cannot be certain: a correct implementation's draws fall outside any region of finite width with
some probability. That probability is stated (:data:`ALPHA`, per call of a check), computed exactly from the
binomial distribution rather than a normal approximation, and measured on correct draws
(``tests/test_draws.py``); so is the power against the departures it exists to catch.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ALPHA", "binomial_region", "outside_region"]

#: Each statistical check's false-alarm rate, two-sided, per call: a correct implementation's count falls outside its
#: region with probability at most this (alpha / 2 in each tail). A run of the suite makes a few hundred such calls.
ALPHA = 1e-6


def _pmf(n: int, q: float) -> np.ndarray:
    """The probabilities of 0..n successes of Binomial(n, q), 0 < q < 1, from their logarithms (no overflow)."""
    k = np.arange(n + 1, dtype=np.float64)
    log_factorial = np.array([math.lgamma(i + 1) for i in range(n + 1)])  # log i!, each within an ulp or so
    log_pmf = log_factorial[n] - log_factorial - log_factorial[::-1] + k * math.log(q) + (n - k) * math.log1p(-q)
    return np.exp(log_pmf)


def binomial_region(n: int, q: float, alpha: float = ALPHA) -> tuple[int, int]:
    """(lo, hi): the counts of Binomial(n, q) a check accepts at false-alarm rate ``alpha``: the widest tails with
    P(K < lo) <= alpha / 2 and P(K > hi) <= alpha / 2, each summed exactly (float64 sums of the tail's terms, relative
    error far below alpha). q = 0 or 1: the one possible count."""
    if not 0 <= q <= 1 or n < 0:
        raise ValueError(f"binomial_region: expected n >= 0 and q in [0, 1], got n={n}, q={q}")
    if q in (0.0, 1.0):
        return (0, 0) if q == 0 else (n, n)
    pmf = _pmf(n, q)
    below = np.cumsum(pmf)  # P(K <= k)
    above = np.cumsum(pmf[::-1])[::-1]  # P(K >= k)
    lo = int(np.searchsorted(below, alpha / 2, side="right"))  # the first k with P(K <= k) > alpha / 2
    hi = int(np.nonzero(above > alpha / 2)[0][-1])  # the last k with P(K >= k) > alpha / 2
    return lo, hi


def outside_region(n: int, q: float, region: tuple[int, int]) -> float:
    """P(K outside ``region``) for K ~ Binomial(n, q): the check's false-alarm rate where q is the true probability,
    its power where q is a departure's."""
    if q in (0.0, 1.0):
        count = 0 if q == 0 else n
        return 0.0 if region[0] <= count <= region[1] else 1.0
    pmf = _pmf(n, q)
    return float(np.sum(pmf[: region[0]]) + np.sum(pmf[region[1] + 1 :]))
