"""Error budgets: how far an implementation in a given dtype may be from the exact value, equation by equation.

Each function below returns an *elementwise* bound on ``|computed - exact|`` for an
implementation that evaluates the equation in a dtype of precision ``prec`` (see
:mod:`aiayn.conformance.numerics`), derived by forward error analysis from the actual magnitudes of the
inputs (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.; cited as [H]). There
is no global rtol anywhere in the suite.

What the budgets assume, and what they do not:

- Every elementary operation (add, multiply, divide, sqrt, a storage rounding) is at least as
  accurate as the dtype: relative error ``<= prec.op = u (1 + 2^-10)`` (the slack covers double
  rounding through a wider format). Nothing assumes a wider accumulator: a float16 dot product
  is allowed ``gamma_n(u_float16)``. Implementations that accumulate in float32 (PyTorch on the
  CPU, cuBLAS) are well inside such a budget; the suite does not need their word for it, and
  gives them no tighter budget for it either.
- exp/log/sin/cos/pow: relative error ``<= prec.t`` (4 ulps, see :mod:`aiayn.conformance.numerics`).
- Any summation order (pairwise, blocked, sequential, split-K): the bounds are the worst case
  over orders, ``gamma_{n-1}`` for n terms [H, §4.2, Lemma 3.4 / eq. (3.4)].
- The algorithm is a standard stable one: the max-shifted softmax; two-pass or Welford variance
  in LayerNorm. An unshifted softmax or a one-pass ``E[x^2] - E[x]^2`` variance is a numerical
  defect these budgets are meant to catch.

The implementation's inputs are exact (the oracle runs on the same rounded values), so every
bound here is the rounding error of one evaluation. Inside multi-head attention the heads see
projections that already carry rounding errors: :func:`attention_core` accepts such input-error
bounds ``e_*`` and bounds ``|f_computed(x + dx) - f(x)|`` for every ``|dx| <= e`` [H, §1.6]. The
composites (layers, the whole model) are bounded in ``conformance/budgets/composites/forward.py``.

How a budget is used (``conformance/run/harness.py``): the oracle (``reference/``, fast tier) computes
in x87 longdouble and rounds its result to float64; its own error is therefore bounded by the same
analysis with the float64 precision.
The comparison threshold is ``bound(prec_dtype) + bound(prec_float64)``, with a floor of one ulp
of the dtype at the expected value (a result must be stored in the dtype, so half an ulp is the
least any implementation can be off by; the floor keeps exact zeros from getting a zero budget).

Every bound is multiplied by ``SAFETY = 1 + 2^-20``: the bound itself is evaluated in float64 from
float64 magnitudes (|q||k|^T, P|V|, ...), which carry relative errors of a few 2^-53.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiayn.conformance.budgets._heads import merge as _merge
from aiayn.conformance.budgets._heads import split as _split
from aiayn.conformance.numerics import Precision, gamma, round_to

__all__ = [
    "SAFETY",
    "adam_step",
    "average_checkpoints",
    "dropout",
    "attention_core",
    "attention_weights",
    "feed_forward",
    "label_smoothing",
    "layer_norm",
    "normalized",
    "lrate",
    "multi_head_attention",
    "positional_encoding",
    "scaled_dot_product_attention",
    "smoothed_cross_entropy",
    "softmax",
]

SAFETY = 1.0 + 2.0**-20
LN_BASE = math.log(10000.0)  # ln of §3.5's base: the exponent 2i/d_model is multiplied by it
_HUGE = 1e300  # stands in for an infinite (vacuous) bound inside matrix products, where inf * 0 = NaN


def _finite(e: Any) -> np.ndarray:
    """A bound array with inf replaced by a huge finite number, so that 0 * bound stays 0 in matmuls."""
    return np.minimum(np.asarray(e, dtype=np.float64), _HUGE)


def _times(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p * c with 0 wherever p == 0 (a zero weight contributes nothing, even against an infinite factor)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(p == 0, 0.0, p * c)


def _softmax64(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 for magnitudes only; -inf entries get 0, all -inf rows 0."""
    visible = z > -np.inf
    m = np.max(np.where(visible, z, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        e = np.where(visible, np.exp(np.where(visible, z - m, 0.0)), 0.0)
        s = np.sum(e, axis=-1, keepdims=True)
        return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# §3.2.1: softmax


def _softmax_weight_factor(
    gap: np.ndarray, p: np.ndarray, widen: np.ndarray | float, n: int, prec: Precision
) -> np.ndarray:
    """Bound c_j on |p_hat_j / p_j - 1| for the max-shifted softmax of scores whose row max may be off.

    ``gap`` = (row max - z_j) >= 0 of the visible entries, ``p`` the exact weights, ``widen`` =
    e^{2D} for scores perturbed by at most D before the softmax (1 for exact inputs).
    See :func:`softmax` for the derivation.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        rho = np.expm1(prec.op * gap) * (1 + prec.t) + prec.t  # exp of a rounded difference, then exp's own error
        big_r = widen * np.sum(_times(p, rho), axis=-1, keepdims=True)  # relative error of the sum's terms, weighted
        g = gamma(max(n - 1, 0), prec.op)  # the sum itself, n - 1 additions in any order
        s_lo, s_hi = (1 - big_r) * (1 - g), (1 + big_r) * (1 + g)
        r3 = (1 + prec.op) ** 3  # the division (or reciprocal and multiply), and a storage rounding
        upper = np.where(s_lo > 0, widen * (1 + rho) * r3 / np.where(s_lo > 0, s_lo, 1.0), np.inf) - 1
        lower = 1 - (1 - np.minimum(rho, 1)) / r3 / widen / s_hi
    return np.maximum(upper, lower)


def softmax(x: np.ndarray, axis: int, prec: Precision) -> np.ndarray:
    """Bound for softmax(x) along ``axis`` (§3.2.1), max-shifted, in precision ``prec``.

    Derivation. Let m = max_j x_j (exact: max is exact), gap_j = m - x_j >= 0, p_j the exact
    weights, n the row length.
      1. d_j = fl(x_j - m) = (x_j - m)(1 + d1): absolute error <= u gap_j, which exp turns into
         the factor e^{+-u gap_j}; exp's own error adds (1 + t). So
         e_hat_j = e_j (1 + r_j), |r_j| <= rho_j := expm1(u gap_j)(1 + t) + t.
      2. S_hat = fl(sum_j e_hat_j): n - 1 additions of positive terms in any order [H, (3.4)]:
         S_hat / S in [(1 - R)(1 - gamma_{n-1}), (1 + R)(1 + gamma_{n-1})], R = sum_j p_j rho_j.
      3. p_hat_j = fl(e_hat_j / S_hat), up to three roundings (a division or a reciprocal and a
         product, and a storage rounding): (1 + u)^{+-3}.
    Hence |p_hat_j - p_j| <= p_j c_j with c_j = max((1 + rho_j)(1 + u)^3 / ((1 - R)(1 - gamma)) - 1,
    1 - (1 - rho_j)(1 + u)^-3 / ((1 + R)(1 + gamma))): the shifted-softmax bound, computed from
    the actual gaps. Underflow: each exp may underflow with absolute error eta, the sum then
    carries n eta, and S >= 1 (the max term is exp(0)), so add (n + 2) eta.
    -inf entries (masked scores) must give exactly 0; a row of -inf gives NaN (compared separately).
    """
    z = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    n = z.shape[-1]
    p = _softmax64(z)
    visible = z > -np.inf
    m = np.max(np.where(visible, z, -np.inf), axis=-1, keepdims=True)
    gap = np.where(visible, np.where(np.isfinite(m), m, 0.0) - np.where(visible, z, 0.0), 0.0)
    c = _softmax_weight_factor(gap, p, 1.0, n, prec)
    bound = _times(p, c) + np.where(visible, (n + 2) * prec.eta, 0.0)
    return np.moveaxis(bound * SAFETY, -1, axis)


# --------------------------------------------------------------------------------------------
# §3.2.1, Eq. (1): scaled dot-product attention


def score_error(q: np.ndarray, e_q: np.ndarray, k: np.ndarray, e_k: np.ndarray, prec: Precision) -> np.ndarray:
    """delta: a bound on |s_hat - s| for the scores s = q k^T / sqrt(d_k) of inputs known to within e_q, e_k.

    (e_q |k|^T + |q| e_k^T + e_q e_k^T + gamma_{d_k + 4} (|q| + e_q)(|k| + e_k)^T + (d_k + 4) eta) / sqrt(d_k):
    see :func:`attention_core`. q, e_q (..., n_q, d_k); k, e_k (..., n_k, d_k); only magnitudes matter,
    so bounds on |q| and |k| give a bound (``strategies.score_error_bound``). Returns (..., n_q, n_k).
    """
    d_k = q.shape[-1]
    kt, ekt = np.swapaxes(k, -1, -2), np.swapaxes(e_k, -1, -2)
    return (
        np.matmul(e_q, np.abs(kt))
        + np.matmul(np.abs(q), ekt)
        + np.matmul(e_q, ekt)
        + gamma(d_k + 4, prec.op) * np.matmul(np.abs(q) + e_q, np.abs(kt) + ekt)
        + (d_k + 4) * prec.eta
    ) / math.sqrt(d_k)


def attention_weights(
    q: np.ndarray,
    k: np.ndarray,
    visible: np.ndarray | None,
    prec: Precision,
    e_q: Any = 0.0,
    e_k: Any = 0.0,
    fully_masked: str = "nan",
    lse_rounding: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P, C, visible) for the weights P = softmax(q k^T / sqrt(d_k)) of Eq. (1): the computed weights are
    P (1 + C') with |C'| <= C elementwise (see :func:`attention_core` for the derivation); ``visible`` the mask as
    the weights saw it (a fully masked row under "uniform" sees every key). P is 0 at masked keys and on fully
    masked rows under "nan" and "zeros".

    ``lse_rounding``: the weights may instead be recomputed from a stored log-sum-exp L = m + log l (FlashAttention's
    backward): exp(s_j - L) has the argument error u |s_j - L| <= u (gap_j + log n_k) of the subtraction and the
    error u |L| <= u (|m| + log n_k) of L's own storage, so the gaps widen by |m| + 2 log n_k.
    Shapes: q (..., n_q, d_k), k (..., n_k, d_k) -> three arrays (..., n_q, n_k).
    """
    d_k, n_k = q.shape[-1], k.shape[-2]
    e_q, e_k = (np.broadcast_to(_finite(e), a.shape) for e, a in ((e_q, q), (e_k, k)))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / math.sqrt(d_k)  # (..., n_q, n_k)
    delta = score_error(q, e_q, k, e_k, prec)
    vis = np.ones(s.shape, dtype=bool) if visible is None else np.broadcast_to(visible, s.shape)
    if fully_masked == "uniform":  # a fully masked row: equal scores over every key (see above)
        dead = ~np.any(vis, axis=-1, keepdims=True)
        s, delta, vis = np.where(dead, 0.0, s), np.where(dead, 0.0, delta), vis | dead
    s = np.where(vis, s, -np.inf)
    delta = np.where(vis, delta, 0.0)
    p = _softmax64(s)  # (..., n_q, n_k); fully masked rows all 0
    big_d = np.max(delta, axis=-1, keepdims=True)  # (..., n_q, 1)
    with np.errstate(over="ignore"):
        widen = np.exp(2 * big_d)
    m = np.max(np.where(vis, s, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    gap = np.where(vis, m - np.where(vis, s, 0.0), 0.0) + 2 * big_d
    if lse_rounding:
        gap = gap + np.abs(m) + 2 * math.log(max(n_k, 1))
    c = _finite(_softmax_weight_factor(gap, p, widen, n_k, prec))
    return p, c, vis


def attention_core(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    visible: np.ndarray | None,
    prec: Precision,
    e_q: Any = 0.0,
    e_k: Any = 0.0,
    e_v: Any = 0.0,
    fully_masked: str = "nan",
    lse_rounding: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(error bound, magnitude bound) for softmax(q k^T / sqrt(d_k)) v with inputs known to within e_q, e_k, e_v
    (``lse_rounding``: the weights may be formed as exp(s_j - L) from the row's log-sum-exp L,
    :func:`attention_weights`).

    Derivation (Eq. (1)).
      Scores. s = q k^T / sqrt(d_k). The implementation sees q + dq, k + dk and computes a
      length-d_k dot product (gamma_{d_k} [H, (3.5)]) and a scaling by 1/sqrt(d_k) formed and
      applied with at most 4 more roundings (sqrt, a reciprocal or fourth root, applied to the
      score or to q and to k): |s_hat - s| <= delta :=
        (e_q |k|^T + |q| e_k^T + e_q e_k^T + gamma_{d_k + 4} (|q| + e_q)(|k| + e_k)^T) / sqrt(d_k).
      Masked scores are -inf in both: no error. D = max over a row's visible keys of delta.
      Softmax of perturbed scores. softmax(s + ds)_j / softmax(s)_j lies in [e^{-2D}, e^{2D}]
      (numerator and denominator each move by at most e^{+-D}); on top of that the rounding of
      the max-shifted softmax itself (see :func:`softmax`) with gaps widened by 2D. So the
      computed weight p_hat_j = p_j (1 + c_j) with |c_j| bounded by ``_softmax_weight_factor``.
      P V. out = sum_j p_j v_j; the implementation forms sum_j p_hat_j (v_j + dv_j) with
      n_k - 1 additions, n_k products and a storage rounding: gamma_{n_k + 1}. Hence
        |out_hat - out| <= (P o C)(|V| + E_V) + P E_V + gamma_{n_k+1} (P o (1 + C))(|V| + E_V)
      plus underflow: each weight may carry (n_k + 2) eta absolutely, times sum_j (|v_j| + e_v_j),
      and the n_k + 2 products and sums may each underflow: (n_k + 2) eta.
    (Every ``eta`` term in this module is the subnormal spacing of the dtype: the absolute error
    of an operation whose result is below the normal range, [H, §2.1].)
    Fully masked rows (no visible key) get bound 0 under the policies "nan" and "zeros": their output
    is NaN or exactly 0, compared separately. Under "uniform" (what a finite mask value gives: every
    masked score the same finite number) the row is Eq. (1) with equal scores, every weight 1/n_k:
    it is bounded as a row whose every key is visible with score 0 (no score error: the scores do
    not matter), by the same softmax and P V analysis.

    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), visible broadcastable to
    (..., n_q, n_k); e_* broadcastable to their inputs. Returns two arrays (..., n_q, d_v): the
    error bound and a bound on |out_hat| (|out| + error), for the next stage of a composite.
    """
    n_k = k.shape[-2]
    e_v = np.broadcast_to(_finite(e_v), v.shape)
    p, c, vis = attention_weights(q, k, visible, prec, e_q, e_k, fully_masked, lse_rounding)
    av = np.abs(v) + e_v  # (..., n_k, d_v)
    err = np.matmul(_times(p, c), av) + np.matmul(p, e_v) + gamma(n_k + 1, prec.op) * np.matmul(_times(p, 1 + c), av)
    alive = np.any(vis, axis=-1, keepdims=True)  # rows with at least one visible key
    err = err + np.where(alive, (n_k + 2) * prec.eta, 0.0) * (np.sum(av, axis=-2, keepdims=True) + 1)
    err = np.where(alive, err, 0.0) * SAFETY
    return err, np.matmul(p, av) + err


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, prec: Precision, fully_masked: str = "nan"
) -> np.ndarray:
    """Bound for Eq. (1) on exact inputs: :func:`attention_core` with no input error (``fully_masked``: the declared
    policy)."""
    return attention_core(q, k, v, mask, prec, fully_masked=fully_masked)[0]


# --------------------------------------------------------------------------------------------
# §3.2.2: multi-head attention


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, prec: Precision) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound) of x @ w + b.

    |fl(x w + b) - (x w + b)| <= gamma_{m+2} (|x||w| + |b|) + (m + 2) eta: a length-m dot product,
    the bias addition and a storage rounding [H, (3.5)], each of the m + 2 results possibly
    underflowing (absolute error eta).
    """
    ab = 0.0 if b is None else np.abs(b)
    value = np.matmul(x, w) + (0.0 if b is None else b)
    m = w.shape[0]
    return value, gamma(m + 2, prec.op) * (np.matmul(np.abs(x), np.abs(w)) + ab) + (m + 2) * prec.eta


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: Mapping[str, np.ndarray],
    num_heads: int,
    mask: np.ndarray | None,
    prec: Precision,
    fully_masked: str = "nan",
) -> np.ndarray:
    """Bound for MultiHead(Q, K, V) (§3.2.2); ``fully_masked``: the declared policy (see :func:`attention_core`).

    Derivation. The projections Q = query W^Q + b_Q etc. are affine maps (see ``_affine``:
    e_Q = gamma_{d_model+2} (|query||W^Q| + |b_Q|)); each head is
    Eq. (1) on its column block with those input errors (:func:`attention_core`), giving e_H and
    |H_hat| <= P|V| + e_H; the output projection adds
    e_H |W^O| + gamma_{h d_v + 2} (|H_hat| |W^O| + |b_O|).
    """
    h = int(num_heads)
    q, e_q = _affine(query, params["w_q"], params.get("b_q"), prec)
    k, e_k = _affine(key, params["w_k"], params.get("b_k"), prec)
    v, e_v = _affine(value, params["w_v"], params.get("b_v"), prec)
    vis = None if mask is None else np.asarray(mask)[..., None, :, :]  # (..., 1, n_q, n_k): every head
    e_h, mag_h = attention_core(
        _split(q, h),
        _split(k, h),
        _split(v, h),
        vis,
        prec,
        _split(e_q, h),
        _split(e_k, h),
        _split(e_v, h),
        fully_masked=fully_masked,
    )
    e_h, mag_h = _finite(_merge(e_h)), _finite(_merge(mag_h))  # (..., n_q, h*d_v)
    w_o, b_o = params["w_o"], params.get("b_o")
    ab = 0.0 if b_o is None else np.abs(b_o)
    m = w_o.shape[0]
    err = (
        np.matmul(e_h, np.abs(w_o)) + gamma(m + 2, prec.op) * (np.matmul(mag_h, np.abs(w_o)) + ab) + (m + 2) * prec.eta
    )
    return err * SAFETY


# --------------------------------------------------------------------------------------------
# §3.5: positional encoding


def positional_encoding(
    length: int,
    d_model: int,
    prec: Precision,
    start: int = 0,
    exponent: np.ndarray | None = None,
    base: float = 10000.0,
    layout: str = "interleaved",
) -> np.ndarray:
    """Bound for PE (§3.5) computed in precision ``prec``: the argument grows with the position.

    ``start``, ``exponent`` (e_i, one per sin/cos pair), ``base`` and ``layout`` (interleaved, swapped, halves):
    §3.5's table by default (0, 2i/d_model, 10000, sin at 2i); another table's where the diagnoses judge a departure
    at its own values (positions from 1, tensor2tensor's i/(d/2 - 1) in halves): the same derivation with
    theta = (pos + start) base^(-e_i) and ln(base), each bound at its own column.

    Derivation. PE[pos, 2i] = sin(theta), PE[pos, 2i+1] = cos(theta), theta = pos w_i,
    w_i = 10000^{-e_i}, e_i = 2i/d_model. The exponent e_i (times ln 10000, in whatever form:
    pow, exp of a product, a division) is formed with at most 4 roundings, so its absolute error
    is <= ln(10000) e_i gamma_4, which pow/exp turns into the factor exp(ln(10000) e_i gamma_4);
    pow/exp's own error (1 + t); pos * w_i or pos / 10000^{e_i}, and possibly a storage rounding
    of w_i: (1 + u)^2. So theta_hat = theta (1 + r_i),
      r_i = (1 + t)(1 + u)^2 exp(ln(10000) e_i gamma_4) - 1,
    an absolute argument error |theta| r_i: it grows with pos, which is why long sequences in low
    precision lose the high-frequency dimensions. sin and cos are 1-Lipschitz and bounded by 1:
      |PE_hat - PE| <= min(|theta| r_i, 2) + (t + u)|PE| + 2 eta
    (the function's own error and a storage rounding).
    """
    pos = np.arange(length, dtype=np.float64)[:, None] + start  # (length, 1)
    e = np.arange(0, d_model, 2, dtype=np.float64) / d_model if exponent is None else np.asarray(exponent, np.float64)
    theta = pos * np.power(base, -e)  # (length, d_model/2)
    r = (1 + prec.t) * (1 + prec.op) ** 2 * np.exp(math.log(base) * e * gamma(4, prec.op)) - 1
    arg = np.minimum(theta * r, 2.0)
    pe, args = np.empty((length, d_model)), np.empty((length, d_model))
    if layout == "halves":  # [sin | cos]
        pe[:, : d_model // 2], pe[:, d_model // 2 :] = np.sin(theta), np.cos(theta)
        args[:, : d_model // 2], args[:, d_model // 2 :] = arg, arg
    else:
        first, second = (np.cos, np.sin) if layout == "swapped" else (np.sin, np.cos)
        pe[:, 0::2], pe[:, 1::2] = first(theta), second(theta)
        args[:, 0::2], args[:, 1::2] = arg, arg
    bound = args + (prec.t + prec.op) * np.abs(pe) + 2 * prec.eta
    return bound * SAFETY


# --------------------------------------------------------------------------------------------
# §3.1: LayerNorm


def normalized(x: np.ndarray, eps: float, prec: Precision) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_hat, Delta, s, beta) of LayerNorm's normalisation x_hat = (x - mean) / s, s = sqrt(var + eps), over the
    last axis: |x_hat_computed - x_hat| <= Delta and |s_computed - s| <= beta (see :func:`layer_norm`).
    Shapes: x (..., d) -> x_hat, Delta (..., d); s, beta (..., 1)."""
    d = x.shape[-1]
    ax = np.abs(x)
    c = x - np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    if d == 1:
        # One element: its mean is itself (one term, divided by 1: exact in any algorithm), so the
        # centred value and the variance are exactly 0 and only sqrt(eps) and the affine step round.
        alpha = np.zeros_like(c)
        beta = gamma(2, prec.op) * s
    else:
        a = gamma(d + 1, prec.op) * np.mean(ax, axis=-1, keepdims=True) + (d + 1) * prec.eta
        alpha = a + prec.op * (np.abs(c) + a) + prec.eta
        rms_alpha = np.sqrt(np.mean(alpha * alpha, axis=-1, keepdims=True))
        beta = (
            rms_alpha
            + gamma(d + 4, prec.op) * (s + rms_alpha)
            + gamma(d, prec.op) * np.sqrt(np.mean(ax * ax, axis=-1, keepdims=True))
            + (d + 2) * prec.eta / s
        )
    x_hat = c / s
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = np.where(beta < s, (alpha + np.abs(x_hat) * beta) / (s - beta), np.inf)
    return x_hat, delta, s, beta


def layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, prec: Precision) -> np.ndarray:
    """Bound for LayerNorm (§3.1) over the last axis, biased variance, eps inside the sqrt.

    Derivation. Row x (length d); c = x - mean(x), sigma^2 = mean(c^2), s = sqrt(sigma^2 + eps),
    x_hat = c / s, y = g x_hat + b.
      Mean: |mu_hat - mu| <= gamma_{d+1} mean(|x|) =: a (d - 1 additions, a division, a storage
      rounding).
      Centred values: |c_hat_i - c_i| <= alpha_i := a + u (|c_i| + a).
      Scale: s is 1-Lipschitz in sigma, and |rms(c_hat) - rms(c)| <= rms(alpha) (triangle
      inequality), so the two-pass s_hat = sqrt(fl(mean(c_hat^2)) + eps) satisfies
      |s_hat - s| <= rms(alpha) + gamma_{d+4} (s + rms(alpha)) (squares, d - 1 additions, a
      division, the eps addition, the sqrt: the relative error of a sum of positive terms, halved
      by the sqrt, bounded loosely). Welford/Chan updating algorithms have, by Chan, Golub &
      LeVeque (1983), a relative error <= d u kappa in S = d sigma^2 with kappa = rms(x)/sigma,
      i.e. |sigma_hat - sigma| <~ d u rms(x) / 2; the term gamma_d rms(x) covers that too.
      Call the total beta. (A one-pass E[x^2] - E[x]^2 has error ~ d u kappa^2 S and fails this
      budget on near-constant rows, as it should.)
      Quotient: |c_hat/s_hat - c/s| <= (alpha_i + |x_hat_i| beta) / (s - beta) =: Delta_i
      (exact algebra, valid while beta < s; beyond that the bound is vacuous, inf).
      Affine step: a division (or reciprocal and product), the gain product, the bias addition and
      a storage rounding: |y_hat - y| <= |g| Delta (1 + gamma_5) + gamma_5 (|g x_hat| + |b|).
      Underflow (small rows in float16): eta in the mean and in each centred value, (d + 2) eta in
      the variance (which moves s by at most (d + 2) eta / s), 4 eta in the affine step.
      One element (d = 1): the mean is the element itself in any algorithm (one term, a division
      by 1), so c = 0 and the variance 0 exactly; s = sqrt(0 + eps) rounds twice (the addition,
      the sqrt): beta = gamma_2 s, alpha = 0.
    """
    x_hat, delta, _, _ = normalized(x, eps, prec)
    g5 = gamma(5, prec.op)
    return (np.abs(gain) * delta * (1 + g5) + g5 * (np.abs(gain * x_hat) + np.abs(bias)) + 4 * prec.eta) * SAFETY


# --------------------------------------------------------------------------------------------
# §3.3, Eq. (2): the position-wise feed-forward network


def feed_forward(
    x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, prec: Precision
) -> np.ndarray:
    """Bound for FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. (2)).

    Derivation. hidden = x W1 + b1 is affine (``_affine``: e_hid = gamma_{d+2} (|x||W1| + |b1|));
    ReLU is exact and 1-Lipschitz, so |relu(hid_hat) - relu(hid)| <= e_hid
    and |relu(hid_hat)| <= |relu(hid)| + e_hid; the second affine map adds
    e_hid |W2| + gamma_{d_ff+2} ((|relu(hid)| + e_hid)|W2| + |b2|).
    """
    hid, e_hid = _affine(x, w1, b1, prec)
    e_hid = _finite(e_hid)
    mag = np.maximum(hid, 0.0) + e_hid
    m = w2.shape[0]
    err = (
        np.matmul(e_hid, np.abs(w2))
        + gamma(m + 2, prec.op) * (np.matmul(mag, np.abs(w2)) + np.abs(b2))
        + (m + 2) * prec.eta
    )
    return err * SAFETY


# --------------------------------------------------------------------------------------------
# §5.3, Eq. (3): the learning rate


def lrate(value: Any, prec: Precision, step: Any = 0, d_model: float = 1.0) -> Any:
    """Bound for lrate = d_model^-0.5 min(step^-0.5, step warmup^-1.5) (§5.3, Eq. (3)).

    Derivation. Three powers (d_model^-0.5, step^-0.5, warmup^-1.5, by pow or by sqrt and a
    reciprocal and a product: each within (1 + t) or (1 + u)^3), the product step * w^-1.5, the
    min (exact) and the final product: relative error <= (1 + t)^3 (1 + u)^4 - 1 times |lrate|.
    Underflow: in float16, warmup^-1.5 is subnormal for warmup > ~600 (and step^-0.5 never is
    for the steps drawn), so it may carry an absolute error of eta instead of a relative one;
    times step and d_model^-0.5 that is d_model^-0.5 (step + 1) eta, and the final product may
    underflow by eta too.
    The result is a Python float, but ``prec`` is the implementation's first (most precise)
    dtype: one computing the schedule in float32 is held to float32's budget.
    """
    r = (1 + prec.t) ** 3 * (1 + prec.op) ** 4 - 1
    underflow = (np.asarray(step, dtype=np.float64) + 1) * d_model**-0.5 * (1 + r) * prec.eta + prec.eta
    return (np.abs(value) * r + underflow) * SAFETY


# --------------------------------------------------------------------------------------------
# §5.3: Adam's step (Kingma & Ba 2015, Algorithm 1)


def _quotient(a: np.ndarray, e_a: np.ndarray, b: np.ndarray, e_b: np.ndarray) -> np.ndarray:
    """A bound on |a' / b' - a / b| for |a' - a| <= e_a and |b' - b| <= e_b, b > 0: (e_a + |a / b| e_b) / (b - e_b);
    infinite where e_b >= b (the denominator may vanish: nothing to bound)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (e_a + np.abs(a / b) * e_b) / (b - e_b)
    # infinite: compare counts the element "not checked" (never a pass); the strategies keep this under 1% a dtype
    return np.where(b > e_b, out, np.inf)


def _root(x: np.ndarray, e_x: np.ndarray) -> np.ndarray:
    """A bound on |sqrt(x') - sqrt(x)| for |x' - x| <= e_x, x >= 0: |x' - x| / (sqrt(x') + sqrt(x)), so at most
    e_x / sqrt(x) and at most sqrt(e_x) (sqrt is not Lipschitz at 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        # at x = 0 the Lipschitz form says nothing; the minimum below takes sqrt(e_x), a finite bound, there
        near = np.where(x > 0, e_x / np.sqrt(x), np.inf)
    return np.minimum(near, np.sqrt(e_x))


def _constant(value: float, prec: Precision) -> float:
    """How far a constant (a beta, eps, lr) may be from its value once rounded to the dtype: its nearest-rounding
    error there, which also bounds it in any wider format (the dtype's value is among the wider format's numbers, so
    the wider nearest rounding is no farther); 0 for code that keeps it in float64."""
    return abs(float(round_to(np.float64(value), prec.name)) - value)


def _correction(beta: float, d_beta: float, step: int, prec: Precision) -> tuple[float, float]:
    """(c, e_c): Adam's bias correction c = 1 - beta^t and a bound on its computed error. beta as the code holds it
    is within d_beta of beta (:func:`_constant`), so its t-th power (by pow: 1 +- T more) lies in
    [(beta - d_beta)^t (1 - T), (beta + d_beta)^t (1 + T)], evaluated in logarithms (no overflow); then the
    subtraction's rounding. Code that forms it in float64 (PyTorch) is far inside."""
    u, t_pow = prec.op, prec.t
    power = beta**step
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        hi = math.exp(step * math.log(beta + d_beta)) * (1 + t_pow) if beta + d_beta > 0 else 0.0
        lo = math.exp(step * math.log(beta - d_beta)) * (1 - t_pow) if beta - d_beta > 0 else 0.0
    c = 1.0 - power
    return c, max(hi - power, power - lo) + u * c + prec.eta * (c != 0)


def adam_step(a: Mapping[str, Any], prec: Precision) -> np.ndarray:
    """Bound for one Adam step (§5.3; Kingma & Ba 2015, Algorithm 1): (param, m, v) after it, stacked (3, ...).

    Derivation, u = ``prec.op``, eta the underflow unit, for any order of evaluation of the codes we know
    (PyTorch's lerp and addcmul, optax's, Keras's), each constant (betas, lr, eps) within d of its value, its rounding
    error in the dtype (:func:`_constant`; 1 - beta formed from the rounded beta errs by d_beta absolutely: relative
    d_beta / (1 - beta), large where 1 - beta is near the dtype's spacing, as 0.999 in float16). An underflow errs
    only where a result is not 0 (products and sums of zeros are exact), so each eta below counts only there:
      m_t = beta1 m + (1 - beta1) g, or m + (1 - beta1)(g - m) (a lerp): at most four roundings on a path, and
        (1 - beta1)|g - m| <= (1 - beta1)(|g| + |m|) with beta1 |m| + (1 - beta1)|m| = |m|:
        e_m = gamma_4 (|m| + (1 - beta1)|g|) + d_beta1 (|g| + |m|)(1 + gamma_4) + 4 eta;
      v_t = beta2 v + (1 - beta2) g^2, one rounding more for g^2 (every term non-negative):
        e_v = gamma_5 (v + (1 - beta2) g^2) + d_beta2 (g^2 + v)(1 + gamma_5) + 5 eta;
      c = 1 - beta^t (:func:`_correction`; 1 exactly without bias correction);
      a quotient x / y with errors e_x, e_y: (e_x + |x / y| e_y) / (y - e_y) (:func:`_quotient`, infinite where the
        denominator may vanish), then its own rounding and eta; a square root: e / sqrt(x), and at most sqrt(e)
        (:func:`_root`), then its rounding, and two more roundings for code that forms sqrt(v_t) / sqrt(c2)
        (PyTorch) instead of sqrt(v_t / c2);
      "outside": den = sqrt(v_t / c2) + eps; "inside": sqrt(v_t / c2 + eps); "hat": den = sqrt(v_t) + eps and the
        factor lr sqrt(c2) / c1 (relative (1 + e_c2 / c2)(1 + d_lr / lr)(1 + u)^4 / (1 - e_c1 / c1) - 1);
      the update lr m_hat / den: (lr + d_lr) times the quotient's bound, plus d_lr |m_hat / den|, three roundings
        of |update|, two underflows, and one of the product before the division (lr m_hat, then / den: eta / den);
      the parameter: that, plus the subtraction's rounding and eta.
    Infinite (not checked) where a denominator may vanish within its error.
    """
    u, eta = prec.op, prec.eta
    p, g, m, v = (np.asarray(a[n], dtype=np.float64) for n in ("param", "grad", "m", "v"))
    b1, b2 = (float(b) for b in a["betas"])
    lr, eps, t = float(a["lr"]), float(a["eps"]), int(a["step"])
    d_b1, d_b2, d_lr, d_eps = (_constant(x, prec) for x in (b1, b2, lr, eps))
    m1 = b1 * m + (1 - b1) * g
    v1 = b2 * v + (1 - b2) * g * g
    e_m = gamma(4, u) * (np.abs(m) + (1 - b1) * np.abs(g)) + d_b1 * (np.abs(g) + np.abs(m)) * (1 + gamma(4, u))
    e_m = e_m + 4 * eta * (e_m + np.abs(m1) > 0)
    e_v = gamma(5, u) * (v + (1 - b2) * g * g) + d_b2 * (g * g + v) * (1 + gamma(5, u))
    e_v = e_v + 5 * eta * (e_v + v1 > 0)
    (c1, e_c1), (c2, e_c2) = (
        (_correction(b1, d_b1, t, prec), _correction(b2, d_b2, t, prec))
        if a["bias_correction"]
        else ((1.0, 0.0), (1.0, 0.0))
    )

    def under(x: np.ndarray, e_x: np.ndarray) -> np.ndarray:
        return eta * ((np.abs(x) + e_x) > 0)

    if a["eps_placement"] == "hat":
        root = np.sqrt(v1)
        e_root = _root(v1, e_v) + gamma(3, u) * root
        e_root = e_root + under(root, e_root)
        den = root + eps
        e_den = e_root + d_eps + u * den
        factor = lr * math.sqrt(c2) / c1
        lr_rel = d_lr / lr if lr else 0.0  # lr = 0 is exact in every dtype
        # infinite where 1 - beta1^t may be 0 within its error: "not checked", counted (half precisions' first steps,
        # which the strategies do not draw)
        rel = (1 + e_c2 / c2) * (1 + lr_rel) * (1 + u) ** 4 / (1 - e_c1 / c1) - 1 if e_c1 < c1 else math.inf
        quotient = m1 / den
        update = factor * quotient
        e_update = factor * (1 + rel) * _quotient(m1, e_m, den, e_den) + np.abs(update) * (rel + u)
    else:
        m_hat, v_hat = m1 / c1, v1 / c2
        e_m_hat = _quotient(m1, e_m, np.float64(c1), np.float64(e_c1)) + u * np.abs(m_hat)
        e_m_hat = e_m_hat + under(m_hat, e_m_hat)
        e_v_hat = _quotient(v1, e_v, np.float64(c2), np.float64(e_c2)) + u * v_hat
        e_v_hat = e_v_hat + under(v_hat, e_v_hat)
        if a["eps_placement"] == "inside":
            inner = v_hat + eps
            den = np.sqrt(inner)
            e_inner = e_v_hat + d_eps + u * inner
            e_den = _root(inner, e_inner) + gamma(3, u) * den
        else:
            root = np.sqrt(v_hat)
            den = root + eps
            e_root = _root(v_hat, e_v_hat) + gamma(3, u) * root
            e_den = e_root + under(root, e_root) + d_eps + u * den
        quotient = m_hat / den
        update = lr * quotient
        e_quotient = _quotient(m_hat, e_m_hat, den, e_den)
        e_update = (lr + d_lr) * e_quotient + d_lr * np.abs(quotient) + gamma(3, u) * np.abs(update)
    with np.errstate(divide="ignore", invalid="ignore"):
        e_update = e_update + under(update, e_update) * (2 + 1 / den)
        e_p = e_update + u * (np.abs(p - update) + e_update)
        e_p = e_p + under(p - update, e_p)
        out = np.stack([e_p, e_m, e_v]) * SAFETY
    # NaN (inf - inf, 0 x inf) where a bound above is infinite: "not checked" as inf is, counted, never a pass
    return np.where(np.isnan(out), np.inf, out)


# --------------------------------------------------------------------------------------------
# §5.4: dropout given its mask


def dropout(y: np.ndarray, p: float, prec: Precision) -> np.ndarray:
    """Bound for y = keep x / (1 - p) given the mask (§5.4).

    Derivation. p held in the dtype within d_p (:func:`_constant`), 1 - p, its reciprocal and the product (or the
    quotient x / (1 - p)): relative (1 + d_p / (1 - p))(1 + u)^3 - 1 of |y|, and eta for an underflow where y is not
    0. A dropped element is exactly 0.
    """
    u = prec.op
    rel = (1 + _constant(p, prec) / (1 - p)) * (1 + u) ** 3 - 1
    return (np.abs(y) * rel + prec.eta * (y != 0)) * SAFETY


# --------------------------------------------------------------------------------------------
# §6.1: checkpoint averaging


def average_checkpoints(stacked: np.ndarray, prec: Precision) -> np.ndarray:
    """Bound for the mean of n checkpoints (§6.1), ``stacked`` (n, ...) the chosen ones' values.

    Derivation. A sum of n terms in any order errs by gamma_{n-1} sum |theta_i| [H, §4.2]; the division by n (or a
    product with 1/n rounded) two roundings more: gamma_{n+1} sum |theta_i| / n, and eta for an underflow where the
    mean is not 0.
    """
    n = stacked.shape[0]
    total = np.sum(np.abs(stacked), axis=0)
    return (gamma(n + 1, prec.op) * total / n + prec.eta * (total > 0)) * SAFETY


# --------------------------------------------------------------------------------------------
# §5.4: label smoothing and the smoothed cross-entropy


def label_smoothing(q: np.ndarray, prec: Precision) -> np.ndarray:
    """Bound for the smoothed targets (§5.4): each entry eps/K, eps/(K-1), 1 - eps or (1 - eps) + eps/K.

    Derivation. At most 4 roundings per entry (a division, a subtraction, an addition, and a
    final rounding when computed wider and stored in the dtype): gamma_4 |q| + eta.
    """
    return (gamma(4, prec.op) * np.abs(q) + prec.eta) * SAFETY


def smoothed_cross_entropy(logits: np.ndarray, q: np.ndarray, prec: Precision) -> np.ndarray:
    """Bound for L = -sum_c q_c log softmax(z)_c per position (§5.4), q the smoothed target.

    Derivation. With m = max z, gap_c = m - z_c, S = sum_c exp(-gap_c) >= 1, the per-class loss is
    l_c = gap_c + log S >= 0.
      log S: as in :func:`softmax`, S_hat / S in [(1 - R)(1 - gamma_{K-1}), (1 + R)(1 + gamma_{K-1})]
      with R = sum_c p_c rho_c, so |log S_hat - log S| <= lam := -log((1 - R)(1 - gamma_{K-1}));
      log's own error t (log S + lam).
      l_c: the rounded gap (u gap_c), lam, log's error, and two more roundings (combining and
      storing): dl_c = u gap_c + lam + t (log S + lam) + gamma_2 (gap_c + log S + lam).
      q: computed in the logits' dtype, |dq_c| <= gamma_4 q_c (:func:`label_smoothing`).
      The weighted sum: K products, K - 1 additions, possibly a division by K (the
      "(1 - eps) nll + eps mean(l)" form) and a storage rounding: gamma_{K+3}.
      |L_hat - L| <= sum_c [(q_c + dq_c) dl_c + dq_c l_c] + gamma_{K+3} sum_c (q_c + dq_c)(l_c + dl_c).
    """
    z = np.asarray(logits, dtype=np.float64)
    k = z.shape[-1]
    m = np.max(z, axis=-1, keepdims=True)
    gap = m - z
    s = np.sum(np.exp(-gap), axis=-1, keepdims=True)
    p = np.exp(-gap) / s
    log_s = np.log(s)
    rho = np.expm1(prec.op * gap) * (1 + prec.t) + prec.t
    big_r = np.sum(p * rho, axis=-1, keepdims=True)
    lo = (1 - big_r) * (1 - gamma(k - 1, prec.op)) - (
        k + 2
    ) * prec.eta  # S >= 1: underflowed terms cost (k + 2) eta relative
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where(lo > 0, -np.log(np.where(lo > 0, lo, 1.0)), np.inf)
    ell = gap + log_s
    d_ell = prec.op * gap + lam + prec.t * (log_s + lam) + gamma(2, prec.op) * (ell + lam)
    dq = gamma(4, prec.op) * q
    err = (
        np.sum((q + dq) * d_ell + dq * ell, axis=-1)
        + gamma(k + 3, prec.op) * np.sum((q + dq) * (ell + d_ell), axis=-1)
        + (k + 3) * prec.eta
    )
    return err * SAFETY
