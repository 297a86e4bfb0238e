"""Batch invariance of every batched equation (§3.1-§3.3, §3.2.3): the drawn example computed alone, at another
index of a larger batch whose other elements have other lengths, and with hidden padding, each within the
equation's budget; bit for bit in the batch where the implementation declares ``policies["batch_invariant"]``
(``checks/invariance.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import decoding as C
from aiayn.conformance.checks import invariance as I
from aiayn.conformance.directions import BACKWARD, DECODE
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import batches
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


def _decode_draws(impl: Any, dtype: str, data: st.DataObject, kind: str) -> dict[str, Any]:
    """Sentences to decode (``kind`` "steps") or search ("beam"), drawn as the decoding checks draw them, and where
    they go."""
    args = data.draw(S.decode_inputs(dtype, kind=kind, scope=S.scope(impl, "transformer_forward")))
    return {**args, **data.draw(batches.placement())}


def _gradient_draws(impl: Any, dtype: str, data: st.DataObject, equation: str) -> dict[str, Any]:
    """The equation's example with no slice whose gradient is undefined (``strategies.defined_gradients``; the
    agreement checks cover those rows), where it goes, and the seed of its cotangents."""
    args = data.draw(record(equation).strategy(dtype, scope=S.scope(impl, equation)))
    args = S.defined_gradients(impl, args, "mask")
    if "axis" in args:  # softmax's x: a slice of -inf has no gradient
        args = S.defined_gradients(impl, args, "x", args["axis"])
    return {**args, **data.draw(batches.placement())}


def _draws(impl: Any, dtype: str, data: st.DataObject, equation: str) -> dict[str, Any]:
    """The equation's example, drawn by its record's strategy, and where it goes (``inputs/batches.placement``)."""
    args = data.draw(record(equation).strategy(dtype, scope=S.scope(impl, equation)))
    return {**args, **data.draw(batches.placement())}


@pytest.mark.aiayn_equation("softmax")
@profile(0.25)
@given(data=st.data())
def test_softmax_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.softmax_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "softmax"))


@pytest.mark.aiayn_equation("scaled_dot_product_attention")
@profile(0.25)
@given(data=st.data())
def test_scaled_dot_product_attention_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.scaled_dot_product_attention_is_batch_invariant(
        impl, dtype, **_draws(impl, dtype, data, "scaled_dot_product_attention")
    )


@pytest.mark.aiayn_equation("multi_head_attention")
@profile(0.25)
@given(data=st.data())
def test_multi_head_attention_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.multi_head_attention_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "multi_head_attention"))


@pytest.mark.aiayn_equation("layer_norm")
@profile(0.25)
@given(data=st.data())
def test_layer_norm_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.layer_norm_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "layer_norm"))


@pytest.mark.aiayn_equation("feed_forward")
@profile(0.25)
@given(data=st.data())
def test_feed_forward_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.feed_forward_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "feed_forward"))


@pytest.mark.aiayn_equation("encoder_layer")
@profile(0.25)
@given(data=st.data())
def test_encoder_layer_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.encoder_layer_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "encoder_layer"))


@pytest.mark.aiayn_equation("decoder_layer")
@profile(0.25)
@given(data=st.data())
def test_decoder_layer_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.decoder_layer_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "decoder_layer"))


@pytest.mark.aiayn_equation("transformer_forward")
@profile(0.25)
@given(data=st.data())
def test_transformer_forward_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.transformer_forward_is_batch_invariant(impl, dtype, **_draws(impl, dtype, data, "transformer_forward"))


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.25)
@given(data=st.data())
def test_cached_decoding_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "steps")
    I.cached_decoding_is_batch_invariant(impl, dtype, **_decode_draws(impl, dtype, data, "steps"))


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.25)
@given(data=st.data())
def test_beam_search_is_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "search")
    I.beam_search_is_batch_invariant(impl, dtype, **_decode_draws(impl, dtype, data, "beam"))


@pytest.mark.aiayn_equation("softmax", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_softmax_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.softmax_gradients_are_batch_invariant(impl, dtype, **_gradient_draws(impl, dtype, data, "softmax"))


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_scaled_dot_product_attention_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.scaled_dot_product_attention_gradients_are_batch_invariant(
        impl, dtype, **_gradient_draws(impl, dtype, data, "scaled_dot_product_attention")
    )


@pytest.mark.aiayn_equation("multi_head_attention", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_multi_head_attention_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.multi_head_attention_gradients_are_batch_invariant(
        impl, dtype, **_gradient_draws(impl, dtype, data, "multi_head_attention")
    )


@pytest.mark.aiayn_equation("layer_norm", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_layer_norm_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    # rows of two or more elements, as the gradients' agreement test: a row of one has a property test of its own
    args = data.draw(S.layer_norm_inputs(dtype, scope=S.scope(impl, "layer_norm"), min_d=2))
    I.layer_norm_gradients_are_batch_invariant(impl, dtype, **args, **data.draw(batches.placement()))


@pytest.mark.aiayn_equation("feed_forward", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_feed_forward_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.feed_forward_gradients_are_batch_invariant(impl, dtype, **_gradient_draws(impl, dtype, data, "feed_forward"))


@pytest.mark.aiayn_equation("encoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_encoder_layer_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.encoder_layer_gradients_are_batch_invariant(impl, dtype, **_gradient_draws(impl, dtype, data, "encoder_layer"))


@pytest.mark.aiayn_equation("decoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_decoder_layer_gradients_are_batch_invariant(impl: Any, dtype: str, data: st.DataObject) -> None:
    I.decoder_layer_gradients_are_batch_invariant(impl, dtype, **_gradient_draws(impl, dtype, data, "decoder_layer"))


@pytest.mark.aiayn_equation("softmax", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_softmax_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "softmax")
    I.softmax_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_scaled_dot_product_attention_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    # lengths across tiles: an order of accumulation that changes between runs shows over many rows (over one or
    # two, a sum does not depend on its order)
    args = data.draw(S.attention_across_tiles(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    args = S.defined_gradients(impl, args, "mask")
    I.scaled_dot_product_attention_gradients_are_deterministic(
        impl, dtype, **args, seed=data.draw(st.integers(0, 2**32 - 1))
    )


@pytest.mark.aiayn_equation("multi_head_attention", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_multi_head_attention_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "multi_head_attention")
    I.multi_head_attention_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )


@pytest.mark.aiayn_equation("layer_norm", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_layer_norm_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    # rows of two or more elements, as the gradients' agreement test: a row of one has a property test of its own
    args = data.draw(S.layer_norm_inputs(dtype, scope=S.scope(impl, "layer_norm"), min_d=2))
    I.layer_norm_gradients_are_deterministic(impl, dtype, **args, seed=data.draw(st.integers(0, 2**32 - 1)))


@pytest.mark.aiayn_equation("feed_forward", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_feed_forward_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "feed_forward")
    I.feed_forward_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )


@pytest.mark.aiayn_equation("encoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_encoder_layer_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "encoder_layer")
    I.encoder_layer_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )


@pytest.mark.aiayn_equation("decoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_decoder_layer_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "decoder_layer")
    I.decoder_layer_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )


@pytest.mark.aiayn_equation("smoothed_cross_entropy", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_smoothed_cross_entropy_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.cross_entropy_inputs(dtype, min_classes=S.min_classes(impl)))
    I.smoothed_cross_entropy_gradients_are_deterministic(impl, dtype, **args, seed=data.draw(st.integers(0, 2**32 - 1)))


@pytest.mark.aiayn_equation("transformer_forward", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_transformer_forward_gradients_are_deterministic(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _gradient_draws(impl, dtype, data, "transformer_forward")
    I.transformer_forward_gradients_are_deterministic(
        impl, dtype, **{k: v for k, v in args.items() if k not in ("size", "index", "hidden")}
    )
