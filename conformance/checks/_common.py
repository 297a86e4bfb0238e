"""Small helpers shared by the check modules: declared policies, inputs as the implementation sees them."""

from __future__ import annotations

from typing import Any

from aiayn.conformance.harness import Case
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
    """(native arguments, what the implementation sees of them as float64) for the named arguments."""
    natives = {name: case.native(value) for name, value in args.items()}
    seen = {name: case.numpy(natives[name], name) for name in args}
    return natives, seen

