"""Checks for §3.1 (LayerNorm) and §3.3 (the position-wise feed-forward network, Eq. (2))."""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import (
    agreement,
    agreement_check,
    exactly_zero,
    gradient_agreement,
    gradient_check,
)
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.numerics import gamma, is_representable, precision
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check

layer_norm = agreement_check("layer_norm")
layer_norm_gradients = gradient_check("layer_norm")


@check(
    "layer_norm",
    kind="property",
    violates="LayerNorm is unchanged by adding a constant to a row (§3.1)",
)
def layer_norm_unchanged_by_shifting_its_input(
    case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, shift: float
) -> None:
    """LayerNorm(x + c) = LayerNorm(x): the mean is subtracted. x and x + c are exact in the dtype."""
    if not (np.all(is_representable(x, case.dtype)) and np.all(is_representable(x + shift, case.dtype))):
        raise ValueError(f"test construction: x and x + {shift} must be exact in {case.dtype}")
    got, _, budget = agreement(case, x=x, gain=gain, bias=bias, eps=eps)
    got2, _, budget2 = agreement(case, x=x + shift, gain=gain, bias=bias, eps=eps)
    compare(
        case,
        got2,
        got,
        budget + budget2,
        what=f"LayerNorm(x + {shift}) differs from LayerNorm(x)",
        expected_name="LayerNorm(x)",
    )


@check(
    "layer_norm",
    kind="property",
    violates="LayerNorm subtracts the row's mean (§3.1): its input gradient sums to 0 over the row",
    direction=BACKWARD,
)
def layer_norm_input_gradient_sums_to_zero(
    case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, d_out: np.ndarray
) -> None:
    """Sum_i dx_i = 0 in every row of two elements or more (dx = (h - mean(h) - x_hat mean(h x_hat)) / s and
    Sum_i x_hat_i = 0): what a backward without the mean term breaks.

    Bound: |Sum_i dx_hat_i| <= Sum_i B_i + gamma_{d-1} Sum_i (|dx_i| + B_i) (our float64 sum inside it).
    """
    if x.shape[-1] < 2:
        raise ValueError("test construction: rows of at least 2 elements (one-element rows have their own check)")
    grads = gradient_agreement(case, d_out, x=x, gain=gain, bias=bias, eps=eps)
    if "dx" not in grads:
        return
    got, expected, budget = grads["dx"]
    d = x.shape[-1]
    u = precision(case.arithmetic).op
    bound = np.sum(budget, axis=-1) + float(gamma(d - 1, u)) * np.sum(np.abs(expected) + budget, axis=-1)
    total = np.sum(got, axis=-1)
    compare(case, total, np.zeros_like(total), bound, what="dx does not sum to 0 over a row", expected_name="0")


@check(
    "layer_norm",
    kind="property",
    violates="LayerNorm of a one-element row is its bias (§3.1: x - mean is exactly 0): no gradient reaches x or gain",
    direction=BACKWARD,
)
def layer_norm_one_element_rows_have_no_gradient(
    case: Case, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, d_out: np.ndarray
) -> None:
    """Rows of one element: x_hat = 0 exactly in any algorithm (the mean of one number is itself), so dx = 0 and
    dgain = 0 exactly (PyTorch #188372: a nonzero dgain for normalized_shape = (1,)); dbias = sum of dy, within its
    budget (the agreement check's)."""
    if x.shape[-1] != 1:
        raise ValueError("test construction: rows of one element")
    grads = gradient_agreement(case, d_out, x=x, gain=gain, bias=bias, eps=eps)
    for label in ("dx", "dgain"):
        if label in grads:
            exactly_zero(case, grads[label][0], f"{label} of one-element rows is not 0", "one element")


feed_forward = agreement_check("feed_forward")
feed_forward_gradients = gradient_check("feed_forward")
