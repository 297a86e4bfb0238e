"""Hypothesis strategies for the conformance suite: small shapes, magnitudes that matter.

Every strategy returns the keyword arguments of one check (``conformance/checks``) as float64 /
int64 / bool NumPy arrays and Python scalars. The arrays are drawn in float64; the check rounds
them to the implementation's dtype through its own ``from_numpy``. Sizes stay small (the whole
suite runs in about a minute on two cores), and edge cases are built, never filtered for:
near-constant rows, large logits, masked and fully masked rows, -inf scores, exact shifts.

How many examples each test draws is the active aiayn profile's (``conformance/inputs/profiles.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import types
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.conformance.budgets import forward as B
from aiayn.conformance.budgets.composites import forward as PR
from aiayn.conformance.inputs.fixed import beam_model
from aiayn.conformance.numerics import gamma, precision, round_to
from aiayn.implementations.protocol import DEFAULT_POLICIES, FULL_SCOPE, Scope, scope_of

__all__ = [
    "FEW_SHAPES",
    "attention_inputs",
    "common_component",
    "cotangent",
    "defined_gradients",
    "causal_perturbation",
    "attention_across_tiles",
    "mha_across_tiles",
    "TILE_LENGTHS",
    "adam_inputs",
    "checkpoint_inputs",
    "dropout_draws",
    "dropout_inputs",
    "cross_entropy_inputs",
    "decoder_inputs",
    "encoder_inputs",
    "exact_shift",
    "ffn_inputs",
    "few_shapes",
    "forward_inputs",
    "keep_pattern",
    "label_smoothing_inputs",
    "layer_norm_inputs",
    "logit_scale_cap",
    "lrate_inputs",
    "mha_fully_masked_self_attention",
    "mha_inputs",
    "paged_inputs",
    "pe_inputs",
    "resolvable_level",
    "score_error_bound",
    "softmax_inputs",
    "split_inputs",
    "states_inputs",
]


# --------------------------------------------------------------------------------------------
# the implementation's declared scope (implementations/protocol.py, Scope): draw only inside it


def scope(impl: Any, equation: str) -> Scope:
    """The scope ``impl`` declares for ``equation`` (the full domain when it declares none)."""
    return scope_of(impl, equation)


def min_classes(impl: Any) -> int:
    """The fewest classes label smoothing can take under the declared policy: 3 for "K-2" (a padding class), else 2."""
    policies = getattr(impl, "policies", {})
    return 3 if isinstance(policies, Mapping) and policies.get("label_smoothing") == "K-2" else 2


# --------------------------------------------------------------------------------------------
# sizes: drawn, or a few per run for an implementation that compiles per shape

#: How many sets of sizes each strategy draws from in a run, for an implementation that declares
#: ``compiles_per_shape = True`` (a library that compiles each new input shape pays about this many
#: compiles per strategy, instead of one per example and per shrink step).
FEW_SHAPES = 4
_FEW: contextvars.ContextVar[int | None] = contextvars.ContextVar("aiayn_few_shapes", default=None)
T = TypeVar("T")


@contextlib.contextmanager
def few_shapes(salt: int | None) -> Iterator[None]:
    """Inside: every strategy takes its sizes from one of :data:`FEW_SHAPES` sets, fixed for the run by ``salt``
    (None: sizes drawn as usual). Values, masks' kinds and the other choices are still drawn; Hypothesis draws,
    and shrinks, the set's index."""
    token = _FEW.set(salt)
    try:
        yield
    finally:
        _FEW.reset(token)


class _Sizes:
    """Where a strategy's sizes (lengths, widths, batch shapes, heads, axes) come from.

    Drawn by Hypothesis; or, inside :func:`few_shapes`, from a generator seeded by the strategy's name, the set's
    index (drawn, in [0, FEW_SHAPES)) and the run's salt, so the same index gives the same sizes all run long.
    Outside :func:`few_shapes` it draws exactly what a direct ``draw`` would.
    """

    def __init__(self, draw: Any, name: str, rng: np.random.Generator | None = None) -> None:
        self.draw = draw
        self.rng = rng
        salt = _FEW.get()
        if rng is None and salt is not None:
            index = draw(st.integers(0, FEW_SHAPES - 1))
            self.rng = np.random.default_rng([zlib.crc32(name.encode()), index, salt])

    def within(self, draw: Any) -> _Sizes:
        """The same sizes, for a strategy called from this one (its own ``draw``)."""
        return _Sizes(draw, "", self.rng) if self.rng is not None else _Sizes(draw, "")

    def integers(self, low: int, high: int) -> int:
        if self.rng is None:
            return self.draw(st.integers(low, high))
        return int(self.rng.integers(low, high + 1))

    def sampled_from(self, options: Sequence[T]) -> T:
        if self.rng is None:
            return self.draw(st.sampled_from(options))
        return options[int(self.rng.integers(len(options)))]


def _batch(sizes: _Sizes, scope: Scope, options: list[tuple[int, ...]]) -> tuple[int, ...]:
    """A batch shape among ``options`` whose number of dimensions the scope accepts (its own shapes if none does)."""
    if scope.batch_dims is not None:
        kept = [b for b in options if len(b) in scope.batch_dims]
        options = kept or [tuple([2] * d) for d in scope.batch_dims]
    return sizes.sampled_from(options)


def _length(sizes: _Sizes, scope: Scope, low: int, high: int) -> int:
    """A sequence length in [low, high], at most the scope's ``max_length``."""
    if scope.max_length is not None:
        high = max(low, min(high, scope.max_length))
    return sizes.integers(low, high)


def _floats(scale: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=-scale, max_value=scale, allow_nan=False, allow_infinity=False)


def _array(draw: Any, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """An array drawn element by element (edge values, shrinkable): for the inputs of an equation."""
    return draw(hnp.arrays(np.float64, shape, elements=_floats(scale)))


def _weights(draw: Any, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Uniform(-scale, scale) weights from a drawn seed: weight matrices are data, not edge cases, and this is fast."""
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(-scale, scale, shape)


# --------------------------------------------------------------------------------------------
# conditioning: inputs the dtype can resolve (conformance/report/coverage.py)
#
# A budget is a theorem with hypotheses; inputs that break them are counted as not checked.
# These caps keep drawn inputs inside what a dtype can resolve, so that nearly every element is
# checked. Each is derived from the budget it serves, with a margin of at least 2.


def logit_scale_cap(dtype: str, d_k: int) -> float:
    """The largest scale of q and k (elements in [-scale, scale]) whose scores a dtype resolves.

    A computed score q.k / sqrt(d_k) may be off by D ~ gamma_{d_k+4}(u) |q||k| / sqrt(d_k) <=
    (d_k + 4) u scale^2 sqrt(d_k) (budgets.forward.attention_core); the softmax weights then move by
    up to e^{2D}. Keeping D <= 1/4 keeps the bound informative: scale <= sqrt(1 / (4 (d_k + 4) u sqrt(d_k))).
    Above it (bfloat16 with |scores| of tens) no implementation in the dtype resolves the weights.
    """
    u = precision(dtype).u
    return float(np.sqrt(1.0 / (4.0 * (d_k + 4) * u * np.sqrt(d_k))))


def resolvable_level(dtype: str, d: int, spread: float) -> float:
    """The largest |mean| of a row of length ``d`` with this spread that LayerNorm in ``dtype`` resolves.

    The mean of a row at level L is off by ~ (d + 1) u L and the centred values by as much, so
    sigma's error is ~ 2 (d + 1) u L (budgets.forward.layer_norm, beta); the bound needs it below sigma.
    A row with two elements pinned at +-spread has sigma >= spread sqrt(2 / d); requiring
    2 (d + 1) u L <= sigma / 8 gives L <= spread sqrt(2 / d) / (16 (d + 1) u).
    """
    u = precision(dtype).u
    return float(spread * np.sqrt(2.0 / d) / (16.0 * (d + 1) * u))


#: The largest a-priori score error D (see :func:`score_error_bound`) a composite's attention may carry.
#: The softmax bound (``budgets.forward._softmax_weight_factor``) is finite while R = e^{2D} sum_j p_j rho_j
#: < 1, rho_j ~ expm1(u (gap_j + 2D)). As p_j <= e^{-gap_j}, each term p_j rho_j is at most about
#: u (2D + 1), so R <~ e^{2D} n_k u (2D + 1): with D <= 1, n_k <= 5 keys (the strategies' lengths)
#: and bfloat16 (u = 2^-8), 0.43 < 1. Without the cap a layer's self-attention reached D ~ 2 to 3
#: in bfloat16 and its bound became infinite (measured: 9 of 400 drawn decoder layers).
SCORE_ERROR_CAP = 1.0


def score_error_bound(attn: Mapping[str, Any], radius_q: float, radius_kv: float, num_heads: int, dtype: str) -> float:
    """A bound on the score error D of ``budgets.forward.attention_core`` in a multi-head attention, for every input it
    may see.

    ``radius_q`` and ``radius_kv`` bound the 2-norm of every query and key row. By Cauchy-Schwarz,
    column i of Q = query W^Q + b_Q has |Q_i| <= radius ||W^Q[:, i]||_2 + |b_i| =: Q_i, and its
    rounding error (``budgets.forward._affine``) at most gamma_{d+2} Q_i + (d + 2) eta =: eQ_i (the same
    for K). The score error of head j is then at most ``budgets.forward.score_error`` of those magnitudes
    (the bound of ``budgets.forward.attention_core``, monotone in them); the bound is the largest over the heads.
    """
    u = precision(dtype)
    d = attn["w_q"].shape[0]
    d_k = d // int(num_heads)

    def reach(w: np.ndarray, b: np.ndarray | None, radius: float) -> tuple[np.ndarray, np.ndarray]:
        mag = radius * np.linalg.norm(w, axis=0) + (0.0 if b is None else np.abs(b))
        return mag, gamma(d + 2, u.op) * mag + (d + 2) * u.eta

    q, e_q = reach(attn["w_q"], attn.get("b_q"), radius_q)
    k, e_k = reach(attn["w_k"], attn.get("b_k"), radius_kv)
    heads = [a.reshape(int(num_heads), 1, d_k) for a in (q, e_q, k, e_k)]  # one query and one key row per head
    return float(np.max(B.score_error(*heads, u)))


def softmax_length_cap(dtype: str, score_error: float) -> int:
    """The most keys whose softmax weights a dtype resolves when each score may be off by D = ``score_error``.

    The softmax bound is finite while R ~ e^{2D} n_k u (2D + 1) < 1 (:data:`SCORE_ERROR_CAP`); a margin of 2 gives
    n_k <= 1 / (2 e^{2D} u (2D + 1)). Longer rows are where the bound no longer applies: their elements would count
    "not checked". bfloat16 with D <= 1/4 (:func:`logit_scale_cap`): 51 keys; float16: 414.
    """
    u = precision(dtype).u
    return int(1.0 / (2.0 * np.exp(2.0 * score_error) * u * (2.0 * score_error + 1.0)))


def condition_attention(
    attn: dict[str, Any], radius_q: float, radius_kv: float, num_heads: int, dtype: str
) -> dict[str, Any]:
    """``attn`` with W^Q, b_Q, W^K, b_K scaled by one factor c <= 1.

    The factor makes :func:`score_error_bound` <= :data:`SCORE_ERROR_CAP`.
    D scales with c^2 (every term is a product of a Q-side and a K-side factor) but for its eta
    terms, which do not scale (below 1e-38 but in float16, where eta = 2^-24 makes them ~1e-6);
    c = 0.99 sqrt(cap / D) leaves room for them and for the rounding of the weights to the dtype
    (norms move by a factor (1 + u)). A weight scale is a choice of the test (``init_params``
    draws one); the model's equations are unchanged, only its scores are smaller in low precision.
    """
    bound = score_error_bound(attn, radius_q, radius_kv, num_heads, dtype)
    if bound <= SCORE_ERROR_CAP:
        return attn
    c = 0.99 * float(np.sqrt(SCORE_ERROR_CAP / bound))
    return {
        name: (value * c if name in ("w_q", "b_q", "w_k", "b_k") and value is not None else value)
        for name, value in attn.items()
    }


def _row_radius(*arrays: np.ndarray) -> float:
    """The largest 2-norm of a row (last axis) of any of ``arrays``."""
    return max(float(np.max(np.linalg.norm(a, axis=-1), initial=0.0)) for a in arrays)


def _norm_radius(norm: Mapping[str, np.ndarray]) -> float:
    """A bound on the 2-norm of a LayerNorm output row: ||g x_hat + b|| <= max|g| sqrt(d) + ||b||
    (||x_hat|| <= sqrt(d))."""
    gain = np.asarray(norm["gain"])
    return float(np.max(np.abs(gain)) * np.sqrt(gain.shape[-1]) + np.linalg.norm(norm["bias"]))


def _pin_spread(draw: Any, z: np.ndarray) -> np.ndarray:
    """``z`` (rows, d) in [-1, 1] with one element of each row set to -1 and another to +1 (d >= 2).

    Hypothesis shrinks arrays towards equal elements; a constant row has sigma = 0, where a
    LayerNorm in low precision is decided by rounding alone (no bound applies). Pinning two
    elements keeps every row's spread.
    """
    z = np.array(z, dtype=np.float64)
    d = z.shape[-1]
    if d >= 2:
        lo = draw(st.integers(0, d - 1))
        hi = (lo + draw(st.integers(1, d - 1))) % d
        z[..., lo], z[..., hi] = -1.0, 1.0
    return z


# --------------------------------------------------------------------------------------------
# §3.2.1 softmax


@st.composite
def softmax_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """x of shape (rows..., n) and an axis: random, near-constant, large (|x| up to 1e4), or with -inf entries."""
    sizes = _Sizes(draw, "softmax_inputs")
    ndims = [1, 2, 3] if scope.batch_dims is None else [b + 1 for b in scope.batch_dims]
    ndim = sizes.sampled_from(ndims)
    shape = tuple(_length(sizes, scope, 1, 7) if i == ndim - 1 else sizes.integers(1, 3) for i in range(ndim))
    kind = draw(st.sampled_from(["random", "near_constant", "large", "masked"]))
    if kind == "near_constant":
        x = draw(_floats(100.0)) + _array(draw, shape, 1e-6)
    elif kind == "large":
        x = _array(draw, shape, 1e4)
    else:
        x = _array(draw, shape, 10.0)
    if kind == "masked":
        hide = draw(hnp.arrays(np.bool_, shape))
        x = np.where(hide, -np.inf, x)
    return {"x": x, "axis": sizes.integers(-len(shape), len(shape) - 1)}


def exact_shift(
    dtype: str, shape: tuple[int, ...], *, pin_rows: bool = False
) -> st.SearchStrategy[tuple[np.ndarray, float]]:
    """(x, c) with x and x + c both exact in ``dtype``: multiples of g = 2^(6 - p), |x| <= 16, |c| <= 32.

    |x + c| <= 48 < 64 = g 2^p, so every value is an integer multiple of g below 2^p g: representable.
    ``pin_rows``: each row (last axis, length >= 2) holds -16 and +16, so that no row is constant
    (see ``_pin_spread``: a LayerNorm of a constant row in low precision has no bound).
    """
    p = precision(dtype).p
    g = 2.0 ** (6 - p)
    xs = hnp.arrays(np.int64, shape, elements=st.integers(-(2 ** (p - 2)), 2 ** (p - 2)))
    if pin_rows and shape[-1] >= 2:
        xs = xs.map(
            lambda a: np.concatenate(
                [np.full((*a.shape[:-1], 1), -(2 ** (p - 2))), np.full((*a.shape[:-1], 1), 2 ** (p - 2)), a[..., 2:]],
                axis=-1,
            )
        )
    cs = st.integers(-(2 ** (p - 1)), 2 ** (p - 1))
    return st.tuples(xs, cs).map(lambda t: (t[0].astype(np.float64) * g, float(t[1]) * g))


# --------------------------------------------------------------------------------------------
# §3.2.1 Eq. (1) and §3.2.3 masks


def _mask_kind(draw: Any, scope: Scope, n_q: int, n_k: int) -> str:
    """One of the mask kinds the scope accepts (``Scope.masks``): none, random, padding, causal (needs n_k >= n_q)."""
    kinds = [k for k in ("none", "random", "padding", "causal") if k in scope.masks and (k != "causal" or n_k >= n_q)]
    return draw(st.sampled_from(kinds or ["none"]))


def _causal(n_q: int, n_k: int) -> np.ndarray:
    """The causal mask (§3.2.3) of n_q queries over n_k keys, aligned at the end (the queries are the last n_q)."""
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


@st.composite
def _mask(
    draw: Any, batch: tuple[int, ...], n_q: int, n_k: int, *, allow_fully_masked: bool = True, scope: Scope = FULL_SCOPE
) -> np.ndarray | None:
    """None, causal (end-aligned), padding (B, 1, n_k) or random (possibly fully masked rows).

    For scores (*batch, n_q, n_k). Only the kinds the scope accepts (``Scope.masks``); "causal" needs n_k >= n_q.
    """
    kind = _mask_kind(draw, scope, n_q, n_k)
    if kind in ("none", "causal"):
        return None if kind == "none" else _causal(n_q, n_k)
    if kind == "padding":
        b = batch[0] if batch else 1
        low = 0 if allow_fully_masked else 1
        lengths = np.array(draw(st.lists(st.integers(low, n_k), min_size=b, max_size=b)))
        m = np.arange(n_k)[None, :] < lengths[:, None]  # (B, n_k)
        if not batch:
            return m[0][None, :]  # (1, n_k)
        return m.reshape(b, *([1] * len(batch)), n_k)  # (B, 1, ..., 1, n_k): key axis, broadcast over queries
    m = draw(hnp.arrays(np.bool_, (*batch, n_q, n_k)))
    if not allow_fully_masked:
        m[..., 0] = True
    return m


@st.composite
def attention_inputs(
    draw: Any,
    dtype: str,
    *,
    batch: tuple[int, ...] | None = None,
    mask: bool = True,
    max_n: int = 5,
    max_d: int = 6,
    scope: Scope = FULL_SCOPE,
) -> dict[str, Any]:
    """q, k, v (scales 1, 4 or 30: up to saturated softmax rows) and a mask, inside the scope.

    ``scope.self_attention_only``: n_k = n_q; masks of the accepted kinds only (a scope that
    accepts only the causal mask always gets it).
    """
    sizes = _Sizes(draw, "attention_inputs")
    if batch is None:
        batch = _batch(sizes, scope, [(), (2,), (2, 1)])
    n_q = _length(sizes, scope, 1, max_n)
    n_k = n_q if scope.self_attention_only else _length(sizes, scope, 1, max_n)
    d_k, d_v = sizes.integers(1, max_d), sizes.integers(1, max_d)
    scale = min(draw(st.sampled_from([1.0, 4.0, 30.0])), logit_scale_cap(dtype, d_k))
    q, k = _array(draw, (*batch, n_q, d_k), scale), _array(draw, (*batch, n_k, d_k), scale)
    v = _array(draw, (*batch, n_k, d_v), 10.0)
    m = draw(_mask(batch, n_q, n_k, scope=scope)) if mask else None
    return {"q": q, "k": k, "v": v, "mask": m}


@st.composite
def split_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """Eq. (1)'s q, k, v and mask (:func:`attention_inputs`, up to 9 keys) and ``edges``, the cut points of the keys
    into 1 to 4 blocks (0 = e_0 <= ... <= e_P = n_k: a repeated point is an empty block). Where the scope accepts
    random masks, a block may be hidden from some queries entirely (a fully masked block)."""
    args = draw(attention_inputs(dtype, max_n=9, scope=scope))
    n_k = args["k"].shape[-2]
    cuts = sorted(draw(st.lists(st.integers(0, n_k), max_size=3)))
    edges = (0, *cuts, n_k)
    if "random" in scope.masks and len(edges) > 2 and draw(st.booleans()):
        p = draw(st.integers(0, len(edges) - 2))
        shape = (*args["q"].shape[:-1], n_k)
        mask = np.ones(shape, dtype=bool) if args["mask"] is None else np.array(np.broadcast_to(args["mask"], shape))
        hidden = draw(hnp.arrays(np.bool_, shape[:-1]))  # the queries the block is hidden from
        mask[..., edges[p] : edges[p + 1]] &= ~hidden[..., None]
        args["mask"] = mask
    return {**args, "edges": edges}


@st.composite
def states_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """Partial states of 1 to 4 blocks to merge: outs (P, *batch, n_q, d_v) of magnitude up to 10 and lses
    (P, *batch, n_q) around a drawn offset (0, +-12, +-100: exp(100) overflows float32, so only a max-shifted merge
    survives it; +-1e4 in float64) with spreads up to 40, some -inf (an empty block; a query may have none alive)."""
    sizes = _Sizes(draw, "states_inputs")
    batch = _batch(sizes, scope, [(), (2,)])
    n_blocks, n_q, d_v = sizes.integers(1, 4), _length(sizes, scope, 1, 4), sizes.integers(1, 5)
    outs = _array(draw, (n_blocks, *batch, n_q, d_v), 10.0)
    offsets = [0.0, 12.0, -12.0, 100.0, -100.0] + ([1e4, -1e4] if dtype == "float64" else [])
    offset = draw(st.sampled_from(offsets))
    spread = draw(st.sampled_from([0.0, 1.0, 5.0, 40.0]))
    shape = (n_blocks, *batch, n_q)
    lses = offset + (_array(draw, shape, spread) if spread else np.zeros(shape))
    empty = draw(hnp.arrays(np.bool_, lses.shape)) & draw(st.booleans())
    return {"outs": outs, "lses": np.where(empty, -np.inf, lses)}


#: What the slots of a paged cache that no sentence owns hold: NaN, or a huge finite value (representable in every
#: dtype), so that reading one shows.
PAGE_POISON: tuple[float, ...] = (float("nan"), 1.0e4, -1.0e4)


@st.composite
def paged_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """A batch of B sentences' queries and their paged cache: q (B, n_q, d_k), k_pages and v_pages (N, page, d) in a
    drawn physical order with up to 2 pages no sentence owns, block_table (B, M) and lengths (B,) in [1, M page].
    Every slot past a sentence's length, and every page in no table, holds a drawn poison (:data:`PAGE_POISON`)."""
    sizes = _Sizes(draw, "paged_inputs")
    b = sizes.integers(1, 3)
    args = draw(attention_inputs(dtype, batch=(b,), mask=False, max_n=9, scope=scope))
    q, k, v = args["q"], args["k"], args["v"]  # (B, n_q, d_k), (B, n_k, d_k), (B, n_k, d_v)
    n_k = k.shape[-2]
    page = sizes.sampled_from([1, 2, 4, 16])
    m = -(-n_k // page)  # pages per sentence
    lengths = np.array([sizes.integers(1, n_k) for _ in range(b)], dtype=np.int64)
    spare = sizes.integers(0, 2)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    order = rng.permutation(b * m + spare)
    table = order[: b * m].reshape(b, m).astype(np.int64)
    poison = draw(st.sampled_from(PAGE_POISON))
    k_pages = np.full((b * m + spare, page, k.shape[-1]), poison)
    v_pages = np.full((b * m + spare, page, v.shape[-1]), poison)
    for s, n in enumerate(lengths):
        t = np.arange(n)
        k_pages[table[s, t // page], t % page] = k[s, :n]
        v_pages[table[s, t // page], t % page] = v[s, :n]
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "block_table": table, "lengths": lengths}


#: Lengths around the tile sizes of attention kernels: one below, at and one above each multiple of 16, 32, 64, 96
#: and 128 up to 129 (the powers of two 16, 32, 64 and 128 among them), where a kernel's last partial tile, or a
#: reduction split across tiles, begins.
TILE_LENGTHS: tuple[int, ...] = tuple(sorted({n + e for n in (16, 32, 64, 96, 128) for e in (-1, 0, 1)}))


def _tile_length(sizes: _Sizes, scope: Scope, upto: int) -> int:
    """A length of :data:`TILE_LENGTHS` up to ``upto`` and the scope's ``max_length`` (none fits: one of 1 to 5)."""
    fits = [n for n in TILE_LENGTHS if n <= upto and (scope.max_length is None or n <= scope.max_length)]
    return sizes.sampled_from(fits) if fits else _length(sizes, scope, 1, 5)


def _seeded_mask(
    draw: Any, rng: np.random.Generator, batch: tuple[int, ...], n_q: int, n_k: int, scope: Scope
) -> np.ndarray | None:
    """A mask of the kinds the scope accepts for long sequences: none, causal (end-aligned), padding (a length per
    batch element in [1, n_k]) or random (from ``rng``: too many entries to draw one by one; every row keeps a
    key)."""
    kind = _mask_kind(draw, scope, n_q, n_k)
    if kind in ("none", "causal"):
        return None if kind == "none" else _causal(n_q, n_k)
    if kind == "padding":
        lengths = rng.integers(1, n_k + 1, size=batch[:1] or (1,))
        m = np.arange(n_k)[None, :] < lengths[:, None]  # (B, n_k)
        return m.reshape(len(lengths), *([1] * len(batch)), n_k) if batch else m
    m = rng.random((*batch, n_q, n_k)) < 0.7
    m[..., rng.integers(0, n_k)] = True
    return m


@st.composite
def attention_across_tiles(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """q, k, v whose lengths cross the tile sizes of attention kernels (:data:`TILE_LENGTHS`, each of n_q and n_k,
    within the scope's ``max_length``), d_k and d_v in 1..8, drawn from a seed (uniform at scales 1 or 4; too many
    elements to draw one by one), and a mask of the accepted kinds (:func:`_seeded_mask`). Lengths stop at
    :func:`softmax_length_cap` (bfloat16: 51)."""
    sizes = _Sizes(draw, "attention_across_tiles")
    batch = _batch(sizes, scope, [(), (2,)])
    upto = min(TILE_LENGTHS[-1], softmax_length_cap(dtype, 0.25))  # scores within 1/4: logit_scale_cap
    n_q = _tile_length(sizes, scope, upto)
    n_k = n_q if scope.self_attention_only else _tile_length(sizes, scope, upto)
    d_k, d_v = sizes.integers(1, 8), sizes.integers(1, 8)
    scale = min(draw(st.sampled_from([1.0, 4.0])), logit_scale_cap(dtype, d_k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, k = rng.uniform(-scale, scale, (*batch, n_q, d_k)), rng.uniform(-scale, scale, (*batch, n_k, d_k))
    v = rng.uniform(-10.0, 10.0, (*batch, n_k, d_v))
    return {"q": q, "k": k, "v": v, "mask": _seeded_mask(draw, rng, batch, n_q, n_k, scope)}


@st.composite
def mha_across_tiles(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """Self- or cross-attention whose lengths cross tile sizes (:data:`TILE_LENGTHS` up to 33), as many heads as
    query positions on half the draws (a square: a layout that swaps heads and positions keeps every shape), d_k 1
    or 2; weights ~ 1/sqrt(d_model) (W^Q and W^K scaled down where the scores' error would pass
    :data:`SCORE_ERROR_CAP`: :func:`condition_attention`) and inputs from a seed; lengths stop at
    :func:`softmax_length_cap` (float16: 46; bfloat16: 5, so no tile length)."""
    sizes = _Sizes(draw, "mha_across_tiles")
    upto = min(33, softmax_length_cap(dtype, SCORE_ERROR_CAP))  # scores within the cap: condition_attention
    n_q = _tile_length(sizes, scope, upto)
    n_k = n_q if scope.self_attention_only else _tile_length(sizes, scope, upto)
    h = n_q if draw(st.booleans()) else sizes.integers(1, 3)
    d_k = sizes.integers(1, 2)
    d_model = h * d_k
    batch = _batch(sizes, scope, [(), (2,)])
    w = 1.5 / np.sqrt(d_model)
    params = {name: _weights(draw, (d_model, d_model), w) for name in ("w_q", "w_k", "w_v", "w_o")}
    if "attention" not in scope.no_bias and draw(st.booleans()):
        params.update({name: _weights(draw, (d_model,), 0.5) for name in ("b_q", "b_k", "b_v", "b_o")})
    scale = min(3.0, logit_scale_cap(dtype, d_k) / 1.5)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    query = rng.uniform(-scale, scale, (*batch, n_q, d_model))
    self_attention = scope.self_attention_only or (n_q == n_k and draw(st.booleans()))
    key = query if self_attention else rng.uniform(-scale, scale, (*batch, n_k, d_model))
    value = key if scope.self_attention_only or scope.shared_key_value else rng.uniform(-scale, scale, key.shape)
    mask = _seeded_mask(draw, rng, batch, n_q, n_k, scope)
    params = condition_attention(params, _row_radius(query), _row_radius(key), h, dtype)
    return {"query": query, "key": key, "value": value, "params": params, "num_heads": h, "mask": mask}


@st.composite
def keep_pattern(draw: Any, n_k: int) -> np.ndarray:
    """Which keys stay visible: at least one kept and (when n_k > 1) at least one masked."""
    keep = draw(hnp.arrays(np.bool_, (n_k,)))
    keep[draw(st.integers(0, n_k - 1))] = True
    if n_k > 1 and keep.all():
        keep[draw(st.integers(0, n_k - 1))] = False
        if not keep.any():
            keep[0] = True
    return keep


@st.composite
def causal_perturbation(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """q, k, v of one length n >= 2 and copies that differ only after position ``upto``."""
    sizes = _Sizes(draw, "causal_perturbation")
    n = _length(sizes, scope, 2, 5)
    d_k, d_v = sizes.integers(1, 5), sizes.integers(1, 5)
    batch = _batch(sizes, scope, [(), (2,)])
    upto = draw(st.integers(0, n - 2))
    q, k, v = (_array(draw, (*batch, n, d), 4.0) for d in (d_k, d_k, d_v))
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a, d in ((q2, d_k), (k2, d_k), (v2, d_v)):
        a[..., upto + 1 :, :] = _array(draw, (*batch, n - upto - 1, d), 4.0) + 5.0  # shifted: surely different
    return {"q": q, "k": k, "v": v, "upto": upto, "q2": q2, "k2": k2, "v2": v2}


# --------------------------------------------------------------------------------------------
# §3.2.2 multi-head attention


@st.composite
def mha_inputs(
    draw: Any, dtype: str, *, min_heads: int = 1, fully_masked: bool = True, scope: Scope = FULL_SCOPE
) -> dict[str, Any]:
    """The paper's shapes (§3.2.2): d_k = d_v = d_model / h; weights ~ 1/sqrt(d_model); optional biases.

    Fully masked query rows (with ``fully_masked``) are drawn for cross-attention only;
    :func:`mha_fully_masked_self_attention` draws them for self-attention, in a test of their own
    (fused self-attention kernels treat them differently, see ``implementations/torch_nn.py``).
    """
    sizes = _Sizes(draw, "mha_inputs")
    h = sizes.integers(min_heads, 3)
    d_k = sizes.integers(1, 3)
    d_model = h * d_k
    n_q = _length(sizes, scope, 1, 4)
    n_k = n_q if scope.self_attention_only else _length(sizes, scope, 1, 4)
    batch = _batch(sizes, scope, [(), (2,)])
    w = 1.5 / np.sqrt(d_model)
    params = {name: _weights(draw, (d_model, d_model), w) for name in ("w_q", "w_k", "w_v", "w_o")}
    if "attention" not in scope.no_bias and draw(st.booleans()):
        params.update({name: _weights(draw, (d_model,), 0.5) for name in ("b_q", "b_k", "b_v", "b_o")})
    # the projections q = query W^Q carry the inputs' scale times ~1.5 (the weights' sum): keep their
    # scores resolvable in the dtype (logit_scale_cap), at most the 3.0 of float32/float64
    scale = min(3.0, logit_scale_cap(dtype, d_k) / 1.5)
    query = _array(draw, (*batch, n_q, d_model), scale)
    self_attention = scope.self_attention_only or draw(st.booleans())
    key = query if self_attention and n_q == n_k else _array(draw, (*batch, n_k, d_model), scale)
    value = (
        key
        if scope.self_attention_only or scope.shared_key_value or draw(st.booleans())
        else _array(draw, (*batch, n_k, d_model), scale)
    )
    mask = draw(_mask(batch, n_q, n_k, allow_fully_masked=fully_masked and key is not query, scope=scope))
    return {"query": query, "key": key, "value": value, "params": params, "num_heads": h, "mask": mask}


@st.composite
def mha_fully_masked_self_attention(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """Self-attention (query is key is value) over a batch of 2 with 2 heads, one query row fully masked.

    The shape every fused self-attention kernel accepts (batched, an even number of heads, one
    tensor for query, key and value), so that the declared ``fully_masked`` policy is checked on
    the path such kernels take.
    """
    sizes = _Sizes(draw, "mha_fully_masked_self_attention")
    h, d_k, n = 2, sizes.integers(1, 3), sizes.integers(2, 4)
    d_model = h * d_k
    w = 1.5 / np.sqrt(d_model)
    params = {name: _weights(draw, (d_model, d_model), w) for name in ("w_q", "w_k", "w_v", "w_o")}
    if "attention" not in scope.no_bias and draw(st.booleans()):
        params.update({name: _weights(draw, (d_model,), 0.5) for name in ("b_q", "b_k", "b_v", "b_o")})
    x = _array(draw, (2, n, d_model), min(3.0, logit_scale_cap(dtype, d_k) / 1.5))
    mask = draw(hnp.arrays(np.bool_, (2, n, n)))
    mask[..., 0] = True
    mask[draw(st.integers(0, 1)), draw(st.integers(0, n - 1)), :] = False
    return {"query": x, "key": x, "value": x, "params": params, "num_heads": h, "mask": mask}


# --------------------------------------------------------------------------------------------
# §3.5 positional encoding


@st.composite
def pe_inputs(draw: Any, dtype: str, *, min_length: int = 0, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """length 0..64 (at most the scope's max_length) and an even d_model 2..32."""
    sizes = _Sizes(draw, "pe_inputs")
    return {"length": _length(sizes, scope, min_length, 64), "d_model": 2 * sizes.integers(1, 16)}


# --------------------------------------------------------------------------------------------
# §3.1 LayerNorm, §3.3 FFN


@st.composite
def layer_norm_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE, min_d: int = 1) -> dict[str, Any]:
    """x (rows, d), gain ~ 1, bias ~ 0 (both not exactly), eps from 1e-6 to 0.25; rows random, offset or near-constant.

    Every row of length >= 2 keeps a spread (``_pin_spread``). Offset rows sit at a level of up to
    1e3 times their spread, capped at what the dtype resolves (:func:`resolvable_level`: in
    bfloat16 about 1, in float16 about 8, in float32 and float64 the full 1e3). Near-constant
    rows have a spread of max(2^(-p/2), 32 d u) relative to their level, so the condition
    kappa = rms(x)/sigma is as large as the dtype can still resolve.
    """
    sizes = _Sizes(draw, "layer_norm_inputs")
    rows, d = sizes.integers(1, 3), sizes.integers(min_d, 12)
    kind = draw(st.sampled_from(["random", "offset", "near_constant"]))
    prec = precision(dtype)
    z = _pin_spread(draw, _array(draw, (rows, d), 1.0))
    if kind == "random":
        x = 10.0 * z
    elif kind == "offset":
        level = min(draw(st.sampled_from([1e3, 37.0])), resolvable_level(dtype, d, 2.0)) * draw(
            st.sampled_from([-1.0, 1.0])
        )
        x = level + 2.0 * z
    else:
        level = draw(st.floats(1.0, 100.0)) * draw(st.sampled_from([-1.0, 1.0]))
        spread = abs(level) * max(2.0 ** (-prec.p / 2), 32 * d * prec.u)
        x = level + spread * z
    gain = 1.0 + _array(draw, (d,), 0.5)
    bias = np.zeros(d) if "layer_norm" in scope.no_bias else _array(draw, (d,), 1.0)
    eps = scope.layer_norm_eps if scope.layer_norm_eps is not None else draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.25]))
    if scope.batch_dims is not None:  # x is (rows, d): one batch dimension; give it as many as the scope accepts
        dims = sizes.sampled_from(list(scope.batch_dims))
        x = x[0] if dims == 0 else x.reshape(*([1] * (dims - 1)), rows, d)
    return {"x": x, "gain": gain, "bias": bias, "eps": eps}


@st.composite
def ffn_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """x (..., n, d_model), W1 (d_model, d_ff), W2 (d_ff, d_model), biases; ReLU active on part of the units."""
    sizes = _Sizes(draw, "ffn_inputs")
    batch = _batch(sizes, scope, [(), (2,)])
    n, d = _length(sizes, scope, 1, 4), sizes.integers(1, 8)
    d_ff = scope.d_ff_ratio * d if scope.d_ff_ratio else sizes.integers(1, 16)
    biased = "ffn" not in scope.no_bias
    return {
        "x": _array(draw, (*batch, n, d), 3.0),
        "w1": _weights(draw, (d, d_ff), 1.5 / np.sqrt(d)),
        "b1": _weights(draw, (d_ff,), 1.0) if biased else np.zeros(d_ff),
        "w2": _weights(draw, (d_ff, d), 1.5 / np.sqrt(d_ff)),
        "b2": _weights(draw, (d,), 1.0) if biased else np.zeros(d),
    }


# --------------------------------------------------------------------------------------------
# §5.3 lrate, §5.4 label smoothing


@st.composite
def lrate_inputs(draw: Any) -> dict[str, Any]:
    """d_model, warmup_steps, and steps around the warmup boundary and far beyond (all >= 1)."""
    d_model = draw(st.sampled_from([1, 2, 64, 512, 1024])) if draw(st.booleans()) else draw(st.integers(1, 4096))
    w = draw(st.sampled_from([1, 2, 4000])) if draw(st.booleans()) else draw(st.integers(1, 10_000))
    special = [1, max(w - 1, 1), w, w + 1, 10**6]
    extra = draw(st.lists(st.integers(1, 3 * w + 3), min_size=1, max_size=4))
    return {"steps": sorted(set(special + extra)), "d_model": d_model, "warmup_steps": w}


@st.composite
def lrate_shape_inputs(draw: Any) -> dict[str, Any]:
    """Steps below and above the warmup boundary, for the shape of the schedule."""
    w = draw(st.sampled_from([1, 2, 10, 4000])) if draw(st.booleans()) else draw(st.integers(1, 10_000))
    rise = sorted(set(draw(st.lists(st.integers(1, w), min_size=1, max_size=4)) + [1, w]))
    decay = sorted(set(draw(st.lists(st.integers(w, 50 * w), min_size=1, max_size=4)) + [w + 1]))
    return {"rise": rise, "decay": decay, "d_model": draw(st.integers(1, 2048)), "warmup_steps": w}


def _moments(draw: Any, shape: tuple[int, ...], low: int, high: int) -> np.ndarray:
    """Signed values spanning magnitudes 10^low .. 10^high, some exactly 0: gradients and first moments, whose
    magnitudes vary over orders across a model's parameters."""
    exponents = draw(hnp.arrays(np.float64, shape, elements=st.floats(low, high)))
    signs = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([-1.0, 1.0])))
    zero = draw(hnp.arrays(np.bool_, shape, elements=st.sampled_from([False, False, False, True])))
    return np.where(zero, 0.0, signs * 10.0**exponents)


@st.composite
def adam_inputs(draw: Any, dtype: str) -> dict[str, Any]:
    """One parameter's Adam step (§5.3): param, grad and m in +-10^-6 .. 10^2 (some 0), v = (something of the same
    range)^2 (some 0); steps 1 (the bias correction's largest), near warmup and far beyond; lr an Eq. (3) value, the
    paper's betas and eps mostly (0.999 and 1e-8 besides: the framework defaults a departure leaves in place; float16
    has ranges of its own, below)."""
    sizes = _Sizes(draw, "adam_inputs")
    shape = sizes.sampled_from([(1,), (4,), (2, 3)])
    # a half precision cannot resolve the first steps' correction 1 - beta2^t (0.02 at t = 1) against its pow's error
    # (4 ulps: 3% of beta2^t in bfloat16) and beta's rounding: from step 100 there
    first = 100 if dtype in ("float16", "bfloat16") else 1
    step = draw(st.sampled_from([first, first + 1, 4000, 100_000]) | st.integers(first, 10**6))
    lr = draw(st.sampled_from([0.0007, 0.001]) | st.floats(1e-6, 1.0))
    # bfloat16 rounds 0.999 to 1.0 (its spacing below 1 is 2^-8): 1 - beta2 = 0 and 1 - beta2^t = 0, no Adam at all
    default = [] if dtype == "bfloat16" else [[0.9, 0.999]]
    betas = draw(st.sampled_from([[0.9, 0.98], [0.9, 0.98], [0.5, 0.9], *default]))
    # float16 resolves neither eps = 1e-9 (below its smallest subnormal, 6e-8: it becomes 0 and a zero second moment
    # divides by 0) nor squares of gradients below 2.4e-4, and holds no update past 65504 (|m_hat| / eps, times lr):
    # there, moments in 10^-2 .. 10 and eps of 10^-3 or more keep |update| <= 10^4
    low, high, epsilons = (-2, 1, [1e-3, 1e-2]) if dtype == "float16" else (-6, 2, [1e-9, 1e-9, 1e-8, 1e-6])
    eps = draw(st.sampled_from(epsilons))
    return {
        "param": _array(draw, shape, 3.0),
        "grad": _moments(draw, shape, low, high),
        "m": _moments(draw, shape, low, high),
        "v": _moments(draw, shape, low, high) ** 2,
        "step": step,
        "lr": lr,
        "betas": betas,
        "eps": eps,
    }


@st.composite
def dropout_inputs(draw: Any, dtype: str) -> dict[str, Any]:
    """x of a few elements (the sub-layer outputs of §5.4), p the paper's 0.1, big EN-DE's 0.3, 0 or drawn below 0.9,
    a seed."""
    sizes = _Sizes(draw, "dropout_inputs")
    shape = sizes.sampled_from([(1,), (2, 3), (4, 8)])
    p = draw(st.sampled_from([0.1, 0.3, 0.0, 0.5]) | st.floats(0.0, 0.9))
    return {"x": _array(draw, shape, 3.0), "p": p, "seed": draw(st.integers(0, 2**32 - 1))}


#: The elements of one statistical check of dropout's mask: 256 x 256. At the false-alarm rate budgets.draws.ALPHA it
#: tells p = 0.11 from the paper's 0.1 with probability 0.9998 (tests/test_draws.py computes it).
DRAW_SHAPE = (256, 256)


@st.composite
def dropout_draws(draw: Any, dtype: str) -> dict[str, Any]:
    """Ones of :data:`DRAW_SHAPE` (y is then 0 exactly where dropped), p the paper's 0.1, 0.3 or drawn in
    [0.01, 0.9], and two distinct seeds."""
    p = draw(st.sampled_from([0.1, 0.3, 0.5]) | st.floats(0.01, 0.9))
    seeds = draw(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2, unique=True))
    return {"x": np.ones(DRAW_SHAPE), "p": p, "seed": seeds[0], "other_seed": seeds[1]}


@st.composite
def checkpoint_inputs(draw: Any, dtype: str) -> dict[str, Any]:
    """Checkpoints of one model (§6.1) at 1-8 distinct steps of 1 to 6 digits, given in a drawn order (a directory
    lists them by name, not by step), each a drift of one set of parameters; n from 1 to their number (5 and 20 in
    the paper)."""
    sizes = _Sizes(draw, "checkpoint_inputs")
    count = sizes.integers(1, 8)
    steps = draw(st.lists(st.integers(1, 999_999), min_size=count, max_size=count, unique=True))
    base = {"w": _array(draw, (2, 3), 3.0), "b": _array(draw, (3,), 1.0)}
    checkpoints = {}
    for s in steps:
        drift = draw(st.sampled_from([0.0, 1e-3, 0.1, 1.0]))
        checkpoints[s] = {name: value + drift * _weights(draw, value.shape, 1.0) for name, value in base.items()}
    return {"checkpoints": checkpoints, "n": draw(st.integers(1, count))}


@st.composite
def label_smoothing_inputs(draw: Any, dtype: str, *, min_classes: int = 2) -> dict[str, Any]:
    """targets (...,) in [0, K), K ``min_classes``..12, eps in [0, 0.5] (0.1 is the paper's)."""
    sizes = _Sizes(draw, "label_smoothing_inputs")
    k = sizes.integers(min_classes, 12)
    shape = sizes.sampled_from([(1,), (3,), (2, 4)])
    targets = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, k - 1)))
    eps = draw(st.sampled_from([0.0, 0.1])) if draw(st.booleans()) else draw(st.floats(0.0, 0.5))
    return {"targets": targets, "vocab_size": k, "eps": eps}


@st.composite
def cross_entropy_inputs(draw: Any, dtype: str, *, min_classes: int = 2) -> dict[str, Any]:
    """logits (..., K) at scales 1, 10 or 100 and targets; eps as in label_smoothing_inputs."""
    sizes = _Sizes(draw, "cross_entropy_inputs")
    k = sizes.integers(min_classes, 12)
    shape = sizes.sampled_from([(1,), (3,), (2, 3)])
    scale = draw(st.sampled_from([1.0, 10.0, 100.0]))
    targets = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, k - 1)))
    eps = draw(st.sampled_from([0.0, 0.1])) if draw(st.booleans()) else draw(st.floats(0.0, 0.5))
    return {"logits": _array(draw, (*shape, k), scale), "targets": targets, "eps": eps}


@st.composite
def cross_entropy_minimum_inputs(draw: Any, dtype: str) -> dict[str, Any]:
    """Targets, K, eps > 0 (so log q is finite), a shift of the logits and a perturbation away from log q."""
    sizes = _Sizes(draw, "cross_entropy_minimum_inputs")
    k = sizes.integers(2, 10)
    shape = sizes.sampled_from([(1,), (3,)])
    targets = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, k - 1)))
    eps = draw(st.sampled_from([0.1, 0.3])) if draw(st.booleans()) else draw(st.floats(0.01, 0.5))
    delta = _array(draw, (*shape, k), 2.0)
    return {"targets": targets, "vocab_size": k, "eps": eps, "shift": draw(_floats(5.0)), "delta": delta}


# --------------------------------------------------------------------------------------------
# §3.1 composites, canonical weights


def _config(n_layers: int, d_model: int, h: int, d_ff: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        n_layers=n_layers, d_model=d_model, d_ff=d_ff, num_heads=h, d_k=d_model // h, d_v=d_model // h
    )


@st.composite
def _sizes(draw: Any, dtype: str, scope: Scope = FULL_SCOPE, outer: _Sizes | None = None) -> tuple[int, int, int]:
    """(d_model, h, d_ff) of a small layer.

    d_model >= 4 in float16 and bfloat16; d_ff = ratio * d_model if the scope fixes it.
    With d_model = 2 every LayerNorm row is two numbers whose difference decides the output's sign;
    inside a layer, where the row is a residual sum, bfloat16 (8 significant bits) and float16 (11)
    leave that difference to rounding often enough that the first-order bound does not apply
    (measured: about 2% of the bfloat16 logits of the whole model; in float16, 5 in 3000 drawn
    decoder layers and 11 in 3000 whole models had such a row). From d_model = 4 on it applies
    (0 in 10,000 of each, with the conditions of ``condition_attention`` and ``_layer_rows``).
    """
    sizes = outer.within(draw) if outer is not None else _Sizes(draw, "")
    h = sizes.sampled_from([1, 2])
    widths = [4] if precision(dtype).p <= 11 and h == 1 else [2, 4]
    d_model = h * sizes.sampled_from(widths)
    return d_model, h, (scope.d_ff_ratio * d_model if scope.d_ff_ratio else sizes.sampled_from([4, 8, 16]))


def _params(
    seed: int, config: types.SimpleNamespace, vocab: int, biases: bool, scope: Scope = FULL_SCOPE
) -> dict[str, Any]:
    """Canonical model weights (``init_params``); attention biases when ``biases`` (and the scope has them), other
    biases zeroed where the scope declares none (``Scope.no_bias``)."""
    from aiayn.reference.model import init_params

    params = init_params(config, vocab, np.random.default_rng(seed), biases=biases and "attention" not in scope.no_bias)
    for layer in (*params["encoder"], *params["decoder"]):
        for name, group in layer.items():
            if name.startswith("norm") and "layer_norm" in scope.no_bias:
                group["bias"] = np.zeros_like(group["bias"])
            if name == "ffn" and "ffn" in scope.no_bias:
                group["b1"], group["b2"] = np.zeros_like(group["b1"]), np.zeros_like(group["b2"])
    return params


def _layer_rows(draw: Any, shape: tuple[int, ...], dtype: str, level: float = 0.0) -> np.ndarray:
    """A layer's input rows: elements in [level - 2, level + 2]; in float16 and bfloat16 every row keeps a spread.

    The first LayerNorm of a layer reads x + Sublayer(x). Hypothesis draws constant rows often (its
    arrays shrink and fill towards equal elements); the sum's spread is then the sublayer's alone,
    which can be small next to its level (measured in bfloat16: about 1 drawn encoder layer in
    3000 had a row with sigma ~ 0.04 at level ~ 1.5), and no bound of LayerNorm applies there
    (``resolvable_level``). Pinning one element of each row to level - 2 and another to level + 2
    (``_pin_spread``) keeps sigma(x) >= 2 sqrt(2 / d_model) >= 1 in the dtypes where this matters
    (d_model <= 8); the wider dtypes resolve such rows and keep every drawn value.
    """
    z = _array(draw, shape, 2.0)
    if precision(dtype).p <= 11:
        z = 2.0 * _pin_spread(draw, z / 2.0)
    return z + level


@st.composite
def encoder_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """x (B, n, d_model), one encoder layer's canonical weights, an optional padding mask (lengths >= 1; if the scope
    accepts padding)."""
    sizes = _Sizes(draw, "encoder_inputs")
    d_model, h, d_ff = draw(_sizes(dtype, scope, sizes))
    layer = _params(draw(st.integers(0, 2**32 - 1)), _config(1, d_model, h, d_ff), 2, draw(st.booleans()), scope)[
        "encoder"
    ][0]
    b, n = sizes.integers(1, 2), _length(sizes, scope, 1, 5)
    x = _layer_rows(draw, (b, n, d_model), dtype)
    layer["self_attn"] = condition_attention(layer["self_attn"], _row_radius(x), _row_radius(x), h, dtype)
    mask = None
    if "padding" in scope.masks and ("none" not in scope.masks or draw(st.booleans())):
        lengths = np.array(draw(st.lists(st.integers(1, n), min_size=b, max_size=b)))
        mask = (np.arange(n)[None, :] < lengths[:, None])[:, None, :]
    return {"x": x, "params": layer, "num_heads": h, "mask": mask}


@st.composite
def decoder_inputs(draw: Any, dtype: str, *, causal_check: bool = False, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """y (B, n_tgt, d), memory (B, n_src, d), one decoder layer's weights; masks None or causal & padding (if the
    scope accepts padding)."""
    sizes = _Sizes(draw, "decoder_inputs")
    d_model, h, d_ff = draw(_sizes(dtype, scope, sizes))
    layer = _params(draw(st.integers(0, 2**32 - 1)), _config(1, d_model, h, d_ff), 2, draw(st.booleans()), scope)[
        "decoder"
    ][0]
    b = sizes.integers(1, 2)
    n_tgt, n_src = _length(sizes, scope, 2 if causal_check else 1, 5), _length(sizes, scope, 1, 5)
    y, memory = _layer_rows(draw, (b, n_tgt, d_model), dtype), _array(draw, (b, n_src, d_model), 2.0)
    y2 = None
    if causal_check:
        upto = draw(st.integers(0, n_tgt - 2))
        y2 = y.copy()
        y2[:, upto + 1 :] = _layer_rows(draw, (b, n_tgt - upto - 1, d_model), dtype, level=3.0)
    seen = _row_radius(y) if y2 is None else _row_radius(y, y2)
    layer["self_attn"] = condition_attention(layer["self_attn"], seen, seen, h, dtype)
    layer["cross_attn"] = condition_attention(
        layer["cross_attn"], _norm_radius(layer["norm1"]), _row_radius(memory), h, dtype
    )
    if causal_check:
        return {"y": y, "memory": memory, "params": layer, "num_heads": h, "upto": upto, "y2": y2}
    self_mask = memory_mask = None
    if "padding" in scope.masks and draw(st.booleans()):
        t_len = np.array(draw(st.lists(st.integers(1, n_tgt), min_size=b, max_size=b)))
        s_len = np.array(draw(st.lists(st.integers(1, n_src), min_size=b, max_size=b)))
        causal = np.arange(n_tgt)[None, :] <= np.arange(n_tgt)[:, None]
        self_mask = causal & (np.arange(n_tgt)[None, :] < t_len[:, None])[:, None, :]
        memory_mask = (np.arange(n_src)[None, :] < s_len[:, None])[:, None, :]
    return {
        "y": y,
        "memory": memory,
        "params": layer,
        "num_heads": h,
        "self_mask": self_mask,
        "memory_mask": memory_mask,
    }


def _rate_and_seed(draw: Any) -> dict[str, Any]:
    """§5.4's rate: the paper's 0.1, big EN-DE's 0.3, 0, 0.5 or drawn below 0.9; and a seed."""
    p = draw(st.sampled_from([0.1, 0.3, 0.0, 0.5]) | st.floats(0.0, 0.9))
    return {"p": p, "seed": draw(st.integers(0, 2**32 - 1))}


@st.composite
def encoder_training_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """:func:`encoder_inputs` in training mode: with dropout's rate p and a seed (§5.4)."""
    return {**draw(encoder_inputs(dtype, scope=scope)), **_rate_and_seed(draw)}


@st.composite
def decoder_training_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """:func:`decoder_inputs` in training mode: with dropout's rate p and a seed (§5.4)."""
    return {**draw(decoder_inputs(dtype, scope=scope)), **_rate_and_seed(draw)}


def _condition_model(params: dict[str, Any], h: int, dtype: str) -> None:
    """Every attention of the model conditioned in place (:func:`condition_attention`), layer by layer.

    The first layer of each stack reads E[token] sqrt(d_model) + PE, whose rows have 2-norm at most
    sqrt(d_model) max_t ||E_t|| + sqrt(d_model / 2) (each sine-cosine pair of §3.5 has norm 1);
    every later attention reads a LayerNorm output (:func:`_norm_radius`), the cross-attentions'
    keys the encoder's last one.
    """
    emb = params["embedding"]
    d = emb.shape[1]
    embedded = float(np.sqrt(d) * np.max(np.linalg.norm(emb, axis=-1)) + np.sqrt(d / 2))
    radius = embedded
    for layer in params["encoder"]:
        layer["self_attn"] = condition_attention(layer["self_attn"], radius, radius, h, dtype)
        radius = _norm_radius(layer["norm2"])
    memory, radius = radius, embedded
    for layer in params["decoder"]:
        layer["self_attn"] = condition_attention(layer["self_attn"], radius, radius, h, dtype)
        layer["cross_attn"] = condition_attention(layer["cross_attn"], _norm_radius(layer["norm1"]), memory, h, dtype)
        radius = _norm_radius(layer["norm3"])


def _rounded(value: Any, dtype: str) -> Any:
    """``value`` (an array, or dicts and lists of them) with every float array rounded to ``dtype``."""
    if isinstance(value, dict):
        return {k: _rounded(v, dtype) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, dtype) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return round_to(value, dtype)
    return value


def _layer_norms_resolved(
    params: dict[str, Any],
    h: int,
    src: np.ndarray,
    tgt: np.ndarray,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    dtype: str,
    scope: Scope,
) -> bool:
    """Does ``dtype`` resolve every LayerNorm row of the whole model's forward pass on ``src`` and ``tgt``?

    Every LayerNorm reads a residual sum x + Sublayer(x) (§3.1) that the strategy does not draw. Now
    and then the sublayer's output nearly cancels the spread of x. Measured in bfloat16 without
    this condition: 3 of 12,595 drawn models (Hypothesis seeds 1 to 4) had logits with no bound,
    e.g. the row (0.494, 0.500, 0.497, 0.507) in a first encoder layer (sigma 0.005 at level 0.5;
    the source tokens all equal, so the self-attention's output was one vector, close to const - x
    at that position). The error bound beta of such a row's computed scale (``budgets.forward.normalized``;
    its mean alone is off by up to gamma_5 x 0.5 ~ 0.01 in bfloat16) exceeds s, so no bound of
    LayerNorm applies and every logit downstream is not checked. A row is resolved when
    beta <= s / 2: LayerNorm's bound holds while beta < s, and the margin 2 keeps its Delta
    within twice (alpha + |x_hat| beta) / s. The rows are the exact (float64) forward pass on the
    weights rounded to ``dtype`` (what the implementation is given), with the eps the scope fixes
    or else the oracle's default (1e-6); a larger eps only raises s, and beta - s / 2 falls as s
    grows. The rows that fail it (sigma below a few u times the level, in the d_model - 1
    dimensions of a centred row) are a set of measure ~ u^(d_model - 1): with d_model >= 4,
    float16 (u 8 times smaller) meets it 500 times less often than bfloat16.
    """
    if precision(dtype).p > 11:
        return True  # float32 and float64: u 2^16 times smaller than bfloat16's, the rows that fail 2^48 times rarer
    eps = scope.layer_norm_eps if scope.layer_norm_eps is not None else float(DEFAULT_POLICIES["layer_norm_eps"])
    rows = PR.layer_norm_inputs(src, tgt, _rounded(params, dtype), h, src_lengths, tgt_lengths, eps)
    for r in rows:
        _, _, s, beta = B.normalized(r, eps, precision(dtype))
        if not np.all(beta <= s / 2):
            return False
    return True


def _model(draw: Any, sizes: _Sizes, dtype: str, scope: Scope, low: int, high: int) -> tuple[dict[str, Any], int, int]:
    """(canonical weights of a conditioned 1- or 2-layer model, its heads h, its vocabulary size in [low, high])."""
    d_model, h, d_ff = draw(_sizes(dtype, scope, sizes))
    vocab = sizes.integers(low, high)
    params = _params(
        draw(st.integers(0, 2**32 - 1)),
        _config(sizes.integers(1, 2), d_model, h, d_ff),
        vocab,
        draw(st.booleans()),
        scope,
    )
    _condition_model(params, h, dtype)
    return params, h, vocab


@st.composite
def forward_inputs(draw: Any, dtype: str, *, kind: str = "agreement", scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """Token ids, canonical weights of a 1- or 2-layer model, and lengths (>= 1) or None.

    ``kind``: "agreement"; "causal" (adds ``upto`` and ``tgt2``, equal to tgt up to ``upto``);
    "batch" (B = 2 and an ``index``).

    Domain: in float16 and bfloat16, models and tokens whose every LayerNorm row, on every target
    the check runs, is one the dtype resolves (:func:`_layer_norms_resolved`); the rest is
    rejected (about 1 drawn model in 1000 in bfloat16), as no implementation in the dtype
    computes those rows' LayerNorm from its inputs rather than from rounding.
    """
    sizes = _Sizes(draw, "forward_inputs")
    params, h, vocab = _model(draw, sizes, dtype, scope, 2, 11)
    b = 2 if kind == "batch" else sizes.integers(1, 2)
    n_src, n_tgt = _length(sizes, scope, 1, 4), _length(sizes, scope, 2 if kind == "causal" else 1, 4)
    src = draw(hnp.arrays(np.int64, (b, n_src), elements=st.integers(0, vocab - 1)))
    tgt = draw(hnp.arrays(np.int64, (b, n_tgt), elements=st.integers(0, vocab - 1)))
    args: dict[str, Any] = {"src": src, "tgt": tgt, "params": params, "num_heads": h}
    if kind == "causal":
        upto = draw(st.integers(0, n_tgt - 2))
        tgt2 = tgt.copy()
        tgt2[:, upto + 1 :] = (tgt[:, upto + 1 :] + 1 + draw(st.integers(0, vocab - 2))) % vocab  # surely different ids
        assume(all(_layer_norms_resolved(params, h, src, t, None, None, dtype, scope) for t in (tgt, tgt2)))
        return {**args, "upto": upto, "tgt2": tgt2}
    lengths = "padding" in scope.masks and draw(st.booleans())
    args["src_lengths"] = np.array(draw(st.lists(st.integers(1, n_src), min_size=b, max_size=b))) if lengths else None
    args["tgt_lengths"] = np.array(draw(st.lists(st.integers(1, n_tgt), min_size=b, max_size=b))) if lengths else None
    assume(_layer_norms_resolved(params, h, src, tgt, args["src_lengths"], args["tgt_lengths"], dtype, scope))
    if kind == "batch":
        args["index"] = draw(st.integers(0, b - 1))
    return args


@st.composite
def forward_training_inputs(draw: Any, dtype: str, *, scope: Scope = FULL_SCOPE) -> dict[str, Any]:
    """:func:`forward_inputs` in training mode: with dropout's rate p and a seed (§5.4)."""
    return {**draw(forward_inputs(dtype, scope=scope)), **_rate_and_seed(draw)}


# --------------------------------------------------------------------------------------------
# decoding (§3.2.3, §6.1): chunk schedules, beam reorderings, beam searches


@st.composite
def decode_inputs(
    draw: Any,
    dtype: str,
    *,
    kind: str = "steps",
    scope: Scope = FULL_SCOPE,
    across_tiles: bool = False,
    padded: bool | None = None,
) -> dict[str, Any]:
    """A model and sentences to decode, as :func:`forward_inputs` draws them (no target padding: a decoder's inputs
    are the tokens it generated).

    ``kind`` "steps": ``chunks``, the sizes in which the target is fed to the cached decoder (one token at a time;
    a prefill of several then one at a time; or any split), summing to its length; with ``across_tiles`` the target
    is 15 to 17 or 31 to 33 tokens long (:data:`TILE_LENGTHS`, within the scope), so a cache crosses a tile of 16
    or 32 positions. "reorder": ``prefix`` (the
    positions cached before the reordering), ``index`` (the batch rows kept, in order, as many as there were, repeats
    allowed: what beam search does) and ``new`` (the tokens fed after it, one or two per row). "beam": a search's
    arguments, ``beam``, ``alpha``, ``extra`` (the maximum output length is the source length plus ``extra``: §6.1's
    50 at a size the oracle can follow step by step), ``bos`` and ``eos``, over a small vocabulary where every id,
    EOS included, is likely enough to be chosen; half the beam draws (where the scope allows their models) are
    steered into a situation where a known search bug changes the hypothesis (:func:`_steered_beam`). ``padded``:
    True to hide a source position wherever the scope accepts padding (None: on half the draws).
    """
    if kind == "beam" and not scope.unmet(_STEERED_NEEDS) and draw(st.booleans()):
        return _steered_beam(draw, scope)
    sizes = _Sizes(draw, "decode_inputs")
    params, h, vocab = _model(draw, sizes, dtype, scope, *((4, 7) if kind == "beam" else (2, 11)))
    b = sizes.integers(1, 2) if kind == "beam" else sizes.integers(1, 3)
    # padded sources more often than not, the first one shorter than the batch: the source mask must reach every
    # step (a known bug drops it after the first)
    room = scope.max_length is None or scope.max_length >= 2
    padded = "padding" in scope.masks and room and (draw(st.sampled_from([True, False])) if padded is None else padded)
    n_src = _length(sizes, scope, 2 if padded else 1, 4)
    src = draw(hnp.arrays(np.int64, (b, n_src), elements=st.integers(0, vocab - 1)))
    lengths = None
    if padded:
        lengths = np.array(
            [draw(st.integers(1, n_src - 1)), *draw(st.lists(st.integers(1, n_src), min_size=b - 1, max_size=b - 1))]
        )
    args: dict[str, Any] = {"src": src, "params": params, "num_heads": h, "src_lengths": lengths}
    if kind == "beam":
        bos = draw(st.integers(0, vocab - 1))
        eos = draw(st.sampled_from(_unlikely_first(args, bos)))
        return {
            **args,
            # the simplest draws first where they tell most: a beam of 2 or more, a penalty that matters
            "beam": draw(st.sampled_from([2, 4, 1])),
            "alpha": draw(st.sampled_from([1.0, 0.6, 2.0, 0.0])),
            "extra": draw(st.integers(2, 6)),
            "bos": int(bos),
            "eos": int(eos),
        }
    if across_tiles:  # too many tokens to draw one by one: from a seed
        n_tgt = max(2, _tile_length(sizes, scope, 33))
        tgt = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, vocab, (b, n_tgt))
    else:
        n_tgt = _length(sizes, scope, 2, 6)
        tgt = draw(hnp.arrays(np.int64, (b, n_tgt), elements=st.integers(0, vocab - 1)))
    if kind == "steps":
        how = draw(st.sampled_from(["ones", "prefill", "any"]))
        if how == "ones":
            chunks = [1] * n_tgt
        elif how == "prefill":
            first = draw(st.integers(2, n_tgt))
            chunks = [first] + [1] * (n_tgt - first)
        else:
            cuts = sorted(draw(st.sets(st.integers(1, n_tgt - 1), max_size=n_tgt - 1)))
            chunks = [j - i for i, j in zip([0, *cuts], [*cuts, n_tgt])]
        return {**args, "tgt": tgt, "chunks": chunks}
    prefix = draw(st.integers(1, n_tgt - 1))
    index = np.array(draw(st.lists(st.integers(0, b - 1), min_size=b, max_size=b)), dtype=np.int64)
    new = draw(hnp.arrays(np.int64, (len(index), draw(st.integers(1, 2))), elements=st.integers(0, vocab - 1)))
    return {**args, "tgt": tgt[:, :prefix], "index": index, "new": new}


#: What the steered beam inputs need of a declared scope (the models of ``fixed.beam_model``).
_STEERED_NEEDS = ("d_ff:2", "bias:attention", "bias:layer_norm", "bias:ffn", "length:8")

#: The situations the steered beam inputs are drawn around: a model of ``fixed.beam_model`` (seed, scale), a beam
#: width, and the lengths penalty's alpha, extra length, EOS id and batch of two among which each situation arises
#: (every combination was checked by running the oracle's search with and without the bug switched in).
_SITUATIONS = (
    # an EOS among the best candidates early: a finished hypothesis kept alive is extended
    ((2, 2.0), 4, (1.0, 2.0), (2, 4), (2, 5), (False, True)),
    # the best continuations share a parent: a per-hypothesis top-1 loses them
    ((0, 1.0), 2, (0.6, 2.0), (2, 4), (1, 4), (False, True)),
    # a longer hypothesis overtakes after a stop bounded at the current length
    ((2, 2.0), 1, (2.0,), (4,), (2, 4), (False, True)),
    # two sentences whose maximum lengths differ: the shorter one's bounds its search
    ((0, 2.0), 1, (0.6, 1.0, 2.0), (2, 4), (1, 2, 3, 4, 5), (True,)),
    # two sentences that stop at different steps under the "full" rule: a stop applied to the batch as a whole lets
    # the first search on, and it finds another hypothesis
    ((8, 2.0), 2, (0.6, 1.0, 2.0), (2, 3, 4, 5, 6), (3, 5), (True,)),
)


def _steered_beam(draw: Any, scope: Scope) -> dict[str, Any]:
    """A beam search over one of the small peaked models among which the fixed beam cases were found
    (``fixed.beam_model``), in one of the situations of :data:`_SITUATIONS` where a search bug of
    ``diagnoses.decoding`` (a finished hypothesis extended, a per-hypothesis top-1, a stop bounded at the current
    length, a batch's maximum length, a stop applied to the batch as a whole) changes the hypothesis: the search's
    arguments are drawn among those where the situation arises, so each bug is reached on many draws, not only on the
    fixed cases."""
    (seed, scale), beam, alphas, extras, eoses, batches = draw(st.sampled_from(_SITUATIONS))
    params, src, h = beam_model(seed, scale)
    two = "padding" in scope.masks and draw(st.sampled_from(batches))
    return {
        "src": src if two else src[:1],
        "params": params,
        "num_heads": h,
        "src_lengths": np.array([2, 4]) if two else None,
        "beam": beam,
        "alpha": draw(st.sampled_from(alphas)),
        "extra": draw(st.sampled_from(extras)),
        "bos": 0,
        "eos": draw(st.sampled_from(eoses)),
    }


def _unlikely_first(args: dict[str, Any], bos: int) -> list[int]:
    """The ids other than ``bos``, least likely first as the first token of the first sentence's output (the
    oracle's model): an end of sentence drawn among them lets hypotheses run for several steps, where the length
    penalty and the stopping rule decide something (a search that ends at step 1 ranks one-token outputs, all with
    lp = 1)."""
    from aiayn.reference.model import transformer_forward

    n = args["src"].shape[1] if args["src_lengths"] is None else int(args["src_lengths"][0])
    logits = transformer_forward(args["src"][:1, :n], np.array([[bos]]), args["params"], args["num_heads"])[0, 0]
    return [int(v) for v in np.argsort(logits, kind="stable") if v != bos]


# --------------------------------------------------------------------------------------------
# the backward pass: cotangents, and inputs with a common component


@st.composite
def cotangent(draw: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A cotangent of the result's ``shape``: of mixed sign around 0, of mixed sign around a non-zero mean, or of
    one sign (all positive or all negative), at scales 1/4 to 8.

    The mean and the sign matter: dS = P (.) (dP - D) and LayerNorm's dx subtract a weighted mean of the cotangent's
    image, so a cotangent with a large common part makes them cancel, which is where a budget relative to the
    result, or a backward that drops the mean term, shows (a suite drawing only zero-mean or only positive
    cotangents meets one of the two cases).
    """
    kind = draw(st.sampled_from(["mixed", "offset", "one sign"]))
    g = _weights(draw, shape, 1.0)
    if kind == "offset":
        g = g + draw(st.sampled_from([-3.0, 2.0, 5.0]))
    elif kind == "one sign":
        g = np.abs(g) * draw(st.sampled_from([1.0, -1.0]))
    return g * draw(st.sampled_from([1.0, 0.25, 8.0]))


@st.composite
def common_component(draw: Any, x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` (..., n, d) plus, half the time, one row vector of size up to ``scale`` added to every row: non-zero-mean
    queries, keys or values (a common component of the keys cancels in Eq. (1)'s value, not in its error)."""
    if not draw(st.booleans()):
        return x
    return x + _weights(draw, (x.shape[-1],), scale)


def defined_gradients(impl: Any, args: dict[str, Any], key: str, axis: int = -1) -> dict[str, Any]:
    """``args`` with no slice whose gradient is undefined, where the implementation's forward is NaN on it: under the
    policy "nan" a fully masked row (``key`` "mask": its last key made visible), and a softmax slice of -inf
    (``key`` "x": its last entry made 0). The forward checks already cover those rows (exactly NaN); their
    gradients have no exact value to check (``checks._common.UNDEFINED_GRADIENT``)."""
    value = args.get(key)
    if value is None:
        return args
    if key == "mask":
        if getattr(impl, "policies", {}).get("fully_masked") != "nan":
            return args
        dead = ~np.any(value, axis=-1, keepdims=True)
        last = np.zeros(value.shape, dtype=bool)
        last[..., -1] = True
        return {**args, "mask": value | (dead & last)}
    x = np.moveaxis(value, axis, -1)
    dead = np.all(x == -np.inf, axis=-1, keepdims=True)
    last = np.zeros(x.shape, dtype=bool)
    last[..., -1] = True
    return {**args, "x": np.moveaxis(np.where(dead & last, 0.0, x), -1, axis)}
