"""§3.1 composites against ``aiayn.reference.model`` with canonical weights.

The composites: encoder layer, decoder layer, full forward pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance import strategies as S
from aiayn.conformance.checks import model as M
from aiayn.conformance.profiles import profile


@pytest.mark.aiayn_equation("encoder_layer")
@profile(0.5)
@given(data=st.data())
def test_encoder_layer(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.encoder_layer(impl, dtype, **data.draw(S.encoder_inputs(dtype, scope=S.scope(impl, "encoder_layer"))))


@pytest.mark.aiayn_equation("decoder_layer")
@profile(0.5)
@given(data=st.data())
def test_decoder_layer(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.decoder_layer(impl, dtype, **data.draw(S.decoder_inputs(dtype, scope=S.scope(impl, "decoder_layer"))))


@pytest.mark.aiayn_equation("decoder_layer")
@profile(0.25)
@given(data=st.data())
def test_decoder_output_at_i_ignores_decoder_inputs_after_i(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.decoder_output_at_i_ignores_decoder_inputs_after_i(
        impl, dtype, **data.draw(S.decoder_inputs(dtype, causal_check=True, scope=S.scope(impl, "decoder_layer")))
    )


@pytest.mark.aiayn_equation("transformer_forward")
@profile(0.375)
@given(data=st.data())
def test_transformer_forward(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.transformer_forward(impl, dtype, **data.draw(S.forward_inputs(dtype, scope=S.scope(impl, "transformer_forward"))))


@pytest.mark.aiayn_equation("transformer_forward")
@profile(0.25)
@given(data=st.data())
def test_transformer_logits_at_i_ignore_target_tokens_after_i(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.transformer_logits_at_i_ignore_target_tokens_after_i(
        impl, dtype, **data.draw(S.forward_inputs(dtype, kind="causal", scope=S.scope(impl, "transformer_forward")))
    )


@pytest.mark.aiayn_equation("transformer_forward")
@profile(0.25)
@given(data=st.data())
def test_transformer_batch_elements_are_independent(impl: Any, dtype: str, data: st.DataObject) -> None:
    M.transformer_batch_elements_are_independent(
        impl, dtype, **data.draw(S.forward_inputs(dtype, kind="batch", scope=S.scope(impl, "transformer_forward")))
    )
