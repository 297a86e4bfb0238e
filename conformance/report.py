"""The conformance report: ``conformance-<impl>.md`` and ``.json``, one row per equation x dtype.

For each equation of ``implementations.protocol.EQUATIONS`` and each dtype the implementation
declares: the status (pass / fail / not provided / not run), the number of examples the checks
ran, the worst agreement error as a fraction of its budget, and the headroom (budget / worst
error; empty when the error was exactly 0). ``lrate`` and ``label_smoothing`` take no float input, so they are checked in the first
(most precise) dtype only; their other dtypes read "n/a".

Regeneration is deterministic under the derandomized ``ci`` profile: no timestamps; the signature
line names the implementation, its version, the profile, the seed and the git commit.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from conformance.harness import SECTIONS
from implementations.protocol import EQUATIONS

FIRST_DTYPE_ONLY = ("lrate", "label_smoothing")


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    """The report's data for one implementation (``entry`` is a ``conformance.plugin.Loaded``)."""
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
    signature = (f"aiayn-conformance|impl:{entry.spec}|version:{getattr(impl, 'version', '-')}|device:{getattr(impl, 'device', '-')}"
                 f"|profile:{run.get('profile')}|seed:{run.get('seed')}|examples-per-test:{run.get('max_examples')}|git:{_git_commit()}")
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
        "signature": signature,
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
        "Each row: the checks of one equation in one dtype (`pytest conformance`). *Worst error / budget* is the largest "
        "|implementation - oracle| / budget seen by the agreement checks (budgets derived per equation in "
        "`conformance/budgets.py`; 1 is the limit); *headroom* is its inverse.",
        "",
        "| equation | dtype | status | examples | worst error / budget | headroom | failing tests (or known deviations) |",
        "|---|---|---|---|---|---|---|",
    ]
    if not data["loaded"]:
        lines.append(f"| (all) | - | not loaded | | | | {data['load_error']} |")
    for r in data["rows"]:
        lines.append(f"| {r['section']} | {r['dtype']} | {r['status']} | {r['examples'] or ''} | {_fmt_ratio(r['worst_error_to_budget'])} | "
                     f"{_fmt_headroom(r)} | {', '.join(r['failed_tests'] or r.get('known_deviations', {}))} |")
    reasons = sorted({(t, why) for r in data["rows"] for t, why in r.get("known_deviations", {}).items()})
    if reasons:
        lines += ["", "Known deviations (declared by the implementation, checked strictly: each must still deviate):", ""]
        lines += [f"- `{t}`: {why.removeprefix('known deviation declared by ')}" for t, why in reasons]
    lines += ["", f"Signature: `{data['signature']}`", ""]
    return "\n".join(lines)


def write(directory: Path, entry: Any, results: Iterable[dict[str, Any]], run: Mapping[str, str]) -> tuple[Path, Path]:
    """Write ``conformance-<name>.md`` and ``.json`` into ``directory``; return both paths."""
    data = build(entry, results, run)
    directory.mkdir(parents=True, exist_ok=True)
    stem = "conformance-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in data["implementation"])
    md, js = directory / f"{stem}.md", directory / f"{stem}.json"
    md.write_text(markdown(data), encoding="utf-8")
    js.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return md, js
