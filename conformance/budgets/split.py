"""Budgets of split keys (§3.2.1, Eq. (1) over blocks of keys, merged by their log-sum-exp): how far an
implementation's block attention, its log-sum-exp and its merge of partial states may be from the oracle's.

The identity these check is proven in ``reference/attention.py`` ("split keys"): for any partition of the keys into
blocks, the blocks' outputs O_p merged with the weights softmax_p(L_p) of their log-sum-exps L_p are Eq. (1) over all
the keys, and log sum_p exp(L_p) is its log-sum-exp. Notation and assumptions are ``budgets/forward.py``'s ([H] is
Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.): u the unit roundoff (``prec.op``), t the
relative error of exp and log (``prec.t``), eta the subnormal spacing, gamma_n = n u / (1 - n u).

- The block's output is Eq. (1) with "zeros" for a query that sees no key of the block: ``forward.attention_core``,
  its weights allowed to be formed as exp(s_j - L) from the block's own log-sum-exp L (``lse_rounding``: the
  subtraction errs by u |s_j - L| and L itself by u |L|, so the gaps widen by |m| + 2 log n).
- The log-sum-exp L = m + log sum_j exp(s_j - m) of scores s_j known to within delta_j (``forward.score_error``):
  L is 1-Lipschitz in the max norm (its gradient is the softmax, of 1-norm 1), so the scores' errors move it by at
  most D = max_j delta_j over the visible keys. The shifted sum l = sum_j exp(s_j - m) is then computed with the
  relative error R of its terms (``forward._softmax_weight_factor``'s rho_j, weighted by the weights, widened by
  e^{2D}) and gamma_{n-1} of its n - 1 additions: log turns the relative error into lambda = -log((1 - R)(1 - g))
  absolutely, and adds t |log l| <= t (log n + lambda) of its own. The result m + log l is rounded up to three times
  (the addition; a conversion from base 2, as kernels that use exp2 do; the storage), each u |L|. Underflow: each
  term may underflow by eta, the sum is at least 1 (its largest term is exp(0)): (n + 2) eta. In all
      |L_hat - L| <= D + lambda + t (log n + lambda) + 3 u (|L| + D + lambda) + (n + 2) eta.
- The merge is a softmax-weighted sum over the P blocks with the L_p as scores, so the weights' analysis is the
  shifted softmax's (``forward.softmax``) with gaps max L - L_p, and the sum Eq. (1)'s P V step over P terms
  (``forward.attention_core``). Given states known to within e_O (outputs) and e_L (log-sum-exps, D = max_p e_L),
  the weights move by a factor within e^{2D}. A merge may form the weights as exp(L_p - L) from the merged L
  instead of the largest L_p (as ``torch.logsumexp`` users do): then each argument errs by u (|L_p - L| + |L|), so
  the gaps widen by |max L| + 2 log P, as for a block's weights formed from its log-sum-exp. This is the
  granularity of the states themselves: an L_p stored in the dtype is only known to u |L_p|, which moves its weight
  as much. A merge done block by block (an online rescaling, as split-KV
  decoding kernels do) rescales each state up to P - 1 more times; the arguments of those exps telescope to the
  block's gap, so their roundings are in the gap term, and their own errors add (1 + t)^{P-1} to the numerator and
  the denominator of a weight alike: the widening factor is e^{2D} (1 + t)^{2(P-1)}. A block with L_p = -inf weighs
  exactly 0; a query with no block alive gives exactly 0 and -inf (compared exactly).

Every bound is multiplied by ``forward.SAFETY``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiayn.conformance.budgets.forward import (
    SAFETY,
    _finite,
    _softmax64,
    _softmax_weight_factor,
    _times,
    attention_core,
    score_error,
)
from aiayn.conformance.numerics import Precision, gamma
from aiayn.reference.attention import paged_keys

__all__ = ["attention_with_lse", "log_sum_exp", "merged", "paged_attention", "split_attention"]


def _lse64(z: np.ndarray) -> np.ndarray:
    """The log-sum-exp of each last-axis row of ``z`` in float64, for magnitudes only; a row of -inf gives -inf."""
    m = np.max(z, axis=-1, initial=-np.inf)
    alive = m > -np.inf
    with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
        s = np.sum(np.exp(z - np.where(alive, m, 0.0)[..., None]), axis=-1)
        # a magnitude for the bound only: a row with nothing visible has no sum, and its bound is 0 (exactly -inf)
        return np.where(alive, m + np.log(np.where(alive, s, 1.0)), -np.inf)


def _lse_error(z: np.ndarray, delta: np.ndarray, prec: Precision, steps: int = 1) -> np.ndarray:
    """The bound of the module docstring on a computed log-sum-exp of each last-axis row of the scores ``z`` (-inf:
    not in the sum) known to within ``delta`` (>= 0, broadcastable to z); 0 where a row has no finite score (then
    the result must be exactly -inf). ``steps``: the P of a merge done block by block (the widening
    (1 + t)^{2(P-1)}; 1 for one pass). Returns z's shape without its last axis."""
    n = z.shape[-1]
    alive = z > -np.inf
    delta = np.where(alive, np.broadcast_to(_finite(delta), z.shape), 0.0)
    big_d = np.max(delta, axis=-1, initial=0.0)  # (...)
    p = _softmax64(z)
    m = np.max(np.where(alive, z, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    gap = np.where(alive, m - np.where(alive, z, 0.0), 0.0) + 2 * big_d[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        widen = np.exp(2 * big_d[..., None]) * (1 + prec.t) ** (2 * (steps - 1))
        rho = np.expm1(prec.op * gap) * (1 + prec.t) + prec.t
        big_r = widen[..., 0] * np.sum(_times(p, rho), axis=-1)
        low = (1 - big_r) * (1 - gamma(max(n - 1, 0), prec.op))
        # (1 - R)(1 - gamma) <= 0: the relative error of the sum may reach 1, so the log's error has no finite bound;
        # the bound is infinite and compare() counts the element "not checked" (its budget's name as the reason)
        lam = np.where(low > 0, -np.log(np.where(low > 0, low, 1.0)), np.inf)
    lse = np.abs(np.where(np.any(alive, axis=-1), _lse64(z), 0.0))
    log_n = math.log(max(n, 1))
    bound = big_d + lam + prec.t * (log_n + lam) + 3 * prec.op * (lse + big_d + lam) + (n + 2) * prec.eta
    return np.where(np.any(alive, axis=-1), bound, 0.0) * SAFETY


def log_sum_exp(
    q: np.ndarray, k: np.ndarray, visible: np.ndarray | None, prec: Precision, e_q: Any = 0.0, e_k: Any = 0.0
) -> np.ndarray:
    """Bound on the log-sum-exp of the scores q k^T / sqrt(d_k) over the visible keys (module docstring), for q, k
    known to within e_q, e_k. Shapes: q (..., n_q, d_k), k (..., n_k, d_k), visible broadcastable to (..., n_q, n_k)
    -> (..., n_q); 0 where a query sees no key (its log-sum-exp must be exactly -inf)."""
    e_q, e_k = (np.broadcast_to(_finite(e), a.shape) for e, a in ((e_q, q), (e_k, k)))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
    if visible is not None:
        s = np.where(np.broadcast_to(visible, s.shape), s, -np.inf)
    return _lse_error(s, score_error(q, e_q, k, e_k, prec), prec)


def attention_with_lse(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None, prec: Precision
) -> tuple[np.ndarray, np.ndarray]:
    """(output bound (..., n_q, d_v), log-sum-exp bound (..., n_q)) of one block on exact inputs: Eq. (1)'s bound
    with "zeros" for a query that sees no key of the block (exactly 0 there), and :func:`log_sum_exp`."""
    if k.shape[-2] == 0:  # an empty block: exactly 0 and -inf
        shape = np.broadcast_shapes(q.shape[:-1], k.shape[:-2] + q.shape[-2:-1])
        return np.zeros((*shape, v.shape[-1])), np.zeros(shape)
    out = attention_core(q, k, v, visible, prec, fully_masked="zeros", lse_rounding=True)[0]
    return out, log_sum_exp(q, k, visible, prec)


def merged(
    outs: np.ndarray, lses: np.ndarray, prec: Precision, e_out: Any = 0.0, e_lse: Any = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(output bound (..., n_q, d_v), log-sum-exp bound (..., n_q)) of the merge of P states (outs (P, ..., n_q, d_v),
    lses (P, ..., n_q), -inf for an empty block) known to within e_out, e_lse (module docstring: the softmax over the
    blocks, then Eq. (1)'s P V step over P terms). 0 where no block is alive (exactly 0 and -inf)."""
    n = outs.shape[0]
    z = np.moveaxis(np.asarray(lses, dtype=np.float64), 0, -1)  # (..., n_q, P)
    o = np.moveaxis(np.abs(np.asarray(outs, dtype=np.float64)), 0, -2)  # (..., n_q, P, d_v)
    e_o = np.moveaxis(np.broadcast_to(_finite(e_out), outs.shape), 0, -2)
    e_z = np.moveaxis(np.broadcast_to(_finite(e_lse), lses.shape), 0, -1)
    alive = z > -np.inf
    e_z = np.where(alive, e_z, 0.0)
    big_d = np.max(e_z, axis=-1, keepdims=True, initial=0.0)  # (..., n_q, 1)
    p = _softmax64(z)  # (..., n_q, P): the blocks' weights
    m = np.max(np.where(alive, z, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    gap = np.where(alive, m - np.where(alive, z, 0.0) + np.abs(m) + 2 * math.log(n), 0.0) + 2 * big_d
    with np.errstate(over="ignore"):
        widen = np.exp(2 * big_d) * (1 + prec.t) ** (2 * (n - 1))
    c = _finite(_softmax_weight_factor(gap, p, widen, n, prec))  # (..., n_q, P)
    av = o + e_o  # (..., n_q, P, d_v)
    pc, p1c = _times(p, c)[..., None, :], _times(p, 1 + c)[..., None, :]  # (..., n_q, 1, P)
    err = (pc @ av + p[..., None, :] @ e_o + gamma(n + 1, prec.op) * (p1c @ av))[..., 0, :]  # (..., n_q, d_v)
    any_alive = np.any(alive, axis=-1)  # (..., n_q)
    err = err + np.where(any_alive, (n + 2) * prec.eta, 0.0)[..., None] * (np.sum(av, axis=-2) + 1)
    err = np.where(any_alive[..., None], err, 0.0) * SAFETY
    return err, _lse_error(z, e_z, prec, steps=n)


def split_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None, edges: Any, prec: Precision
) -> tuple[np.ndarray, np.ndarray]:
    """(output bound, log-sum-exp bound) of attention computed block by block over the key blocks ``edges`` (cut
    points 0 = e_0 <= e_1 <= ... <= e_P = n_k) and merged: each block within :func:`attention_with_lse`, then the
    merge of states known to within those bounds (:func:`merged`, which adds the errors to the states' magnitudes,
    here P |V| for a block's output: a convex combination of its values)."""
    vis = None if visible is None else np.broadcast_to(visible, (*q.shape[:-1], k.shape[-2]))
    outs, lses, e_outs, e_lses = [], [], [], []
    for a, b in zip(edges[:-1], edges[1:]):
        kb, vb = k[..., a:b, :], v[..., a:b, :]
        wb = None if vis is None else vis[..., a:b]
        e_out, e_lse = attention_with_lse(q, kb, vb, wb, prec)
        if b > a:
            s = np.matmul(q, np.swapaxes(kb, -1, -2)) / math.sqrt(q.shape[-1])
            s = s if wb is None else np.where(wb, s, -np.inf)
            w = _softmax64(s)
            out, lse = np.matmul(w, np.abs(vb)), _lse64(s)
        else:
            out, lse = np.zeros(e_out.shape), np.full(e_lse.shape, -np.inf)
        outs.append(out)
        lses.append(lse)
        e_outs.append(e_out)
        e_lses.append(e_lse)
    shape = np.broadcast_shapes(*(x.shape for x in outs))
    outs_, e_outs_ = (np.stack([np.broadcast_to(x, shape) for x in xs]) for xs in (outs, e_outs))
    lses_, e_lses_ = (np.stack([np.broadcast_to(x, shape[:-1]) for x in xs]) for xs in (lses, e_lses))
    return merged(outs_, lses_, prec, e_outs_, e_lses_)


def paged_attention(
    q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray, block_table: Any, lengths: Any, prec: Precision
) -> np.ndarray:
    """Bound of Eq. (1) over a paged cache (``reference.attention.paged_keys``): Eq. (1)'s bound on the cache read in
    its logical order, the slots past each sentence's length absent (whatever they hold weighs exactly 0 and must
    reach nothing). Shapes: q (B, n_q, d_k), pages (N, page, d), block_table (B, M), lengths (B,) -> (B, n_q, d_v)."""
    k, visible = paged_keys(k_pages, block_table, lengths)
    v, _ = paged_keys(v_pages, block_table, lengths)
    return attention_core(q, k, v, visible[:, None, :], prec, fully_masked="zeros")[0]
