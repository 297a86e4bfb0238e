"""The split-keys checks (``conformance/checks/split.py``) have teeth: a block's log-sum-exp, a merge and the
identity each fail a planted bug and name it (``diagnoses/split.py``), and pass the built-in; an implementation
without the methods is "not provided"; a result of the wrong type or shape fails before its values are read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _checks import run_check

from aiayn.conformance.diagnoses.split import PAGE_TAIL_TIMES_ZERO, SPLIT_CATALOGUE, UNNORMALISED_MERGE
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.implementations.numpy_impl import NumpyImplementation

RNG = np.random.default_rng(20171206)
NAMES = {d.name for d in SPLIT_CATALOGUE}


def _name(fragment: str) -> str:
    return next(n for n in NAMES if fragment in n)


class EmptyBlockPlusInfinity(NumpyImplementation):
    """FlashAttention's convention: +inf as the log-sum-exp of a query the block hides."""

    def attention_with_lse(self, q, k, v, mask=None):
        out, lse = super().attention_with_lse(q, k, v, mask)
        return out, np.where(lse == -np.inf, np.inf, lse).astype(lse.dtype)


class BaseTwoWeights(NumpyImplementation):
    """The merge's weights as 2^(L_p - max L): natural-log log-sum-exps fed to an exp2 kernel."""

    def merge_attention_states(self, outs, lses):
        _, lse = super().merge_attention_states(outs, lses)
        w = np.exp2(lses - np.max(lses, axis=0))
        return (np.sum(w[..., None] * outs, axis=0) / np.sum(w, axis=0)[..., None]).astype(outs.dtype), lse


class MaxOnlyLse(NumpyImplementation):
    """The merged log-sum-exp as the largest block's."""

    def merge_attention_states(self, outs, lses):
        out, _ = super().merge_attention_states(outs, lses)
        return out, np.max(lses, axis=0)


class Unnormalised(NumpyImplementation):
    """The merge without its final division."""

    def merge_attention_states(self, outs, lses):
        _, lse = super().merge_attention_states(outs, lses)
        w = np.exp(lses - np.max(lses, axis=0))
        return np.sum(w[..., None] * outs, axis=0).astype(outs.dtype), lse


class PagedRead(NumpyImplementation):
    """A paged kernel with one of three bugs: the tail's values multiplied by 0, the last page read whole, the table
    ignored."""

    def __init__(self, bug: str) -> None:
        super().__init__()
        self.bug = bug

    def paged_attention(self, q, k_pages, v_pages, block_table, lengths):
        b, m = block_table.shape
        page = k_pages.shape[1]
        span = m * page
        if self.bug == "physical":
            block_table = np.arange(b * m).reshape(b, m)
        reach = -(-lengths // page) * page if self.bug == "whole-page" else lengths
        visible = np.arange(span)[None, :] < reach[:, None]
        k = np.where(visible[..., None], k_pages[block_table].reshape(b, span, -1), 0.0)
        v = v_pages[block_table].reshape(b, span, -1)
        if self.bug == "physical":
            v = np.where(visible[..., None], v, 0.0)
        s = np.where(visible[:, None, :], q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        with np.errstate(invalid="ignore"):
            return (w / w.sum(axis=-1, keepdims=True)) @ v


def _paged(poison: float) -> dict[str, Any]:
    """Two sentences of 3 and 5 positions in pages of 2, their pages swapped in the pool, one page unowned."""
    table = np.array([[3, 1, 4], [0, 2, 5]])  # pool of 7 pages: 6 unowned
    lengths = np.array([3, 5])
    k_pages, v_pages = np.full((7, 2, 4), poison), np.full((7, 2, 3), poison)
    for s, n in enumerate(lengths):
        for t in range(n):
            k_pages[table[s, t // 2], t % 2] = RNG.uniform(-1, 1, 4)
            v_pages[table[s, t // 2], t % 2] = RNG.standard_normal(3)
    q = RNG.uniform(-1, 1, (2, 2, 4))
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "block_table": table, "lengths": lengths}


@pytest.mark.parametrize("poison", [np.nan, 1e4])
def test_the_built_in_reads_a_paged_cache_as_the_contiguous_one(poison: float) -> None:
    stats = run_check(NumpyImplementation(), "paged_attention", "float64", **_paged(poison))
    assert stats.checked == 2 * 2 * 3


@pytest.mark.parametrize(
    "bug, poison, named",
    [
        ("tail", np.nan, PAGE_TAIL_TIMES_ZERO),
        ("whole-page", 1e4, _name("last page read whole")),
        ("physical", 1e4, _name("block table ignored")),
    ],
)
def test_a_paged_bug_fails_and_is_named(bug: str, poison: float, named: str) -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_check(PagedRead(bug), "paged_attention", "float64", **_paged(poison))
    assert f"matches '{named}'" in str(info.value), str(info.value)


class ReturnsOneArray(NumpyImplementation):
    def merge_attention_states(self, outs, lses):
        return super().merge_attention_states(outs, lses)[0]


def _block() -> dict[str, Any]:
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False  # a query the block hides
    return {
        "q": RNG.standard_normal((3, 4)),
        "k": RNG.standard_normal((5, 4)),
        "v": RNG.standard_normal((5, 2)),
        "mask": mask,
    }


def _states() -> dict[str, Any]:
    return {"outs": RNG.standard_normal((3, 2, 4)), "lses": np.array([[0.5, 2.0], [1.5, -np.inf], [-1.0, 0.25]])}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_built_in_passes_every_split_check(dtype: str) -> None:
    impl = NumpyImplementation()
    for check, args in (
        ("attention_with_lse", _block()),
        ("merge_attention_states", _states()),
        ("attention_over_split_keys_equals_the_whole", {**_block(), "edges": (0, 2, 2, 5)}),
    ):
        stats = run_check(impl, check, dtype, **args)
        assert stats.checked > 0, f"{check} compared nothing"


@pytest.mark.parametrize(
    "impl, check, args, named",
    [
        (EmptyBlockPlusInfinity(), "attention_with_lse", _block(), _name("+inf")),
        (BaseTwoWeights(), "merge_attention_states", _states(), _name("base 2")),
        (MaxOnlyLse(), "merge_attention_states", _states(), _name("largest block")),
        (Unnormalised(), "merge_attention_states", _states(), UNNORMALISED_MERGE),
    ],
    ids=["lse-plus-inf", "base-two", "max-only-lse", "unnormalised"],
)
def test_a_planted_bug_fails_and_is_named(impl: Any, check: str, args: dict[str, Any], named: str) -> None:
    with pytest.raises(ConformanceFailure) as info:
        run_check(impl, check, "float64", **args)
    assert f"matches '{named}'" in str(info.value), str(info.value)


@pytest.mark.parametrize("impl", [Unnormalised(), MaxOnlyLse(), EmptyBlockPlusInfinity()], ids=type)
def test_the_identity_fails_each_planted_bug(impl: Any) -> None:
    broken = "breaks what the paper states: 'Eq. \\(1\\) over all the keys is the merge"
    with pytest.raises(ConformanceFailure, match=broken):
        run_check(impl, "attention_over_split_keys_equals_the_whole", "float64", **_block(), edges=(0, 2, 5))


def test_a_result_that_is_not_a_pair_fails_before_its_values() -> None:
    with pytest.raises(ConformanceFailure, match="returned ndarray, expected a pair \\(out, lse\\)"):
        run_check(ReturnsOneArray(), "merge_attention_states", "float64", **_states())


def test_an_implementation_without_the_methods_is_not_provided() -> None:
    from aiayn.conformance.checks.split import provided

    class Plain:
        name = "plain"

    with pytest.raises(pytest.skip.Exception, match="not provided: plain has no attention_with_lse"):
        provided(Plain())
