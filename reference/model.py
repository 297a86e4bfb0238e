"""The encoder-decoder, §3.1 (stacks), §3.2.3 (the three uses of attention), §3.4 (embeddings), §3.5.

The forward pass in the fast tier only (inference semantics: dropout excluded). Each sub-layer is the fast tier of
its own equation (multi-head attention, feed-forward, LayerNorm), so the composite's own error is a few float64 ulps
per sub-layer: every sub-layer computes in longdouble and rounds its result once to float64 before the next one
reads it.

The backward (``*_vjp``: every gradient of a layer or of the whole model for a cotangent of its output) in both
tiers: the fast one in longdouble throughout, rounded once to float64 at the end; the exact one in mpmath through
``aiayn.reference._exact.correctly_rounded`` (every gradient correctly rounded), each sub-layer by its own tier's
formula, the chain rule between them (the comment above :func:`flatten_params`).

Canonical nested weight layout (what ``init_params`` builds and every implementation is checked in):

    params = {
        "embedding": (vocab, d_model)            # shared: source, target and pre-softmax (§3.4)
        "positional": (max_len, d_model)         # optional: learned positions (Table 3 row E);
                                                 # absent = the sinusoids of §3.5
        "encoder": [layer, ...]                  # N encoder layers, each
            {"self_attn": MHA params,            # w_q, w_k, w_v, w_o, optional b_q b_k b_v b_o
             "norm1": {"gain", "bias"},          # (d_model,) each
             "ffn": {"w1", "b1", "w2", "b2"},    # Eq. (2) layout, see aiayn.reference.layers
             "norm2": {"gain", "bias"}}
        "decoder": [layer, ...]                  # N decoder layers, each
            {"self_attn", "norm1",               # masked self-attention (§3.2.3)
             "cross_attn", "norm2",              # encoder-decoder attention: queries from the
                                                 # decoder, keys and values from the encoder output
             "ffn", "norm3"}
    }

Post-norm throughout (LayerNorm(x + Sublayer(x)), §3.1); no final LayerNorm after either stack
(the paper's post-norm model has none; pre-norm implementations add one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import as_float_array, as_mask, choice, positive_int
from aiayn.reference._exact import DEFAULT_DPS, correctly_rounded, mp_matmul, to_mp
from aiayn.reference.attention import (
    _attention_ld,
    _attention_mp,
    _attention_vjp_ld,
    _attention_vjp_mp,
    _cotangent,
    _mha_pullback,
    _unbroadcast,
    causal_mask,
    multi_head_attention,
    padding_mask,
)
from aiayn.reference.counts import DECODER_SUBLAYERS, ENCODER_SUBLAYERS, dropout_places
from aiayn.reference.layers import (
    LD,
    RELU_AT_ZERO,
    _feed_forward_pullback,
    _layer_norm_pullback_ld,
    _layer_norm_pullback_mp,
    embedding_lookup,
    feed_forward,
    output_logits,
    sublayer_connection,
)
from aiayn.reference.positional import DEFAULT_BASE, _pe_rows_ld, _pe_rows_mp, positional_encoding
from aiayn.reference.training import P_DROP, dropout

DEFAULT_EPS = 1e-6  # LayerNorm eps; the paper is silent (see aiayn.reference.layers.layer_norm)


def _norm(params: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    """The (gain, bias) pair of one LayerNorm in a layer's params, with a clear error if absent."""
    try:
        return params[name]["gain"], params[name]["bias"]
    except (KeyError, TypeError):
        raise ValueError(f"params['{name}']: expected a mapping with 'gain' and 'bias'") from None


def _ffn(params: Mapping[str, Any]):
    """The position-wise feed-forward sub-layer of Eq. (2) with this layer's weights."""
    try:
        w = params["ffn"]
        return lambda t: feed_forward(t, w["w1"], w["b1"], w["w2"], w["b2"])
    except (KeyError, TypeError):
        raise ValueError("params['ffn']: expected a mapping with 'w1', 'b1', 'w2', 'b2'") from None


def layer_keep(keep: Mapping[str, Any] | None, stack: str, i: int) -> dict[str, Any] | None:
    """The masks of layer ``i`` of ``stack`` ("encoder" or "decoder") among the whole model's (:func:`dropout_places`),
    by sub-layer name; None: evaluation."""
    if keep is None:
        return None
    names = ENCODER_SUBLAYERS if stack == "encoder" else DECODER_SUBLAYERS
    return {s: keep[f"{stack}.{i}.{s}"] for s in names}


def _residual_dropout(keep: Any, p_drop: float, sublayers: tuple[str, ...]) -> Callable[[str, Callable], Callable]:
    """Wraps a sub-layer so that its output goes through §5.4's dropout with ``keep[name]`` (identity: ``keep`` None,
    evaluation mode)."""
    if keep is None:
        return lambda name, sublayer: sublayer
    if not isinstance(keep, Mapping) or set(keep) != set(sublayers):
        got = sorted(map(str, keep)) if isinstance(keep, Mapping) else type(keep).__name__
        raise ValueError(f"keep: expected a mapping of the sub-layers {list(sublayers)} to boolean masks, got {got}")
    return lambda name, sublayer: lambda t: dropout(sublayer(t), keep[name], p_drop)


def encoder_layer(
    x: Any,
    params: Mapping[str, Any],
    num_heads: int,
    mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    keep: Mapping[str, Any] | None = None,
    p_drop: float = P_DROP,
) -> np.ndarray:
    """One encoder layer: self-attention then feed-forward, each as LayerNorm(x + Sublayer(x)).

    Paper: §3.1 ("The first is a multi-head self-attention mechanism, and the second is a simple,
    position-wise fully connected feed-forward network ... LayerNorm(x + Sublayer(x))"), §3.2.3
    (encoder self-attention: keys, values and queries all from the previous layer), §5.4 (training: "dropout to the
    output of each sub-layer, before it is added to the sub-layer input and normalized").

    Choices:
        Post-norm (the paper's); LayerNorm ``eps`` (paper silent, default 1e-6); ``mask`` (e.g. a padding mask)
        applies to the self-attention. ``keep`` None: evaluation mode, no dropout; else training mode given its masks,
        ``{"self_attn": keep, "ffn": keep}`` (bool, x's shape, True = kept), each sub-layer's output
        ``aiayn.reference.training.dropout(out, keep[name], p_drop)`` before its residual sum, and nothing else dropped.

    Shapes: x (..., n, d_model) -> (..., n, d_model).
    """
    drop = _residual_dropout(keep, p_drop, ENCODER_SUBLAYERS)
    attn = params["self_attn"]
    x = sublayer_connection(
        x,
        drop("self_attn", lambda t: multi_head_attention(t, t, t, attn, num_heads, mask)),
        *_norm(params, "norm1"),
        eps,
    )
    return sublayer_connection(x, drop("ffn", _ffn(params)), *_norm(params, "norm2"), eps)


def decoder_layer(
    y: Any,
    memory: Any,
    params: Mapping[str, Any],
    num_heads: int,
    self_mask: Any = None,
    memory_mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    keep: Mapping[str, Any] | None = None,
    p_drop: float = P_DROP,
) -> np.ndarray:
    """One decoder layer: masked self-attention, encoder-decoder attention, feed-forward; each post-norm.

    Paper: §3.1 (the decoder inserts a third sub-layer performing multi-head attention over the
    output of the encoder stack; self-attention masked so that predictions for position i can
    depend only on positions less than i), §3.2.3.

    Choices:
        ``self_mask`` defaults to the causal mask (the paper's); pass a combined causal and
        padding mask to also hide padded target keys. ``memory_mask`` hides padded source keys. ``keep``: as
        :func:`encoder_layer`'s, ``{"self_attn", "cross_attn", "ffn"}`` (§5.4).

    Shapes: y (..., n_tgt, d_model), memory (..., n_src, d_model) -> (..., n_tgt, d_model).
    """
    drop = _residual_dropout(keep, p_drop, DECODER_SUBLAYERS)
    n_tgt = np.shape(y)[-2]
    if self_mask is None:
        self_mask = causal_mask(n_tgt, n_tgt)
    self_attn, cross_attn = params["self_attn"], params["cross_attn"]
    y = sublayer_connection(
        y,
        drop("self_attn", lambda t: multi_head_attention(t, t, t, self_attn, num_heads, self_mask)),
        *_norm(params, "norm1"),
        eps,
    )
    y = sublayer_connection(
        y,
        drop("cross_attn", lambda t: multi_head_attention(t, memory, memory, cross_attn, num_heads, memory_mask)),
        *_norm(params, "norm2"),
        eps,
    )
    return sublayer_connection(y, drop("ffn", _ffn(params)), *_norm(params, "norm3"), eps)


def _embed(tokens: Any, params: Mapping[str, Any], name: str) -> np.ndarray:
    """Embedding × sqrt(d_model) plus positions (§3.4, §3.5): sinusoids, or the learned table if given."""
    x = embedding_lookup(tokens, params["embedding"])  # (B, n, d_model)
    n, d_model = x.shape[-2], x.shape[-1]
    if "positional" in params:
        table = np.asarray(params["positional"], dtype=np.float64)
        if table.ndim != 2 or table.shape[1] != d_model or table.shape[0] < n:
            raise ValueError(
                f"params['positional']: expected (max_len >= {n}, {d_model}) for {name}, got {table.shape}"
            )
        return x + table[:n]
    return x + positional_encoding(n, d_model)


def transformer_forward(
    src_tokens: Any,
    tgt_tokens: Any,
    params: Mapping[str, Any],
    num_heads: int,
    *,
    src_lengths: Any = None,
    tgt_lengths: Any = None,
    eps: float = DEFAULT_EPS,
    keep: Mapping[str, Any] | None = None,
    p_drop: float = P_DROP,
) -> np.ndarray:
    """The full encoder-decoder forward pass to pre-softmax logits (teacher forcing).

    Paper: §3 and Figure 1: inputs embedded (× sqrt(d_model), §3.4) plus positional encodings
    (§3.5), N encoder layers, N decoder layers on the (shifted-right) outputs, then the linear
    pre-softmax transformation sharing the embedding matrix (§3.4).

    Choices:
        One embedding matrix shared by source, target and output (§3.4; EN-DE used a shared
        vocabulary). Padding: ``src_lengths`` masks padded source keys in encoder self-attention
        and encoder-decoder attention; ``tgt_lengths`` masks padded target keys in decoder
        self-attention (combined with the causal mask). A length of 0 gives fully masked rows
        (NaN, the attention's default policy). No final LayerNorm. ``keep`` None: evaluation mode, no dropout; else
        training mode given its masks by place (:func:`dropout_places`: bool, each of the array it drops's shape),
        §5.4's dropout with rate ``p_drop`` on the embeddings' sums and on each layer's sub-layer outputs.

    Shapes: src_tokens (B, n_src), tgt_tokens (B, n_tgt) integer ids -> logits (B, n_tgt, vocab).
    """
    h = positive_int("num_heads", num_heads)
    src, tgt = np.asarray(src_tokens), np.asarray(tgt_tokens)
    for name, arr in (("src_tokens", src), ("tgt_tokens", tgt)):
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected shape (B, n), got {arr.shape}")
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"src_tokens and tgt_tokens must agree on the batch size B: got {src.shape[0]} and {tgt.shape[0]}"
        )
    src_mask, tgt_mask = _masks(src.shape[1], tgt.shape[1], src_lengths, tgt_lengths)

    encoders, decoders = _layers(params, "encoder"), _layers(params, "decoder")
    if keep is not None:
        places = dropout_places(len(encoders), len(decoders))
        if not isinstance(keep, Mapping) or set(keep) != set(places):
            got = sorted(map(str, keep)) if isinstance(keep, Mapping) else type(keep).__name__
            raise ValueError(f"keep: expected a mapping of the places {list(places)} to boolean masks, got {got}")

    def drop(a: np.ndarray, place: str) -> np.ndarray:
        return a if keep is None else dropout(a, keep[place], p_drop)

    x = drop(_embed(src, params, "src_tokens"), "src_embedding")  # (B, n_src, d_model)
    for i, layer in enumerate(encoders):
        x = encoder_layer(x, layer, h, src_mask, eps=eps, keep=layer_keep(keep, "encoder", i), p_drop=p_drop)
    y = drop(_embed(tgt, params, "tgt_tokens"), "tgt_embedding")  # (B, n_tgt, d_model)
    for i, layer in enumerate(decoders):
        y = decoder_layer(
            y, x, layer, h, tgt_mask, src_mask, eps=eps, keep=layer_keep(keep, "decoder", i), p_drop=p_drop
        )
    return output_logits(y, params["embedding"])  # (B, n_tgt, vocab)


def _masks(n_src: int, n_tgt: int, src_lengths: Any, tgt_lengths: Any) -> tuple[np.ndarray | None, np.ndarray]:
    """The source padding mask (B, 1, n_src) or None, and the target's causal mask, with padding when lengths are
    given: (n_tgt, n_tgt) or (B, n_tgt, n_tgt)."""
    src_mask = None if src_lengths is None else padding_mask(src_lengths, n_src)
    tgt_mask = causal_mask(n_tgt, n_tgt)
    if tgt_lengths is not None:
        tgt_mask = tgt_mask & padding_mask(tgt_lengths, n_tgt)
    return src_mask, tgt_mask


def _layers(params: Mapping[str, Any], stack: str) -> Sequence[Mapping[str, Any]]:
    """The list of layer params of one stack, with a clear error when it is missing or empty."""
    layers = params.get(stack)
    if not isinstance(layers, Sequence) or len(layers) == 0:
        raise ValueError(f"params['{stack}']: expected a non-empty list of layer params")
    return layers


# --------------------------------------------------------------------------------------------
# canonical random weights


def _mha_params(
    rng: np.random.Generator, d_model: int, h: int, d_k: int, d_v: int, biases: bool
) -> dict[str, np.ndarray]:
    """Random MHA weights in the canonical layout, scaled 1/sqrt(fan_in) so activations stay O(1)."""
    p = {
        "w_q": rng.normal(size=(d_model, h * d_k)) / np.sqrt(d_model),
        "w_k": rng.normal(size=(d_model, h * d_k)) / np.sqrt(d_model),
        "w_v": rng.normal(size=(d_model, h * d_v)) / np.sqrt(d_model),
        "w_o": rng.normal(size=(h * d_v, d_model)) / np.sqrt(h * d_v),
    }
    if biases:
        p.update({f"b_{n}": 0.1 * rng.normal(size=p[f"w_{n}"].shape[1]) for n in ("q", "k", "v", "o")})
    return p


def _norm_params(rng: np.random.Generator, d_model: int) -> dict[str, np.ndarray]:
    """LayerNorm gain and bias near (1, 0) but not equal to them, so a swapped pair is caught."""
    return {"gain": 1.0 + 0.1 * rng.normal(size=d_model), "bias": 0.1 * rng.normal(size=d_model)}


def _ffn_params(rng: np.random.Generator, d_model: int, d_ff: int) -> dict[str, np.ndarray]:
    """Feed-forward weights of Eq. (2), scaled 1/sqrt(fan_in)."""
    return {
        "w1": rng.normal(size=(d_model, d_ff)) / np.sqrt(d_model),
        "b1": 0.1 * rng.normal(size=d_ff),
        "w2": rng.normal(size=(d_ff, d_model)) / np.sqrt(d_ff),
        "b2": 0.1 * rng.normal(size=d_model),
    }


def init_params(
    config: Any,
    vocab_size: int,
    rng: np.random.Generator,
    *,
    biases: bool = True,
    max_positions: int | None = None,
) -> dict[str, Any]:
    """Random weights in the canonical nested layout, deterministic for a given ``rng``.

    ``config`` is anything with ``n_layers``, ``d_model``, ``d_ff``, ``num_heads``, ``d_k``, ``d_v``
    (e.g. ``aiayn.reference.counts.TransformerConfig``). Gains and biases are drawn near 1 and 0 rather than
    at them, so that a check of an implementation catches a swapped or ignored parameter.
    ``max_positions`` adds a learned positional table (Table 3 row E) instead of the sinusoids.
    """
    vocab_size = positive_int("vocab_size", vocab_size, minimum=2)
    d_model, h = config.d_model, config.num_heads
    d_k, d_v = config.d_k, config.d_v

    def enc() -> dict[str, Any]:
        return {
            "self_attn": _mha_params(rng, d_model, h, d_k, d_v, biases),
            "norm1": _norm_params(rng, d_model),
            "ffn": _ffn_params(rng, d_model, config.d_ff),
            "norm2": _norm_params(rng, d_model),
        }

    def dec() -> dict[str, Any]:
        return {
            "self_attn": _mha_params(rng, d_model, h, d_k, d_v, biases),
            "norm1": _norm_params(rng, d_model),
            "cross_attn": _mha_params(rng, d_model, h, d_k, d_v, biases),
            "norm2": _norm_params(rng, d_model),
            "ffn": _ffn_params(rng, d_model, config.d_ff),
            "norm3": _norm_params(rng, d_model),
        }

    params: dict[str, Any] = {"embedding": rng.normal(size=(vocab_size, d_model)) / np.sqrt(d_model)}
    if max_positions is not None:
        params["positional"] = 0.1 * rng.normal(size=(positive_int("max_positions", max_positions), d_model))
    params["encoder"] = [enc() for _ in range(config.n_layers)]
    params["decoder"] = [dec() for _ in range(config.n_layers)]
    return params


# --------------------------------------------------------------------------------------------
# the backward of the composites: vector-Jacobian products
#
# The chain rule through the sub-layers' own VJPs (reference/attention.py, reference/layers.py), from the output back:
#   a post-norm sub-layer z = LayerNorm(r), r = x + Sublayer(x): dr = LayerNorm's VJP of dz (and dgain, dbias), then
#   dx = dr + Sublayer's VJP of dr (the residual path and the sub-layer's own);
#   self-attention reads one array as query, key and value: dx = dquery + dkey + dvalue; encoder-decoder attention
#   reads the encoder output as key and value: dmemory = dkey + dvalue, summed over every decoder layer;
#   the shared embedding matrix E (§3.4) receives the sum of its three uses: dlogits^T y from logits = y E^T, and
#   sqrt(d_model) dX scattered to the rows of the source ids and of the target ids; a learned positional table
#   (Table 3 row E) receives dX summed over the batch at each position, from both sequences; sinusoids take none.
# Masks, the fully masked policy ("nan", the composites' forward's) and ReLU's derivative at 0 (``relu_at_zero``) as in
# the sub-layers. Gradients are named by their path in the canonical layout, dots between the keys
# ("self_attn.w_q", "encoder.0.ffn.w1"; :func:`flatten_params`); every MHA bias has one, given or absent (zero).

_MHA_PARAMS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def flatten_params(params: Any, prefix: str = "") -> dict[str, Any]:
    """The arrays of a nested parameter layout by dotted path ("encoder.0.self_attn.w_q"); absent biases (None)
    left out."""
    if isinstance(params, Mapping):
        items: Any = params.items()
    elif isinstance(params, Sequence) and not isinstance(params, (str, bytes, np.ndarray)):
        items = enumerate(params)
    else:
        return {prefix: params}
    flat: dict[str, Any] = {}
    for key, value in items:
        if value is not None:
            flat.update(flatten_params(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _map_tree(fn: Callable[[Any], Any], params: Any) -> Any:
    """The nested layout with ``fn`` applied to every array (None kept)."""
    if isinstance(params, Mapping):
        return {k: _map_tree(fn, v) for k, v in params.items()}
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes, np.ndarray)):
        return [_map_tree(fn, v) for v in params]
    return None if params is None else fn(params)


class _Arithmetic:
    """What a composite's VJP is computed in: longdouble (the fast tier) or mpmath in the ambient context (the exact
    tier); each sub-layer in it is its own tier's formula."""

    def __init__(self, exact: bool) -> None:
        self.exact = exact
        self.matmul = mp_matmul if exact else np.matmul
        self.attention = _attention_mp if exact else _attention_ld
        self.attention_vjp = _attention_vjp_mp if exact else _attention_vjp_ld

    def lift(self, a: Any) -> np.ndarray:
        return to_mp(a) if self.exact else np.asarray(a, dtype=np.float64).astype(LD)

    def sqrt(self, n: int) -> Any:
        return mpmath.sqrt(n) if self.exact else np.sqrt(LD(n))

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, mpmath.mpf(0), dtype=object) if self.exact else np.zeros(shape, dtype=LD)

    def sinusoids(self, n: int, d_model: int) -> np.ndarray:
        """PE rows 0 .. n-1 of §3.5 in this arithmetic."""
        if self.exact:
            return _pe_rows_mp(list(range(n)), d_model, mpmath.mpf(DEFAULT_BASE))
        return _pe_rows_ld(np.arange(n), d_model, DEFAULT_BASE)

    def layer_norm(self, x: np.ndarray, norm: Mapping[str, np.ndarray], eps: float):
        pullback = _layer_norm_pullback_mp if self.exact else _layer_norm_pullback_ld
        return pullback(x, norm["gain"], norm["bias"], eps)

    def feed_forward(self, x: np.ndarray, w: Mapping[str, np.ndarray], relu_at_zero: float):
        return _feed_forward_pullback(x, w["w1"], w["b1"], w["w2"], w["b2"], relu_at_zero, self.exact)

    def attention_layer(self, p: Mapping[str, Any], query, key, value, h: int, visible):
        ins = {**{k: v for k, v in p.items() if v is not None}, "query": query, "key": key, "value": value}
        return _mha_pullback(ins, h, visible, "nan", self.matmul, self.attention, self.attention_vjp)


def _visible(mask: Any, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray | None:
    """A mask as multi-head attention applies it: (..., 1, n_q, n_k), the same for every head."""
    return None if mask is None else as_mask("mask", mask, (*batch, n_q, n_k))[..., None, :, :]


def _post_norm(grads: dict, name: str, pullback: Callable, d_out: np.ndarray) -> np.ndarray:
    """LayerNorm's share of a sub-layer's backward: its gain and bias gradients into ``grads``; returns d(x + S(x))."""
    d_sum, grads[f"{name}.gain"], grads[f"{name}.bias"] = pullback(d_out)
    return d_sum


def _ffn_back(grads: dict, pullback: Callable, d_out: np.ndarray) -> np.ndarray:
    dx, grads["ffn.w1"], grads["ffn.b1"], grads["ffn.w2"], grads["ffn.b2"] = pullback(d_out)
    return dx


def _attention_back(grads: dict, name: str, pullback: Callable, d_out: np.ndarray) -> dict[str, np.ndarray]:
    g = pullback(d_out)
    grads.update((f"{name}.{k}", g[k]) for k in _MHA_PARAMS)
    return g


def _encoder_layer_pullback(
    ar: _Arithmetic, x, p, h: int, visible, eps: float, relu_at_zero: float, residual: str = "post"
):
    """One encoder layer (§3.1) in ``ar`` and its pullback d_out -> (dx, parameter gradients by path).

    ``residual``: "post", §3.1's LayerNorm(x + Sublayer(x)); "pre" (for the diagnoses only: pre-norm code),
    x + Sublayer(LayerNorm(x))."""
    if residual == "pre":
        return _encoder_layer_pullback_pre(ar, x, p, h, visible, eps, relu_at_zero)
    a, a_back = ar.attention_layer(p["self_attn"], x, x, x, h, visible)
    x1, n1_back = ar.layer_norm(x + a, p["norm1"], eps)  # (..., n, d_model)
    f, f_back = ar.feed_forward(x1, p["ffn"], relu_at_zero)
    out, n2_back = ar.layer_norm(x1 + f, p["norm2"], eps)

    def pullback(d_out: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        grads: dict[str, np.ndarray] = {}
        d_r2 = _post_norm(grads, "norm2", n2_back, d_out)
        d_r1 = _post_norm(grads, "norm1", n1_back, d_r2 + _ffn_back(grads, f_back, d_r2))
        g = _attention_back(grads, "self_attn", a_back, d_r1)
        return d_r1 + g["query"] + g["key"] + g["value"], grads

    return out, pullback


def _encoder_layer_pullback_pre(ar: _Arithmetic, x, p, h: int, visible, eps: float, relu_at_zero: float):
    """A pre-norm encoder layer x1 = x + MultiHead(LN1(x)), out = x1 + FFN(LN2(x1)) and its pullback."""
    z1, n1_back = ar.layer_norm(x, p["norm1"], eps)  # (..., n, d_model)
    a, a_back = ar.attention_layer(p["self_attn"], z1, z1, z1, h, visible)
    x1 = x + a
    z2, n2_back = ar.layer_norm(x1, p["norm2"], eps)
    f, f_back = ar.feed_forward(z2, p["ffn"], relu_at_zero)

    def pullback(d_out: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        grads: dict[str, np.ndarray] = {}
        d_x1 = d_out + _post_norm(grads, "norm2", n2_back, _ffn_back(grads, f_back, d_out))
        g = _attention_back(grads, "self_attn", a_back, d_x1)
        return d_x1 + _post_norm(grads, "norm1", n1_back, g["query"] + g["key"] + g["value"]), grads

    return x1 + f, pullback


def _decoder_layer_pullback(
    ar: _Arithmetic,
    y,
    memory,
    p,
    h: int,
    self_visible,
    memory_visible,
    eps: float,
    relu_at_zero: float,
    residual: str = "post",
):
    """One decoder layer (§3.1) in ``ar`` and its pullback d_out -> (dy, dmemory, parameter gradients by path);
    ``residual`` as :func:`_encoder_layer_pullback`'s."""
    if residual == "pre":
        return _decoder_layer_pullback_pre(ar, y, memory, p, h, self_visible, memory_visible, eps, relu_at_zero)
    a, a_back = ar.attention_layer(p["self_attn"], y, y, y, h, self_visible)
    y1, n1_back = ar.layer_norm(y + a, p["norm1"], eps)
    c, c_back = ar.attention_layer(p["cross_attn"], y1, memory, memory, h, memory_visible)
    y2, n2_back = ar.layer_norm(y1 + c, p["norm2"], eps)
    f, f_back = ar.feed_forward(y2, p["ffn"], relu_at_zero)
    out, n3_back = ar.layer_norm(y2 + f, p["norm3"], eps)

    def pullback(d_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        grads: dict[str, np.ndarray] = {}
        d_r3 = _post_norm(grads, "norm3", n3_back, d_out)
        d_r2 = _post_norm(grads, "norm2", n2_back, d_r3 + _ffn_back(grads, f_back, d_r3))
        gc = _attention_back(grads, "cross_attn", c_back, d_r2)
        d_r1 = _post_norm(grads, "norm1", n1_back, d_r2 + gc["query"])
        ga = _attention_back(grads, "self_attn", a_back, d_r1)
        return d_r1 + ga["query"] + ga["key"] + ga["value"], gc["key"] + gc["value"], grads

    return out, pullback


def _decoder_layer_pullback_pre(
    ar: _Arithmetic, y, memory, p, h: int, self_visible, memory_visible, eps: float, relu_at_zero: float
):
    """A pre-norm decoder layer: y1 = y + SelfAttn(LN1(y)), y2 = y1 + CrossAttn(LN2(y1), memory),
    out = y2 + FFN(LN3(y2)), and its pullback."""
    z1, n1_back = ar.layer_norm(y, p["norm1"], eps)
    a, a_back = ar.attention_layer(p["self_attn"], z1, z1, z1, h, self_visible)
    y1 = y + a
    z2, n2_back = ar.layer_norm(y1, p["norm2"], eps)
    c, c_back = ar.attention_layer(p["cross_attn"], z2, memory, memory, h, memory_visible)
    y2 = y1 + c
    z3, n3_back = ar.layer_norm(y2, p["norm3"], eps)
    f, f_back = ar.feed_forward(z3, p["ffn"], relu_at_zero)

    def pullback(d_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        grads: dict[str, np.ndarray] = {}
        d_y2 = d_out + _post_norm(grads, "norm3", n3_back, _ffn_back(grads, f_back, d_out))
        gc = _attention_back(grads, "cross_attn", c_back, d_y2)
        d_y1 = d_y2 + _post_norm(grads, "norm2", n2_back, gc["query"])
        ga = _attention_back(grads, "self_attn", a_back, d_y1)
        d_y = d_y1 + _post_norm(grads, "norm1", n1_back, ga["query"] + ga["key"] + ga["value"])
        return d_y, gc["key"] + gc["value"], grads

    return y2 + f, pullback


def _scatter_rows(ar: _Arithmetic, ids: np.ndarray, rows: np.ndarray, vocab: int) -> np.ndarray:
    """sum over positions with id i of rows[position], for every i < vocab: (vocab, d_model)."""
    out = ar.zeros((vocab, rows.shape[-1]))
    for i, row in zip(ids.reshape(-1).tolist(), rows.reshape(-1, rows.shape[-1])):
        out[i] = out[i] + row
    return out


def _transformer_pullback(
    ar: _Arithmetic,
    src,
    tgt,
    p,
    h: int,
    src_mask,
    tgt_mask,
    eps: float,
    relu_at_zero: float,
    departure: Mapping[str, Any] | None = None,
):
    """Figure 1's forward pass in ``ar`` (as :func:`transformer_forward`) and its pullback dlogits -> parameter
    gradients by path.

    ``departure`` (None: the paper's model) is for the diagnoses (``conformance/diagnoses/backward.py``), which name a
    failing gradient by the whole-model departure whose VJP it matches: "final_norms", the stacks ("encoder",
    "decoder") that end in a LayerNorm of gain 1 and bias 0; "embed_scale", where sqrt(d_model) multiplies ("none",
    "after_pe": the sum E[x] + PE); "output_scale", a factor on the decoder's output before the tied projection;
    "residual", "pre" for pre-norm layers x + Sublayer(LayerNorm(x))."""
    departure = departure or {}
    e = p["embedding"]  # (vocab, d_model)
    vocab, d_model = e.shape
    (b, n_src), n_tgt = src.shape, tgt.shape[1]
    root = ar.sqrt(d_model)
    embed_scale = departure.get("embed_scale", "before_pe")
    root_e = root if embed_scale != "none" else 1  # the factor on E[x]
    root_pe = root if embed_scale == "after_pe" else 1  # the factor on PE
    out_scale = departure.get("output_scale", 1)
    residual = departure.get("residual", "post")  # "pre": pre-norm layers
    unit = {"gain": ar.lift(np.ones(d_model)), "bias": ar.lift(np.zeros(d_model))}

    def positions(n: int) -> np.ndarray:
        return p["positional"][:n] if "positional" in p else ar.sinusoids(n, d_model)

    def stack_end(stack: str, z: np.ndarray) -> tuple[np.ndarray, Callable]:
        if stack not in departure.get("final_norms", ()):
            return z, lambda d: d
        z, back = ar.layer_norm(z, unit, eps)
        return z, lambda d: back(d)[0]

    x = e[src] * root_e + positions(n_src) * root_pe  # (B, n_src, d_model)
    enc_visible = _visible(src_mask, (b,), n_src, n_src)
    enc_backs = []
    for layer in p["encoder"]:
        x, back = _encoder_layer_pullback(ar, x, layer, h, enc_visible, eps, relu_at_zero, residual)
        enc_backs.append(back)
    x, x_end = stack_end("encoder", x)
    y = e[tgt] * root_e + positions(n_tgt) * root_pe  # (B, n_tgt, d_model)
    self_visible, memory_visible = _visible(tgt_mask, (b,), n_tgt, n_tgt), _visible(src_mask, (b,), n_tgt, n_src)
    dec_backs = []
    for layer in p["decoder"]:
        y, back = _decoder_layer_pullback(ar, y, x, layer, h, self_visible, memory_visible, eps, relu_at_zero, residual)
        dec_backs.append(back)
    y, y_end = stack_end("decoder", y)
    logits = ar.matmul(y * out_scale, np.swapaxes(e, 0, 1))  # (B, n_tgt, vocab)

    def pullback(d_logits: np.ndarray) -> dict[str, np.ndarray]:
        grads: dict[str, np.ndarray] = {}
        d_e = ar.matmul(d_logits.reshape(-1, vocab).T, (y * out_scale).reshape(-1, d_model))  # logits = y E^T
        d_y, d_memory = y_end(ar.matmul(d_logits, e) * out_scale), ar.zeros(x.shape)
        for i in reversed(range(len(dec_backs))):
            d_y, d_mem, layer_grads = dec_backs[i](d_y)
            d_memory = d_memory + d_mem
            grads.update((f"decoder.{i}.{k}", v) for k, v in layer_grads.items())
        d_x = x_end(d_memory)
        for i in reversed(range(len(enc_backs))):
            d_x, layer_grads = enc_backs[i](d_x)
            grads.update((f"encoder.{i}.{k}", v) for k, v in layer_grads.items())
        grads["embedding"] = d_e + (_scatter_rows(ar, src, d_x, vocab) + _scatter_rows(ar, tgt, d_y, vocab)) * root_e
        if "positional" in p:
            d_pos = ar.zeros(p["positional"].shape)
            d_pos[:n_src] = d_pos[:n_src] + d_x.sum(axis=0) * root_pe
            d_pos[:n_tgt] = d_pos[:n_tgt] + d_y.sum(axis=0) * root_pe
            grads["positional"] = d_pos
        return grads

    return logits, pullback


def _in_tier(compute: Callable[[_Arithmetic], dict[str, Any]], exact: bool, dps: int) -> dict[str, np.ndarray]:
    """``compute``'s gradients in the fast tier (longdouble, each rounded once to float64) or the exact one (mpmath
    through ``correctly_rounded``: each correctly rounded)."""
    if not exact:
        return {name: np.asarray(g).astype(np.float64) for name, g in compute(_Arithmetic(False)).items()}
    ar, shapes = _Arithmetic(True), {}

    def flat() -> np.ndarray:
        grads = compute(ar)
        shapes.update((name, np.shape(g)) for name, g in grads.items())
        return np.concatenate([np.asarray(g, dtype=object).reshape(-1) for g in grads.values()])

    values, out, start = correctly_rounded(flat, dps), {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = values[start : start + size].reshape(shape)
        start += size
    return out


def _encoder_layer_vjp(x, params, num_heads, d_out, mask, eps, relu_at_zero, exact: bool, dps: int):
    out = encoder_layer(x, params, num_heads, mask, eps=eps)  # validates every input, with its own errors
    choice("relu_at_zero", relu_at_zero, RELU_AT_ZERO)  # type: ignore[arg-type]
    x = as_float_array("x", x, min_ndim=2)
    d_out = _cotangent("d_out", d_out, out.shape)
    visible = _visible(mask, out.shape[:-2], x.shape[-2], x.shape[-2])

    def compute(ar: _Arithmetic) -> dict[str, Any]:
        _, pullback = _encoder_layer_pullback(
            ar, ar.lift(x), _map_tree(ar.lift, params), num_heads, visible, eps, relu_at_zero
        )
        dx, grads = pullback(ar.lift(d_out))
        return {"x": _unbroadcast(dx, x.shape), **grads}

    return _in_tier(compute, exact, dps)


def encoder_layer_vjp(
    x: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
) -> dict[str, np.ndarray]:
    """The VJP of one encoder layer: the gradient of x and of every parameter for the cotangent ``d_out``, by path
    ("x", "self_attn.w_q", ..., "norm1.gain", "ffn.w1", ...); fast tier (longdouble throughout, float64 out).

    Paper: §3.1, §3.2.3. Derivation in the comment above; choices as :func:`encoder_layer` and ReLU's derivative at 0
    ``relu_at_zero`` (0 or 1, as :func:`aiayn.reference.layers.feed_forward_vjp`). Shapes: as :func:`encoder_layer`,
    d_out the output's shape -> each input's shape.
    """
    return _encoder_layer_vjp(x, params, num_heads, d_out, mask, eps, relu_at_zero, False, DEFAULT_DPS)


def encoder_layer_vjp_exact(
    x: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
    dps: int = DEFAULT_DPS,
) -> dict[str, np.ndarray]:
    """The VJP of one encoder layer; exact tier (mpmath at ``dps`` digits, each gradient correctly rounded to
    float64). Paper: §3.1. Same definition, names, choices and shapes as :func:`encoder_layer_vjp`."""
    return _encoder_layer_vjp(x, params, num_heads, d_out, mask, eps, relu_at_zero, True, dps)


def _decoder_layer_vjp(y, memory, params, num_heads, d_out, self_mask, memory_mask, eps, relu_at_zero, exact, dps):
    out = decoder_layer(y, memory, params, num_heads, self_mask, memory_mask, eps=eps)
    choice("relu_at_zero", relu_at_zero, RELU_AT_ZERO)  # type: ignore[arg-type]
    y, memory = as_float_array("y", y, min_ndim=2), as_float_array("memory", memory, min_ndim=2)
    d_out = _cotangent("d_out", d_out, out.shape)
    n_tgt, n_src, batch = y.shape[-2], memory.shape[-2], out.shape[:-2]
    self_visible = _visible(causal_mask(n_tgt, n_tgt) if self_mask is None else self_mask, batch, n_tgt, n_tgt)
    memory_visible = _visible(memory_mask, batch, n_tgt, n_src)

    def compute(ar: _Arithmetic) -> dict[str, Any]:
        lifted = _map_tree(ar.lift, params)
        _, pullback = _decoder_layer_pullback(
            ar, ar.lift(y), ar.lift(memory), lifted, num_heads, self_visible, memory_visible, eps, relu_at_zero
        )
        dy, dmemory, grads = pullback(ar.lift(d_out))
        return {"y": _unbroadcast(dy, y.shape), "memory": _unbroadcast(dmemory, memory.shape), **grads}

    return _in_tier(compute, exact, dps)


def decoder_layer_vjp(
    y: Any,
    memory: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    self_mask: Any = None,
    memory_mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
) -> dict[str, np.ndarray]:
    """The VJP of one decoder layer: the gradient of y, of the encoder output ``memory`` (its key-and-value use) and
    of every parameter, by path ("y", "memory", "self_attn.w_q", "cross_attn.w_k", "norm3.gain", ...); fast tier.

    Paper: §3.1, §3.2.3. Derivation in the comment above; choices as :func:`decoder_layer` (the causal self mask by
    default) and ``relu_at_zero``. Shapes: as :func:`decoder_layer`, d_out the output's shape -> each input's shape.
    """
    return _decoder_layer_vjp(
        y, memory, params, num_heads, d_out, self_mask, memory_mask, eps, relu_at_zero, False, DEFAULT_DPS
    )


def decoder_layer_vjp_exact(
    y: Any,
    memory: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_out: Any,
    self_mask: Any = None,
    memory_mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
    dps: int = DEFAULT_DPS,
) -> dict[str, np.ndarray]:
    """The VJP of one decoder layer; exact tier (each gradient correctly rounded to float64). Paper: §3.1, §3.2.3.
    Same definition, names, choices and shapes as :func:`decoder_layer_vjp`."""
    return _decoder_layer_vjp(y, memory, params, num_heads, d_out, self_mask, memory_mask, eps, relu_at_zero, True, dps)


def _transformer_forward_vjp(
    src, tgt, params, num_heads, d_logits, src_lengths, tgt_lengths, eps, relu, exact, dps, departure=None
):
    logits = transformer_forward(
        src, tgt, params, num_heads, src_lengths=src_lengths, tgt_lengths=tgt_lengths, eps=eps
    )  # validates every input, with its own errors
    choice("relu_at_zero", relu, RELU_AT_ZERO)  # type: ignore[arg-type]
    d_logits = _cotangent("d_logits", d_logits, logits.shape)
    src, tgt = np.asarray(src), np.asarray(tgt)
    src_mask, tgt_mask = _masks(src.shape[1], tgt.shape[1], src_lengths, tgt_lengths)

    def compute(ar: _Arithmetic) -> dict[str, Any]:
        lifted = _map_tree(ar.lift, params)
        _, pullback = _transformer_pullback(ar, src, tgt, lifted, num_heads, src_mask, tgt_mask, eps, relu, departure)
        return pullback(ar.lift(d_logits))

    return _in_tier(compute, exact, dps)


def transformer_forward_vjp(
    src_tokens: Any,
    tgt_tokens: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_logits: Any,
    *,
    src_lengths: Any = None,
    tgt_lengths: Any = None,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
) -> dict[str, np.ndarray]:
    """The VJP of the full forward pass: the gradient of every parameter for the cotangent ``d_logits`` of the
    logits, by path ("embedding", "positional" when learned, "encoder.0.self_attn.w_q", "decoder.1.norm3.bias", ...);
    fast tier (longdouble throughout, float64 out). The shared embedding matrix receives the sum of its three uses.

    Paper: §3, Figure 1, §3.4, §3.5. Derivation in the comment above; choices as :func:`transformer_forward` and
    ``relu_at_zero``. Shapes: as :func:`transformer_forward`, d_logits the logits' shape (B, n_tgt, vocab).
    """
    return _transformer_forward_vjp(
        src_tokens,
        tgt_tokens,
        params,
        num_heads,
        d_logits,
        src_lengths,
        tgt_lengths,
        eps,
        relu_at_zero,
        False,
        DEFAULT_DPS,
    )


def transformer_forward_vjp_exact(
    src_tokens: Any,
    tgt_tokens: Any,
    params: Mapping[str, Any],
    num_heads: int,
    d_logits: Any,
    *,
    src_lengths: Any = None,
    tgt_lengths: Any = None,
    eps: float = DEFAULT_EPS,
    relu_at_zero: float = 0.0,
    dps: int = DEFAULT_DPS,
) -> dict[str, np.ndarray]:
    """The VJP of the full forward pass; exact tier (the sinusoids, every sub-layer and the sums in mpmath, each
    gradient correctly rounded to float64). Paper: §3, Figure 1. Same definition, names, choices and shapes as
    :func:`transformer_forward_vjp`."""
    return _transformer_forward_vjp(
        src_tokens, tgt_tokens, params, num_heads, d_logits, src_lengths, tgt_lengths, eps, relu_at_zero, True, dps
    )
