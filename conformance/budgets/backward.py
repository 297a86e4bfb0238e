"""Error budgets of the backward pass: how far an implementation's gradient (its VJP for a cotangent) may be from
the exact one, equation by equation.

Each function returns, for every gradient the equation has, an elementwise bound on ``|computed - exact|`` for an
implementation that evaluates the backward formula in a dtype of precision ``prec``, derived by forward error
analysis from the magnitudes of the inputs and the cotangent, under the assumptions of ``budgets/forward.py`` (every
operation within ``prec.op``, exp/log within ``prec.t``, any summation order, [H] = Higham, "Accuracy and Stability
of Numerical Algorithms", 2nd ed.). The forward quantities a backward reuses (the attention weights P, LayerNorm's
x_hat and s, the FFN's hidden layer) carry the forward pass's own error bounds (``budgets/forward.py``): an
implementation may save them from its forward or recompute them, and both are covered.

Three rules, each the reason a same-dtype baseline or a relative tolerance is the wrong test:

- A difference of two comparable terms (dS = P (.) (dP - D), LayerNorm's dx, softmax's dy - sum(y dy)) is bounded
  from the magnitudes of its terms, never relative to its own value: it cancels, the errors do not.
- A gradient that sums over rows (dK, dV, dW, a bias's gradient) is bounded by the sum of the magnitudes of what
  it adds, Sum_j |dS_ij| |k_j| for dQ: a common component of the keys cancels in the value, not in the error.
- Where a branch (ReLU's gate) may go either way within the forward's error, both branches are allowed there.

Every bound is multiplied by ``SAFETY`` (``budgets/forward.py``). Budgets here are per gradient, by the gradient's name
(the equation's argument names, ``conformance/equations.py``); the oracle's own share is the same bound at float64
(the fast tier computes in longdouble and rounds once), added by the record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiayn.conformance.budgets.forward import SAFETY, _finite, _softmax64, _times, attention_weights, normalized
from aiayn.conformance.budgets.forward import softmax as softmax_forward
from aiayn.conformance.numerics import Precision, gamma

__all__ = [
    "attention_core_vjp",
    "feed_forward",
    "layer_norm",
    "multi_head_attention",
    "scaled_dot_product_attention",
    "smoothed_cross_entropy",
    "softmax",
    "unbroadcast",
]


def unbroadcast(err: np.ndarray, mag: np.ndarray, shape: tuple[int, ...], prec: Precision) -> np.ndarray:
    """The bound of a gradient summed over the axes its input (of ``shape``) was broadcast along.

    ``err`` bounds each term's error and ``mag`` its magnitude (both of the broadcast shape). The sum of b terms in
    any order: Sum err + gamma_{b-1} Sum (mag + err) [H, (3.4)].
    """
    lead = err.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and err.shape[lead + i] != 1)
    if not axes:
        return err
    b = int(np.prod([err.shape[a] for a in axes]))
    total = np.sum(err, axis=axes, keepdims=True) + gamma(b - 1, prec.op) * np.sum(mag + err, axis=axes, keepdims=True)
    return total.reshape(shape)


# --------------------------------------------------------------------------------------------
# §3.2.1: softmax, and the softmax inside Eq. (1)


def _softmax_vjp_error(
    p: np.ndarray, b_p: np.ndarray, m: np.ndarray, e_m: np.ndarray, prec: Precision
) -> tuple[np.ndarray, np.ndarray]:
    """(error bound, magnitude bound) of dz = P (.) (G - D), D = Sum_j P_j G_j, along the last axis.

    P: the exact weights, computed within ``b_p`` (absolute); G: the incoming gradient, |G| <= ``m``, computed
    within ``e_m``.
      D: Sum_j P_hat_j G_hat_j, n products and n - 1 additions, or Sum_c dO_c O_hat_c in Eq. (1) (the same bound, see
         :func:`scaled_dot_product_attention`):
         E_D <= Sum_j [b_p m + (P + b_p) e_m] + gamma_{n+1} Sum_j (P + b_p)(m + e_m).
      G - D: |G_j - D| <= m_j + Sum_l P_l m_l =: R_j (from the magnitudes: it cancels, its error does not);
         computed within e_m + E_D and one rounding.
      The product with P_hat, and one more rounding (the form P G - P D, or a storage):
         |dz_hat - dz| <= b_p R + (P + b_p)(e_m + E_D)(1 + gamma_2) + gamma_2 (P + b_p) R.
    Returns the error bound and |dz| + error (the next stage's magnitude), both of P's shape.
    """
    n = p.shape[-1]
    pb = p + b_p
    e_d = np.sum(b_p * m + pb * e_m, axis=-1, keepdims=True) + gamma(n + 1, prec.op) * np.sum(
        pb * (m + e_m), axis=-1, keepdims=True
    )
    r = m + np.sum(p * m, axis=-1, keepdims=True)
    g2 = gamma(2, prec.op)
    err = b_p * r + pb * (e_m + e_d) * (1 + g2) + g2 * pb * r + 2 * prec.eta
    err = np.where(pb == 0, 0.0, err)  # a zero weight gives exactly 0, whatever it multiplies
    return err, _times(p, r) + err


def softmax(x: np.ndarray, dy: np.ndarray, axis: int, prec: Precision) -> dict[str, np.ndarray]:
    """Bound for softmax's VJP dx = y (.) (dy - Sum(y (.) dy)) along ``axis`` (§3.2.1): :func:`_softmax_vjp_error`
    with y computed within the forward's shifted-softmax bound (``budgets.forward.softmax``) and the cotangent exact.
    A masked entry (-inf) has y = 0 and gets 0; a slice of -inf has no gradient (NaN, compared as such)."""
    z = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    g = np.abs(np.moveaxis(np.asarray(dy, dtype=np.float64), axis, -1))
    p = _softmax64(z)
    b_p = np.moveaxis(_finite(softmax_forward(x, axis, prec)), axis, -1)
    err, _ = _softmax_vjp_error(p, b_p, g, np.zeros_like(g), prec)
    return {"x": np.moveaxis(err * SAFETY, -1, axis)}


# --------------------------------------------------------------------------------------------
# §3.2.1, Eq. (1): scaled dot-product attention


def attention_core_vjp(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    d_out: np.ndarray,
    prec: Precision,
    fully_masked: str = "nan",
    e_q: Any = 0.0,
    e_k: Any = 0.0,
    e_v: Any = 0.0,
    e_out: Any = 0.0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(error bounds, magnitude bounds) of dQ, dK, dV of Eq. (1) given the cotangent dO, by name ("q", "k", "v"),
    for inputs known to within e_q, e_k, e_v and a cotangent within e_out (the heads of multi-head attention), in the
    broadcast batch shape (no sum over broadcast dimensions yet).

    Derivation. S = Q K^T sigma (sigma = 1/sqrt(d_k)), P = softmax(S) (masked scores -inf), O = P V.
      P: computed within b_p = P C + eta' (``budgets.forward.attention_weights``: the shifted softmax of scores computed
         from the perturbed inputs; ``lse_rounding``: also P recomputed from a stored log-sum-exp, as FlashAttention's
         backward does; eta' = (n_k + 2) eta on visible keys for underflow).
      dV = P^T dO: Sum_i b_p (|dO_i| + e_out) + P e_out + gamma_{n_q+1} Sum_i (P + b_p)(|dO_i| + e_out).
      dP = dO V^T: with M = (|dO| + e_out)(|V| + e_v)^T, within e_dP = e_out |V|^T + |dO| e_v^T + e_out e_v^T +
         gamma_{d_v+1} M.
      D_i = rowsum(dO (.) O) or Sum_j P_ij dP_ij: the O form has |O_hat - O| within the forward's bound
         Sum_j b_p (|v_j| + e_v) + P e_v + gamma_{n_k+1} Sum_j (P + b_p)(|v_j| + e_v), so its error is at most
         Sum_j [b_p M + (P + b_p) e_dP] + gamma_{n_k+d_v+2} Sum_j (P + b_p) M, the bound of the P form (see
         _softmax_vjp_error) with gamma_{n_k+1} raised to gamma_{n_k+d_v+2}; the larger is used.
      dS = P (.) (dP - D): :func:`_softmax_vjp_error` with G = dP (m = M, e_m = e_dP): never relative to |dS|.
      dQ = sigma dS K: sigma formed and applied with at most 4 roundings (as in the forward), so
         sigma [Sum_j e_dS (|k_j| + e_k) + |dS| e_k + gamma_{n_k+4} Sum_j (|dS| + e_dS)(|k_j| + e_k)];
         dK = sigma dS^T Q alike over i. Where sigma is applied to a factor before the product (K sigma, or dS sigma;
         SDPA scales its operands first), that factor's underflow adds eta per element, carried by the other:
         eta Sum_j (|dS_ij| + |k_j|) for dQ, eta Sum_i (|dS_ij| + |q_i|) for dK (the relative part is in gamma).
    Masked scores have P = 0 and b_p = 0: no error reaches their keys. Fully masked rows: NaN under "nan" (compared
    as NaN, or undefined), exactly 0 under "zeros" (P = 0), and under "uniform" every weight 1/n_k with no gradient
    to the scores (the masked scores are constants), so dS = 0 there and dV gets the 1/n_k weights.
    """
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    sigma = 1.0 / math.sqrt(q.shape[-1])
    e_q, e_k, e_v = (np.broadcast_to(_finite(e), a.shape) for e, a in ((e_q, q), (e_k, k), (e_v, v)))
    g = np.asarray(d_out, dtype=np.float64)
    e_g = np.broadcast_to(_finite(e_out), g.shape)
    p, c, vis = attention_weights(q, k, mask, prec, e_q, e_k, fully_masked=fully_masked, lse_rounding=True)
    visible = np.ones(p.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), p.shape)
    dead = ~np.any(visible, axis=-1, keepdims=True)
    b_p = _times(p, c) + np.where(vis, (n_k + 2) * prec.eta, 0.0)
    ag, aq, ak, av = np.abs(g) + e_g, np.abs(q) + e_q, np.abs(k) + e_k, np.abs(v) + e_v
    pt, bt = np.swapaxes(p, -1, -2), np.swapaxes(b_p, -1, -2)
    e_dv = np.matmul(bt, ag) + np.matmul(pt, e_g) + gamma(n_q + 1, prec.op) * np.matmul(pt + bt, ag)
    e_dv = e_dv + (n_q + 1) * prec.eta
    m = np.matmul(ag, np.swapaxes(av, -1, -2))  # (..., n_q, n_k)
    e_dp = (
        np.matmul(e_g, np.swapaxes(av, -1, -2))
        + np.matmul(np.abs(g), np.swapaxes(e_v, -1, -2))
        + gamma(d_v + 1, prec.op) * m
        + (d_v + 1) * prec.eta
    )
    wide = gamma(n_k + d_v + 2, prec.op) - gamma(n_k + 1, prec.op)  # the O form of D (see above)
    e_ds, mag_ds = _softmax_vjp_error(p, b_p, m, e_dp + wide * m, prec)
    if fully_masked == "uniform":  # no gradient reaches the constant scores of a fully masked row
        e_ds, mag_ds = np.where(dead, 0.0, e_ds), np.where(dead, 0.0, mag_ds)
    abs_ds = mag_ds - e_ds  # |dS|'s bound
    # a factor scaled by sigma before the product: its underflow (eta an element) carried by the other factor
    prescaled_k = prec.eta * (np.sum(mag_ds, axis=-1, keepdims=True) + np.sum(ak, axis=-2)[..., None, :])
    e_dq = (
        sigma * (np.matmul(e_ds, ak) + np.matmul(abs_ds, e_k) + gamma(n_k + 4, prec.op) * np.matmul(mag_ds, ak))
        + (n_k + 4) * prec.eta
        + prescaled_k
    )
    mds_t, eds_t, ads_t = (np.swapaxes(a, -1, -2) for a in (mag_ds, e_ds, abs_ds))
    prescaled_q = prec.eta * (np.sum(mds_t, axis=-1, keepdims=True) + np.sum(aq, axis=-2)[..., None, :])
    e_dk = (
        sigma * (np.matmul(eds_t, aq) + np.matmul(ads_t, e_q) + gamma(n_q + 4, prec.op) * np.matmul(mds_t, aq))
        + (n_q + 4) * prec.eta
        + prescaled_q
    )
    errors = {"q": e_dq * SAFETY, "k": e_dk * SAFETY, "v": e_dv * SAFETY}
    magnitudes = {
        "q": sigma * np.matmul(mag_ds, ak) + errors["q"],
        "k": sigma * np.matmul(mds_t, aq) + errors["k"],
        "v": np.matmul(pt + bt, ag) + errors["v"],
    }
    return errors, magnitudes


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    d_out: np.ndarray,
    prec: Precision,
    fully_masked: str = "nan",
) -> dict[str, np.ndarray]:
    """Bounds for dQ, dK, dV of Eq. (1) on exact inputs given the cotangent dO, by name ("q", "k", "v"):
    :func:`attention_core_vjp`, with the sums over the batch dimensions along which q, k or v were broadcast
    (:func:`unbroadcast`)."""
    errors, magnitudes = attention_core_vjp(q, k, v, mask, d_out, prec, fully_masked)
    return {
        name: unbroadcast(errors[name], magnitudes[name], a.shape, prec) for name, a in (("q", q), ("k", k), ("v", v))
    }


# --------------------------------------------------------------------------------------------
# §3.2.2: multi-head attention


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: Mapping[str, np.ndarray],
    num_heads: int,
    mask: np.ndarray | None,
    d_out: np.ndarray,
    prec: Precision,
    fully_masked: str = "nan",
) -> dict[str, np.ndarray]:
    """Bounds for the gradients of MultiHead (§3.2.2) given the cotangent dY, by name: query, key, value and every
    parameter given (w_q, ..., b_o).

    Derivation. Q = query W^Q + b^Q within e_Q (``budgets.forward._affine``), likewise K and V; each head's forward
    within e_H with |H_hat| <= mag_H (``budgets.forward.attention_core``); Y = Concat(H) W^O + b^O; N rows.
      dW^O = Concat^T dY: Sum e_H |dY| + gamma_{N+1} Sum mag_H |dY|.  db^O = Sum dY: gamma_{N-1} Sum |dY|.
      dConcat = dY (W^O)^T: within e_dC = gamma_{h d_v + 1} |dY| |W^O|^T.
      Each head: :func:`attention_core_vjp` on Q, K, V with their errors and the cotangent dConcat with e_dC.
      dW^Q = query^T dQ: Sum |query| e_dQ + gamma_{N+1} Sum |query| mag_dQ; db^Q = Sum dQ: Sum e_dQ + gamma_{N-1}
      Sum mag_dQ; dquery = dQ (W^Q)^T: e_dQ |W^Q|^T + gamma_{h d_k + 1} mag_dQ |W^Q|^T; likewise for key and value.
    """
    from aiayn.conformance.budgets.forward import _affine, _merge, _split, attention_core

    h = int(num_heads)
    ins = {"query": query, "key": key, "value": value}
    proj = {
        x: _affine(ins[name], params[f"w_{x}"], params.get(f"b_{x}"), prec)
        for name, x in (("query", "q"), ("key", "k"), ("value", "v"))
    }
    vis = None if mask is None else np.asarray(mask)[..., None, :, :]  # (..., 1, n_q, n_k): every head
    heads = {x: (_split(val, h), _split(_finite(err), h)) for x, (val, err) in proj.items()}
    e_h, mag_h = attention_core(
        heads["q"][0],
        heads["k"][0],
        heads["v"][0],
        vis,
        prec,
        heads["q"][1],
        heads["k"][1],
        heads["v"][1],
        fully_masked=fully_masked,
    )
    e_h, mag_h = _finite(_merge(e_h)), _finite(_merge(mag_h))  # (..., n_q, h*d_v)
    g = np.asarray(d_out, dtype=np.float64)
    ag = np.abs(g)
    w_o = params["w_o"]
    n = _rows(g).shape[0]
    out = {
        "w_o": np.matmul(_rows(e_h).T, _rows(ag))
        + gamma(n + 1, prec.op) * np.matmul(_rows(mag_h).T, _rows(ag))
        + (n + 1) * prec.eta,
        "b_o": gamma(max(n - 1, 0), prec.op) * np.sum(_rows(ag), axis=0) + n * prec.eta,
    }
    e_dc = gamma(w_o.shape[0] + 1, prec.op) * np.matmul(ag, np.abs(w_o).T) + (w_o.shape[0] + 1) * prec.eta
    errors, mags = attention_core_vjp(
        heads["q"][0],
        heads["k"][0],
        heads["v"][0],
        vis,
        _split(g @ w_o.T, h),
        prec,
        fully_masked,
        heads["q"][1],
        heads["k"][1],
        heads["v"][1],
        _split(e_dc, h),
    )
    for name, x in (("query", "q"), ("key", "k"), ("value", "v")):
        e_d, mag_d = _finite(_merge(errors[x])), _finite(_merge(mags[x]))  # (..., n, h*d)
        a_in, w = np.abs(ins[name]), params[f"w_{x}"]
        m_in = _rows(e_d).shape[0]
        out[f"w_{x}"] = np.matmul(_rows(np.broadcast_to(a_in, e_d.shape[:-1] + a_in.shape[-1:])).T, _rows(e_d)) + gamma(
            m_in + 1, prec.op
        ) * np.matmul(_rows(np.broadcast_to(a_in, mag_d.shape[:-1] + a_in.shape[-1:])).T, _rows(mag_d))
        out[f"w_{x}"] = out[f"w_{x}"] + (m_in + 1) * prec.eta
        out[f"b_{x}"] = np.sum(_rows(e_d), axis=0) + gamma(max(m_in - 1, 0), prec.op) * np.sum(_rows(mag_d), axis=0)
        width = w.shape[1]
        e_in = np.matmul(e_d, np.abs(w).T) + gamma(width + 1, prec.op) * np.matmul(mag_d, np.abs(w).T)
        mag_in = np.matmul(mag_d, np.abs(w).T) + e_in
        out[name] = unbroadcast(e_in + (width + 1) * prec.eta, mag_in, np.shape(ins[name]), prec)
    return {name: b * SAFETY for name, b in out.items() if name in ins or name in params}


# --------------------------------------------------------------------------------------------
# §3.1: LayerNorm


def layer_norm(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, dy: np.ndarray, prec: Precision
) -> dict[str, np.ndarray]:
    """Bounds for LayerNorm's dx, dgain, dbias given the cotangent dy, by name ("x", "gain", "bias").

    Derivation. x_hat = (x - mu) / s over the last axis (length d), s = sqrt(var + eps), y = gain x_hat + bias;
    x_hat is computed within Delta and s within beta (``budgets.forward.normalized``: two-pass or Welford); N rows.
      dbias = Sum_rows dy: gamma_{N-1} Sum |dy|.
      dgain = Sum_rows dy (.) x_hat: Sum |dy| Delta + gamma_{N+1} Sum |dy| (|x_hat| + Delta).
      dx = (h - mean(h) - x_hat mean(h (.) x_hat)) / s with h = gain (.) dy (one rounding):
        a = mean(h): gamma_{d+2} mean|h|; b = mean(h x_hat): mean(|h| Delta) + gamma_{d+3} mean(|h|(|x_hat| + Delta));
        the bracket: |a err| + |x_hat| |b err| + Delta (|b| + |b err|) + gamma_3 (|h| + |a| + (|x_hat| + Delta)(|b|
        + |b err|)) with |a| <= mean|h| and |b| <= mean|h x_hat| (from the magnitudes: it cancels);
        divided by s_hat: the bracket's magnitude times 3 beta / (s - beta) (the forms that multiply by rstd twice,
        (x - mu) rstd^2, included) and 2 more roundings. Where beta >= s the bound is vacuous (inf): not checked.
    |mu| >> sigma makes Delta, and so every bound here, grow with |mu| / sigma: the centred values lose u |mu|.
    A row of one element (d = 1) has x_hat = 0, dx = 0 and dgain = 0 exactly: Delta = 0 there.
    """
    x_hat, delta, s, beta = normalized(x, eps, prec)
    delta = _finite(delta)
    d = x.shape[-1]
    g = np.asarray(dy, dtype=np.float64)
    ag, ax_hat = np.abs(g), np.abs(x_hat)
    rows = tuple(range(x.ndim - 1))
    n = int(np.prod([x.shape[i] for i in rows])) if rows else 1
    d_bias = gamma(max(n - 1, 0), prec.op) * np.sum(ag, axis=rows) + n * prec.eta
    d_gain = (
        np.sum(ag * delta, axis=rows) + gamma(n + 1, prec.op) * np.sum(ag * (ax_hat + delta), axis=rows) + n * prec.eta
    )
    h = np.abs(gain) * ag  # |h|, h = gain dy
    mean_h = np.mean(h, axis=-1, keepdims=True)
    e_a = gamma(d + 2, prec.op) * mean_h + (d + 2) * prec.eta
    mag_b = np.mean(h * ax_hat, axis=-1, keepdims=True)
    e_b = np.mean(h * delta, axis=-1, keepdims=True) + gamma(d + 3, prec.op) * np.mean(
        h * (ax_hat + delta), axis=-1, keepdims=True
    )
    e_b = e_b + (d + 3) * prec.eta
    bracket_mag = h + mean_h + (ax_hat + delta) * (mag_b + e_b)
    e_bracket = e_a + ax_hat * e_b + delta * (mag_b + e_b) + gamma(3, prec.op) * bracket_mag + prec.op * h
    with np.errstate(divide="ignore", invalid="ignore"):
        # s's error beta reaching s itself: the bound says nothing (inf: those elements are counted "not checked")
        rel_s = np.where(beta < s, 3 * beta / (s - beta), np.inf)
        d_x = (e_bracket / s) * (1 + rel_s) * (1 + gamma(2, prec.op)) + (bracket_mag / s) * (rel_s + gamma(2, prec.op))
    d_x = d_x + 3 * prec.eta
    if d == 1:  # x_hat = 0 and mean(h) = h: dx = 0 in any algorithm
        d_x = np.zeros_like(d_x) + prec.eta
    return {"x": d_x * SAFETY, "gain": d_gain * SAFETY, "bias": d_bias * SAFETY}


# --------------------------------------------------------------------------------------------
# §3.3, Eq. (2): the position-wise feed-forward network


def feed_forward(
    x: np.ndarray,
    w1: np.ndarray,
    b1: np.ndarray,
    w2: np.ndarray,
    b2: np.ndarray,
    dy: np.ndarray,
    prec: Precision,
    x_error: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Bounds for the gradients of FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. (2)) given dy, by name.

    Derivation. z = x W1 + b1 within e_z = gamma_{d_model+2} (|x||W1| + |b1|) (``budgets.forward._affine``), r = relu(z)
    within e_z; N rows.
      db2 = Sum_rows dy: gamma_{N-1} Sum |dy|.  dW2 = r^T dy: Sum e_z |dy| + gamma_{N+1} Sum (|r| + e_z)|dy|.
      dr = dy W2^T: within e_dr = gamma_{d_model+1} |dy||W2|^T.
      dz = dr (.) [z > 0]: where |z| > e_z the computed gate is the exact one, error e_dr; where |z| <= e_z the gate
        may go either way (ReLU's derivative at 0 is a choice, and z's sign is within its own error): both branches
        are allowed, error |dr| + e_dr. ``x_error`` (a bound on x's own error, where the FFN's input is computed
        upstream: a composite, ``budgets/composites/backward.py``) widens that margin by |x_error| |W1|.
      db1 = Sum_rows dz; dW1 = x^T dz; dx = dz W1^T: each with the error of dz carried through and the sums'
        gamma (N + 1 or d_ff + 1 terms) on the magnitudes |dz| + e_dz.
    """
    x, w1, b1, w2, b2 = (np.asarray(a, dtype=np.float64) for a in (x, w1, b1, w2, b2))
    g = np.asarray(dy, dtype=np.float64)
    ag = np.abs(g)
    d_model, d_ff = w1.shape
    z = np.matmul(x, w1) + b1
    e_z = gamma(d_model + 2, prec.op) * (np.matmul(np.abs(x), np.abs(w1)) + np.abs(b1)) + (d_model + 2) * prec.eta
    r = np.maximum(z, 0.0)
    x2, g2, z2, e_z2, r2 = (a.reshape(-1, a.shape[-1]) for a in (x, ag, z, e_z, r))
    n = x2.shape[0]
    d_b2 = gamma(max(n - 1, 0), prec.op) * np.sum(g2, axis=0) + n * prec.eta
    d_w2 = np.matmul(e_z2.T, g2) + gamma(n + 1, prec.op) * np.matmul((r2 + e_z2).T, g2) + (n + 1) * prec.eta
    dr = np.matmul(g2, np.abs(w2).T)  # |dy| |W2|^T, a bound on |dr|
    e_dr = gamma(d_model + 1, prec.op) * dr + (d_model + 1) * prec.eta
    margin = e_z2 if x_error is None else e_z2 + (np.abs(x_error) @ np.abs(w1)).reshape(e_z2.shape)
    either = np.abs(z2) <= margin
    e_dz = np.where(either, dr + e_dr, e_dr)
    mag_dz = np.where(z2 > 0, dr, 0.0) + e_dz
    d_b1 = np.sum(e_dz, axis=0) + gamma(max(n - 1, 0), prec.op) * np.sum(mag_dz, axis=0) + n * prec.eta
    ax2 = np.abs(x2)
    d_w1 = np.matmul(ax2.T, e_dz) + gamma(n + 1, prec.op) * np.matmul(ax2.T, mag_dz) + (n + 1) * prec.eta
    d_x = np.matmul(e_dz, np.abs(w1).T) + gamma(d_ff + 1, prec.op) * np.matmul(mag_dz, np.abs(w1).T)
    d_x = (d_x + (d_ff + 1) * prec.eta).reshape(x.shape)
    out = {"x": d_x, "w1": d_w1, "b1": d_b1, "w2": d_w2, "b2": d_b2}
    return {name: b * SAFETY for name, b in out.items()}


# --------------------------------------------------------------------------------------------
# §5.4: the smoothed cross-entropy


def smoothed_cross_entropy(logits: np.ndarray, q: np.ndarray, d_loss: Any, prec: Precision) -> dict[str, np.ndarray]:
    """Bound for the gradient of L = -Sum_c q_c log softmax(z)_c with respect to the logits (§5.4), by name
    ("logits"), given the cotangent of each position's loss.

    Derivation. dz_c = g (p_c Q - q_c), Q = Sum_c q_c (1 on a target row, 0 on a padding row whose smoothed target
    is all 0); p within the shifted-softmax bound b_p (``budgets.forward.softmax``), q within gamma_4 q
    (``budgets.forward.label_smoothing``). An implementation may use Q = 1 implicitly (p - q) only where it is 1; the
    bound: |g| [b_p Q (1 + gamma_4) + gamma_{K+6} (p Q + q)] (the sum Q, the difference, the product with g and a
    storage), from the magnitudes p Q + q (it cancels at the target class).
    """
    z = np.asarray(logits, dtype=np.float64)
    k = z.shape[-1]
    p = _softmax64(z)
    b_p = _finite(softmax_forward(z, -1, prec))
    big_q = np.sum(q, axis=-1, keepdims=True)
    g = np.abs(np.asarray(d_loss, dtype=np.float64))[..., None]
    err = g * (b_p * big_q * (1 + gamma(4, prec.op)) + gamma(k + 6, prec.op) * (p * big_q + q)) + 3 * prec.eta
    return {"logits": err * SAFETY}
