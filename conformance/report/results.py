"""The results of a run, typed: what one test found (:class:`TestResult`), and one report row (:class:`Row`).

A :class:`TestResult` is written by the plugin for every aiayn test of one implementation in one dtype
(passed, failed, skipped, a declared known deviation, a crash or a hang); it crosses from an xdist worker to
the controller as its :meth:`~TestResult.to_dict`. The report (``report/rows.py``) folds the results of one
equation and dtype into a :class:`Row`, which the JSON report stores as :meth:`~Row.to_dict` and the zoo,
the mutants and the false-alarm count read back with :meth:`Row.from_dict`. Outcomes and statuses are enums
(:class:`Outcome`, :class:`Status`); both are strings, so the JSON holds their plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from aiayn.conformance.directions import FORWARD, Direction

__all__ = ["APART", "Counts", "Outcome", "Row", "Status", "TestResult"]


class Outcome(str, Enum):
    """How one test ended."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    KNOWN_DEVIATION = "known deviation"  # failed, and the implementation declares that it does (strict)

    def __str__(self) -> str:
        return self.value


class Status(str, Enum):
    """The verdict of one report row (an equation in one dtype)."""

    PASS = "pass"
    PASS_WITHIN_SCOPE = "pass within scope"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    INCONCLUSIVE_DECLARED = "inconclusive (declared)"
    KNOWN_DEVIATION = "known deviation"
    NOT_PROVIDED = "not provided"
    OUT_OF_SCOPE = "out of scope"
    SKIPPED = "skipped"
    NOT_RUN = "not run"
    NOT_APPLICABLE = "n/a"

    def __str__(self) -> str:
        return self.value

    @property
    def passed(self) -> bool:
        return self in (Status.PASS, Status.PASS_WITHIN_SCOPE)

    @property
    def inconclusive(self) -> bool:
        return self in (Status.INCONCLUSIVE, Status.INCONCLUSIVE_DECLARED)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


#: How a row counts a failing example whose output no known departure explains.
NO_MATCH = "no known departure"


@dataclass(kw_only=True)
class Counts:
    """What the checks of one test counted, for its report row (the harness accumulates them, ``run.harness.Stats``;
    a :class:`TestResult` carries them).

    ``examples``: check calls (one per Hypothesis example or fixed case); ``unsupported``: examples the
    implementation refused (``Unsupported``), with ``unsupported_why``. ``checked``: elements compared against a
    budget that applies (or exactly: NaN patterns, contract checks). ``unchecked``: elements whose budget is infinite
    or undefined, by reason: never counted as passed. ``exact``: elements of checks with zero tolerance (the
    contract, exact policies). ``worst``: the largest error / budget among checked elements of the agreement checks
    (None when none was checked). ``nan_mismatches``: examples that failed on a NaN pattern. ``departures``: the
    known departures the failures match; ``causes``: each cause found across the failing examples with the number it
    explains, of ``diagnosed`` failing examples a diagnosis was computed for. ``violations``: the paper's statements
    a property check found broken. ``notes``: what a passing check accepted that the report should say (e.g. a
    refusal by an exception other than ValueError). ``largest``: the largest over-budget discrepancy (ratio, where,
    inputs, replay file), which leads the failure message.
    """

    examples: int = 0
    unsupported: int = 0
    unsupported_why: str = ""
    checked: int = 0
    unchecked: dict[str, int] = field(default_factory=dict)
    exact: int = 0
    worst: float | None = None
    nan_mismatches: int = 0
    departures: list[str] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)
    diagnosed: int = 0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    largest: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # by part: TIME_PARTS
    apart: dict[str, float] = field(default_factory=dict)  # arrangement -> most ulps from the example alone (APART)


#: The arrangements of the invariance checks whose distance from the example computed once, alone, a row reports
#: (``Counts.apart``, in ulps of the dtype at the larger of the two values; ``checks/invariance.py``): the example
#: in a batch, padded, and the same call run again (its gradients: run-to-run determinism).
APART = ("in a batch", "padded", "rerun")

#: Where a test's time goes (``Counts.seconds``): "test", its call's wall time in pytest; "implementation", inside the
#: implementation's methods (its process boundary included); "oracle", the oracle's values and the budgets;
#: "diagnosis", naming failures. The rest of "test" is Hypothesis's generation and shrinking and the harness.
TIME_PARTS = ("test", "implementation", "oracle", "diagnosis")


@dataclass
class TestResult(Counts):
    """What one aiayn test of one implementation in one dtype found (a pytest item's result): who and what, then
    its :class:`Counts` (keyword-only).

    ``crash``: "timeout" (a call past the time limit, or a call not made because its method hung before),
    "fatal error: ..." or "exit ..." where the check did not finish; ``replay``: its replay file.
    """

    __test__ = False  # not a pytest test class

    spec: str
    equation: str
    dtype: str
    test: str
    outcome: Outcome
    direction: str = FORWARD  # BACKWARD: a test of the implementation's gradients
    nodeid: str = ""
    reason: str = ""
    crash: str = ""
    replay: str | None = None

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)
        self.direction = Direction(self.direction).value  # a plain str: results cross to the controller as data

    @property
    def counted(self) -> bool:
        """Whether its counts enter the row (it ran to a verdict)."""
        return self.outcome in (Outcome.PASSED, Outcome.FAILED, Outcome.KNOWN_DEVIATION)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TestResult:
        return cls(**_known(cls, data))


@dataclass
class Row:
    """One row of a conformance report: the tests of one equation in one dtype and direction (its forward pass, or
    its gradients), summed, and their verdict.

    ``fraction_checked``: checked / (checked + not checked) elements (None when nothing was compared);
    ``worst_error_to_budget``: the largest |implementation - oracle| / budget of the agreement checks, and
    ``headroom`` its inverse; ``measure``: that number as text, or what happened where none applies.
    """

    equation: str
    section: str
    dtype: str
    status: Status
    direction: str = FORWARD  # BACKWARD: the row of the equation's gradients
    scope: str = ""
    examples: int = 0
    unsupported: int = 0
    unsupported_why: str = ""
    out_of_scope_tests: list[str] = field(default_factory=list)
    checked: int = 0
    not_checked: int = 0
    not_checked_reasons: dict[str, int] = field(default_factory=dict)
    fraction_checked: float | None = None
    max_unchecked: float | None = None
    declared_inconclusive: str | None = None
    worst_error_to_budget: float | None = None
    headroom: float | None = None
    measure: str = ""
    largest_failure: dict[str, Any] | None = None
    departures: list[str] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)  # each cause found across the failing examples: how many
    diagnosed: int = 0  # of how many failing examples
    violations: list[str] = field(default_factory=list)
    unnamed_failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed_tests: list[str] = field(default_factory=list)
    known_deviations: dict[str, str] = field(default_factory=dict)
    tests: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # its tests' Counts.seconds, summed by part
    apart: dict[str, float] = field(default_factory=dict)  # its tests' Counts.apart, the most of each
    bitwise: bool = False  # batch invariance declared (policies["batch_invariant"]) and checked bit for bit
    deterministic: bool = False  # run-to-run determinism declared (policies["deterministic"]) and checked bit for bit

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self.direction = Direction(self.direction).value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        return cls(**_known(cls, data))
