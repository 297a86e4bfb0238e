"""§3.2: softmax, scaled dot-product attention (Eq. (1)), masking (§3.2.3) and multi-head attention (§3.2.2).

Agreement with the oracle within derived budgets (the forward pass, and the gradients against the oracle's VJP),
and these metamorphic relations:
softmax shift invariance and rows summing to 1; keys and values permuted together; queries
permuted; masked keys equal to removed keys; poison at masked positions; the causal mask; batch
elements and heads independent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import attention as A
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile

# --------------------------------------------------------------------------------------------
# softmax


@pytest.mark.aiayn_equation("softmax")
@profile()
@given(data=st.data())
def test_softmax(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.softmax(impl, dtype, **data.draw(S.softmax_inputs(dtype, scope=S.scope(impl, "softmax"))))


@pytest.mark.aiayn_equation("softmax")
@profile(0.5)
@given(data=st.data())
def test_softmax_rows_sum_to_one(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.softmax_rows_sum_to_one(impl, dtype, **data.draw(S.softmax_inputs(dtype, scope=S.scope(impl, "softmax"))))


@pytest.mark.aiayn_equation("softmax")
@profile(0.5)
@given(data=st.data())
def test_softmax_shift_invariance(impl: Any, dtype: str, data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from([(1, 3), (2, 5), (3, 1, 4)]))
    x, shift = data.draw(S.exact_shift(dtype, shape))
    A.softmax_shift_invariance(impl, dtype, x=x, axis=-1, shift=shift)


# --------------------------------------------------------------------------------------------
# scaled dot-product attention, Eq. (1)


@pytest.mark.aiayn_equation("scaled_dot_product_attention")
@profile()
@given(data=st.data())
def test_scaled_dot_product_attention(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.scaled_dot_product_attention(
        impl, dtype, **data.draw(S.attention_inputs(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("masks:random",))
@profile(0.5)
@given(data=st.data())
def test_attention_unchanged_when_keys_and_values_are_permuted_together(
    impl: Any, dtype: str, data: st.DataObject
) -> None:
    args = data.draw(S.attention_inputs(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    perm = np.array(data.draw(st.permutations(range(args["k"].shape[-2]))))
    A.attention_unchanged_when_keys_and_values_are_permuted_together(impl, dtype, **args, perm=perm)


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("masks:random",))
@profile(0.5)
@given(data=st.data())
def test_attention_outputs_follow_permuted_queries(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_inputs(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    perm = np.array(data.draw(st.permutations(range(args["q"].shape[-2]))))
    A.attention_outputs_follow_permuted_queries(impl, dtype, **args, perm=perm)


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("masks:padding", "cross-attention"))
@profile(0.5)
@given(data=st.data())
def test_attention_masked_keys_equal_removed_keys(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_inputs(dtype, mask=False, scope=S.scope(impl, "scaled_dot_product_attention")))
    keep = data.draw(S.keep_pattern(args["k"].shape[-2]))
    A.attention_masked_keys_equal_removed_keys(impl, dtype, q=args["q"], k=args["k"], v=args["v"], keep=keep)


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("masks:padding",))
@pytest.mark.parametrize("poison", ["huge", "nan_keys"])
@profile(0.5)
@given(data=st.data())
def test_attention_poison_at_masked_positions_changes_nothing(
    impl: Any, dtype: str, data: st.DataObject, poison: str
) -> None:
    args = data.draw(S.attention_inputs(dtype, mask=False, scope=S.scope(impl, "scaled_dot_product_attention")))
    keep = data.draw(S.keep_pattern(args["k"].shape[-2]))
    A.attention_poison_at_masked_positions_changes_nothing(
        impl, dtype, q=args["q"], k=args["k"], v=args["v"], keep=keep, poison=poison
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("masks:causal",))
@profile(0.5)
@given(data=st.data())
def test_causal_output_at_i_ignores_inputs_after_i(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.causal_output_at_i_ignores_inputs_after_i(
        impl, dtype, **data.draw(S.causal_perturbation(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", needs=("batch:1",))
@profile(0.5)
@given(data=st.data())
def test_attention_batch_elements_are_independent(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(
        S.attention_inputs(
            dtype, batch=(data.draw(st.integers(2, 3)),), scope=S.scope(impl, "scaled_dot_product_attention")
        )
    )
    A.attention_batch_elements_are_independent(
        impl, dtype, **args, index=data.draw(st.integers(0, args["q"].shape[0] - 1))
    )


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2


@pytest.mark.aiayn_equation("multi_head_attention")
@profile()
@given(data=st.data())
def test_multi_head_attention(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.multi_head_attention(impl, dtype, **data.draw(S.mha_inputs(dtype, scope=S.scope(impl, "multi_head_attention"))))


@pytest.mark.aiayn_equation("multi_head_attention", needs=("masks:random", "batch:1"))
@profile(0.5)
@given(data=st.data())
def test_multi_head_attention_fully_masked_self_attention_row(impl: Any, dtype: str, data: st.DataObject) -> None:
    A.multi_head_attention_fully_masked_self_attention_row(
        impl, dtype, **data.draw(S.mha_fully_masked_self_attention(dtype, scope=S.scope(impl, "multi_head_attention")))
    )


@pytest.mark.aiayn_equation("multi_head_attention")
@profile(0.25)
@given(data=st.data())
def test_multi_head_attention_heads_are_independent(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.mha_inputs(dtype, min_heads=2, fully_masked=False, scope=S.scope(impl, "multi_head_attention")))
    h, params = args["num_heads"], args["params"]
    d_k = params["w_q"].shape[1] // h
    d_model = params["w_q"].shape[0]
    scale = 1.5 / np.sqrt(d_model)
    names = ["w_q", "w_k", "w_v"] + [b for b in ("b_q", "b_k", "b_v") if b in params]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    replacement = {n: rng.uniform(-scale, scale, (d_model, d_k) if n.startswith("w") else (d_k,)) for n in names}
    A.multi_head_attention_heads_are_independent(
        impl, dtype, **args, head=data.draw(st.integers(0, h - 1)), replacement=replacement
    )


# --------------------------------------------------------------------------------------------
# the backward pass: gradients against the oracle's VJP


@pytest.mark.aiayn_equation("softmax", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_softmax_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.softmax_inputs(dtype, scope=S.scope(impl, "softmax")))
    args = S.defined_gradients(impl, args, "x", args["axis"])
    A.softmax_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(args["x"].shape)))


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_scaled_dot_product_attention_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_inputs(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    args = S.defined_gradients(impl, args, "mask")
    scale = float(np.max(np.abs(args["q"]), initial=1.0))
    for name, size in (("q", 0.5 * scale), ("k", 0.5 * scale), ("v", 20.0)):
        args[name] = data.draw(S.common_component(args[name], size))
    shape = (*np.broadcast_shapes(args["q"].shape[:-2], args["k"].shape[:-2]), args["q"].shape[-2], args["v"].shape[-1])
    A.scaled_dot_product_attention_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("multi_head_attention", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_multi_head_attention_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.mha_inputs(dtype, scope=S.scope(impl, "multi_head_attention")))
    args = S.defined_gradients(impl, args, "mask")
    shape = (*args["query"].shape[:-1], args["params"]["w_o"].shape[1])
    A.multi_head_attention_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD, needs=("masks:padding",))
@profile(0.25)
@given(data=st.data())
def test_attention_masked_keys_receive_no_gradient(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_inputs(dtype, mask=False, scope=S.scope(impl, "scaled_dot_product_attention")))
    keep = data.draw(S.keep_pattern(args["k"].shape[-2]))
    shape = (*args["q"].shape[:-1], args["v"].shape[-1])
    A.attention_masked_keys_receive_no_gradient(
        impl, dtype, q=args["q"], k=args["k"], v=args["v"], keep=keep, d_out=data.draw(S.cotangent(shape))
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD, needs=("masks:random",))
@profile(0.25)
@given(data=st.data())
def test_attention_key_gradients_sum_to_zero(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_inputs(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    args = S.defined_gradients(impl, args, "mask")
    shape = (*args["q"].shape[:-1], args["v"].shape[-1])
    A.attention_key_gradients_sum_to_zero(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD, needs=("masks:causal",))
@profile(0.25)
@given(data=st.data())
def test_causal_gradient_reaches_no_later_key(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.causal_perturbation(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    shape = (*args["q"].shape[:-1], args["v"].shape[-1])
    A.causal_gradient_reaches_no_later_key(
        impl, dtype, q=args["q"], k=args["k"], v=args["v"], row=args["upto"], d_out=data.draw(S.cotangent(shape))
    )


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD, needs=("batch:1",))
@profile(0.25)
@given(data=st.data())
def test_attention_gradients_stay_in_their_batch_element(impl: Any, dtype: str, data: st.DataObject) -> None:
    batch = (data.draw(st.integers(2, 3)),)
    args = data.draw(S.attention_inputs(dtype, batch=batch, scope=S.scope(impl, "scaled_dot_product_attention")))
    args = S.defined_gradients(impl, args, "mask")
    shape = (*args["q"].shape[:-1], args["v"].shape[-1])
    A.attention_gradients_stay_in_their_batch_element(
        impl, dtype, **args, index=data.draw(st.integers(0, batch[0] - 1)), d_out=data.draw(S.cotangent(shape))
    )


# --------------------------------------------------------------------------------------------
# lengths around kernels' tile sizes (strategies.TILE_LENGTHS: 15-17, 31-33, 63-65, 95-97, 127-129)


@pytest.mark.aiayn_equation("scaled_dot_product_attention")
@profile(0.25)
@given(data=st.data())
def test_scaled_dot_product_attention_across_tiles(impl: Any, dtype: str, data: st.DataObject) -> None:
    where = S.scope(impl, "scaled_dot_product_attention")
    A.scaled_dot_product_attention_across_tiles(impl, dtype, **data.draw(S.attention_across_tiles(dtype, scope=where)))


@pytest.mark.aiayn_equation("scaled_dot_product_attention", direction=BACKWARD)
@profile(0.125)
@given(data=st.data())
def test_scaled_dot_product_attention_gradients_across_tiles(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.attention_across_tiles(dtype, scope=S.scope(impl, "scaled_dot_product_attention")))
    args = S.defined_gradients(impl, args, "mask")
    shape = (*np.broadcast_shapes(args["q"].shape[:-2], args["k"].shape[:-2]), args["q"].shape[-2], args["v"].shape[-1])
    A.scaled_dot_product_attention_gradients_across_tiles(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("multi_head_attention")
@profile(0.25)
@given(data=st.data())
def test_multi_head_attention_across_tiles(impl: Any, dtype: str, data: st.DataObject) -> None:
    where = S.scope(impl, "multi_head_attention")
    A.multi_head_attention_across_tiles(impl, dtype, **data.draw(S.mha_across_tiles(dtype, scope=where)))
