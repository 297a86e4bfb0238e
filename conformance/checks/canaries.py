"""Canaries in output buffers (§3.2.1-§3.3): a method that writes its result into a given ``out`` must write every
element.

Where an implementation declares ``policies["writes_out"]`` (``implementations/protocol.py``), each listed equation
gets ``<equation>_writes_every_element_of_out``: the drawn call is made twice more with ``out=``, a native array of
the result's shape and the call's dtype filled with NaN, then with the dtype's largest finite value, and what it
returns is judged against the oracle within the equation's own budget: an element left unwritten keeps the canary
(NaN where the oracle has a number, or the largest value where it has anything else) and fails. Where the
implementation runs in this process, ``out`` itself must hold what the call returned (the result written in place).
The canaries in what a call reads, hidden positions poisoned, are the checks of masking
(``attention_poison_at_masked_positions_changes_nothing``, ``attention_masked_keys_receive_no_gradient``), of decoding
(``cached_decoding_ignores_what_padding_holds``) and of a paged cache (``paged_attention``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aiayn.conformance.checks._common import agreement, prepare
from aiayn.conformance.checks.invariance import differing_bits
from aiayn.conformance.equations import record
from aiayn.conformance.numerics import first_index, precision
from aiayn.conformance.run.boundary import Remote
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check
from aiayn.implementations.protocol import writes_out

__all__ = ["declares_out"]

#: What a failure breaks: the result is the equation's value at every element.
VIOLATES = "every element of a result is the equation's value (§3.2.1-§3.3): none is left as the buffer held it"


def declares_out(impl: Any, equation: str) -> None:
    """Skip as "not provided" unless ``impl`` declares ``out=`` for ``equation`` (``policies["writes_out"]``): the
    tests call it before they draw, the checks again (a replayed check)."""
    import pytest

    if equation not in writes_out(getattr(impl, "policies", None)):
        pytest.skip(f"not provided: {getattr(impl, 'name', impl)} declares no out= for {equation}")


def _out_check(equation: str) -> Callable[..., None]:
    """Register ``<equation>_writes_every_element_of_out``."""
    r = record(equation)

    def writes_every_element_of_out(case: Case, **args: Any) -> None:
        declares_out(case.impl, equation)
        _, expected, budget = agreement(case, **args)
        natives, _ = prepare(case, **{name: args[name] for name in r.arguments})
        method = getattr(case.impl, r.name)
        ordered = [natives[name] for name in r.arguments] + ([case.dtype] if r.passes_dtype else [])
        for fill, shown in ((np.nan, "NaN"), (precision(case.dtype).max, "the largest finite value")):
            buffer = case.native(np.full(expected.shape, fill))
            what = f"{case.impl.name}.{r.name}(..., out=<{case.dtype} {expected.shape} filled with {shown}>)"
            returned = case.guard(what, lambda *a, b=buffer: method(*a, out=b), *ordered)
            got = case.numpy(returned, f"{r.name}(..., out=...)")
            if not isinstance(got, np.ndarray) or got.shape != expected.shape:
                case.fail(f"{what} returned {getattr(got, 'shape', type(got).__name__)}, expected {expected.shape}")
            case._check_native_dtype(returned, got, case.dtype, r.name)
            if not isinstance(case.impl, Remote):  # in this process: the buffer itself must hold the result
                held = case.numpy(buffer, "out")
                differs = differing_bits(held, got)
                if np.any(differs):
                    i = first_index(differs)
                    case.fail(
                        f"{what} returned a result that is not what it wrote into out: {int(np.sum(differs))} of "
                        f"{differs.size} elements differ (first at index {i}: out holds {float(held[i])!r}, the "
                        f"result is {float(got[i])!r})"
                    )
            compare(
                case,
                got,
                expected,
                budget,
                what=f"with out= filled with {shown}, the result (an element left unwritten keeps it)",
                budget_name=r.budget_name,
            )

    name = f"{equation}_writes_every_element_of_out"
    writes_every_element_of_out.__name__ = writes_every_element_of_out.__qualname__ = name
    writes_every_element_of_out.__doc__ = (
        f"{r.title}: called with out= filled with NaN, then with the largest finite value, every element written and "
        f"within {r.budget_name}, where policies['writes_out'] lists it."
    )
    return check(equation, kind="property", violates=VIOLATES)(writes_every_element_of_out)


softmax_writes_every_element_of_out = _out_check("softmax")
scaled_dot_product_attention_writes_every_element_of_out = _out_check("scaled_dot_product_attention")
multi_head_attention_writes_every_element_of_out = _out_check("multi_head_attention")
layer_norm_writes_every_element_of_out = _out_check("layer_norm")
feed_forward_writes_every_element_of_out = _out_check("feed_forward")
