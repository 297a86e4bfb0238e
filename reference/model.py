"""The encoder-decoder, §3.1 (stacks), §3.2.3 (the three uses of attention), §3.4 (embeddings), §3.5.

Fast tier only (inference semantics: dropout excluded). Each sub-layer is the fast tier of its own
equation (multi-head attention, feed-forward, LayerNorm), so the composite's own error is a few
float64 ulps per sub-layer: every sub-layer computes in longdouble and rounds its result once to
float64 before the next one reads it.

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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aiayn.reference._checks import positive_int
from aiayn.reference.attention import causal_mask, multi_head_attention, padding_mask
from aiayn.reference.layers import embedding_lookup, feed_forward, output_logits, sublayer_connection
from aiayn.reference.positional import positional_encoding

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


def encoder_layer(
    x: Any, params: Mapping[str, Any], num_heads: int, mask: Any = None, *, eps: float = DEFAULT_EPS
) -> np.ndarray:
    """One encoder layer: self-attention then feed-forward, each as LayerNorm(x + Sublayer(x)).

    Paper: §3.1 ("The first is a multi-head self-attention mechanism, and the second is a simple,
    position-wise fully connected feed-forward network ... LayerNorm(x + Sublayer(x))"), §3.2.3
    (encoder self-attention: keys, values and queries all from the previous layer).

    Choices:
        Post-norm (the paper's); dropout excluded (inference); LayerNorm ``eps`` (paper silent,
        default 1e-6); ``mask`` (e.g. a padding mask) applies to the self-attention.

    Shapes: x (..., n, d_model) -> (..., n, d_model).
    """
    attn = params["self_attn"]
    x = sublayer_connection(
        x, lambda t: multi_head_attention(t, t, t, attn, num_heads, mask), *_norm(params, "norm1"), eps
    )
    return sublayer_connection(x, _ffn(params), *_norm(params, "norm2"), eps)


def decoder_layer(
    y: Any,
    memory: Any,
    params: Mapping[str, Any],
    num_heads: int,
    self_mask: Any = None,
    memory_mask: Any = None,
    *,
    eps: float = DEFAULT_EPS,
) -> np.ndarray:
    """One decoder layer: masked self-attention, encoder-decoder attention, feed-forward; each post-norm.

    Paper: §3.1 (the decoder inserts a third sub-layer performing multi-head attention over the
    output of the encoder stack; self-attention masked so that predictions for position i can
    depend only on positions less than i), §3.2.3.

    Choices:
        ``self_mask`` defaults to the causal mask (the paper's); pass a combined causal and
        padding mask to also hide padded target keys. ``memory_mask`` hides padded source keys.

    Shapes: y (..., n_tgt, d_model), memory (..., n_src, d_model) -> (..., n_tgt, d_model).
    """
    n_tgt = np.shape(y)[-2]
    if self_mask is None:
        self_mask = causal_mask(n_tgt, n_tgt)
    self_attn, cross_attn = params["self_attn"], params["cross_attn"]
    y = sublayer_connection(
        y, lambda t: multi_head_attention(t, t, t, self_attn, num_heads, self_mask), *_norm(params, "norm1"), eps
    )
    y = sublayer_connection(
        y,
        lambda t: multi_head_attention(t, memory, memory, cross_attn, num_heads, memory_mask),
        *_norm(params, "norm2"),
        eps,
    )
    return sublayer_connection(y, _ffn(params), *_norm(params, "norm3"), eps)


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
        (NaN, the attention's default policy). Dropout excluded; no final LayerNorm.

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
    n_src, n_tgt = src.shape[1], tgt.shape[1]
    src_mask = None if src_lengths is None else padding_mask(src_lengths, n_src)  # (B, 1, n_src)
    tgt_mask = causal_mask(n_tgt, n_tgt)  # (n_tgt, n_tgt)
    if tgt_lengths is not None:
        tgt_mask = tgt_mask & padding_mask(tgt_lengths, n_tgt)  # (B, n_tgt, n_tgt)

    x = _embed(src, params, "src_tokens")  # (B, n_src, d_model)
    for layer in _layers(params, "encoder"):
        x = encoder_layer(x, layer, h, src_mask, eps=eps)
    y = _embed(tgt, params, "tgt_tokens")  # (B, n_tgt, d_model)
    for layer in _layers(params, "decoder"):
        y = decoder_layer(y, x, layer, h, tgt_mask, src_mask, eps=eps)
    return output_logits(y, params["embedding"])  # (B, n_tgt, vocab)


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
