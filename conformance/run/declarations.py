"""The optional declarations of an implementation, validated against what the suite knows.

``implementations/protocol.py`` (``contract_problems``) checks the contract's members and values; this module adds
what only the suite can tell: ``compiles_per_shape`` that is not a bool, a ``policies`` key it does not read (a
misspelt ``padding_id`` would otherwise fall back to its default without a word), a ``declared_inconclusive`` key
that names no equation, a ``known_deviations`` name that is no test of the suite (or not with those parameters, or
not a dtype). Each problem names the closest valid name. The contract check ``declarations_follow_the_contract``
(``checks/contract.py``) reports them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiayn.implementations.decoding import beam_policies
from aiayn.implementations.protocol import DECLARED_PROPERTIES, DTYPES, EQUATIONS, POLICY_CHOICES

__all__ = ["POLICY_KEYS", "declaration_problems", "known_tests", "tests_from"]

#: Every key of ``policies`` the suite reads: those of ``POLICY_CHOICES``, ``layer_norm_eps``, and the optional
#: ``padding_id`` (label smoothing "K-2"'s padding class, default 0), ``flush_subnormals``, ``beam_search`` (the
#: choices of §6.1's beam search, ``implementations/decoding.py``), the declared properties
#: (``DECLARED_PROPERTIES``: ``batch_invariant``, ``deterministic``), ``writes_out`` (the methods taking ``out=``) and
#: ``adam_bias_correction`` (Adam's choice beside ``adam_eps``, one of ``POLICY_CHOICES``).
POLICY_KEYS: tuple[str, ...] = (
    *POLICY_CHOICES,
    "adam_bias_correction",
    "layer_norm_eps",
    "padding_id",
    "flush_subnormals",
    "beam_search",
    *DECLARED_PROPERTIES,
    "writes_out",
)


#: Where the suite's tests are read from (the pytest plugin registers its reader, ``plugin.deviation_names``, when it
#: is imported: the tests live above the checks, so a check asks through this hook rather than importing them).
_TESTS: list[Callable[[], Mapping[str, Collection[str]]]] = []


def tests_from(reader: Callable[[], Mapping[str, Collection[str]]]) -> None:
    """Register ``reader``: the suite's tests by the names ``known_deviations`` use -> their bracketed parameters."""
    _TESTS[:] = [reader]


def known_tests() -> Mapping[str, Collection[str]]:
    """The suite's tests as the registered reader gives them (what :func:`declaration_problems` checks names
    against)."""
    if not _TESTS:
        raise RuntimeError("the suite's tests are read by the pytest plugin (aiayn.conformance.run.plugin): import it")
    return _TESTS[0]()


def declaration_problems(impl: Any, checks: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """The problems of ``impl``'s optional declarations (empty: none).

    ``checks``: the suite's tests by the names ``known_deviations`` use (the test's name without ``test_``) -> the
    bracketed parameters each runs with (``plugin.deviation_names``); without it only the form of each
    ``known_deviations`` entry is checked.
    """
    return (
        _compiles_problems(impl)
        + _policy_key_problems(getattr(impl, "policies", None))
        + _inconclusive_problems(getattr(impl, "declared_inconclusive", None))
        + _deviation_problems(getattr(impl, "known_deviations", None), checks)
    )


def _compiles_problems(impl: Any) -> list[str]:
    """``compiles_per_shape`` (optional): True where each new input shape costs the implementation a compile; the
    suite then draws sizes from a few sets per run (``strategies.few_shapes``)."""
    value = getattr(impl, "compiles_per_shape", False)
    if isinstance(value, bool):
        return []
    return [f"compiles_per_shape: expected True or False, got {value!r}"]


def _policy_key_problems(policies: Any) -> list[str]:
    if not isinstance(policies, Mapping):
        return []  # the contract's own check says so
    problems = [
        f"policies: unknown key {key!r}{_did_you_mean(str(key), POLICY_KEYS)}; the suite reads {', '.join(POLICY_KEYS)}"
        for key in policies
        if key not in POLICY_KEYS
    ]
    try:
        beam_policies(policies)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` with the closest of ``choices`` to ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _reasons_problems(member: str, declared: Any, form: str) -> list[str]:
    """The problems of a mapping of names to reasons (``known_deviations``, ``declared_inconclusive``) as a whole and
    of its reasons; the names are checked by the caller."""
    if not isinstance(declared, Mapping):
        return [f"{member}: expected a mapping of {form} -> reason (str), got {declared!r}"]
    return [
        f"{member}[{key!r}]: expected a non-empty reason (str), got {reason!r}"
        for key, reason in declared.items()
        if not isinstance(reason, str) or not reason.strip()
    ]


def _inconclusive_problems(declared: Any) -> list[str]:
    if declared is None:
        return []
    form = "'equation' or 'equation@dtype'"
    problems = _reasons_problems("declared_inconclusive", declared, form)
    if not isinstance(declared, Mapping):
        return problems
    equations = (*EQUATIONS, "contract")
    for key in declared:
        equation, at, dtype = str(key).partition("@")
        if equation not in equations:
            problems.append(
                f"declared_inconclusive: {key!r} names no equation{_did_you_mean(equation, equations)}; a key is "
                f"{form}, the equation one of EQUATIONS or 'contract'"
            )
        elif at and dtype not in DTYPES:
            problems.append(
                f"declared_inconclusive: {key!r}: {dtype!r} is not one of {DTYPES}{_did_you_mean(dtype, DTYPES)}"
            )
    return problems


#: A ``known_deviations`` name: the test's name without ``test_``, its parameters in brackets (which may hold
#: brackets themselves), then ``@dtype``.
_DEVIATION = re.compile(r"(?P<test>[^\[@]*)(?:\[(?P<params>.*)\])?(?:@(?P<dtype>[^\]@]*))?", re.DOTALL)


def _deviation_problems(declared: Any, checks: Mapping[str, Collection[str]] | None) -> list[str]:
    if declared is None:
        return []
    problems = _reasons_problems("known_deviations", declared, "'test[params]@dtype'")
    if not isinstance(declared, Mapping):
        return problems
    for key in declared:
        parsed = _DEVIATION.fullmatch(str(key))
        if parsed is None or not parsed["test"]:
            problems.append(
                f"known_deviations: {key!r} is not of the form 'test', 'test[params]', 'test@dtype' or "
                "'test[params]@dtype' (the test's name without test_)"
            )
            continue
        dtype = parsed["dtype"]
        if dtype is not None and dtype not in DTYPES:
            close = _did_you_mean(dtype, DTYPES)
            problems.append(f"known_deviations: {key!r}: {dtype!r} is not one of {DTYPES}{close}")
        if checks is not None:
            problems += _deviation_name_problems(str(key), parsed["test"], parsed["params"], checks)
    return problems


def _deviation_name_problems(
    key: str, test: str, params: str | None, checks: Mapping[str, Collection[str]]
) -> list[str]:
    """Whether ``test[params]`` names a test of the suite, as the suite runs it."""
    if test not in checks:
        return [f"known_deviations: {key!r} names no test of the suite{_did_you_mean(test, checks)}"]
    known = checks[test]
    if params is None and known:
        shown = ", ".join(f"[{p}]" for p in sorted(known)[:6]) + (", ..." if len(known) > 6 else "")
        return [f"known_deviations: {key!r}: test {test} runs once per parameter set; name one: {shown}"]
    if params is not None and not known:
        return [f"known_deviations: {key!r}: test {test} takes no parameters; declare it as {test!r}"]
    if params is not None and params not in known:
        return [
            f"known_deviations: {key!r}: test {test} is not run with parameters [{params}]"
            + _did_you_mean(params, known)
        ]
    return []
