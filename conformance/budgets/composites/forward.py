"""Error budgets for the composites (§3.1 layers, Figure 1's forward pass): local bounds times condition numbers.

A composite is a chain of equations (multi-head attention, residual sums, LayerNorm, Eq. (2),
embeddings, the output projection). Chaining the elementwise worst-case bounds of
``conformance/budgets/forward.py`` stage by stage is rigorous but compounds the worst case at every stage
(about 10^3 per layer), which makes it vacuous for anything below float64. So the composites use
the standard first-order forward error analysis instead [H, §1.6; §3.5]:

    computed output - exact output  =  sum_k  J_k l_k  +  O(u^2),

where stage k adds a local rounding error l_k (bounded elementwise by that equation's own budget,
|l_k| <= L_k, evaluated at the exact inputs of the stage) and J_k is the Jacobian of everything
*downstream* of stage k (the condition of the rest of the network with respect to stage k's
output). Hence, elementwise,

    |error|  <~  sum_k |J_k| L_k,

with |J_k| L_k = sum_j |J_k[:, j]| L_k[j]: each local error may take any sign pattern, but the
Jacobians are composed exactly before the absolute value is taken, so cancellation inside the
downstream network is kept. The Jacobians are evaluated at the exact intermediate values (the
oracle's, in float64) by forward-mode differentiation (a Jacobian-vector product per column,
batched). Terms of second order in u are neglected (the "<~" of [H]); so is the kink of ReLU
(a unit whose exact pre-activation lies within its own rounding error of 0 may switch; the
derivative used is that at the exact value).

The oracle's own error in a composite (it rounds to float64 between sub-layers) is the same sum
with the float64 local bounds; the comparison threshold uses the sum of both, L_k(dtype) +
L_k(float64), through the same Jacobians.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.conformance.budgets import forward as B
from aiayn.conformance.budgets._heads import merge as _merge
from aiayn.conformance.budgets._heads import split as _split
from aiayn.conformance.numerics import Precision, gamma
from aiayn.reference.model import layer_keep

__all__ = ["decoder_layer", "encoder_layer", "layer_norm_inputs", "transformer_forward"]

Tangent = np.ndarray | None  # a batch of tangents with a leading axis, or None for zero


# --------------------------------------------------------------------------------------------
# the graph: stages with a value, a Jacobian-vector product and a local error bound


@dataclass
class _Op:
    outs: tuple[str, ...]
    inputs: tuple[str, ...]
    jvp: Callable[..., tuple[Tangent, ...]]  # jvp(*input values, *input tangents) -> a tangent per output
    local: Callable[[Precision], tuple[np.ndarray, ...]]  # elementwise bounds on this stage's own rounding errors
    # vjp(*output cotangents) -> a cotangent per input (None: zero), each with a leading axis of rows; None where the
    # stage has no transpose written, and the graph is then bounded in forward mode
    vjp: Callable[..., tuple[Tangent, ...]] | None = None


class _Graph:
    """Records the stages of a composite as they are evaluated (in float64), then bounds its outputs."""

    def __init__(self) -> None:
        self.values: dict[str, np.ndarray] = {}
        self.ops: list[_Op] = []
        self.norm_inputs: list[str] = []  # the stages every LayerNorm reads, in order

    def source(self, name: str, value: np.ndarray, local: Callable[[Precision], np.ndarray]) -> None:
        """A stage with no upstream stage (an embedding): only a local error."""
        self.values[name] = value
        self.ops.append(_Op((name,), (), lambda: (None,), lambda p: (local(p),), lambda c: ()))

    def stage(
        self,
        name: str,
        inputs: Sequence[str],
        value: np.ndarray,
        jvp: Callable[..., np.ndarray],
        local: Callable[[Precision], np.ndarray],
        vjp: Callable[[np.ndarray], tuple[Tangent, ...]] | None = None,
    ) -> np.ndarray:
        self.values[name] = value
        self.ops.append(_Op((name,), tuple(inputs), lambda *a: (jvp(*a),), lambda p: (local(p),), vjp))
        return value

    def stages(
        self,
        names: Sequence[str],
        inputs: Sequence[str],
        values: Sequence[np.ndarray],
        jvp: Callable[..., tuple[Tangent, ...]],
        local: Callable[[Precision], tuple[np.ndarray, ...]],
    ) -> None:
        """One stage with several outputs (a sub-layer's backward: the input's gradient and its parameters')."""
        self.values.update(zip(names, values))
        self.ops.append(_Op(tuple(names), tuple(inputs), jvp, local))

    def bound(self, output: str, precisions: Sequence[Precision]) -> np.ndarray:
        """sum_k |J_k| L_k at ``output``, with L_k summed over ``precisions``."""
        return self.bounds([output], precisions)[output]

    def bounds(self, outputs: Sequence[str], precisions: Sequence[Precision]) -> dict[str, np.ndarray]:
        """sum_k |J_k| L_k at each of ``outputs``, with L_k summed over ``precisions``.

        Where every stage up to the outputs has its transpose (``vjp``), the Jacobians come in reverse mode: one row
        per element of an output, carried back through the stages, |J_k| read at each stage; the cost grows with
        the output's size, not with the sum of every stage's (forward mode, one column per element of each stage,
        carried forward). Both give the same sum (``tests/test_forward_propagation.py``)."""
        last = max(i for i, op in enumerate(self.ops) if set(op.outs) & set(outputs))
        ops = self.ops[: last + 1]
        locals_ = []  # per stage: its outputs' local bounds
        for op in ops:
            found = []
            for local in (sum(parts) for parts in zip(*(op.local(p) for p in precisions))):
                # NaN (an overflowed bound, inf - inf) is no bound, as inf: clamped to 1e300 so that 0 x bound stays 0
                # in the Jacobian products; every element it reaches is at or above comparison.VACUOUS: not checked
                found.append(np.minimum(np.where(np.isnan(local), np.inf, local), 1e300))
            locals_.append(found)
        if all(op.vjp is not None for op in ops):
            totals = {name: self._reverse(ops, locals_, name) for name in outputs}
        else:
            totals = self._forward(ops, locals_, outputs)
        return {name: total * B.SAFETY for name, total in totals.items()}

    def _reverse(self, ops: Sequence[_Op], locals_: Sequence[Sequence[np.ndarray]], output: str) -> np.ndarray:
        """sum_k |J_k| L_k at ``output``: its rows of every J_k, carried back from the identity at ``output``."""
        value = self.values[output]
        m = value.size
        cotangents: dict[str, np.ndarray] = {output: np.eye(m).reshape(m, *value.shape)}  # (m, *stage shape) each
        total = np.zeros(m)
        for op, locs in zip(reversed(ops), reversed(locals_)):
            outs = [cotangents.pop(name, None) for name in op.outs]
            if all(c is None for c in outs):
                continue
            for c, local in zip(outs, locs):
                if c is not None and np.any(local):
                    total += np.abs(c).reshape(m, -1) @ local.reshape(-1)
            for name, c in zip(op.inputs, op.vjp(*outs)):  # type: ignore[misc]
                if c is not None:
                    cotangents[name] = cotangents[name] + c if name in cotangents else c
        return total.reshape(value.shape)

    def _forward(
        self, ops: Sequence[_Op], locals_: Sequence[Sequence[np.ndarray]], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """sum_k |J_k| L_k at each of ``outputs``: each stage output's local error, one column per element, carried
        forward through every later stage that reads it."""
        totals = {name: np.zeros_like(self.values[name]) for name in outputs}
        read = {name for op in ops for name in op.inputs}
        for index, op in enumerate(ops):
            for out, local in zip(op.outs, locals_[index]):
                if out in totals:
                    totals[out] = totals[out] + local
                if out not in read or not np.any(local):
                    continue
                n = local.size
                tangents: dict[str, Tangent] = {out: (np.eye(n) * local.reshape(-1)).reshape(n, *local.shape)}
                for later in ops[index + 1 :]:
                    ins = [tangents.get(name) for name in later.inputs]
                    if all(t is None for t in ins):
                        continue
                    for name, t in zip(later.outs, later.jvp(*[self.values[name] for name in later.inputs], *ins)):
                        if t is not None:
                            tangents[name] = t
                for name in totals:
                    if name != out and tangents.get(name) is not None:
                        totals[name] = totals[name] + np.sum(np.abs(tangents[name]), axis=0)
        return totals


def _zero(t: Tangent, like: np.ndarray) -> np.ndarray:
    return np.zeros((1, *like.shape)) if t is None else t


# --------------------------------------------------------------------------------------------
# the stages in float64 with their Jacobian-vector products


def _softmax_masked(s: np.ndarray, visible: np.ndarray) -> np.ndarray:
    z = np.where(visible, s, -np.inf)
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def _mha(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, params: Mapping[str, np.ndarray], h: int, mask: Any
) -> tuple[np.ndarray, Callable[..., np.ndarray], Callable[[np.ndarray], tuple[np.ndarray, ...]]]:
    """MultiHead (§3.2.2) at these inputs, its tangent map and that map's transpose (the heads' Q, K, V and
    weights P kept for both). Tangent of head i: dP V + P dV with dP = P o (dS - sum P dS), dS = (dQ K^T + Q dK^T) /
    sqrt(d_k) at visible keys; the transpose runs the same products backwards (P o (G - sum P G) is its own)."""

    def proj(x: np.ndarray, w: str, b: str) -> np.ndarray:
        return x @ params[w] + (params[b] if params.get(b) is not None else 0.0)

    q, k, v = (
        _split(proj(query, "w_q", "b_q"), h),
        _split(proj(key, "w_k", "b_k"), h),
        _split(proj(value, "w_v", "b_v"), h),
    )
    root = math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) / root  # (..., h, n_q, n_k)
    visible = (
        np.ones(s.shape, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask)[..., None, :, :], s.shape)
    )
    p = _softmax_masked(s, visible)
    out = _merge(p @ v) @ params["w_o"] + (params["b_o"] if params.get("b_o") is not None else 0.0)

    def tangent(dq: Tangent, dk: Tangent, dv: Tangent) -> np.ndarray:
        tq = _split(_zero(dq, query) @ params["w_q"], h)
        tk = _split(_zero(dk, key) @ params["w_k"], h)
        tv = _split(_zero(dv, value) @ params["w_v"], h)
        ds = np.where(visible, (tq @ np.swapaxes(k, -1, -2) + q @ np.swapaxes(tk, -1, -2)) / root, 0.0)
        dp = p * (ds - np.sum(p * ds, axis=-1, keepdims=True))
        return _merge(dp @ v + p @ tv) @ params["w_o"]

    def transpose(c: np.ndarray) -> tuple[np.ndarray, ...]:  # c: (rows, ..., n_q, d_model)
        g = _split(c @ params["w_o"].T, h)  # (rows, ..., h, n_q, d_v)
        gp = g @ np.swapaxes(v, -1, -2)
        gs = np.where(visible, p * (gp - np.sum(p * gp, axis=-1, keepdims=True)), 0.0) / root
        gq, gk, gv = gs @ k, np.swapaxes(gs, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g
        return _merge(gq) @ params["w_q"].T, _merge(gk) @ params["w_k"].T, _merge(gv) @ params["w_v"].T

    return out, tangent, transpose


def _layer_norm(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], tuple[np.ndarray]]]:
    """LayerNorm at x, its tangent map d x_hat = (dc - x_hat mean(x_hat dc)) / s with dc = dx - mean(dx), and that
    map's transpose (the same two projections in the other order)."""
    c = x - np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    xh = c / s

    def tangent(dx: np.ndarray) -> np.ndarray:
        dc = dx - np.mean(dx, axis=-1, keepdims=True)
        d_xh = (dc - xh * np.mean(xh * dc, axis=-1, keepdims=True)) / s
        return d_xh * gain

    def transpose(cot: np.ndarray) -> tuple[np.ndarray]:
        g = cot * gain
        u = (g - xh * np.mean(xh * g, axis=-1, keepdims=True)) / s
        return (u - np.mean(u, axis=-1, keepdims=True),)

    return xh * gain + bias, tangent, transpose


def _ffn(
    x: np.ndarray, ffn: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], tuple[np.ndarray]]]:
    """Eq. (2) at x, its tangent map and that map's transpose; ReLU's derivative taken at the exact pre-activation."""
    hidden = x @ ffn["w1"] + ffn["b1"]
    active = hidden > 0

    def tangent(dx: np.ndarray) -> np.ndarray:
        return ((dx @ ffn["w1"]) * active) @ ffn["w2"]

    def transpose(c: np.ndarray) -> tuple[np.ndarray]:
        return (((c @ ffn["w2"].T) * active) @ ffn["w1"].T,)

    return np.maximum(hidden, 0.0) @ ffn["w2"] + ffn["b2"], tangent, transpose


# --------------------------------------------------------------------------------------------
# building the composites


def _add_mha(
    g: _Graph, name: str, q: str, k: str, v: str, params: Mapping[str, np.ndarray], h: int, mask: np.ndarray | None
) -> None:
    qv, kv, vv = g.values[q], g.values[k], g.values[v]
    value, tangent, transpose = _mha(qv, kv, vv, params, h, mask)
    g.stage(
        name,
        (q, k, v),
        value,
        lambda a, b, c, ta, tb, tc: tangent(ta, tb, tc),
        lambda p: B.multi_head_attention(qv, kv, vv, params, h, mask, p),
        transpose,
    )


def _add_residual_norm(g: _Graph, name: str, x: str, sub: str, norm: Mapping[str, np.ndarray], eps: float) -> None:
    """LayerNorm(x + Sublayer(x)) (§3.1) as two stages: the sum (one rounding) and the LayerNorm."""
    r = g.values[x] + g.values[sub]
    g.stage(
        f"{name}.sum",
        (x, sub),
        r,
        lambda a, b, ta, tb: _zero(ta, a) + _zero(tb, b),
        lambda p: p.op * np.abs(r) + p.eta,
        lambda c: (c, c),
    )
    gain, bias = norm["gain"], norm["bias"]
    g.norm_inputs.append(f"{name}.sum")
    value, tangent, transpose = _layer_norm(r, gain, bias, eps)
    g.stage(
        name,
        (f"{name}.sum",),
        value,
        lambda a, ta: tangent(ta),
        lambda p: B.layer_norm(r, gain, bias, eps, p),
        transpose,
    )


def _add_ffn(g: _Graph, name: str, x: str, ffn: Mapping[str, np.ndarray]) -> None:
    xv = g.values[x]
    value, tangent, transpose = _ffn(xv, ffn)
    g.stage(
        name,
        (x,),
        value,
        lambda a, ta: tangent(ta),
        lambda p: B.feed_forward(xv, ffn["w1"], ffn["b1"], ffn["w2"], ffn["b2"], p),
        transpose,
    )


def _add_dropout(g: _Graph, sub: str, keep: Mapping[str, np.ndarray] | None, name: str, p: float) -> str:
    """§5.4's dropout of a sub-layer's output given its mask, keep x / (1 - p): a stage whose local error is
    ``budgets.forward.dropout``'s and whose Jacobian is the same mask and scale; ``keep`` None (evaluation): none."""
    if keep is None:
        return sub
    kept = np.asarray(keep[name], dtype=bool)
    scale = np.where(kept, 1 / (1 - p), 0.0)
    value = g.values[sub] * scale
    g.stage(
        f"{sub}.drop",
        (sub,),
        value,
        lambda a, ta: ta * scale,
        lambda prec: B.dropout(value, p, prec),
        lambda c: (c * scale,),
    )
    return f"{sub}.drop"


def _encoder(
    g: _Graph,
    x: str,
    params: Mapping[str, Any],
    h: int,
    mask: np.ndarray | None,
    eps: float,
    tag: str,
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> str:
    _add_mha(g, f"{tag}.attn", x, x, x, params["self_attn"], h, mask)
    _add_residual_norm(g, f"{tag}.z", x, _add_dropout(g, f"{tag}.attn", keep, "self_attn", p), params["norm1"], eps)
    _add_ffn(g, f"{tag}.ffn", f"{tag}.z", params["ffn"])
    _add_residual_norm(g, f"{tag}.out", f"{tag}.z", _add_dropout(g, f"{tag}.ffn", keep, "ffn", p), params["norm2"], eps)
    return f"{tag}.out"


def _decoder(
    g: _Graph,
    y: str,
    memory: str,
    params: Mapping[str, Any],
    h: int,
    self_mask: np.ndarray,
    memory_mask: np.ndarray | None,
    eps: float,
    tag: str,
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> str:
    _add_mha(g, f"{tag}.self", y, y, y, params["self_attn"], h, self_mask)
    _add_residual_norm(g, f"{tag}.a", y, _add_dropout(g, f"{tag}.self", keep, "self_attn", p), params["norm1"], eps)
    _add_mha(g, f"{tag}.cross", f"{tag}.a", memory, memory, params["cross_attn"], h, memory_mask)
    cross = _add_dropout(g, f"{tag}.cross", keep, "cross_attn", p)
    _add_residual_norm(g, f"{tag}.b", f"{tag}.a", cross, params["norm2"], eps)
    _add_ffn(g, f"{tag}.ffn", f"{tag}.b", params["ffn"])
    _add_residual_norm(g, f"{tag}.out", f"{tag}.b", _add_dropout(g, f"{tag}.ffn", keep, "ffn", p), params["norm3"], eps)
    return f"{tag}.out"


def causal(n: int) -> np.ndarray:
    """(n, n): query i sees keys j <= i (§3.2.3)."""
    return np.arange(n)[None, :] <= np.arange(n)[:, None]


def source_and_target_masks(
    n_src: int, n_tgt: int, src_lengths: np.ndarray | None, tgt_lengths: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray]:
    """The whole model's masks: padded source keys (B, 1, n_src) or None; the target's causal mask, with padded
    target keys hidden when lengths are given."""
    src_mask = (
        None if src_lengths is None else (np.arange(n_src)[None, :] < np.asarray(src_lengths)[:, None])[:, None, :]
    )
    tgt_mask = causal(n_tgt)
    if tgt_lengths is not None:
        tgt_mask = tgt_mask & (np.arange(n_tgt)[None, :] < np.asarray(tgt_lengths)[:, None])[:, None, :]
    return src_mask, tgt_mask


def _input(g: _Graph, name: str, value: np.ndarray) -> None:
    """An exact input (the rounded values the implementation was given): no error of its own."""
    g.source(name, np.asarray(value, dtype=np.float64), lambda p: np.zeros(np.shape(value)))


def encoder_layer(
    x: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    mask: np.ndarray | None,
    eps: float,
    precisions: Sequence[Precision],
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> np.ndarray:
    """First-order bound for the encoder layer (§3.1): MHA, sum, LayerNorm, FFN, sum, LayerNorm; in training mode
    (``keep``: the masks of §5.4's dropout by sub-layer, ``p`` its rate) each sub-layer's output dropped before its
    sum."""
    g = _Graph()
    _input(g, "x", x)
    return g.bound(_encoder(g, "x", params, num_heads, mask, eps, "enc", keep, p), precisions)


def decoder_layer(
    y: np.ndarray,
    memory: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
    eps: float,
    precisions: Sequence[Precision],
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> np.ndarray:
    """First-order bound for the decoder layer (§3.1); ``self_mask`` None means causal (§3.2.3); ``keep``, ``p``: as
    :func:`encoder_layer`'s."""
    self_mask = causal(y.shape[-2]) if self_mask is None else self_mask
    g = _Graph()
    _input(g, "y", y)
    _input(g, "memory", memory)
    out = _decoder(g, "y", "memory", params, num_heads, self_mask, memory_mask, eps, "dec", keep, p)
    return g.bound(out, precisions)


def _embedding(g: _Graph, name: str, tokens: np.ndarray, embedding: np.ndarray) -> None:
    """E[tokens] sqrt(d) + PE (§3.4, §3.5): gather exact, gamma_2 for sqrt(d) and the product, PE's bound, the sum."""
    from aiayn.reference.positional import positional_encoding

    n, d = tokens.shape[-1], embedding.shape[1]
    scaled = embedding[tokens] * math.sqrt(d)
    x = scaled + positional_encoding(n, d)
    g.source(
        name,
        x,
        lambda p: gamma(2, p.op) * np.abs(scaled) + B.positional_encoding(n, d, p) + p.op * np.abs(x) + 2 * p.eta,
    )


def _forward_graph(
    src: np.ndarray,
    tgt: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    eps: float,
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> _Graph:
    """The whole model's stages (Figure 1) evaluated in float64, the last one its logits (stage "logits"); in training
    mode (``keep``: the masks by place, ``reference.model.dropout_places``) with dropout's stages where §5.4 puts
    them."""
    src_mask, tgt_mask = source_and_target_masks(src.shape[1], tgt.shape[1], src_lengths, tgt_lengths)
    emb = params["embedding"]
    g = _Graph()
    _embedding(g, "src", src, emb)
    x = _add_dropout(g, "src", keep, "src_embedding", p)
    for i, layer in enumerate(params["encoder"]):
        x = _encoder(g, x, layer, num_heads, src_mask, eps, f"enc{i}", layer_keep(keep, "encoder", i), p)
    _embedding(g, "tgt", tgt, emb)
    y = _add_dropout(g, "tgt", keep, "tgt_embedding", p)
    for i, layer in enumerate(params["decoder"]):
        y = _decoder(g, y, x, layer, num_heads, tgt_mask, src_mask, eps, f"dec{i}", layer_keep(keep, "decoder", i), p)
    yv = g.values[y]
    d = emb.shape[1]
    g.stage(
        "logits",
        (y,),
        yv @ emb.T,
        lambda a, ta: ta @ emb.T,
        lambda p: gamma(d + 1, p.op) * (np.abs(yv) @ np.abs(emb).T) + (d + 1) * p.eta,
        lambda c: (c @ emb,),
    )
    return g


def transformer_forward(
    src: np.ndarray,
    tgt: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    eps: float,
    precisions: Sequence[Precision],
    keep: Mapping[str, np.ndarray] | None = None,
    p: float = 0.0,
) -> np.ndarray:
    """First-order bound for the logits (Figure 1): both embeddings, the stacks, the tied projection y E^T (§3.4); in
    training mode (``keep``, ``p``) with §5.4's dropout stages.

    The encoder's stages reach the logits through every decoder layer's encoder-decoder attention
    (the graph is a DAG: the memory feeds each cross-attention).
    """
    g = _forward_graph(src, tgt, params, num_heads, src_lengths, tgt_lengths, eps, keep, p)
    return g.bound("logits", precisions)


def layer_norm_inputs(
    src: np.ndarray,
    tgt: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    eps: float,
) -> list[np.ndarray]:
    """The exact rows x + Sublayer(x) that each LayerNorm of the whole model reads (§3.1), in float64, encoder first."""
    g = _forward_graph(src, tgt, params, num_heads, src_lengths, tgt_lengths, eps)
    return [g.values[name] for name in g.norm_inputs]
