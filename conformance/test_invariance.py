"""Batch invariance of every batched equation (§3.1-§3.3, §3.2.3): the drawn example computed alone, at another
index of a larger batch whose other elements have other lengths, and with hidden padding, each within the
equation's budget; bit for bit in the batch where the implementation declares ``policies["batch_invariant"]``
(``checks/invariance.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import invariance as I
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import batches
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


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
