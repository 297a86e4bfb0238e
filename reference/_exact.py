"""The exact tier's machinery: float64 -> mpmath, arithmetic at a stated precision, one rounding back.

Every exact-tier function in ``reference/`` follows the same recipe:

1. its float64 inputs are converted to ``mpmath.mpf`` *exactly* (a binary64 value has 53 bits,
   far fewer than the working precision);
2. the equation is evaluated inside ``with mpmath.workdps(dps):`` (default ``DEFAULT_DPS`` = 50
   decimal digits, about 166 bits), never by changing mpmath's global context;
3. each result is rounded **once** to float64 by :func:`round_to_float64`, correctly rounded
   (round to nearest, ties to even), including in the subnormal range.

Why step 3 needs care: ``float(mpf)`` first rounds to 53 significant bits and then lets the
platform narrow that to a subnormal, which can round twice (an exact tie created by the first
rounding is broken the wrong way by the second). Below 2^-1022 we therefore round the value
scaled by 2^1074 to the nearest integer (exact in mpmath) and scale back, which is one rounding
onto the subnormal grid.

The result is correctly rounded when the working precision's error stays below the distance to
the nearest rounding boundary; ``tests/test_exact_tier.py`` checks this by recomputing at
``HIGH_DPS`` and requiring zero changed float64 results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np

DEFAULT_DPS = 50  # decimal digits (~166 bits): 113 bits beyond binary64
HIGH_DPS = 120  # the re-check precision used by the tests (~399 bits)

_TWO_1074 = mpmath.mpf(2) ** 1074  # exact: a power of two
_SMALLEST_NORMAL = 2.0**-1022
_OVERFLOW = mpmath.mpf(2) ** 1024


def to_mp(x: Any) -> np.ndarray:
    """Convert a float64 array (or anything ``np.asarray`` takes) to an object array of mpf, exactly."""
    arr = np.asarray(x, dtype=np.float64)
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in.tolist()):
        flat_out[i] = mpmath.mpf(v)  # exact for any binary64 value, including inf and nan
    return out


def round_to_float64(value: Any) -> float:
    """Round one mpmath number to the nearest float64 (ties to even), with a single rounding.

    Handles NaN, infinities, overflow (|x| >= 2^1024 after rounding gives inf) and the
    subnormal range (one rounding onto the 2^-1074 grid, not two).
    """
    v = mpmath.mpf(value)
    if mpmath.isnan(v):
        return math.nan
    if mpmath.isinf(v):
        return math.inf if v > 0 else -math.inf
    if v == 0:
        return 0.0
    if abs(v) < _SMALLEST_NORMAL:
        with mpmath.workprec(max(mpmath.mp.prec, 64) + 1100):
            n = mpmath.nint(v * _TWO_1074)  # exact scaling, then nearest integer, ties to even
        return float(int(n)) * 2.0**-1074  # |n| <= 2^52: both steps exact
    with mpmath.workprec(53):
        r = +v  # rounds to 53 significant bits, nearest-even
    if abs(r) >= _OVERFLOW:
        return math.inf if r > 0 else -math.inf
    return float(r)  # exact: r has 53 bits and a normal exponent


def to_float64(x: np.ndarray) -> np.ndarray:
    """Round every entry of an object array of mpf to float64 (see :func:`round_to_float64`)."""
    arr = np.asarray(x, dtype=object)
    out = np.empty(arr.shape, dtype=np.float64)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat_out[i] = round_to_float64(v)
    return out


def elementwise(fn: Callable[[Any], Any], x: np.ndarray) -> np.ndarray:
    """Apply a scalar mpmath function to every entry of an object array (shape kept)."""
    arr = np.asarray(x, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat_out[i] = fn(v)
    return out


def mp_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched matrix product of object arrays (..., m, k) @ (..., k, n) in the current mp context.

    NumPy's object-dtype matmul performs the products and sums with the mpf operators, so every
    operation is rounded at the working precision of the enclosing ``workdps`` block.
    """
    return np.matmul(np.asarray(a, dtype=object), np.asarray(b, dtype=object))


def mp_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum of an object array along ``axis`` with ``mpmath.fsum`` (exact accumulation, one rounding)."""
    arr = np.moveaxis(np.asarray(x, dtype=object), axis, -1)
    out = np.empty(arr.shape[:-1], dtype=object)
    flat_out = out.reshape(-1)
    rows = arr.reshape(-1, arr.shape[-1])
    for i, row in enumerate(rows):
        flat_out[i] = mpmath.fsum(row.tolist())
    return out
