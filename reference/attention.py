"""Attention, §3.2.1-§3.2.3: softmax, scaled dot-product attention (Eq. 1), masks, multi-head attention.

Each equation is encoded twice:

- the fast tier (``softmax``, ``scaled_dot_product_attention``, ``multi_head_attention``) computes in
  ``np.longdouble`` (x87 extended on x86-64: 64-bit significand, unit roundoff 2^-64) and rounds once
  to float64 at the end; any size, batch dimensions broadcast;
- the exact tier (``*_exact``) computes in mpmath at ``dps`` decimal digits and rounds each result
  once to float64, correctly rounded (see ``reference/_exact.py``).

Shapes use the paper's names: ``n_q`` queries, ``n_k`` keys/values, widths ``d_k`` and ``d_v``,
``h`` heads, ``d_model`` the model width; ``...`` is any number of broadcast batch dimensions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import as_float_array, as_mask, batch_shape, choice, positive_int, same_size
from aiayn.reference._exact import DEFAULT_DPS, correctly_rounded, elementwise, mp_matmul, mp_sum, to_mp

LD = np.longdouble
FULLY_MASKED_POLICIES = ("nan", "zeros", "uniform")

# --------------------------------------------------------------------------------------------
# softmax, §3.2.1


def _softmax_input(x: Any, axis: int) -> np.ndarray:
    """Validate softmax's input: real, at least 1-D, not empty along ``axis``, finite except -inf (a masked score).

    An ``axis`` outside x's dimensions is left to NumPy's reductions, whose AxisError names it.
    """
    arr = as_float_array("x", x, min_ndim=1, allow_nonfinite=True)
    if -arr.ndim <= axis < arr.ndim and arr.shape[axis] == 0:
        raise ValueError(
            f"x: softmax needs at least one element along axis {axis}, got shape {arr.shape} "
            "(a distribution over no entries cannot sum to 1)"
        )
    bad = np.isnan(arr) | (arr == np.inf)
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"x: expected finite values or -inf (a masked score), found {arr[where]} at index {where}")
    return arr


def _softmax_ld(z: np.ndarray, axis: int) -> np.ndarray:
    """Max-shifted softmax in longdouble; a slice that is all -inf gives NaN (0/0), as the formula does."""
    m = np.max(z, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - m)  # -inf - (-inf) = nan for an all -inf slice
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, max-shifted; fast tier (longdouble inside, float64 out).

    Paper: §3.2.1 (the softmax in Eq. (1)): softmax(z)_i = exp(z_i) / sum_j exp(z_j).

    Choices:
        Max shift: exp(z_i - max z) / sum_j exp(z_j - max z), the same value in exact arithmetic
        and free of overflow. Entries of -inf (masked scores) get probability 0; a slice that is
        entirely -inf has no defined softmax and gives NaN (the 0/0 that -inf masking produces);
        ``scaled_dot_product_attention`` offers a policy for that case. NaN and +inf are rejected.
        An empty ``axis`` (n = 0) is rejected with a ValueError rather than given an empty result:
        the output along the axis is a probability distribution, which must sum to 1, and no
        distribution has no entries (``scaled_dot_product_attention`` likewise needs n_k >= 1).
        Empty batch dimensions are fine and give an empty result.

    Shapes: x (..., n) along ``axis`` -> same shape, float64.
    """
    z = _softmax_input(x, axis).astype(LD)
    return _softmax_ld(z, axis).astype(np.float64)


def _softmax_rows_mp(scores: np.ndarray, visible: np.ndarray | None, fully_masked: str) -> np.ndarray:
    """Exact softmax of each last-axis row of an object array of mpf; masked entries get exactly 0.

    A row with no visible entry gives NaN (policy "nan"), zeros ("zeros") or 1/n ("uniform").
    """
    rows = scores.reshape(-1, scores.shape[-1])
    vis = np.ones(rows.shape, dtype=bool) if visible is None else visible.reshape(rows.shape)
    out = np.empty(rows.shape, dtype=object)
    for r in range(rows.shape[0]):
        keep = {j for j in range(rows.shape[1]) if vis[r, j] and rows[r, j] != mpmath.ninf}
        if not keep:
            fill = {"nan": mpmath.nan, "zeros": mpmath.mpf(0), "uniform": mpmath.mpf(1) / rows.shape[1]}[fully_masked]
            out[r, :] = [fill] * rows.shape[1]
            continue
        m = max(rows[r, j] for j in keep)
        e = [mpmath.exp(rows[r, j] - m) if j in keep else mpmath.mpf(0) for j in range(rows.shape[1])]
        total = mpmath.fsum(e)
        out[r, :] = [e_j / total for e_j in e]
    return out.reshape(scores.shape)


def softmax_exact(x: Any, axis: int = -1, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """Softmax along ``axis``; exact tier (mpmath at ``dps`` digits, each result rounded once to float64).

    Paper: §3.2.1. Same definition and choices as :func:`softmax`.
    """
    z = _softmax_input(x, axis)
    moved = to_mp(np.moveaxis(z, axis, -1))
    p = correctly_rounded(lambda: _softmax_rows_mp(moved, None, "nan"), dps)
    return np.moveaxis(p, -1, axis)


# --------------------------------------------------------------------------------------------
# masks, §3.2.3


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """The decoder's mask: query i may attend to key j only if j is not in its future.

    Paper: §3.2.3: "We implement this inside of scaled dot-product attention by masking out
    (setting to -inf) all values in the input of the softmax which correspond to illegal
    connections", preventing leftward information flow.

    Choices:
        When n_q < n_k (queries are the last n_q of n_k positions, as in incremental decoding with
        cached keys) the mask is aligned at the end: query i sits at position n_k - n_q + i and
        sees keys j <= n_k - n_q + i. n_k < n_q is rejected (some queries would see nothing).

    Shapes: -> bool (n_q, n_k), True = may attend.
    """
    n_q = positive_int("n_q", n_q)
    n_k = positive_int("n_k", n_k)
    if n_k < n_q:
        raise ValueError(
            f"n_k: expected n_k >= n_q (queries are the last n_q of n_k positions), got n_q={n_q}, n_k={n_k}"
        )
    offset = n_k - n_q
    return np.arange(n_k)[None, :] <= (np.arange(n_q)[:, None] + offset)  # (n_q, n_k)


def padding_mask(lengths: Any, n_k: int) -> np.ndarray:
    """Mask out the padding keys of each batch element: key j is visible iff j < lengths[b].

    Paper: §3.2.3 / §5.1 (batches of sentences of different lengths; the paper's masking
    mechanism is the -inf of §3.2.3 applied to padded positions).

    Choices:
        A length of 0 is allowed and gives fully masked rows; what they yield is the attention
        function's ``fully_masked`` policy.

    Shapes: lengths (B,) integers in [0, n_k] -> bool (B, 1, n_k), broadcastable to (B, n_q, n_k)
    for Eq. (1) and to (B, h, n_q, n_k) inside multi-head attention.
    """
    n_k = positive_int("n_k", n_k)
    arr = np.asarray(lengths)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            "lengths: expected a 1-D integer array (one length per batch element), got "
            f"{arr.dtype} of shape {arr.shape}"
        )
    if np.any(arr < 0) or np.any(arr > n_k):
        raise ValueError(f"lengths: expected integers in [0, n_k={n_k}], got {arr.tolist()}")
    return (np.arange(n_k)[None, :] < arr[:, None])[:, None, :]  # (B, 1, n_k)


# --------------------------------------------------------------------------------------------
# scaled dot-product attention, §3.2.1, Eq. (1)


def _attention_inputs(q: Any, k: Any, v: Any, mask: Any, fully_masked: str):
    """Validate Eq. (1)'s inputs; return float64 arrays and the mask broadcast to the score shape."""
    choice("fully_masked", fully_masked, FULLY_MASKED_POLICIES)
    return _block_inputs(q, k, v, mask, empty=False)[:4]


def _block_inputs(q: Any, k: Any, v: Any, mask: Any, *, empty: bool):
    """Validate q, k, v and a mask of Eq. (1) (``empty``: n_k = 0 allowed, an empty block of keys); return float64
    arrays, the mask broadcast to the score shape, and the batch shape."""
    q = as_float_array("q", q, min_ndim=2)
    k = as_float_array("k", k, min_ndim=2)
    v = as_float_array("v", v, min_ndim=2)
    if q.shape[-1] == 0:
        raise ValueError(f"q: d_k must be >= 1, got q of shape {q.shape}")
    same_size("q", q.shape[-1], "k", k.shape[-1], "d_k (last axis)")
    same_size("k", k.shape[-2], "v", v.shape[-2], "n_k (second-to-last axis)")
    if k.shape[-2] == 0 and not empty:
        raise ValueError(f"k: n_k must be >= 1, got k of shape {k.shape}")
    batch = batch_shape("q, k, v", q, k, v)
    score_shape = (*batch, q.shape[-2], k.shape[-2])
    visible = None if mask is None else as_mask("mask", mask, score_shape)
    return q, k, v, visible, batch


def _attention_ld(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None, fully_masked: str
) -> np.ndarray:
    """Eq. (1) in longdouble on already-validated arrays; returns longdouble (..., n_q, d_v)."""
    d_k = q.shape[-1]
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(LD(d_k))  # (..., n_q, n_k)
    if visible is not None:
        scores = np.where(visible, scores, LD(-np.inf))
    p = _softmax_ld(scores, -1)  # (..., n_q, n_k); NaN rows where fully masked
    if fully_masked == "zeros":
        p = np.where(np.isnan(p), LD(0), p)
    elif fully_masked == "uniform":
        p = np.where(np.isnan(p), LD(1) / LD(p.shape[-1]), p)
    # A masked key's weight is exp(-inf) = 0 exactly, so it contributes 0 * v = 0 (v is finite).
    return np.matmul(p, v)  # (..., n_q, d_v)


def scaled_dot_product_attention(q: Any, k: Any, v: Any, mask: Any = None, *, fully_masked: str = "nan") -> np.ndarray:
    """Scaled dot-product attention; fast tier (longdouble inside, float64 out).

    Paper: §3.2.1, Eq. (1): Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V; masking per §3.2.3
    (illegal connections set to -inf before the softmax).

    Choices:
        Mask value: -inf (the paper's), so a masked key gets weight exactly 0 (a large negative
        number instead would leak exp(-big) of weight). Fully masked rows (no visible key) have no
        defined output: ``fully_masked="nan"`` (default: what -inf masking gives, 0/0),
        ``"zeros"`` (the row's output is 0: PyTorch's SDPA) or ``"uniform"`` (every key weighs
        1/n_k, the mean of the values: what a finite mask value such as -1e9 gives on a row that
        is masked throughout). The scale is applied
        to the scores after the product, as Eq. (1) writes it.

    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask bool broadcastable to
    (..., n_q, n_k) with True = may attend -> (..., n_q, d_v) float64.
    """
    q, k, v, visible = _attention_inputs(q, k, v, mask, fully_masked)
    out = _attention_ld(q.astype(LD), k.astype(LD), v.astype(LD), visible, fully_masked)
    return out.astype(np.float64)


def _attention_mp(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None, fully_masked: str
) -> np.ndarray:
    """Eq. (1) on object arrays of mpf in the current mp context; returns mpf (..., n_q, d_v)."""
    d_k = q.shape[-1]
    scores = mp_matmul(q, np.swapaxes(k, -1, -2))  # (..., n_q, n_k)
    scores = elementwise(lambda s: s / mpmath.sqrt(d_k), scores)
    if visible is not None:
        visible = np.broadcast_to(visible, scores.shape)
    p = _softmax_rows_mp(scores, visible, fully_masked)  # (..., n_q, n_k); masked weights exactly 0
    return mp_matmul(p, v)  # (..., n_q, d_v)


def scaled_dot_product_attention_exact(
    q: Any, k: Any, v: Any, mask: Any = None, *, fully_masked: str = "nan", dps: int = DEFAULT_DPS
) -> np.ndarray:
    """Scaled dot-product attention; exact tier (mpmath at ``dps`` digits, rounded once to float64).

    Paper: §3.2.1, Eq. (1). Same definition, choices and shapes as :func:`scaled_dot_product_attention`.
    """
    q, k, v, visible = _attention_inputs(q, k, v, mask, fully_masked)
    q, k, v = to_mp(q), to_mp(k), to_mp(v)
    return correctly_rounded(lambda: _attention_mp(q, k, v, visible, fully_masked), dps)


# --------------------------------------------------------------------------------------------
# split keys, §3.2.1, Eq. (1): attention over blocks of keys, merged by their log-sum-exp
#
# The identity. For one query, let s_j = q . k_j / sqrt(d_k) over the visible keys j, split into blocks B_1 .. B_P
# (any partition; a block may hold no visible key). For block p let
#     L_p = log sum_{j in B_p} exp(s_j)   (-inf for a block with no visible key: the log of an empty sum),
#     O_p = sum_{j in B_p} exp(s_j - L_p) v_j   (0 for such a block),
# so exp(L_p) O_p = sum_{j in B_p} exp(s_j) v_j. With L = log sum_p exp(L_p) = log sum_j exp(s_j):
#     sum_p exp(L_p - L) O_p = sum_p sum_{j in B_p} exp(s_j - L) v_j = sum_j softmax(s)_j v_j = Attention(q, K, V),
# and log sum_p exp(L_p) = L. So merging the blocks' (O_p, L_p) by the weights softmax_p(L_p) gives Eq. (1) over all
# keys and their log-sum-exp, for any partition: the merge is itself a softmax-weighted sum, over the blocks, with the
# blocks' log-sum-exps as scores. A block with no visible key has weight exp(-inf - L) = 0 and drops out; if no
# block has a visible key the merge is the empty case again: O = 0, L = -inf (FlashAttention's kernels write +inf
# there instead; this oracle takes the value of the formula).
#
# The error of a merge (``conformance/budgets/split.py`` states it in full): the weights are a max-shifted softmax of
# the L_p, so an implementation's computed weight is w_p (1 + c_p) with c_p the shifted-softmax factor of the gaps
# max L - L_p (``budgets.forward.softmax``), widened by e^{2D} where the L_p it is given are off by at most D; the
# sum over the P blocks adds gamma_{P+1}; the merged L is the log-sum-exp of P scores. The oracle's fast tier merges
# in longdouble and rounds once: within the same bound at unit roundoff 2^-64, then one float64 rounding.


def attention_with_lse(q: Any, k: Any, v: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (1) over one block of keys and the log-sum-exp of its scores; fast tier (longdouble inside, float64 out).

    Paper: §3.2.1, Eq. (1), with masking per §3.2.3. The log-sum-exp is not in the paper: it is what lets attention
    over a concatenation of key blocks be computed block by block and merged (:func:`merge_attention_states`; the
    identity above, "split keys").

    Choices:
        A query with no visible key in the block (every key masked, or n_k = 0) gets the output 0 and the log-sum-exp
        -inf (the log of an empty sum), whatever policy the whole attention has for a fully masked row: the block
        then weighs nothing in a merge.

    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask bool broadcastable to (..., n_q, n_k),
    n_k >= 0 -> (out (..., n_q, d_v), lse (..., n_q)) float64.
    """
    q, k, v, visible, batch = _block_inputs(q, k, v, mask, empty=True)
    q, k, v = q.astype(LD), k.astype(LD), v.astype(LD)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(LD(q.shape[-1]))  # (..., n_q, n_k)
    if visible is not None:
        scores = np.where(visible, scores, LD(-np.inf))
    shape = (*batch, q.shape[-2])
    m = np.max(scores, axis=-1, initial=LD(-np.inf))  # (..., n_q); -inf where nothing is visible
    alive = m > -np.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.exp(scores - np.where(alive, m, LD(0))[..., None])  # masked: exp(-inf) = 0
        total = np.sum(e, axis=-1)  # >= 1 where alive (the max term is exp(0))
        out = np.matmul(e / np.where(alive, total, LD(1))[..., None], v)
        lse = np.where(alive, m + np.log(np.where(alive, total, LD(1))), LD(-np.inf))
    return out.astype(np.float64), np.broadcast_to(lse, shape).astype(np.float64)


def _lse_mp(scores: np.ndarray, visible: np.ndarray | None) -> np.ndarray:
    """The log-sum-exp of each last-axis row of an object array of mpf over its visible entries (-inf for none)."""
    rows = scores.reshape(-1, scores.shape[-1])
    vis = np.ones(rows.shape, dtype=bool) if visible is None else np.broadcast_to(visible, scores.shape)
    vis = vis.reshape(rows.shape)
    out = np.empty(rows.shape[0], dtype=object)
    for r in range(rows.shape[0]):
        keep = [rows[r, j] for j in range(rows.shape[1]) if vis[r, j] and rows[r, j] != mpmath.ninf]
        if not keep:
            out[r] = mpmath.ninf
            continue
        m = max(keep)
        out[r] = m + mpmath.log(mpmath.fsum(mpmath.exp(s - m) for s in keep))
    return out.reshape(scores.shape[:-1])


def attention_with_lse_exact(
    q: Any, k: Any, v: Any, mask: Any = None, *, dps: int = DEFAULT_DPS
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (1) over one block of keys and its log-sum-exp; exact tier (mpmath at ``dps`` digits, each rounded once).

    Paper: §3.2.1, Eq. (1). Same definition, choices and shapes as :func:`attention_with_lse`.
    """
    q, k, v, visible, batch = _block_inputs(q, k, v, mask, empty=True)
    shape = (*batch, q.shape[-2])
    if k.shape[-2] == 0:
        return np.zeros((*batch, q.shape[-2], v.shape[-1])), np.full(shape, -np.inf)
    q, k, v = (to_mp(np.broadcast_to(x, (*batch, *x.shape[-2:]))) for x in (q, k, v))

    def scores() -> np.ndarray:
        return elementwise(lambda s: s / mpmath.sqrt(q.shape[-1]), mp_matmul(q, np.swapaxes(k, -1, -2)))

    def out() -> np.ndarray:
        return mp_matmul(_softmax_rows_mp(scores(), visible, "zeros"), v)  # (..., n_q, d_v)

    return correctly_rounded(out, dps), correctly_rounded(lambda: _lse_mp(scores(), visible), dps)


def _states_inputs(outs: Any, lses: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate the inputs of :func:`merge_attention_states`."""
    outs = as_float_array("outs", outs, min_ndim=3)
    lses = as_float_array("lses", lses, min_ndim=2, allow_nonfinite=True)
    if outs.shape[:-1] != lses.shape:
        raise ValueError(
            f"lses: expected the shape of outs without its last axis, {outs.shape[:-1]}, got {lses.shape} "
            "(one log-sum-exp per block and query)"
        )
    if outs.shape[0] == 0:
        raise ValueError(f"outs: expected at least one block (axis 0), got shape {outs.shape}")
    if np.any(np.isnan(lses) | (lses == np.inf)):
        where = tuple(int(i) for i in np.argwhere(np.isnan(lses) | (lses == np.inf))[0])
        raise ValueError(f"lses: expected finite values or -inf (an empty block), found {lses[where]} at {where}")
    return outs, lses


def merge_attention_states(outs: Any, lses: Any) -> tuple[np.ndarray, np.ndarray]:
    """Merge the attention outputs of P blocks of keys by their log-sum-exps; fast tier (longdouble, float64 out).

    Paper: §3.2.1, Eq. (1): by the identity above ("split keys"), merging :func:`attention_with_lse` of the blocks of
    any partition of the keys gives Eq. (1) over all of them and their log-sum-exp.

    out = sum_p softmax_p(L)_p O_p, lse = log sum_p exp(L_p), max-shifted. A query whose every block has lse -inf
    (no visible key anywhere) gets out 0 and lse -inf.

    Shapes: outs (P, ..., n_q, d_v), lses (P, ..., n_q), P >= 1 -> (out (..., n_q, d_v), lse (..., n_q)) float64.
    """
    outs, lses = _states_inputs(outs, lses)
    o, z = outs.astype(LD), lses.astype(LD)
    m = np.max(z, axis=0)  # (..., n_q)
    alive = m > -np.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.exp(z - np.where(alive, m, LD(0)))  # (P, ..., n_q); an empty block: 0
        total = np.sum(w, axis=0)  # >= 1 where alive
        out = np.sum(w[..., None] * o, axis=0) / np.where(alive, total, LD(1))[..., None]
        lse = np.where(alive, m + np.log(np.where(alive, total, LD(1))), LD(-np.inf))
    return out.astype(np.float64), lse.astype(np.float64)


def merge_attention_states_exact(outs: Any, lses: Any, *, dps: int = DEFAULT_DPS) -> tuple[np.ndarray, np.ndarray]:
    """Merge P blocks' attention states; exact tier (mpmath at ``dps`` digits, each result rounded once).

    Paper: §3.2.1, Eq. (1). Same definition, choices and shapes as :func:`merge_attention_states`.
    """
    outs, lses = _states_inputs(outs, lses)
    o, z = to_mp(np.moveaxis(outs, 0, -1)), to_mp(np.moveaxis(lses, 0, -1))  # blocks last: (..., n_q, d_v, P)

    alive = np.moveaxis(lses != -np.inf, 0, -1)  # (..., n_q, P)

    def out() -> np.ndarray:  # the blocks' weights softmax(L) (an empty block 0; none alive: all 0), then the sum
        w = _softmax_rows_mp(z, alive, "zeros")  # (..., n_q, P)
        return mp_matmul(o, w[..., None])[..., 0]  # (..., n_q, d_v)

    return correctly_rounded(out, dps), correctly_rounded(lambda: _lse_mp(z, None), dps)


def paged_keys(pages: Any, block_table: Any, lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """A paged cache read in its logical order: (keys or values (B, M page, d), visible (B, M page)).

    A paged cache (vLLM's PagedAttention) stores every sentence's keys (or values) in fixed-size pages of a shared
    pool, in any physical order; sentence b's t-th position is slot t mod page of page ``block_table[b, t // page]``.
    Only the first ``lengths[b]`` positions are the sentence's: the slots past them (in its last page, and in pages
    its table lists beyond) hold whatever the pool held, and are given as 0 and not visible here, so that nothing
    computed from them can depend on them (split keys: the identity above with the unread slots as an empty block).

    Shapes: pages (N, page, d), block_table (B, M) int, 0 <= entries < N, lengths (B,) int, 0 <= lengths <= M page.
    """
    pages = as_float_array("pages", pages, min_ndim=3, allow_nonfinite=True)
    if pages.ndim != 3:
        raise ValueError(f"pages: expected (N, page, d), got shape {pages.shape}")
    table = np.asarray(block_table)
    if table.ndim != 2 or table.dtype.kind not in "iu":
        raise ValueError(f"block_table: expected a 2-d integer array (B, M), got {table.dtype} of shape {table.shape}")
    if table.size and (table.min() < 0 or table.max() >= pages.shape[0]):
        raise ValueError(
            f"block_table: entries must index the {pages.shape[0]} pages, got {table.min()}..{table.max()}"
        )
    n = np.asarray(lengths)
    span = table.shape[1] * pages.shape[1]
    if n.shape != (table.shape[0],) or n.dtype.kind not in "iu" or np.any((n < 0) | (n > span)):
        raise ValueError(f"lengths: expected {table.shape[0]} integers in [0, {span}], got {n!r}")
    gathered = pages[table].reshape(table.shape[0], span, pages.shape[2])  # (B, M page, d)
    visible = np.arange(span)[None, :] < n[:, None]  # (B, M page)
    return np.where(visible[..., None], gathered, 0.0), visible


def paged_attention(q: Any, k_pages: Any, v_pages: Any, block_table: Any, lengths: Any) -> np.ndarray:
    """Eq. (1) of each sentence's queries over its paged cache; fast tier (longdouble inside, float64 out).

    Paper: §3.2.1, Eq. (1) over the keys a decoder has cached (§3.2.3: each query sees every cached position), read
    through the block table (:func:`paged_keys`); a sentence with no position gets 0.

    Shapes: q (B, n_q, d_k), k_pages (N, page, d_k), v_pages (N, page, d_v), block_table (B, M), lengths (B,)
    -> (B, n_q, d_v) float64.
    """
    k, visible = paged_keys(k_pages, block_table, lengths)
    v, _ = paged_keys(v_pages, block_table, lengths)
    return scaled_dot_product_attention(q, k, v, visible[:, None, :], fully_masked="zeros")


def paged_attention_exact(
    q: Any, k_pages: Any, v_pages: Any, block_table: Any, lengths: Any, *, dps: int = DEFAULT_DPS
) -> np.ndarray:
    """Eq. (1) of each sentence's queries over its paged cache; exact tier. Same definition as
    :func:`paged_attention`."""
    k, visible = paged_keys(k_pages, block_table, lengths)
    v, _ = paged_keys(v_pages, block_table, lengths)
    return scaled_dot_product_attention_exact(q, k, v, visible[:, None, :], fully_masked="zeros", dps=dps)


# --------------------------------------------------------------------------------------------
# the backward of softmax and Eq. (1): vector-Jacobian products
#
# For a cotangent dY of an output Y = f(X), the VJP is dX = J_f(X)^T dY: what reverse-mode autodiff
# computes. Derived here from the definitions, not from any implementation's backward:
#
#   softmax  y_i = exp(x_i) / sum_j exp(x_j):  dy_i/dx_j = y_i (delta_ij - y_j), so
#            dx_j = sum_i dy_i y_i (delta_ij - y_j) = y_j (dy_j - sum_i y_i dy_i).
#   Eq. (1)  S = Q K^T / sqrt(d_k) (masked entries -inf), P = softmax_rows(S), O = P V:
#            dV = P^T dO;  dP = dO V^T;  dS = P (.) (dP - D), D_i = sum_j P_ij dP_ij (= dO_i . O_i);
#            dQ = dS K / sqrt(d_k);  dK = dS^T Q / sqrt(d_k).
#   A masked score is the constant -inf: its weight is exactly 0, so dS is exactly 0 there and nothing
#   flows to its query or key. A fully masked row under "zeros" or "uniform" has weights that do not
#   depend on S (constants): its dS is exactly 0 (its dV share is still P^T dO). Under "nan" the row's
#   output is undefined and so is every gradient it reaches (NaN: its dQ row, every dK, every dV).
#   Inputs broadcast over batch dimensions receive the sum over the dimensions they were broadcast
#   along (their gradient has their own shape).


def _cotangent(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A finite cotangent of exactly the output's shape."""
    arr = as_float_array(name, value)
    if arr.shape != shape:
        raise ValueError(f"{name}: expected the output's shape {shape}, got {arr.shape}")
    return arr


def _unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``grad`` summed over the dimensions an input of ``shape`` was broadcast along (float or object arrays)."""
    lead = grad.ndim - len(shape)
    if lead:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def softmax_vjp(x: Any, dy: Any, axis: int = -1) -> np.ndarray:
    """The VJP of softmax along ``axis``: dx = y (.) (dy - sum_axis(y (.) dy)); fast tier (longdouble, float64 out).

    Paper: §3.2.1 (the softmax of Eq. (1)). A masked entry (-inf) gets exactly 0; a slice that is all -inf has no
    softmax and gives NaN, as :func:`softmax` does. Shapes: x and dy (..., n) along ``axis`` -> dx, same shape.
    """
    z = _softmax_input(x, axis).astype(LD)
    g = _cotangent("dy", dy, z.shape).astype(LD)
    y = _softmax_ld(z, axis)
    with np.errstate(invalid="ignore"):
        return (y * (g - np.sum(y * g, axis=axis, keepdims=True))).astype(np.float64)


def softmax_vjp_exact(x: Any, dy: Any, axis: int = -1, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """The VJP of softmax; exact tier (mpmath at ``dps`` digits, each result rounded once to float64).

    Paper: §3.2.1. Same definition and shapes as :func:`softmax_vjp`.
    """
    z = _softmax_input(x, axis)
    g = _cotangent("dy", dy, z.shape)
    moved, cot = to_mp(np.moveaxis(z, axis, -1)), to_mp(np.moveaxis(g, axis, -1))

    def compute() -> np.ndarray:
        y = _softmax_rows_mp(moved, None, "nan")
        d = mp_sum(y * cot, -1)[..., None]
        return y * (cot - d)

    return np.moveaxis(correctly_rounded(compute, dps), -1, axis)


def _attention_vjp_ld(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_out: np.ndarray,
    visible: np.ndarray | None,
    fully_masked: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of Eq. (1) in longdouble on validated arrays, each of its input's shape."""
    scale = np.sqrt(LD(q.shape[-1]))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / scale  # (..., n_q, n_k)
    if visible is not None:
        s = np.where(visible, s, LD(-np.inf))
    p = _softmax_ld(s, -1)  # (..., n_q, n_k); NaN rows where fully masked
    dead = np.isnan(p[..., :1])  # (..., n_q, 1): rows with no visible key
    if fully_masked != "nan":
        p = np.where(dead, LD(0) if fully_masked == "zeros" else LD(1) / LD(p.shape[-1]), p)
    with np.errstate(invalid="ignore"):
        dv = np.matmul(np.swapaxes(p, -1, -2), d_out)  # (..., n_k, d_v)
        dp = np.matmul(d_out, np.swapaxes(v, -1, -2))  # (..., n_q, n_k)
        ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))  # (..., n_q, n_k)
        if fully_masked != "nan":
            ds = np.where(dead, LD(0), ds)  # constant weights: no gradient to the scores
        dq = np.matmul(ds, k) / scale  # (..., n_q, d_k)
        dk = np.matmul(np.swapaxes(ds, -1, -2), q) / scale  # (..., n_k, d_k)
    return _unbroadcast(dq, q.shape), _unbroadcast(dk, k.shape), _unbroadcast(dv, v.shape)


def scaled_dot_product_attention_vjp(
    q: Any, k: Any, v: Any, d_out: Any, mask: Any = None, *, fully_masked: str = "nan"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The VJP of scaled dot-product attention: (dQ, dK, dV) for the cotangent ``d_out``; fast tier (longdouble
    inside, float64 out).

    Paper: §3.2.1, Eq. (1), masks per §3.2.3. Formulas, and what masked entries and fully masked rows receive, in
    the comment above. Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), d_out the output's shape
    (..., n_q, d_v), mask as for :func:`scaled_dot_product_attention` -> dq, dk, dv of q's, k's and v's shapes.
    """
    q, k, v, visible = _attention_inputs(q, k, v, mask, fully_masked)
    shape = (*batch_shape("q, k, v", q, k, v), q.shape[-2], v.shape[-1])
    d_out = _cotangent("d_out", d_out, shape)
    grads = _attention_vjp_ld(q.astype(LD), k.astype(LD), v.astype(LD), d_out.astype(LD), visible, fully_masked)
    return tuple(g.astype(np.float64) for g in grads)  # type: ignore[return-value]


def _attention_vjp_mp(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_out: np.ndarray,
    visible: np.ndarray | None,
    fully_masked: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of Eq. (1) on object arrays of mpf in the current mp context."""
    root = mpmath.sqrt(q.shape[-1])
    s = elementwise(lambda x: x / root, mp_matmul(q, np.swapaxes(k, -1, -2)))  # (..., n_q, n_k)
    if visible is not None:
        visible = np.broadcast_to(visible, s.shape)
    p = _softmax_rows_mp(s, visible, fully_masked)  # masked weights exactly 0; dead rows per the policy
    live = np.ones(s.shape[:-1], dtype=bool) if visible is None else np.any(visible, axis=-1)
    dv = mp_matmul(np.swapaxes(p, -1, -2), d_out)
    dp = mp_matmul(d_out, np.swapaxes(v, -1, -2))
    ds = p * (dp - mp_sum(p * dp, -1)[..., None])
    if fully_masked != "nan":
        ds = np.where(live[..., None], ds, mpmath.mpf(0))
    dq = elementwise(lambda x: x / root, mp_matmul(ds, k))
    dk = elementwise(lambda x: x / root, mp_matmul(np.swapaxes(ds, -1, -2), q))
    return _unbroadcast(dq, q.shape), _unbroadcast(dk, k.shape), _unbroadcast(dv, v.shape)


def scaled_dot_product_attention_vjp_exact(
    q: Any, k: Any, v: Any, d_out: Any, mask: Any = None, *, fully_masked: str = "nan", dps: int = DEFAULT_DPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The VJP of scaled dot-product attention; exact tier (mpmath at ``dps`` digits, each result rounded once to
    float64).

    Paper: §3.2.1, Eq. (1). Same definition, choices and shapes as :func:`scaled_dot_product_attention_vjp`.
    """
    q, k, v, visible = _attention_inputs(q, k, v, mask, fully_masked)
    shape = (*batch_shape("q, k, v", q, k, v), q.shape[-2], v.shape[-1])
    d_out = _cotangent("d_out", d_out, shape)
    mq, mk, mv, mo = to_mp(q), to_mp(k), to_mp(v), to_mp(d_out)

    def compute() -> np.ndarray:
        parts = _attention_vjp_mp(mq, mk, mv, mo, visible, fully_masked)
        return np.concatenate([np.asarray(part, dtype=object).reshape(-1) for part in parts])

    flat = correctly_rounded(compute, dps)
    sizes = np.cumsum([q.size, k.size])
    dq, dk, dv = np.split(flat, sizes)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2

_REQUIRED = ("w_q", "w_k", "w_v", "w_o")
_OPTIONAL = ("b_q", "b_k", "b_v", "b_o")


def _mha_inputs(
    query: Any, key: Any, value: Any, params: Mapping[str, Any], num_heads: Any, mask: Any, fully_masked: str
):
    """Validate MHA's inputs against the canonical layout; return arrays, sizes and the mask."""
    choice("fully_masked", fully_masked, FULLY_MASKED_POLICIES)
    h = positive_int("num_heads", num_heads)
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a mapping with keys {', '.join(_REQUIRED)}, got {type(params).__name__}")
    missing = [name for name in _REQUIRED if name not in params]
    if missing:
        raise ValueError(
            f"params: missing {', '.join(missing)} (canonical layout: w_q, w_k, w_v, w_o; optional b_q, b_k, b_v, b_o)"
        )
    unknown = sorted(set(params) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ValueError(f"params: unknown keys {unknown}; expected w_q, w_k, w_v, w_o and optional b_q, b_k, b_v, b_o")
    w = {name: as_float_array(f"params['{name}']", params[name], min_ndim=2) for name in _REQUIRED}
    for name, arr in w.items():
        if arr.ndim != 2:
            raise ValueError(f"params['{name}']: expected a 2-D matrix, got shape {arr.shape}")
    query = as_float_array("query", query, min_ndim=2)
    key = as_float_array("key", key, min_ndim=2)
    value = as_float_array("value", value, min_ndim=2)
    same_size("query", query.shape[-1], "params['w_q']", w["w_q"].shape[0], "d_model (query's last axis vs w_q's rows)")
    same_size("key", key.shape[-1], "params['w_k']", w["w_k"].shape[0], "d_model (key's last axis vs w_k's rows)")
    same_size("value", value.shape[-1], "params['w_v']", w["w_v"].shape[0], "d_model (value's last axis vs w_v's rows)")
    same_size("key", key.shape[-2], "value", value.shape[-2], "n_k (second-to-last axis)")
    same_size("params['w_q']", w["w_q"].shape[1], "params['w_k']", w["w_k"].shape[1], "h*d_k (columns)")
    same_size(
        "params['w_v']", w["w_v"].shape[1], "params['w_o']", w["w_o"].shape[0], "h*d_v (w_v's columns vs w_o's rows)"
    )
    for name, width in (("w_q", w["w_q"].shape[1]), ("w_v", w["w_v"].shape[1])):
        if width == 0 or width % h:
            raise ValueError(
                f"num_heads: {h} heads must divide params['{name}']'s {width} columns (h*d_k, h*d_v) into "
                "equal widths >= 1"
            )
    widths = {"b_q": w["w_q"].shape[1], "b_k": w["w_k"].shape[1], "b_v": w["w_v"].shape[1], "b_o": w["w_o"].shape[1]}
    b = {}
    for name in _OPTIONAL:
        if params.get(name) is not None:
            arr = as_float_array(f"params['{name}']", params[name], min_ndim=1)
            if arr.shape != (widths[name],):
                raise ValueError(f"params['{name}']: expected shape ({widths[name]},), got {arr.shape}")
            b[name] = arr
    if key.shape[-2] == 0:
        raise ValueError(f"key: n_k must be >= 1, got key of shape {key.shape}")
    batch = batch_shape("query, key, value", query, key, value)
    visible = None
    if mask is not None:
        visible = as_mask("mask", mask, (*batch, query.shape[-2], key.shape[-2]))[..., None, :, :]  # (..., 1, n_q, n_k)
    return query, key, value, w, b, h, visible


def _split_heads(x: np.ndarray, h: int) -> np.ndarray:
    """(..., n, h*d) -> (..., h, n, d): head i takes columns i*d:(i+1)*d (the canonical layout)."""
    *batch, n, width = x.shape
    return np.swapaxes(x.reshape(*batch, n, h, width // h), -2, -3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., h, n, d) -> (..., n, h*d): Concat(head_1, ..., head_h) of §3.2.2."""
    *batch, h, n, d = x.shape
    return np.swapaxes(x, -2, -3).reshape(*batch, n, h * d)


def multi_head_attention(
    query: Any,
    key: Any,
    value: Any,
    params: Mapping[str, Any],
    num_heads: int,
    mask: Any = None,
    *,
    fully_masked: str = "nan",
) -> np.ndarray:
    """Multi-head attention; fast tier (longdouble throughout, one rounding to float64 at the end).

    Paper: §3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), Attention as in Eq. (1).

    Canonical parameter layout (the contract every implementation is checked in):
        ``w_q`` (d_model, h*d_k), ``w_k`` (d_model, h*d_k), ``w_v`` (d_model, h*d_v),
        ``w_o`` (h*d_v, d_model); optional biases ``b_q`` (h*d_k,), ``b_k`` (h*d_k,),
        ``b_v`` (h*d_v,), ``b_o`` (d_model,). Head i uses columns i*d_k:(i+1)*d_k of w_q and
        w_k, columns i*d_v:(i+1)*d_v of w_v, and rows i*d_v:(i+1)*d_v of w_o. Projections are
        right-multiplications x @ W (the paper's Q W_i^Q).

    Choices:
        Biases: the paper writes none; they are optional here (absent = zero) because most
        implementations (PyTorch's included) have them. Masking and fully masked rows as in
        :func:`scaled_dot_product_attention` (the same mask is applied to every head).

    Shapes: query (..., n_q, d_model), key and value (..., n_k, d_model), mask broadcastable to
    (..., n_q, n_k) -> (..., n_q, d_model) float64.
    """
    query, key, value, w, b, h, visible = _mha_inputs(query, key, value, params, num_heads, mask, fully_masked)
    ld = {name: arr.astype(LD) for name, arr in {**w, **b}.items()}
    zero = LD(0)
    q = query.astype(LD) @ ld["w_q"] + ld.get("b_q", zero)  # (..., n_q, h*d_k)
    k = key.astype(LD) @ ld["w_k"] + ld.get("b_k", zero)  # (..., n_k, h*d_k)
    v = value.astype(LD) @ ld["w_v"] + ld.get("b_v", zero)  # (..., n_k, h*d_v)
    heads = _attention_ld(
        _split_heads(q, h), _split_heads(k, h), _split_heads(v, h), visible, fully_masked
    )  # (..., h, n_q, d_v)
    out = _merge_heads(heads) @ ld["w_o"] + ld.get("b_o", zero)  # (..., n_q, d_model)
    return out.astype(np.float64)


def multi_head_attention_exact(
    query: Any,
    key: Any,
    value: Any,
    params: Mapping[str, Any],
    num_heads: int,
    mask: Any = None,
    *,
    fully_masked: str = "nan",
    dps: int = DEFAULT_DPS,
) -> np.ndarray:
    """Multi-head attention; exact tier (mpmath at ``dps`` digits, each output rounded once to float64).

    Paper: §3.2.2. Same definition, canonical layout, choices and shapes as
    :func:`multi_head_attention`.
    """
    query, key, value, w, b, h, visible = _mha_inputs(query, key, value, params, num_heads, mask, fully_masked)
    mp = {name: to_mp(arr) for name, arr in {**w, **b, "query": query, "key": key, "value": value}.items()}

    def project(x: str, weight: str, bias: str) -> np.ndarray:
        y = mp_matmul(mp[x], mp[weight])
        return y + mp[bias] if bias in mp else y

    def compute() -> np.ndarray:
        q = project("query", "w_q", "b_q")  # (..., n_q, h*d_k)
        k = project("key", "w_k", "b_k")  # (..., n_k, h*d_k)
        v = project("value", "w_v", "b_v")  # (..., n_k, h*d_v)
        heads = _attention_mp(_split_heads(q, h), _split_heads(k, h), _split_heads(v, h), visible, fully_masked)
        out = mp_matmul(_merge_heads(heads), mp["w_o"])  # (..., n_q, d_model)
        return out + mp["b_o"] if "b_o" in mp else out

    return correctly_rounded(compute, dps)


def _mha_pullback(
    ins: Mapping[str, np.ndarray],
    h: int,
    visible: np.ndarray | None,
    fully_masked: str,
    matmul: Any,
    attention: Any,
    attention_vjp: Any,
) -> tuple[np.ndarray, Callable[[np.ndarray], dict[str, np.ndarray]]]:
    """§3.2.2's output and its pullback (cotangent -> gradients by name), with the arithmetic given (``matmul``,
    Eq. (1) forward and VJP): longdouble or mpmath. ``ins`` holds query, key, value and the parameters given.

    Y = Concat(head_1..h) W^O + b^O with head_i = Attention(Q_i, K_i, V_i), Q = query W^Q + b^Q (likewise K, V):
    dW^O = Concat^T dY, db^O = sum dY, dConcat = dY (W^O)^T split into heads, (dQ_i, dK_i, dV_i) by Eq. (1)'s VJP,
    dW^Q = query^T dQ, db^Q = sum dQ, dquery = dQ (W^Q)^T (likewise for key and value); every sum over all rows.
    The gradients of query, key and value have the batch shape of the output (not reduced to a broadcast input's).
    """

    def rows(a: np.ndarray) -> np.ndarray:
        return a.reshape(-1, a.shape[-1])

    def t(a: np.ndarray) -> np.ndarray:
        return np.swapaxes(a, -1, -2)

    def affine(x: np.ndarray, w: str, b: str) -> np.ndarray:
        y = matmul(x, ins[w])
        return y + ins[b] if b in ins else y

    q, k, v = affine(ins["query"], "w_q", "b_q"), affine(ins["key"], "w_k", "b_k"), affine(ins["value"], "w_v", "b_v")
    qh, kh, vh = _split_heads(q, h), _split_heads(k, h), _split_heads(v, h)  # (..., h, n, d)
    concat = _merge_heads(attention(qh, kh, vh, visible, fully_masked))  # (..., n_q, h*d_v)
    out = affine(concat, "w_o", "b_o")  # (..., n_q, d_model)

    def pullback(d_out: np.ndarray) -> dict[str, np.ndarray]:
        grads = {"w_o": matmul(t(rows(concat)), rows(d_out)), "b_o": rows(d_out).sum(axis=0)}
        d_heads = _split_heads(matmul(d_out, t(ins["w_o"])), h)  # (..., h, n_q, d_v)
        dqh, dkh, dvh = attention_vjp(qh, kh, vh, d_heads, visible, fully_masked)
        for name, x, d in (("query", "q", dqh), ("key", "k", dkh), ("value", "v", dvh)):
            merged = _merge_heads(d)  # (..., n, h*d)
            grads[f"w_{x}"] = matmul(t(rows(ins[name])), rows(merged))
            grads[f"b_{x}"] = rows(merged).sum(axis=0)
            grads[name] = matmul(merged, t(ins[f"w_{x}"]))
        return grads

    return out, pullback


def _mha_vjp(
    ins: Mapping[str, np.ndarray],
    h: int,
    visible: np.ndarray | None,
    fully_masked: str,
    d_out: np.ndarray,
    matmul: Any,
    attention: Any,
    attention_vjp: Any,
) -> dict[str, np.ndarray]:
    """The VJP of §3.2.2 for the cotangent ``d_out`` (:func:`_mha_pullback`)."""
    return _mha_pullback(ins, h, visible, fully_masked, matmul, attention, attention_vjp)[1](d_out)


MHA_GRADIENTS = ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _mha_vjp_inputs(
    query: Any,
    key: Any,
    value: Any,
    params: Mapping[str, Any],
    num_heads: Any,
    d_out: Any,
    mask: Any,
    fully_masked: str,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]], int, np.ndarray | None, np.ndarray]:
    """Validated inputs of the MHA VJP: the given arrays by name, every gradient's shape (absent biases included),
    the heads, the mask and the cotangent."""
    query, key, value, w, b, h, visible = _mha_inputs(query, key, value, params, num_heads, mask, fully_masked)
    shape = (*batch_shape("query, key, value", query, key, value), query.shape[-2], w["w_o"].shape[1])
    given = {**w, **b, "query": query, "key": key, "value": value}
    widths = {"b_q": w["w_q"].shape[1], "b_k": w["w_k"].shape[1], "b_v": w["w_v"].shape[1], "b_o": w["w_o"].shape[1]}
    shapes = {name: np.shape(a) for name, a in given.items()} | {name: (widths[name],) for name in _OPTIONAL}
    return given, shapes, h, visible, _cotangent("d_out", d_out, shape)


def multi_head_attention_vjp(
    query: Any,
    key: Any,
    value: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    mask: Any = None,
    *,
    fully_masked: str = "nan",
) -> dict[str, np.ndarray]:
    """The VJP of multi-head attention: the gradient of every input and parameter for the cotangent ``d_out``, by
    name (:data:`MHA_GRADIENTS`: query, key, value, w_q, ..., b_o; a bias's gradient is returned whether the bias is
    given or absent, i.e. zero); fast tier (longdouble inside, float64 out).

    Paper: §3.2.2. Canonical layout, choices and shapes as :func:`multi_head_attention`; each gradient has its
    input's shape. Self-attention passes one array as query, key and value: its gradient is the sum of the three.
    """
    given, shapes, h, visible, d_out = _mha_vjp_inputs(query, key, value, params, num_heads, d_out, mask, fully_masked)
    ins = {name: a.astype(LD) for name, a in given.items()}
    grads = _mha_vjp(ins, h, visible, fully_masked, d_out.astype(LD), np.matmul, _attention_ld, _attention_vjp_ld)
    for name in ("query", "key", "value"):
        grads[name] = _unbroadcast(grads[name], shapes[name])
    return {name: grads[name].astype(np.float64) for name in MHA_GRADIENTS}


def multi_head_attention_vjp_exact(
    query: Any,
    key: Any,
    value: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    mask: Any = None,
    *,
    fully_masked: str = "nan",
    dps: int = DEFAULT_DPS,
) -> dict[str, np.ndarray]:
    """The VJP of multi-head attention; exact tier (mpmath at ``dps`` digits, each result rounded once to float64).

    Paper: §3.2.2. Same definition, layout, choices and shapes as :func:`multi_head_attention_vjp`.
    """
    given, shapes, h, visible, d_out = _mha_vjp_inputs(query, key, value, params, num_heads, d_out, mask, fully_masked)
    ins = {name: to_mp(a) for name, a in given.items()}
    dm = to_mp(d_out)

    def compute() -> np.ndarray:
        grads = _mha_vjp(ins, h, visible, fully_masked, dm, mp_matmul, _attention_mp, _attention_vjp_mp)
        for name in ("query", "key", "value"):
            grads[name] = _unbroadcast(grads[name], shapes[name])
        return np.concatenate([np.asarray(grads[n], dtype=object).reshape(-1) for n in MHA_GRADIENTS])

    flat = correctly_rounded(compute, dps)
    out, start = {}, 0
    for name in MHA_GRADIENTS:
        size = int(np.prod(shapes[name]))
        out[name] = flat[start : start + size].reshape(shapes[name])
        start += size
    return out


__all__ = [
    "FULLY_MASKED_POLICIES",
    "MHA_GRADIENTS",
    "causal_mask",
    "multi_head_attention",
    "multi_head_attention_exact",
    "multi_head_attention_vjp",
    "multi_head_attention_vjp_exact",
    "padding_mask",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_exact",
    "scaled_dot_product_attention_vjp",
    "scaled_dot_product_attention_vjp_exact",
    "softmax",
    "softmax_exact",
    "softmax_vjp",
    "softmax_vjp_exact",
]
