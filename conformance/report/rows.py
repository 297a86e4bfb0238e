"""The conformance report: ``conformance-<impl>.md`` and ``.json``, one row per equation x dtype.

For each equation of ``aiayn.implementations.protocol.EQUATIONS`` and each dtype the implementation
declares: the status (pass / fail / inconclusive / known deviation / not provided / not run), the
examples the checks ran, the elements checked against a budget that applies and those not checked
(with the reasons; ``report/coverage.py`` states how many may be), the worst agreement error as a fraction
of its budget among the checked elements, and the headroom (budget / worst error). Where no
number applies the cell says what happened (contract, NaN mismatch, not measured, crash, hang).
``lrate`` and ``label_smoothing`` take no float input, so they are checked in the first (most
precise) dtype only; their other dtypes read "n/a".

Regeneration is deterministic under the derandomized ``ci`` profile: no timestamps; the signature
line (``aiayn.kit.signature``) names the implementation, its version, the profile, the seed and the
commit of aiayn itself. The same cells, one line per equation, end every ``aiayn check`` run
(:func:`summary_lines`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.conformance.directions import BACKWARD, DECODE, FORWARD, SPLIT
from aiayn.conformance.equations import CONTRACT, RECORDS, title, unjudged
from aiayn.conformance.report.coverage import MAX_UNSUPPORTED, OUT_OF_SCOPE, declared_inconclusive, max_unchecked
from aiayn.conformance.report.results import APART, NO_MATCH, Outcome, Row, Status, TestResult
from aiayn.conformance.run.boundary import Remote, flushes, isolation
from aiayn.implementations.protocol import DTYPES, EQUATIONS, flushes_subnormals, scope_of
from aiayn.kit import Report, Scope, md_table, write_report


def _unjudged(row: Row) -> float:
    """The fraction of the row's elements the suite could not judge: not checked, less those no caller defines
    (``equations.unjudged``: counted, shown, never a reason for "inconclusive")."""
    judged_out = sum(unjudged(row.not_checked_reasons).values())
    undefined = sum(row.not_checked_reasons.values()) - judged_out
    total = row.checked + row.not_checked - undefined
    return (row.not_checked - undefined) / total if total > 0 else 0.0


def _typed(results: Iterable[TestResult | Mapping[str, Any]]) -> list[TestResult]:
    return [r if isinstance(r, TestResult) else TestResult.from_dict(r) for r in results]


def directions(equation: str) -> tuple[str, ...]:
    """The report rows an equation has: "forward", "backward" where its record has a backward pass, "decode" where it
    has decoding, "split keys" where it has a split over blocks of keys."""
    record = RECORDS.get(equation)
    if record is None:
        return (FORWARD,)
    return (
        (FORWARD,)
        + ((BACKWARD,) if record.backward is not None else ())
        + ((DECODE,) if record.decode else ())
        + ((SPLIT,) if record.split else ())
    )


def section(equation: str, direction: str = FORWARD) -> str:
    """A row's name in the report: the equation's title, and ", backward" for its gradients' row."""
    return title(equation) + (f", {direction}" if direction != FORWARD else "")


def _row(equation: str, dtype: str, results: list[TestResult], impl: Any, direction: str = FORWARD) -> Row:
    """Summarise the test results of one (equation, dtype, direction): what ran, what was checked, what was not, the
    verdict."""
    shown = dtype if equation != CONTRACT else "all"
    row = Row(equation, section(equation, direction), shown, Status.NOT_RUN, direction)
    if not results:
        return row
    failed = sorted({r.test for r in results if r.outcome is Outcome.FAILED})
    deviations = {r.test: r.reason for r in results if r.outcome is Outcome.KNOWN_DEVIATION}
    ran = [r for r in results if r.outcome in (Outcome.PASSED, Outcome.FAILED)]
    out_of_scope = sorted({r.test for r in results if r.outcome is Outcome.SKIPPED and OUT_OF_SCOPE in r.reason})
    scope = scope_of(impl, equation).describe(direction) if impl is not None and equation != CONTRACT else "full domain"
    if flushes_subnormals(getattr(impl, "policies", None), equation, dtype):  # the budgets assumed FTZ arithmetic
        scope = f"{scope}; subnormals flushed to zero (declared)"
    counted = [r for r in results if r.counted]
    not_provided = any("not provided" in r.reason for r in results)
    row.checked = int(sum(r.checked for r in counted))
    exact = int(sum(r.exact for r in counted))
    for r in counted:
        for why, n in r.unchecked.items():
            row.not_checked_reasons[why] = row.not_checked_reasons.get(why, 0) + int(n)
    row.not_checked = sum(row.not_checked_reasons.values())
    total = row.checked + row.not_checked
    row.fraction_checked = row.checked / total if total else None
    worsts = [r.worst for r in ran if r.worst is not None]
    worst = max(worsts) if worsts else None
    crashes = sorted({r.crash for r in results if r.crash})
    nan = sum(r.nan_mismatches for r in results if r.outcome is Outcome.FAILED)
    row.max_unchecked = max_unchecked(equation, dtype)
    row.declared_inconclusive = declared_inconclusive(impl, equation, dtype)
    row.examples = int(sum(r.examples for r in counted))
    row.unsupported = int(sum(r.unsupported for r in counted))
    inconclusive = Status.INCONCLUSIVE_DECLARED if row.declared_inconclusive else Status.INCONCLUSIVE
    if failed:
        row.status = Status.FAIL
    elif counted and row.examples and row.unsupported / row.examples > MAX_UNSUPPORTED:
        row.status = inconclusive
    elif counted and _unjudged(row) > row.max_unchecked:
        row.status = inconclusive
    elif deviations:
        row.status = Status.KNOWN_DEVIATION
    elif any(r.outcome is Outcome.PASSED and (r.checked or r.exact or r.unchecked) for r in ran):
        row.status = Status.PASS if scope == "full domain" else Status.PASS_WITHIN_SCOPE
    elif ran:  # its tests ran and passed, but none compared an element: nothing was checked, never a pass
        row.status = inconclusive
    elif out_of_scope:
        row.status = Status.OUT_OF_SCOPE
    else:
        row.status = Status.NOT_PROVIDED if not_provided else Status.SKIPPED
    row.measure = _measure(equation, counted, crashes, nan, worst, row.checked, exact)
    largest = [r.largest for r in results if r.largest]
    # named for failures and for known deviations alike (a declared deviation is still diagnosed: the name says
    # what it is)
    failing = [r for r in results if r.outcome in (Outcome.FAILED, Outcome.KNOWN_DEVIATION)]
    row.scope = scope
    row.unsupported_why = next((r.unsupported_why for r in counted if r.unsupported_why), "")
    row.out_of_scope_tests = out_of_scope
    row.worst_error_to_budget = worst
    row.headroom = None if worst is None or worst == 0 else 1.0 / worst
    row.largest_failure = max(largest, key=lambda x: x["ratio"]) if largest else None
    row.departures = sorted({d for r in failing for d in r.departures})
    for r in failing:
        row.diagnosed += r.diagnosed
        for cause, n in r.causes.items():
            row.causes[cause] = row.causes.get(cause, 0) + n
    row.violations = sorted({v for r in failing for v in r.violations})
    row.unnamed_failures = sorted(
        {r.test for r in results if r.outcome is Outcome.FAILED and not r.departures and not r.violations}
    )
    row.notes = sorted({n for r in results for n in r.notes})
    row.failed_tests = failed
    row.known_deviations = deviations
    row.tests = sorted({r.test for r in results})
    for r in results:
        for part, seconds in r.seconds.items():
            row.seconds[part] = row.seconds.get(part, 0.0) + float(seconds)
    for r in counted:
        for arrangement, ulps in r.apart.items():
            row.apart[arrangement] = max(row.apart.get(arrangement, 0.0), float(ulps))
    policies = getattr(impl, "policies", None)
    declares = isinstance(policies, Mapping)
    batched = bool({"in a batch", "padded"} & set(row.apart))
    row.bitwise = declares and policies.get("batch_invariant") is True and batched
    row.deterministic = declares and policies.get("deterministic") is True and "rerun" in row.apart
    return row


def _measure(
    equation: str,
    counted: list[TestResult],
    crashes: list[str],
    nan: int,
    worst: float | None,
    checked: int,
    exact: int,
) -> str:
    """The row's number, or what happened where no number applies."""
    if crashes:
        return "; ".join("hang (time limit)" if c == "timeout" else f"crash ({c})" for c in crashes)
    if nan and worst is None:
        return "NaN mismatch"
    if worst is not None:
        return f"{worst:.3g}" + (" (and a NaN mismatch)" if nan else "")
    if counted and checked and (exact == checked or equation == CONTRACT):  # the contract's checks: zero tolerance
        return "contract (exact)" if equation == CONTRACT else "exact checks"
    return "not measured" if counted else ""


def build(entry: Any, results: Iterable[TestResult | Mapping[str, Any]], run: Mapping[str, str]) -> dict[str, Any]:
    """The report's data for one implementation (``entry`` is a ``aiayn.conformance.run.plugin.Loaded``)."""
    results = _typed(results)
    impl = entry.impl
    dtypes = tuple(getattr(impl, "dtypes", ()) or ())
    rows: list[Row] = []
    for equation in (CONTRACT, *EQUATIONS) if dtypes else ():
        for direction in directions(equation):
            for dtype in dtypes:
                if equation in RECORDS and RECORDS[equation].first_dtype_only and dtype != dtypes[0]:
                    rows.append(Row(equation, section(equation, direction), dtype, Status.NOT_APPLICABLE, direction))
                elif equation == CONTRACT and dtype != dtypes[0]:
                    continue
                else:
                    mine = [
                        r
                        for r in results
                        if r.equation == equation
                        and r.direction == direction
                        and (equation == CONTRACT or r.dtype == dtype)
                    ]
                    rows.append(_row(equation, dtype, mine, impl, direction))
    failed = sum(1 for r in rows if r.status is Status.FAIL)
    inconclusive = sum(1 for r in rows if r.status is Status.INCONCLUSIVE)
    scoped = sorted({r.scope for r in rows if r.scope not in ("", "full domain")})
    if impl is None:
        verdict = "NOT LOADED"
    elif failed:
        verdict = "FAIL"
    elif inconclusive:
        verdict = "INCONCLUSIVE"
    elif any(r.status is Status.KNOWN_DEVIATION for r in rows):
        verdict = "PASS WITH KNOWN DEVIATIONS"
    else:
        verdict = "PASS"
    if scoped and impl is not None and not failed and not inconclusive:
        verdict += " WITHIN DECLARED SCOPE"
    return {
        "implementation": entry.name,
        "spec": entry.spec,
        "version": getattr(impl, "version", None),
        "device": getattr(impl, "device", None),
        "dtypes": list(dtypes),
        "policies": {
            k: dict(v) if isinstance(v, Mapping) else v for k, v in dict(getattr(impl, "policies", {}) or {}).items()
        },
        "loaded": impl is not None,
        "load_error": entry.error or None,
        "isolated": isinstance(impl, Remote),
        "isolation": None if impl is None else isolation(impl),
        "verdict": verdict,
        "failed_rows": failed,
        "inconclusive_rows": inconclusive,
        "hypothesis_profile": run.get("profile"),
        "seed": run.get("seed"),
        "max_examples": run.get("max_examples"),
        "rows": [r.to_dict() for r in rows],
    }


def _fmt_fraction(row: Row) -> str:
    f = row.fraction_checked
    return "" if f is None else ("100%" if f == 1 else f"{100 * f:.2f}%")


def _fmt_headroom(row: Row) -> str:
    if row.worst_error_to_budget is None:
        return ""
    return "exact" if row.headroom is None else f"{row.headroom:.3g}x"


def as_report(data: Mapping[str, Any]) -> Report:
    """The report of :func:`build`'s data, for ``aiayn.kit.write_report``: its verdict, Markdown body and JSON."""
    counts = [f"{data['failed_rows']} equation x dtype rows fail"] if data["failed_rows"] else []
    counts += [f"{data['inconclusive_rows']} rows inconclusive"] if data.get("inconclusive_rows") else []
    return Report(
        name=f"conformance-{data['implementation']}",
        title=f'Conformance of `{data["implementation"]}` to "Attention Is All You Need"',
        precision=", ".join(data["dtypes"]) or "-",
        seed=str(data.get("seed")),
        packages=("numpy", "hypothesis"),
        generator=(__name__,),
        fields={
            "impl": data["spec"],
            "impl_version": data.get("version") or "-",
            "device": data.get("device") or "-",
            "profile": data.get("hypothesis_profile"),
            "examples_per_test": data.get("max_examples"),
        },
        lines=_body(data),
        data=_strict_json(dict(data)),
        verdict=data["verdict"]
        + (f" ({'; '.join(counts)})" if counts else "")
        + ("" if data.get("isolated", True) or not data["loaded"] else " (not isolated: --in-process)"),
    )


def _strict_json(value: Any) -> Any:
    """``value`` with what strict JSON cannot hold written as text: infinite or NaN floats (an infinite error's
    ratio) as "inf", "-inf", "nan"; NumPy scalars as Python numbers."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    return value


def _body(data: Mapping[str, Any]) -> list[str]:
    """The report's Markdown below its title and verdict."""
    lines = [
        "",
        f"Implementation `{data['spec']}`: {data['version']} on {data['device']}; "
        f"dtypes {', '.join(data['dtypes']) or '-'}; "
        f"declared policies {json.dumps(data['policies'], sort_keys=True)}.",
        "",
        f"It ran {data.get('isolation') or 'nowhere (not loaded)'}: "
        + (
            "every call crossed into its process as data (`conformance/run/boundary.py`), and the oracle, the "
            "budgets and this verdict were computed in aiayn's, out of its reach."
            if data.get("isolated")
            else "the verdict is not isolated from the code it judges."
        ),
        "",
        "Each row: the checks of one equation in one dtype (`aiayn check`). "
        "*Checked*: elements compared with a budget that "
        "applies (derived per equation in `conformance/budgets/forward.py` and "
        "`conformance/budgets/composites/forward.py`), or exactly; "
        "*not checked*: elements whose budget is infinite for those inputs (its hypotheses fail), "
        "counted and never passed. "
        "A row with more unchecked elements than its stated maximum (`conformance/report/coverage.py`) is "
        "*inconclusive*. "
        "*Worst error / budget*: the largest |implementation - oracle| / budget "
        "among the checked elements of the agreement "
        "checks (1 is the limit); *headroom* is its inverse. Where no number applies the cell says what happened: "
        "*contract (exact)* (zero-tolerance checks of the plug-in contract), *exact checks*, *NaN mismatch*, "
        "*not measured* "
        "(nothing could be checked), *crash* or *hang*.",
        "",
    ]
    typed = [Row.from_dict(r) for r in data["rows"]]
    rows = [["(all)", "-", "not loaded", "", "", "", "", "", "", data["load_error"]]] if not data["loaded"] else []
    rows += [
        [
            r.section,
            r.dtype,
            r.status,
            r.scope,
            _fmt_examples(r),
            _fmt_checked(r),
            _fmt_unchecked(r),
            r.measure,
            _fmt_headroom(r),
            _fmt_notes(r),
        ]
        for r in typed
    ]
    lines += md_table(
        [
            "equation",
            "dtype",
            "status",
            "scope",
            "examples",
            "checked",
            "not checked",
            "worst error / budget",
            "headroom",
            "failing tests, departures matched, known deviations",
        ],
        rows,
    )
    why = sorted({(r.section, r.dtype, reason, n) for r in typed for reason, n in r.not_checked_reasons.items()})
    if why:
        lines += ["", "Not checked, and why:", ""]
        lines += [f"- {section} [{dtype}]: {n} elements: {reason}" for section, dtype, reason, n in why]
    largest = [(r.section, r.dtype, r.largest_failure) for r in typed if r.largest_failure]
    if largest:
        lines += [
            "",
            "Largest discrepancy found per failing row "
            "(Hypothesis reports the smallest failing example; this is the worst):",
            "",
        ]
        lines += [
            f"- {section} [{dtype}]: {f['ratio']:.3g} x budget in {f['check']}, {f['where']}; inputs {f['inputs']}"
            for section, dtype, f in largest
        ]
    reasons = sorted({(t, w) for r in typed for t, w in r.known_deviations.items()})
    if reasons:
        lines += [
            "",
            "Known deviations (declared by the implementation, checked strictly: each must still deviate):",
            "",
        ]
        lines += [f"- `{t}`: {w.removeprefix('known deviation declared by ')}" for t, w in reasons]
    return lines + _time_lines(typed)


#: Rows shown in the report's time breakdown, slowest first.
TIME_ROWS = 8


def _time_lines(rows: list[Row]) -> list[str]:
    """Where the run's time went: the tests' wall time summed over the workers, split into the implementation's
    calls, the oracle and budgets, the diagnoses and the rest (Hypothesis's generation and shrinking, the harness);
    the whole run and its :data:`TIME_ROWS` slowest rows."""
    timed = [r for r in rows if r.seconds.get("test")]
    if not timed:
        return []

    def parts(seconds: Mapping[str, float]) -> str:
        test = seconds.get("test", 0.0)
        impl, oracle, diagnosis = (seconds.get(p, 0.0) for p in ("implementation", "oracle", "diagnosis"))
        rest = max(test - impl - oracle - diagnosis, 0.0)
        return (
            f"{test:.1f} s: implementation {impl:.1f}, oracle and budgets {oracle:.1f}, diagnoses {diagnosis:.1f}, "
            f"the rest (Hypothesis, the harness) {rest:.1f}"
        )

    total: dict[str, float] = {}
    for r in timed:
        for part, seconds in r.seconds.items():
            total[part] = total.get(part, 0.0) + seconds
    lines = ["", "Where the time went (the tests' wall time, summed over the workers):", ""]
    lines.append(f"- all rows: {parts(total)}")
    slowest = sorted(timed, key=lambda r: -r.seconds["test"])[:TIME_ROWS]
    lines += [f"- {r.section} [{r.dtype}]: {parts(r.seconds)}" for r in slowest]
    return lines


def _fmt_examples(row: Row) -> str:
    if not row.examples:
        return ""
    return f"{row.examples}" + (f" ({row.unsupported} unsupported)" if row.unsupported else "")


def _fmt_matches(row: Row) -> list[str]:
    """What a row's failures match: the shown examples' departures, then every other cause found across its failing
    examples, each with how many of them it explains."""
    counted = sorted(row.causes, key=lambda c: (-row.causes[c], c))
    names = [*row.departures, *(c for c in counted if c not in row.departures)]
    out = []
    for name in names:
        n = row.causes.get(name)
        counts = f" ({n} of {row.diagnosed} failing examples diagnosed)" if n and row.diagnosed else ""
        out.append(f"{name}{counts}" if name == NO_MATCH else f"matches '{name}'{counts}")
    return out


def _fmt_notes(row: Row) -> str:
    parts = list(row.failed_tests) or list(row.known_deviations)
    parts += _fmt_matches(row)
    if row.violations:
        parts.append("breaks " + "; ".join(f"'{v}'" for v in row.violations))
    if row.out_of_scope_tests and row.status is not Status.OUT_OF_SCOPE:
        parts.append(f"{len(row.out_of_scope_tests)} tests out of scope")
    parts += row.notes
    if row.apart:
        parts.append(_fmt_apart(row))
    return ", ".join(parts)


def _fmt_apart(row: Row) -> str:
    """How far the invariance arrangements came out from the example computed once, alone (``Row.apart``)."""
    parts = []
    shown = ", ".join(f"{k} {row.apart[k]:.3g}" for k in APART if k in row.apart and k != "rerun")
    if shown:
        declared = " (bitwise in a batch: declared, checked)" if row.bitwise else ""
        parts.append(f"ulps from the example alone: {shown}{declared}")
    if "rerun" in row.apart:
        parts.append(
            f"ulps between reruns: {row.apart['rerun']:.3g}"
            + (" (bitwise: declared, checked)" if row.deterministic else "")
        )
    return ", ".join(parts)


def _fmt_checked(row: Row) -> str:
    return "" if row.fraction_checked is None else f"{row.checked:,} ({_fmt_fraction(row)})"


def _fmt_unchecked(row: Row) -> str:
    if row.fraction_checked is None:
        return ""
    return f"{row.not_checked:,} (max {100 * row.max_unchecked:g}%)" if row.not_checked else "0"


def paths(directory: Path, name: str) -> tuple[Path, Path]:
    """The report files of implementation ``name`` in ``directory``: ``conformance-<name>.md`` and ``.json``."""
    stem = "conformance-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(directory) / f"{stem}.md", Path(directory) / f"{stem}.json"


def report_name(impl: Any, name: str) -> str:
    """The name a report file carries: the implementation's, with its device type unless that is the CPU
    (``torch-cuda``)."""
    device = str(getattr(impl, "device", "cpu") or "cpu").split(":")[0]
    return name if device == "cpu" else f"{name}-{device}"


def write(
    directory: Path,
    entry: Any,
    results: Iterable[TestResult | Mapping[str, Any]],
    run: Mapping[str, str],
    *,
    force: bool = False,
    interrupted: bool = False,
) -> tuple[Path, Path]:
    """Write ``conformance-<name>.md`` and ``.json`` (``conformance-<name>-<device>.*`` off the CPU) into
    ``directory`` (atomically, quietly: the plugin names them in its summary); return both paths.

    The report's scope is the examples it ran (a run of every test at profile dev, ci or thorough over every
    declared dtype is a full run): a smaller run (``-k``, ``--dtype``, profile smoke) never replaces the report of
    a larger one, it writes beside it (``kit.write_report``) unless ``force``. An ``interrupted`` run (SIGINT,
    SIGTERM) never writes under the main name: its partial report is ``<stem>-INTERRUPTED``, its verdict
    "INTERRUPTED", whatever its rows say (the tests it did not reach are not in them).
    """
    data = build(entry, results, run)
    if interrupted:
        data["verdict"] = "INTERRUPTED"
    md, js = paths(directory, report_name(entry.impl, data["implementation"]))
    rep = as_report(data)
    if interrupted:
        rep.verdict = f"INTERRUPTED (partial: the rows hold the {len(_typed(results))} tests that ended before it)"
    selection = run.get("selection") or ""
    examples = sum(int(r.get("examples") or 0) for r in data["rows"])
    rep.scope = Scope(
        label=f"profile {run.get('profile')}" + (f", {selection}" if selection else ""),
        size=float(examples),
        full=not selection and run.get("profile") != "smoke" and not interrupted,
    )
    stem = f"{md.stem}-INTERRUPTED" if interrupted else md.stem
    written = write_report(md.parent, rep, stem=stem, quiet=True, force=force or interrupted)
    return written[0], written[1]


#: The most characters of the notes of one cell in the end-of-run table (the report holds them all).
CELL_WIDTH = 240


def _fmt_tests(tests: list[str], shown: int = 3) -> list[str]:
    if len(tests) <= shown:
        return list(tests)
    return [*tests[:shown], f"{len(tests) - shown} more failed tests"]


def _unnamed(result: TestResult) -> bool:
    return result.outcome is Outcome.FAILED and not result.departures and not result.violations


def _without_title(reason: str) -> str:
    """A failure's first line without the equation's title, which the table's row names already."""
    head, sep, rest = reason.partition("): ")
    return rest if sep and "§" in head else reason


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 45].rstrip(", ") + " ... (the report lists every one)"


def failure_reason(result: TestResult) -> str:
    """Why a check failed, in one line: the departures it matched, the statement it broke, else its message's first
    line (a contract problem, a crash, a disagreement no known departure explains)."""
    if result.departures:
        return "matches " + " or ".join(f"'{d}'" for d in result.departures)
    if result.violations:
        return "breaks " + "; ".join(f"'{v}'" for v in result.violations)
    return result.reason or result.crash or "failed (no message)"


def summary_lines(entry: Any, results: Iterable[TestResult | Mapping[str, Any]]) -> list[str]:
    """The per-equation table that ends a run: one line per equation, its status in each dtype checked."""
    results = _typed(results)
    by_equation: dict[tuple[str, str], dict[str, Row]] = {}
    for equation in (CONTRACT, *EQUATIONS):
        for direction in directions(equation):
            mine = [r for r in results if r.equation == equation and r.direction == direction]
            for dtype in sorted(
                dict.fromkeys(r.dtype for r in mine), key=lambda d: DTYPES.index(d) if d in DTYPES else -1
            ):
                by_equation.setdefault((equation, direction), {})[dtype] = _row(
                    equation, dtype, [r for r in mine if r.dtype == dtype], entry.impl, direction
                )
    width = max((len(section(*key)) for key in by_equation), default=10)
    lines = [f"{entry.name} ({entry.spec})" if entry.spec != entry.name else entry.name]
    if entry.impl is not None and (flushes(entry.impl) or not isinstance(entry.impl, Remote)):
        lines.append(f"  ran {isolation(entry.impl)}")
    for (equation, direction), cells in by_equation.items():
        parts = []
        for dtype, cell in cells.items():
            text = f"{dtype if dtype != '-' else 'all'}: {cell.status}"
            notes = []
            if cell.status is Status.PASS and cell.headroom is not None:
                notes.append(f"headroom {cell.headroom:.3g}x")
            if cell.fraction_checked is not None and cell.fraction_checked < 1:
                notes.append(f"{_fmt_fraction(cell)} checked")
            if cell.measure in ("NaN mismatch",) or cell.measure.startswith(("crash", "hang")):
                notes.append(cell.measure)
            notes += _fmt_tests(cell.failed_tests)
            notes += _fmt_matches(cell)
            notes += [f"breaks '{v}'" for v in cell.violations]
            mine = [r for r in results if r.equation == equation and r.direction == direction and r.dtype == dtype]
            notes += sorted({_without_title(failure_reason(r)) for r in mine if _unnamed(r)})
            if cell.status is Status.PASS_WITHIN_SCOPE:
                notes.append(f"scope: {cell.scope}")
            if notes:
                text += f" ({_shorten(', '.join(notes), CELL_WIDTH)})"
            parts.append(text)
        lines.append(f"  {section(equation, direction):<{width}}  {'; '.join(parts)}")
    breakdown = _time_lines([cell for cells in by_equation.values() for cell in cells.values()])
    return lines + [f"  time, {line.removeprefix('- all rows: ')}" for line in breakdown[3:4]]
