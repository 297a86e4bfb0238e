"""How a check talks to an implementation and reports a failure.

A *check* (see ``conformance/checks/``) is a function ``check(impl, dtype, **args)`` of plain
float64/int64/bool NumPy arrays and Python scalars. It converts the arrays with the
implementation's own ``from_numpy`` (so they are rounded to ``dtype``), reads back exactly what the
implementation saw (``to_numpy``), runs the oracle on those values, calls the implementation, and
compares with a derived budget (``conformance/budgets/forward.py``) through ``run/comparison.py``, which also names
the departure a failing output matches. A failure's inputs become a replay file (``run/failures.py``).

Everything an implementation can do wrong inside a call — raise, return the wrong shape, a
non-array, NaN, values not in its dtype, a different answer the second time, modify its input —
becomes a :class:`ConformanceFailure` (an ``AssertionError``) of that one check, with a message
naming the equation and paper section, the worst element, the error as a multiple of its budget,
the input shapes and dtypes, and a replay command; the failing inputs are saved as ``.npz``.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.conformance.diagnoses.forward import PRECISION_DEPARTURES, agreeing, explain
from aiayn.conformance.directions import FORWARD
from aiayn.conformance.equations import title
from aiayn.conformance.numerics import first_index, is_representable
from aiayn.conformance.report.results import Counts, TestResult
from aiayn.conformance.run import isolation
from aiayn.conformance.run.boundary import Native, ProcessEnded, Remote, call_each
from aiayn.conformance.run.failures import save, save_case
from aiayn.implementations.protocol import Unsupported, flushes_subnormals

__all__ = [
    "CHECKS",
    "Case",
    "BrokenContract",
    "ConformanceFailure",
    "NaNMismatch",
    "OverBudget",
    "Stats",
    "check",
    "current_stats",
]

#: name -> the registered check (a function ``(impl, dtype, **args)``); filled by ``aiayn.conformance.checks``.
CHECKS: dict[str, Callable[..., None]] = {}


class ConformanceFailure(AssertionError):
    """A check found the implementation disagreeing with the paper; the message says how and how to replay.

    The subclasses name the kind of failure. Hypothesis tells distinct failures of one test apart
    by their exception type (and origin), so a NaN where the oracle has a number and an error over
    budget on other inputs are reported as two failures, each with its own message and replay file.
    """


class OverBudget(ConformanceFailure):
    """The result differs from the expected value by more than the derived budget."""


class NaNMismatch(ConformanceFailure):
    """NaN where the expected value is a number, or a number where it is NaN (a fully masked row)."""


class BrokenContract(ConformanceFailure):
    """The call broke the contract: raised, wrong shape, dtype or device, mutated an input, not deterministic."""


class UnsupportedInput(Exception):
    """The implementation raised ``Unsupported`` for this example: counted (``Stats.unsupported``), never a failure."""


# --------------------------------------------------------------------------------------------
# statistics for the report (collected per test by the plugin, run/plugin.py)


@dataclass(kw_only=True)
class Stats(Counts):
    """What the checks of one test saw, for its report row: its :class:`~aiayn.conformance.report.results.Counts`,
    accumulated (the named departures, violations and notes as sets), and ``files``, the replay files written.
    ``largest`` also keeps the lines that lead the failure message of the shrunk example."""

    departures: set[str] = field(default_factory=set)
    violations: set[str] = field(default_factory=set)
    notes: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)

    def result(self, **identity: Any) -> TestResult:
        """The test's typed result: ``identity`` (spec, equation, dtype, test, outcome, nodeid, reason, crash)
        and what its checks saw."""
        counts = {f.name: copy.copy(getattr(self, f.name)) for f in fields(Counts)}
        return TestResult(
            **identity,
            **{
                **counts,
                "departures": sorted(self.departures | set((self.largest or {}).get("departures") or ())),
                "violations": sorted(self.violations),
                "notes": sorted(self.notes),
                "largest": None if self.largest is None else {k: v for k, v in self.largest.items() if k != "lines"},
            },
        )


_STATS: contextvars.ContextVar[Stats | None] = contextvars.ContextVar("aiayn_stats", default=None)


@contextlib.contextmanager
def timed(part: str) -> Iterator[None]:
    """Add the time of the block to the current test's ``seconds[part]`` (``report.results.TIME_PARTS``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        stats = _STATS.get()
        if stats is not None:
            stats.seconds[part] = stats.seconds.get(part, 0.0) + time.perf_counter() - start


def current_stats() -> contextvars.ContextVar[Stats | None]:
    """The context variable the conftest sets to a fresh :class:`Stats` around each test."""
    return _STATS


# --------------------------------------------------------------------------------------------
# a case: one call of one check


@dataclass(frozen=True)
class Diagnosis:
    """What ``diagnoses.forward.explain`` needs to name the departure a failing agreement check matches.

    ``args``: the oracle's arguments for ``equation`` (the rounded inputs the implementation saw,
    and the declared policies); ``budget_at(dtype, values=None, ops=None)``: the check's budget computed for a
    dtype, at the oracle's values or at ``values`` (a departure's own output, for a departure computed at another
    arithmetic),
    derived for the departure's operations ``ops`` where the budget depends on them (the positional table's);
    ``model`` and ``departures``: the equation's model in the diagnoses and the catalogue families that concern it
    (its record's).
    """

    equation: str
    args: Mapping[str, Any]
    budget_at: Callable[..., np.ndarray]
    model: Callable[..., np.ndarray]
    departures: frozenset[str]

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        return explain(self.model, self.departures, self.args, got, self.budget_at, dtype)

    def agreeing(self, names: list[str], got: np.ndarray, dtype: str) -> list[str]:
        """Which of ``names`` agree with ``got`` on these inputs, each alone (``diagnoses.forward.agreeing``)."""
        return agreeing(names, self.model, self.args, got, self.budget_at, dtype)


#: The dtype names of the contract (``implementations/protocol.py``: ``DTYPES`` and the index dtypes).
_CONTRACT_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "bool")


def contract_dtype_name(native_dtype: Any) -> str | None:
    """The contract's name of a native dtype, by meaning: what NumPy makes of it (NumPy, JAX, ml_dtypes, anything
    ``np.dtype`` accepts), else a printed name that ends in a contract name after its last dot (``torch.float32``);
    None when neither tells (a library's own names, e.g. ``dtypes.double``): the values decide alone."""
    if not isinstance(native_dtype, str):  # np.dtype("float") is float64: a printed name is read as text only
        try:
            return np.dtype(native_dtype).name
        except (TypeError, ValueError):
            pass
    text = str(native_dtype).rsplit(".", 1)[-1]
    return text if text in _CONTRACT_DTYPES else None


def same_device(native: Any, declared: str) -> bool:
    """A result's device is the declared one, by meaning: case aside, the same name, the same with an index
    (``cuda`` and ``cuda:0``), or the declared name as one word of the native one (JAX's ``TFRT_CPU_0``)."""
    got, want = str(native).strip().lower(), declared.strip().lower()
    if got == want or got.startswith(want + ":") or want.startswith(got + ":"):
        return True
    return ":" not in want and want in re.split(r"[^a-z0-9]+", got)


@dataclass
class Case:
    """One run of a check: which implementation, dtype, check and equation, and the raw arguments."""

    impl: Any
    dtype: str
    check: str
    equation: str
    args: dict[str, Any]
    kind: str  # "agreement" (counts towards the report's headroom), "property" or "contract"
    # set by the check's helper: what the diagnoses need if an agreement check fails (a Diagnosis, or a gradient's
    # diagnoses.backward.BackwardDiagnosis)
    diagnosis: Any = None
    violates: str = ""  # a property check: the statement of the paper its failure breaks (the check's own name for it)
    arithmetic_as: str | None = None  # a property re-checked at another arithmetic (explained_by_arithmetic)
    direction: str = FORWARD  # BACKWARD: the check reads the implementation's gradients (gradients.py)
    rerun: Callable[[str], None] | None = field(default=None, repr=False)  # the check again, at an arithmetic
    # set by the check's recipe: which candidate departures agree with the implementation on another case's input
    # (the recipe run again there; None: the input tells nothing), to tell candidates apart
    survivors: Callable[[Case, list[str]], list[str] | None] | None = field(default=None, repr=False)
    # id(native) -> (native, shape, dtype) of what from_numpy made in this case: to_numpy must give that shape back
    _made: dict[int, tuple[Any, tuple[int, ...], str]] = field(default_factory=dict, init=False, repr=False)

    @property
    def title(self) -> str:
        return title(self.equation) + (f", {self.direction}" if self.direction != FORWARD else "")

    @property
    def arithmetic(self) -> str:
        """The precision the budgets assume: the dtype, or "<dtype>-ftz" where the implementation declares that this
        equation flushes subnormal results to zero in this dtype (policy ``flush_subnormals``,
        ``implementations/protocol.py``)."""
        if self.arithmetic_as is not None:
            return self.arithmetic_as
        flushed = flushes_subnormals(getattr(self.impl, "policies", None), self.equation, self.dtype)
        return f"{self.dtype}-ftz" if flushed else self.dtype

    def explained_by_arithmetic(self) -> str | None:
        """For a failing property: the precision departure under whose arithmetic the same check holds on the same
        inputs (the implementation called again), else None.

        "float32 inside a float64 claim" (float64 checks) and "subnormal results flushed to zero" (the dtype with
        subnormals flushed), as ``diagnoses.forward.explain`` names them for agreement checks. The property's own budget
        is derived from the arithmetic (``case.arithmetic``), so re-checking at another arithmetic is the same theorem
        with another unit roundoff; and every output the property reads must agree with the oracle within that
        arithmetic's budget too (``checks/_common.agreement``), so an algebraic departure small enough to hide in a
        wider budget is not taken for the arithmetic.
        """
        if self.rerun is None or self.arithmetic_as is not None:
            return None
        candidates = [("float32", "float32")] if self.dtype == "float64" else []
        if not self.arithmetic.endswith("-ftz"):
            candidates.append(("ftz", f"{self.dtype}-ftz"))
            if self.dtype == "float64":  # both at once, where neither alone holds
                candidates.append(("float32-ftz", "float32-ftz"))
        outer = _STATS.get()
        named = set() if outer is None else set(outer.files)  # this failure's own replay file among them
        for kind, arithmetic in candidates:
            scratch = Stats()
            token = _STATS.set(scratch)
            try:
                self.rerun(arithmetic)
            except Exception:  # fails there too (or cannot be re-checked): not explained by this arithmetic
                continue
            finally:
                _STATS.reset(token)
                for path in set(scratch.files) - named:  # the re-check's own replay files: no message names them
                    Path(path).unlink(missing_ok=True)
            return PRECISION_DEPARTURES[kind]
        return None

    # ---- calling the implementation

    def native(self, value: Any, dtype: str | None = None) -> Any:
        """The implementation's native version of a (nested) argument: floats in ``dtype`` (default the case's)."""
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        dtype = dtype or self.dtype
        leaves: list[np.ndarray] = []

        def collect(v: Any) -> None:
            if isinstance(v, Mapping):
                for x in v.values():
                    collect(x)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    collect(x)
            elif isinstance(v, np.ndarray):
                leaves.append(v)

        collect(value)
        targets = ["bool" if v.dtype == np.bool_ else "int64" if v.dtype.kind in "iu" else dtype for v in leaves]
        whats = [f"from_numpy(<{v.dtype} {v.shape}>, {t!r})" for v, t in zip(leaves, targets)]
        made = iter(self._each("from_numpy", whats, [(v, t) for v, t in zip(leaves, targets)]))
        checked = iter(zip(leaves, targets, whats))

        def rebuilt(v: Any) -> Any:
            if isinstance(v, Mapping):
                return {k: rebuilt(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [rebuilt(x) for x in v]
            if not isinstance(v, np.ndarray):
                return v
            out, (array, target, what) = next(made), next(checked)
            if out is None or (isinstance(out, _NOT_NATIVE) and not isinstance(out, np.generic)):
                self.fail(
                    f"{what} returned {_what_it_is(out)}, expected a native array "
                    "(the contract's from_numpy: implementations/protocol.py)"
                )
            self._made[id(out)] = (out, array.shape, target)
            return out

        return rebuilt(value)

    def numpy(self, native: Any, what: str) -> Any:
        """``to_numpy`` of a (nested) native value, checked to be an ndarray (floats come back as float64)."""
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        return self.numpy_all([(what, native)])[0]

    def numpy_all(self, natives: list[tuple[str, Any]]) -> list[Any]:
        """:meth:`numpy` of each ``(what, native)`` (one exchange across the process boundary for them all)."""
        __tracebackhide__ = True
        arrays = iter(self.numpy_each(_leaves_of(natives)))

        def rebuilt(v: Any) -> Any:
            if isinstance(v, Mapping):
                return {k: rebuilt(x) for k, x in v.items()}
            if isinstance(v, list):
                return [rebuilt(x) for x in v]
            if v is None or isinstance(v, (int, float, str, bool)):
                return v
            return next(arrays)

        return [rebuilt(native) for _, native in natives]

    def numpy_each(self, natives: list[tuple[str, Any]]) -> list[np.ndarray]:
        """``to_numpy`` of each ``(what, native)``, each checked as :meth:`numpy` checks (one exchange across the
        process boundary for them all)."""
        __tracebackhide__ = True
        got = self._each("to_numpy", [f"to_numpy({what})" for what, _ in natives], [(n,) for _, n in natives])
        return [self._checked_array(arr, native, what) for arr, (what, native) in zip(got, natives)]

    def _each(self, method: str, whats: list[str], calls: list[tuple[Any, ...]], what: str = "") -> list[Any]:
        """The answers of ``method`` to each argument tuple of ``calls`` (described by ``whats``), each call guarded:
        one exchange for them all where the implementation is in a process of its own (``run/boundary.py``), the first
        that raised failing as it would alone; ``what`` describes them all (default: the method and the count)."""
        __tracebackhide__ = True
        if len(calls) < 2 or not isinstance(self.impl, Remote):
            return [self.guard(what, getattr(self.impl, method), *args) for what, args in zip(whats, calls)]
        what = what or f"{method}(<{len(calls)} calls>)"
        answers, raised = self.guard(what, call_each, self.impl, method, calls)
        if len(answers) < len(calls):
            if raised is None:
                self.fail(f"{what} gave {len(answers)} answers, expected {len(calls)}")
            self.guard(whats[len(answers)], _reraise, raised)
        return answers[: len(calls)]

    def _checked_array(self, arr: Any, native: Any, what: str) -> np.ndarray:
        __tracebackhide__ = True
        if type(arr) is not np.ndarray:  # a subclass (np.matrix, a masked array) indexes and sums by its own rules
            self.fail(f"to_numpy({what}) returned {_what_it_is(arr)}, expected a numpy.ndarray")
        if arr.dtype.kind not in "fiub":  # object, str, complex arrays would be converted, not read, by float64 casts
            self.fail(
                f"to_numpy({what}) returned an array of dtype {arr.dtype}; the contract says float64 for floats, "
                "int64 for ids and bool for masks"
            )
        if arr.dtype.kind == "f" and arr.dtype != np.float64:
            self.fail(
                f"to_numpy({what}) returned dtype {arr.dtype}; the contract says float results come back as float64"
            )
        made = self._made.get(id(native))
        if made is not None and made[0] is native:
            _, shape, target = made
            if arr.shape != shape:
                self.fail(
                    f"to_numpy({what}) returned shape {arr.shape} for what from_numpy made of a {shape} array: "
                    "from_numpy and to_numpy must keep shapes"
                )
            if arr.dtype.kind not in {"bool": "b", "int64": "iu"}.get(target, "f"):
                self.fail(
                    f"to_numpy({what}) returned dtype {arr.dtype} for what from_numpy made as {target}: "
                    "the contract says floats come back as float64, ids as int64, masks as bool"
                )
        return arr

    def guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into the implementation under the time limit (``run/isolation.py``); anything it raises becomes this
        check's failure."""
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        try:
            with timed("implementation"), isolation.calling(self, what, save_case), warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore", RuntimeWarning
                )  # the results are judged, not the warnings (poison overflows on purpose)
                return fn(*args)
        except ConformanceFailure:
            raise
        except Unsupported as exc:
            raise UnsupportedInput(f"{what}: {exc}") from None
        except MemoryError:
            self.fail(f"{what} raised MemoryError (inputs: {self.describe_inputs()})")
        except ProcessEnded as exc:  # os._exit, a signal, a segfault in the implementation's own process
            raise isolation.ProcessCrashed(self.crash_message(what, str(exc)), exc.cause) from None
        except SystemExit as exc:  # sys.exit() inside the implementation: this check's failure, the run goes on
            self.fail(
                f"{what} tried to end the process (SystemExit({exc.code!r})); an implementation reports a problem "
                "by raising an exception"
            )
        except Exception as exc:  # a plugin's own error fails this check, never the run
            self.fail(f"{what} raised {type(exc).__name__}: {exc}")

    def describe_inputs(self) -> str:
        """The inputs' names, dtypes and shapes, as failure messages show them."""
        return _describe_args(self.args, self.dtype)

    def timeout_message(self, what: str, limit: float) -> str:
        """The failure message of a call that did not return within ``limit`` seconds (inputs saved for replay)."""
        path = self.save()
        return "\n".join(
            [
                f"{self.title}: {what} did not return within {limit:g} s "
                "(the per-call time limit; aiayn check --timeout)",
                f"  implementation {getattr(self.impl, 'name', '?')} on {getattr(self.impl, 'device', '?')}, "
                f"dtype {self.dtype}; check {self.check}",
                f"  inputs: {self.describe_inputs()}",
                f"  replay: aiayn replay {path}",
            ]
        )

    def crash_message(self, what: str, how: str) -> str:
        """The failure message of a call during which the implementation's process ended (inputs saved for replay)."""
        path = self.save()
        return "\n".join(
            [
                f"{self.title}: {what}: {how}",
                f"  implementation {getattr(self.impl, 'name', '?')} on {getattr(self.impl, 'device', '?')}, "
                f"dtype {self.dtype}; check {self.check}",
                f"  inputs: {self.describe_inputs()}",
                f"  replay: aiayn replay {path}   (in this process: expect the same crash)",
            ]
        )

    def call(self, method: str, *native_args: Any) -> Any:
        """Call equation ``method`` with native arguments; raise a failure if it raises."""
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        fn = getattr(self.impl, method)
        shown = ", ".join(_describe_native(a) for a in native_args)
        return self.guard(f"{self.impl.name}.{method}({shown})", fn, *native_args)

    def run(
        self,
        method: str,
        native_args: list[Any],
        *,
        out_dtype: str | None = None,
        repeat: bool = True,
        parts: tuple[str, ...] | Mapping[str, tuple[int, ...]] = (),
        part_dtypes: Mapping[str, str] | None = None,
    ) -> np.ndarray:
        """Call ``method`` with hygiene checks; return the result as float64.

        Hygiene: inputs not mutated; the result is an array of the
        declared dtype (its native ``dtype`` attribute if it has one, and every value exactly
        representable in that dtype) on the declared device (its ``device`` attribute if any);
        and the same bits when called twice with the same inputs. ``parts``: the method returns several arrays, each
        checked so: a tuple of names (Adam's step: param, m, v), a tuple of arrays of one shape, returned stacked
        (len(parts), ...); a mapping of names to shapes (averaged checkpoints: parameter name -> shape), a mapping of
        exactly those names to arrays of those shapes, returned flattened and concatenated in the mapping's order.
        ``part_dtypes``: a part's dtype where it is not the call's (dropout's mask: "bool").
        """
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        out_dtype = out_dtype or self.dtype
        before = _snapshot(self, native_args)
        if repeat and isinstance(self.impl, Remote):  # both calls in one exchange across the process boundary
            shown = f"{self.impl.name}.{method}({', '.join(_describe_native(a) for a in native_args)})"
            out, again = self._each(method, [shown, shown], [tuple(native_args)] * 2, f"{shown} (called twice)")
        else:
            out = self.call(method, *native_args)
            again = self.call(method, *native_args) if repeat else None
        inputs = _natives_in(native_args)
        # the inputs after the calls and the results in one exchange (one per array, where the results are nested)
        results = [(f"{method}(...)", out), (f"{method}(...) (second call)", again)][: 2 if repeat else 1]
        single = not parts and all(_is_leaf(r) for _, r in results)
        arrays = self.numpy_each(inputs + (results if single else []))
        after = [(path, np.array(a, copy=True)) for (path, _), a in zip(inputs, arrays)]
        for path, (b, a) in _paired(before, after):
            if not _same_bits(a, b):
                where = first_index(~_equal_nan(a, b)) if a.shape == b.shape else ()
                self.fail(
                    f"{method} modified its input {path} in place"
                    + (f" (first change at index {where})" if where else "")
                )
        if parts:
            return self._parts(method, parts, out, again, out_dtype, part_dtypes or {})
        got = arrays[len(inputs)] if single else self.numpy(out, f"{method}(...)")
        if not isinstance(got, np.ndarray):
            self.fail(f"{method} returned {type(out).__name__}, expected a native array")
        self._check_native_dtype(out, got, out_dtype, method)
        self._check_device(out, method)
        if again is not None:
            got2 = arrays[len(inputs) + 1] if single else self.numpy(again, f"{method}(...) (second call)")
            if got2.shape != got.shape or not _same_bits(got, got2):
                diff = _first_difference(got, got2)
                self.fail(f"{method} is not deterministic: two calls with the same inputs differ{diff}")
        return got

    def _parts(
        self,
        method: str,
        parts: tuple[str, ...] | Mapping[str, tuple[int, ...]],
        out: Any,
        again: Any,
        dtype: str,
        part_dtypes: Mapping[str, str],
    ) -> np.ndarray:
        """The arrays of a method that returns several (:meth:`run`'s ``parts``): the answer's type and its length or
        keys first, then each array as :meth:`run` checks one (dtype, device, shape, the same bits when called
        again)."""
        __tracebackhide__ = True
        keyed = isinstance(parts, Mapping)
        names = list(parts)
        calls = [(f"{method}(...)", out)] + ([(f"{method}(...) (second call)", again)] if again is not None else [])
        listed = []
        for what, result in calls:
            if keyed:
                if not isinstance(result, Mapping) or set(result) != set(names):
                    keys = f" with keys {sorted(map(str, result))}" if isinstance(result, Mapping) else ""
                    self.fail(f"{what} returned {_what_it_is(result)}{keys}, expected a mapping of {sorted(names)}")
                result = [result[name] for name in names]
            elif not isinstance(result, (tuple, list)) or len(result) != len(names):
                size = f" of {len(result)} items" if isinstance(result, (tuple, list)) else ""
                self.fail(
                    f"{what} returned {_what_it_is(result)}{size}, expected a tuple of {len(names)} native arrays "
                    f"({', '.join(names)})"
                )
            for name, r in zip(names, result):
                if not _is_leaf(r) or isinstance(r, tuple):
                    self.fail(f"{what}'s {name} is {_what_it_is(r)}, expected a native array")
            listed.append((what, result))
        named = [(f"{what}'s {name}", r) for what, result in listed for name, r in zip(names, result)]
        arrays = self.numpy_each(named)
        got = arrays[: len(names)]
        for name, (what, native), array in zip(names, named, got):
            wanted = part_dtypes.get(name, dtype)
            if wanted == "bool" and array.dtype != np.bool_:
                self.fail(f"{what} came back as {array.dtype} values, expected a bool array")
            self._check_native_dtype(native, array, wanted, what)
            self._check_device(native, what)
        wanted = [tuple(parts[name]) for name in names] if keyed else [got[0].shape] * len(names)
        if [a.shape for a in got] != wanted:
            shapes = ", ".join(f"{name} {a.shape}" for name, a in zip(names, got))
            expected = ", ".join(f"{name} {shape}" for name, shape in zip(names, wanted)) if keyed else "one shape"
            self.fail(f"{method} returned arrays of shapes {shapes}; expected {expected}")
        for name, first, second in zip(names, got, arrays[len(names) :]):
            if second.shape != first.shape or not _same_bits(first, second):
                self.fail(
                    f"{method} is not deterministic: two calls with the same inputs differ in {name}"
                    f"{_first_difference(first, second)}"
                )
        return np.concatenate([a.reshape(-1) for a in got]) if keyed else np.stack(got)

    def _check_native_dtype(self, out: Any, got: np.ndarray, dtype: str, method: str) -> None:
        """The result is in ``dtype`` by meaning: its native dtype, named as the contract names dtypes
        (:func:`contract_dtype_name`), is ``dtype`` where a name can be read; and every value is a ``dtype`` number."""
        native_dtype = getattr(out, "dtype", None)
        name = None if native_dtype is None else self.native_dtype_name(native_dtype)
        if name is not None and name != dtype:
            shown = f"{native_dtype}" + ("" if str(native_dtype) == name else f" ({name})")
            self.fail(f"{method} returned native dtype {shown}, expected {dtype}")
        if got.dtype.kind == "f":
            bad = ~is_representable(got, dtype)
            if np.any(bad):
                where = first_index(bad)
                self.fail(
                    f"{method} returned values that are not {dtype} numbers (e.g. {got[where]!r} at {where}): "
                    f"the result was not rounded to the declared dtype"
                )

    def native_dtype_name(self, native_dtype: Any) -> str | None:
        """The contract's name of ``native_dtype`` (the implementation's ``dtype_name`` hook if it has one); a hook
        that raises fails the check."""
        hook = getattr(self.impl, "dtype_name", None)
        if callable(hook):
            what = f"{self.impl.name}.dtype_name({native_dtype!r})"
            name = self.guard(what, hook, native_dtype)
            if name is not None and type(name) is not str:  # compared with the dtype: its own == must not decide
                self.fail(f"{what} returned {_what_it_is(name)}, expected a dtype name (str) or None")
            return name
        return contract_dtype_name(native_dtype)

    def _check_device(self, out: Any, method: str) -> None:
        device = getattr(out, "device", None)
        if device is None or callable(device) or not isinstance(self.impl.device, str):
            return
        if not same_device(device, self.impl.device):
            self.fail(f"{method} returned an array on device {str(device)!r}, declared device {self.impl.device!r}")

    # ---- failing

    def save(self) -> Path:
        """Write this case's inputs as a replay file (one file per distinct input) and remember it in the test's
        stats."""
        path = save(self)
        stats = _STATS.get()
        if stats is not None and str(path) not in stats.files:
            stats.files.append(str(path))
        return path

    def fail(
        self,
        problem: str,
        details: list[str] | None = None,
        kind: type[ConformanceFailure] = BrokenContract,
        ratio: float | None = None,
        breaks_property: bool | None = None,
    ) -> None:
        """Save the inputs for replay and raise the failure message (of class ``kind``).

        In a property check, a failure of the property itself (``breaks_property``; default: an
        over-budget or NaN mismatch, not a crash or a broken contract) names what it breaks.

        When this test found a larger over-budget discrepancy on other inputs than the one failing
        now (Hypothesis reports the smallest failing example, not the worst), the message leads
        with that one, and names its replay file too.
        """
        __tracebackhide__ = True  # the failure message says it all; pytest shows the check, not the harness
        path = self.save()
        impl = self.impl
        stats = _STATS.get()
        if breaks_property is None:
            breaks_property = kind in (OverBudget, NaNMismatch)
        explained = None
        if self.kind == "property" and self.violates and breaks_property:
            explained = self.explained_by_arithmetic()
        if explained is not None:  # not a separate defect: the arithmetic the agreement checks name explains it
            problem += (
                f"; the output matches '{explained}': at that arithmetic this property holds on these inputs "
                f"('{self.violates}')"
            )
            if stats is not None:
                stats.departures.add(explained)
        elif self.kind == "property" and self.violates and breaks_property:  # the property's own name for it
            problem += f"; this breaks what the paper states: '{self.violates}'"
            if stats is not None:
                stats.violations.add(self.violates)
        lines = [f"{self.title}: {problem}"]
        largest = None if stats is None else stats.largest
        if largest is not None and largest["replay"] != str(path) and (ratio is None or largest["ratio"] > ratio):
            names = [f"'{n}'" for n in largest.get("departures") or []]
            matched = (
                f", the output matches {names[0]}"
                if len(names) == 1
                else f", candidates not told apart: {', '.join(names)}"
                if names
                else ""
            )
            lines += [
                f"  largest discrepancy found for this check: {largest['ratio']:.3g} x budget, {largest['where']}"
                + matched
                + f"; inputs {largest['inputs']}; replay: aiayn replay {largest['replay']}",
                "  the smallest failing example Hypothesis found:",
            ]
        lines += [
            f"  implementation {getattr(impl, 'name', '?')} ({getattr(impl, 'version', '?')}) "
            f"on {getattr(impl, 'device', '?')}, dtype {self.dtype}; check {self.check}",
            *(details or []),
            f"  inputs: {_describe_args(self.args, self.dtype)}",
            f"  replay: aiayn replay {path}",
        ]
        raise kind("\n".join(lines))

    def tally(
        self,
        *,
        checked: int = 0,
        unchecked: Mapping[str, int] | None = None,
        exact: int = 0,
        ratio: float | None = None,
    ) -> None:
        """Count what one comparison checked (and could not), and its worst error / budget, for the report."""
        stats = _STATS.get()
        if stats is None:
            return
        stats.checked += int(checked)
        stats.exact += int(exact)
        for reason, n in (unchecked or {}).items():
            if n:
                stats.unchecked[reason] = stats.unchecked.get(reason, 0) + int(n)
        if self.kind == "agreement" and ratio is not None and np.isfinite(ratio):
            stats.worst = float(ratio) if stats.worst is None else max(stats.worst, float(ratio))

    def apart(self, arrangement: str, ulps: float) -> None:
        """Note that ``arrangement`` (one of ``report.results.APART``) came out ``ulps`` from the example computed
        alone: the report keeps the most."""
        stats = _STATS.get()
        if stats is not None and np.isfinite(ulps):
            stats.apart[arrangement] = max(stats.apart.get(arrangement, 0.0), float(ulps))

    def exact_checks(self, n: int = 1) -> None:
        """Count ``n`` checks with zero tolerance that passed (the contract, exact policies)."""
        self.tally(checked=n, exact=n)


def check(
    equation: str, kind: str = "agreement", violates: str = "", direction: str = FORWARD
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a check function ``fn(case, **args)`` of ``equation`` as ``check(impl, dtype, **args)``.

    The function's name is the check's one identifier: its test is ``test_<name>``, its replay files and
    report lines name it, and an implementation's ``known_deviations`` declare it (with a test's parameters
    and dtype, as ``name[param]@dtype``).

    ``violates`` (property checks, required there): what the paper states that a failure of the property
    breaks, with its section, e.g. "a masked key is as if removed (§3.2.3)". A failing property check names
    it, in its message and in the report, as an agreement check names the catalogued departure its output
    matches. ``direction``: "backward" for a check of the implementation's gradients (its report row is the
    equation's backward row).
    """

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        name = fn.__name__
        if kind == "property" and not violates:
            raise ValueError(
                f"check {name!r}: a property check states what the paper says that its failure breaks (violates=)"
            )

        @functools.wraps(fn)
        def run(impl: Any, dtype: str, **args: Any) -> None:
            stats = _STATS.get()
            if stats is not None:
                stats.examples += 1
            case = Case(impl, dtype, name, equation, args, kind, violates=violates, direction=direction)
            if kind == "property":
                case.rerun = lambda arithmetic: fn(
                    Case(
                        impl,
                        dtype,
                        name,
                        equation,
                        args,
                        kind,
                        violates=violates,
                        arithmetic_as=arithmetic,
                        direction=direction,
                    ),
                    **args,
                )
            try:
                fn(case, **args)
            except UnsupportedInput as exc:  # outside what the implementation supports: counted, not a failure
                if stats is not None:
                    stats.unsupported += 1
                    stats.unsupported_why = stats.unsupported_why or str(exc)[:300]

        run.equation = equation  # type: ignore[attr-defined]
        run.direction = direction  # type: ignore[attr-defined]
        CHECKS[name] = run
        return run

    return decorate


# --------------------------------------------------------------------------------------------
# helpers: snapshots, descriptions, saving and loading


def _snapshot(case: Case, natives: list[Any]) -> list[tuple[str, np.ndarray]]:
    """``(path, array)`` of every native array among ``natives`` (a mapping's and a list's too), copied."""
    found = _natives_in(natives)
    return [(path, np.array(a, copy=True)) for (path, _), a in zip(found, case.numpy_each(found))]


def _is_leaf(value: Any) -> bool:
    """A native value by itself: not None, a Python scalar, a mapping or a list (which ``Case.numpy`` walks)."""
    return not (value is None or isinstance(value, (Mapping, list, int, float, str, bool)))


def _natives_in(natives: list[Any]) -> list[tuple[str, Any]]:
    """``(path, native)`` of every native array among the arguments ``natives``, mappings and lists walked."""
    return _leaves_of([(f"argument {i}", v) for i, v in enumerate(natives)])


def _leaves_of(values: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(path, native)`` of every native array in each ``(what, value)``, mappings and lists walked."""
    found: list[tuple[str, Any]] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                walk(x, f"{path}[{k!r}]")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        elif v is not None and not isinstance(v, (int, float, str, bool)):
            found.append((path, v))

    for what, v in values:
        walk(v, what)
    return found


def _reraise(exc: BaseException) -> None:
    """Raise what a call made across the process boundary raised (under ``Case.guard``, which names it)."""
    raise exc


def _paired(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]):
    return [(pa, (xa, xb)) for (pa, xa), (_, xb) in zip(a, b)]


def _equal_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return a == b


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        eq = _equal_nan(a, b) & (np.signbit(a) == np.signbit(b))
        return bool(np.all(eq))
    return bool(np.array_equal(a, b))


def _first_difference(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f" (shapes {a.shape} and {b.shape})"
    i = first_index(~(_equal_nan(a, b) & (np.signbit(a) == np.signbit(b))))
    return f" (first at index {i}: {a[i]!r} then {b[i]!r})"


#: What ``from_numpy`` cannot mean as a native array: the values the suite passes through unconverted.
_NOT_NATIVE = (bool, int, float, complex, str, bytes, Mapping, list, tuple)


def _what_it_is(value: Any) -> str:
    """``None``, or the type of ``value`` with a short repr, for a message about a wrong return value."""
    if value is None:
        return "None"
    if isinstance(value, Native):  # kept in the implementation's process: its type there
        return f"{value.type_name} {value}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + ' ...' if len(text) > 60 else text}"


def _describe_native(v: Any) -> str:
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {_describe_native(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return f"[{len(v)} items]"
    shape = getattr(v, "shape", None)
    if shape is not None:
        return f"<{str(getattr(v, 'dtype', '?')).rsplit('.', 1)[-1]} {tuple(shape)}>"
    return repr(v)


def _describe_args(args: Mapping[str, Any], dtype: str) -> str:
    def one(v: Any) -> str:
        if isinstance(v, np.ndarray):
            kind = "bool" if v.dtype == np.bool_ else "int64" if v.dtype.kind in "iu" else dtype
            return f"{kind} {v.shape}"
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)) and v and all(type(x) in (int, float) for x in v) and len(v) <= 16:
            return repr(list(v))  # a few numbers (cut points, lengths, Adam's betas): shown as they are
        if isinstance(v, (list, tuple)):
            return f"[{len(v)} x {one(v[0])}]" if v else "[]"
        return repr(v)

    text = "; ".join(f"{k} {one(v)}" for k, v in args.items())
    return text if len(text) < 600 else text[:600] + " ..."
