"""Batch invariance (§3.1-§3.3, §3.2.3): an example's result does not depend on what else is in its batch.

For every batched equation (its record's ``batch``, ``inputs/batches.py``), one check ``<equation>_is_batch_invariant``
computes the drawn example three ways: alone, as one block at another index of a larger batch whose other blocks
have other lengths, and with hidden padding appended. Two tiers:

- *within budget* (always): each arrangement agrees with the oracle within the equation's own budget (the bound of
  the example's computation, whatever else shares the call), and how many ulps apart the arrangements came out
  from the example alone is reported (``Counts.apart``);
- *bitwise* (where the implementation declares ``policies["batch_invariant"]``): the example in the batch has the
  same bits as alone, as vLLM's and Thinking Machines' batch-invariance tests demand. Padding changes the lengths a
  kernel reduces over, so it is held to the first tier only.

The padded call is judged against the oracle on the padded arguments: the declared policy "uniform" gives a fully
masked query row the mean of every value, padded ones included, so there the padded result differs from the example's
by definition; elements whose oracle values differ between the two are left out of the ulps apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aiayn.conformance.checks._common import agreement, declared, implementation_result
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import batches
from aiayn.conformance.inputs.strategies import scope
from aiayn.conformance.numerics import first_index, ulp
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check, current_stats

__all__ = ["NO_BATCH", "NO_PADDING", "ulps_apart"]

#: The row's note where an example could not be put in a batch: the scope accepts no batch dimension to add.
NO_BATCH = "batch invariance not checked on some examples: the scope accepts no batch dimension to add"
#: The row's note where an example could not be padded (the record's ``why_no_padding`` where it has no padding
#: arrangement at all).
NO_PADDING = "padded arrangement not checked on some examples: the scope accepts no padding mask or no longer sequence"


def _note(text: str) -> None:
    stats = current_stats().get()
    if stats is not None:
        stats.notes.add(text)


#: What a failure of batch invariance breaks.
VIOLATES = (
    "each sentence's result depends on that sentence alone, and padding is as if absent (§3.1-§3.3; masking, §3.2.3)"
)


def ulps_apart(a: np.ndarray, b: np.ndarray, dtype: str) -> float:
    """The most ulps of ``dtype`` (at the larger magnitude of the pair) between ``a`` and ``b``, elementwise; NaN
    against NaN and equal infinities count 0 (a differing NaN pattern is an oracle disagreement, judged before)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if bool(np.all(same)):
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.where(same, 0.0, np.abs(a - b) / ulp(np.maximum(np.abs(a), np.abs(b)), dtype))
    # inf against a finite number (or inf against -inf) gives NaN above: counted as infinitely far apart, so it can
    # only fail a declared batch invariance or show as the row's worst distance, never read as 0
    gap = np.where(np.isnan(gap), np.inf, gap)
    return float(np.max(gap))


def _bitwise(case: Case, got: np.ndarray, alone: np.ndarray, placed: batches.Placed) -> None:
    """Under a declared ``batch_invariant``: the example in the batch has exactly the bits it has alone."""
    differs = ~((got == alone) | (np.isnan(got) & np.isnan(alone)))
    if np.any(differs):
        i = first_index(differs)
        case.fail(
            f"policies['batch_invariant'] is declared, but {placed.what} differs from the example computed alone in "
            f"{int(np.sum(differs))} of {differs.size} elements, up to {ulps_apart(got, alone, case.dtype):.3g} ulps "
            f"(first at index {i}: {float(got[i])!r} in the batch, {float(alone[i])!r} alone)",
            breaks_property=True,
        )


def _batch_check(equation: str) -> Callable[..., None]:
    """Register ``<equation>_is_batch_invariant``: the example alone, in a batch and padded, each within the
    equation's budget; the batch bit for bit where declared."""
    r = record(equation)
    b = r.batch
    assert b is not None

    def is_batch_invariant(case: Case, size: int, index: int, extra: int, seed: int, **args: Any) -> None:
        rng = np.random.default_rng(seed)
        where = scope(case.impl, equation)
        example = batches.alone(args, b, where)
        if example is None:
            _note(NO_BATCH)
            return
        undefined = r.undefined(example.args) if r.undefined is not None else None
        got, expected, budget = agreement(case, **example.args)
        compare(
            case,
            got,
            expected,
            budget,
            what=f"{example.what} disagrees with the oracle",
            budget_name=r.budget_name,
            undefined=undefined,
        )
        arrangements = [
            batches.in_batch(example, b, where, size, index, rng),
            batches.padded(example, b, where, extra, rng),
        ]
        for key, placed in zip(("in a batch", "padded"), arrangements):
            if placed is None:
                _note(b.why_no_padding or NO_PADDING)
                continue
            free = np.zeros(got.shape, dtype=bool) if undefined is None else np.broadcast_to(undefined[0], got.shape)
            if key == "padded":  # the oracle of the padded call: a policy may read the padding (see the docstring)
                mine, want, bound = (x[placed.keep] for x in agreement(case, **placed.args))
                free = free | ~((want == expected) | (np.isnan(want) & np.isnan(expected)))
            else:
                mine, want, bound = implementation_result(case, **placed.args)[0][placed.keep], expected, budget
            compare(
                case,
                mine,
                want,
                bound,
                what=f"{placed.what} disagrees with the oracle",
                budget_name=r.budget_name,
                undefined=undefined,
            )
            case.apart(key, ulps_apart(np.where(free, 0.0, mine), np.where(free, 0.0, got), case.dtype))
            if key == "in a batch" and declared(case).get("batch_invariant", False):
                _bitwise(case, np.where(free, 0.0, mine), np.where(free, 0.0, got), placed)

    name = f"{equation}_is_batch_invariant"
    is_batch_invariant.__name__ = is_batch_invariant.__qualname__ = name
    is_batch_invariant.__doc__ = (
        f"{r.title}: the example alone, in a batch and padded, each within {r.budget_name}; the batch bit for bit "
        "where policies['batch_invariant'] is declared."
    )
    return check(equation, kind="property", violates=VIOLATES)(is_batch_invariant)


softmax_is_batch_invariant = _batch_check("softmax")
scaled_dot_product_attention_is_batch_invariant = _batch_check("scaled_dot_product_attention")
multi_head_attention_is_batch_invariant = _batch_check("multi_head_attention")
layer_norm_is_batch_invariant = _batch_check("layer_norm")
feed_forward_is_batch_invariant = _batch_check("feed_forward")
encoder_layer_is_batch_invariant = _batch_check("encoder_layer")
decoder_layer_is_batch_invariant = _batch_check("decoder_layer")
transformer_forward_is_batch_invariant = _batch_check("transformer_forward")
