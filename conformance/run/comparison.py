"""A result judged against the oracle within its budget, and a failing output named: elementwise comparison
(:func:`compare`: what is checked, what is not and why, the worst ratio), and the departures a failing agreement
check's output matches (:func:`matches`: each cause counted for the report, candidates told apart on drawn inputs).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.conformance.diagnoses.forward import PAIRS
from aiayn.conformance.directions import BACKWARD, DECODE, SPLIT
from aiayn.conformance.equations import RECORDS
from aiayn.conformance.numerics import first_index, floored, precision
from aiayn.conformance.report.results import NO_MATCH
from aiayn.conformance.run.harness import Case, Diagnosis, NaNMismatch, OverBudget, Stats, current_stats, timed

__all__ = ["DISAMBIGUATION_INPUTS", "VACUOUS", "applicable", "compare", "matches", "total_budget"]

#: The running test's statistics (``harness.Stats``), None outside a test.
_STATS = current_stats()


def total_budget(bound_fn: Callable[[Any], np.ndarray], dtype: str, expected: np.ndarray) -> np.ndarray:
    """The comparison threshold: bound(dtype) + bound(float64) (the oracle's own), floored at 1 ulp.

    See ``conformance/budgets/forward.py`` (module docstring) for why the oracle's share is the float64
    bound and why the floor is one ulp of the dtype at the expected value.
    """
    derived = np.asarray(bound_fn(precision(dtype)), dtype=np.float64) + np.asarray(
        bound_fn(precision("float64")), dtype=np.float64
    )
    return floored(derived, dtype, expected)


#: A budget at or above this is not a bound: it came from an infinite one, clamped to 1e300 so that
#: 0 x bound stays 0 inside a matrix product (``budgets.forward._HUGE``). Every honest budget of the suite
#: is many orders of magnitude below (inputs stay within 1e4, sizes within 64).
VACUOUS = 1e200


def applicable(budget: np.ndarray) -> np.ndarray:
    """Elementwise: is the budget a bound that applies (finite, not NaN, below :data:`VACUOUS`)?"""
    b = np.asarray(budget, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(b) & (b < VACUOUS)


def compare(
    case: Case,
    got: np.ndarray,
    expected: np.ndarray,
    budget: np.ndarray,
    *,
    what: str = "disagrees with the oracle",
    budget_name: str = "",
    expected_name: str = "the oracle",
    not_applicable: str = "",
    undefined: tuple[np.ndarray, str] | None = None,
) -> float | None:
    """Fail unless |got - expected| <= budget on every element whose budget applies; return the worst ratio.

    - NaN must appear exactly where ``expected`` is NaN (a fully masked row's declared policy);
      those elements are checked exactly.
    - An element whose budget is infinite, NaN or vacuous (:func:`applicable`) is *not checked*:
      it is counted, with the reason (``not_applicable``, else the budget's name), and never
      passes or fails on a number that means nothing.
    - Every other element is checked: the ratio |got - expected| / budget must be at most 1.
    - ``undefined``: (mask, reason): elements where the exact value is undefined and no value is required (a
      gradient that depends on a NaN output): not checked, counted under ``reason``.
    Works on 0-d and empty results. Returns the worst ratio among checked elements (None if none).
    """
    __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        case.fail(f"{what}: result has shape {got.shape}, expected {expected.shape}")
    if undefined is not None:
        free = np.broadcast_to(undefined[0], expected.shape)
        case.tally(unchecked={undefined[1]: int(np.sum(free))})
        got, expected = np.where(free, 0.0, got), np.where(free, 0.0, expected)
        _unjudged_in_diagnosis(case, free)
    nan_got, nan_exp = np.isnan(got), np.isnan(expected)
    extra, missing = nan_got & ~nan_exp, nan_exp & ~nan_got
    if np.any(extra) or np.any(missing):
        stats = _STATS.get()
        if stats is not None:
            stats.nan_mismatches += 1
        matched = _diagnose(case, got)
        policy = _masked_row_policy(case)
        if np.any(extra):
            i = first_index(extra)
            case.fail(
                f"{what}{matched}: NaN at index {i}, where {expected_name} gives {float(expected[i])!r} "
                f"({int(np.sum(extra))} unexpected NaN in all{policy and f'; declared {policy}'})",
                kind=NaNMismatch,
            )
        i = first_index(missing)
        case.fail(
            f"{what}{matched}: {float(got[i])!r} at index {i}, where {expected_name} gives NaN"
            + (f" (the declared policy's result for a fully masked row; {policy})" if policy else ""),
            kind=NaNMismatch,
        )
    budget = np.broadcast_to(np.asarray(budget, dtype=np.float64), expected.shape)
    usable = applicable(budget) & ~nan_exp
    skipped = int(np.sum(~applicable(budget) & ~nan_exp))
    reason = not_applicable or f"{budget_name or 'the budget'}: infinite or undefined for these inputs"
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.where(nan_exp | (got == expected), 0.0, np.abs(got - expected))  # equal infinities: no error
        err = np.where(np.isnan(err), np.inf, err)  # inf against -inf
        ratio = np.where(usable, np.where(err == 0, 0.0, err / np.where(usable, budget, 1.0)), 0.0)
    worst_at = first_index(ratio == np.max(ratio)) if ratio.size and np.any(usable) else None
    r = float(ratio[worst_at]) if worst_at is not None else None
    case.tally(checked=int(np.sum(usable)) + int(np.sum(nan_exp)), unchecked={reason: skipped}, ratio=r)
    if r is not None and r > 1.0:
        i = worst_at
        where = f"index {i}: got {float(got[i])!r}, {expected_name} gives {float(expected[i])!r}"
        over = int(np.sum(ratio > 1))
        details = [
            f"  worst element at {where}",
            f"  error {err[i]:.3e} = {r:.3g} x budget {budget[i]:.3e}"
            + (f" ({budget_name})" if budget_name else "")
            + f"; {over} of {int(np.sum(usable))} checked elements over budget"
            + (f" ({skipped} not checked: {reason})" if skipped else ""),
        ]
        matched, names = matches(case, got, r)
        _note_largest(case, r, where, names)
        case.fail(f"{what}{matched}", details, kind=OverBudget, ratio=r)
    return r


def _unjudged_in_diagnosis(case: Case, free: np.ndarray) -> None:
    """The diagnosis judges no departure on the elements the comparison leaves out (compared as 0 there): its budget
    is infinite at them."""
    diagnosis = case.diagnosis
    if not isinstance(diagnosis, Diagnosis) or not np.any(free):
        return

    def budget_at(*args: Any, **kwargs: Any) -> np.ndarray:
        # no departure is judged where the comparison reads nothing (the padded target positions, compared as 0)
        return np.where(free, np.inf, np.broadcast_to(diagnosis.budget_at(*args, **kwargs), free.shape))

    case.diagnosis = dataclasses.replace(diagnosis, budget_at=budget_at)


def _masked_row_policy(case: Case) -> str:
    """ "fully_masked policy 'X'" for an equation with attention (a NaN may be a fully masked row's), else ""."""

    r = RECORDS.get(case.equation)
    if r is None or "attention" not in r.departures or case.direction == SPLIT:  # split keys: 0 and -inf, always
        return ""
    policies = getattr(case.impl, "policies", None)
    return f"fully_masked policy {policies.get('fully_masked') if isinstance(policies, Mapping) else None!r}"


def _diagnose(case: Case, got: np.ndarray) -> str:
    """ "; the output matches 'X'" for the known departures an agreement check's failing output agrees with.

    The departures are those of ``diagnoses/forward.py``. Only agreement checks (an oracle variant is
    comparable with the implementation's output). The names go to the test's stats for the report
    only from the examples a failure message shows (Hypothesis's final replay of each distinct
    failure, a fixed input, a replay; and the largest discrepancy the message leads with,
    :func:`_note_largest`): an example met on the way can match a departure by coincidence (scores
    so large that softmax is one-hot either way match "no 1/sqrt(d_k) scaling"), and the report
    must not name what no shown example and replay file supports.
    """
    return matches(case, got)[0]


#: Failing examples of Hypothesis's search diagnosed per test (each costs up to a second on a whole model, and a
#: failing test meets hundreds while shrinking): beyond these, only an example that would be the test's largest
#: discrepancy is diagnosed; the row's counts say how many were ("N of M failing examples").
DIAGNOSED_PER_TEST = 10


def matches(case: Case, got: np.ndarray, ratio: float | None = None) -> tuple[str, list[str]]:
    """:func:`_diagnose`'s text and the departure names behind it (credited to the report from a shown example): what
    names a failing agreement, for the harness's comparison and for a check that compares on its own (beam search)."""
    if case.kind != "agreement" or case.diagnosis is None:
        return "", []  # a property check names what it breaks itself (Case.fail)
    stats = _STATS.get()
    shown = _shown_example()
    if not shown and stats is not None and stats.diagnosed >= DIAGNOSED_PER_TEST:
        largest = stats.largest["ratio"] if stats.largest else None
        if ratio is None or (largest is not None and ratio <= largest):
            return "", []  # a search example no message shows, and not the largest: left undiagnosed
    token = PAIRS.set(shown)  # pairs only where a message shows the example: the search's examples are many
    try:
        with timed("diagnosis"):
            names = case.diagnosis.explain(got, case.dtype)
    except Exception as exc:  # a diagnosis that cannot be computed must not hide the failure itself
        return f" (no diagnosis: {type(exc).__name__}: {exc})", []
    finally:
        PAIRS.reset(token)
    if stats is not None and not _final_replay() and (names or shown):  # the causes of the failing examples
        # diagnosed in full (a search example no single departure explains is left uncounted), for the row's counts
        stats.diagnosed += 1
        for name in names or [NO_MATCH]:
            stats.causes[name] = stats.causes.get(name, 0) + 1
    told = ""
    if len(names) > 1 and _shown_example():
        with timed("diagnosis"):
            names, told = _disambiguate(case, names)
    if stats is not None and _shown_example():
        stats.departures.update(names)
    if not names:
        catalogue = {BACKWARD: "backward", DECODE: "decoding", SPLIT: "split"}.get(case.direction, "forward")
        return f"; no known departure matches (conformance/diagnoses/{catalogue}.py)", names
    if len(names) > 1:  # a budget wide enough for several: candidates, not a match
        return "; candidates, not told apart" + told + ": " + ", ".join(f"'{n}'" for n in names), names
    return f"; the output matches '{names[0]}'" + told, names


#: Inputs drawn to tell candidate departures apart when a failing example cannot.
DISAMBIGUATION_INPUTS = 3


def _disambiguate(case: Case, names: list[str]) -> tuple[list[str], str]:
    """Candidates that survive the largest-discrepancy example of the test and :data:`DISAMBIGUATION_INPUTS` inputs
    drawn for the purpose (the failing example's shapes, masks, ids and sizes; its float arrays redrawn), with the
    implementation called on each; and how the message says so.

    A candidate survives an input when its variant agrees with the implementation's output there within budget
    (``diagnoses.forward.agreeing``, each candidate alone). When every candidate would be ruled out, none is (the inputs
    drawn leave the bug's conditions); when more than one survives, the message says they cannot be told apart.
    """
    survivors = list(names)
    stats = _STATS.get()
    largest = stats.largest if stats is not None else None
    if largest and largest.get("departures"):
        kept = [n for n in survivors if n in largest["departures"]]
        survivors = kept or survivors
    rng = np.random.default_rng(zlib.crc32(f"{case.check}:{case.dtype}".encode()))
    tried, tighter = 0, _tighter(case)
    for dtype in [case.dtype] * DISAMBIGUATION_INPUTS + ([tighter] if tighter else []):
        if len(survivors) == 1:
            break
        outcome = _candidates_on_new_input(case, survivors, rng, dtype)
        if outcome is None:
            continue
        tried += 1
        survivors = outcome or survivors
    drawn = f"{tried} drawn" + (f" (the last in {tighter})" if tighter and tried > DISAMBIGUATION_INPUTS else "")
    ruled_out = [n for n in names if n not in survivors]
    if len(survivors) > 1:
        return survivors, f" on these inputs and {drawn} to separate them"
    shown = ", ".join(f"'{n}'" for n in ruled_out)
    return survivors, f" (not {shown}: ruled out on the test's largest discrepancy or on inputs drawn: {drawn})"


def _tighter(case: Case) -> str | None:
    """The implementation's most precise dtype where it is more precise than the case's: a budget narrow enough to
    separate candidates that the case's dtype's budget fits together (float16's fits several feed-forward modules)."""
    declared = getattr(case.impl, "dtypes", ()) or ()
    here = precision(case.dtype).u
    return next((d for d in ("float64", "float32") if d in declared and precision(d).u < here), None)


def _candidates_on_new_input(case: Case, names: list[str], rng: np.random.Generator, dtype: str) -> list[str] | None:
    """The candidates that agree with the implementation on one input drawn like the case's, in ``dtype`` (the check's
    recipe run there, ``case.survivors``); None when the input cannot be used (the implementation refuses it, or
    breaks its contract there) or the check set no recipe to rerun."""
    if case.survivors is None:
        return None
    args = _redrawn(case.args, rng)
    probe = Case(case.impl, dtype, case.check, case.equation, args, "agreement", direction=case.direction)
    scratch = Stats()
    token = _STATS.set(scratch)
    try:
        return case.survivors(probe, names)
    except Exception:  # refused, or the contract broken on it: this input tells nothing
        return None
    finally:
        _STATS.reset(token)
        for path in scratch.files:
            Path(path).unlink(missing_ok=True)


def _redrawn(value: Any, rng: np.random.Generator, memo: dict[int, Any] | None = None) -> Any:
    """``value`` with every float array redrawn (normal, at half the array's own scale, at least 1/2; non-finite
    entries such as -inf scores kept); masks, ids, shapes and scalars kept, and one array passed under two names
    (self-attention) still one array."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, Mapping):
        out: Any = {k: _redrawn(v, rng, memo) for k, v in value.items()}
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
        finite = value[np.isfinite(value)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        out = np.where(np.isfinite(value), rng.standard_normal(value.shape) * scale / 2, value)
    else:
        out = value
    memo[id(value)] = out
    return out


def _shown_example() -> bool:
    """Whether the example running now is one a failure message shows: not inside a Hypothesis search, or
    its final replay of a failing example (``BuildContext.is_final``)."""
    import hypothesis
    from hypothesis.control import current_build_context

    return not hypothesis.currently_in_test_context() or bool(current_build_context().is_final)


def _final_replay() -> bool:
    """Whether the example running now is Hypothesis's final replay of a failing example it has already run."""
    import hypothesis
    from hypothesis.control import current_build_context

    return hypothesis.currently_in_test_context() and bool(current_build_context().is_final)


def _note_largest(case: Case, ratio: float, where: str, departures: list[str]) -> None:
    """Keep the largest over-budget discrepancy of this test (with its own replay file and the departures its output
    matches) for the failure message, which leads with it; the report credits those departures too (Stats.result)."""
    stats = _STATS.get()
    if stats is None or (stats.largest is not None and stats.largest["ratio"] >= ratio):
        return
    if len(departures) > 1 and case.kind == "agreement" and case.diagnosis is not None:
        departures, _ = _disambiguate(case, departures)  # credited to the report: told apart as a shown example is
    stats.largest = {
        "ratio": ratio,
        "where": where,
        "inputs": case.describe_inputs(),
        "replay": str(case.save()),
        "check": case.check,
        "departures": list(departures),
    }
