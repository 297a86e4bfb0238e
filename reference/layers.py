"""Layers, §3.1, §3.3, §3.4: LayerNorm and the residual sub-layer connection, the position-wise
feed-forward network (Eq. 2), the embedding lookup (× sqrt(d_model)) and the tied pre-softmax
projection.

Each equation is encoded twice:

- the fast tier (``layer_norm``, ``feed_forward``, ...) computes in ``np.longdouble`` (x87 extended
  on x86-64: 64-bit significand, unit roundoff 2^-64) and rounds once to float64 at the end; any
  size, batch dimensions broadcast. Every float64 input is exact in longdouble, and longdouble's
  exponent range (to 1e±4932) means no square or product of float64 values over- or underflows
  inside the computation;
- the exact tier (``*_exact``) evaluates the same formula in mpmath through
  ``aiayn.reference._exact.correctly_rounded`` and rounds each result once to float64. The rational
  parts (sums of products of float64 values, LayerNorm's deviations and sum of squares) are formed
  exactly at ``EXACT_PREC`` bits; only LayerNorm's square root and the steps after it, and
  sqrt(d_model), work at the Ziv loop's precision. Eq. (2) and x E^T are exact before their one
  rounding.

Shapes use the paper's names: ``d_model`` the model width, ``d_ff`` the inner width of Eq. (2),
``vocab`` the number of embedding rows; ``...`` is any number of batch dimensions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import as_float_array, choice, same_size
from aiayn.reference._exact import DEFAULT_DPS, correctly_rounded, to_mp

LD = np.longdouble
DEFAULT_EPS = 1e-6  # LayerNorm eps: the paper is silent; tensor2tensor's value (PyTorch uses 1e-5)
NORM_PLACEMENTS = ("post", "pre")
# Bits that hold any sum of products of float64 values (and LayerNorm's sum of squares of such
# sums) exactly: a float64 is m * 2^e with e in [-1074, 971] and |m| < 2^53, so a product of two
# spans at most 2148 + 2048 bits and a product of three (Eq. (2)'s second matmul) 3222 + 3072, plus
# log2 of the number of terms. 8192 leaves room for 2^1800 terms.
EXACT_PREC = 8192


# --------------------------------------------------------------------------------------------
# shared validation


def _vector(name: str, value: Any, size: int, what: str) -> np.ndarray:
    """A finite float64 vector of length ``size`` (``what`` names that size), or raise naming ``name``."""
    arr = as_float_array(name, value)
    if arr.shape != (size,):
        raise ValueError(f"{name}: expected shape ({size},) to match {what}, got shape {arr.shape}")
    return arr


def _nonnegative_scalar(name: str, value: Any) -> float:
    arr = as_float_array(name, value)
    if arr.ndim != 0 or arr < 0:
        raise ValueError(f"{name}: expected one finite number >= 0, got {value!r}")
    return float(arr)


def _reject_constant_rows(name: str, rows: np.ndarray, eps: float) -> None:
    """With eps = 0 a row with zero variance has no LayerNorm (0/0): raise naming the row."""
    if eps != 0.0:
        return
    constant = np.all(rows == rows[..., :1], axis=-1)
    if np.any(constant):
        where = tuple(int(i) for i in np.argwhere(constant)[0])
        raise ValueError(
            f"{name}: row {where} is constant, so its variance is 0 and LayerNorm with eps=0 is 0/0; "
            "use eps > 0 or a row with two distinct values"
        )


def _validate_norm_params(d_model: int, gain: Any, bias: Any, eps: Any) -> tuple[np.ndarray, np.ndarray, float]:
    what = f"the last axis (d_model = {d_model}) of x"
    return _vector("gain", gain, d_model, what), _vector("bias", bias, d_model, what), _nonnegative_scalar("eps", eps)


def _validate_layer_norm(x: Any, gain: Any, bias: Any, eps: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    x = as_float_array("x", x, min_ndim=1)
    if x.shape[-1] == 0:
        raise ValueError(f"x: expected a last axis (d_model) of size >= 1, got shape {x.shape}")
    gain, bias, eps = _validate_norm_params(x.shape[-1], gain, bias, eps)
    _reject_constant_rows("x", x, eps)
    return x, gain, bias, eps


# --------------------------------------------------------------------------------------------
# LayerNorm, §3.1


def _layer_norm_ld(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm in longdouble with the corrected two-pass variance (Chan, Golub & LeVeque, 1983).

    The mean's rounding error is removed by subtracting the mean of the first-pass deviations, so
    the deviations are accurate to a few u relative to themselves plus O(d^2 u^2) times the
    row's magnitude: near-constant rows keep their small spread.
    """
    x = x.astype(LD)
    d = x.shape[-1]
    r = x - np.sum(x, axis=-1, keepdims=True) / d  # (..., d) first-pass deviations
    dev = r - np.sum(r, axis=-1, keepdims=True) / d  # (..., d) corrected deviations
    var = np.sum(dev * dev, axis=-1, keepdims=True) / d  # (..., 1) biased (population) variance
    return dev / np.sqrt(var + eps) * gain + bias  # (..., d)


def _layer_norm_mp(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: Any) -> np.ndarray:
    """LayerNorm of an object array of mpf in the ambient mpmath context.

    With S = sum_j x_j and T_j = d x_j - S (both exact), Q = sum_j T_j^2 + d^3 eps (exact):
    var + eps = Q / d^3 and (x_j - mean) / sqrt(var + eps) = T_j / sqrt(Q / d). Only Q/d, its square
    root, the division and the affine step are rounded, none of them with cancellation except the
    final + bias.
    """
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    out = np.empty(rows.shape, dtype=object)
    for r, row in enumerate(rows):
        with mpmath.workprec(EXACT_PREC):
            s = mpmath.fsum(row.tolist())
            t = [d * v - s for v in row]
            q = mpmath.fsum(t, squared=True) + d**3 * eps
        scale = mpmath.sqrt(q / d)
        out[r] = [t[j] / scale * gain[j] + bias[j] for j in range(d)]
    return out.reshape(x.shape)


def layer_norm(x: Any, gain: Any, bias: Any, eps: float = DEFAULT_EPS) -> np.ndarray:
    """Layer normalisation over the last axis; fast tier (longdouble inside, float64 out).

    Paper: §3.1 ("LayerNorm(x + Sublayer(x))", citing Ba et al., 2016):
    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gain + bias, over the d_model features.

    Choices:
        eps: the paper is silent; default 1e-6 as in the authors' tensor2tensor code (PyTorch's
        nn.LayerNorm uses 1e-5). eps must be >= 0; eps = 0 with a constant row is an error (0/0).
        Variance: the biased (population) variance, sum (x - mean)^2 / d_model.
        eps is added inside the square root, to the variance.

    Shapes: x (..., d_model), gain (d_model,), bias (d_model,) -> (..., d_model) float64.
    """
    x, gain, bias, eps = _validate_layer_norm(x, gain, bias, eps)
    return _layer_norm_ld(x, gain, bias, eps).astype(np.float64)


def layer_norm_exact(x: Any, gain: Any, bias: Any, eps: float = DEFAULT_EPS, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """Layer normalisation over the last axis; exact tier (mpmath, correctly rounded float64).

    Paper: §3.1: LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gain + bias.

    Choices: as ``layer_norm`` (eps default 1e-6, biased variance, eps inside the square root).

    Shapes: x (..., d_model), gain (d_model,), bias (d_model,) -> (..., d_model) float64.
    """
    x, gain, bias, eps = _validate_layer_norm(x, gain, bias, eps)
    xm, gm, bm, em = to_mp(x), to_mp(gain), to_mp(bias), to_mp(eps)[()]
    return correctly_rounded(lambda: _layer_norm_mp(xm, gm, bm, em), dps)


# --------------------------------------------------------------------------------------------
# the residual sub-layer connection, §3.1


def _validate_sublayer(sublayer: Any, norm: str) -> None:
    choice("norm", norm, NORM_PLACEMENTS)
    if not callable(sublayer):
        raise TypeError(
            f"sublayer: expected a callable mapping (..., d_model) to (..., d_model), got {type(sublayer).__name__}"
        )


def _sublayer_output(sublayer: Callable[[np.ndarray], Any], arg: np.ndarray) -> np.ndarray:
    out = as_float_array("sublayer(x)", sublayer(arg))
    if out.shape != arg.shape:
        raise ValueError(
            f"sublayer: must return the shape it was given, {arg.shape} (§3.1 adds it to x), got {out.shape}"
        )
    return out


def sublayer_connection(
    x: Any,
    sublayer: Callable[[np.ndarray], Any],
    gain: Any,
    bias: Any,
    eps: float = DEFAULT_EPS,
    *,
    norm: str = "post",
) -> np.ndarray:
    """The residual connection around a sub-layer; fast tier (longdouble inside, float64 out).

    Paper: §3.1: "the output of each sub-layer is LayerNorm(x + Sublayer(x))" (post-norm).

    Choices:
        norm="post" (default) is the paper's LayerNorm(x + Sublayer(x)). norm="pre" is
        x + Sublayer(LayerNorm(x)), the later pre-norm variant: NOT the paper's, offered for
        comparison. Dropout on the sub-layer output (§5.4) is excluded (inference semantics).
        ``sublayer`` is a float64 callable: for "post" it gets x, and x + Sublayer(x) is formed in
        longdouble; for "pre" it gets LayerNorm(x) rounded to float64. LayerNorm choices as
        ``layer_norm``.

    Shapes: x (..., d_model); sublayer (..., d_model) -> (..., d_model); gain, bias (d_model,).
    """
    _validate_sublayer(sublayer, norm)
    x = as_float_array("x", x, min_ndim=1)
    gain, bias, eps = _validate_norm_params(x.shape[-1], gain, bias, eps)
    if norm == "post":
        residual = x.astype(LD) + _sublayer_output(sublayer, x)  # (..., d_model)
        _reject_constant_rows("x + sublayer(x)", residual, eps)
        return _layer_norm_ld(residual, gain, bias, eps).astype(np.float64)
    _reject_constant_rows("x", x, eps)
    normed = _layer_norm_ld(x, gain, bias, eps).astype(np.float64)  # (..., d_model)
    return (x.astype(LD) + _sublayer_output(sublayer, normed)).astype(np.float64)


def sublayer_connection_exact(
    x: Any,
    sublayer: Callable[[np.ndarray], Any],
    gain: Any,
    bias: Any,
    eps: float = DEFAULT_EPS,
    *,
    norm: str = "post",
    dps: int = DEFAULT_DPS,
) -> np.ndarray:
    """The residual connection around a sub-layer; exact tier (mpmath, correctly rounded float64).

    Paper: §3.1: LayerNorm(x + Sublayer(x)) (post-norm, the paper's).

    Choices: as ``sublayer_connection``. ``sublayer`` here is an exact callable: it receives an
    object array of mpmath numbers and must return one of the same shape, computed in the ambient
    mpmath context (it is called again at each precision of the Ziv loop). For "pre" it receives
    the unrounded LayerNorm(x). The residual sum is formed exactly.

    Shapes: as ``sublayer_connection``.
    """
    _validate_sublayer(sublayer, norm)
    x = as_float_array("x", x, min_ndim=1)
    gain, bias, eps = _validate_norm_params(x.shape[-1], gain, bias, eps)
    xm, gm, bm, em = to_mp(x), to_mp(gain), to_mp(bias), to_mp(eps)[()]
    if norm == "pre":
        _reject_constant_rows("x", x, eps)

    def compute() -> np.ndarray:
        arg = xm if norm == "post" else _layer_norm_mp(xm, gm, bm, em)
        out = np.asarray(sublayer(arg), dtype=object)
        if out.shape != xm.shape:
            raise ValueError(f"sublayer: must return the shape it was given, {xm.shape}, got {out.shape}")
        with mpmath.workprec(EXACT_PREC):
            total = xm + out  # (..., d_model), exact
        if norm == "pre":
            return total
        _reject_constant_rows("x + sublayer(x)", total, eps)
        return _layer_norm_mp(total, gm, bm, em)

    return correctly_rounded(compute, dps)


# --------------------------------------------------------------------------------------------
# position-wise feed-forward network, §3.3, Eq. (2)


def _validate_feed_forward(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[np.ndarray, ...]:
    x = as_float_array("x", x, min_ndim=1)
    w1 = as_float_array("w1", w1)
    if w1.ndim != 2:
        raise ValueError(f"w1: expected a matrix (d_model, d_ff), got shape {w1.shape}")
    same_size("x", x.shape[-1], "w1", w1.shape[0], "d_model (x's last axis, w1's rows)")
    d_model, d_ff = w1.shape
    b1 = _vector("b1", b1, d_ff, f"d_ff = {d_ff} (w1's columns)")
    w2 = as_float_array("w2", w2)
    if w2.shape != (d_ff, d_model):
        raise ValueError(f"w2: expected shape (d_ff, d_model) = ({d_ff}, {d_model}) from w1, got {w2.shape}")
    b2 = _vector("b2", b2, d_model, f"d_model = {d_model} (x's last axis)")
    return x, w1, b1, w2, b2


def _affine_mp(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w + b for object arrays x (..., k), w (k, n), b (n,) or None: every entry exact."""
    k, n = w.shape
    rows = x.reshape(-1, k)
    cols = [w[:, c].tolist() for c in range(n)]
    out = np.empty((rows.shape[0], n), dtype=object)
    with mpmath.workprec(EXACT_PREC):
        for r, row in enumerate(rows):
            vals = row.tolist()
            out[r] = [mpmath.fdot(vals, cols[c]) + (0 if b is None else b[c]) for c in range(n)]
    return out.reshape(*x.shape[:-1], n)


def _relu_mp(v: Any) -> Any:
    return v if v > 0 else mpmath.mpf(0)


def feed_forward(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> np.ndarray:
    """The position-wise feed-forward network; fast tier (longdouble inside, float64 out).

    Paper: §3.3, Eq. (2): FFN(x) = max(0, x W1 + b1) W2 + b2, the same weights at every position.

    Choices:
        Row-vector convention as printed (x W1): w1 is (d_model, d_ff), w2 is (d_ff, d_model).
        Dropout (the tensor2tensor code drops the ReLU output) is excluded (inference semantics).

    Shapes: x (..., d_model), w1 (d_model, d_ff), b1 (d_ff,), w2 (d_ff, d_model), b2 (d_model,)
    -> (..., d_model) float64.
    """
    x, w1, b1, w2, b2 = _validate_feed_forward(x, w1, b1, w2, b2)
    hidden = np.maximum(np.matmul(x.astype(LD), w1.astype(LD)) + b1.astype(LD), 0)  # (..., d_ff)
    return (np.matmul(hidden, w2.astype(LD)) + b2.astype(LD)).astype(np.float64)  # (..., d_model)


def feed_forward_exact(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """The position-wise feed-forward network; exact tier (correctly rounded float64).

    Paper: §3.3, Eq. (2): FFN(x) = max(0, x W1 + b1) W2 + b2.

    Choices: as ``feed_forward``. Eq. (2) is rational, so every entry is computed exactly
    (``EXACT_PREC`` bits) and rounded once; the result does not depend on ``dps``.

    Shapes: as ``feed_forward``.
    """
    x, w1, b1, w2, b2 = _validate_feed_forward(x, w1, b1, w2, b2)
    xm, w1m, b1m, w2m, b2m = (to_mp(a) for a in (x, w1, b1, w2, b2))

    def compute() -> np.ndarray:
        hidden = np.vectorize(_relu_mp, otypes=[object])(_affine_mp(xm, w1m, b1m))  # (..., d_ff)
        return _affine_mp(hidden, w2m, b2m)  # (..., d_model)

    return correctly_rounded(compute, dps)


# --------------------------------------------------------------------------------------------
# the backward of LayerNorm and Eq. (2): vector-Jacobian products
#
# Derived from the definitions (never from an implementation's backward). For a cotangent dY:
#   LayerNorm  x_hat = (x - mean) / sigma, sigma = sqrt(var + eps) (biased var), y = gain x_hat + bias:
#              d x_hat_i / d x_j = (delta_ij - 1/d - x_hat_i x_hat_j / d) / sigma (d sigma / d x_j = x_hat_j / d), so
#              dx = (g - mean(g) - x_hat mean(g x_hat)) / sigma with g = dY gain;
#              dgain = sum over rows of dY x_hat; dbias = sum over rows of dY.
#   Eq. (2)    z = x W1 + b1, h = max(0, z), y = h W2 + b2:
#              dW2 = h^T dY, db2 = sum dY, dh = dY W2^T, dz = dh [z > 0], dW1 = x^T dz, db1 = sum dz, dx = dz W1^T;
#              the sums run over every row (position and batch): the weights are shared (§3.3). ReLU has no
#              derivative at z = 0: the choice ``relu_at_zero`` (0, the subgradient autograd libraries take, by
#              default; or 1) is used there.

RELU_AT_ZERO = (0.0, 1.0)


def _rows_sum(a: np.ndarray) -> np.ndarray:
    """Sum over every axis but the last (float or object arrays)."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


def _layer_norm_pullback_ld(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float
) -> tuple[np.ndarray, Callable[[np.ndarray], tuple[np.ndarray, ...]]]:
    """LayerNorm of longdouble arrays (as :func:`_layer_norm_ld` forms it) and its pullback dy -> (dx, dgain, dbias),
    longdouble; formulas in the comment above."""
    d = x.shape[-1]
    r = x - np.sum(x, axis=-1, keepdims=True) / d
    dev = r - np.sum(r, axis=-1, keepdims=True) / d  # (..., d) corrected two-pass deviations
    sigma = np.sqrt(np.sum(dev * dev, axis=-1, keepdims=True) / d + eps)  # (..., 1)
    x_hat = dev / sigma

    def pullback(g: np.ndarray) -> tuple[np.ndarray, ...]:
        gg = g * gain
        dx = (gg - np.mean(gg, axis=-1, keepdims=True) - x_hat * np.mean(gg * x_hat, axis=-1, keepdims=True)) / sigma
        return dx, _rows_sum(g * x_hat), _rows_sum(g)

    return x_hat * gain + bias, pullback


def _layer_norm_pullback_mp(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: Any
) -> tuple[np.ndarray, Callable[[np.ndarray], tuple[np.ndarray, ...]]]:
    """LayerNorm of object arrays of mpf (as :func:`_layer_norm_mp` forms it: T_j = d x_j - sum x and
    Q = sum T_j^2 + d^3 eps exact) and its pullback dy -> (dx, dgain, dbias), in the ambient mpmath context."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    sigmas, x_hats = [], []
    for row in rows:
        with mpmath.workprec(EXACT_PREC):
            s = mpmath.fsum(row.tolist())
            t = [d * v - s for v in row]
            q = mpmath.fsum(t, squared=True) + d**3 * mpmath.mpf(eps)
        sigmas.append(mpmath.sqrt(q / d**3))
        x_hats.append([t_j / mpmath.sqrt(q / d) for t_j in t])
    x_hat = np.array(x_hats, dtype=object).reshape(x.shape)

    def pullback(dy: np.ndarray) -> tuple[np.ndarray, ...]:
        cots = dy.reshape(-1, d)
        dx = np.empty(rows.shape, dtype=object)
        dgain, dbias = [mpmath.mpf(0)] * d, [mpmath.mpf(0)] * d
        for i, (cot, sigma, xh) in enumerate(zip(cots, sigmas, x_hats)):
            g = [cot[j] * gain[j] for j in range(d)]
            mean_g = mpmath.fsum(g) / d
            mean_gx = mpmath.fdot(g, xh) / d
            dx[i] = [(g[j] - mean_g - xh[j] * mean_gx) / sigma for j in range(d)]
            dgain = [dgain[j] + cot[j] * xh[j] for j in range(d)]
            dbias = [dbias[j] + cot[j] for j in range(d)]
        return dx.reshape(x.shape), np.array(dgain, dtype=object), np.array(dbias, dtype=object)

    return x_hat * gain + bias, pullback


def layer_norm_vjp(
    x: Any, gain: Any, bias: Any, dy: Any, eps: float = DEFAULT_EPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The VJP of LayerNorm over the last axis: (dx, dgain, dbias) for the cotangent ``dy``; fast tier (longdouble
    inside, float64 out). Formulas in the comment above; the deviations from the mean are formed as
    :func:`layer_norm` forms them (corrected two-pass).

    Paper: §3.1. Shapes: x and dy (..., d_model), gain, bias (d_model,) -> dx (..., d_model), dgain, dbias (d_model,).
    """
    x, gain, bias, eps = _validate_layer_norm(x, gain, bias, eps)
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the output's shape {x.shape}, got {dy.shape}")
    _, pullback = _layer_norm_pullback_ld(x.astype(LD), gain.astype(LD), bias.astype(LD), eps)
    return tuple(a.astype(np.float64) for a in pullback(dy.astype(LD)))  # type: ignore[return-value]


def layer_norm_vjp_exact(
    x: Any, gain: Any, bias: Any, dy: Any, eps: float = DEFAULT_EPS, *, dps: int = DEFAULT_DPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The VJP of LayerNorm; exact tier (mpmath at ``dps`` digits, each result rounded once to float64).

    Paper: §3.1. Same definition and shapes as :func:`layer_norm_vjp`; x_hat and sigma formed as
    :func:`layer_norm_exact` forms them (T_j = d x_j - sum x and Q = sum T_j^2 + d^3 eps, exact).
    """
    x, gain, bias, eps = _validate_layer_norm(x, gain, bias, eps)
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the output's shape {x.shape}, got {dy.shape}")
    d = x.shape[-1]
    xm, gm, bm, cot = to_mp(x), to_mp(gain), to_mp(bias), to_mp(dy)

    def compute() -> np.ndarray:
        _, pullback = _layer_norm_pullback_mp(xm, gm, bm, eps)
        return np.concatenate([np.asarray(a, dtype=object).reshape(-1) for a in pullback(cot)])

    flat = correctly_rounded(compute, dps)
    return flat[: x.size].reshape(x.shape), flat[x.size : x.size + d], flat[x.size + d :]


def _mp_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for object arrays a (..., k), b (k, n): every entry exact."""
    return _affine_mp(a, b, None)


def _feed_forward_pullback(
    x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, relu_at_zero: float, exact: bool
) -> tuple[np.ndarray, Callable[[np.ndarray], tuple[np.ndarray, ...]]]:
    """Eq. (2) and its pullback dy -> (dx, dw1, db1, dw2, db2), formulas in the comment above: on longdouble arrays,
    or (``exact``) on object arrays of mpf with every product and sum exact."""
    if exact:
        matmul, relu = _mp_product, np.vectorize(_relu_mp, otypes=[object])
        gate = np.vectorize(lambda v: 1 if v > 0 else (relu_at_zero if v == 0 else 0), otypes=[object])
    else:
        matmul, relu = np.matmul, (lambda v: np.maximum(v, 0))
        gate = lambda v: np.where(v > 0, LD(1), np.where(v == 0, LD(relu_at_zero), LD(0)))  # noqa: E731
    d_model, d_ff = w1.shape
    z = matmul(x, w1) + b1  # (..., d_ff)
    h = relu(z)

    def pullback(g: np.ndarray) -> tuple[np.ndarray, ...]:
        dz = matmul(g, w2.T.copy()) * gate(z)  # (..., d_ff)
        dw1 = matmul(x.reshape(-1, d_model).T.copy(), dz.reshape(-1, d_ff))
        dw2 = matmul(h.reshape(-1, d_ff).T.copy(), g.reshape(-1, d_model))
        return matmul(dz, w1.T.copy()), dw1, _rows_sum(dz), dw2, _rows_sum(g)

    return matmul(h, w2) + b2, pullback


def _validate_feed_forward_vjp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, dy: Any, relu_at_zero: float):
    x, w1, b1, w2, b2 = _validate_feed_forward(x, w1, b1, w2, b2)
    choice("relu_at_zero", relu_at_zero, RELU_AT_ZERO)  # type: ignore[arg-type]
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the output's shape {x.shape}, got {dy.shape}")
    return x, w1, b1, w2, b2, dy


def feed_forward_vjp(
    x: Any, w1: Any, b1: Any, w2: Any, b2: Any, dy: Any, *, relu_at_zero: float = 0.0
) -> tuple[np.ndarray, ...]:
    """The VJP of Eq. (2): (dx, dw1, db1, dw2, db2) for the cotangent ``dy``; fast tier (longdouble inside, float64
    out). Formulas and the choice ``relu_at_zero`` in the comment above.

    Paper: §3.3, Eq. (2). Shapes: as :func:`feed_forward`, dy the output's shape -> each input's shape.
    """
    arrays = _validate_feed_forward_vjp(x, w1, b1, w2, b2, dy, relu_at_zero)
    x, w1, b1, w2, b2, dy = (a.astype(LD) for a in arrays)
    _, pullback = _feed_forward_pullback(x, w1, b1, w2, b2, relu_at_zero, exact=False)
    return tuple(a.astype(np.float64) for a in pullback(dy))


def feed_forward_vjp_exact(
    x: Any, w1: Any, b1: Any, w2: Any, b2: Any, dy: Any, *, relu_at_zero: float = 0.0, dps: int = DEFAULT_DPS
) -> tuple[np.ndarray, ...]:
    """The VJP of Eq. (2); exact tier (every entry exact, rounded once to float64: the VJP is rational).

    Paper: §3.3, Eq. (2). Same definition, choice and shapes as :func:`feed_forward_vjp`.
    """
    arrays = _validate_feed_forward_vjp(x, w1, b1, w2, b2, dy, relu_at_zero)
    xm, w1m, b1m, w2m, b2m, gm = (to_mp(a) for a in arrays)

    def compute() -> np.ndarray:
        with mpmath.workprec(EXACT_PREC):  # the sums of the row sums too
            _, pullback = _feed_forward_pullback(xm, w1m, b1m, w2m, b2m, relu_at_zero, exact=True)
            parts = pullback(gm)
        return np.concatenate([np.asarray(p, dtype=object).reshape(-1) for p in parts])

    flat = correctly_rounded(compute, dps)
    out, start = [], 0
    for shape in (arrays[0].shape, *(a.shape for a in arrays[1:5])):
        size = int(np.prod(shape))
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return tuple(out)


# --------------------------------------------------------------------------------------------
# embeddings and the tied pre-softmax projection, §3.4


def _validate_tokens(tokens: Any, vocab: int) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"tokens: expected integer token ids, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= vocab)
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"tokens: id {int(arr[where])} at index {where} is out of range; expected 0 <= id < vocab = {vocab}"
        )
    return arr


def _validate_embedding(embedding: Any) -> np.ndarray:
    e = as_float_array("embedding", embedding)
    if e.ndim != 2 or 0 in e.shape:
        raise ValueError(f"embedding: expected a non-empty matrix (vocab, d_model), got shape {e.shape}")
    return e


def embedding_lookup(tokens: Any, embedding: Any) -> np.ndarray:
    """Embedding rows for token ids, multiplied by sqrt(d_model); fast tier (float64 out).

    Paper: §3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)."

    Choices:
        The same matrix serves source, target and the pre-softmax projection (§3.4, shared
        vocabulary); ids outside [0, vocab) are an error (no wrap-around, no padding row).

    Shapes: tokens (...) integer, embedding (vocab, d_model) -> (..., d_model) float64.
    """
    e = _validate_embedding(embedding)
    ids = _validate_tokens(tokens, e.shape[0])
    return (e.astype(LD)[ids] * np.sqrt(LD(e.shape[1]))).astype(np.float64)  # (..., d_model)


def embedding_lookup_exact(tokens: Any, embedding: Any, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """Embedding rows for token ids, multiplied by sqrt(d_model); exact tier (correctly rounded).

    Paper: §3.4: embedding weights multiplied by sqrt(d_model).

    Choices: as ``embedding_lookup``.

    Shapes: tokens (...) integer, embedding (vocab, d_model) -> (..., d_model) float64.
    """
    e = _validate_embedding(embedding)
    ids = _validate_tokens(tokens, e.shape[0])
    rows = to_mp(e[ids])  # (..., d_model), exact
    d_model = e.shape[1]
    return correctly_rounded(lambda: rows * mpmath.sqrt(d_model), dps)


def _validate_logits_inputs(x: Any, embedding: Any) -> tuple[np.ndarray, np.ndarray]:
    x = as_float_array("x", x, min_ndim=1)
    e = _validate_embedding(embedding)
    same_size("x", x.shape[-1], "embedding", e.shape[1], "d_model (x's last axis, embedding's columns)")
    return x, e


def output_logits(x: Any, embedding: Any) -> np.ndarray:
    """The pre-softmax linear transformation with the embedding matrix; fast tier (float64 out).

    Paper: §3.4: "we share the same weight matrix between the two embedding layers and the
    pre-softmax linear transformation": logits = x E^T.

    Choices:
        Tied weights, no bias, and no sqrt(d_model) factor on the output side (the paper puts it
        only in the embedding layers).

    Shapes: x (..., d_model), embedding (vocab, d_model) -> (..., vocab) float64.
    """
    x, e = _validate_logits_inputs(x, embedding)
    return np.matmul(x.astype(LD), e.astype(LD).T).astype(np.float64)  # (..., vocab)


def output_logits_exact(x: Any, embedding: Any, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """The tied pre-softmax projection x E^T; exact tier (computed exactly, rounded once).

    Paper: §3.4: logits = x E^T with the shared embedding matrix E.

    Choices: as ``output_logits``; the result is exact before its one rounding (any ``dps``).

    Shapes: x (..., d_model), embedding (vocab, d_model) -> (..., vocab) float64.
    """
    x, e = _validate_logits_inputs(x, embedding)
    xm, etm = to_mp(x), to_mp(e.T)
    return correctly_rounded(lambda: _affine_mp(xm, etm, None), dps)
