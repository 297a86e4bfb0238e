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

__all__ = ["SPLIT_CATALOGUE", "SplitDeparture", "SplitDiagnosis", "UNNORMALISED_MERGE"]

#: The merge that forgets to renormalise: the blocks' outputs weighted by exp(L_p - max L) and summed, never divided
#: by the weights' sum (right only where one block holds every visible key).
UNNORMALISED_MERGE = (
    "the merge without renormalising (the blocks' outputs weighted by exp(L_p - max L), not divided by their sum)"
)


@dataclass(frozen=True)
class SplitDeparture:
    """One known bug: its name, where it was seen, which result it changes ("out" or "lse") of which method
    ("block" or "merge"), and ``compute(a)``: that result with the bug, from the arguments ``a`` the oracle got."""

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
    """Elementwise within ``budget``, equal infinities agreeing."""
    if got.shape != variant.shape:
        return False
    with np.errstate(invalid="ignore"):
        close = (got == variant) | (np.abs(got - variant) <= budget)
    return bool(np.all(close))
