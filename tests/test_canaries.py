"""Canaries: what a hidden (padded) position holds must reach nothing. The decoding canary
(``checks/decoding.cached_decoding_ignores_what_padding_holds``) passes the built-in and fails a decoder that masks by
adding a finite penalty (the poison outweighs it), naming the property it breaks."""

from __future__ import annotations

import numpy as np
import pytest
from _checks import run_check

from aiayn.conformance.checks.decoding import NO_HIDDEN_SOURCE, canary
from aiayn.conformance.inputs.fixed import cases
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.conformance.studies.mutants import AdditiveMask
from aiayn.implementations.numpy_impl import NumpyImplementation

CASE = next(
    c for c in cases("transformer_forward", "decode") if c.check == "cached_decoding_ignores_what_padding_holds"
)


class AdditivePenaltyDecoder(NumpyImplementation):
    """Every attention masks by adding -1e4 to the hidden scores (the forward mutant's bug) while decoding."""

    scaled_dot_product_attention = AdditiveMask.scaled_dot_product_attention


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_built_in_decodes_the_same_whatever_the_padding_holds(dtype: str) -> None:
    stats = run_check(NumpyImplementation(), CASE.check, dtype, **CASE.args)
    assert stats.checked > 0 and not stats.unchecked


def test_a_finite_mask_penalty_lets_the_canary_through_and_is_named() -> None:
    with pytest.raises(ConformanceFailure, match="breaks what the paper states: 'a hidden \\(padded\\) source"):
        run_check(AdditivePenaltyDecoder(), CASE.check, "float32", **CASE.args)


def test_without_a_hidden_position_the_draw_counts_as_not_checked() -> None:
    stats = run_check(NumpyImplementation(), CASE.check, "float64", **{**CASE.args, "src_lengths": None})
    assert stats.unchecked == {NO_HIDDEN_SOURCE: 1} and stats.checked == 0


def test_the_poison_cannot_overflow_a_projection_and_is_huge_where_the_range_allows() -> None:
    """Far above any penalty a finite mask adds in float32 and float64; in float16, whose range ends at 65504, the
    safe poison of a 16-wide model is below 1 (the canary there is only other values)."""
    params = CASE.args["params"]
    d = params["embedding"].shape[1]
    w = max(float(np.max(np.abs(params["embedding"]))), 1.0)
    for dtype, least in (("float64", 1e290), ("float32", 1e25), ("float16", 0.0)):
        x = canary(params, dtype)
        assert least < x and x * d * w < np.finfo(dtype).max, (dtype, x)
