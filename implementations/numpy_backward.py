"""The backward pass of the NumPy implementation, written by hand: VJPs computed in the dtype of the inputs.

What an implementation without autograd writes to provide gradients (``implementations/protocol.py``, "Gradients"):
``NumpyImplementation.vjp(equation, args, d_out)`` dispatches to the functions below, which take the equation's
arguments and the cotangent of its result and return each argument's gradient, by name, in the arguments' dtype.

Scaled dot-product attention has the two paths of the forward. The *direct* path takes each row's weights
P = exp(S - m) / l from its maximum m and sum l. The *blocked* path is the FlashAttention formulation (Dao 2023,
Algorithm 2), so that the common kernel formulation is itself checked: each key tile's statistics (maximum m_j, sum
l_j) are merged into the row's log-sum-exp L = m + log sum_j l_j exp(m_j - m), as the forward's online softmax merges
them, and the weights are recomputed from it, P = exp(S - L). Then, with D = rowsum(dO (.) O) = rowsum(P (.) dP),
  dV = P^T dO,  dP = dO V^T,  dS = P (.) (dP - D),  dQ = dS K / sqrt(d_k),  dK = dS^T Q / sqrt(d_k).
(The dK line follows from S = Q K^T / sqrt(d_k) directly; it is not copied from a paper's listing.) Both paths go by
blocks of query rows against every key, every key tile of a block at once (tile statistics are reductions over a
view (rows, tiles, width) of the scores): each product above is one GEMM per block, with no Python loop over key
tiles.

This module does not use ``reference/`` (the oracle it is checked against).
"""

from __future__ import annotations

import functools
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


#: Query rows the backward takes at once from one (batch, head) slice: its weights and dP for 128 query rows are two
#: 128 x n_k matrices (1 MiB each in float32 at n_k = 2048, cache-resident), and each of its five products is a GEMM
#: of 128 rows, wide enough to run near the GEMM ceiling.
QUERY_ROWS = 128
#: n_q * n_k from which the forward and the backward walk the batch one (batch, head) slice at a time (cache-sized
#: tiles); below it one call covers every slice (less Python overhead on small inputs).
PER_SLICE_MIN = 64 * 64


def attention_vjp(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    out: np.ndarray | None,
    d_out: np.ndarray,
    fully_masked: str,
    block: int | None,
) -> dict[str, np.ndarray]:
    """dQ, dK, dV of Eq. (1) for the cotangent ``d_out``.

    ``block``: None for the direct path (the weights P = exp(S - m) / l from each row's maximum m and sum l), else
    the key tile of the blocked path: each tile's maximum m_j and sum l_j merged into the row's log-sum-exp
    L = m + log sum_j l_j exp(m_j - m) (the forward's online softmax, every tile at once), then P = exp(S - L).
    ``out``: the forward's output, for D = rowsum(dO (.) O); without it D = rowsum(P (.) dP), the same sum (dP = dO
    V^T and O = P V) from what the backward has at hand, so that the backward needs no forward pass.
    Fully masked rows: "nan" gives NaN (0/0, as the forward), "zeros" no gradient at all, "uniform" weights 1/n_k
    and no gradient to the scores (the masked scores are constants).
    The work goes by blocks of :data:`QUERY_ROWS` query rows against every key, so each of the five products
    (S = Q K^T, dP = dO V^T, dV += P^T dO, dQ = dS K, dK += dS^T Q) is one GEMM over all keys: no loop over key tiles.
    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask broadcastable to (..., n_q, n_k), out and
    d_out (..., n_q, d_v) -> dq, dk, dv of q's, k's and v's shapes.
    """
    dt = q.dtype
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    scale = 1.0 / math.sqrt(d_k)  # a Python float: keeps the dtype
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], d_out.shape[:-2])
    visible = None if mask is None else np.broadcast_to(mask, batch + (n_q, n_k))  # a view
    dq = np.zeros(batch + (n_q, d_k), dtype=dt)
    dk = np.zeros(batch + (n_k, d_k), dtype=dt)
    dv = np.zeros(batch + (n_k, d_v), dtype=dt)
    if n_k == 0 or n_q == 0:  # no key: every row fully masked, its output a constant
        if fully_masked == "nan":
            dq[...] = np.nan
        return {"q": sum_to(dq, q.shape), "k": sum_to(dk, k.shape), "v": sum_to(dv, v.shape)}
    qs, kb, vb, dob = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (q * scale, k, v, d_out))  # views
    ob = None if out is None else np.broadcast_to(out, batch + out.shape[-2:])
    tile = None if block is None else max(1, min(block, n_k))
    per_slice = bool(batch) and n_q * n_k >= PER_SLICE_MIN
    slices = list(np.ndindex(*batch)) if per_slice else [...]
    rows = min(QUERY_ROWS, n_q) if per_slice else n_q
    lead = () if per_slice else batch
    buffers = [np.empty(lead + (rows * n_k,), dtype=dt) for _ in range(2)]  # S then P, and dP then dS: reused
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for idx in slices:
            k_t = np.ascontiguousarray(np.swapaxes(kb[idx], -1, -2))  # (..., d_k, n_k): a GEMM operand read in order
            v_t = np.ascontiguousarray(np.swapaxes(vb[idx], -1, -2))  # (..., d_v, n_k)
            for start in range(0, n_q, rows):
                r = slice(start, start + rows)
                n_r = min(rows, n_q - start)
                s, dp = (buf[..., : n_r * n_k].reshape(lead + (n_r, n_k)) for buf in buffers)  # contiguous
                q_r, do_r = qs[idx][..., r, :], dob[idx][..., r, :]
                vis = None if visible is None else visible[idx][..., r, :]
                dead = None if vis is None or fully_masked == "nan" else ~np.any(vis, axis=-1, keepdims=True)
                np.matmul(q_r, k_t, out=s)  # (..., r, n_k) scores S
                p = _weights(s, vis, tile)
                if dead is not None:  # a row with no visible key: weights 0 ("zeros") or 1/n_k ("uniform")
                    np.copyto(p, 0.0 if fully_masked == "zeros" else 1.0 / n_k, where=dead)
                dv[idx] += np.matmul(np.swapaxes(p, -1, -2), do_r)  # dV += P^T dO
                np.matmul(do_r, v_t, out=dp)  # (..., r, n_k) dP = dO V^T
                d_s = _scores_grad(p, dp, do_r, None if ob is None else ob[idx][..., r, :])
                if dead is not None:  # the masked scores are constants: no gradient through them
                    np.copyto(d_s, 0.0, where=dead)
                np.matmul(d_s, kb[idx], out=dq[idx][..., r, :])  # dQ = dS K (times 1/sqrt(d_k) below)
                dk[idx] += np.matmul(np.swapaxes(d_s, -1, -2), q_r)  # dK += dS^T Q / sqrt(d_k)
    dq *= scale  # dK's scale is in qs
    return {"q": sum_to(dq, q.shape), "k": sum_to(dk, k.shape), "v": sum_to(dv, v.shape)}


def _weights(s: np.ndarray, vis: np.ndarray | None, tile: int | None) -> np.ndarray:
    """The softmax weights P of the scores ``s`` (..., r, n_k), computed in place; masked weights 0.

    Direct (``tile`` None): P = exp(S - m) / l, m and l the row's maximum and sum. Blocked: each key tile's maximum
    m_j and sum l_j = sum exp(S - m_j), merged as the forward's online softmax merges them: m = max_j m_j,
    l = sum_j l_j exp(m_j - m), the log-sum-exp L = m + log l, and P = exp(S - m_j) exp(m_j - m) / l = exp(S - L).
    A row with no visible key gets 0/0 = NaN, as the forward.
    """
    if vis is not None:
        # §3.2.3 sets a masked score to -inf (replaced, not added to: NaN or inf poison at a masked position cannot
        # reach the row); its weight is then exactly 0, and a row with no visible key has max -inf (handled below)
        np.copyto(s, -np.inf, where=~vis)
    groups = [_split(s, 1, s.shape[-1])] if tile is None else _key_tiles(s, tile)  # views (..., r, tiles, width)
    m_j = [np.max(g, axis=-1, keepdims=True) for g in groups]  # (..., r, tiles, 1); -inf: a tile masked entirely
    m = functools.reduce(np.maximum, [np.max(x, axis=-2, keepdims=True) for x in m_j])  # (..., r, 1, 1)
    # not finite: -inf for a row with no visible key (shift 0: its weights become 0 / 0 = NaN below, as the forward's
    # output); +inf or NaN only from scores that overflowed or NaN inputs, whose forward output is NaN too: those
    # rows end NaN through l (0 x inf), never finite, so no undefined gradient passes as a value
    m = np.where(np.isfinite(m), m, 0.0)
    ell, rescale = 0.0, []
    for g, mx in zip(groups, m_j):
        np.subtract(g, np.where(np.isfinite(mx), mx, 0.0), out=g)
        np.exp(g, out=g)  # exp(S - m_j), 0 where masked
        # exp(m_j - m); 0 for a tile with no visible key (m_j = -inf), whose exp(S - m_j) are all 0 already; a tile
        # whose max is +inf or NaN (overflowed or NaN scores) also gets 0 here, but its exp(S) holds inf or NaN, so
        # its row's l = sum_j l_j c_j is NaN (inf x 0) and every weight of that row NaN: nothing is dropped silently
        c = np.exp(np.where(np.isfinite(mx), mx - m, -np.inf))
        ell = ell + np.sum(_row_sums(g) * c, axis=-2, keepdims=True)  # (..., r, 1, 1)
        rescale.append(c)
    for g, c in zip(groups, rescale):
        np.multiply(g, c / ell, out=g)  # exp(S - m_j) exp(m_j - m) / l
    return s


def _key_tiles(s: np.ndarray, tile: int) -> list[np.ndarray]:
    """Views of ``s`` (..., r, n_k) by key tiles: the whole tiles (..., r, n_k // tile, tile), and the tail."""
    n_k = s.shape[-1]
    whole = n_k // tile * tile
    out = [_split(s[..., :whole], whole // tile, tile)] if whole else []
    return out + ([_split(s[..., whole:], 1, n_k - whole)] if whole < n_k else [])


def _split(x: np.ndarray, tiles: int, width: int) -> np.ndarray:
    """``x`` (..., r, tiles * width) as a view (..., r, tiles, width): writing to it writes to ``x``."""
    view = x.view()
    view.shape = x.shape[:-1] + (tiles, width)  # raises rather than copy
    return view


def _row_sums(x: np.ndarray) -> np.ndarray:
    """Sums along the last axis, keepdims, as a product with a column of ones (one GEMV pass, no temporary)."""
    return np.matmul(x, np.ones((x.shape[-1], 1), dtype=x.dtype))


def _scores_grad(p: np.ndarray, dp: np.ndarray, d_o: np.ndarray, o: np.ndarray | None) -> np.ndarray:
    """dS = P (.) (dP - D) in place of ``dp`` (``p`` is overwritten), D = rowsum(dO (.) O) from the forward's output
    ``o``, or without it rowsum(P (.) dP), the same sum (dP = dO V^T, O = P V). p, dp (..., r, n_k), d_o (..., r, d_v).
    """
    if o is not None:
        np.subtract(dp, np.sum(d_o * o, axis=-1, keepdims=True), out=dp)  # dP - D
        return np.multiply(dp, p, out=dp)
    np.multiply(dp, p, out=dp)  # P (.) dP
    d_row = _row_sums(dp)  # D, (..., r, 1)
    return np.subtract(dp, np.multiply(p, d_row, out=p), out=dp)  # P (.) dP - P (.) D


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
