"""The conformance report: ``conformance-<impl>.md`` and ``.json``, one row per equation x dtype.

For each equation of ``aiayn.implementations.protocol.EQUATIONS`` and each dtype the implementation
declares: the status (pass / fail / not provided / not run), the number of examples the checks
ran, the worst agreement error as a fraction of its budget, and the headroom (budget / worst
error; empty when the error was exactly 0). ``lrate`` and ``label_smoothing`` take no float input, so they are checked in the first
(most precise) dtype only; their other dtypes read "n/a".

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

from aiayn.conformance.harness import SECTIONS
from aiayn.implementations.protocol import DTYPES, EQUATIONS
from aiayn.kit import md_table, signature, write_json, write_text

FIRST_DTYPE_ONLY = ("lrate", "label_smoothing")


def _cell(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Summarise the test results of one (equation, dtype)."""
    if not results:
        return {"status": "not run", "examples": 0, "worst_error_to_budget": None, "headroom": None, "failed_tests": [], "tests": []}
    failed = sorted({r["test"] for r in results if r["outcome"] == "failed"})
    deviations = sorted({r["test"] for r in results if r["outcome"] == "known deviation"})
    ran = [r for r in results if r["outcome"] not in ("skipped", "known deviation")]
    not_provided = any("not provided" in r.get("reason", "") for r in results)
    worst = max((r.get("worst", 0.0) for r in ran), default=0.0)
    if failed:
        status = "fail"
    elif deviations:
        status = "known deviation"
    elif ran:
        status = "pass"
    else:
        status = "not provided" if not_provided else "skipped"
    return {
        "status": status,
        "examples": int(sum(r.get("examples", 0) for r in ran)),
        "worst_error_to_budget": worst if ran else None,
        "headroom": None if not ran or worst == 0 else 1.0 / worst,
        "failed_tests": failed,
        "known_deviations": {r["test"]: r["reason"] for r in results if r["outcome"] == "known deviation"},
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
            if equation in FIRST_DTYPE_ONLY and dtype != dtypes[0]:
                cell = {"status": "n/a", "examples": 0, "worst_error_to_budget": None, "headroom": None, "failed_tests": [], "tests": []}
            elif equation == "contract" and dtype != dtypes[0]:
                continue
            else:
                cell = _cell(mine if equation != "contract" else [r for r in results if r["equation"] == "contract"])
            rows.append({"equation": equation, "section": SECTIONS[equation], "dtype": dtype if equation != "contract" else "all", **cell})
    failed = sum(1 for r in rows if r["status"] == "fail")
    sig = signature(f"conformance-{entry.name}", packages=("numpy", "hypothesis"), impl=entry.spec,
                    impl_version=getattr(impl, "version", "-"), device=getattr(impl, "device", "-"), profile=run.get("profile"),
                    seed=run.get("seed"), examples_per_test=run.get("max_examples"))
    return {
        "implementation": entry.name,
        "spec": entry.spec,
        "version": getattr(impl, "version", None),
        "device": getattr(impl, "device", None),
        "dtypes": list(dtypes),
        "policies": {k: v for k, v in dict(getattr(impl, "policies", {}) or {}).items()},
        "loaded": impl is not None,
        "load_error": entry.error or None,
        "verdict": "NOT LOADED" if impl is None else ("FAIL" if failed else
                                                      "PASS WITH KNOWN DEVIATIONS" if any(r["status"] == "known deviation" for r in rows) else "PASS"),
        "failed_rows": failed,
        "hypothesis_profile": run.get("profile"),
        "seed": run.get("seed"),
        "signature": sig,
        "rows": rows,
    }


def _fmt_ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def _fmt_headroom(row: Mapping[str, Any]) -> str:
    if row["worst_error_to_budget"] is None:
        return ""
    return "exact" if row["headroom"] is None else f"{row['headroom']:.3g}x"


def markdown(data: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    lines = [
        f"# Conformance of `{data['implementation']}` to \"Attention Is All You Need\"",
        "",
        f"Verdict: **{data['verdict']}**" + (f" ({data['failed_rows']} equation x dtype rows fail)" if data["failed_rows"] else ""),
        "",
        f"Implementation `{data['spec']}`: {data['version']} on {data['device']}; dtypes {', '.join(data['dtypes']) or '-'}; "
        f"declared policies {json.dumps(data['policies'], sort_keys=True)}.",
        "",
        "Each row: the checks of one equation in one dtype (`aiayn check`). *Worst error / budget* is the largest "
        "|implementation - oracle| / budget seen by the agreement checks (budgets derived per equation in "
        "`conformance/budgets.py`; 1 is the limit); *headroom* is its inverse.",
        "",
    ]
    rows = [["(all)", "-", "not loaded", "", "", "", data["load_error"]]] if not data["loaded"] else []
    rows += [[r["section"], r["dtype"], r["status"], r["examples"] or "", _fmt_ratio(r["worst_error_to_budget"]), _fmt_headroom(r),
              ", ".join(r["failed_tests"] or r.get("known_deviations", {}))] for r in data["rows"]]
    lines += md_table(["equation", "dtype", "status", "examples", "worst error / budget", "headroom", "failing tests (or known deviations)"], rows)
    reasons = sorted({(t, why) for r in data["rows"] for t, why in r.get("known_deviations", {}).items()})
    if reasons:
        lines += ["", "Known deviations (declared by the implementation, checked strictly: each must still deviate):", ""]
        lines += [f"- `{t}`: {why.removeprefix('known deviation declared by ')}" for t, why in reasons]
    lines += ["", f"Signature: `{data['signature']}`", ""]
    return "\n".join(lines)


def paths(directory: Path, name: str) -> tuple[Path, Path]:
    """The report files of implementation ``name`` in ``directory``: ``conformance-<name>.md`` and ``.json``."""
    stem = "conformance-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(directory) / f"{stem}.md", Path(directory) / f"{stem}.json"


def write(directory: Path, entry: Any, results: Iterable[dict[str, Any]], run: Mapping[str, str]) -> tuple[Path, Path]:
    """Write ``conformance-<name>.md`` and ``.json`` into ``directory`` (atomically, quietly: the
    plugin names them in its summary); return both paths."""
    data = build(entry, results, run)
    md, js = paths(directory, data["implementation"])
    write_text(md, markdown(data), quiet=True)
    write_json(js, data, quiet=True, sort_keys=True, default=str)
    return md, js


def summary_lines(entry: Any, results: Iterable[dict[str, Any]]) -> list[str]:
    """The per-equation table that ends a run: one line per equation, its status in each dtype checked."""
    results = list(results)
    by_equation: dict[str, dict[str, dict[str, Any]]] = {}
    for equation in ("contract", *EQUATIONS):
        mine = [r for r in results if r["equation"] == equation]
        for dtype in sorted(dict.fromkeys(r["dtype"] for r in mine), key=lambda d: DTYPES.index(d) if d in DTYPES else -1):
            by_equation.setdefault(equation, {})[dtype] = _cell([r for r in mine if r["dtype"] == dtype])
    width = max((len(SECTIONS[e]) for e in by_equation), default=10)
    lines = [f"{entry.name} ({entry.spec})" if entry.spec != entry.name else entry.name]
    for equation, cells in by_equation.items():
        parts = []
        for dtype, cell in cells.items():
            text = f"{dtype if dtype != '-' else 'all'}: {cell['status']}"
            if cell["status"] == "pass" and cell["headroom"] is not None:
                text += f" (headroom {cell['headroom']:.3g}x)"
            if cell["failed_tests"]:
                text += f" ({', '.join(cell['failed_tests'])})"
            parts.append(text)
        lines.append(f"  {SECTIONS[equation]:<{width}}  {'; '.join(parts)}")
    return lines
