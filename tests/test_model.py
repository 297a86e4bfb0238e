"""The oracle's encoder-decoder (reference/model.py, §3.1-§3.5) is wired as the paper says.

The sub-layers are tested on their own (test_attention, test_layers); here we check the wiring:
a closed-form model whose every value can be worked by hand, causality and padding as bit-exact
invariances, and the canonical layout's shapes.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from aiayn.reference.model import decoder_layer, encoder_layer, init_params, transformer_forward

SMALL = SimpleNamespace(n_layers=2, d_model=8, d_ff=16, num_heads=2, d_k=4, d_v=4)


def _zero_mha(d: int) -> dict[str, np.ndarray]:
    return {n: np.zeros((d, d)) for n in ("w_q", "w_k", "w_v", "w_o")}


def _norm(gain=(1.0, 1.0), bias=(0.0, 0.0)) -> dict[str, np.ndarray]:
    return {"gain": np.array(gain), "bias": np.array(bias)}


def _zero_ffn() -> dict[str, np.ndarray]:
    return {"w1": np.zeros((2, 1)), "b1": np.zeros(1), "w2": np.zeros((1, 2)), "b2": np.zeros(2)}


def test_closed_form_two_wide_model():
    """A 2-wide model with zeroed attention and FFN weights can be worked by hand.

    Every sub-layer then outputs 0 (zero projections give zero values; zero FFN weights give b2=0),
    so each post-norm step is LayerNorm(x). With d_model = 2, eps = 0, gain 1, bias 0,
    LayerNorm((a, b)) = (1, -1) if a > b else (-1, 1). The decoder input for target token t at
    position p is E[t] * sqrt(2) + (sin p, cos p) (§3.4, §3.5 with d_model = 2: one pair, i = 0);
    the last LayerNorm has gain (2, 3) and bias (0.5, 0), and the logits are y @ E^T (§3.4).
    With E = [[3, 0], [0, 3], [1, 1]]:
      token 0: (3 sqrt 2 + sin p, cos p) -> s = (1, -1) -> y = (2.5, -3)  -> logits (7.5, -9, -0.5)
      token 1: (sin p, 3 sqrt 2 + cos p) -> s = (-1, 1) -> y = (-1.5, 3)  -> logits (-4.5, 9, 1.5)
      token 2 at p = 0: (sqrt 2, sqrt 2 + 1) -> (-1, 1) -> logits (-4.5, 9, 1.5)
      token 2 at p = 1: sin 1 = 0.841 > cos 1 = 0.540 -> (1, -1) -> logits (7.5, -9, -0.5)
    """
    emb = np.array([[3.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    enc = {"self_attn": _zero_mha(2), "norm1": _norm(), "ffn": _zero_ffn(), "norm2": _norm()}
    dec = {
        "self_attn": _zero_mha(2),
        "norm1": _norm(),
        "cross_attn": _zero_mha(2),
        "norm2": _norm(),
        "ffn": _zero_ffn(),
        "norm3": _norm(gain=(2.0, 3.0), bias=(0.5, 0.0)),
    }
    params = {"embedding": emb, "encoder": [enc], "decoder": [dec]}
    logits = transformer_forward(np.array([[0, 1]]), np.array([[2, 2, 0, 1]]), params, 1, eps=0.0)
    up, down = [7.5, -9.0, -0.5], [-4.5, 9.0, 1.5]
    expected = np.array([[down, up, up, down]])  # token 2 at p = 0 and p = 1, then tokens 0 and 1
    np.testing.assert_array_equal(logits, expected)
    assert math.sin(1) > math.cos(1)  # the hand-worked branch for token 2 at p = 1


def test_decoder_is_causal_bit_for_bit():
    """Logits at target positions <= i do not depend on target tokens after i (§3.1, §3.2.3)."""
    rng = np.random.default_rng(0)
    params = init_params(SMALL, 11, rng)
    src = rng.integers(0, 11, size=(2, 5))
    tgt = rng.integers(0, 11, size=(2, 6))
    tgt2 = tgt.copy()
    tgt2[:, 4:] = (tgt[:, 4:] + 1) % 11
    a = transformer_forward(src, tgt, params, SMALL.num_heads)
    b = transformer_forward(src, tgt2, params, SMALL.num_heads)
    assert np.array_equal(a[:, :4], b[:, :4]), "positions 0-3 changed when only tokens 4-5 changed"
    assert not np.array_equal(a[:, 4:], b[:, 4:]), "positions 4-5 ignored their own tokens"


def test_padded_source_tokens_change_nothing():
    """With src_lengths, what lies in the padding of the source never reaches the logits."""
    rng = np.random.default_rng(1)
    params = init_params(SMALL, 11, rng)
    src = rng.integers(0, 11, size=(2, 5))
    tgt = rng.integers(0, 11, size=(2, 3))
    lengths = np.array([3, 5])
    src2 = src.copy()
    src2[0, 3:] = (src[0, 3:] + 5) % 11
    a = transformer_forward(src, tgt, params, SMALL.num_heads, src_lengths=lengths)
    b = transformer_forward(src2, tgt, params, SMALL.num_heads, src_lengths=lengths)
    assert np.array_equal(a, b)
    c = transformer_forward(src2, tgt, params, SMALL.num_heads)  # without the mask, padding leaks in
    assert not np.array_equal(a[0], c[0])


def test_source_reaches_the_decoder_through_cross_attention():
    rng = np.random.default_rng(2)
    params = init_params(SMALL, 11, rng)
    tgt = rng.integers(0, 11, size=(1, 3))
    a = transformer_forward(np.array([[1, 2, 3]]), tgt, params, SMALL.num_heads)
    b = transformer_forward(np.array([[3, 2, 1]]), tgt, params, SMALL.num_heads)
    assert not np.array_equal(a, b)


def test_batch_elements_are_independent():
    rng = np.random.default_rng(3)
    params = init_params(SMALL, 11, rng)
    src = rng.integers(0, 11, size=(3, 4))
    tgt = rng.integers(0, 11, size=(3, 5))
    whole = transformer_forward(src, tgt, params, SMALL.num_heads)
    for b in range(3):
        alone = transformer_forward(src[b : b + 1], tgt[b : b + 1], params, SMALL.num_heads)
        assert np.array_equal(whole[b], alone[0]), f"batch element {b} depends on the others"


def test_layers_keep_the_model_width_and_learned_positions_are_used():
    rng = np.random.default_rng(4)
    params = init_params(SMALL, 11, rng, max_positions=7)
    x = rng.normal(size=(2, 5, SMALL.d_model))
    assert encoder_layer(x, params["encoder"][0], 2).shape == (2, 5, 8)
    assert decoder_layer(x[:, :3], x, params["decoder"][0], 2).shape == (2, 3, 8)
    src, tgt = rng.integers(0, 11, size=(1, 4)), rng.integers(0, 11, size=(1, 3))
    learned = transformer_forward(src, tgt, params, 2)
    del params["positional"]
    assert not np.array_equal(learned, transformer_forward(src, tgt, params, 2))


def test_bad_model_input_is_named():
    rng = np.random.default_rng(5)
    params = init_params(SMALL, 11, rng)
    with pytest.raises(ValueError, match="src_tokens"):
        transformer_forward(np.array([1, 2]), np.array([[1]]), params, 2)
    with pytest.raises(ValueError, match="batch size"):
        transformer_forward(np.array([[1, 2]]), np.array([[1], [2]]), params, 2)
    with pytest.raises(ValueError, match="encoder"):
        transformer_forward(np.array([[1, 2]]), np.array([[1]]), {**params, "encoder": []}, 2)
    with pytest.raises(ValueError, match="norm2"):
        encoder_layer(np.ones((2, 8)), {k: v for k, v in params["encoder"][0].items() if k != "norm2"}, 2)


# --------------------------------------------------------------------------------------------
# the layers in training mode (§5.4's residual dropout, given the masks)


def _masks(names, shape, value):
    return {name: np.full(shape, value) for name in names}


def test_training_layers_with_every_element_kept_at_rate_zero_are_the_evaluation_layers_bit_for_bit():
    """keep all True and p = 0: dropout is x / 1 = x exactly, so the layer is the evaluation layer."""
    rng = np.random.default_rng(6)
    params = init_params(SMALL, 11, rng)
    x, memory = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 4, 8))
    enc, dec = params["encoder"][0], params["decoder"][0]
    kept = encoder_layer(x, enc, 2, keep=_masks(("self_attn", "ffn"), x.shape, True), p_drop=0.0)
    assert np.array_equal(kept, encoder_layer(x, enc, 2))
    kept = decoder_layer(x, memory, dec, 2, keep=_masks(("self_attn", "cross_attn", "ffn"), x.shape, True), p_drop=0.0)
    assert np.array_equal(kept, decoder_layer(x, memory, dec, 2))


def test_training_layers_with_every_element_dropped_are_layer_norms_of_their_inputs():
    """Every sub-layer output dropped: each sub-layer connection is LayerNorm(x + 0), the layer LayerNorm applied once
    per sub-layer (an independent computation through aiayn.reference.layers.layer_norm, whatever the weights)."""
    from aiayn.reference.layers import layer_norm

    rng = np.random.default_rng(7)
    params = init_params(SMALL, 11, rng)
    x, memory = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 4, 8))
    enc, dec = params["encoder"][0], params["decoder"][0]
    expected = x
    for norm in ("norm1", "norm2"):
        expected = layer_norm(expected, enc[norm]["gain"], enc[norm]["bias"], 1e-6)
    got = encoder_layer(x, enc, 2, keep=_masks(("self_attn", "ffn"), x.shape, False), p_drop=0.3)
    assert np.array_equal(got, expected)
    expected = x
    for norm in ("norm1", "norm2", "norm3"):
        expected = layer_norm(expected, dec[norm]["gain"], dec[norm]["bias"], 1e-6)
    got = decoder_layer(x, memory, dec, 2, keep=_masks(("self_attn", "cross_attn", "ffn"), x.shape, False), p_drop=0.3)
    assert np.array_equal(got, expected)


def test_training_layers_drop_each_sub_layer_by_its_own_mask():
    """Dropping only the feed-forward's output: the self-attention's connection is the evaluation one, so the layer
    is LayerNorm(z + 0) with z the evaluation layer's first connection; the masks are read by sub-layer name."""
    from aiayn.reference.attention import multi_head_attention
    from aiayn.reference.layers import layer_norm, sublayer_connection

    rng = np.random.default_rng(8)
    enc = init_params(SMALL, 11, rng)["encoder"][0]
    x = rng.normal(size=(1, 4, 8))
    keep = {"self_attn": np.ones(x.shape, dtype=bool), "ffn": np.zeros(x.shape, dtype=bool)}
    mha = lambda t: multi_head_attention(t, t, t, enc["self_attn"], 2)  # noqa: E731
    z = sublayer_connection(x, mha, enc["norm1"]["gain"], enc["norm1"]["bias"], 1e-6)
    expected = layer_norm(z, enc["norm2"]["gain"], enc["norm2"]["bias"], 1e-6)
    assert np.array_equal(encoder_layer(x, enc, 2, keep=keep, p_drop=0.0), expected)


def test_training_layers_name_a_wrong_set_of_masks():
    rng = np.random.default_rng(9)
    params = init_params(SMALL, 11, rng)
    x = rng.normal(size=(1, 3, 8))
    with pytest.raises(ValueError, match=r"keep: expected a mapping of the sub-layers \['self_attn', 'ffn'\]"):
        encoder_layer(x, params["encoder"][0], 2, keep={"self_attn": np.ones(x.shape, dtype=bool)})
    with pytest.raises(ValueError, match="cross_attn"):
        decoder_layer(x, x, params["decoder"][0], 2, keep=_masks(("self_attn", "ffn"), x.shape, True))
    with pytest.raises(TypeError, match="keep: expected a boolean array"):
        encoder_layer(x, params["encoder"][0], 2, keep=_masks(("self_attn", "ffn"), x.shape, 1.0))


def test_the_whole_model_in_training_mode_drops_the_embeddings_sums_and_each_sub_layer():
    """keep all True at rate 0 is the evaluation model bit for bit; with the source's embedding sum dropped whole
    (every other place kept, rate 0), the logits are those of a composition by hand whose encoder reads zeros (the
    layers, the target's embedding sum and the tied projection called one by one); every place is needed."""
    from aiayn.reference.layers import embedding_lookup, output_logits
    from aiayn.reference.model import dropout_places
    from aiayn.reference.positional import positional_encoding

    rng = np.random.default_rng(10)
    params = init_params(SMALL, 11, rng)
    src, tgt = rng.integers(0, 11, size=(2, 4)), rng.integers(0, 11, size=(2, 3))
    places = dropout_places(2, 2)
    assert places[:3] == ("src_embedding", "encoder.0.self_attn", "encoder.0.ffn") and places[5] == "tgt_embedding"

    def masks(dropped: str = "") -> dict[str, np.ndarray]:
        return {p: np.full((2, 4 if p.startswith(("src", "encoder")) else 3, 8), p != dropped) for p in places}

    evaluation = transformer_forward(src, tgt, params, 2)
    assert np.array_equal(transformer_forward(src, tgt, params, 2, keep=masks(), p_drop=0.0), evaluation)
    memory = np.zeros((2, 4, 8))
    for layer in params["encoder"]:
        memory = encoder_layer(memory, layer, 2)
    y = embedding_lookup(tgt, params["embedding"]) + positional_encoding(3, 8)
    for layer in params["decoder"]:
        y = decoder_layer(y, memory, layer, 2)
    expected = output_logits(y, params["embedding"])
    assert np.array_equal(transformer_forward(src, tgt, params, 2, keep=masks("src_embedding"), p_drop=0.0), expected)
    with pytest.raises(ValueError, match="keep: expected a mapping of the places"):
        transformer_forward(src, tgt, params, 2, keep={p: m for p, m in masks().items() if p != "decoder.1.ffn"})
