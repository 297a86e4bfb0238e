"""Floating-point facts the budgets are built from: unit roundoff, gamma_n, ulps, rounding to a dtype.

Notation (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §2.1-§3.1):

- ``p`` significand bits (the leading bit included), unit roundoff ``u = 2^-p``: a correctly
  rounded operation returns ``(a op b)(1 + delta)`` with ``|delta| <= u``, plus, in the subnormal
  range, an absolute error of at most half the subnormal spacing ``eta``.
- ``gamma_n(u) = n u / (1 - n u)`` bounds ``|prod (1 + delta_i)^{+-1} - 1|`` over ``n`` roundings.
- An ulp of ``x`` (``ulp(x)``) is the spacing of the dtype at ``|x|``: ``2^(e - p + 1)`` for
  ``2^e <= |x| < 2^(e + 1)``, and ``eta`` in the subnormal range. For a normal ``x``,
  ``u |x| < ulp(x) <= 2 u |x|``.

Two constants widen the textbook model to what real implementations do, each with its reason:

- :data:`DOUBLE_ROUNDING`: an implementation may compute an operation in a wider format (float32
  for float16, longdouble for float64) and round the result to the dtype afterwards. That is two
  roundings, ``(1 + d_wide)(1 + d)`` with ``|d_wide| <= u_wide <= u 2^-10`` for every pair used
  here (float16/bfloat16 via float32, float32 via float64, float64 via x87 longdouble), so each
  operation is modelled with ``u_op = u (1 + 2^-10)``.
- :data:`TRANSCENDENTAL_ULPS`: exp, log, sin, cos and pow are not correctly rounded in the
  libraries implementations use. Documented worst cases: NumPy's float32 SIMD exp 2.52 ulp and
  log 3.83 ulp (NumPy release notes for the AVX512F kernels), CUDA's expf/logf/sinf/cosf <= 2 ulp
  (CUDA C Programming Guide, "Mathematical Functions"), glibc < 1-2 ulp. We allow 4 ulps, i.e. a
  relative error ``t = 8 u_op``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DOUBLE_ROUNDING",
    "PRECISIONS",
    "Precision",
    "TRANSCENDENTAL_ULPS",
    "first_index",
    "floored",
    "gamma",
    "is_representable",
    "precision",
    "round_to",
    "ulp",
]

DOUBLE_ROUNDING = 2.0**-10
TRANSCENDENTAL_ULPS = 4


@dataclass(frozen=True)
class Precision:
    """One IEEE-style binary format: significand bits, exponent range, and the derived units."""

    name: str
    p: int  # significand bits, the implicit leading bit included
    emin: int  # exponent of the smallest normal number, 2^emin
    emax: int  # exponent of the largest finite number's leading bit
    flush: bool = (
        False  # subnormal results flushed to zero (FTZ, as XLA's CPU backend does): an underflow errs by up to 2^emin
    )

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p (round to nearest)."""
        return 2.0**-self.p

    @property
    def op(self) -> float:
        """Per-operation relative error allowed: u, widened by :data:`DOUBLE_ROUNDING`."""
        return self.u * (1.0 + DOUBLE_ROUNDING)

    @property
    def t(self) -> float:
        """Relative error allowed for exp/log/sin/cos/pow: :data:`TRANSCENDENTAL_ULPS` ulps = 2 * that * u_op."""
        return 2.0 * TRANSCENDENTAL_ULPS * self.op

    @property
    def eta(self) -> float:
        """Subnormal spacing 2^(emin - p + 1): the absolute error unit below the normal range (2^emin when subnormals
        are flushed)."""
        return 2.0**self.emin if self.flush else 2.0 ** (self.emin - self.p + 1)

    @property
    def max(self) -> float:
        """Largest finite value (2 - 2^(1-p)) 2^emax."""
        return (2.0 - 2.0 ** (1 - self.p)) * 2.0**self.emax


PRECISIONS: dict[str, Precision] = {
    "float64": Precision("float64", 53, -1022, 1023),
    "float32": Precision("float32", 24, -126, 127),
    "float16": Precision("float16", 11, -14, 15),
    "bfloat16": Precision("bfloat16", 8, -126, 127),
}
# The same formats with subnormal results flushed to zero ("<dtype>-ftz"): the budgets of an (equation,
# dtype) for which an implementation declares FTZ arithmetic (policy "flush_subnormals", harness.Case.arithmetic),
# and the diagnosis "subnormal results flushed to zero" (conformance/diagnoses/forward.py) for one that does not.
PRECISIONS.update(
    {f"{name}-ftz": Precision(f"{name}-ftz", q.p, q.emin, q.emax, flush=True) for name, q in list(PRECISIONS.items())}
)


def precision(dtype: str) -> Precision:
    """The :class:`Precision` of a dtype name from ``aiayn.implementations.protocol.DTYPES``."""
    try:
        return PRECISIONS[dtype]
    except KeyError:
        raise ValueError(f"dtype: expected one of {sorted(PRECISIONS)}, got {dtype!r}") from None


def gamma(n: float, u: float) -> float | np.ndarray:
    """Higham's gamma_n = n u / (1 - n u) (inf once n u >= 1: the bound says nothing any more)."""
    if isinstance(n, (int, float)):  # the common scalar case, without array overhead
        nu = n * u
        return nu / (1.0 - nu) if nu < 1.0 else math.inf
    nu = np.asarray(n, dtype=np.float64) * u
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(nu < 1.0, nu / (1.0 - nu), np.inf)
    return out[()] if out.ndim == 0 else out


def ulp(x: np.ndarray | float, dtype: str) -> np.ndarray:
    """The spacing of ``dtype`` at |x| (eta in the subnormal range); inf stays inf, NaN stays NaN."""
    prec = precision(dtype)
    a = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where((a > 0) & np.isfinite(a), a, 2.0**prec.emin)))  # 0, subnormals: the least
    spacing = np.ldexp(1.0, (np.maximum(e, prec.emin) - prec.p + 1).astype(int))
    if prec.flush:  # below the normal range a flushed result errs by up to 2^emin
        spacing = np.where(a < 2.0**prec.emin, 2.0**prec.emin, spacing)
    return np.where(np.isfinite(a), spacing, a)


def round_to(x: np.ndarray | float, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype`` (nearest, ties to even), returned as float64.

    Works for every dtype, bfloat16 included, without any library that knows bfloat16: scale by
    the dtype's quantum at |x| (a power of two, so the scaling is exact), round half to even with
    ``np.rint``, scale back; values beyond the largest finite number round to +-inf as IEEE says.
    """
    prec = precision(dtype)
    a = np.asarray(x, dtype=np.float64)
    if prec.p == 53:
        return a.copy()
    quantum = ulp(a, dtype)
    finite = np.isfinite(a) & (quantum > 0)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.where(finite, np.rint(np.where(finite, a / quantum, 0.0)) * quantum, a)
        big = np.abs(r) > prec.max
    return np.where(big, np.copysign(np.inf, a), r)


def is_representable(x: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise: is the float64 value exactly a value of ``dtype``? (NaN counts as representable.)"""
    a = np.asarray(x, dtype=np.float64)
    return np.isnan(a) | (round_to(a, dtype) == a)


def _self_check() -> None:
    """Cheap sanity facts about the constants (run at import: a wrong table would poison every budget)."""
    assert PRECISIONS["float32"].max == float(np.finfo(np.float32).max)
    assert PRECISIONS["float16"].max == float(np.finfo(np.float16).max)
    assert PRECISIONS["float16"].eta == float(np.finfo(np.float16).smallest_subnormal)
    assert PRECISIONS["float32"].eta == float(np.finfo(np.float32).smallest_subnormal)
    assert math.isclose(PRECISIONS["bfloat16"].max, 3.3895313892515355e38)


_self_check()


def floored(derived: np.ndarray, dtype: str, expected: np.ndarray) -> np.ndarray:
    """A derived threshold (already including the oracle's share) with the floor of one ulp of ``dtype`` at the
    expected value (``budgets/forward.py``, module docstring, says why)."""
    floor = ulp(np.where(np.isfinite(expected), expected, 0.0), dtype)
    return np.maximum(np.broadcast_to(np.asarray(derived, dtype=np.float64), np.shape(expected)), floor)


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    """The index of the first True of ``mask`` in C order (a 0-d mask gives ())."""
    flat = np.flatnonzero(np.asarray(mask).reshape(-1))
    return tuple(int(j) for j in np.unravel_index(int(flat[0]), np.shape(mask))) if flat.size else ()
