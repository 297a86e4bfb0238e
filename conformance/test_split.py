"""Split keys (§3.2.1): Eq. (1) over blocks of keys and its log-sum-exp, the merge of blocks' states, and the
identity that merging the blocks of any partition gives the whole (``checks/split.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import split as P
from aiayn.conformance.directions import SPLIT
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile

_EQ = "scaled_dot_product_attention"


@pytest.mark.aiayn_equation(_EQ, direction=SPLIT)
@profile(0.5)
@given(data=st.data())
def test_attention_with_lse(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.provided(impl)
    args = data.draw(S.split_inputs(dtype, scope=S.scope(impl, _EQ)))
    edges = args.pop("edges")
    a, b = edges[data.draw(st.integers(0, len(edges) - 2))], edges[-1]  # one block, possibly empty
    block = {**args, "k": args["k"][..., a:b, :], "v": args["v"][..., a:b, :]}
    if args["mask"] is not None:
        block["mask"] = args["mask"][..., a:b]
    P.attention_with_lse(impl, dtype, **block)


@pytest.mark.aiayn_equation(_EQ, direction=SPLIT)
@profile(0.5)
@given(data=st.data())
def test_merge_attention_states(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.provided(impl)
    P.merge_attention_states(impl, dtype, **data.draw(S.states_inputs(dtype, scope=S.scope(impl, _EQ))))


@pytest.mark.aiayn_equation(_EQ, direction=SPLIT)
@profile(0.5)
@given(data=st.data())
def test_attention_over_split_keys_equals_the_whole(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.provided(impl)
    P.attention_over_split_keys_equals_the_whole(
        impl, dtype, **data.draw(S.split_inputs(dtype, scope=S.scope(impl, _EQ)))
    )


@pytest.mark.aiayn_equation(_EQ, direction=SPLIT)
@profile(0.5)
@given(data=st.data())
def test_paged_attention(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.provided(impl, P.PAGED)
    P.paged_attention(impl, dtype, **data.draw(S.paged_inputs(dtype, scope=S.scope(impl, _EQ))))
