"""One drawn example placed in a batch, or padded: the arrangements of the batch-invariance checks.

Every batched equation of the paper computes a batch element from that element alone: attention, Eq. (1), acts on
one sentence's queries, keys and values (§3.2.1), LayerNorm and the feed-forward network, Eq. (2), on one position
(§3.1, §3.3), a layer and the whole model on one sentence (§3.1, Figure 1), and padding hides positions as if they
were absent (§3.2.3). So the example's result must not depend on what else is in its batch, nor on hidden padding.

- :func:`alone`: the example as one block of its own batch (every batched argument broadcast to one batch shape; a
  leading axis added where it has none);
- :func:`in_batch`: that block at ``index`` of ``size`` blocks, the others fillers of other lengths (padding masks
  or lengths drawn anew; the positions of the example's own arrays in another order);
- :func:`padded`: the block with ``hidden`` positions appended to its sequences, hidden (masked keys, positions past
  a length).

Each returns a :class:`Placed`: the arguments, and ``keep``, the index of the example's part in the result.
What an equation batches is its record's :class:`~aiayn.conformance.equations.Batching`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from aiayn.implementations.protocol import Scope

__all__ = ["Batching", "Placed", "alone", "in_batch", "padded", "placement"]


@dataclass(frozen=True)
class Batching:
    """What one batch element of an equation is, read by the batch-invariance checks.

    ``core(a)``: each batched argument's core rank (the trailing dimensions of one element; the rest are batch
    dimensions), from the example's arguments; arguments not named are shared by the whole batch (weights, sizes).
    ``lengths``: length arguments, each to the token argument whose last axis it measures. ``causal``: masks that
    stay causal (the decoder's self-attention mask: None means causal there). ``axis``: an argument holding an axis
    of a batched array (softmax's), counted from the front when non-negative. ``positions``: the arguments whose
    axis -2 (tokens: -1) are sequence positions padding may extend, each with the arguments whose positions it
    shares (self-attention: queries are keys); ``masks``: each mask with its (query argument, key argument);
    ``rows``: the argument whose positions are the result's axis -2 (None: no padding arrangement, the equation
    acts per position, so padding is more positions: the batch arrangement already). ``why_no_padding``: said where
    ``rows`` is None.
    """

    core: Callable[[Mapping[str, Any]], Mapping[str, int]]
    lengths: Mapping[str, str] = field(default_factory=dict)
    causal: frozenset[str] = frozenset()
    axis: str | None = None
    positions: tuple[str, ...] = ()
    masks: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    rows: str | None = None
    why_no_padding: str = ""


@dataclass(frozen=True)
class Placed:
    """An arrangement: the arguments to call with, ``keep`` the example's part of the result, ``what`` its name in
    messages."""

    args: dict[str, Any]
    keep: tuple[Any, ...]
    what: str


@st.composite
def placement(draw: Any) -> dict[str, int]:
    """Where the example goes: a batch of ``size`` blocks, at ``index``, ``hidden`` padded positions, fillers from
    ``seed``."""
    size = draw(st.integers(2, 4))
    return {
        "size": size,
        "index": draw(st.integers(0, size - 1)),
        "hidden": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def _masks_allowed(scope: Scope) -> bool:
    """Whether the scope accepts masks of other lengths (padding masks, or any boolean mask)."""
    return "padding" in scope.masks or "random" in scope.masks


def _batched(args: Mapping[str, Any], b: Batching) -> dict[str, int]:
    """The batched arguments given (not None), by core rank."""
    return {name: rank for name, rank in b.core(args).items() if args.get(name) is not None}


def alone(args: Mapping[str, Any], b: Batching, scope: Scope) -> Placed | None:
    """The example as one block: every batched argument broadcast to the example's batch shape (masks materialised
    over it), a leading axis added where there is no batch dimension. None where the scope accepts no batch
    dimension to add."""
    ranks = _batched(args, b)
    shapes = [np.shape(args[name])[: np.ndim(args[name]) - rank] for name, rank in ranks.items()]
    batch = np.broadcast_shapes(*shapes) if shapes else ()
    out = dict(args)
    if not batch:
        if scope.batch_dims is not None and 1 not in scope.batch_dims:
            return None
        batch = (1,)
        if b.axis is not None and out[b.axis] >= 0:
            out[b.axis] = out[b.axis] + 1
    memo: dict[int, np.ndarray] = {}
    for name, rank in ranks.items():
        value = args[name]
        if id(value) not in memo:  # one array passed under several names stays one array
            memo[id(value)] = np.array(np.broadcast_to(value, batch + np.shape(value)[np.ndim(value) - rank :]))
        out[name] = memo[id(value)]
    return Placed(out, (slice(None),), "the example alone")


def _fill(value: np.ndarray, rank: int, rng: np.random.Generator) -> np.ndarray:
    """A filler block of a float or token array: the example's positions in another order (axis -2 of an array of
    core rank 2 or more, else its last axis), so each filler position is one the strategy drew."""
    axis = -2 if rank >= 2 else -1
    return np.take(value, rng.permutation(value.shape[axis]), axis=axis)


def _padding_mask(shape: tuple[int, ...], causal: bool, rng: np.random.Generator) -> np.ndarray:
    """A (..., n_q or 1, n_k) mask of one block: keys before a drawn length in [1, n_k] visible, and the causal mask
    (§3.2.3) on top for a causal one; no row is fully masked."""
    n_q, n_k = shape[-2:]
    visible = np.arange(n_k) < rng.integers(1, n_k + 1)
    m = np.broadcast_to(visible, shape)
    if causal:
        m = m & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q))
    return np.array(m)


def _full_mask(name: str, b: Batching, args: Mapping[str, Any], batch: tuple[int, ...]) -> np.ndarray:
    """An explicit mask where the example has None: causal for a causal mask, every key visible otherwise
    (broadcast over queries)."""
    q, k = b.masks[name]
    n_q, n_k = _length(args, q), _length(args, k)
    if name in b.causal:
        return np.broadcast_to(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None], batch + (n_q, n_k)).copy()
    return np.ones(batch + (1, n_k), dtype=bool)


def _length(args: Mapping[str, Any], name: str) -> int:
    """The number of positions of argument ``name`` (tokens: its last axis; arrays of vectors: axis -2)."""
    value = np.asarray(args[name])
    return value.shape[-1] if value.dtype.kind in "iu" else value.shape[-2]


def in_batch(example: Placed, b: Batching, scope: Scope, size: int, index: int, rng: np.random.Generator) -> Placed:
    """``example`` (from :func:`alone`) as block ``index`` of ``size`` blocks along axis 0. The other blocks: float
    and token arrays with the example's positions in another order; masks of other lengths (padding masks drawn
    anew, causal where the mask is) and lengths drawn in [1, n], where the scope accepts padding; else the example's
    own. Where the example has no mask or lengths but the fillers do, its block gets every key visible (causal: the
    causal mask) and full lengths."""
    args = dict(example.args)
    ranks = _batched(args, b)
    first = next(iter(ranks))
    block = np.shape(args[first])[0]
    other = _masks_allowed(scope)
    batch = np.shape(args[first])[: np.ndim(args[first]) - ranks[first]]
    for name in b.masks:
        if other and args.get(name) is None:
            args[name] = _full_mask(name, b, args, batch)
    for name, tokens in b.lengths.items():
        if other and args.get(name) is None:
            args[name] = np.full(batch, _length(args, tokens), dtype=np.int64)
    memo: dict[int, np.ndarray] = {}
    out = dict(args)
    for name in _batched(args, b):
        value = args[name]
        if id(value) in memo:
            out[name] = memo[id(value)]
            continue
        blocks = []
        for j in range(size):
            if j == index:
                blocks.append(value)
            elif name in b.masks:
                blocks.append(_padding_mask(value.shape, name in b.causal, rng) if other else value)
            elif name in b.lengths:
                n = _length(args, b.lengths[name])
                blocks.append(rng.integers(1, n + 1, size=value.shape) if other else value)
            else:
                blocks.append(_fill(value, b.core(args)[name], rng))
        memo[id(value)] = out[name] = np.concatenate(blocks, axis=0)
    keep = (slice(index * block, (index + 1) * block),)
    return Placed(out, keep, f"the example at index {index} of a batch of {size} (the others of other lengths)")


def padded(example: Placed, b: Batching, scope: Scope, hidden: int, rng: np.random.Generator) -> Placed | None:
    """``example`` (from :func:`alone`) with ``hidden`` positions appended to each sequence of ``b.positions`` (copies
    of drawn positions; tokens: drawn tokens), hidden: masks get those keys masked (query rows added copy the last
    real row's mask), lengths keep the real lengths (full where the example had none). None where padding cannot be
    placed: the equation has no padding arrangement, the scope accepts no padding, or no position is left under
    its ``max_length``."""
    if b.rows is None or not _masks_allowed(scope):
        return None
    args = dict(example.args)
    longest = max(_length(args, name) for name in b.positions)
    if scope.max_length is not None:
        hidden = min(hidden, scope.max_length - longest)
    if hidden <= 0:
        return None
    n_rows = _length(args, b.rows)
    batch = np.shape(args[b.rows])[: np.ndim(args[b.rows]) - b.core(args)[b.rows]]
    for name, tokens in b.lengths.items():
        if args.get(name) is None:
            args[name] = np.full(batch, _length(args, tokens), dtype=np.int64)
    grown: dict[str, int] = {}
    memo: dict[int, np.ndarray] = {}
    out = dict(args)
    for name in b.positions:
        value = np.asarray(args[name])
        grown[name] = _length(args, name)
        if id(args[name]) not in memo:
            axis = -1 if value.dtype.kind in "iu" else -2
            picks = rng.integers(0, value.shape[axis], size=hidden)
            memo[id(args[name])] = np.concatenate([value, np.take(value, picks, axis=axis)], axis=axis)
        out[name] = memo[id(args[name])]
    for name, (q, k) in b.masks.items():
        m = args.get(name)
        m = _full_mask(name, b, args, batch) if m is None else np.array(np.broadcast_to(m, batch + np.shape(m)[-2:]))
        if k in grown:  # the added keys: hidden from every query
            m = np.concatenate([m, np.zeros(m.shape[:-1] + (hidden,), dtype=bool)], axis=-1)
        if q in grown and m.shape[-2] != 1:  # added queries see what the last real one sees
            m = np.concatenate([m, np.repeat(m[..., -1:, :], hidden, axis=-2)], axis=-2)
        out[name] = m
    keep = (Ellipsis, slice(0, n_rows), slice(None))
    return Placed(out, keep, f"the example with {hidden} padded position(s) appended, hidden")
