"""Checks for §3.2: softmax, scaled dot-product attention (Eq. (1)), masking (§3.2.3), multi-head attention (§3.2.2).

Agreement checks compare with the oracle (``aiayn.reference.attention``) on the rounded inputs, within
the budgets of ``conformance/budgets/forward.py``. Property checks compare the implementation with
itself on related inputs: two computations of the same exact value may each be off by their own
budget, so they may differ by the sum of both (``B1 + B2``), and by nothing more.
"""

from __future__ import annotations

import numpy as np

from aiayn.conformance.checks._common import (
    agreement,
    agreement_check,
    exactly_zero,
    gradient_agreement,
    gradient_check,
    policy,
    prepare,
)
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.numerics import gamma, is_representable, precision
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check

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
# the same checks on lengths around kernels' tile sizes (inputs/strategies.py, TILE_LENGTHS): a last partial tile, a
# reduction split across tiles
scaled_dot_product_attention_across_tiles = agreement_check(
    "scaled_dot_product_attention", "scaled_dot_product_attention_across_tiles"
)
scaled_dot_product_attention_gradients_across_tiles = gradient_check(
    "scaled_dot_product_attention", "scaled_dot_product_attention_gradients_across_tiles"
)


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
# Eq. (1)'s gradients: exact identities (each names what it protects)


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="a masked key is as if removed (§3.2.3): it receives no gradient, and what it holds changes none",
    direction=BACKWARD,
)
def attention_masked_keys_receive_no_gradient(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, d_out: np.ndarray
) -> None:
    """Keys and values that every query has masked get dK = dV = 0 exactly (their weights are exactly 0), and huge
    values there change no gradient (flash-attention #2424: a backward that forgets the mask; JAX #19490: a huge
    masked logit leaking into the gradient).

    Poison: in masked keys and values the largest magnitudes whose products cannot overflow, max / (4 d max(|x|, 1))
    with x the queries for keys (so a masked score stays finite) and the cotangent for values (so dP = dO V^T stays
    finite, and dS = P (.) (dP - D) is exactly 0 there). (A masked score that overflows is the forward's poison
    check, where PyTorch's SDPA declares that it adds -inf rather than replacing the score; a dP that overflows
    gives 0 x inf = NaN in every backward that forms dS so; NaN at masked keys gives 0 x NaN in dQ = dS K: none of
    these is required to vanish.)
    Bound: the clean and the poisoned calls compute the same exact gradients of q and of the visible keys and
    values, and the clean call's budget covers both (the analysis never looks at masked entries): 2 x budget.
    """
    mask = keep[None, :]
    clean = gradient_agreement(case, d_out, q=q, k=k, v=v, mask=mask)
    big = precision(case.dtype).max
    k2, v2 = k.copy(), v.copy()
    k2[..., ~keep, :] = big / (4 * k.shape[-1] * max(float(np.max(np.abs(q), initial=0.0)), 1.0))
    v2[..., ~keep, :] = -big / (4 * v.shape[-1] * max(float(np.max(np.abs(d_out), initial=0.0)), 1.0))
    with np.errstate(all="ignore"):  # the poisoned call's own oracle and budget overflow at the masked keys: unused
        poisoned = gradient_agreement(case, d_out, q=q, k=k2, v=v2, mask=mask)
    hidden = np.flatnonzero(~keep).tolist()
    for label, (got, _, budget) in clean.items():
        if label in ("dk", "dv"):
            exactly_zero(case, got[..., ~keep, :], f"the gradient {label} of masked keys {hidden} is not 0", "masked")
            exactly_zero(
                case,
                poisoned[label][0][..., ~keep, :],
                f"with poison, {label} of masked keys {hidden} is not 0",
                "masked",
            )
            got, budget, other = got[..., keep, :], budget[..., keep, :], poisoned[label][0][..., keep, :]
        else:
            other = poisoned[label][0]
        compare(
            case,
            other,
            got,
            2 * budget,
            what=f"the largest values at masked keys {hidden} changed the gradient {label}",
            expected_name="the gradient with clean masked keys",
        )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="each row of softmax weights sums to 1 (§3.2.1): Sum_j dK_j = 0 and Sum_j dV_j = Sum_i dO_i",
    direction=BACKWARD,
)
def attention_key_gradients_sum_to_zero(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, d_out: np.ndarray
) -> None:
    """Sum_j dK_j = 0 (Sum_j dS_ij = Sum_j P_ij (dP_ij - D_i) = D_i - D_i = 0) and Sum_j dV_j = Sum_i dO_i over the
    rows whose weights sum to 1 (those with a visible key; every row under the policy "uniform"): what a dropped
    reduction block, a D from the unnormalised output or weights before normalisation break.

    Bound: |Sum_j dK_hat_j| <= Sum_j B_j + gamma_{n_k-1} Sum_j (|dK_j| + B_j) (our float64 sum of the computed
    values adds gamma_{n_k-1}(2^-53) Sum |dK_hat|, inside the first); likewise for dV, with the exact Sum_i dO_i
    formed in float64 from the rounded cotangent (its own error, gamma_{n_q}(2^-53) Sum |dO_i|, added).
    """
    if any(np.shape(a)[:-2] != np.shape(q)[:-2] for a in (k, v)):
        raise ValueError("test construction: q, k, v of one batch shape (no broadcast sums)")
    grads = gradient_agreement(case, d_out, q=q, k=k, v=v, mask=mask)
    n_k = k.shape[-2]
    shape = q.shape[:-1] + (n_k,)
    visible = np.ones(shape, bool) if mask is None else np.broadcast_to(mask, shape)
    live = np.any(visible, axis=-1)  # (..., n_q): rows whose weights sum to 1 ("uniform": every row)
    if policy(case, "fully_masked") == "uniform":
        live = np.ones_like(live)
    g = case.numpy(case.native(d_out), "d_out")
    u, u64 = precision(case.arithmetic).op, 2.0**-53
    for label, target in (("dk", 0.0), ("dv", np.sum(np.where(live[..., None], g, 0.0), axis=-2))):
        if label not in grads:
            continue
        got, expected, budget = grads[label]
        total = np.sum(got, axis=-2)
        bound = np.sum(budget, axis=-2) + float(gamma(max(n_k - 1, 0), u)) * np.sum(np.abs(expected) + budget, axis=-2)
        if label == "dv":  # the exact sum of dO, formed here in float64
            bound = bound + float(gamma(max(q.shape[-2], 1), u64)) * np.sum(np.abs(g), axis=-2)
        compare(
            case,
            total,
            np.broadcast_to(target, total.shape),
            bound,
            what=f"the sum over keys of {label} is not {'0' if label == 'dk' else 'the sum of dO over live rows'}",
            expected_name="the exact sum",
        )


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="with the causal mask, position i sees only positions j <= i (§3.2.3): no gradient reaches later keys",
    direction=BACKWARD,
)
def causal_gradient_reaches_no_later_key(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, row: int, d_out: np.ndarray
) -> None:
    """With the causal mask and a cotangent on query ``row`` alone, dK_j = dV_j = 0 exactly for j > row."""
    from aiayn.reference.attention import causal_mask

    n = q.shape[-2]
    g = np.zeros_like(d_out)
    g[..., row, :] = d_out[..., row, :]
    grads = gradient_agreement(case, g, q=q, k=k, v=v, mask=causal_mask(n, n))
    for label in ("dk", "dv"):
        if label in grads:
            exactly_zero(case, grads[label][0][..., row + 1 :, :], f"{label} of keys after {row} is not 0", "causal")


@check(
    "scaled_dot_product_attention",
    kind="property",
    violates="batch elements are computed independently: no gradient crosses between them",
    direction=BACKWARD,
)
def attention_gradients_stay_in_their_batch_element(
    case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, index: int, d_out: np.ndarray
) -> None:
    """With a cotangent that is 0 on batch element ``index``, every gradient of that element is exactly 0."""
    g = d_out.copy()
    g[index] = 0.0
    for label, (got, _, _) in gradient_agreement(case, g, q=q, k=k, v=v, mask=mask).items():
        exactly_zero(
            case, got[index], f"the gradient {label} of batch element {index} (zero cotangent) is not 0", "batch"
        )


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2

multi_head_attention = agreement_check("multi_head_attention")
multi_head_attention_across_tiles = agreement_check("multi_head_attention", "multi_head_attention_across_tiles")
multi_head_attention_gradients = gradient_check("multi_head_attention")
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
