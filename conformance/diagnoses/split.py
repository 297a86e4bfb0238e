"""Diagnoses of split keys (§3.2.1, Eq. (1) over blocks of keys merged by their log-sum-exp): the known bugs of a
block's log-sum-exp and of a merge, each computed from the states the implementation was given, so that a failing
check names the one its output matches.

A bug is named where its output agrees with the implementation's within the check's own budget and does not agree
with the oracle's (on inputs where the bug changes nothing there is nothing to name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PAGE_TAIL_TIMES_ZERO", "SPLIT_CATALOGUE", "SplitDeparture", "SplitDiagnosis", "UNNORMALISED_MERGE"]

#: The merge that forgets to renormalise: the blocks' outputs weighted by exp(L_p - max L) and summed, never divided
#: by the weights' sum (right only where one block holds every visible key).
UNNORMALISED_MERGE = (
    "the merge without renormalising (the blocks' outputs weighted by exp(L_p - max L), not divided by their sum)"
)


#: A paged kernel that gives the slots past a sentence's length weight 0 but still multiplies their values by it:
#: 0 x NaN is NaN, so whatever the pool held there reaches the result (vLLM's paged-attention kernel zeroes those
#: values explicitly for this reason: vLLM issue #641).
PAGE_TAIL_TIMES_ZERO = (
    "the values past the sentence's length multiplied by their zero weights (a NaN left in the page reaches the result)"
)


@dataclass(frozen=True)
class SplitDeparture:
    """One known bug: its name, where it was seen, which result it changes ("out" or "lse") of which method
    ("block", "merge" or "paged"), and ``compute(a)``: that result with the bug, from the arguments ``a`` the oracle
    got."""

    name: str
    note: str
    method: str
    result: str
    compute: Callable[[Mapping[str, Any]], np.ndarray]


def _weights(lses: np.ndarray, base: float = np.e) -> tuple[np.ndarray, np.ndarray]:
    """(exp(L_p - max L) in ``base``, per block (P, ..., n_q), and whether any block is alive (..., n_q))."""
    m = np.max(lses, axis=0)
    alive = m > -np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        return np.power(base, lses - np.where(alive, m, 0.0)), alive


def _unnormalised(a: Mapping[str, Any]) -> np.ndarray:
    w, _ = _weights(a["lses"])
    return np.sum(w[..., None] * a["outs"], axis=0)


def _base_two(a: Mapping[str, Any]) -> np.ndarray:
    w, alive = _weights(a["lses"], 2.0)
    total = np.sum(w, axis=0)
    return np.sum(w[..., None] * a["outs"], axis=0) / np.where(alive, total, 1.0)[..., None]


def _max_only(a: Mapping[str, Any]) -> np.ndarray:
    return np.max(a["lses"], axis=0)


def _empty_as_plus_infinity(a: Mapping[str, Any]) -> np.ndarray:
    lse = np.asarray(a["lse"], dtype=np.float64)
    return np.where(lse == -np.inf, np.inf, lse)


def _paged(a: Mapping[str, Any], table: np.ndarray, reach: np.ndarray, zero_tail: bool) -> np.ndarray:
    """Eq. (1) of each sentence over the first ``reach[b]`` slots of the pages ``table[b]`` lists, read as they are
    (poison included), the slots past ``a["lengths"]`` given weight 0 but their values multiplied by it unless
    ``zero_tail``; float64, for a variant's values only."""
    q, k_pages, v_pages, lengths = (np.asarray(a[n]) for n in ("q", "k_pages", "v_pages", "lengths"))
    b, m = table.shape
    page = k_pages.shape[1]
    k = k_pages[table].reshape(b, m * page, -1)
    v = v_pages[table].reshape(b, m * page, -1)
    slots = np.arange(m * page)[None, :]
    scored = slots < np.asarray(reach)[:, None]  # (B, M page): the slots the bug reads
    s = np.einsum("bqd,bkd->bqk", q, np.where(scored[..., None], k, 0.0)) / np.sqrt(q.shape[-1])
    s = np.where(scored[:, None, :], s, -np.inf)
    mx = np.max(s, axis=-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    w = w / np.sum(w, axis=-1, keepdims=True)
    if zero_tail:
        v = np.where((slots < lengths[:, None])[..., None], v, 0.0)
    return np.einsum("bqk,bkd->bqd", w, v)


def _tail_times_zero(a: Mapping[str, Any]) -> np.ndarray:
    table = np.asarray(a["block_table"])
    return _paged(a, table, np.asarray(a["lengths"]), zero_tail=False)


def _whole_last_page(a: Mapping[str, Any]) -> np.ndarray:
    table, page = np.asarray(a["block_table"]), np.shape(a["k_pages"])[1]
    return _paged(a, table, -(-np.asarray(a["lengths"]) // page) * page, zero_tail=False)


def _physical_order(a: Mapping[str, Any]) -> np.ndarray:
    b, m = np.shape(a["block_table"])
    table = np.minimum(np.arange(b * m).reshape(b, m), np.shape(a["k_pages"])[0] - 1)
    return _paged(a, table, np.asarray(a["lengths"]), zero_tail=True)


#: Every bug of split keys the suite can name; the split mutant (``studies/mutants.py``) carries one of these names.
SPLIT_CATALOGUE: tuple[SplitDeparture, ...] = (
    SplitDeparture(
        UNNORMALISED_MERGE, "a merge of partial states that drops the final division", "merge", "out", _unnormalised
    ),
    SplitDeparture(
        "the merge's weights in base 2 (2^(L_p - max L) of natural-log log-sum-exps)",
        "exp2 kernels (FlashAttention's) fed log-sum-exps in natural log without the log2(e) factor",
        "merge",
        "out",
        _base_two,
    ),
    SplitDeparture(
        "the merged log-sum-exp as the largest block's alone (the log of the weights' sum left out)",
        "a merge that rescales the outputs but keeps max L as the new log-sum-exp",
        "merge",
        "lse",
        _max_only,
    ),
    SplitDeparture(
        "the log-sum-exp of a block with no visible key as +inf (FlashAttention's convention), not -inf",
        "FlashAttention 2 writes +inf for a fully masked row, so that exp(s - lse) is 0 in its backward",
        "block",
        "lse",
        _empty_as_plus_infinity,
    ),
    SplitDeparture(
        PAGE_TAIL_TIMES_ZERO,
        "0 x NaN: a kernel that masks the scores of unused slots but reads their values",
        "paged",
        "out",
        _tail_times_zero,
    ),
    SplitDeparture(
        "the sentence's last page read whole (the slots past its length attended)",
        "a paged kernel that takes the length in pages, not in positions",
        "paged",
        "out",
        _whole_last_page,
    ),
    SplitDeparture(
        "the block table ignored (the pages read in their physical order)",
        "a paged cache read as if contiguous",
        "paged",
        "out",
        _physical_order,
    ),
)


@dataclass(frozen=True)
class SplitDiagnosis:
    """What ``comparison.matches`` needs to name the bug a failing split-keys check matches: which ``method`` and
    ``result`` was compared, the oracle's arguments ``a`` (with the oracle's ``lse`` for a block's bugs), the
    expected values and the check's budget at an arithmetic (``budget_at(dtype)``)."""

    method: str
    result: str
    a: Mapping[str, Any]
    expected: np.ndarray
    budget_at: Callable[[str], np.ndarray]

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        got = np.asarray(got, dtype=np.float64)
        budget = self.budget_at(dtype)
        for departure in SPLIT_CATALOGUE:
            if (departure.method, departure.result) != (self.method, self.result):
                continue
            with np.errstate(all="ignore"):
                variant = np.asarray(departure.compute(self.a), dtype=np.float64)
            if _agrees(got, variant, budget) and not _agrees(variant, self.expected, budget):
                return [departure.name]  # the first that computes this output: the catalogue's are told apart by it
        return []

    def agreeing(self, names: list[str], got: np.ndarray, dtype: str) -> list[str]:
        return [n for n in self.explain(got, dtype) if n in names]


def _agrees(got: np.ndarray, variant: np.ndarray, budget: np.ndarray) -> bool:
    """Elementwise within ``budget``, equal infinities and NaN against NaN agreeing (a poison that reached both)."""
    if got.shape != variant.shape:
        return False
    with np.errstate(invalid="ignore"):
        close = (got == variant) | (np.isnan(got) & np.isnan(variant)) | (np.abs(got - variant) <= budget)
    return bool(np.all(close))
