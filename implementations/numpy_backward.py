"""The backward pass of the NumPy implementation, written by hand: VJPs computed in the dtype of the inputs.

What an implementation without autograd writes to provide gradients (``implementations/protocol.py``, "Gradients"):
``NumpyImplementation.vjp(equation, args, d_out)`` dispatches to the functions below, which take the equation's
arguments and the cotangent of its result and return each argument's gradient, by name, in the arguments' dtype.

Scaled dot-product attention has the two paths of the forward. The *direct* path differentiates the whole score
matrix. The *blocked* path is the FlashAttention formulation (Dao 2023, Algorithm 2), so that the common kernel
formulation is itself checked: a forward pass over key tiles saves only the row log-sum-exp L = m + log l; the
backward recomputes each tile's weights P = exp(S - L) from it, takes D = rowsum(dO (.) O) once per row, and
accumulates, tile by tile,
  dV_j += P^T dO_i,  dP = dO_i V_j^T,  dS = P (.) (dP - D_i),
  dQ_i += dS K_j / sqrt(d_k),  dK_j += dS^T Q_i / sqrt(d_k).
(The dK line follows from S = Q K^T / sqrt(d_k) directly; it is not copied from a paper's listing.)

This module does not use ``reference/`` (the oracle it is checked against).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["sum_to", "attention_vjp", "cross_entropy_vjp", "feed_forward_vjp", "layer_norm_vjp", "softmax_vjp"]


def softmax_vjp(y: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
    """dx = y (.) (dy - sum(y (.) dy)) along ``axis`` (§3.2.1), from the forward's output y."""
    return y * (dy - np.sum(y * dy, axis=axis, keepdims=True))


def sum_to(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``grad`` summed over the leading and size-1 axes its input (of ``shape``) was broadcast along."""
    lead = grad.ndim - len(shape)
    if lead:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def attention_vjp(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    out: np.ndarray,
    d_out: np.ndarray,
    fully_masked: str,
    block: int | None,
) -> dict[str, np.ndarray]:
    """dQ, dK, dV of Eq. (1) for the cotangent ``d_out``, given the forward's output ``out``.

    ``block``: None for the direct path, else the key tile of the blocked path (weights recomputed from the saved
    log-sum-exp). Fully masked rows: "nan" gives NaN (0/0, as the forward), "zeros" no gradient at all, "uniform"
    weights 1/n_k and no gradient to the scores (the masked scores are constants).
    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask broadcastable to (..., n_q, n_k), out and
    d_out (..., n_q, d_v) -> dq, dk, dv of q's, k's and v's shapes.
    """
    dt = q.dtype
    n_q, d_k = q.shape[-2:]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d_k)  # a Python float: keeps the dtype
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], d_out.shape[:-2])
    shape = batch + (n_q, n_k)
    visible = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)
    dead = ~np.any(visible, axis=-1, keepdims=True)  # (..., n_q, 1)
    qs = q * scale
    step = n_k if block is None else max(1, min(block, n_k))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # row statistics over key tiles (the forward's online softmax): max m and sum l, saved as L = m + log l
        m = np.full(batch + (n_q, 1), -np.inf, dtype=dt)
        ell = np.zeros(batch + (n_q, 1), dtype=dt)
        for j in range(0, n_k, step):
            kj = np.swapaxes(k[..., j : j + step, :], -1, -2)
            s = np.where(visible[..., j : j + step], np.matmul(qs, kj), -np.inf)
            m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))
            shift = np.where(np.isfinite(m_new), m_new, 0.0).astype(dt)
            ell = ell * np.exp(np.where(np.isfinite(m), m - shift, -np.inf)).astype(dt) + np.sum(
                np.exp(s - shift), axis=-1, keepdims=True
            )
            m = m_new
        lse = (m + np.log(ell)).astype(dt)  # (..., n_q, 1); -inf on fully masked rows
        if fully_masked == "uniform":
            lse = np.where(dead, dt.type(math.log(n_k)) if n_k else dt.type(0), lse)
        d_row = np.sum(d_out * out, axis=-1, keepdims=True)  # D = rowsum(dO (.) O), (..., n_q, 1)
        dq = np.zeros(batch + (n_q, d_k), dtype=dt)
        dk = np.zeros(batch + (n_k, d_k), dtype=dt)
        dv = np.zeros(batch + (n_k, v.shape[-1]), dtype=dt)
        for j in range(0, n_k, step):
            kj, vj = k[..., j : j + step, :], v[..., j : j + step, :]
            vis = visible[..., j : j + step]
            if fully_masked == "uniform":
                vis = vis | dead
            s = np.where(vis, np.matmul(qs, np.swapaxes(kj, -1, -2)), -np.inf)
            if fully_masked == "uniform":
                s = np.where(dead, dt.type(0), s)
            p = np.exp(s - lse).astype(dt)  # the weights, recomputed: (..., n_q, tile)
            if fully_masked == "zeros":
                p = np.where(dead, dt.type(0), p)
            dv[..., j : j + step, :] += np.matmul(np.swapaxes(p, -1, -2), d_out)
            dp = np.matmul(d_out, np.swapaxes(vj, -1, -2))
            ds = p * (dp - d_row)
            if fully_masked != "nan":
                ds = np.where(dead, dt.type(0), ds)
            dq += np.matmul(ds, kj) * scale
            dk[..., j : j + step, :] += np.matmul(np.swapaxes(ds, -1, -2), q) * scale
    return {"q": sum_to(dq, q.shape), "k": sum_to(dk, k.shape), "v": sum_to(dv, v.shape)}


def layer_norm_vjp(x: np.ndarray, gain: np.ndarray, eps: float, dy: np.ndarray) -> dict[str, np.ndarray]:
    """dx, dgain, dbias of LayerNorm over the last axis (§3.1): with x_hat = (x - mean) / s and h = gain dy,
    dx = (h - mean(h) - x_hat mean(h x_hat)) / s; dgain = sum over rows of dy x_hat; dbias = sum of dy."""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean(np.square(centred), axis=-1, keepdims=True) + float(eps))
    x_hat = centred / s
    h = gain * dy
    dx = (h - np.mean(h, axis=-1, keepdims=True) - x_hat * np.mean(h * x_hat, axis=-1, keepdims=True)) / s
    rows = tuple(range(x.ndim - 1))
    return {"x": dx, "gain": np.sum(dy * x_hat, axis=rows), "bias": np.sum(dy, axis=rows)}


def feed_forward_vjp(
    x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, dy: np.ndarray
) -> dict[str, np.ndarray]:
    """Gradients of Eq. (2), max(0, x W1 + b1) W2 + b2 (§3.3); ReLU's derivative at 0 taken as 0."""
    z = np.matmul(x, w1) + b1
    r = np.maximum(z, 0)
    xs, dys, rs = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]), r.reshape(-1, r.shape[-1])
    dz = np.matmul(dys, w2.T) * (z.reshape(rs.shape) > 0)
    return {
        "x": np.matmul(dz, w1.T).reshape(x.shape),
        "w1": np.matmul(xs.T, dz),
        "b1": np.sum(dz, axis=0),
        "w2": np.matmul(rs.T, dys),
        "b2": np.sum(dys, axis=0),
    }


def cross_entropy_vjp(logits: np.ndarray, q: np.ndarray, d_loss: np.ndarray) -> dict[str, np.ndarray]:
    """d logits of -sum_c q_c log softmax(z)_c (§5.4): d_loss (p sum(q) - q), q the smoothed targets."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    e = np.exp(shifted)
    p = e / np.sum(e, axis=-1, keepdims=True)
    return {"logits": d_loss[..., None] * (p * np.sum(q, axis=-1, keepdims=True) - q)}
