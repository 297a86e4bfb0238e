"""Canaries in output buffers: where an implementation declares ``policies["writes_out"]``, every listed equation
called with ``out=`` filled with NaN, then with the largest finite value, writes every element
(``checks/canaries.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import canaries as C
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


def _draws(impl: Any, dtype: str, data: st.DataObject, equation: str) -> dict[str, Any]:
    C.declares_out(impl, equation)
    return data.draw(record(equation).strategy(dtype, scope=S.scope(impl, equation)))


@pytest.mark.aiayn_equation("softmax")
@profile(0.25)
@given(data=st.data())
def test_softmax_writes_every_element_of_out(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.softmax_writes_every_element_of_out(impl, dtype, **_draws(impl, dtype, data, "softmax"))


@pytest.mark.aiayn_equation("scaled_dot_product_attention")
@profile(0.25)
@given(data=st.data())
def test_scaled_dot_product_attention_writes_every_element_of_out(impl: Any, dtype: str, data: st.DataObject) -> None:
    if data.draw(st.booleans()):  # lengths across tiles: a kernel's last partial tile of its output
        C.declares_out(impl, "scaled_dot_product_attention")
        where = S.scope(impl, "scaled_dot_product_attention")
        args = data.draw(S.attention_across_tiles(dtype, scope=where))
    else:
        args = _draws(impl, dtype, data, "scaled_dot_product_attention")
    C.scaled_dot_product_attention_writes_every_element_of_out(impl, dtype, **args)


@pytest.mark.aiayn_equation("multi_head_attention")
@profile(0.25)
@given(data=st.data())
def test_multi_head_attention_writes_every_element_of_out(impl: Any, dtype: str, data: st.DataObject) -> None:
    args = _draws(impl, dtype, data, "multi_head_attention")
    C.multi_head_attention_writes_every_element_of_out(impl, dtype, **args)


@pytest.mark.aiayn_equation("layer_norm")
@profile(0.25)
@given(data=st.data())
def test_layer_norm_writes_every_element_of_out(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.layer_norm_writes_every_element_of_out(impl, dtype, **_draws(impl, dtype, data, "layer_norm"))


@pytest.mark.aiayn_equation("feed_forward")
@profile(0.25)
@given(data=st.data())
def test_feed_forward_writes_every_element_of_out(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.feed_forward_writes_every_element_of_out(impl, dtype, **_draws(impl, dtype, data, "feed_forward"))
