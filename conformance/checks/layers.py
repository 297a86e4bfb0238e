"""Checks for §3.1 (LayerNorm) and §3.3 (the position-wise feed-forward network, Eq. (2))."""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import agreement, agreement_check, gradient_check
from aiayn.conformance.harness import Case, check, compare
from aiayn.conformance.numerics import is_representable

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


feed_forward = agreement_check("feed_forward")
feed_forward_gradients = gradient_check("feed_forward")
