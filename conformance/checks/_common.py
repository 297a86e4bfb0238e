"""What the check modules share: declared policies, inputs as the implementation sees them, and the one agreement
recipe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aiayn.conformance.harness import Case, Diagnosis, check, compare
from aiayn.implementations.protocol import POLICY_CHOICES


def policy(case: Case, key: str) -> Any:
    """The implementation's declared policy ``key``, or a failure naming what is wrong with it."""
    policies = getattr(case.impl, "policies", None)
    try:
        value = policies[key]  # type: ignore[index]
    except Exception:
        case.fail(f"policies has no {key!r} entry (declared policies: {policies!r})")
    if key in POLICY_CHOICES and value not in POLICY_CHOICES[key]:
        case.fail(f"policies[{key!r}] = {value!r} is not one of {POLICY_CHOICES[key]}")
    if key == "layer_norm_eps" and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        case.fail(f"policies['layer_norm_eps'] = {value!r} is not a positive float")
    return value


def prepare(case: Case, **args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(native arguments, what the implementation sees of them as float64) for the named arguments.

    An array passed under several names (self-attention: query is key is value) becomes one
    native array passed under each name, as a caller would do: fused kernels (PyTorch's inference
    fast path) take a different route when the three are the same tensor.
    """
    natives: dict[str, Any] = {}
    for name, value in args.items():
        same = next(
            (
                other
                for other, earlier in args.items()
                if other in natives and earlier is value and isinstance(value, np.ndarray)
            ),
            None,
        )
        natives[name] = natives[same] if same is not None else case.native(value)
    seen = {name: case.numpy(natives[name], name) for name in args}
    return natives, seen


def agreement(case: Case, **args: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(implementation's result, oracle's, budget) for the case's equation on ``args``: the one recipe of every
    agreement with the oracle, read from the equation's record (``conformance/equations.py``).

    The arguments are converted by the implementation's ``from_numpy`` and read back (:func:`prepare`), the
    implementation is called with them in its method's order, the oracle runs on exactly what it saw (plus the
    arguments the declared policies give), and the budget is formed at the case's arithmetic with the oracle's
    share. ``case.diagnosis`` gets what ``diagnoses.explain`` needs if the comparison fails.
    """
    from aiayn.conformance.equations import record

    r = record(case.equation)
    natives, seen = prepare(case, **{name: args[name] for name in r.arguments})
    if r.call is not None:
        got = r.call(case, natives, seen)
    else:
        got = case.run(r.name, [natives[name] for name in r.arguments] + ([case.dtype] if r.passes_dtype else []))
    a = {**seen, **r.policies(case)}
    expected = np.asarray(r.oracle(a), dtype=np.float64)
    budget = r.budget_at(a, expected, case.arithmetic)
    model_args = {**seen, **(r.model_policies or r.policies)(case)}
    diagnosed = {**a, **r.diagnosis_policies}
    case.diagnosis = Diagnosis(
        r.name,
        model_args,
        lambda dtype, values=None: r.budget_at(diagnosed, expected if values is None else values, dtype),
    )
    if case.arithmetic_as is not None:  # a property re-checked at another arithmetic: its values must agree there too
        compare(case, got, expected, budget, budget_name=r.budget_name)
    return got, expected, budget


def agreement_check(equation: str, name: str | None = None) -> Callable[..., None]:
    """Register an agreement check of ``equation``, named ``name`` (default: the equation's name): its result agrees
    with the oracle within the record's budget on every element the budget applies to."""
    from aiayn.conformance.equations import record

    budget_name = record(equation).budget_name

    def agrees(case: Case, **args: Any) -> None:
        got, expected, budget = agreement(case, **args)
        compare(case, got, expected, budget, budget_name=budget_name)

    agrees.__name__ = agrees.__qualname__ = name or equation
    agrees.__doc__ = f"{equation} agrees with the oracle within {budget_name}."
    return check(equation)(agrees)
