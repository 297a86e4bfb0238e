"""Assertions shared by the oracle's tier-agreement tests (test_layers, test_positional, test_training).

``assert_sandwiched`` checks that a fast-tier float64 result is a float64 rounding of some value
within the derived bound E of the truth y: fl64(y - E) <= fast <= fl64(y + E), elementwise. This is
tighter than "within one ulp plus E" and exactly what "error at most E before one final rounding"
means. ``y`` and ``E`` are object arrays of mpf (evaluated at HIGH_DPS by the caller).
"""

from __future__ import annotations

import mpmath
import numpy as np

from aiayn.reference._exact import HIGH_DPS, correctly_rounded, round_to_float64

#: The unit roundoffs the tier-agreement bounds are written in (exact, as mpf).
u = mpmath.mpf(2) ** -64  # longdouble (x87 extended, 64-bit significand): the fast tier's working precision
U = mpmath.mpf(2) ** -53  # float64: the final rounding
TINY = mpmath.mpf(2) ** -1075  # half the float64 subnormal spacing: one rounding's absolute error in that range


def gamma(n: int, unit: mpmath.mpf = u) -> mpmath.mpf:
    """gamma_n = n unit / (1 - n unit), the bound on n roundings' relative error [Higham, §3.1]."""
    return n * unit / (1 - n * unit)


def rounded(truth) -> np.ndarray:
    """fl64 of a truth evaluated at HIGH_DPS (a callable that evaluates it, or the values already evaluated), made
    certain by _exact's Ziv loop."""
    compute = truth if callable(truth) else (lambda: truth)
    return correctly_rounded(lambda: np.asarray(compute(), dtype=object), HIGH_DPS)


def assert_sandwiched(fast, true_values, bound, what: str, inputs: str) -> None:
    """fl64(y - E) <= fast <= fl64(y + E) elementwise, with a message naming the worst miss."""
    fast = np.asarray(fast, dtype=np.float64)
    true_values, bound = np.asarray(true_values, dtype=object), np.asarray(bound, dtype=object)
    assert fast.shape == true_values.shape, f"{what}: shape {fast.shape}, expected {true_values.shape}; {inputs}"
    with mpmath.workdps(HIGH_DPS):
        for idx in np.ndindex(fast.shape):
            y, e = true_values[idx], bound[idx]
            lo, hi = round_to_float64(y - e), round_to_float64(y + e)
            if not lo <= fast[idx] <= hi:
                miss = abs(mpmath.mpf(float(fast[idx])) - y)
                raise AssertionError(
                    f"{what}: fast {float(fast[idx])!r} at {idx} is not a float64 rounding of a value within the "
                    f"derived bound E = {mpmath.nstr(e, 4)} of the truth {mpmath.nstr(y, 22)} "
                    f"(|fast - truth| = {mpmath.nstr(miss, 4)} = {mpmath.nstr(miss / e if e else mpmath.inf, 4)} E); "
                    f"{inputs}"
                )


def assert_exact_equal(got, expected, what: str, inputs: str) -> None:
    """Bit-for-bit equality, with a message naming the first differing element."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}; {inputs}"
    differ = got != expected
    if np.any(differ):
        where = tuple(int(i) for i in np.argwhere(differ)[0])
        raise AssertionError(f"{what}: {got[where]!r} at {where}, expected exactly {expected[where]!r}; {inputs}")
