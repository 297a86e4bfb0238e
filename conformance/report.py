"""The conformance report: ``conformance-<impl>.md`` and ``.json``, one row per equation x dtype.

For each equation of ``aiayn.implementations.protocol.EQUATIONS`` and each dtype the implementation
declares: the status (pass / fail / inconclusive / known deviation / not provided / not run), the
examples the checks ran, the elements checked against a budget that applies and those not checked
(with the reasons; ``coverage.py`` states how many may be), the worst agreement error as a fraction
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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiayn.conformance.coverage import MAX_UNSUPPORTED, OUT_OF_SCOPE, declared_inconclusive, max_unchecked
from aiayn.conformance.equations import CONTRACT, RECORDS, title
from aiayn.implementations.protocol import DTYPES, EQUATIONS, flushes_subnormals, scope_of
from aiayn.kit import md_table, signature, write_json, write_text


def _empty(status: str) -> dict[str, Any]:
    return {
        "status": status,
        "scope": "",
        "examples": 0,
        "unsupported": 0,
        "unsupported_why": "",
        "out_of_scope_tests": [],
        "checked": 0,
        "not_checked": 0,
        "not_checked_reasons": {},
        "fraction_checked": None,
        "worst_error_to_budget": None,
        "headroom": None,
        "measure": "",
        "departures": [],
        "violations": [],
        "unnamed_failures": [],
        "failed_tests": [],
        "tests": [],
    }


def _cell(results: list[dict[str, Any]], equation: str, dtype: str, impl: Any) -> dict[str, Any]:
    """Summarise the test results of one (equation, dtype): what ran, what was checked, what was not, the verdict."""
    if not results:
        return _empty("not run")
    failed = sorted({r["test"] for r in results if r["outcome"] == "failed"})
    deviations = {r["test"]: r["reason"] for r in results if r["outcome"] == "known deviation"}
    ran = [r for r in results if r["outcome"] in ("passed", "failed")]
    out_of_scope = sorted(
        {r["test"] for r in results if r["outcome"] == "skipped" and OUT_OF_SCOPE in r.get("reason", "")}
    )
    scope = scope_of(impl, equation).describe() if impl is not None and equation != "contract" else "full domain"
    if flushes_subnormals(
        getattr(impl, "policies", None), equation, dtype
    ):  # the budgets assumed FTZ arithmetic (harness.Case.arithmetic): say so
        scope = f"{scope}; subnormals flushed to zero (declared)"
    counted = [r for r in results if r["outcome"] in ("passed", "failed", "known deviation")]
    not_provided = any("not provided" in r.get("reason", "") for r in results)
    checked = int(sum(r.get("checked", 0) for r in counted))
    exact = int(sum(r.get("exact", 0) for r in counted))
    reasons: dict[str, int] = {}
    for r in counted:
        for why, n in (r.get("unchecked") or {}).items():
            reasons[why] = reasons.get(why, 0) + int(n)
    not_checked = sum(reasons.values())
    total = checked + not_checked
    fraction = checked / total if total else None
    worsts = [r["worst"] for r in ran if r.get("worst") is not None]
    worst = max(worsts) if worsts else None
    crashes = sorted({r["crash"] for r in results if r.get("crash")})
    nan = sum(int(r.get("nan_mismatches", 0) or 0) for r in results if r["outcome"] == "failed")
    limit = max_unchecked(equation, dtype)
    declared = declared_inconclusive(impl, equation, dtype)
    examples = int(sum(r.get("examples", 0) for r in counted))
    unsupported = int(sum(r.get("unsupported", 0) or 0 for r in counted))
    if failed:
        status = "fail"
    elif counted and examples and unsupported / examples > MAX_UNSUPPORTED:
        status = "inconclusive (declared)" if declared else "inconclusive"
    elif counted and fraction is not None and 1 - fraction > limit:
        status = "inconclusive (declared)" if declared else "inconclusive"
    elif deviations:
        status = "known deviation"
    elif ran:
        status = "pass" if scope == "full domain" else "pass within scope"
    elif out_of_scope:
        status = "out of scope"
    else:
        status = "not provided" if not_provided else "skipped"
    if crashes:
        measure = "; ".join("hang (time limit)" if c == "timeout" else f"crash ({c})" for c in crashes)
    elif nan and worst is None:
        measure = "NaN mismatch"
    elif worst is not None:
        measure = f"{worst:.3g}" + (" (and a NaN mismatch)" if nan else "")
    elif (
        counted and checked and (exact == checked or equation == "contract")
    ):  # the contract's checks all have zero tolerance
        measure = "contract (exact)" if equation == "contract" else "exact checks"
    elif counted:
        measure = "not measured"
    else:
        measure = ""
    largest = [r["largest"] for r in results if r.get("largest")]
    # named for failures and for known deviations alike (a declared deviation is still diagnosed: the name says what it is)
    departures = sorted(
        {d for r in results if r["outcome"] in ("failed", "known deviation") for d in (r.get("departures") or [])}
    )
    violations = sorted(
        {v for r in results if r["outcome"] in ("failed", "known deviation") for v in (r.get("violations") or [])}
    )
    unnamed = sorted(
        {r["test"] for r in results if r["outcome"] == "failed" and not r.get("departures") and not r.get("violations")}
    )
    return {
        "status": status,
        "scope": scope,
        "examples": examples,
        "unsupported": unsupported,
        "unsupported_why": next((r["unsupported_why"] for r in counted if r.get("unsupported_why")), ""),
        "out_of_scope_tests": out_of_scope,
        "checked": checked,
        "not_checked": not_checked,
        "not_checked_reasons": reasons,
        "fraction_checked": fraction,
        "max_unchecked": limit,
        "declared_inconclusive": declared,
        "worst_error_to_budget": worst,
        "headroom": None if worst is None or worst == 0 else 1.0 / worst,
        "measure": measure,
        "largest_failure": max(largest, key=lambda x: x["ratio"]) if largest else None,
        "departures": departures,
        "violations": violations,
        "unnamed_failures": unnamed,
        "failed_tests": failed,
        "known_deviations": deviations,
        "tests": sorted({r["test"] for r in results}),
    }


def build(entry: Any, results: Iterable[dict[str, Any]], run: Mapping[str, str]) -> dict[str, Any]:
    """The report's data for one implementation (``entry`` is a ``aiayn.conformance.plugin.Loaded``)."""
    results = list(results)
    impl = entry.impl
    dtypes = tuple(getattr(impl, "dtypes", ()) or ())
    rows = []
    for equation in ("contract", *EQUATIONS) if dtypes else ():
        for dtype in dtypes:
            mine = [r for r in results if r["equation"] == equation and r["dtype"] == dtype]
            if equation in RECORDS and RECORDS[equation].first_dtype_only and dtype != dtypes[0]:
                cell = _empty("n/a")
            elif equation == "contract" and dtype != dtypes[0]:
                continue
            else:
                cell = _cell(
                    mine if equation != "contract" else [r for r in results if r["equation"] == "contract"],
                    equation,
                    dtype,
                    impl,
                )
            rows.append(
                {
                    "equation": equation,
                    "section": title(equation),
                    "dtype": dtype if equation != "contract" else "all",
                    **cell,
                }
            )
    failed = sum(1 for r in rows if r["status"] == "fail")
    inconclusive = sum(1 for r in rows if r["status"] == "inconclusive")
    scoped = sorted({r["scope"] for r in rows if r.get("scope") not in ("", "full domain")})
    sig = signature(
        f"conformance-{entry.name}",
        packages=("numpy", "hypothesis"),
        impl=entry.spec,
        impl_version=getattr(impl, "version", "-"),
        device=getattr(impl, "device", "-"),
        profile=run.get("profile"),
        seed=run.get("seed"),
        examples_per_test=run.get("max_examples"),
    )
    if impl is None:
        verdict = "NOT LOADED"
    elif failed:
        verdict = "FAIL"
    elif inconclusive:
        verdict = "INCONCLUSIVE"
    elif any(r["status"] == "known deviation" for r in rows):
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
        "verdict": verdict,
        "failed_rows": failed,
        "inconclusive_rows": inconclusive,
        "hypothesis_profile": run.get("profile"),
        "seed": run.get("seed"),
        "signature": sig,
        "rows": rows,
    }


def _fmt_fraction(row: Mapping[str, Any]) -> str:
    f = row.get("fraction_checked")
    return "" if f is None else ("100%" if f == 1 else f"{100 * f:.2f}%")


def _fmt_headroom(row: Mapping[str, Any]) -> str:
    if row["worst_error_to_budget"] is None:
        return ""
    return "exact" if row["headroom"] is None else f"{row['headroom']:.3g}x"


def markdown(data: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    counts = [f"{data['failed_rows']} equation x dtype rows fail"] if data["failed_rows"] else []
    counts += [f"{data['inconclusive_rows']} rows inconclusive"] if data.get("inconclusive_rows") else []
    lines = [
        f'# Conformance of `{data["implementation"]}` to "Attention Is All You Need"',
        "",
        f"Verdict: **{data['verdict']}**" + (f" ({'; '.join(counts)})" if counts else ""),
        "",
        f"Implementation `{data['spec']}`: {data['version']} on {data['device']}; dtypes {', '.join(data['dtypes']) or '-'}; "
        f"declared policies {json.dumps(data['policies'], sort_keys=True)}.",
        "",
        "Each row: the checks of one equation in one dtype (`aiayn check`). *Checked*: elements compared with a budget that "
        "applies (derived per equation in `conformance/budgets.py` and `conformance/propagation.py`), or exactly; "
        "*not checked*: elements whose budget is infinite for those inputs (its hypotheses fail), counted and never passed. "
        "A row with more unchecked elements than its stated maximum (`conformance/coverage.py`) is *inconclusive*. "
        "*Worst error / budget*: the largest |implementation - oracle| / budget among the checked elements of the agreement "
        "checks (1 is the limit); *headroom* is its inverse. Where no number applies the cell says what happened: "
        "*contract (exact)* (zero-tolerance checks of the plug-in contract), *exact checks*, *NaN mismatch*, *not measured* "
        "(nothing could be checked), *crash* or *hang*.",
        "",
    ]
    rows = [["(all)", "-", "not loaded", "", "", "", "", "", "", data["load_error"]]] if not data["loaded"] else []
    rows += [
        [
            r["section"],
            r["dtype"],
            r["status"],
            r.get("scope", ""),
            _fmt_examples(r),
            _fmt_checked(r),
            _fmt_unchecked(r),
            r.get("measure", ""),
            _fmt_headroom(r),
            _fmt_notes(r),
        ]
        for r in data["rows"]
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
    why = sorted(
        {
            (r["section"], r["dtype"], reason, n)
            for r in data["rows"]
            for reason, n in (r.get("not_checked_reasons") or {}).items()
        }
    )
    if why:
        lines += ["", "Not checked, and why:", ""]
        lines += [f"- {section} [{dtype}]: {n} elements: {reason}" for section, dtype, reason, n in why]
    largest = [(r["section"], r["dtype"], r["largest_failure"]) for r in data["rows"] if r.get("largest_failure")]
    if largest:
        lines += [
            "",
            "Largest discrepancy found per failing row (Hypothesis reports the smallest failing example; this is the worst):",
            "",
        ]
        lines += [
            f"- {section} [{dtype}]: {f['ratio']:.3g} x budget in {f['check']}, {f['where']}; inputs {f['inputs']}"
            for section, dtype, f in largest
        ]
    reasons = sorted({(t, w) for r in data["rows"] for t, w in r.get("known_deviations", {}).items()})
    if reasons:
        lines += [
            "",
            "Known deviations (declared by the implementation, checked strictly: each must still deviate):",
            "",
        ]
        lines += [f"- `{t}`: {w.removeprefix('known deviation declared by ')}" for t, w in reasons]
    lines += ["", f"Signature: `{data['signature']}`", ""]
    return "\n".join(lines)


def _fmt_examples(row: Mapping[str, Any]) -> str:
    if not row["examples"]:
        return ""
    return f"{row['examples']}" + (f" ({row['unsupported']} unsupported)" if row.get("unsupported") else "")


def _fmt_notes(row: Mapping[str, Any]) -> str:
    parts = list(row["failed_tests"]) or list(row.get("known_deviations", {}))
    if row.get("departures"):
        parts.append("matches " + "; ".join(f"'{d}'" for d in row["departures"]))
    if row.get("violations"):
        parts.append("breaks " + "; ".join(f"'{v}'" for v in row["violations"]))
    if row.get("out_of_scope_tests") and row["status"] != "out of scope":
        parts.append(f"{len(row['out_of_scope_tests'])} tests out of scope")
    return ", ".join(parts)


def _fmt_checked(row: Mapping[str, Any]) -> str:
    return "" if row.get("fraction_checked") is None else f"{row['checked']:,} ({_fmt_fraction(row)})"


def _fmt_unchecked(row: Mapping[str, Any]) -> str:
    if row.get("fraction_checked") is None:
        return ""
    return f"{row['not_checked']:,} (max {100 * row['max_unchecked']:g}%)" if row["not_checked"] else "0"


def paths(directory: Path, name: str) -> tuple[Path, Path]:
    """The report files of implementation ``name`` in ``directory``: ``conformance-<name>.md`` and ``.json``."""
    stem = "conformance-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(directory) / f"{stem}.md", Path(directory) / f"{stem}.json"


def report_name(impl: Any, name: str) -> str:
    """The name a report file carries: the implementation's, with its device type unless that is the CPU (``torch-cuda``)."""
    device = str(getattr(impl, "device", "cpu") or "cpu").split(":")[0]
    return name if device == "cpu" else f"{name}-{device}"


def write(directory: Path, entry: Any, results: Iterable[dict[str, Any]], run: Mapping[str, str]) -> tuple[Path, Path]:
    """Write ``conformance-<name>.md`` and ``.json`` (``conformance-<name>-<device>.*`` off the CPU) into
    ``directory`` (atomically, quietly: the plugin names them in its summary); return both paths."""
    data = build(entry, results, run)
    md, js = paths(directory, report_name(entry.impl, data["implementation"]))
    write_text(md, markdown(data), quiet=True)
    write_json(js, data, quiet=True, sort_keys=True, default=str)
    return md, js


def summary_lines(entry: Any, results: Iterable[dict[str, Any]]) -> list[str]:
    """The per-equation table that ends a run: one line per equation, its status in each dtype checked."""
    results = list(results)
    by_equation: dict[str, dict[str, dict[str, Any]]] = {}
    for equation in ("contract", *EQUATIONS):
        mine = [r for r in results if r["equation"] == equation]
        for dtype in sorted(
            dict.fromkeys(r["dtype"] for r in mine), key=lambda d: DTYPES.index(d) if d in DTYPES else -1
        ):
            by_equation.setdefault(equation, {})[dtype] = _cell(
                [r for r in mine if r["dtype"] == dtype], equation, dtype, entry.impl
            )
    width = max((len(title(e)) for e in by_equation), default=10)
    lines = [f"{entry.name} ({entry.spec})" if entry.spec != entry.name else entry.name]
    for equation, cells in by_equation.items():
        parts = []
        for dtype, cell in cells.items():
            text = f"{dtype if dtype != '-' else 'all'}: {cell['status']}"
            notes = []
            if cell["status"] == "pass" and cell["headroom"] is not None:
                notes.append(f"headroom {cell['headroom']:.3g}x")
            if cell["fraction_checked"] is not None and cell["fraction_checked"] < 1:
                notes.append(f"{_fmt_fraction(cell)} checked")
            if cell["measure"] in ("NaN mismatch",) or cell["measure"].startswith(("crash", "hang")):
                notes.append(cell["measure"])
            notes += cell["failed_tests"]
            notes += [f"matches '{d}'" for d in cell.get("departures", [])]
            notes += [f"breaks '{v}'" for v in cell.get("violations", [])]
            if cell["status"] == "pass within scope":
                notes.append(f"scope: {cell['scope']}")
            if notes:
                text += f" ({', '.join(notes)})"
            parts.append(text)
        lines.append(f"  {title(equation):<{width}}  {'; '.join(parts)}")
    return lines
