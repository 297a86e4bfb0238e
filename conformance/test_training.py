"""§5.3 the learning-rate schedule (Eq. (3)) and Adam's step, §5.4 label smoothing, the smoothed cross-entropy and
residual dropout, §6.1 checkpoint averaging.

``lrate`` and ``label_smoothing`` take no float input; they run in the implementation's first
(most precise) dtype only.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import training as T
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


@pytest.mark.aiayn_equation("lrate")
@profile(0.5)
@given(args=S.lrate_inputs())
def test_lrate(impl: Any, dtype: str, args: dict[str, Any]) -> None:
    T.lrate(impl, dtype, **args)


@pytest.mark.aiayn_equation("lrate")
@profile(0.5)
@given(args=S.lrate_shape_inputs())
def test_lrate_rises_linearly_to_its_peak_then_decays_as_inverse_sqrt(
    impl: Any, dtype: str, args: dict[str, Any]
) -> None:
    T.lrate_rises_linearly_to_its_peak_then_decays_as_inverse_sqrt(impl, dtype, **args)


@pytest.mark.aiayn_equation("lrate")
def test_lrate_at_step_zero_follows_the_declared_policy(impl: Any, dtype: str) -> None:
    T.lrate_at_step_zero_follows_the_declared_policy(impl, dtype, d_model=512, warmup_steps=4000)


@pytest.mark.aiayn_equation("adam_step")
@profile()
@given(data=st.data())
def test_adam_step(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.adam_step(impl, dtype, **data.draw(S.adam_inputs(dtype)))


@pytest.mark.aiayn_equation("label_smoothing")
@profile()
@given(data=st.data())
def test_label_smoothing(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.label_smoothing(impl, dtype, **data.draw(S.label_smoothing_inputs(dtype, min_classes=S.min_classes(impl))))


@pytest.mark.aiayn_equation("label_smoothing")
@profile(0.5)
@given(data=st.data())
def test_smoothed_targets_sum_to_one(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.smoothed_targets_sum_to_one(
        impl, dtype, **data.draw(S.label_smoothing_inputs(dtype, min_classes=S.min_classes(impl)))
    )


@pytest.mark.aiayn_equation("smoothed_cross_entropy")
@profile()
@given(data=st.data())
def test_smoothed_cross_entropy(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.smoothed_cross_entropy(impl, dtype, **data.draw(S.cross_entropy_inputs(dtype, min_classes=S.min_classes(impl))))


@pytest.mark.aiayn_equation("smoothed_cross_entropy")
@profile(0.5)
@given(data=st.data())
def test_smoothed_cross_entropy_is_minimised_at_the_target_with_value_its_entropy(
    impl: Any, dtype: str, data: st.DataObject
) -> None:
    T.smoothed_cross_entropy_is_minimised_at_the_target_with_value_its_entropy(
        impl, dtype, **data.draw(S.cross_entropy_minimum_inputs(dtype))
    )


@pytest.mark.aiayn_equation("smoothed_cross_entropy", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_smoothed_cross_entropy_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.cross_entropy_inputs(dtype, min_classes=S.min_classes(impl)))
    T.smoothed_cross_entropy_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(args["targets"].shape)))


@pytest.mark.aiayn_equation("dropout")
@profile()
@given(data=st.data())
def test_dropout(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.dropout(impl, dtype, **data.draw(S.dropout_inputs(dtype)))


@pytest.mark.aiayn_equation("dropout")
@profile(0.25)
@given(data=st.data())
def test_dropout_keeps_each_element_with_probability_one_minus_p(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.dropout_keeps_each_element_with_probability_one_minus_p(impl, dtype, **data.draw(S.dropout_draws(dtype)))


@pytest.mark.aiayn_equation("dropout")
@profile(0.25)
@given(data=st.data())
def test_dropout_keeps_neighbours_independently(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.dropout_keeps_neighbours_independently(impl, dtype, **data.draw(S.dropout_draws(dtype)))


@pytest.mark.aiayn_equation("dropout")
@profile(0.25)
@given(data=st.data())
def test_dropout_masks_of_different_seeds_are_independent(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.dropout_masks_of_different_seeds_are_independent(impl, dtype, **data.draw(S.dropout_draws(dtype)))


@pytest.mark.aiayn_equation("average_checkpoints")
@profile()
@given(data=st.data())
def test_average_checkpoints(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.average_checkpoints(impl, dtype, **data.draw(S.checkpoint_inputs(dtype)))


@pytest.mark.aiayn_equation("encoder_layer_training")
@profile(0.5)
@given(data=st.data())
def test_encoder_layer_training(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.encoder_layer_training(
        impl, dtype, **data.draw(S.encoder_training_inputs(dtype, scope=S.scope(impl, "encoder_layer_training")))
    )


@pytest.mark.aiayn_equation("encoder_layer_training")
@profile(0.25)
@given(data=st.data())
def test_encoder_layer_training_keeps_each_element_with_probability_one_minus_p(
    impl: Any, dtype: str, data: st.DataObject
) -> None:
    T.encoder_layer_training_keeps_each_element_with_probability_one_minus_p(
        impl, dtype, **data.draw(S.encoder_training_inputs(dtype, scope=S.scope(impl, "encoder_layer_training")))
    )


@pytest.mark.aiayn_equation("decoder_layer_training")
@profile(0.5)
@given(data=st.data())
def test_decoder_layer_training(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.decoder_layer_training(
        impl, dtype, **data.draw(S.decoder_training_inputs(dtype, scope=S.scope(impl, "decoder_layer_training")))
    )


@pytest.mark.aiayn_equation("decoder_layer_training")
@profile(0.25)
@given(data=st.data())
def test_decoder_layer_training_keeps_each_element_with_probability_one_minus_p(
    impl: Any, dtype: str, data: st.DataObject
) -> None:
    T.decoder_layer_training_keeps_each_element_with_probability_one_minus_p(
        impl, dtype, **data.draw(S.decoder_training_inputs(dtype, scope=S.scope(impl, "decoder_layer_training")))
    )


@pytest.mark.aiayn_equation("encoder_layer")
@profile(0.25)
@given(data=st.data())
def test_encoder_layer_applies_no_dropout_at_evaluation(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.encoder_layer_applies_no_dropout_at_evaluation(
        impl, dtype, **data.draw(S.encoder_inputs(dtype, scope=S.scope(impl, "encoder_layer")))
    )


@pytest.mark.aiayn_equation("decoder_layer")
@profile(0.25)
@given(data=st.data())
def test_decoder_layer_applies_no_dropout_at_evaluation(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.decoder_layer_applies_no_dropout_at_evaluation(
        impl, dtype, **data.draw(S.decoder_inputs(dtype, scope=S.scope(impl, "decoder_layer")))
    )


@pytest.mark.aiayn_equation("transformer_forward_training")
@profile(0.375)
@given(data=st.data())
def test_transformer_forward_training(impl: Any, dtype: str, data: st.DataObject) -> None:
    T.transformer_forward_training(
        impl, dtype, **data.draw(S.forward_training_inputs(dtype, scope=S.scope(impl, "transformer_forward_training")))
    )


@pytest.mark.aiayn_equation("transformer_forward_training")
@profile(0.125)
@given(data=st.data())
def test_transformer_forward_training_keeps_each_element_with_probability_one_minus_p(
    impl: Any, dtype: str, data: st.DataObject
) -> None:
    T.transformer_forward_training_keeps_each_element_with_probability_one_minus_p(
        impl, dtype, **data.draw(S.forward_training_inputs(dtype, scope=S.scope(impl, "transformer_forward_training")))
    )
