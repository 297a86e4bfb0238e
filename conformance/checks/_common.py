"""Small helpers shared by the check modules: declared policies, inputs as the implementation sees them."""

from __future__ import annotations

from typing import Any

import numpy as np

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
