"""Checks for §3.2: softmax, scaled dot-product attention (Eq. (1)), masking (§3.2.3), multi-head attention (§3.2.2).

Agreement checks compare with the oracle (``aiayn.reference.attention``) on the rounded inputs, within
the budgets of ``conformance/budgets.py``. Property checks compare the implementation with
itself on related inputs: two computations of the same exact value may each be off by their own
budget, so they may differ by the sum of both (``B1 + B2``), and by nothing more.
"""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import agreement, agreement_check, gradient_check, prepare
from aiayn.conformance.harness import Case, check, compare
from aiayn.conformance.numerics import gamma, is_representable, precision

# --------------------------------------------------------------------------------------------
# softmax, §3.2.1


softmax = agreement_check("softmax")
softmax_gradients = gradient_check("softmax")


@check("softmax", kind="property", violates="softmax weights sum to 1 (§3.2.1)")
def softmax_rows_sum_to_one(case: Case, x: np.ndarray, axis: int) -> None:
    """Each slice along ``axis`` sums to 1 (rows that are all -inf excepted: they are NaN).

    |sum_j p_hat_j - 1| <= sum_j |p_hat_j - p_j| <= sum_j budget_j, plus our own float64 summation
    of n terms: gamma_n(2^-53) sum_j p_hat_j.
    """
    got, expected, budget = agreement(case, x=x, axis=axis)
    n = got.shape[axis]
    total = np.sum(got, axis=axis)
    alive = ~np.all(np.isnan(expected), axis=axis)
    bound = np.sum(np.where(np.isnan(budget), 0.0, budget), axis=axis) + float(gamma(n, 2.0**-53)) * np.nansum(
        np.abs(got), axis=axis
    )
    compare(
        case,
        np.where(alive, total, np.nan),
        np.where(alive, 1.0, np.nan),
        bound,
        what=f"softmax slices along axis {axis} do not sum to 1",
        expected_name="the required sum",
    )


@check(
    "softmax",
    kind="property",
    violates="softmax is unchanged by adding a constant to its inputs (§3.2.1)",
)
def softmax_shift_invariance(case: Case, x: np.ndarray, axis: int, shift: float) -> None:
    """softmax(x + c) = softmax(x) (§3.2.1): x and x + c are drawn so that both are exact in the dtype."""
    if not (np.all(is_representable(x, case.dtype)) and np.all(is_representable(x + shift, case.dtype))):
        raise ValueError(f"test construction: x and x + {shift} must be exact in {case.dtype}")
    got, _, budget = agreement(case, x=x, axis=axis)
    got_shifted, _, budget_shifted = agreement(case, x=x + shift, axis=axis)
    compare(
        case,
        got_shifted,
        got,
        budget + budget_shifted,
        what=f"softmax(x + {shift}) differs from softmax(x)",
        expected_name="softmax(x)",
    )


# --------------------------------------------------------------------------------------------
# scaled dot-product attention, Eq. (1), and masks, §3.2.3


scaled_dot_product_attention = agreement_check("scaled_dot_product_attention")
scaled_dot_product_attention_gradients = gradient_check("scaled_dot_product_attention")


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="attention does not depend on the order of the key-value pairs (Eq. (1))",
)
def attention_unchanged_when_keys_and_values_are_permuted_together(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, perm: np.ndarray
) -> None:
    """Permuting keys and values together (and the mask's key axis) leaves the output unchanged."""
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=mask)
    pm = None if mask is None else mask[..., perm]
    got_p, _, budget_p = agreement(case, q=q, k=k[..., perm, :], v=v[..., perm, :], mask=pm)
    compare(
        case,
        got_p,
        got,
        budget + budget_p,
        what=f"permuting keys and values together by {perm.tolist()} changed the output",
        expected_name="the unpermuted call",
    )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="each output row depends on its own query only (Eq. (1))",
)
def attention_outputs_follow_permuted_queries(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, perm: np.ndarray
) -> None:
    """Permuting the queries (and the mask's query axis) permutes the output rows the same way."""
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=mask)
    pm = None if mask is None else np.broadcast_to(mask, (*mask.shape[:-2], q.shape[-2], k.shape[-2]))[..., perm, :]
    got_p, _, budget_p = agreement(case, q=q[..., perm, :], k=k, v=v, mask=pm)
    compare(
        case,
        got_p,
        got[..., perm, :],
        budget[..., perm, :] + budget_p,
        what=f"permuting the queries by {perm.tolist()} did not permute the output rows the same way",
        expected_name="the permuted original",
    )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="a masked key is as if removed: weight exactly 0 (§3.2.3)",
)
def attention_masked_keys_equal_removed_keys(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray
) -> None:
    """Masking keys out (§3.2.3) gives the output of deleting those keys and values."""
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=keep[None, :])
    got_r, _, budget_r = agreement(case, q=q, k=k[..., keep, :], v=v[..., keep, :], mask=None)
    compare(
        case,
        got,
        got_r,
        budget + budget_r,
        what=f"masking keys {np.flatnonzero(~keep).tolist()} is not the same as removing them",
        expected_name="the call without those keys",
    )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="masked scores are set to -inf: what a masked key or value holds cannot matter (§3.2.3)",
)
def attention_poison_at_masked_positions_changes_nothing(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, poison: str
) -> None:
    """Garbage at masked key/value positions changes nothing: the largest finite values there, or NaN in keys.

    ``poison``: "huge" (the dtype's largest finite value, +-, in masked keys and values) or
    "nan_keys" (NaN in masked keys). A masked score is -inf before the softmax (§3.2.3), so a
    masked key's content never matters, and its weight is exactly 0, so a masked value of any
    finite size contributes exactly 0. (NaN in a masked *value* is not required to vanish: Eq. (1)
    forms P V, and IEEE arithmetic gives 0 x NaN = NaN in every matrix-product implementation.)
    An implementation that adds a large negative number instead of masking (-1e4, -1e9) fails
    both poisons: the huge score outweighs the penalty, and NaN + penalty is NaN.
    Overflow, every example: under "huge", the first query row's elements get the magnitude
    floor 2 / sqrt(d_k) with the signs of the poison's pattern, so that row's masked scores are
    +-big x sum_c |q_0c| / sqrt(d_k) >= 2 big: +inf in every dtype whose largest value is that of
    float32 or above (any order of the sum: its terms have one sign; pre-scaling q and k by
    d_k^(-1/4) each changes nothing), and finite in float16 (65504 x 2 x 6 is far from float32's
    limit). A masked score that overflows must be ignored like any other. The floor keeps the row
    inside what the dtype resolves: its score error is at most gamma_{d_k+4} x 2 x scale, below the
    1/4 of ``strategies.logit_scale_cap``'s derivation in every dtype.
    Bound: both calls compute the same exact value, and the budget of the clean call covers the
    poisoned one (the analysis never looks at masked entries), so 2 x budget.
    """
    big = precision(case.dtype).max
    sign = np.where(np.arange(k.shape[-1]) % 2 == 0, 1.0, -1.0)
    if poison == "huge" and q.shape[-2] > 0:
        q = q.copy()
        q[..., 0, :] = sign * np.maximum(np.abs(q[..., 0, :]), 2.0 / np.sqrt(q.shape[-1]))
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=keep[None, :])
    k2, v2 = k.copy(), v.copy()
    if poison == "huge":
        k2[..., ~keep, :] = big * sign
        v2[..., ~keep, :] = -big
    elif poison == "nan_keys":
        k2[..., ~keep, :] = np.nan
    else:
        raise ValueError(f"poison: expected 'huge' or 'nan_keys', got {poison!r}")
    nat, _ = prepare(case, q=q, k=k2, v=v2)
    got_p = case.run("scaled_dot_product_attention", [nat["q"], nat["k"], nat["v"], case.native(keep[None, :])])
    compare(
        case,
        got_p,
        got,
        2 * budget,
        what=f"poison ({poison}) at masked key/value positions {np.flatnonzero(~keep).tolist()} changed the output",
        expected_name="the call with clean masked positions",
    )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="with the causal mask, position i sees only positions j <= i (§3.2.3)",
)
def causal_output_at_i_ignores_inputs_after_i(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, upto: int, q2: np.ndarray, k2: np.ndarray, v2: np.ndarray
) -> None:
    """With the causal mask (§3.2.3), the output at i does not depend on queries, keys or values at j > i.

    q2, k2, v2 equal q, k, v at positions <= ``upto`` and differ after it; outputs <= upto must agree.
    """
    from aiayn.reference.attention import causal_mask

    n = q.shape[-2]
    mask = causal_mask(n, n)
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=mask)
    got2, _, budget2 = agreement(case, q=q2, k=k2, v=v2, mask=mask)
    rows = slice(0, upto + 1)
    compare(
        case,
        got2[..., rows, :],
        got[..., rows, :],
        budget[..., rows, :] + budget2[..., rows, :],
        what=f"with the causal mask, changing positions > {upto} changed the output at positions <= {upto}",
        expected_name="the call before the change",
    )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="batch elements are computed independently",
)
def attention_batch_elements_are_independent(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, index: int
) -> None:
    """Batch element ``index`` computed alone equals the same element computed in the batch."""
    got, _, budget = agreement(case, q=q, k=k, v=v, mask=mask)
    one = slice(index, index + 1)
    m1 = None if mask is None else np.broadcast_to(mask, (q.shape[0], q.shape[-2], k.shape[-2]))[one]
    got1, _, budget1 = agreement(case, q=q[one], k=k[one], v=v[one], mask=m1)
    compare(
        case,
        got1,
        got[one],
        budget[one] + budget1,
        what=f"batch element {index} computed alone differs from the same element in the batch",
        expected_name="the batched call",
    )


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2

multi_head_attention = agreement_check("multi_head_attention")
#: The same agreement on self-attention inputs with a fully masked query row (a kernel path of its own in fused code).
multi_head_attention_fully_masked_self_attention_row = agreement_check(
    "multi_head_attention", "multi_head_attention_fully_masked_self_attention_row"
)


@check(
    "multi_head_attention",
    kind="property",
    violates="each head attends on its own projections only (§3.2.2)",
)
def multi_head_attention_heads_are_independent(
    case: Case,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: dict[str, np.ndarray],
    num_heads: int,
    mask: np.ndarray | None,
    head: int,
    replacement: dict[str, np.ndarray],
) -> None:
    """Heads are independent: with head ``head``'s rows of W^O zeroed, its own Q/K/V weights cannot matter.

    ``replacement`` holds new values for that head's column blocks of w_q, w_k, w_v (and b_q, b_k,
    b_v if present). Head i uses columns i*d_k:(i+1)*d_k (the canonical layout); an implementation
    that splits the heads along the wrong axis, or concatenates them in the wrong order, lets the
    silenced head's weights leak into the output.
    """
    h = num_heads
    d_k, d_v = params["w_q"].shape[1] // h, params["w_v"].shape[1] // h
    silenced = {n: a.copy() for n, a in params.items()}
    silenced["w_o"][head * d_v : (head + 1) * d_v, :] = 0.0
    changed = {n: a.copy() for n, a in silenced.items()}
    for name, block in replacement.items():
        width = d_v if name in ("w_v", "b_v") else d_k
        if name in changed:
            changed[name][..., head * width : (head + 1) * width] = block
    got, _, budget = agreement(case, query=query, key=key, value=value, params=silenced, num_heads=num_heads, mask=mask)
    got2, _, budget2 = agreement(
        case, query=query, key=key, value=value, params=changed, num_heads=num_heads, mask=mask
    )
    compare(
        case,
        got2,
        got,
        budget + budget2,
        what=(
            f"with head {head}'s rows of w_o zeroed, changing head {head}'s w_q/w_k/w_v columns changed the output "
            "(heads not independent)"
        ),
        expected_name="the call before the change",
    )
