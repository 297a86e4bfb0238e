"""How much of what the suite draws it can actually check: the stated fractions, and "inconclusive".

A budget (``budgets/forward.py``, ``budgets/composites/forward.py``) is a theorem with hypotheses: where they fail (the
error in LayerNorm's sigma is not below sigma; a softmax whose perturbed scores overflow; a
composite downstream of such a stage) the bound is infinite, and the element is *not checked*:
counted, with its reason, in the report, never passed. The strategies (``inputs/strategies.py``) are
conditioned so that this stays rare: inputs are scaled to what the dtype can resolve.

Per equation, its record (``equations.py``, ``Equation.max_unchecked``) states the largest
fraction of drawn elements that may go unchecked; a report row above it is **inconclusive**,
which fails the run (exit 1) unless
the implementation declares it in ``declared_inconclusive`` (``"equation"`` or
``"equation@dtype"`` -> why). ``tests/meta/test_budget_coverage.py`` checks the stated fractions
against the strategies themselves, dtype by dtype, with an implementation that rounds every
intermediate to the dtype (``conformance/studies/simulated.py``).

The stated fractions (measured with ``conformance/studies/simulated.py`` over the ``thorough`` profile,
1000 examples per test, and checked over the ``ci`` profile by the test):

- 1% everywhere: the budgets apply to essentially every element the strategies draw (measured:
  0 unchecked for every equation in every dtype, once the strategies keep LayerNorm rows and
  attention scores within what the dtype resolves: ``inputs/strategies.py``, ``resolvable_level``,
  ``logit_scale_cap``, and for the composites ``condition_attention`` (each attention's worst-case
  score error at most 1) and ``_layer_rows`` (every input row keeps a spread in float16 and
  bfloat16) and, for the whole model, ``_layer_norms_resolved`` (every LayerNorm row of its forward pass,
  residual sums included, is one the dtype resolves: about 1 drawn bfloat16 model in 1,100 is rejected; before
  it, 3 of 12,595 bfloat16 whole models drawn over seeds 1-4 had logits with no bound). Measured with
  ``aiayn.conformance.inputs.strategies`` over 10,000 draws per composite in float16 and bfloat16 (encoder layer,
  decoder layer) and 9,264 bfloat16 and 2,104 float16 whole models: 0 elements unchecked
  (``tests/meta/test_conditioning.py`` repeats it on 300 draws). Without those conditions about 1 drawn
  bfloat16 decoder layer in 45 has elements with no bound (3.5% of its outputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_UNSUPPORTED",
    "OUT_OF_SCOPE",
    "declared_inconclusive",
    "max_unchecked",
]

#: The prefix of a skip reason for a test outside an implementation's declared scope (the plugin
#: writes it, the report reads it).
OUT_OF_SCOPE = "outside the declared scope"

#: A row whose examples the implementation mostly refused (``Unsupported``) says little: above this
#: fraction of unsupported examples it is inconclusive, not a pass.
MAX_UNSUPPORTED = 0.5


def max_unchecked(equation: str, dtype: str) -> float:
    """The stated largest unchecked fraction of ``equation`` (its record's, ``equations.py``; the contract's
    default)."""
    from aiayn.conformance.equations import DEFAULT_MAX_UNCHECKED, RECORDS  # not at import: the plugin stays light

    return RECORDS[equation].max_unchecked if equation in RECORDS else DEFAULT_MAX_UNCHECKED


def declared_inconclusive(impl: Any, equation: str, dtype: str) -> str | None:
    """The implementation's reason for accepting an inconclusive row (``declared_inconclusive``), or None."""
    declared = getattr(impl, "declared_inconclusive", None)
    if not isinstance(declared, Mapping):
        return None
    reason = declared.get(f"{equation}@{dtype}") or declared.get(equation)
    return str(reason) if reason else None
