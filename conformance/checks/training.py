"""Checks for §5.3 (the learning-rate schedule, Eq. (3)) and §5.4 (label smoothing, the smoothed cross-entropy)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiayn.conformance import budgets as B
from aiayn.conformance.checks._common import policy, prepare
from aiayn.conformance.harness import Case, Diagnosis, check, compare, total_budget
from aiayn.conformance.numerics import gamma

U64 = 2.0**-53

# --------------------------------------------------------------------------------------------
# the learning rate, §5.3, Eq. (3)


def _lrate_value(case: Case, step: int, d_model: int, warmup_steps: int) -> float:
    """One call of lrate, twice (determinism), checked to return a Python float."""
    first = case.call("lrate", step, d_model, warmup_steps)
    second = case.call("lrate", step, d_model, warmup_steps)
    for value in (first, second):
        if isinstance(value, bool) or not isinstance(value, float):
            case.fail(
                f"lrate({step}, {d_model}, {warmup_steps}) returned {type(value).__name__} {value!r}; the contract says a Python float"
            )
    if not (first == second or (math.isnan(first) and math.isnan(second))):
        case.fail(f"lrate({step}, {d_model}, {warmup_steps}) is not deterministic: {first!r} then {second!r}")
    return first


def _lrates(case: Case, steps: list[int], d_model: int, warmup_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(implementation's values, oracle's, budgets) at ``steps`` (all >= 1)."""
    from aiayn.reference.training import lrate as oracle

    got = np.array([_lrate_value(case, s, d_model, warmup_steps) for s in steps], dtype=np.float64)
    expected = np.asarray(oracle(np.array(steps, dtype=np.int64), d_model, warmup_steps), dtype=np.float64)

    def bound(p: Any) -> np.ndarray:
        return B.lrate(expected, p, np.array(steps, dtype=np.float64), d_model)

    budget = total_budget(bound, case.arithmetic, expected)
    case.diagnosis = Diagnosis(
        "lrate",
        {
            "steps": list(steps),
            "d_model": d_model,
            "warmup_steps": warmup_steps,
            "step_zero": policy(case, "step_zero"),
        },
        lambda dt: total_budget(bound, dt, expected),
    )
    return got, expected, budget


@check("lrate", "lrate")
def lrate_agreement(case: Case, steps: list[int], d_model: int, warmup_steps: int) -> None:
    """d_model^-0.5 min(step^-0.5, step warmup^-1.5) agrees with the oracle at every step (>= 1)."""
    got, expected, budget = _lrates(case, steps, d_model, warmup_steps)
    compare(case, got, expected, budget, budget_name="budgets.lrate", expected_name="the oracle")


@check(
    "lrate_warmup_then_decay",
    "lrate",
    kind="property",
    violates="lrate rises linearly for warmup_steps, then decays as step^-0.5 (Eq. (3))",
)
def lrate_shape(case: Case, rise: list[int], decay: list[int], d_model: int, warmup_steps: int) -> None:
    """The schedule rises linearly to its peak at warmup_steps, then decays as step^-0.5 (§5.3).

    With w = warmup_steps: lrate(s) = (s / w) lrate(w) for 1 <= s <= w, and
    lrate(s) = sqrt(w / s) lrate(w) for s >= w; lrate(w) is the maximum. Bounds: each value within
    its budget B(s), lrate(w) within B(w) scaled by the same factor, and our own float64
    arithmetic (3 roundings: 3 * 2^-53 relative).
    """
    w = warmup_steps
    (peak,), _, (b_peak,) = _lrates(case, [w], d_model, w)
    got, _, b = _lrates(case, rise, d_model, w)
    factor = np.array(rise, dtype=np.float64) / w
    compare(
        case,
        got,
        factor * peak,
        b + factor * b_peak + 3 * U64 * np.abs(got),
        what=f"lrate is not linear in the step below warmup_steps={w}",
        expected_name="(step / warmup) lrate(warmup)",
    )
    got, _, b = _lrates(case, decay, d_model, w)
    factor = np.sqrt(w / np.array(decay, dtype=np.float64))
    compare(
        case,
        got,
        factor * peak,
        b + factor * b_peak + 3 * U64 * np.abs(got),
        what=f"lrate does not decay as step^-0.5 after warmup_steps={w}",
        expected_name="sqrt(warmup / step) lrate(warmup)",
    )
    got, _, b = _lrates(case, rise + decay, d_model, w)
    compare(
        case,
        got,
        np.minimum(got, peak),
        b + b_peak,
        what=f"lrate exceeds its value at warmup_steps={w} (the peak)",
        expected_name="the peak lrate(warmup)",
    )


@check(
    "lrate_step_zero",
    "lrate",
    kind="property",
    violates="step 0 follows the declared step_zero policy; a negative step raises ValueError (the contract)",
)
def lrate_step_zero(case: Case, d_model: int, warmup_steps: int) -> None:
    """Step 0 follows the declared policy ("zero": exactly 0.0; "raise": ValueError; "one": exactly lrate(1)); a negative step raises ValueError."""
    declared = policy(case, "step_zero")
    if declared == "zero":
        value = _lrate_value(case, 0, d_model, warmup_steps)
        case.exact_checks()
        if value != 0.0:
            case.fail(
                f"lrate(0, ...) = {value!r}; declared step_zero='zero' means exactly 0.0 (min(inf, 0) = 0)",
                breaks_property=True,
            )
    elif declared == "one":
        value, one = _lrate_value(case, 0, d_model, warmup_steps), _lrate_value(case, 1, d_model, warmup_steps)
        case.exact_checks()
        if value != one:
            case.fail(
                f"lrate(0, ...) = {value!r} but lrate(1, ...) = {one!r}; declared step_zero='one' means step 0 is computed as step 1",
                breaks_property=True,
            )
    else:
        _expect_value_error(case, 0, d_model, warmup_steps, "declared step_zero='raise'")
    _expect_value_error(case, -1, d_model, warmup_steps, "the contract: a negative step raises ValueError")


def _expect_value_error(case: Case, step: int, d_model: int, warmup_steps: int, why: str) -> None:
    try:
        value = case.impl.lrate(step, d_model, warmup_steps)
    except ValueError:
        case.exact_checks()
        return
    except Exception as exc:
        case.fail(f"lrate({step}, ...) raised {type(exc).__name__}: {exc}; expected ValueError ({why})")
    case.fail(f"lrate({step}, ...) returned {value!r}; expected ValueError ({why})", breaks_property=True)


# --------------------------------------------------------------------------------------------
# label smoothing, §5.4


def smoothing(case: Case) -> dict[str, Any]:
    """The oracle's label-smoothing arguments for the declared policy: "K" and "K-1" as they are;
    "K-2" is the oracle's "K-1" with a padding class (``policies.get("padding_id", 0)``), which takes
    no mass, so eps is spread over the other K - 2 classes."""
    declared = policy(case, "label_smoothing")
    if declared == "K-2":
        return {"variant": "K-1", "padding_id": int(case.impl.policies.get("padding_id", 0))}
    return {"variant": declared, "padding_id": None}


def _declared(case: Case) -> dict[str, Any]:
    """The declared smoothing policy as the diagnoses take it."""
    return {"declared": policy(case, "label_smoothing"), "padding_id": int(case.impl.policies.get("padding_id", 0))}


def _smoothed(
    case: Case, targets: np.ndarray, vocab_size: int, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.training import label_smoothing as oracle

    got = case.run("label_smoothing", [case.native(targets), vocab_size, eps])
    expected = oracle(targets, vocab_size, eps, **smoothing(case))
    budget = total_budget(lambda p: B.label_smoothing(expected, p), case.arithmetic, expected)
    case.diagnosis = Diagnosis(
        "label_smoothing",
        {"targets": targets, "vocab_size": vocab_size, "eps": eps, **_declared(case)},
        lambda dt: total_budget(lambda p: B.label_smoothing(expected, p), dt, expected),
    )
    return got, expected, budget


@check("label_smoothing", "label_smoothing")
def label_smoothing_agreement(case: Case, targets: np.ndarray, vocab_size: int, eps: float) -> None:
    """Smoothed targets agree with the oracle's for the declared variant ("K" or "K-1"), in dtypes[0]."""
    got, expected, budget = _smoothed(case, targets, vocab_size, eps)
    compare(
        case, got, expected, budget, budget_name=f"budgets.label_smoothing, variant {policy(case, 'label_smoothing')!r}"
    )


@check(
    "label_smoothing_sums_to_one",
    "label_smoothing",
    kind="property",
    violates="each smoothed target distribution sums to 1 (§5.4)",
)
def label_smoothing_sums_to_one(case: Case, targets: np.ndarray, vocab_size: int, eps: float) -> None:
    """Each smoothed target distribution sums to 1 (0 for a padding row under "K-2"):
    |sum_c q_hat_c - 1| <= sum_c B_c + gamma_K(2^-53) sum_c q_hat_c."""
    got, _, budget = _smoothed(case, targets, vocab_size, eps)
    bound = np.sum(budget, axis=-1) + float(gamma(vocab_size, U64)) * np.sum(np.abs(got), axis=-1)
    pad = smoothing(case)["padding_id"]
    required = np.ones(got.shape[:-1]) if pad is None else np.where(np.asarray(targets) == pad, 0.0, 1.0)
    compare(
        case,
        np.sum(got, axis=-1),
        required,
        bound,
        what="smoothed targets do not sum to 1",
        expected_name="the required sum",
    )


def _cross_entropy(
    case: Case, logits: np.ndarray, targets: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.training import label_smoothing, smoothed_cross_entropy

    smooth = smoothing(case)
    nat, seen = prepare(case, logits=logits, targets=targets)
    got = case.run("smoothed_cross_entropy", [nat["logits"], nat["targets"], eps])
    expected = smoothed_cross_entropy(seen["logits"], targets, eps, **smooth)
    q = label_smoothing(targets, logits.shape[-1], eps, **smooth)
    budget = total_budget(
        lambda p: B.smoothed_cross_entropy(seen["logits"], q, p), case.arithmetic, np.asarray(expected)
    )
    case.diagnosis = Diagnosis(
        "smoothed_cross_entropy",
        {"logits": seen["logits"], "targets": targets, "eps": eps, **_declared(case)},
        lambda dt: total_budget(lambda p: B.smoothed_cross_entropy(seen["logits"], q, p), dt, np.asarray(expected)),
    )
    return got, np.asarray(expected, dtype=np.float64), budget


@check("smoothed_cross_entropy", "smoothed_cross_entropy")
def cross_entropy_agreement(case: Case, logits: np.ndarray, targets: np.ndarray, eps: float) -> None:
    """-sum_c q_c log softmax(logits)_c per position agrees with the oracle (declared smoothing variant)."""
    got, expected, budget = _cross_entropy(case, logits, targets, eps)
    compare(case, got, expected, budget, budget_name="budgets.smoothed_cross_entropy")


@check(
    "cross_entropy_minimum_is_target_entropy",
    "smoothed_cross_entropy",
    kind="property",
    violates="the smoothed cross-entropy is smallest where softmax(logits) is the target distribution (§5.4)",
)
def cross_entropy_minimum(
    case: Case, targets: np.ndarray, vocab_size: int, eps: float, shift: float, delta: np.ndarray
) -> None:
    """The loss is smallest when softmax(logits) is the smoothed target q, and its value there is H(q).

    At logits = log q + c (rounded to the dtype), the exact loss is H(q) + KL(q || softmax(logits)),
    KL >= 0 being only the rounding of the logits (the oracle computes it); so
    |L_hat - H| <= budget + KL. At any other logits (log q + c + delta) the exact loss is >= H, so
    L_hat >= H - budget.
    """
    from aiayn.reference.training import label_smoothing, smoothed_target_entropy

    variant = policy(case, "label_smoothing")
    if (
        variant == "K-2"
    ):  # the padding class carries no mass: log q = -inf there, and no finite logits reach the minimum
        case.tally(
            unchecked={
                "the minimum property needs every class to carry smoothing mass; 'K-2' gives the padding class none": 2
            }
        )
        return
    q = label_smoothing(targets, vocab_size, eps, variant=variant)
    entropy = float(smoothed_target_entropy(vocab_size, eps, variant=variant))
    at_target = np.log(q) + shift
    got, expected, budget = _cross_entropy(case, at_target, targets, eps)
    kl = np.maximum(expected - entropy, 0.0)
    compare(
        case,
        got,
        np.full(got.shape, entropy),
        budget + kl,
        what=f"the loss at the smoothed target is not its entropy H(q) = {entropy!r}",
        expected_name="H(q)",
    )
    got2, _, budget2 = _cross_entropy(case, at_target + delta, targets, eps)
    compare(
        case,
        got2,
        np.maximum(got2, entropy),
        budget2,
        what=f"the loss went below its minimum H(q) = {entropy!r} away from the target",
        expected_name="the minimum H(q)",
    )
