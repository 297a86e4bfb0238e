"""Every equation on fixed inputs (``inputs/fixed.py``): the same registered checks, budgets and report as the drawn
ones.

One test per equation, parametrized by its fixed cases; a case runs the check it names with its
saved arguments, so a failure replays like any other (``aiayn replay``). These are the inputs a
GPU run (``aiayn check SPEC --device cuda``) and a CPU run share case by case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from aiayn.conformance.checks import load_all
from aiayn.conformance.directions import BACKWARD, DECODE, FORWARD, SPLIT
from aiayn.conformance.inputs import fixed as F
from aiayn.conformance.report.coverage import OUT_OF_SCOPE
from aiayn.conformance.run.harness import CHECKS
from aiayn.implementations.protocol import EQUATIONS, scope_of

load_all()


def _on_fixed_inputs(equation: str, direction: str = FORWARD) -> Callable[..., None]:
    @pytest.mark.aiayn_equation(equation, direction=direction)
    @pytest.mark.parametrize("case", F.cases(equation, direction), ids=str)
    def test(impl: Any, dtype: str, case: F.Fixed) -> None:
        if case.dtypes is not None and dtype not in case.dtypes:
            # not a disagreement: the case's inputs are not numbers of this dtype (eps = 1e-9 in float16), and every
            # dtype has a case of its own among the equation's (inputs/fixed.py)
            pytest.skip(f"the case's values are not {dtype} numbers: {dtype} runs its own case")
        scope = scope_of(impl, equation)
        unmet = scope.unmet(case.needs)
        if unmet:
            pytest.skip(f"{OUT_OF_SCOPE} of {impl.name} ({scope.describe()}): the case needs {', '.join(unmet)}")
        CHECKS[case.check](impl, dtype, **case.args)

    gradients = {BACKWARD: "_gradients", DECODE: "_decoding", SPLIT: "_split_keys"}.get(direction, "")
    test.__name__ = test.__qualname__ = f"test_{equation}{gradients}_on_fixed_inputs"
    test.__doc__ = f"{equation}{gradients.replace('_', ' ')} agrees with the oracle on each of its fixed cases."
    return test


for _equation in EQUATIONS:
    globals()[f"test_{_equation}_on_fixed_inputs"] = _on_fixed_inputs(_equation)
    if F.cases(_equation, BACKWARD):
        globals()[f"test_{_equation}_gradients_on_fixed_inputs"] = _on_fixed_inputs(_equation, BACKWARD)
    if F.cases(_equation, DECODE):
        globals()[f"test_{_equation}_decoding_on_fixed_inputs"] = _on_fixed_inputs(_equation, DECODE)
    if F.cases(_equation, SPLIT):
        globals()[f"test_{_equation}_split_keys_on_fixed_inputs"] = _on_fixed_inputs(_equation, SPLIT)
