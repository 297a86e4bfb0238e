"""Positional encoding, §3.5: the sinusoids and the linear map M_k between PE(pos) and PE(pos + k).

Each equation is encoded twice:

- the fast tier computes the angles pos / base^(2i/d_model) and their sines and cosines in
  ``np.longdouble`` (unit roundoff u = 2^-64) and rounds once to float64. The angle carries a
  relative error of a few u (the exponent 2i/d_model, the power and the division), so its absolute
  error grows with the angle: about |angle| * (2i/d_model * ln(base) + 6) u. At pos = 10^5 that is
  ~6e-14, still 2^-11 of what a float64 implementation's own angle error (|angle| * 2^-53) is;
- the exact tier evaluates the same formula in mpmath through
  ``aiayn.reference._exact.correctly_rounded``, with extra digits for large angles so that the angle's
  absolute error stays at the working precision.

Shapes: ``length`` positions 0 .. length-1, ``d_model`` even; pair i is dimensions (2i, 2i+1).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import as_float_array, positive_int
from aiayn.reference._exact import DEFAULT_DPS, check_dps, correctly_rounded, to_mp

LD = np.longdouble
DEFAULT_BASE = 10000.0  # §3.5: "wavelengths form a geometric progression from 2π to 10000 · 2π"


def _validate_d_model(d_model: Any) -> int:
    d = positive_int("d_model", d_model, minimum=2)
    if d % 2:
        raise ValueError(f"d_model: expected an even width (dimensions come in sin/cos pairs 2i, 2i+1), got {d}")
    return d


def _validate_base(base: Any) -> float:
    arr = as_float_array("base", base)
    if arr.ndim != 0 or arr <= 0:
        raise ValueError(f"base: expected one finite number > 0 (the paper's 10000), got {base!r}")
    return float(arr)


def _validate_offset(k: Any) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k: expected an integer position offset (may be negative), got {k!r} ({type(k).__name__})")
    return int(k)


def _denominators_ld(d_model: int, base: float) -> np.ndarray:
    """base^(2i/d_model) for i = 0 .. d_model/2 - 1, in longdouble. Shape (d_model/2,)."""
    exponents = np.arange(0, d_model, 2, dtype=LD) / LD(d_model)  # (d/2,)
    return np.power(LD(base), exponents)


def _angles_mp(offsets: list[int], d_model: int, base: Any) -> np.ndarray:
    """offset / base^(2i/d_model) in the ambient mpmath context. Shape (len(offsets), d_model/2)."""
    dens = [mpmath.power(base, mpmath.mpf(2 * i) / d_model) for i in range(d_model // 2)]
    out = np.empty((len(offsets), d_model // 2), dtype=object)
    for r, p in enumerate(offsets):
        out[r] = [mpmath.mpf(p) / den for den in dens]
    return out


def _guard_digits(largest_offset: int, base: float) -> int:
    """Extra decimal digits that keep |angle| * 10^-dps absolute: the angle's own size, and ln(base)
    that scales the exponent's rounding error."""
    return 2 + math.ceil(math.log10(max(abs(largest_offset), 1) * max(abs(math.log(base)), 1.0)))


def _interleave(sin: np.ndarray, cos: np.ndarray) -> np.ndarray:
    """(n, d/2) sines and cosines -> (n, d) with sin at even and cos at odd dimensions."""
    out = np.empty((sin.shape[0], 2 * sin.shape[1]), dtype=sin.dtype)
    out[:, 0::2], out[:, 1::2] = sin, cos
    return out


def _pe_rows_ld(positions: np.ndarray, d_model: int, base: float) -> np.ndarray:
    """PE rows for integer positions (n,) in longdouble. Shape (n, d_model)."""
    angles = positions.astype(LD)[:, None] / _denominators_ld(d_model, base)[None, :]  # (n, d/2)
    return _interleave(np.sin(angles), np.cos(angles))


def _pe_rows_mp(positions: list[int], d_model: int, base: Any) -> np.ndarray:
    """PE rows for integer positions in the ambient mpmath context. Shape (n, d_model), object."""
    angles = _angles_mp(positions, d_model, base)
    sin = np.vectorize(mpmath.sin, otypes=[object])(angles) if angles.size else angles
    cos = np.vectorize(mpmath.cos, otypes=[object])(angles) if angles.size else angles
    return _interleave(sin, cos)


def positional_encoding(length: int, d_model: int, *, base: float = DEFAULT_BASE) -> np.ndarray:
    """The sinusoidal positional encoding; fast tier (longdouble inside, float64 out).

    Paper: §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Choices:
        d_model must be even (the paper pairs sin and cos; an odd width is an error, not a
        truncated last pair). ``base`` is the paper's 10000, exposed for experiments.
        Positions start at 0; length 0 gives an empty (0, d_model) array.

    Shapes: -> (length, d_model) float64.
    """
    n = positive_int("length", length, minimum=0)
    d = _validate_d_model(d_model)
    b = _validate_base(base)
    return _pe_rows_ld(np.arange(n), d, b).astype(np.float64)


def positional_encoding_exact(
    length: int, d_model: int, *, base: float = DEFAULT_BASE, dps: int = DEFAULT_DPS
) -> np.ndarray:
    """The sinusoidal positional encoding; exact tier (mpmath, correctly rounded float64).

    Paper: §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same angle).

    Choices: as ``positional_encoding``. The working precision is raised by the number of digits
    of the largest angle, so large positions keep ``dps`` digits after the point.

    Shapes: -> (length, d_model) float64.
    """
    n = positive_int("length", length, minimum=0)
    d = _validate_d_model(d_model)
    b = _validate_base(base)
    bm = to_mp(b)[()]
    return correctly_rounded(lambda: _pe_rows_mp(list(range(n)), d, bm), check_dps(dps) + _guard_digits(n, b))


def _blocks(sin: np.ndarray, cos: np.ndarray, zero: Any) -> np.ndarray:
    """Block-diagonal matrix with 2x2 blocks [[cos, sin], [-sin, cos]]. sin, cos (d/2,) -> (d, d)."""
    d = 2 * sin.shape[0]
    m = np.full((d, d), zero, dtype=sin.dtype)
    idx = np.arange(0, d, 2)
    m[idx, idx], m[idx, idx + 1] = cos, sin
    m[idx + 1, idx], m[idx + 1, idx + 1] = -sin, cos
    return m


def pe_shift_matrix(k: int, d_model: int, *, base: float = DEFAULT_BASE) -> np.ndarray:
    """The matrix M_k with PE(pos + k) = M_k @ PE(pos) for every pos; fast tier (float64 out).

    Paper: §3.5: "for any fixed offset k, PE_{pos+k} can be represented as a linear function of
    PE_pos." With w_i = 1 / base^(2i/d_model), the angle-addition formulas give, for pair i,
        [sin((pos+k) w_i), cos((pos+k) w_i)] = [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]]
                                               @ [sin(pos w_i), cos(pos w_i)],
    so M_k is block diagonal with these rotations, independent of pos.

    Choices: k is any integer (negative shifts back); d_model even; ``base`` as
    ``positional_encoding``. M_{-k} = M_k^T and M_0 = I.

    Shapes: -> (d_model, d_model) float64.
    """
    k = _validate_offset(k)
    d = _validate_d_model(d_model)
    b = _validate_base(base)
    angles = LD(k) / _denominators_ld(d, b)  # (d/2,)
    return _blocks(np.sin(angles), np.cos(angles), LD(0)).astype(np.float64)


def pe_shift_matrix_exact(k: int, d_model: int, *, base: float = DEFAULT_BASE, dps: int = DEFAULT_DPS) -> np.ndarray:
    """The matrix M_k with PE(pos + k) = M_k @ PE(pos); exact tier (correctly rounded float64).

    Paper: §3.5 (see ``pe_shift_matrix`` for the derivation).

    Choices: as ``pe_shift_matrix``.

    Shapes: -> (d_model, d_model) float64.
    """
    k = _validate_offset(k)
    d = _validate_d_model(d_model)
    b = _validate_base(base)
    bm = to_mp(b)[()]

    def compute() -> np.ndarray:
        angles = _angles_mp([k], d, bm)[0]  # (d/2,)
        sin = np.array([mpmath.sin(a) for a in angles], dtype=object)
        cos = np.array([mpmath.cos(a) for a in angles], dtype=object)
        return _blocks(sin, cos, mpmath.mpf(0))

    return correctly_rounded(compute, check_dps(dps) + _guard_digits(k, b))
