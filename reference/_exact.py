"""The exact tier's machinery: float64 -> mpmath, arithmetic at a stated precision, one rounding back.

Every exact-tier function in ``reference/`` follows the same recipe:

1. its float64 inputs are converted to ``mpmath.mpf`` *exactly* (a binary64 value has 53 bits,
   far fewer than the working precision);
2. the equation is evaluated by :func:`correctly_rounded` inside ``mpmath.workdps(dps)`` (default
   ``DEFAULT_DPS`` = 50 decimal digits, about 166 bits), never by changing mpmath's global context;
3. each result is rounded **once** to float64 by :func:`round_to_float64`, correctly rounded
   (round to nearest, ties to even), including in the subnormal range.

Step 2 is Ziv's strategy: a value computed at 50 digits can still sit too close to a float64
rounding boundary (the midpoint between two neighbours) for its float64 rounding to be known,
e.g. the mean of 28.7, 2e-129 and six 38s, whose true value lies 1e-130 above a midpoint. So the
equation is evaluated at two precisions (p and p + ``GUARD_DPS``); their difference estimates the
error, and any element whose value lies within that estimate (plus the last rounding, 10^-p')
of a boundary is recomputed at twice the precision, up to ``MAX_DPS``. At ``MAX_DPS`` (1300 digits,
~4300 bits) every dot product of float64 values is held exactly, so a tie that survives is a true
tie and ties-to-even is the right answer.

Why step 3 needs care: ``float(mpf)`` first rounds to 53 significant bits and then lets the
platform narrow that to a subnormal, which can round twice (an exact tie created by the first
rounding is broken the wrong way by the second). Below 2^-1022 we therefore round the value
scaled by 2^1074 to the nearest integer (exact in mpmath) and scale back, which is one rounding
onto the subnormal grid.

mpmath has no signed zero: a zero result comes back as +0.0 (and -0.0 inputs act as +0.0).

The result is correctly rounded when the working precision's error stays below the distance to
the nearest rounding boundary; ``tests/test_exact_tier.py`` checks this by recomputing at
``HIGH_DPS`` and requiring zero changed float64 results.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np

DEFAULT_DPS = 50  # decimal digits (~166 bits): 113 bits beyond binary64
HIGH_DPS = 120  # the re-check precision used by the tests (~399 bits)
GUARD_DPS = 20  # the second evaluation's extra digits, whose difference estimates the error
MAX_DPS = 1300  # ~4300 bits: exact for any sum of products of two float64 values
MIN_DPS = 15  # the least working precision accepted (float64 itself needs 17 digits to round-trip)

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
    if isinstance(value, mpmath.mpf):
        v = value  # mpf(mpf) would round to the ambient precision: a first, hidden rounding
    else:
        with mpmath.workprec(2200):  # wide enough to hold any float64, int or str exactly enough
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
        return math.copysign(float(abs(int(n))) * 2.0**-1074, -1.0 if v < 0 else 1.0)  # |n| <= 2^52: exact; keeps -0.0
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


def _ambiguous(lo: Any, hi: Any, dps_hi: int) -> bool:
    """True if the float64 rounding of ``hi`` is not certain given the error estimate |hi - lo|."""
    if not (mpmath.isfinite(hi) and mpmath.isfinite(lo)):
        return False
    r = round_to_float64(hi)
    if math.isinf(r):
        return False
    with mpmath.workprec(2200):
        err = abs(hi - lo) + abs(hi) * mpmath.mpf(10) ** (-dps_hi)
        neighbours = (math.nextafter(r, -math.inf), math.nextafter(r, math.inf))
        midpoints = [(mpmath.mpf(r) + mpmath.mpf(n)) / 2 for n in neighbours if math.isfinite(n)]
        return any(abs(hi - m) <= err for m in midpoints)


def check_dps(dps: Any) -> int:
    """Return ``dps`` as an int if it is a working precision the exact tier accepts (an int >= ``MIN_DPS``
    decimal digits), or raise naming ``dps``: TypeError for a non-integer (bool and float included),
    ValueError below ``MIN_DPS``."""
    if isinstance(dps, bool) or not isinstance(dps, numbers.Integral):
        raise TypeError(f"dps: expected an int >= {MIN_DPS} (decimal digits), got {dps!r} ({type(dps).__name__})")
    if dps < MIN_DPS:
        raise ValueError(f"dps: expected at least {MIN_DPS} decimal digits (float64 needs 17 to round-trip), got {dps}")
    return int(dps)


def correctly_rounded(compute: Callable[[], np.ndarray], dps: int = DEFAULT_DPS) -> np.ndarray:
    """Evaluate ``compute()`` (mpf results, object array) until every float64 rounding is certain.

    ``compute`` must do all its arithmetic in the ambient mpmath context; it is called inside
    ``mpmath.workdps(p)`` for p = dps, dps + GUARD_DPS, then doubled while any element is
    ambiguous (see the module docstring), up to MAX_DPS. Returns float64, each correctly rounded.
    ``dps`` is checked by :func:`check_dps`.
    """
    dps = check_dps(dps)
    with mpmath.workdps(dps):
        lo = np.asarray(compute(), dtype=object)
    p = dps + GUARD_DPS
    while True:
        with mpmath.workdps(p):
            hi = np.asarray(compute(), dtype=object)
        unsure = any(_ambiguous(a, b, p) for a, b in zip(lo.reshape(-1), hi.reshape(-1)))
        if not unsure or p >= MAX_DPS:
            return to_float64(hi)
        lo, p = hi, min(2 * p, MAX_DPS)


def elementwise(fn: Callable[[Any], Any], x: np.ndarray) -> np.ndarray:
    """Apply a scalar mpmath function to every entry of an object array (shape kept)."""
    arr = np.asarray(x, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat_out[i] = fn(v)
    return out


def mp_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched matrix product of object arrays (..., m, k) @ (..., k, n), batch dims broadcast.

    Each entry is ``mpmath.fdot``: the products and their sum are formed exactly and rounded once
    to the working precision of the enclosing ``workdps`` block.
    """
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = np.broadcast_to(b, (*batch, *b.shape[-2:]))
    m, n = a.shape[-2], b.shape[-1]
    out = np.empty((*batch, m, n), dtype=object)
    for idx in np.ndindex(*batch):
        rows, cols = a[idx], b[idx]
        for i in range(m):
            row = rows[i].tolist()
            for j in range(n):
                out[(*idx, i, j)] = mpmath.fdot(row, cols[:, j].tolist())
    return out


def mp_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum of an object array along ``axis`` with ``mpmath.fsum`` (exact accumulation, one rounding)."""
    arr = np.moveaxis(np.asarray(x, dtype=object), axis, -1)
    out = np.empty(arr.shape[:-1], dtype=object)
    flat_out = out.reshape(-1)
    rows = arr.reshape(-1, arr.shape[-1])
    for i, row in enumerate(rows):
        flat_out[i] = mpmath.fsum(row.tolist())
    return out
