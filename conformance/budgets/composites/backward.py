"""Error budgets for the composites' gradients (an encoder layer, a decoder layer, the whole model): first order.

A composite's backward is the chain rule through its sub-layers' backwards (``reference/model.py``): the forward
stages first (``budgets/composites/forward.py``), then, from the output back, each sub-layer's VJP (LayerNorm's, Eq.
(2)'s, multi-head attention's), the residual sums of the cotangents, and for the whole model the tied projection's and
the embeddings' shares. The bound is the same first-order forward error analysis as the forward's [H, §1.6; §3.5]:

    computed gradient - exact gradient  =  sum_k  J_k l_k  +  O(u^2),

over every stage k of the whole computation, forward and backward: l_k the stage's own rounding error, bounded
elementwise by that equation's own budget at the stage's exact inputs (``budgets/forward.py`` for a forward stage,
``budgets/backward.py`` for a backward one: each covers the forward quantities its backward saves or recomputes),
and J_k the Jacobian of the rest of the computation with respect to that stage's output. A forward stage's error
reaches the gradients through every backward stage that reads its value (LayerNorm's x_hat and s, attention's P,
the FFN's gate and hidden layer): the Jacobians of the backward formulas with respect to their forward inputs are
written out below (forward-mode derivatives of the VJPs, one column per perturbed element, as
``budgets/composites/forward.py`` does for the forward). The Jacobians are evaluated at the exact intermediate values;
terms of second order in u are neglected (the "<~" of [H]).

The one place the first order does not hold is ReLU's gate: a unit whose exact pre-activation lies within the
computed pre-activation's error of 0 may switch, and its share of the FFN's backward jumps by the whole cotangent.
The FFN's backward budget allows both branches there (``budgets.backward.feed_forward``), with the pre-activation's
error including what reaches the FFN's input from upstream (its first-order bound at that stage).

The oracle's own error (``reference/model.py``'s fast tier: longdouble throughout) is bounded by the same sum at
float64 and added, through the same Jacobians (``equations.py``: "propagated").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aiayn.conformance.budgets import backward as BB
from aiayn.conformance.budgets.composites.forward import (
    Tangent,
    _decoder,
    _embedding,
    _encoder,
    _Graph,
    _input,
    _merge,
    _softmax_masked,
    _split,
    _zero,
    causal,
    source_and_target_masks,
)
from aiayn.conformance.numerics import Precision, gamma

__all__ = ["decoder_layer", "encoder_layer", "transformer_forward"]

MHA_PARAMS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _rows(a: np.ndarray) -> np.ndarray:
    """A value's rows: (R, width)."""
    return a.reshape(-1, a.shape[-1])


def _trows(t: np.ndarray) -> np.ndarray:
    """A tangent's rows, per column: (n, R, width)."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def _outer(a: np.ndarray, ta: Tangent, b: np.ndarray, tb: Tangent) -> np.ndarray:
    """The tangent of Sum_rows a^T b (a parameter's gradient) for tangents ta of a and tb of b: (n, width_a,
    width_b)."""
    total = np.zeros((1, a.shape[-1], b.shape[-1]))
    if ta is not None:
        total = total + np.einsum("nri,rj->nij", _trows(ta), _rows(b))
    if tb is not None:
        total = total + np.einsum("ri,nrj->nij", _rows(a), _trows(tb))
    return total


def _row_sum(t: np.ndarray) -> np.ndarray:
    """The tangent of Sum_rows a (a bias's gradient): (n, width)."""
    return _trows(t).sum(axis=1)


def _sum_local(*terms: np.ndarray):
    """The bound of one rounded sum of len(terms) arrays (a residual's cotangent): gamma_{m-1} Sum |terms|."""
    magnitude = sum(np.abs(t) for t in terms)
    return lambda p: gamma(max(len(terms) - 1, 1), p.op) * magnitude + len(terms) * p.eta


# --------------------------------------------------------------------------------------------
# the sub-layers' backwards: values and their forward-mode derivatives


def _layer_norm_back(
    r: np.ndarray, gain: np.ndarray, eps: float, d: np.ndarray, tr: Tangent = None, td: Tangent = None
) -> tuple[tuple[np.ndarray, ...], tuple[Tangent, ...]]:
    """LayerNorm's VJP (dr, dgain, dbias) at input r for the cotangent d, and its tangents.

    dr = (h - mean h - x_hat mean(h x_hat)) / s with h = gain d; with dc = tr - mean tr: ds = mean(x_hat dc),
    dx_hat = (dc - x_hat ds) / s, and d(dr) = (th - mean th - dx_hat B - x_hat dB) / s - dr ds / s with
    B = mean(h x_hat), dB = mean(th x_hat + h dx_hat); d(dgain) = Sum (td x_hat + d dx_hat); d(dbias) = Sum td.
    """
    c = r - np.mean(r, axis=-1, keepdims=True)
    s = np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    xh = c / s
    h = d * gain
    b = np.mean(h * xh, axis=-1, keepdims=True)
    dr = (h - np.mean(h, axis=-1, keepdims=True) - xh * b) / s
    values = (dr, _rows(d * xh).sum(axis=0), _rows(d).sum(axis=0))
    if tr is None and td is None:
        return values, (None, None, None)
    dxh, ds = np.zeros((1, *r.shape)), np.zeros((1, *s.shape))
    if tr is not None:
        dc = tr - np.mean(tr, axis=-1, keepdims=True)
        ds = np.mean(xh * dc, axis=-1, keepdims=True)
        dxh = (dc - xh * ds) / s
    th = _zero(td, d) * gain
    tb = np.mean(th * xh + h * dxh, axis=-1, keepdims=True)
    t_dr = (th - np.mean(th, axis=-1, keepdims=True) - dxh * b - xh * tb) / s - dr * ds / s
    t_gain = _row_sum(_zero(td, d) * xh + d * dxh)
    return values, (t_dr, t_gain, None if td is None else _row_sum(td))


def _ffn_back(
    x: np.ndarray, w: Mapping[str, np.ndarray], d: np.ndarray, tx: Tangent = None, td: Tangent = None
) -> tuple[tuple[np.ndarray, ...], tuple[Tangent, ...]]:
    """Eq. (2)'s VJP (dx, dw1, db1, dw2, db2) at input x for the cotangent d, and its tangents (the gate held at
    the exact pre-activation's sign: its switching is the FFN budget's either-branch term)."""
    z = x @ w["w1"] + w["b1"]
    gate = (z > 0).astype(np.float64)
    hidden = z * gate
    dz = (d @ w["w2"].T) * gate
    values = (dz @ w["w1"].T, _rows(x).T @ _rows(dz), _rows(dz).sum(axis=0), _rows(hidden).T @ _rows(d))
    values = (*values, _rows(d).sum(axis=0))
    if tx is None and td is None:
        return values, (None,) * 5
    t_hidden = None if tx is None else (tx @ w["w1"]) * gate
    t_dz = None if td is None else (td @ w["w2"].T) * gate
    tangents = (
        None if t_dz is None else t_dz @ w["w1"].T,
        _outer(x, tx, dz, t_dz),
        None if t_dz is None else _row_sum(t_dz),
        _outer(hidden, t_hidden, d, td),
        None if td is None else _row_sum(td),
    )
    return values, tangents


def _mha_back(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: Mapping[str, np.ndarray],
    h: int,
    mask: np.ndarray | None,
    d: np.ndarray,
    tquery: Tangent = None,
    tkey: Tangent = None,
    tvalue: Tangent = None,
    td: Tangent = None,
) -> tuple[dict[str, np.ndarray], dict[str, Tangent]]:
    """MultiHead's VJP (dquery, dkey, dvalue and every parameter's gradient, by name) for the cotangent d, and the
    tangents (``reference/attention.py``'s formulas, differentiated once more):
    tS = (tq k^T + q tk^T) / sqrt(d_k) (0 where masked), tP = P (.) (tS - Sum P tS), tO = tP v + P tv;
    d(dV) = tP^T dO + P^T tdO; d(dP) = tdO v^T + dO tv^T; d(dS) = tP (.) (dP - D) + P (.) (tdP - tD) with
    tD = Sum (tP dP + P tdP); d(dq) = (tdS k + dS tk) / sqrt(d_k), d(dk) = (tdS^T q + dS^T tq) / sqrt(d_k); each
    projection's weight gradient Sum in^T d(out) differentiated in both factors."""

    def bias(name: str) -> Any:
        return params[name] if params.get(name) is not None else 0.0

    proj = {"q": query @ params["w_q"] + bias("b_q"), "k": key @ params["w_k"] + bias("b_k")}
    proj["v"] = value @ params["w_v"] + bias("b_v")
    q, k, v = (_split(proj[x], h) for x in "qkv")  # (..., h, n, d)
    root = math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) / root
    visible = np.ones(s.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask)[..., None, :, :], s.shape)
    p = _softmax_masked(s, visible)
    concat = _merge(p @ v)
    d_o = _split(d @ params["w_o"].T, h)  # (..., h, n_q, d_v)
    dv = np.swapaxes(p, -1, -2) @ d_o
    dp = d_o @ np.swapaxes(v, -1, -2)
    big_d = np.sum(p * dp, axis=-1, keepdims=True)
    ds = p * (dp - big_d)
    dq, dk = ds @ k / root, np.swapaxes(ds, -1, -2) @ q / root
    merged = {"q": _merge(dq), "k": _merge(dk), "v": _merge(dv)}
    ins = {"q": query, "k": key, "v": value}
    names = {"q": "query", "k": "key", "v": "value"}
    grads = {"w_o": _rows(concat).T @ _rows(d), "b_o": _rows(d).sum(axis=0)}
    for x in "qkv":
        grads[f"w_{x}"] = _rows(ins[x]).T @ _rows(merged[x])
        grads[f"b_{x}"] = _rows(merged[x]).sum(axis=0)
        grads[names[x]] = merged[x] @ params[f"w_{x}"].T
    tins = {"q": tquery, "k": tkey, "v": tvalue}
    if all(t is None for t in (*tins.values(), td)):
        return grads, {}
    tp = {x: None if tins[x] is None else _split(tins[x] @ params[f"w_{x}"], h) for x in "qkv"}
    t_s = np.zeros((1, *s.shape))
    if tp["q"] is not None:
        t_s = t_s + tp["q"] @ np.swapaxes(k, -1, -2) / root
    if tp["k"] is not None:
        t_s = t_s + q @ np.swapaxes(tp["k"], -1, -2) / root
    t_s = np.where(visible, t_s, 0.0)
    t_p = p * (t_s - np.sum(p * t_s, axis=-1, keepdims=True))
    t_o = t_p @ v + (0.0 if tp["v"] is None else p @ tp["v"])
    t_do = np.zeros((1, *d_o.shape)) if td is None else _split(td @ params["w_o"].T, h)
    t_dv = np.swapaxes(t_p, -1, -2) @ d_o + np.swapaxes(p, -1, -2) @ t_do
    t_dp = t_do @ np.swapaxes(v, -1, -2) + (0.0 if tp["v"] is None else d_o @ np.swapaxes(tp["v"], -1, -2))
    t_big_d = np.sum(t_p * dp + p * t_dp, axis=-1, keepdims=True)
    t_ds = t_p * (dp - big_d) + p * (t_dp - t_big_d)
    t_dq = t_ds @ k / root + (0.0 if tp["k"] is None else ds @ tp["k"] / root)
    t_dk = np.swapaxes(t_ds, -1, -2) @ q / root + (0.0 if tp["q"] is None else np.swapaxes(ds, -1, -2) @ tp["q"] / root)
    t_merged = {"q": _merge(t_dq), "k": _merge(t_dk), "v": _merge(t_dv)}
    tangents: dict[str, Tangent] = {"w_o": _outer(concat, _merge(t_o), d, td)}
    tangents["b_o"] = None if td is None else _row_sum(td)
    for x in "qkv":
        tangents[f"w_{x}"] = _outer(ins[x], tins[x], merged[x], t_merged[x])
        tangents[f"b_{x}"] = _row_sum(t_merged[x])
        tangents[names[x]] = t_merged[x] @ params[f"w_{x}"].T
    return grads, tangents


# --------------------------------------------------------------------------------------------
# the backward stages


class _Backward:
    """Adds the backward stages of a composite to a graph that holds its forward stages
    (``budgets/composites/forward.py``'s names: "<tag>.z.sum" is a residual sum, "<tag>.z" its LayerNorm,
    "<tag>.attn" an attention, ...)."""

    def __init__(self, g: _Graph) -> None:
        self.g = g
        self._input_errors: dict[tuple[str, str], np.ndarray] = {}  # by (stage, repr of the precision)

    def norm(self, name: str, norm: Mapping[str, np.ndarray], eps: float, d: str, grads: str) -> str:
        """LayerNorm ``name``'s backward for the cotangent ``d``: dgain, dbias as ``grads``.gain/.bias; returns the
        name of d(x + Sublayer(x))."""
        g, gain = self.g, norm["gain"]
        r, dv = g.values[f"{name}.sum"], g.values[d]
        (dr, dgain, dbias), _ = _layer_norm_back(r, gain, eps, dv)
        g.stages(
            (f"{name}.dsum", f"{grads}.gain", f"{grads}.bias"),
            (f"{name}.sum", d),
            (dr, dgain, dbias),
            lambda a, b, ta, tb: _layer_norm_back(a, gain, eps, b, ta, tb)[1],
            lambda p: tuple(BB.layer_norm(r, gain, norm["bias"], eps, dv, p)[k] for k in ("x", "gain", "bias")),
        )
        return f"{name}.dsum"

    def _error_at(self, name: str, p: Precision) -> np.ndarray:
        """The first-order bound at forward stage ``name`` in precision ``p`` (an FFN's input: its gate's margin)."""
        key = (name, repr(p))
        if key not in self._input_errors:
            self._input_errors[key] = self.g.bound(name, [p])
        return self._input_errors[key]

    def ffn(self, name: str, x: str, w: Mapping[str, np.ndarray], d: str, grads: str) -> str:
        """The FFN ``name``'s backward (its input ``x``) for the cotangent ``d``; returns the name of its dx."""
        g = self.g
        xv, dv = g.values[x], g.values[d]
        values, _ = _ffn_back(xv, w, dv)
        outs = (f"{name}.dx", *(f"{grads}.{k}" for k in ("w1", "b1", "w2", "b2")))

        def local(p: Precision) -> tuple[np.ndarray, ...]:
            bounds = BB.feed_forward(xv, w["w1"], w["b1"], w["w2"], w["b2"], dv, p, x_error=self._error_at(x, p))
            return tuple(bounds[k] for k in ("x", "w1", "b1", "w2", "b2"))

        g.stages(outs, (x, d), values, lambda a, b, ta, tb: _ffn_back(a, w, b, ta, tb)[1], local)
        return f"{name}.dx"

    def attention(
        self, name: str, q: str, k: str, v: str, params: Mapping[str, np.ndarray], h: int, mask, d: str, grads: str
    ) -> tuple[str, str, str]:
        """The attention ``name``'s backward for the cotangent ``d``; returns the names of dquery, dkey, dvalue."""
        g = self.g
        qv, kv, vv, dv = g.values[q], g.values[k], g.values[v], g.values[d]
        values, _ = _mha_back(qv, kv, vv, params, h, mask, dv)
        given = [n for n in MHA_PARAMS if params.get(n) is not None]
        keys = ("query", "key", "value", *given)
        outs = (f"{name}.dquery", f"{name}.dkey", f"{name}.dvalue", *(f"{grads}.{n}" for n in given))

        def jvp(a, b, c, e, ta, tb, tc, te):
            tangents = _mha_back(a, b, c, params, h, mask, e, ta, tb, tc, te)[1]
            return tuple(tangents.get(n) for n in keys)

        def local(p: Precision) -> tuple[np.ndarray, ...]:
            bounds = BB.multi_head_attention(qv, kv, vv, params, h, mask, dv, p)
            return tuple(bounds[n] for n in keys)

        g.stages(outs, (q, k, v, d), tuple(values[n] for n in keys), jvp, local)
        return outs[0], outs[1], outs[2]

    def add(self, name: str, terms: Sequence[str]) -> str:
        """One rounded sum of cotangents (a residual's two paths, self-attention's three uses)."""
        g = self.g
        values = [g.values[t] for t in terms]
        total = sum(values[1:], values[0])
        g.stage(
            name,
            tuple(terms),
            total,
            lambda *a: sum(_zero(t, v) for t, v in zip(a[len(terms) :], values)),
            _sum_local(*values),
        )
        return name

    def encoder(self, tag: str, x: str, params: Mapping[str, Any], h: int, mask, eps: float, d: str, grads: str) -> str:
        """An encoder layer's backward (its forward stages under ``tag``); returns the name of its dx."""
        d_r2 = self.norm(f"{tag}.out", params["norm2"], eps, d, f"{grads}norm2")
        d_z = self.add(f"{tag}.dz", (d_r2, self.ffn(f"{tag}.ffn", f"{tag}.z", params["ffn"], d_r2, f"{grads}ffn")))
        d_r1 = self.norm(f"{tag}.z", params["norm1"], eps, d_z, f"{grads}norm1")
        dq, dk, dv = self.attention(f"{tag}.attn", x, x, x, params["self_attn"], h, mask, d_r1, f"{grads}self_attn")
        return self.add(f"{tag}.dx", (d_r1, dq, dk, dv))

    def decoder(
        self,
        tag: str,
        y: str,
        memory: str,
        params: Mapping[str, Any],
        h: int,
        self_mask,
        memory_mask,
        eps: float,
        d: str,
        grads: str,
    ) -> tuple[str, str]:
        """A decoder layer's backward; returns the names of its dy and its dmemory (key and value uses)."""
        d_r3 = self.norm(f"{tag}.out", params["norm3"], eps, d, f"{grads}norm3")
        d_b = self.add(f"{tag}.db", (d_r3, self.ffn(f"{tag}.ffn", f"{tag}.b", params["ffn"], d_r3, f"{grads}ffn")))
        d_r2 = self.norm(f"{tag}.b", params["norm2"], eps, d_b, f"{grads}norm2")
        cq, ck, cv = self.attention(
            f"{tag}.cross",
            f"{tag}.a",
            memory,
            memory,
            params["cross_attn"],
            h,
            memory_mask,
            d_r2,
            f"{grads}cross_attn",
        )
        d_a = self.add(f"{tag}.da", (d_r2, cq))
        d_r1 = self.norm(f"{tag}.a", params["norm1"], eps, d_a, f"{grads}norm1")
        sq, sk, sv = self.attention(
            f"{tag}.self", y, y, y, params["self_attn"], h, self_mask, d_r1, f"{grads}self_attn"
        )
        return self.add(f"{tag}.dy", (d_r1, sq, sk, sv)), self.add(f"{tag}.dmemory", (ck, cv))


def _layer_names(params: Mapping[str, Any], grads: str) -> list[str]:
    """Every gradient of a layer the graph names: its inputs', then ``grads`` + each parameter's path."""
    names: list[str] = []
    for sub, value in params.items():
        names += [f"{grads}{sub}.{k}" for k, a in value.items() if a is not None]
    return names


def _bounds(g: _Graph, stages: Mapping[str, str], precisions: Sequence[Precision]) -> dict[str, np.ndarray]:
    """The bound of each gradient (by its name in the record) at its stage of the graph."""
    found = g.bounds(list(stages.values()), precisions)
    return {name: found[stage] for name, stage in stages.items()}


def encoder_layer(
    x: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    mask: np.ndarray | None,
    eps: float,
    d_out: np.ndarray,
    precisions: Sequence[Precision],
) -> dict[str, np.ndarray]:
    """First-order bounds for an encoder layer's gradients (§3.1), by name ("x", "self_attn.w_q", ...)."""
    g = _Graph()
    _input(g, "x", x)
    _encoder(g, "x", params, num_heads, mask, eps, "enc")
    _input(g, "d_out", d_out)
    dx = _Backward(g).encoder("enc", "x", params, num_heads, mask, eps, "d_out", "")
    stages = {name: name for name in _layer_names(params, "")} | {"x": dx}
    return _bounds(g, stages, precisions)


def decoder_layer(
    y: np.ndarray,
    memory: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
    eps: float,
    d_out: np.ndarray,
    precisions: Sequence[Precision],
) -> dict[str, np.ndarray]:
    """First-order bounds for a decoder layer's gradients (§3.1), by name ("y", "memory", "cross_attn.w_k", ...);
    ``self_mask`` None means causal (§3.2.3)."""
    self_mask = causal(y.shape[-2]) if self_mask is None else self_mask
    g = _Graph()
    _input(g, "y", y)
    _input(g, "memory", memory)
    _decoder(g, "y", "memory", params, num_heads, self_mask, memory_mask, eps, "dec")
    _input(g, "d_out", d_out)
    back = _Backward(g)
    dy, dmemory = back.decoder("dec", "y", "memory", params, num_heads, self_mask, memory_mask, eps, "d_out", "")
    stages = {name: name for name in _layer_names(params, "")} | {"y": dy, "memory": dmemory}
    return _bounds(g, stages, precisions)


def transformer_forward(
    src: np.ndarray,
    tgt: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    eps: float,
    d_logits: np.ndarray,
    precisions: Sequence[Precision],
) -> dict[str, np.ndarray]:
    """First-order bounds for the whole model's gradients (Figure 1), by parameter path ("embedding", "positional"
    when learned, "encoder.0.ffn.w1", ...). The tied matrix E's gradient sums the projection's share
    (dlogits^T y) and the two lookups' (sqrt(d_model) dX at each id): one stage whose own error is that of the sum
    of k + 2 terms for a row whose id occurs k times (gamma_{k+2}) and of the products by sqrt(d_model)."""
    if "positional" in params:  # the strategies draw the sinusoids only; the forward stages assume them
        return _not_checked(params)
    src_mask, tgt_mask = source_and_target_masks(src.shape[1], tgt.shape[1], src_lengths, tgt_lengths)
    emb = params["embedding"]
    vocab, d_model = emb.shape
    g = _Graph()
    _embedding(g, "src", src, emb)
    x = "src"
    for i, layer in enumerate(params["encoder"]):
        x = _encoder(g, x, layer, num_heads, src_mask, eps, f"enc{i}")
    _embedding(g, "tgt", tgt, emb)
    ys = ["tgt"]
    for i, layer in enumerate(params["decoder"]):
        ys.append(_decoder(g, ys[-1], x, layer, num_heads, tgt_mask, src_mask, eps, f"dec{i}"))
    yv, dl = g.values[ys[-1]], np.asarray(d_logits, dtype=np.float64)
    # logits = y E^T: E's projection share Sum_rows dlogits^T y (y carries the forward's error); dy = dlogits E
    # (exact inputs only: its own rounding)
    g.stage(
        "d_e_out",
        (ys[-1],),
        _rows(dl).T @ _rows(yv),
        lambda a, ta: np.einsum("rv,nrd->nvd", _rows(dl), _trows(ta)),
        lambda p: gamma(_rows(dl).shape[0] + 1, p.op) * (np.abs(_rows(dl)).T @ np.abs(_rows(yv))) + p.eta,
    )
    g.source("d_top", dl @ emb, lambda p: gamma(vocab, p.op) * (np.abs(dl) @ np.abs(emb)) + vocab * p.eta)
    back = _Backward(g)
    d, d_memory = "d_top", []
    for i in reversed(range(len(params["decoder"]))):
        d, dm = back.decoder(
            f"dec{i}", ys[i], x, params["decoder"][i], num_heads, tgt_mask, src_mask, eps, d, f"decoder.{i}."
        )
        d_memory.append(dm)
    dx = back.add("d_memory", d_memory) if len(d_memory) > 1 else d_memory[0]
    enc_inputs = ["src"] + [f"enc{i}.out" for i in range(len(params["encoder"]) - 1)]
    for i in reversed(range(len(params["encoder"]))):
        dx = back.encoder(f"enc{i}", enc_inputs[i], params["encoder"][i], num_heads, src_mask, eps, dx, f"encoder.{i}.")
    _embedding_gradient(g, src, tgt, vocab, math.sqrt(d_model), dx, d)
    stages = {"embedding": "embedding"}
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(params[stack]):
            stages |= {name: name for name in _layer_names(layer, f"{stack}.{i}.")}
    return _bounds(g, stages, precisions)


def _not_checked(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every gradient's bound infinite: the harness counts each element "not checked" (never passed). Used where the
    forward stages cannot be built: a learned positional table, which the strategies never draw."""
    from aiayn.reference.model import flatten_params

    return {name: np.full(np.shape(a), np.inf) for name, a in flatten_params(params).items()}


def _embedding_gradient(g: _Graph, src: np.ndarray, tgt: np.ndarray, vocab: int, root: float, dx: str, dy: str):
    """E's gradient (§3.4): the projection's share plus sqrt(d_model) times the cotangents at the ids of both
    sequences; a row whose id occurs k times sums k + 1 terms, each product by sqrt(d_model) one more rounding."""
    d_out, d_src, d_tgt = g.values["d_e_out"], g.values[dx], g.values[dy]

    def scatter(ids: np.ndarray, t: np.ndarray) -> np.ndarray:  # (n, B, n_pos, d) -> (n, vocab, d)
        onehot = (ids.reshape(-1)[:, None] == np.arange(vocab)[None, :]).astype(np.float64)
        return np.einsum("rv,nrd->nvd", onehot, _trows(t))

    value = d_out + (scatter(src, d_src[None])[0] + scatter(tgt, d_tgt[None])[0]) * root
    counts = np.bincount(np.concatenate([src.reshape(-1), tgt.reshape(-1)]), minlength=vocab)[:, None]
    magnitude = np.abs(d_out) + (scatter(src, np.abs(d_src)[None])[0] + scatter(tgt, np.abs(d_tgt)[None])[0]) * root
    terms = counts + 1
    g.stage(
        "embedding",
        ("d_e_out", dx, dy),
        value,
        lambda a, b, c, ta, tb, tc: (
            _zero(ta, a)
            + (0.0 if tb is None else scatter(src, tb) * root)
            + (0.0 if tc is None else scatter(tgt, tc) * root)
        ),
        lambda p: (gamma(2, p.op) + gamma(terms, p.op)) * magnitude + (terms + 2) * p.eta,
    )
