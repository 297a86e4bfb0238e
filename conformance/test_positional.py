"""§3.5: sinusoidal positional encodings: agreement, PE(pos + k) a linear function of PE(pos) and §3.5's own M_k, and
|PE| <= 1."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiayn.conformance.checks import positional as P
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.inputs.profiles import profile


@pytest.mark.aiayn_equation("positional_encoding")
@profile()
@given(data=st.data())
def test_positional_encoding(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.positional_encoding(impl, dtype, **data.draw(S.pe_inputs(dtype, scope=S.scope(impl, "positional_encoding"))))


@pytest.mark.aiayn_equation("positional_encoding")
@profile(0.5)
@given(data=st.data(), offset=st.integers(1, 20))
def test_positional_encoding_shift_is_a_linear_map(impl: Any, dtype: str, data: st.DataObject, offset: int) -> None:
    P.positional_encoding_shift_is_a_linear_map(
        impl,
        dtype,
        **data.draw(S.pe_inputs(dtype, min_length=1, scope=S.scope(impl, "positional_encoding"))),
        offset=offset,
    )


@pytest.mark.aiayn_equation("positional_encoding")
@profile(0.25)
@given(data=st.data())
def test_positional_encoding_is_bounded_by_one(impl: Any, dtype: str, data: st.DataObject) -> None:
    P.positional_encoding_is_bounded_by_one(
        impl, dtype, **data.draw(S.pe_inputs(dtype, scope=S.scope(impl, "positional_encoding")))
    )


@pytest.mark.aiayn_equation("positional_encoding")
@profile(0.25)
@given(data=st.data(), offset=st.integers(1, 20))
def test_positional_encoding_pairs_rotate_by_k(impl: Any, dtype: str, data: st.DataObject, offset: int) -> None:
    P.positional_encoding_pairs_rotate_by_k(
        impl,
        dtype,
        **data.draw(S.pe_inputs(dtype, min_length=1, scope=S.scope(impl, "positional_encoding"))),
        offset=offset,
    )
