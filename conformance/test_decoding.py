"""Decoding (§3.2.3, §6.1) against ``aiayn.reference.decoding``: the cached decoder fed in chunks, a cache reordered
by beam indices, and beam search with GNMT's length penalty (few examples each: every one runs the whole model; an
implementation without the methods is skipped as "not provided" before anything is drawn)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import decoding as C
from aiayn.conformance.directions import DECODE
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.5)
@given(data=st.data())
def test_cached_decoding_equals_the_full_forward(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "steps")
    C.cached_decoding_equals_the_full_forward(
        impl, dtype, **data.draw(S.decode_inputs(dtype, scope=S.scope(impl, "transformer_forward")))
    )


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.125)
@given(data=st.data())
def test_cached_decoding_across_tiles(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "steps")
    where = S.scope(impl, "transformer_forward")
    C.cached_decoding_across_tiles(impl, dtype, **data.draw(S.decode_inputs(dtype, scope=where, across_tiles=True)))


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.25)
@given(data=st.data())
def test_cached_decoding_ignores_what_padding_holds(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "steps")
    args = data.draw(S.decode_inputs(dtype, scope=S.scope(impl, "transformer_forward"), padded=True))
    C.cached_decoding_ignores_what_padding_holds(impl, dtype, **args, filler_seed=data.draw(st.integers(0, 2**32 - 1)))


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.25)
@given(data=st.data())
def test_reordered_cache_equals_the_reordered_prefixes(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "steps")
    C.reordered_cache_equals_the_reordered_prefixes(
        impl, dtype, **data.draw(S.decode_inputs(dtype, kind="reorder", scope=S.scope(impl, "transformer_forward")))
    )


@pytest.mark.aiayn_equation("transformer_forward", direction=DECODE)
@profile(0.25)
@given(data=st.data())
def test_beam_search_finds_the_oracles_hypothesis(impl: Any, dtype: str, data: st.DataObject) -> None:
    C.provided(impl, "search")
    C.beam_search_finds_the_oracles_hypothesis(
        impl, dtype, **data.draw(S.decode_inputs(dtype, kind="beam", scope=S.scope(impl, "transformer_forward")))
    )
