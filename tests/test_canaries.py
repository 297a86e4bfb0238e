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


def _tiles() -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(7)
    return {
        "q": rng.uniform(-1, 1, (33, 4)),
        "k": rng.uniform(-1, 1, (40, 4)),
        "v": rng.normal(size=(40, 3)),
        "mask": None,
    }


OUT_CHECK = "scaled_dot_product_attention_writes_every_element_of_out"


class ReturnsACopy(NumpyImplementation):
    """Writes its result into a new array and returns it, leaving the caller's out as it was."""

    def __init__(self) -> None:
        super().__init__(policies={"writes_out": ("scaled_dot_product_attention",)})

    def scaled_dot_product_attention(self, q, k, v, mask=None, out=None):
        return super().scaled_dot_product_attention(q, k, v, mask)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_blocked_built_in_writes_every_element_of_out(dtype: str) -> None:
    from aiayn.implementations.numpy_impl import blocked_numpy_implementation

    stats = run_check(blocked_numpy_implementation(), OUT_CHECK, dtype, **_tiles())
    assert stats.checked == 2 * 33 * 3  # each canary's call, every element


def test_a_kernel_that_skips_its_last_partial_tile_leaves_the_canary() -> None:
    from aiayn.conformance.studies.mutants import SkipsLastPartialTile

    with pytest.raises(ConformanceFailure, match="with out= filled with NaN, the result .*NaN at index \\(32, 0\\)"):
        run_check(SkipsLastPartialTile(), OUT_CHECK, "float64", **_tiles())


def test_a_result_that_is_not_the_buffer_fails() -> None:
    with pytest.raises(ConformanceFailure, match="returned a result that is not what it wrote into out"):
        run_check(ReturnsACopy(), OUT_CHECK, "float64", **_tiles())


def test_an_undeclared_out_is_not_provided_and_a_bad_declaration_is_named() -> None:
    from aiayn.implementations.protocol import policy_problem

    with pytest.raises(pytest.skip.Exception, match="declares no out= for scaled_dot_product_attention"):
        run_check(NumpyImplementation(), OUT_CHECK, "float64", **_tiles())
    assert "expected a tuple of equation names" in policy_problem("writes_out", ("attention",))
    assert policy_problem("writes_out", ("layer_norm",)) is None
