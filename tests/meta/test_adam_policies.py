"""Adam's declared choices reach the oracle: an implementation that declares Keras's order of eps ("hat"), or eps
inside the root without bias correction, passes the agreement check computed that way, and the same code without the
declaration fails it with the departure named (``conformance/diagnoses/forward.py``, family "adam")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiayn.conformance.checks import load_all
from aiayn.conformance.inputs import fixed as F
from aiayn.conformance.run.harness import CHECKS, ConformanceFailure
from aiayn.implementations.numpy_impl import NumpyImplementation, adam_moments

load_all()


class KerasOrder(NumpyImplementation):
    """Kingma & Ba's efficient form, as Keras writes it: lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + eps)."""

    name = "keras-order"

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):  # type: ignore[no-untyped-def]
        dt = param.dtype
        m1, v1 = adam_moments(grad, m, v, betas, dt)
        b1, b2, t = dt.type(betas[0]), dt.type(betas[1]), dt.type(step)
        alpha = dt.type(lr) * np.sqrt(1 - b2**t) / (1 - b1**t)
        return param - (m1 * alpha) / (np.sqrt(v1) + dt.type(eps)), m1, v1


class InsideUncorrected(NumpyImplementation):
    """eps inside the root and no bias correction: lr m / sqrt(v + eps)."""

    name = "inside-uncorrected"

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):  # type: ignore[no-untyped-def]
        dt = param.dtype
        m1, v1 = adam_moments(grad, m, v, betas, dt)
        return param - dt.type(lr) * m1 / np.sqrt(v1 + dt.type(eps)), m1, v1


CASES = [
    (KerasOrder, {"adam_eps": "hat"}, "Adam's eps added before the bias correction (Keras's order)"),
    (
        InsideUncorrected,
        {"adam_eps": "inside", "adam_bias_correction": False},
        "Adam's eps inside the square root + Adam without bias correction",
    ),
]


@pytest.mark.parametrize(("cls", "declared", "departure"), CASES, ids=["keras-order", "inside-uncorrected"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_declared_choice_of_adam_passes_and_the_undeclared_one_is_named(
    cls: type, declared: dict, departure: str, dtype: str
) -> None:
    for case in F.cases("adam_step"):
        if case.dtypes is None or dtype in case.dtypes:
            CHECKS[case.check](cls(policies=declared), dtype, **case.args)
    case = next(c for c in F.cases("adam_step") if "step 1:" in c.label)
    with pytest.raises(ConformanceFailure) as failure:
        CHECKS[case.check](cls(), dtype, **case.args)
    assert f"matches '{departure}'" in str(failure.value), str(failure.value)


@pytest.mark.parametrize("value", ["outside-ish", 1, None])
def test_a_bad_adam_declaration_fails_the_check_naming_the_policy(value: Any) -> None:
    case = F.cases("adam_step")[0]
    impl = NumpyImplementation()
    impl.policies = {**impl.policies, "adam_eps": value}  # past the built-in's own validation, as a plug-in's would be
    with pytest.raises(ConformanceFailure, match="policies\\['adam_eps'\\]: expected one of"):
        CHECKS[case.check](impl, "float64", **case.args)
