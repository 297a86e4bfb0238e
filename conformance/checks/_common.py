"""What the check modules share: declared policies, inputs as the implementation sees them, and the one agreement
recipe."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from aiayn.conformance.diagnoses.backward import BackwardDiagnosis
from aiayn.conformance.directions import BACKWARD
from aiayn.conformance.equations import record
from aiayn.conformance.numerics import gamma, precision
from aiayn.conformance.run import gradients
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, Diagnosis, check, current_stats, timed
from aiayn.implementations.protocol import policy_problem
from aiayn.reference.model import flatten_params


def policy(case: Case, key: str) -> Any:
    """The implementation's declared policy ``key``, or a failure naming what is wrong with it."""
    policies = getattr(case.impl, "policies", None)
    try:
        value = policies[key]  # type: ignore[index]
    except Exception:
        case.fail(f"policies has no {key!r} entry (declared policies: {policies!r})")
    problem = policy_problem(key, value)
    if problem:
        case.fail(f"policies[{key!r}]: {problem}")
    return value


class _Declared(Mapping[str, Any]):
    """The declared policies of ``case``'s implementation as the records' hooks read them (``equations.Declared``):
    each value validated by :func:`policy` when read, so a hook that reads an absent or invalid one fails the check
    with the reason; ``get`` reads an optional one."""

    def __init__(self, case: Case) -> None:
        self._case = case
        raw = getattr(case.impl, "policies", None)
        self._raw = raw if isinstance(raw, Mapping) else {}

    def __getitem__(self, key: str) -> Any:
        return policy(self._case, key)

    def __iter__(self) -> Any:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._raw else default


def declared(case: Case) -> Mapping[str, Any]:
    """The declared policies of ``case``'s implementation, validated as they are read (what the records' policy hooks
    take)."""
    return _Declared(case)


def prepare(case: Case, **args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(native arguments, what the implementation sees of them as float64) for the named arguments.

    An array passed under several names (self-attention: query is key is value) becomes one
    native array passed under each name, as a caller would do: fused kernels (PyTorch's inference
    fast path) take a different route when the three are the same tensor.
    """
    first: dict[str, str] = {}  # name -> the first name its array was passed under
    for name, value in args.items():
        first[name] = next(
            (other for other, earlier in args.items() if earlier is value and isinstance(value, np.ndarray)), name
        )
    distinct = [name for name in args if first[name] == name]
    made = dict(zip(distinct, case.native([args[name] for name in distinct])))  # one conversion of them all
    natives = {name: made[first[name]] for name in args}
    seen = dict(zip(args, case.numpy_all([(name, natives[name]) for name in args])))
    return natives, seen


def implementation_result(case: Case, **args: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """(the implementation's result for the case's equation on ``args``, what it saw of them as float64): the
    arguments converted by its ``from_numpy`` and read back (:func:`prepare`), the method called in its record's
    argument order (or through the record's ``call``)."""
    r = record(case.equation)
    natives, seen = prepare(case, **{name: args[name] for name in r.arguments})
    if r.call is not None:
        return r.call(case, natives, seen), seen
    return case.run(r.name, [natives[name] for name in r.arguments] + ([case.dtype] if r.passes_dtype else [])), seen


def agreement(case: Case, **args: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(implementation's result, oracle's, budget) for the case's equation on ``args``: the one recipe of every
    agreement with the oracle, read from the equation's record (``conformance/equations.py``).

    The arguments are converted by the implementation's ``from_numpy`` and read back (:func:`prepare`), the
    implementation is called with them in its method's order, the oracle runs on exactly what it saw (plus the
    arguments the declared policies give), and the budget is formed at the case's arithmetic with the oracle's
    share. ``case.diagnosis`` gets what ``diagnoses.forward.explain`` needs if the comparison fails, and
    ``case.survivors`` how to rerun this recipe on another input to tell candidate departures apart.
    """
    r = record(case.equation)
    got, seen = implementation_result(case, **args)
    policies = declared(case)
    a = {**seen, **r.policies(policies)}
    with timed("oracle"):
        expected = np.asarray(r.oracle(a), dtype=np.float64)
        budget = r.budget_at(a, expected, case.arithmetic)
    model_args = r.model_arguments(policies, seen)
    diagnosed = {**a, **r.diagnosis_policies}
    case.diagnosis = Diagnosis(
        r.name,
        model_args,
        lambda dtype, values=None, ops=None: r.budget_at(
            diagnosed if ops is None else {**diagnosed, "ops": ops}, expected if values is None else values, dtype
        ),
        r.model,
        r.departures,
    )
    if case.direction != BACKWARD:
        case.survivors = _forward_survivors
    if case.arithmetic_as is not None:  # a property re-checked at another arithmetic: its values must agree there too
        compare(case, got, expected, budget, budget_name=r.budget_name)
    return got, expected, budget


def _forward_survivors(probe: Case, names: list[str]) -> list[str] | None:
    """Which of the candidate departures ``names`` agree with the implementation on ``probe``'s input (the recipe
    run again there); None where the input tells nothing (no diagnosis was set)."""
    got, _, _ = agreement(probe, **probe.args)
    return None if probe.diagnosis is None else probe.diagnosis.agreeing(names, got, probe.dtype)


def _backward_survivors(probe: Case, names: list[str]) -> list[str]:
    """The same for a gradient check: the candidates that agree with every gradient of ``probe``'s input."""
    diagnoses: dict[str, Any] = {}
    grads = gradient_agreement(probe, diagnoses=diagnoses, **probe.args)
    label = next(iter(grads))
    return [n for n in diagnoses[label].explain(grads[label][0], probe.dtype) if n in names]


def agreement_check(equation: str, name: str | None = None) -> Callable[..., None]:
    """Register an agreement check of ``equation``, named ``name`` (default: the equation's name): its result agrees
    with the oracle within the record's budget on every element the budget applies to."""
    budget_name = record(equation).budget_name

    undefined = record(equation).undefined

    def agrees(case: Case, **args: Any) -> None:
        got, expected, budget = agreement(case, **args)
        compare(case, got, expected, budget, budget_name=budget_name, undefined=undefined and undefined(args))

    agrees.__name__ = agrees.__qualname__ = name or equation
    agrees.__doc__ = f"{equation} agrees with the oracle within {budget_name}."
    return check(equation)(agrees)


#: Why a gradient element whose exact value is NaN is not checked: it depends on an output that is NaN (a fully
#: masked row under the policy "nan", a softmax slice of -inf), where the function has no derivative; an
#: implementation may give anything there (PyTorch's autograd gives 0 to dQ and NaN to dV, for one).
UNDEFINED_GRADIENT = "undefined: depends on an output that is NaN (no derivative there)"


def gradient_agreement(
    case: Case, d_out: np.ndarray, diagnoses: dict[str, Any] | None = None, **args: Any
) -> dict[str, tuple[np.ndarray, np.ndarray, Any]]:
    """(implementation's gradient, oracle's, budget) by gradient name, for the case's equation on ``args`` and the
    cotangent ``d_out``: the one recipe of every backward check, read from the record's :class:`Backward`.

    The arguments and the cotangent are converted by ``from_numpy`` (the cotangent in the case's dtype, as autograd
    requires), the gradients come from the implementation (``conformance/run/gradients.py``; none given: the test is
    skipped as "not provided"), and the oracle's VJP runs on exactly the rounded inputs and cotangent it saw. An
    array passed under several names has one gradient, the sum over its uses: it is compared with the sum of the
    oracle's, within the sum of the budgets plus the k - 1 additions of k uses (gamma_{k-1} on the magnitudes).
    A gradient the implementation leaves out is noted in the row ("not provided"), never passed. ``diagnoses``, if
    given, gets each gradient's :class:`~aiayn.conformance.diagnoses.backward.BackwardDiagnosis` (what names a
    failure).
    """
    import pytest

    r = record(case.equation)
    bw = r.backward
    if bw is None:
        raise ValueError(f"test construction: {case.equation} has no backward record")
    natives, seen = prepare(case, **{name: args[name] for name in r.arguments})
    a = {**seen, **r.policies(declared(case))}
    with timed("oracle"):
        shape = np.shape(r.oracle(a))
    if np.shape(d_out) != shape:
        raise ValueError(f"test construction: the cotangent has shape {np.shape(d_out)}, the result {shape}")
    undefined = r.undefined(args) if r.undefined is not None else None
    if undefined is not None:  # no loss reads an element no caller defines: its cotangent is 0
        d_out = np.where(np.broadcast_to(undefined[0], shape), 0.0, d_out)
    d_native = case.native(np.asarray(d_out, dtype=np.float64))
    g = case.numpy(d_native, "d_out")
    call = [natives[name] for name in r.arguments] + ([case.dtype] if r.passes_dtype else [])
    try:
        grads = gradients.vjp(case, list(r.arguments) + (["dtype"] if r.passes_dtype else []), call, d_native)
    except gradients.NotProvided as exc:  # no gradient given (no vjp, no autograd graph): reported, never passed
        pytest.skip(f"not provided: {exc}")
    with timed("oracle"):
        expected = {name: np.asarray(v, dtype=np.float64) for name, v in bw.oracle(a, g).items()}
        names = bw.gradient_names(a)
        budgets = bw.budget_at(a, g, expected, case.arithmetic)
    given = {
        k for name in r.arguments for k in (flatten_params(seen[name]) if isinstance(seen[name], dict) else [name])
    }
    _check_gradient_keys(case, grads, set(r.arguments) | given | ({"dtype"} if r.passes_dtype else set()))
    out: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}
    given_parts: dict[str, list[str]] = {}
    covered: set[str] = set()
    for key, native in grads.items():
        parts = [p for p in key.split(gradients.SHARED) if p in names]
        if not parts:
            continue  # a gradient of an argument the record does not differentiate (an index, a size)
        covered.update(parts)
        label = "d" + "+d".join(parts)
        got = case.numpy(native, f"the gradient {label}")
        if not isinstance(got, np.ndarray):
            case.fail(f"the gradient {label} is {type(native).__name__}, expected a native array")
        case._check_native_dtype(native, got, case.dtype, f"the gradient {label}")
        parts = [p for p in parts if p in budgets]
        if not parts:
            continue  # the gradient of an argument not given (an absent bias): nothing to compare
        want = np.sum([expected[p] for p in parts], axis=0)
        bound = np.sum([budgets[p] for p in parts], axis=0)
        if len(parts) > 1:
            u = precision(case.arithmetic).op
            bound = bound + gamma(len(parts) - 1, u) * np.sum([np.abs(expected[p]) + budgets[p] for p in parts], axis=0)
        out[label] = (got, want, bound)
        given_parts[label] = parts
    missing = [f"d{name}" for name in names if name not in covered and name in given]
    if not out:  # nothing to compare: never a pass
        wanted = ", ".join(f"d{name}" for name in names if name in given)
        if gradients.own_vjp(case.impl) is not None:
            case.fail(
                f"{case.impl.name}.vjp({case.equation!r}, ...) returned no gradient of {wanted} (keys: "
                f"{sorted(grads)!r}); an equation it does not differentiate raises NotImplementedError "
                "(the contract's vjp: implementations/protocol.py, Gradients)"
            )
        # autograd (no vjp of its own) reached no argument: the implementation gives no gradient, which the report
        # counts as "not provided" (never a pass); an own vjp that gives none failed just above
        pytest.skip(f"not provided: no gradient of {wanted} reached (keys given: {sorted(grads)!r})")
    stats = current_stats().get()
    if missing and stats is not None:
        stats.notes.add(f"gradients not provided: {', '.join(missing)}")
    everything = {label: (given_parts[label], got, bound) for label, (got, _, bound) in out.items()}
    if diagnoses is not None:
        diagnoses.update({label: BackwardDiagnosis(case.equation, a, g, label, everything, bw) for label in out})
    if case.direction == BACKWARD:
        case.survivors = _backward_survivors
    if case.arithmetic_as is not None:  # a property re-checked at another arithmetic: its gradients must agree there
        for label, (got, want, bound) in out.items():
            compare(case, got, want, bound, what=f"the gradient {label} disagrees with the oracle's VJP")
    return out


def _check_gradient_keys(case: Case, grads: Mapping[Any, Any], arguments: set[str]) -> None:
    """Every key of the implementation's gradients is a string that names arguments of the equation (joined by
    ``gradients.SHARED`` for one array passed under several names): a key that names none fails, naming the
    equation's argument names, rather than being passed over."""
    for key in grads:
        if not isinstance(key, str):
            case.fail(
                f"the gradients of {case.equation} have a key {key!r} of type {type(key).__name__}: expected an "
                f"argument name (one of {', '.join(sorted(arguments))})"
            )
        unknown = [part for part in key.split(gradients.SHARED) if part not in arguments]
        if unknown:
            case.fail(
                f"the gradients of {case.equation} have a key {key!r} that names no argument of it ("
                f"{', '.join(repr(u) for u in unknown)}); its arguments: {', '.join(sorted(arguments))} "
                f"(several joined by {gradients.SHARED!r} for one array passed under several names)"
            )


def gradient_check(equation: str, name: str | None = None) -> Callable[..., None]:
    """Register the backward agreement check of ``equation`` (default name ``<equation>_gradients``): every gradient
    the implementation gives agrees with the oracle's VJP within the record's backward budget."""
    budget_name = record(equation).backward.budget_name  # type: ignore[union-attr]

    def agrees(case: Case, d_out: np.ndarray, **args: Any) -> None:
        diagnoses: dict[str, Any] = {}
        for label, (got, expected, budget) in gradient_agreement(case, d_out, diagnoses, **args).items():
            case.diagnosis = diagnoses[label]
            compare(
                case,
                got,
                expected,
                budget,
                what=f"the gradient {label} disagrees with the oracle's VJP",
                budget_name=budget_name,
                expected_name="the oracle's VJP",
                undefined=(np.isnan(expected), UNDEFINED_GRADIENT),
            )

    agrees.__name__ = agrees.__qualname__ = name or f"{equation}_gradients"
    agrees.__doc__ = f"{equation}'s gradients agree with the oracle's VJP within {budget_name}."
    return check(equation, direction=BACKWARD)(agrees)


def exactly_zero(case: Case, got: np.ndarray, what: str, where: str = "exact") -> None:
    """``got`` must be exactly 0: a zero budget, so any nonzero element fails (NaN fails as a NaN mismatch)."""
    compare(case, got, np.zeros_like(got), np.zeros_like(got), what=what, expected_name=f"0 ({where})")
