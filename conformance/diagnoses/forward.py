"""Named diagnoses: when an agreement check fails, which known departure from the paper does the output match?

A catalogue of departures real code makes, each an *oracle variant*: the paper's equations with
one thing done differently (the project's mutants, and what tutorials and libraries are known to
do). When an agreement check fails, :func:`explain` evaluates every variant that concerns the
equation on the same (rounded) inputs and names each whose output agrees with the
implementation's within the check's own budget; the message and the report then say, for
example, "LayerNorm (§3.1) disagrees; the output matches 'unbiased variance, eps added to the
std'".

The variants are computed here, in longdouble, by one small model of the paper (:class:`Ops`
with its defaults is the paper; ``tests/meta/test_diagnoses.py`` checks it equals the oracle,
``aiayn.reference``, on every equation) with one operation swapped. A variant's own rounding is
below the oracle's float64 share, which the budget includes, so "agrees within budget" has the
budget's meaning. Two kinds are numerical rather than algebraic (the unshifted softmax, the
one-pass variance): they are computed in the dtype of the check, as such code computes them.
"float32 inside a float64 claim" compares with the paper's output within float32's budget.

Where the paper is explicit (biased variance, eps inside the square root, post-norm, ReLU, -inf
masking, interleaved sin/cos, positions from 0), a match names a departure; where it is silent
(the fully masked row, label smoothing's K, step 0), the declared policies say what is checked
and a departure names a choice other than the declared one.
"""

from __future__ import annotations

import contextvars
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from aiayn.conformance.budgets._heads import affine, merge, split

__all__ = ["CATALOGUE", "PRECISION_DEPARTURES", "Departure", "Ops", "PAPER", "agreeing", "evaluate", "explain"]

LD = np.longdouble


@dataclass(frozen=True)
class Ops:
    """How each piece of the model is computed; the defaults are the paper's."""

    scale: str = "sqrt_dk"  # sqrt_dk | dk | none | sqrt_dmodel
    softmax_over: str = "keys"  # keys | queries
    mask: str = "-inf"  # -inf | after_softmax | add:-1e4 | add:-1e9 | fill:-1e9 | ignored
    fully_masked: str | None = None  # None: the declared policy; else nan | zeros | uniform
    softmax_shift: bool = True
    softmax_last_axis: bool = False
    softmax_length_one: bool = False  # True: 1 over a length-1 axis, whatever the input (NaN and +-inf included)
    heads: str = "blocks"  # blocks | strided | reversed
    pe: str = "interleaved"  # the layout of sin and cos: interleaved | swapped | halves ([sin | cos])
    pe_spacing: str = "2i/d"  # the frequencies' exponent: 2i/d (§3.5) | i/d | t2t: i/max(d/2 - 1, 1) (tensor2tensor)
    # | t2t_unguarded: i/(d/2 - 1), NaN at d = 2
    pe_base: float = 10000.0
    pe_start: int = 0  # the first position's index
    layer_norm: str = "biased"  # biased | unbiased | eps_std | unbiased_eps_std | one_pass | scale_shift
    activation: str = "relu"  # relu | none | gelu | bias_after_relu
    ffn_sublayer: str = "none"  # none | residual | pre_norm:<eps> (x + FFN(LayerNorm(x))) | post_norm:<eps>
    residual: str = "post"  # post | pre
    embed_scale: str = "before_pe"  # before_pe: E[x] sqrt(d) + PE (§3.4) | none | after_pe: (E[x] + PE) sqrt(d)
    output_scale: str = "none"  # none | rsqrt_d: the decoder's output times d_model^-1/2 before the tied projection
    final_norm: str = "none"  # none | encoder | decoder | both: a LayerNorm (gain 1, bias 0) after the stack
    causal_offset: int = 0
    unwritten_tail: int = 0  # 0: every query row written; T: beyond one tile, rows past the last whole tile left 0
    lrate_shift: int = 0
    adam_beta2: float | None = None  # None: as given; else Adam's beta2 in its place (a framework's default)
    adam_eps_value: float | None = None  # None: as given; else Adam's eps in its place
    adam_eps: str | None = None  # None: the declared placement; else outside | hat | inside
    adam_bias_correction: bool | None = None  # None: as declared
    checkpoints: str = "last"  # which are averaged: last (by step) | first (as given) | by_name (step as text) | all
    dropout: str = "inverted"  # inverted: keep x / (1 - p) | unscaled: keep x | times_keep: keep x (1 - p) | over_p
    # where a layer in training mode drops (§5.4): residual (each sub-layer's output, before its sum) | after_norm
    # (the layer's LayerNorm output) | on_sum (x + Sublayer(x), before its LayerNorm) | none (its masks not applied)
    dropout_place: str = "residual"
    embedding_dropout: bool = True  # the whole model in training mode drops the embeddings' sums (§5.4)
    smoothing: str | None = None  # None: the declared policy; else K | K-1 | K-2 | none


PAPER = Ops()

#: Whether :func:`explain` (and the backward's) goes on to pairs where no single departure agrees: False while
#: Hypothesis searches (``run/comparison.py`` sets it), where every failing example is diagnosed and a pair search
#: costs up to a second; the examples a failure message shows are diagnosed in full.
PAIRS: contextvars.ContextVar[bool] = contextvars.ContextVar("aiayn_pairs", default=True)


# --------------------------------------------------------------------------------------------
# the model, in longdouble (the numerical variants in the check's dtype)


def _compute_type(dtype: str | None) -> Any:
    return (
        LD
        if dtype is None
        else {"float64": np.float64, "float32": np.float32, "float16": np.float16}.get(dtype, np.float32)
    )


def _softmax(z: np.ndarray, axis: int, ops: Ops, dtype: str | None = None) -> np.ndarray:
    if ops.softmax_last_axis:
        axis = -1
    if ops.softmax_length_one and z.shape[axis] == 1:  # a shortcut: one element, weight 1, nothing computed
        return np.ones(z.shape, dtype=LD)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if not ops.softmax_shift:  # numerical: exp overflows in the dtype, as unshifted code does
            e = np.exp(z.astype(_compute_type(dtype)))
            return (e / np.sum(e, axis=axis, keepdims=True)).astype(LD)
        e = np.exp(z - np.max(z, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax(x: np.ndarray, axis: int, ops: Ops = PAPER, dtype: str | None = None) -> np.ndarray:
    return _softmax(np.asarray(x, dtype=LD), axis, ops, dtype)


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    fully_masked: str,
    ops: Ops = PAPER,
    d_model: int | None = None,
) -> np.ndarray:
    q, k, v = (np.asarray(a, dtype=LD) for a in (q, k, v))
    d_k = q.shape[-1]
    divisor = {"sqrt_dk": np.sqrt(LD(d_k)), "dk": LD(d_k), "none": LD(1), "sqrt_dmodel": np.sqrt(LD(d_model or d_k))}[
        ops.scale
    ]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / divisor  # (..., n_q, n_k)
    visible = (
        np.ones(s.shape, dtype=bool)
        if mask is None or ops.mask == "ignored"
        else np.broadcast_to(np.asarray(mask, dtype=bool), s.shape)
    )
    if ops.mask == "-inf":
        s = np.where(visible, s, LD(-np.inf))
    elif ops.mask.startswith("add:"):
        s = s + np.where(visible, LD(0), LD(float(ops.mask[4:])))
    elif ops.mask.startswith("fill:"):
        s = np.where(visible, s, LD(float(ops.mask[5:])))
    p = _softmax(s, -2 if ops.softmax_over == "queries" else -1, ops)
    if ops.mask == "after_softmax":
        p = p * visible
    policy = ops.fully_masked or fully_masked
    if ops.mask == "-inf" and ops.softmax_over == "keys":
        dead = ~np.any(visible, axis=-1, keepdims=True)
        p = np.where(dead, {"nan": LD(np.nan), "zeros": LD(0), "uniform": LD(1) / LD(s.shape[-1])}[policy], p)
    out = np.matmul(p, v)
    tile = ops.unwritten_tail
    if tile and out.shape[-2] > tile:  # a tiled kernel's loop over whole tiles only: the rest keep a zeroed buffer
        out[..., (out.shape[-2] // tile) * tile :, :] = 0
    return out


def _split(x: np.ndarray, h: int, layout: str) -> np.ndarray:
    """(..., n, h*d) -> (..., h, n, d): blocks (the paper's), strided (interleaved) columns."""
    *batch, n, width = x.shape
    if layout == "strided":
        return np.moveaxis(x.reshape(*batch, n, width // h, h), -1, -3)
    return split(x, h)


def _merge(x: np.ndarray, layout: str) -> np.ndarray:
    return merge(x[..., ::-1, :, :] if layout == "reversed" else x)


def _affine(x: np.ndarray, w: Any, b: Any) -> np.ndarray:
    return affine(x, np.asarray(w, dtype=LD), None if b is None else np.asarray(b, dtype=LD))


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    mask: np.ndarray | None,
    fully_masked: str,
    ops: Ops = PAPER,
) -> np.ndarray:
    h = int(num_heads)
    query, key, value = (np.asarray(a, dtype=LD) for a in (query, key, value))
    q = _split(_affine(query, params["w_q"], params.get("b_q")), h, ops.heads)
    k = _split(_affine(key, params["w_k"], params.get("b_k")), h, ops.heads)
    v = _split(_affine(value, params["w_v"], params.get("b_v")), h, ops.heads)
    m = None if mask is None else np.asarray(mask, dtype=bool)[..., None, :, :]
    heads = scaled_dot_product_attention(q, k, v, m, fully_masked, ops, d_model=query.shape[-1])
    return _affine(_merge(heads, ops.heads), params["w_o"], params.get("b_o"))


def pe_exponent(d_model: int, ops: Ops = PAPER) -> np.ndarray:
    """The frequencies' exponents e_i of a table (w_i = base^-e_i), one per sin/cos pair: (d_model/2,)."""
    i = np.arange(0, d_model, 2, dtype=LD) / 2  # the pair index i
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "2i/d": 2 * i / LD(d_model),
            "i/d": i / LD(d_model),
            "t2t": i / LD(max(d_model // 2 - 1, 1)),
            "t2t_unguarded": i / LD(d_model // 2 - 1),  # 0/0 at d_model = 2
        }[ops.pe_spacing]


def pe_table(d_model: int, ops: Ops) -> dict[str, Any]:
    """The positional budget's description of ``ops``'s table (``budgets.forward.positional_encoding``'s start,
    exponent, base, layout): how a positional departure is judged at its own values."""
    layout = ops.pe if ops.pe in ("halves", "swapped") else "interleaved"
    exponent = np.asarray(pe_exponent(d_model, ops), dtype=np.float64)
    return {"start": ops.pe_start, "exponent": exponent, "base": ops.pe_base, "layout": layout}


def positional_encoding(length: int, d_model: int, ops: Ops = PAPER) -> np.ndarray:
    """§3.5's table; ``ops.pe_spacing`` "t2t" with ``ops.pe`` "halves" is tensor2tensor's ``get_timing_signal_1d``
    (frequencies 10000^(-i / max(d/2 - 1, 1)), its guard against d/2 = 1 included, [sin | cos])."""
    pos = np.arange(length, dtype=LD)[:, None] + ops.pe_start  # (length, 1)
    theta = pos * np.power(LD(ops.pe_base), -pe_exponent(d_model, ops))  # (length, d/2)
    pe = np.empty((length, d_model), dtype=LD)
    if ops.pe == "halves":
        pe[:, : d_model // 2], pe[:, d_model // 2 :] = np.sin(theta), np.cos(theta)
    elif ops.pe == "swapped":
        pe[:, 0::2], pe[:, 1::2] = np.cos(theta), np.sin(theta)
    else:
        pe[:, 0::2], pe[:, 1::2] = np.sin(theta), np.cos(theta)
    return pe


def layer_norm(
    x: np.ndarray, gain: Any, bias: Any, eps: float, ops: Ops = PAPER, dtype: str | None = None
) -> np.ndarray:
    g, b = np.asarray(gain, dtype=LD), np.asarray(bias, dtype=LD)
    if ops.layer_norm == "one_pass":  # numerical: E[x^2] - E[x]^2 in the dtype, as such code computes it
        xd = np.asarray(x).astype(_compute_type(dtype))
        mean = np.mean(xd, axis=-1, keepdims=True)
        var = np.maximum(np.mean(xd * xd, axis=-1, keepdims=True) - mean * mean, 0)
        return ((xd - mean) / np.sqrt(var + xd.dtype.type(eps))).astype(LD) * g + b
    if ops.layer_norm == "scale_shift":  # numerical: every step in the dtype, as Keras' LayerNormalization computes it
        t = _compute_type(dtype)
        xt = np.asarray(x).astype(t)
        mean = np.mean(xt, axis=-1, keepdims=True)
        var = np.mean(np.square(xt - mean), axis=-1, keepdims=True)
        r = (1 / np.sqrt((var + t(eps)).astype(np.float64))).astype(t) * g.astype(
            t
        )  # rsqrt, one rounding (Keras: ops.rsqrt)
        return (xt * r + (b.astype(t) - mean * r)).astype(LD)
    x = np.asarray(x, dtype=LD)
    d = x.shape[-1]
    c = x - np.mean(x, axis=-1, keepdims=True)
    unbiased = ops.layer_norm in ("unbiased", "unbiased_eps_std")
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.sum(c * c, axis=-1, keepdims=True) / LD(d - 1 if unbiased else d)
        denom = np.sqrt(var) + LD(eps) if ops.layer_norm in ("eps_std", "unbiased_eps_std") else np.sqrt(var + LD(eps))
        return c / denom * g + b


def feed_forward(x: np.ndarray, w1: Any, b1: Any, w2: Any, b2: Any, ops: Ops = PAPER) -> np.ndarray:
    """Eq. (2); with ``ops.ffn_sublayer`` the module is the whole sub-layer around it: its own residual, and its
    own LayerNorm (gain 1, bias 0, the eps named) before (pre-norm) or after (post-norm) it."""
    x = np.asarray(x, dtype=LD)
    kind, _, eps = ops.ffn_sublayer.partition(":")
    if kind == "none":
        return _ffn(x, w1, b1, w2, b2, ops)
    ones, zeros = np.ones(x.shape[-1], dtype=LD), np.zeros(x.shape[-1], dtype=LD)
    if kind == "pre_norm":
        return x + _ffn(layer_norm(x, ones, zeros, float(eps), PAPER), w1, b1, w2, b2, ops)
    y = x + _ffn(x, w1, b1, w2, b2, ops)
    return layer_norm(y, ones, zeros, float(eps), PAPER) if kind == "post_norm" else y


def _ffn(x: np.ndarray, w1: Any, b1: Any, w2: Any, b2: Any, ops: Ops) -> np.ndarray:
    if ops.activation == "bias_after_relu":
        hidden = np.maximum(np.matmul(x, np.asarray(w1, dtype=LD)), 0) + np.asarray(b1, dtype=LD)
    else:
        pre = _affine(x, w1, b1)
        hidden = {
            "relu": lambda: np.maximum(pre, 0),
            "none": lambda: pre,
            "gelu": lambda: pre * (1 + np.vectorize(math.erf)(pre.astype(np.float64) / math.sqrt(2))).astype(LD) / 2,
        }[ops.activation]()
    return _affine(hidden, w2, b2)


def _norm(x: np.ndarray, p: Mapping[str, Any], eps: float, ops: Ops) -> np.ndarray:
    return layer_norm(x, p["gain"], p["bias"], eps, ops)


def _sublayer(
    x: np.ndarray,
    norm: Mapping[str, Any],
    eps: float,
    ops: Ops,
    f: Callable[[np.ndarray], np.ndarray],
    keep: Any = None,
    p: float = 0.0,
) -> np.ndarray:
    """LayerNorm(x + f(x)) (post-norm, §3.1) or x + f(LayerNorm(x)) (pre-norm); in training mode (``keep``, the
    sub-layer's mask) with §5.4's dropout where ``ops.dropout_place`` puts it."""
    place = "none" if keep is None else ops.dropout_place

    def drop(t: np.ndarray) -> np.ndarray:
        return t if place == "none" else dropout(t, keep, p, ops=ops)

    if ops.residual == "pre":
        return x + drop(f(_norm(x, norm, eps, ops)))
    if place == "after_norm":
        return drop(_norm(x + f(x), norm, eps, ops))
    if place == "on_sum":
        return _norm(drop(x + f(x)), norm, eps, ops)
    return _norm(x + (drop(f(x)) if place == "residual" else f(x)), norm, eps, ops)


def _kept(keep: Mapping[str, Any] | None, name: str) -> Any:
    return None if keep is None else keep[name]


def encoder_layer(
    x: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    mask: np.ndarray | None,
    eps: float,
    fully_masked: str,
    ops: Ops = PAPER,
    keep: Mapping[str, Any] | None = None,
    p: float = 0.0,
    seed: Any = None,
) -> np.ndarray:
    # keep, p: training mode (§5.4), the masks the implementation drew by sub-layer; seed: its draw's
    x = np.asarray(x, dtype=LD)
    z = _sublayer(
        x,
        params["norm1"],
        eps,
        ops,
        lambda t: multi_head_attention(t, t, t, params["self_attn"], num_heads, mask, fully_masked, ops),
        _kept(keep, "self_attn"),
        p,
    )
    f = params["ffn"]
    return _sublayer(
        z,
        params["norm2"],
        eps,
        ops,
        lambda t: feed_forward(t, f["w1"], f["b1"], f["w2"], f["b2"], ops),
        _kept(keep, "ffn"),
        p,
    )


def _causal(n: int, ops: Ops) -> np.ndarray:
    return np.arange(n)[None, :] <= np.arange(n)[:, None] + ops.causal_offset


def decoder_layer(
    y: np.ndarray,
    memory: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
    eps: float,
    fully_masked: str,
    ops: Ops = PAPER,
    keep: Mapping[str, Any] | None = None,
    p: float = 0.0,
    seed: Any = None,
) -> np.ndarray:
    # keep, p, seed: as encoder_layer's
    y, memory = np.asarray(y, dtype=LD), np.asarray(memory, dtype=LD)
    self_mask = _causal(y.shape[-2], ops) if self_mask is None else self_mask
    a = _sublayer(
        y,
        params["norm1"],
        eps,
        ops,
        lambda t: multi_head_attention(t, t, t, params["self_attn"], num_heads, self_mask, fully_masked, ops),
        _kept(keep, "self_attn"),
        p,
    )
    b = _sublayer(
        a,
        params["norm2"],
        eps,
        ops,
        lambda t: multi_head_attention(
            t, memory, memory, params["cross_attn"], num_heads, memory_mask, fully_masked, ops
        ),
        _kept(keep, "cross_attn"),
        p,
    )
    f = params["ffn"]
    return _sublayer(
        b,
        params["norm3"],
        eps,
        ops,
        lambda t: feed_forward(t, f["w1"], f["b1"], f["w2"], f["b2"], ops),
        _kept(keep, "ffn"),
        p,
    )


def transformer_forward(
    src: np.ndarray,
    tgt: np.ndarray,
    params: Mapping[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    eps: float,
    fully_masked: str,
    ops: Ops = PAPER,
    keep: Mapping[str, Any] | None = None,
    p: float = 0.0,
    seed: Any = None,
) -> np.ndarray:
    # keep, p, seed: training mode (§5.4), the masks the implementation drew by place (reference.model.dropout_places)
    from aiayn.reference.model import layer_keep

    emb = np.asarray(params["embedding"], dtype=LD)
    d = emb.shape[1]

    def drop(a: np.ndarray, place: str) -> np.ndarray:
        return a if keep is None or not ops.embedding_dropout else dropout(a, keep[place], p, ops=ops)

    def embed(tokens: np.ndarray) -> np.ndarray:
        n = tokens.shape[-1]
        positions = (
            np.asarray(params["positional"], dtype=LD)[:n] if "positional" in params else positional_encoding(n, d, ops)
        )
        root = np.sqrt(LD(d))
        return emb[tokens] * (LD(1) if ops.embed_scale == "none" else root) + positions * (
            root if ops.embed_scale == "after_pe" else LD(1)
        )

    n_src, n_tgt = src.shape[-1], tgt.shape[-1]
    src_mask = (
        None if src_lengths is None else (np.arange(n_src)[None, :] < np.asarray(src_lengths)[:, None])[:, None, :]
    )
    tgt_mask = _causal(n_tgt, ops)
    if tgt_lengths is not None:
        tgt_mask = tgt_mask & (np.arange(n_tgt)[None, :] < np.asarray(tgt_lengths)[:, None])[:, None, :]
    ones, zeros = np.ones(d, dtype=LD), np.zeros(d, dtype=LD)
    x = drop(embed(np.asarray(src)), "src_embedding")
    for i, layer in enumerate(params["encoder"]):
        x = encoder_layer(x, layer, num_heads, src_mask, eps, fully_masked, ops, layer_keep(keep, "encoder", i), p)
    if ops.final_norm in ("encoder", "both"):
        x = layer_norm(x, ones, zeros, eps, ops)
    y = drop(embed(np.asarray(tgt)), "tgt_embedding")
    for i, layer in enumerate(params["decoder"]):
        y = decoder_layer(
            y, x, layer, num_heads, tgt_mask, src_mask, eps, fully_masked, ops, layer_keep(keep, "decoder", i), p
        )
    if ops.final_norm in ("decoder", "both"):
        y = layer_norm(y, ones, zeros, eps, ops)
    return np.matmul(y / np.sqrt(LD(d)) if ops.output_scale == "rsqrt_d" else y, emb.T)


def lrate(steps: Any, d_model: int, warmup_steps: int, step_zero: str, ops: Ops = PAPER) -> np.ndarray:
    s = np.asarray(steps, dtype=LD) + ops.lrate_shift
    if step_zero == "one":
        s = np.maximum(s, 1)
    with np.errstate(divide="ignore"):
        return np.where(
            s == 0, LD(0), np.minimum(1 / np.sqrt(s), s * LD(warmup_steps) ** LD(-1.5)) / np.sqrt(LD(d_model))
        )


def adam_step(
    param: Any,
    grad: Any,
    m: Any,
    v: Any,
    step: int,
    lr: float,
    betas: Any,
    eps: float,
    bias_correction: bool,
    eps_placement: str,
    ops: Ops = PAPER,
) -> np.ndarray:
    from aiayn.reference.training import adam_step as step_of

    b1, b2 = (float(b) for b in betas)
    out = step_of(
        param,
        grad,
        m,
        v,
        step,
        lr,
        (b1, b2 if ops.adam_beta2 is None else ops.adam_beta2),
        eps if ops.adam_eps_value is None else ops.adam_eps_value,
        bias_correction=bias_correction if ops.adam_bias_correction is None else ops.adam_bias_correction,
        eps_placement=ops.adam_eps or eps_placement,
    )
    return np.stack(out)  # (3, ...): param, m, v


def dropout(x: Any, keep: Any, p: float, seed: Any = None, ops: Ops = PAPER) -> np.ndarray:
    # seed: the draw's; the mask it drew is given
    xs, kept = np.asarray(x, dtype=LD), np.asarray(keep, dtype=bool)
    scale = {
        "inverted": 1 / (1 - LD(p)),
        "unscaled": LD(1),
        "times_keep": 1 - LD(p),
        "over_p": 1 / LD(p) if p else LD(np.inf),  # p = 0: inf, which agrees with no finite output (names nothing)
    }[ops.dropout]
    return np.where(kept, xs * scale, LD(0))


def average_checkpoints(checkpoints: Mapping[int, Mapping[str, Any]], n: int, ops: Ops = PAPER) -> np.ndarray:
    steps = list(checkpoints)
    chosen = {
        "last": sorted(steps)[-n:],
        "first": steps[:n],
        "by_name": sorted(steps, key=str)[-n:],  # checkpoint_100 sorts before checkpoint_20
        "all": steps,
    }[ops.checkpoints]
    names = list(checkpoints[steps[0]])
    means = [np.mean(np.stack([np.asarray(checkpoints[s][name], dtype=LD) for s in chosen]), axis=0) for name in names]
    return np.concatenate([m.reshape(-1) for m in means])


def _smoothing_args(declared: str, padding_id: int, ops: Ops) -> dict[str, Any] | None:
    chosen = ops.smoothing or declared
    if chosen == "none":
        return None
    if chosen == "K-2":
        return {"variant": "K-1", "padding_id": padding_id}
    return {"variant": chosen, "padding_id": None}


def label_smoothing(
    targets: np.ndarray, vocab_size: int, eps: float, declared: str, padding_id: int, ops: Ops = PAPER
) -> np.ndarray:
    from aiayn.reference.training import label_smoothing as smooth

    args = _smoothing_args(declared, padding_id, ops)
    if args is None:
        return smooth(targets, vocab_size, 0.0)
    return smooth(targets, vocab_size, eps, **args)


def smoothed_cross_entropy(
    logits: np.ndarray, targets: np.ndarray, eps: float, declared: str, padding_id: int, ops: Ops = PAPER
) -> np.ndarray:
    q = label_smoothing(targets, np.shape(logits)[-1], eps, declared, padding_id, ops).astype(LD)
    z = np.asarray(logits, dtype=LD)
    w = z - np.max(z, axis=-1, keepdims=True)
    log_p = w - np.log(np.sum(np.exp(w), axis=-1, keepdims=True))
    return -np.sum(np.where(q == 0, LD(0), q * log_p), axis=-1)


#: One of this module's models of an equation (``softmax``, ..., ``transformer_forward``): the oracle's arguments and
#: ``ops`` (and ``dtype`` where it computes numerically) -> its output. The diagnoses take the model, not the
#: equation's name: an equation's record (``equations.py``, ``Equation.model``) says which it is.
Model = Callable[..., np.ndarray]


def evaluate(model: Model, args: Mapping[str, Any], ops: Ops = PAPER, dtype: str | None = None) -> np.ndarray:
    """``model`` on ``args`` (the oracle's arguments, as :func:`explain` takes them) with ``ops``, as float64."""
    extra = {"dtype": dtype} if "dtype" in inspect.signature(model).parameters else {}
    with np.errstate(all="ignore"):
        return np.asarray(model(**args, ops=ops, **extra), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# the catalogue


@dataclass(frozen=True)
class Departure:
    """One known departure: its name (what messages say), who does it, where it shows, and how to compute it.

    ``family``: the part of the model it concerns; an equation's record lists the families that concern it
    (``equations.py``, ``Equation.departures``), so a departure is tried on every equation that contains that part.
    ``precision``: compare within this dtype's budget ("float32": float32 inside a float64 claim), or "ftz": the
    check's dtype with subnormal results flushed to zero (``numerics.PRECISIONS`` "<dtype>-ftz": every underflow errs
    by up to 2^emin, not eta). ``numerical``: computed in the check's dtype. ``compute``: numerical, computed in this
    dtype whatever the check's (a narrower one: code that upcasts). ``same_as``: the departure this one refines (the
    same output but on some inputs): where the two outputs are identical only that one is named.
    """

    name: str
    note: str
    family: str
    ops: Ops = PAPER
    precision: str | None = None
    numerical: bool = False
    compute: str | None = None
    same_as: str | None = None

    def output(self, model: Model, args: Mapping[str, Any], dtype: str) -> np.ndarray:
        return evaluate(model, args, self.ops, self.compute or (dtype if self.numerical else None))


def _d(name: str, note: str, family: str, **ops: Any) -> Departure:
    flags = {k: ops.pop(k) for k in ("precision", "numerical", "compute", "same_as") if k in ops}
    return Departure(name, note, family, replace(PAPER, **ops), **flags)


#: Every departure the suite can name. The project's mutants (``studies/mutants.py``) each carry one of these names.
CATALOGUE: tuple[Departure, ...] = (
    _d(
        "no 1/sqrt(d_k) scaling",
        "Eq. (1) without its scale: the scores of plain dot-product attention",
        "attention",
        scale="none",
    ),
    _d("scores divided by d_k instead of sqrt(d_k)", "a square root forgotten", "attention", scale="dk"),
    _d(
        "scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k)",
        "the model width used for the head width",
        "heads",
        scale="sqrt_dmodel",
    ),
    _d(
        "softmax over the queries instead of the keys",
        "the attention weights normalised along the wrong axis",
        "attention",
        softmax_over="queries",
    ),
    _d(
        "mask applied after the softmax",
        "masked weights zeroed without renormalising",
        "attention",
        mask="after_softmax",
    ),
    _d(
        "finite mask value -1e4 added to the scores",
        "additive masks in fp16 code (a finite value leaks weight; §3.2.3 sets -inf)",
        "attention",
        mask="add:-1e4",
    ),
    _d("finite mask value -1e9 added to the scores", "additive masks (§3.2.3 sets -inf)", "attention", mask="add:-1e9"),
    _d(
        "masked scores set to -1e9 (masked_fill)",
        "the Annotated Transformer and many tutorials (§3.2.3 sets -inf)",
        "attention",
        mask="fill:-1e9",
    ),
    _d("mask ignored", "the mask argument never applied", "attention", mask="ignored"),
    _d(
        "the last partial tile of 16 query rows left unwritten (0)",
        "a tiled kernel (taken beyond one tile) whose loop covers whole tiles of query rows only: rows past the last "
        "whole tile keep the zeros of their output buffer (only lengths above the tile, not a multiple of it, show "
        "it)",
        "attention",
        unwritten_tail=16,
    ),
    _d(
        "the last partial tile of 32 query rows left unwritten (0)",
        "as with tiles of 16 rows; named only where its output differs from theirs",
        "attention",
        unwritten_tail=32,
        same_as="the last partial tile of 16 query rows left unwritten (0)",
    ),
    _d(
        "the last partial tile of 64 query rows left unwritten (0)",
        "as with tiles of 16 rows; named only where its output differs from theirs",
        "attention",
        unwritten_tail=64,
        same_as="the last partial tile of 16 query rows left unwritten (0)",
    ),
    _d(
        "fully masked rows give zeros",
        "PyTorch's SDPA behaviour, where another policy is declared",
        "attention",
        fully_masked="zeros",
    ),
    _d(
        "fully masked rows give NaN",
        "plain -inf masking (0/0), where another policy is declared",
        "attention",
        fully_masked="nan",
    ),
    _d(
        "fully masked rows give the mean of the values",
        "a finite mask value, where another policy is declared",
        "attention",
        fully_masked="uniform",
    ),
    _d(
        "softmax without the max shift",
        "exp overflows for large scores (numerical, in the dtype)",
        "softmax",
        softmax_shift=False,
        numerical=True,
    ),
    _d(
        "softmax returns 1 over a length-1 axis whatever the input",
        "a shortcut for one element: NaN and +-inf give 1 too, where exp(x - max x) / sum gives NaN",
        "softmax",
        softmax_length_one=True,
    ),
    _d(
        "softmax over the last axis whatever axis says",
        "the axis argument ignored",
        "softmax",
        softmax_last_axis=True,
    ),
    _d(
        "heads interleaved (head i takes columns i, i+h, ...)",
        "a reshape to (d_k, h) instead of (h, d_k)",
        "heads",
        heads="strided",
    ),
    _d("heads concatenated in reverse order", "Concat(head_h, ..., head_1)", "heads", heads="reversed"),
    _d("cos in the even, sin in the odd dimensions", "§3.5 puts sin at 2i, cos at 2i+1", "positional", pe="swapped"),
    _d(
        "sin and cos in two halves",
        "concatenated [sin | cos] instead of interleaved (tensor2tensor's layout)",
        "positional",
        pe="halves",
    ),
    _d(
        "frequencies 10000^(-i/(d/2-1)) (tensor2tensor's spacing)",
        "the pair index i over d/2 - 1 timescales (at least 1) instead of 2i/d_model: the highest frequency pair "
        "reaches 1/10000 exactly",
        "positional",
        pe_spacing="t2t",
    ),
    _d(
        "tensor2tensor's timing signal (get_timing_signal_1d)",
        "[sin | cos] halves with frequencies 10000^(-i/(d/2-1)): the table tensor2tensor and the engines that "
        "load its models compute",
        "positional",
        pe="halves",
        pe_spacing="t2t",
    ),
    _d(
        "exponent i/d_model instead of 2i/d_model",
        "the dimension index used for the pair index",
        "positional",
        pe_spacing="i/d",
    ),
    _d(
        "tensor2tensor's timing signal without its guard (NaN at d_model = 2)",
        "[sin | cos] halves, frequencies 10000^(-i/(d/2-1)) with no max(d/2 - 1, 1): 0/0 at d_model = 2 (an "
        "inference engine's table; fairseq's get_embedding divides by zero there); elsewhere tensor2tensor's table",
        "positional",
        pe="halves",
        pe_spacing="t2t_unguarded",
        same_as="tensor2tensor's timing signal (get_timing_signal_1d)",
    ),
    _d("positions counted from 1", "§3.5 counts pos from 0 (OpenNMT-tf counts from 1)", "positional", pe_start=1),
    _d(
        "positions counted from 2 (padding_idx + 1)",
        "fairseq's and Hugging Face FSMT's sinusoidal positions start at padding_idx + 1, 2 with the default "
        "padding_idx 1; §3.5 counts pos from 0",
        "positional",
        pe_start=2,
    ),
    _d(
        "positional base 1000 instead of 10000",
        "§3.5's wavelengths go up to 10000 * 2 pi",
        "positional",
        pe_base=1000.0,
    ),
    _d(
        "eps added to the std",
        "(x - mean) / (std + eps); the paper's LayerNorm has eps inside the square root",
        "layer_norm",
        layer_norm="eps_std",
    ),
    _d(
        "unbiased variance",
        "var with d - 1 (torch.std's default); LayerNorm normalises by the biased one",
        "layer_norm",
        layer_norm="unbiased",
    ),
    _d(
        "unbiased variance, eps added to the std",
        "x.std(-1) + eps: the Annotated Transformer's LayerNorm",
        "layer_norm",
        layer_norm="unbiased_eps_std",
    ),
    _d(
        "one-pass variance E[x^2] - E[x]^2",
        "cancels catastrophically on near-constant rows (numerical, in the dtype)",
        "layer_norm_rows",
        layer_norm="one_pass",
        numerical=True,
    ),
    _d("no ReLU", "FFN without its max(0, .): two linear maps", "ffn", activation="none"),
    _d("GELU instead of ReLU", "BERT's and GPT's activation; Eq. (2) has max(0, .)", "ffn", activation="gelu"),
    _d("bias after the ReLU", "max(0, x W1) + b1 instead of max(0, x W1 + b1)", "ffn", activation="bias_after_relu"),
    _d(
        "feed-forward module with its own residual x + FFN(x)",
        "the module is the residual sub-layer without its LayerNorm, checked as Eq. (2)",
        "ffn",
        ffn_sublayer="residual",
    ),
    *(
        _d(
            f"feed-forward module with its own pre-norm and residual x + FFN(LayerNorm(x)), eps {eps}",
            "the whole pre-norm sub-layer (unit gain, zero bias) in one module, checked as Eq. (2)",
            "ffn",
            ffn_sublayer=f"pre_norm:{eps}",
        )
        for eps in ("1e-5", "1e-6")
    ),
    *(
        _d(
            f"feed-forward module with its own residual and post-norm LayerNorm(x + FFN(x)), eps {eps}",
            "the whole post-norm sub-layer of §3.1 (unit gain, zero bias) in one module, checked as Eq. (2)",
            "ffn",
            ffn_sublayer=f"post_norm:{eps}",
        )
        for eps in ("1e-5", "1e-6")
    ),
    _d(
        "pre-norm sub-layers x + Sublayer(LayerNorm(x))",
        "GPT-2, the Annotated Transformer, tensor2tensor's later default; §3.1 is post-norm",
        "residual",
        residual="pre",
    ),
    _d(
        "embeddings not scaled by sqrt(d_model)",
        "§3.4 multiplies the embedding weights by sqrt(d_model)",
        "embedding",
        embed_scale="none",
    ),
    _d(
        "embeddings scaled by sqrt(d_model) after the PE is added",
        "(E[x] + PE) sqrt(d_model): the positional table scaled with the embedding; §3.4 scales the embedding "
        "weights only",
        "embedding",
        embed_scale="after_pe",
    ),
    _d(
        "decoder output scaled by d_model^-1/2 before the tied projection",
        "T5's tied output layer (tie_word_embeddings) rescales the decoder's output; §3.4 shares the matrix "
        "without a factor",
        "embedding",
        output_scale="rsqrt_d",
    ),
    _d(
        "a final LayerNorm after the encoder stack",
        "gain 1, bias 0 (an untrained one): pre-norm stacks (fairseq's encoder_normalize_before, tensor2tensor) norm "
        "the stack's output; §3.1's post-norm layers end in their own LayerNorm",
        "final_norm",
        final_norm="encoder",
    ),
    _d(
        "a final LayerNorm after the decoder stack",
        "gain 1, bias 0 (an untrained one): pre-norm decoders (fairseq's decoder_normalize_before) norm the stack's "
        "output before the projection",
        "final_norm",
        final_norm="decoder",
    ),
    _d(
        "a final LayerNorm after each stack",
        "gain 1, bias 0 (untrained ones): PyTorch's nn.Transformer builds encoder_norm and decoder_norm whether its "
        "layers are post-norm or not",
        "final_norm",
        final_norm="both",
    ),
    _d(
        "pre-norm sub-layers with a final LayerNorm after each stack",
        "x + Sublayer(LayerNorm(x)) in every layer and a LayerNorm closing each stack, as pre-norm models ship them "
        "(the Annotated Transformer, fairseq's normalize_before, tensor2tensor's later default, PyTorch's "
        "nn.Transformer with norm_first=True): §3.1 is post-norm with no final norm",
        "final_norm",
        residual="pre",
        final_norm="both",
    ),
    _d(
        "causal mask off by one (position i sees i + 1)",
        "§3.2.3 allows j <= i",
        "causal",
        causal_offset=1,
    ),
    _d("lrate shifted by one step", "a 0-based step counter fed to Eq. (3)", "lrate", lrate_shift=1),
    _d(
        "Adam's beta2 at the frameworks' default 0.999",
        "§5.3 sets beta2 = 0.98; torch.optim.Adam, optax.adam and Keras's Adam default to 0.999",
        "adam",
        adam_beta2=0.999,
    ),
    _d(
        "Adam's eps at PyTorch's default 1e-8",
        "§5.3 sets eps = 1e-9; torch.optim.Adam's default",
        "adam",
        adam_eps_value=1e-8,
    ),
    _d("Adam's eps at Keras's default 1e-7", "§5.3 sets eps = 1e-9; Keras's Adam default", "adam", adam_eps_value=1e-7),
    _d(
        "Adam's eps inside the square root",
        "m_hat / sqrt(v_hat + eps), where another is declared",
        "adam",
        adam_eps="inside",
    ),
    _d(
        "Adam's eps added before the bias correction (Keras's order)",
        "lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + eps): Kingma & Ba's efficient form, where another is "
        "declared",
        "adam",
        adam_eps="hat",
    ),
    _d(
        "Adam's eps added after the bias correction (Algorithm 1's order)",
        "m_hat / (sqrt(v_hat) + eps), where another is declared",
        "adam",
        adam_eps="outside",
    ),
    _d(
        "Adam without bias correction",
        "m_t and v_t used as they are (Kingma & Ba divide by 1 - beta^t), where correction is declared",
        "adam",
        adam_bias_correction=False,
    ),
    _d(
        "Adam with bias correction",
        "the moments divided by 1 - beta^t, where no correction is declared",
        "adam",
        adam_bias_correction=True,
    ),
    _d(
        "dropout without its 1 / (1 - p) scaling",
        "the kept elements left as they are: evaluation then sees larger activations than training did",
        "dropout",
        dropout="unscaled",
    ),
    _d(
        "dropout scaled by (1 - p) at training",
        "the original paper's test-time rule applied while training (Srivastava et al. scale at test, not by 1 - p "
        "at training)",
        "dropout",
        dropout="times_keep",
    ),
    _d(
        "dropout's p taken as the keep probability",
        "kept elements scaled by 1 / p (TensorFlow 1's keep_prob where a rate is meant)",
        "dropout",
        dropout="over_p",
    ),
    _d(
        "dropout after the LayerNorm",
        "LayerNorm(x + Sublayer(x)) dropped, where §5.4 drops the sub-layer's output before it is added and normalized",
        "dropout",
        dropout_place="after_norm",
    ),
    _d(
        "dropout of the residual sum",
        "x + Sublayer(x) dropped before the LayerNorm: the residual stream itself loses elements, where §5.4 drops the "
        "sub-layer's output only",
        "dropout",
        dropout_place="on_sum",
    ),
    _d(
        "no dropout of the embeddings' sums",
        "E[x] sqrt(d_model) + PE left whole in training mode, where §5.4 drops it in both stacks (the masks returned "
        "but not applied there)",
        "dropout",
        embedding_dropout=False,
    ),
    _d(
        "no dropout in training mode",
        "the masks returned but not applied (a rate not passed down, a module left in evaluation mode)",
        "dropout",
        dropout_place="none",
    ),
    _d(
        "the first n checkpoints given averaged, not the last n",
        "the checkpoints taken in the order they come (a directory listing, a dict), not by step",
        "averaging",
        checkpoints="first",
    ),
    _d(
        "the last n checkpoints by name, not by step",
        "file names sorted as text: checkpoint_100 before checkpoint_20",
        "averaging",
        checkpoints="by_name",
    ),
    _d(
        "every checkpoint averaged, not the last n",
        "§6.1 averages the last 5 (base) or 20 (big)",
        "averaging",
        checkpoints="all",
    ),
    _d("smoothing over K classes", "Szegedy et al.'s form, where another is declared", "smoothing", smoothing="K"),
    _d("smoothing over K-1 classes", "tensor2tensor's form, where another is declared", "smoothing", smoothing="K-1"),
    _d(
        "smoothing over K-2 classes (a padding class)",
        "the Annotated Transformer's LabelSmoothing, where another is declared",
        "smoothing",
        smoothing="K-2",
    ),
    _d("no label smoothing (one-hot targets)", "eps ignored", "smoothing", smoothing="none"),
    _d(
        "float32 inside a float64 claim",
        "computed in float32 while declaring float64: agrees with the paper within float32's budget only",
        "arithmetic",
        precision="float32",
    ),
    _d(
        "subnormal results flushed to zero",
        "FTZ/DAZ arithmetic (XLA's CPU backend, fast-math builds): agrees with the paper within the "
        "budget whose underflow unit is 2^emin, the smallest normal, instead of the subnormal spacing",
        "arithmetic",
        precision="ftz",
    ),
    _d(
        "float32 inside a float64 claim, subnormal results flushed to zero",
        "both at once (float32 code on an FTZ/DAZ machine while declaring float64): agrees with the paper within "
        "float32's budget whose underflow unit is float32's smallest normal; named only where neither alone agrees",
        "arithmetic",
        precision="float32-ftz",
    ),
    _d(
        "LayerNorm as x r + (beta - mean r), r = gain / sqrt(var + eps)",
        "one multiply-add per element (Keras' LayerNormalization): x r and "
        "mean r cancel on rows whose mean is large beside their spread (numerical, in the dtype)",
        "layer_norm",
        layer_norm="scale_shift",
        numerical=True,
    ),
    _d(
        "LayerNorm as x r + (beta - mean r), computed in float32",
        "the same one multiply-add form computed in float32 on float16 or "
        "bfloat16 inputs and rounded at the end (Keras' LayerNormalization under JAX): "
        "the cancellation of float32, not the overflow of float16",
        "layer_norm",
        layer_norm="scale_shift",
        numerical=True,
        compute="float32",
    ),
)


def agreeing(
    names: list[str],
    model: Model,
    args: Mapping[str, Any],
    got: np.ndarray,
    budget_at: Callable[..., np.ndarray],
    dtype: str,
) -> list[str]:
    """Which of ``names`` (catalogue names, or pairs "A + B" as :func:`explain` names them) agree with ``got`` on
    these inputs, each judged alone (no precedence between them): the candidates an input cannot rule out."""
    from aiayn.conformance.numerics import precision

    kinds = {name: kind for kind, name in PRECISION_DEPARTURES.items()}
    undefined = np.isnan(evaluate(model, args))
    got = np.asarray(got, dtype=np.float64)
    kept, budgets = [], {}
    for name in names:
        parts = _parts(name)
        if parts is None:
            kept.append(name)  # not a name this can evaluate: never ruled out
            continue
        departure, second = parts[0], parts[1].name if len(parts) > 1 and parts[1].precision is not None else ""
        if len(parts) > 1 and not second:
            departure = _together(parts[0], parts[1])
        try:
            variant = departure.output(model, args, dtype)
            if second:
                target = "float32" if kinds[second] == "float32" else f"{dtype}-ftz"
                budget = np.asarray(budget_at(target, values=variant), dtype=np.float64)
            else:
                kind = departure.precision
                target = f"{dtype}-ftz" if kind == "ftz" else kind or dtype
                if target not in budgets:
                    budgets[target] = np.asarray(budget_at(target), dtype=np.float64)
                budget = budgets[target]
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            continue  # no meaning on these inputs: ruled out here
        u = precision(dtype).u
        budget = _where_undefined(budget, undefined, got, variant, u, _added_mask_rounding(departure, model, args, u))
        if variant.shape != got.shape:
            continue
        if _agrees(got, variant, budget) or (
            not second
            and _pairable(departure)
            and _agrees_at_own_values(got, variant, budget_at, dtype, undefined, departure.ops)
        ):
            kept.append(name)
    return kept


#: The departures of arithmetic by their ``precision``: what a property check that holds at that arithmetic names.
PRECISION_DEPARTURES = {d.precision: d.name for d in CATALOGUE if d.precision is not None}


def explain(
    model: Model,
    families: frozenset[str],
    args: Mapping[str, Any],
    got: np.ndarray,
    budget_at: Callable[[str], np.ndarray],
    dtype: str,
) -> list[str]:
    """The names of the departures whose output agrees with ``got`` within budget (empty: no known departure matches).

    ``model``: the equation's model here, ``families``: the catalogue families that concern it (its record's
    ``departures``); ``args``: the oracle's arguments (as :func:`evaluate` takes them);
    ``budget_at(dtype)``: the check's budget computed for a dtype (the check's own for every
    departure, float32's for "float32 inside a float64 claim").

    Where a departure of arithmetic (``precision``: the paper's own equations, compared within
    another arithmetic's budget) matches, the departures of an equation that match too are not
    named: the input does not tell them apart, and the paper's equations explain the output with
    the smaller claim. (Scores so large that softmax is one-hot either way let "no 1/sqrt(d_k)
    scaling" agree with an output whose subnormal terms were flushed to zero.) A departure of an
    equation is named where no arithmetic explains the output.
    """
    from aiayn.conformance.numerics import precision

    got = np.asarray(got, dtype=np.float64)
    undefined = np.isnan(
        evaluate(model, args)
    )  # the paper's NaN (fully masked rows): the check's budget is a bare floor there
    names, arithmetic, closer, seen, budgets = [], [], [], {}, {}
    paper = evaluate(model, args)
    for departure in CATALOGUE:
        if departure.family not in families or (departure.precision not in (None, "ftz") and dtype != "float64"):
            continue
        if departure.compute is not None and dtype not in ("float16", "bfloat16"):
            continue  # an upcast to float32 concerns only the narrower dtypes
        target = f"{dtype}-ftz" if departure.precision == "ftz" else departure.precision or dtype
        try:
            variant = departure.output(model, args, dtype)
            if target not in budgets:  # one budget per arithmetic (a whole model's costs a fifth of a second)
                budgets[target] = np.asarray(budget_at(target), dtype=np.float64)
            budget = budgets[target]
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            continue  # this departure has no meaning for these inputs (e.g. a d - 1 of 0)
        if _same_as(departure, variant, seen):
            continue  # where it is the departure it refines, that name stands for both
        seen[departure.name] = variant
        u = precision(dtype).u
        budget = _where_undefined(budget, undefined, got, variant, u, _added_mask_rounding(departure, model, args, u))
        if variant.shape == got.shape and _agrees(got, variant, budget):
            if departure.precision == "float32-ftz" and arithmetic:
                continue  # float32 alone, or the flush alone, explains it: the smaller claim
            (arithmetic if departure.precision is not None else names).append(departure.name)
        elif _pairable(departure) and variant.shape == got.shape and not _agrees(paper, variant, budget):
            closer.append((departure, variant))  # it changes these inputs' output: alone at its own values, or paired
    found = arithmetic or names or _at_own_values(got, budget_at, dtype, closer, undefined)
    if found or not PAIRS.get():
        return found
    return _pairs(model, args, got, budget_at, dtype, families, undefined) or _structural_pairs(
        model, args, got, paper, budget_at, dtype, closer, undefined
    )


def _same_as(departure: Departure, variant: np.ndarray, seen: Mapping[str, np.ndarray]) -> bool:
    """Whether ``departure`` refines another (``same_as``: equal to it but on some inputs) whose output on these
    inputs, in ``seen`` by name, is ``variant`` bit for bit (NaN where NaN)."""
    other = seen.get(departure.same_as or "")
    return other is not None and other.shape == variant.shape and np.array_equal(other, variant, equal_nan=True)


def _at_own_values(
    got: np.ndarray,
    budget_at: Callable[..., np.ndarray],
    dtype: str,
    closer: list[tuple[Departure, np.ndarray]],
    undefined: np.ndarray,
) -> list[str]:
    """The structural departures that agree within the check's budget evaluated at the departure's own output (its
    floors at its own values: a table whose first row is sin(1) where the paper's is sin(0) = 0), where none agreed
    within the budget at the paper's values."""
    return [d.name for d, variant in closer if _agrees_at_own_values(got, variant, budget_at, dtype, undefined, d.ops)]


def _agrees_at_own_values(
    got: np.ndarray,
    variant: np.ndarray,
    budget_at: Callable[..., np.ndarray],
    dtype: str,
    undefined: np.ndarray,
    ops: Ops,
) -> bool:
    """``got`` within the check's budget evaluated at ``variant`` (a structural departure's own output) and derived
    for its operations ``ops`` where a budget depends on them (a positional table's positions and frequencies)."""
    from aiayn.conformance.numerics import precision

    try:
        budget = np.asarray(budget_at(dtype, values=variant, ops=ops), dtype=np.float64)
    except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
        return False
    return _agrees(got, variant, _where_undefined(budget, undefined, got, variant, precision(dtype).u))


#: Pairs of structural departures (none agreeing alone), in two rounds: the :data:`PAIRS_EVALUATED` pairs whose two
#: changes to the paper's output, added, come closest to the implementation's change are evaluated (first order: a
#: pair changes the output by about the sum of its members' changes, a final LayerNorm and another positional table
#: each moving it part of the way; a model evaluation costs about a millisecond), pairs of one family first (two
#: choices of one table compose far from first order), then the :data:`PAIRS_JUDGED` closest of those are judged
#: within the check's budget at their own output (a budget costs several).
PAIRS_EVALUATED = 64
PAIRS_JUDGED = 4


def _structural(departure: Departure) -> bool:
    """A departure of the equation itself (not of arithmetic, not computed in a dtype): one that can pair with
    another such."""
    return departure.precision is None and departure.compute is None and not departure.numerical


def _pairable(departure: Departure) -> bool:
    """A departure of the equation, computed in the check's dtype or exactly: a sub-layer's departure found on its
    own row (its LayerNorm's unbiased std, its softmax without the max shift) is tried in the whole model with each
    structural departure of another field."""
    return departure.precision is None and departure.compute is None


def _changes(ops: Ops) -> dict[str, Any]:
    """The fields in which ``ops`` departs from the paper's."""
    return {f.name: getattr(ops, f.name) for f in fields(Ops) if getattr(ops, f.name) != getattr(PAPER, f.name)}


def _together(a: Departure, b: Departure) -> Departure:
    """Both departures at once (their changes are of different fields), named "A + B"; computed in the check's
    dtype where either is numerical."""
    return Departure(
        f"{a.name} + {b.name}",
        f"{a.note}; {b.note}",
        a.family,
        replace(a.ops, **_changes(b.ops)),
        numerical=a.numerical or b.numerical,
    )


def _parts(name: str) -> list[Departure] | None:
    """The departures a name given by :func:`explain` stands for: one, or the two of a pair "A + B" (a name may
    itself contain " + "); None where it names none."""
    by_name = {d.name: d for d in CATALOGUE}
    if name in by_name:
        return [by_name[name]]
    for first, departure in by_name.items():
        rest = name[len(first) + 3 :]
        if name.startswith(f"{first} + ") and rest in by_name:
            return [departure, by_name[rest]]
    return None


def _structural_pairs(
    model: Model,
    args: Mapping[str, Any],
    got: np.ndarray,
    paper: np.ndarray,
    budget_at: Callable[..., np.ndarray],
    dtype: str,
    closer: list[tuple[Departure, np.ndarray]],
    undefined: np.ndarray,
) -> list[str]:
    """Two structural departures at once (``closer``: each that changes these inputs' output, with that output),
    changes to different fields, chosen as :data:`PAIRS_EVALUATED` says; named "A + B" (catalogue order) where the
    pair agrees within the check's budget at the pair's output."""
    live = ~(np.isnan(got) | np.isnan(paper))
    with np.errstate(invalid="ignore", over="ignore"):
        target = np.where(live, got - paper, 0.0).ravel()
        changes = [np.where(live & ~np.isnan(v), v - paper, 0.0).ravel() for _, v in closer]
    ranked = []
    for i, (a, _) in enumerate(closer):
        for j in range(i + 1, len(closer)):
            b = closer[j][0]
            if set(_changes(a.ops)) & set(_changes(b.ops)) or (a.numerical and b.numerical):
                continue  # two choices of one field, or two numerical accidents: not both at once
            if a.family == b.family:  # one family's choices compose, not add (a table's start and its frequencies)
                ranked.append((-1.0, i, j))  # every such pair is evaluated
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                miss = float(np.linalg.norm(target - changes[i] - changes[j]))
            ranked.append((miss if np.isfinite(miss) else np.inf, i, j))  # an order only: an overflowed miss goes last
    ranked.sort()
    evaluated = []
    for _, i, j in ranked[:PAIRS_EVALUATED]:
        pair = _together(closer[i][0], closer[j][0])  # closer is in catalogue order
        try:
            variant = pair.output(model, args, dtype)
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            continue
        if variant.shape == got.shape:
            with np.errstate(invalid="ignore", over="ignore"):
                miss = float(np.linalg.norm(np.where(live & ~np.isnan(variant), got - variant, 0.0)))
            evaluated.append((miss if np.isfinite(miss) else np.inf, i, j, pair, variant))  # order; judged below
    evaluated.sort(key=lambda e: (e[0], e[1], e[2]))
    return [
        pair.name
        for *_, pair, variant in evaluated[:PAIRS_JUDGED]
        if _agrees_at_own_values(got, variant, budget_at, dtype, undefined, pair.ops)
    ]


def _pairs(
    model: Model,
    args: Mapping[str, Any],
    got: np.ndarray,
    budget_at: Callable[..., np.ndarray],
    dtype: str,
    families: Any,
    undefined: np.ndarray,
) -> list[str]:
    """Two departures at once: a departure of the equation computed at a departure's arithmetic (float32 inside a
    float64 claim; subnormals flushed), named as the pair. The budget is the arithmetic's, evaluated at the
    variant's own values (its layout, its magnitudes), not the paper's."""
    from aiayn.conformance.numerics import precision

    arithmetics = [("float32", "float32")] if dtype == "float64" else []
    arithmetics.append(("ftz", f"{dtype}-ftz"))
    names, seen = [], {}
    for departure in CATALOGUE:
        if departure.family not in families or departure.precision is not None or departure.compute is not None:
            continue
        try:
            variant = departure.output(model, args, dtype)
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            continue
        if variant.shape != got.shape or _same_as(departure, variant, seen):
            continue
        seen[departure.name] = variant
        for kind, target in arithmetics:
            try:
                budget = np.asarray(budget_at(target, values=variant), dtype=np.float64)
            except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
                continue
            u = precision(dtype).u
            budget = _where_undefined(budget, undefined, got, variant, u)
            if _agrees(got, variant, budget):
                names.append(f"{departure.name} + {PRECISION_DEPARTURES[kind]}")
                break
    return names


#: Where the paper's output is NaN (a fully masked row) the check's budget is only a floor of one
#: ulp: it bounds nothing. There a variant is compared within this many units of the dtype's
#: roundoff times the value: enough for the sums and products of the suite's sizes (gamma_n for
#: n <= 16 terms is about 16 u) with a margin of 4.
UNDEFINED_ROUNDOFFS = 64


def _where_undefined(
    budget: np.ndarray, undefined: np.ndarray, got: np.ndarray, variant: np.ndarray, u: float, extra: float = 0.0
) -> np.ndarray:
    """The budget, with :data:`UNDEFINED_ROUNDOFFS` u |value| (plus ``extra``) where the paper's output is NaN (its
    budget is a bare floor there)."""
    budget = np.broadcast_to(np.asarray(budget, dtype=np.float64), got.shape)
    if undefined.shape != got.shape or not np.any(undefined):
        return budget
    with np.errstate(invalid="ignore"):
        relative = (
            UNDEFINED_ROUNDOFFS * u * np.maximum(np.abs(np.nan_to_num(got)), np.abs(np.nan_to_num(variant))) + extra
        )
    return np.where(undefined, np.maximum(budget, relative), budget)


def _added_mask_rounding(departure: Departure, model: Model, args: Mapping[str, Any], u: float) -> float:
    """How far code that adds a finite mask value M to the scores (``mask="add:M"``) can be from the variant on a fully
    masked row of Eq. (1), where every score is shifted by M and the paper's output is undefined.

    In exact arithmetic M cancels in the softmax; in the dtype each shifted score s_j + M is rounded, an error
    delta_j <= u (|M| + S) with S = max |s_j|. Softmax weights then change by a factor exp(delta_j - sum_i p_i delta_i),
    relatively at most 2 max |delta| to first order, so the output sum_j p_j v_j moves by at most 2 u (|M| + S) V,
    V = max |v_j|; a factor 2 covers the second order (the row's own roundoff is in UNDEFINED_ROUNDOFFS). Without it
    the variant of "-1e4 added" missed float64 code that does exactly that by 5e-13 (a 1e4 shift costs 12 digits).
    Only Eq. (1), where the scores and values are the check's inputs; 0 elsewhere.
    """
    if model is not scaled_dot_product_attention or not departure.ops.mask.startswith("add:"):
        return 0.0
    q, k, v = (np.asarray(args[n], dtype=np.float64) for n in ("q", "k", "v"))
    with np.errstate(all="ignore"):
        scores = np.abs(np.matmul(q, np.swapaxes(k, -1, -2))) / np.sqrt(q.shape[-1])
        s_max = float(np.nanmax(scores)) if scores.size else 0.0
        v_max = float(np.nanmax(np.abs(v))) if v.size else 0.0
    return 4.0 * u * (abs(float(departure.ops.mask[4:])) + s_max) * v_max


def _agrees(got: np.ndarray, variant: np.ndarray, budget: np.ndarray) -> bool:
    nan_g, nan_v = np.isnan(got), np.isnan(variant)
    if not np.array_equal(nan_g, nan_v):
        return False
    live = ~nan_g
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(live & (got != variant), np.abs(got - variant), 0.0)
        b = np.broadcast_to(budget, got.shape)
        return bool(np.all(np.where(live, (err <= b) | (got == variant), True)))
