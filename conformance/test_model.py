"""§3.1 composites against ``aiayn.reference.model`` with canonical weights.

The composites: encoder layer, decoder layer, full forward pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import model as M
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile
from aiayn.reference import model as ref_model


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


# --------------------------------------------------------------------------------------------
# the backward pass: every input's and parameter's gradient against the oracle's VJP (few examples: each budget
# carries every stage's error through the rest of the forward and backward computation, a second or so a call)


@pytest.mark.aiayn_equation("encoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_encoder_layer_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.encoder_inputs(dtype, scope=S.scope(impl, "encoder_layer")))
    shape = np.shape(ref_model.encoder_layer(args["x"], args["params"], args["num_heads"], args["mask"]))
    M.encoder_layer_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("decoder_layer", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_decoder_layer_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.decoder_inputs(dtype, scope=S.scope(impl, "decoder_layer")))
    shape = np.broadcast_shapes(args["y"].shape, (*args["memory"].shape[:-2], *args["y"].shape[-2:]))
    M.decoder_layer_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("transformer_forward", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_transformer_forward_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.forward_inputs(dtype, scope=S.scope(impl, "transformer_forward")))
    shape = (args["src"].shape[0], args["tgt"].shape[1], args["params"]["embedding"].shape[0])
    M.transformer_forward_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))
