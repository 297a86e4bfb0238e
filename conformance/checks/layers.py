"""Checks for §3.1 (LayerNorm) and §3.3 (the position-wise feed-forward network, Eq. (2))."""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.conformance import budgets as B
from aiayn.conformance.checks._common import prepare
from aiayn.conformance.harness import Case, Diagnosis, check, compare, total_budget
from aiayn.conformance.numerics import is_representable


def _layer_norm(
    case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.layers import layer_norm as oracle

    nat, seen = prepare(case, x=x, gain=gain, bias=bias)
    got = case.run("layer_norm", [nat["x"], nat["gain"], nat["bias"], eps])
    expected = oracle(seen["x"], seen["gain"], seen["bias"], eps)
    budget = total_budget(
        lambda p: B.layer_norm(seen["x"], seen["gain"], seen["bias"], eps, p), case.arithmetic, expected
    )
    case.diagnosis = Diagnosis(
        "layer_norm",
        {"x": seen["x"], "gain": seen["gain"], "bias": seen["bias"], "eps": eps},
        lambda dt: total_budget(lambda p: B.layer_norm(seen["x"], seen["gain"], seen["bias"], eps, p), dt, expected),
    )
    return got, expected, budget


@check("layer_norm", "layer_norm")
def layer_norm_agreement(case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> None:
    """(x - mean) / sqrt(var + eps) * gain + bias (biased variance, eps inside the sqrt) agrees with the oracle."""
    got, expected, budget = _layer_norm(case, x, gain, bias, eps)
    compare(
        case,
        got,
        expected,
        budget,
        budget_name="LayerNorm bound (two-pass/Welford, Chan-Golub-LeVeque), budgets.layer_norm",
    )


@check(
    "layer_norm_shift_invariance",
    "layer_norm",
    kind="property",
    violates="LayerNorm is unchanged by adding a constant to a row (§3.1)",
)
def layer_norm_shift_invariance(
    case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, shift: float
) -> None:
    """LayerNorm(x + c) = LayerNorm(x): the mean is subtracted. x and x + c are exact in the dtype."""
    if not (np.all(is_representable(x, case.dtype)) and np.all(is_representable(x + shift, case.dtype))):
        raise ValueError(f"test construction: x and x + {shift} must be exact in {case.dtype}")
    got, _, budget = _layer_norm(case, x, gain, bias, eps)
    got2, _, budget2 = _layer_norm(case, x + shift, gain, bias, eps)
    compare(
        case,
        got2,
        got,
        budget + budget2,
        what=f"LayerNorm(x + {shift}) differs from LayerNorm(x)",
        expected_name="LayerNorm(x)",
    )


@check("feed_forward", "feed_forward")
def ffn_agreement(case: Case, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> None:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 agrees with the oracle."""
    from aiayn.reference.layers import feed_forward as oracle

    nat, seen = prepare(case, x=x, w1=w1, b1=b1, w2=w2, b2=b2)
    got = case.run("feed_forward", [nat["x"], nat["w1"], nat["b1"], nat["w2"], nat["b2"]])
    expected = oracle(seen["x"], seen["w1"], seen["b1"], seen["w2"], seen["b2"])

    def bound(p: Any) -> np.ndarray:
        return B.feed_forward(seen["x"], seen["w1"], seen["b1"], seen["w2"], seen["b2"], p)

    budget = total_budget(bound, case.arithmetic, expected)
    case.diagnosis = Diagnosis("feed_forward", dict(seen), lambda dt: total_budget(bound, dt, expected))
    compare(case, got, expected, budget, budget_name="Eq. (2) bound, budgets.feed_forward")
