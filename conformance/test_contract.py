"""The plug-in contract (implementations/protocol.py): declarations and the from/to NumPy boundary.

Every other check runs the oracle on what ``to_numpy(from_numpy(x, dtype))`` returns, so this
boundary is checked first: correct rounding into the dtype (ties to even, subnormals, overflow),
float64 copies back, int64 ids and bool masks unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.conformance.checks import contract
from aiayn.conformance.inputs.profiles import profile
from aiayn.conformance.numerics import precision
from aiayn.conformance.run.plugin import LoadFailure


@pytest.mark.aiayn_equation("contract", dtypes="first", load_failures=True)
def test_declarations_follow_the_contract(impl: Any, dtype: str) -> None:
    if isinstance(impl, LoadFailure):
        pytest.fail(f"could not load implementation {impl.spec!r}: {impl.message}", pytrace=False)
    contract.declarations_follow_the_contract(impl, dtype)


def _rounding_cases(dtype: str) -> np.ndarray:
    """Values that exercise rounding in ``dtype``: halfway cases (both parities), subnormals, overflow."""
    prec = precision(dtype)
    if prec.p == 53:
        return np.array([0.0, -0.0, 1.0, 5e-324, -1.7976931348623157e308])
    one_ulp = 2.0 ** (1 - prec.p)
    return np.array(
        [
            1 + one_ulp / 2,  # tie, rounds down to the even 1
            1 + 3 * one_ulp / 2,  # tie, rounds up to the even 1 + 2 ulp
            # just above the tie, by one float64 ulp: up; a cast through float32 (p = 24) first lands on the tie
            # for every narrower dtype, then rounds it to the even neighbour below: "rounds twice"
            np.nextafter(1 + one_ulp / 2, 2.0),
            -(1 + one_ulp / 4),
            prec.eta / 2,  # tie between 0 and the smallest subnormal: 0
            3 * prec.eta / 2,  # tie: to 2 eta (even)
            prec.max,
            prec.max * (1 + 2.0 ** -(prec.p + 1)),  # the tie above max: overflows to inf (even)
            -prec.max * 1.5,  # beyond: -inf
            1 / 3,
            np.pi * 1e3,
        ]
    )


@pytest.mark.aiayn_equation("contract")
def test_from_numpy_rounds_to_nearest_even(impl: Any, dtype: str) -> None:
    contract.from_numpy_rounds_to_nearest_even(impl, dtype, x=_rounding_cases(dtype))


@pytest.mark.aiayn_equation("contract")
@profile()
@given(x=hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(-1e5, 1e5, allow_nan=False)))
def test_from_numpy_rounds_random_values(impl: Any, dtype: str, x: np.ndarray) -> None:
    contract.from_numpy_rounds_random_values(impl, dtype, x=x)


@pytest.mark.aiayn_equation("contract")
def test_to_numpy_returns_float64_copies_and_round_trips_ids_and_masks(impl: Any, dtype: str) -> None:
    contract.to_numpy_returns_float64_copies_and_round_trips_ids_and_masks(
        impl, dtype, x=np.linspace(-2.0, 3.0, 6).reshape(2, 3)
    )


@pytest.mark.aiayn_equation("contract")
def test_from_numpy_copies_its_input(impl: Any, dtype: str) -> None:
    contract.from_numpy_copies_its_input(impl, dtype, x=np.linspace(-2.0, 3.0, 6).reshape(2, 3))
