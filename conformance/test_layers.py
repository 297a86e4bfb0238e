"""§3.1 LayerNorm and §3.3 the position-wise feed-forward network (Eq. (2))."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.conformance.checks import layers as L
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


@pytest.mark.aiayn_equation("layer_norm")
@profile()
@given(data=st.data())
def test_layer_norm(impl: Any, dtype: str, data: st.DataObject) -> None:
    L.layer_norm(impl, dtype, **data.draw(S.layer_norm_inputs(dtype, scope=S.scope(impl, "layer_norm"))))


@pytest.mark.aiayn_equation("layer_norm", needs=("batch:1",))
@profile(0.5)
@given(data=st.data())
def test_layer_norm_unchanged_by_shifting_its_input(impl: Any, dtype: str, data: st.DataObject) -> None:
    d = data.draw(st.integers(2, 10))
    x, shift = data.draw(S.exact_shift(dtype, (data.draw(st.integers(1, 3)), d), pin_rows=True))
    gain = 1.0 + data.draw(hnp.arrays(np.float64, (d,), elements=st.floats(-0.5, 0.5)))
    scope = S.scope(impl, "layer_norm")
    bias = (
        np.zeros(d)
        if "layer_norm" in scope.no_bias
        else data.draw(hnp.arrays(np.float64, (d,), elements=st.floats(-1.0, 1.0)))
    )
    fixed = scope.layer_norm_eps
    eps = fixed if fixed is not None else data.draw(st.sampled_from([1e-6, 1e-3, 0.25]))
    L.layer_norm_unchanged_by_shifting_its_input(impl, dtype, x=x, gain=gain, bias=bias, eps=eps, shift=shift)


@pytest.mark.aiayn_equation("feed_forward")
@profile()
@given(data=st.data())
def test_feed_forward(impl: Any, dtype: str, data: st.DataObject) -> None:
    L.feed_forward(impl, dtype, **data.draw(S.ffn_inputs(dtype, scope=S.scope(impl, "feed_forward"))))


# --------------------------------------------------------------------------------------------
# the backward pass: gradients against the oracle's VJP


@pytest.mark.aiayn_equation("layer_norm", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_layer_norm_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.layer_norm_inputs(dtype, scope=S.scope(impl, "layer_norm"), min_d=2))
    L.layer_norm_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(args["x"].shape)))


@pytest.mark.aiayn_equation("feed_forward", direction=BACKWARD)
@profile(0.5)
@given(data=st.data())
def test_feed_forward_gradients(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.ffn_inputs(dtype, scope=S.scope(impl, "feed_forward")))
    shape = (*args["x"].shape[:-1], args["w2"].shape[1])
    L.feed_forward_gradients(impl, dtype, **args, d_out=data.draw(S.cotangent(shape)))


@pytest.mark.aiayn_equation("layer_norm", direction=BACKWARD)
@profile(0.25)
@given(data=st.data())
def test_layer_norm_input_gradient_sums_to_zero(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = data.draw(S.layer_norm_inputs(dtype, scope=S.scope(impl, "layer_norm"), min_d=2))
    L.layer_norm_input_gradient_sums_to_zero(impl, dtype, **args, d_out=data.draw(S.cotangent(args["x"].shape)))


@pytest.mark.aiayn_equation("layer_norm", direction=BACKWARD, needs=("batchdims:1",))
@profile(0.25)
@given(data=st.data())
def test_layer_norm_one_element_rows_have_no_gradient(impl: Any, dtype: str, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 4))
    x = data.draw(S.cotangent((rows, 1)))  # values of any sign and size
    scope = S.scope(impl, "layer_norm")
    eps = scope.layer_norm_eps if scope.layer_norm_eps is not None else data.draw(st.sampled_from([1e-6, 1e-5, 0.25]))
    gain, bias = 1.0 + data.draw(S.cotangent((1,))) / 16, data.draw(S.cotangent((1,)))
    L.layer_norm_one_element_rows_have_no_gradient(
        impl, dtype, x=x, gain=gain, bias=bias, eps=eps, d_out=data.draw(S.cotangent((rows, 1)))
    )
