"""The zoo report: popular implementations of the paper's equations, checked through thin adapters (``aiayn zoo``).

Runs the conformance suite, as ``aiayn check`` does (worker processes, the per-call time limit),
on every adapter of ``aiayn.implementations.zoo.ZOO`` (third-party code only) whose library is
installed, in one pytest session, writes each adapter's own report into
``<out>/zoo/conformance-<name>.{md,json}``, and summarises them in ``<out>/zoo.{md,json,png}``: one
row per implementation (name, library version, verdict), one column per equation. Beside the
adapters the table shows aiayn's built-ins over PyTorch's own functions and modules
(:data:`BUILTIN_ROWS`): the zoo does not check them again, it reads the one report each has,
``<out>/conformance-<name>.json`` (``aiayn check NAME --report <out>``), and says so in the table.
A cell combines the equation's rows over the dtypes checked:

- ``pass`` with the smallest headroom (budget / worst error) over the dtypes, or ``pass within
  scope`` with the scope in a footnote;
- a *named departure*: the check failed, and the names of the catalogued departures
  (``diagnoses/forward.py``) whose output agrees with the implementation's on the failing inputs, or, for
  a property check (a relation between calls, no oracle value), the statement of the paper the
  property expresses ("breaks 'a masked key is as if removed (§3.2.3)'");
- ``known deviation``: a documented behaviour the adapter declares, its reason in a footnote
  (checked strictly: it must still deviate);
- ``out of scope``, ``not provided``, ``inconclusive`` (too much unchecked or unsupported);
- ``UNNAMED``: a failure no known departure explains (or a crash, a hang). The zoo's exit status is
  1 when any cell is unnamed or an adapter did not load: the catalogue or the adapter needs work.

Beside the equations, one column per property of the kernels (:data:`PROPERTIES`), each over every row of the
implementation: batch invariance (bit for bit in a batch, measured, or within budget with the most ulps apart and the
equations that moved), run-to-run determinism of the gradients, lengths across tiles, split keys, canaries.

A library that is not installed gets a row saying so (``pip install 'aiayn[zoo]'``). A failing
cell is a finding about that library, not an error of the run: the exit status is 0 when every
failure is named.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aiayn.conformance.directions import BACKWARD, DECODE, FORWARD, SPLIT
from aiayn.conformance.equations import CONTRACT, record
from aiayn.conformance.report.results import Row, Status
from aiayn.conformance.report.rows import paths
from aiayn.conformance.run.runner import pytest_arguments
from aiayn.environment import UsageError
from aiayn.implementations.protocol import EQUATIONS
from aiayn.implementations.registry import BUILTINS
from aiayn.implementations.zoo import ZOO, ZooEntry
from aiayn.kit import Report, Scope, figure_style, pyplot, save_png, smaller, stored_scope, write_report

__all__ = ["BUILTIN_ROWS", "PROPERTIES", "cell", "installed", "property_cell", "run", "summarise"]

#: aiayn's built-ins that call PyTorch's own functions and modules (``implementations/registry.py``): rows of the
#: zoo table read from their one report each, ``<out>/conformance-<name>.json``, never checked a second time.
BUILTIN_ROWS: Mapping[str, ZooEntry] = MappingProxyType(
    {
        "torch-sdpa": ZooEntry(
            BUILTINS["torch-sdpa"],
            "torch",
            "torch.nn.functional.scaled_dot_product_attention (Eq. (1)); the rest in plain torch",
        ),
        "torch-nn": ZooEntry(
            BUILTINS["torch-nn"],
            "torch",
            "nn.MultiheadAttention, nn.LayerNorm, nn.TransformerEncoderLayer / DecoderLayer (documented forward)",
        ),
        "torch-nn-fastpath": ZooEntry(
            BUILTINS["torch-nn-fastpath"],
            "torch",
            "the same modules in eval mode (PyTorch's fused inference kernels)",
        ),
    }
)

#: Cell kinds, their colour in the figure and their rank when the dtypes of one equation disagree (highest shown).
KINDS: Mapping[str, tuple[str, int]] = {
    "not provided": ("#ffffff", 0),
    "not run": ("#ffffff", 0),
    "out of scope": ("#d9d9d9", 1),
    "pass": ("#4daf4a", 2),
    "pass within scope": ("#a6d96a", 3),
    "known deviation": ("#fee08b", 4),
    "inconclusive": ("#b2abd2", 5),
    "departs": ("#fc8d59", 6),
    "UNNAMED": ("#d7191c", 7),
}


def installed(library: str) -> str | None:
    """The installed version of PyPI distribution ``library``, or None."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def cell(report_rows: Sequence[Row | Mapping[str, Any]]) -> dict[str, Any]:
    """One zoo cell from the conformance report rows of one equation (one per dtype)."""
    typed = [r if isinstance(r, Row) else Row.from_dict(r) for r in report_rows]
    statuses = {r.status for r in typed}
    # dtypes not selected (--quick) or not applicable
    rows = [r for r in typed if r.status not in (Status.NOT_APPLICABLE, Status.NOT_RUN)]
    if not rows:
        kind = "not run" if Status.NOT_RUN in statuses else "not provided"
        return {
            "kind": kind,
            "text": kind,
            "dtypes": [],
            "departures": [],
            "violations": [],
            "headroom": None,
            "notes": [],
        }
    by_kind: dict[str, list[Row]] = {}
    for r in rows:
        if r.status is Status.FAIL:
            kind = "departs" if (r.departures or r.violations) and not r.unnamed_failures else "UNNAMED"
        elif r.status.inconclusive:
            kind = "inconclusive"
        elif r.status is Status.SKIPPED:
            kind = "not run"
        else:
            kind = r.status.value
        by_kind.setdefault(kind, []).append(r)
    if not by_kind:
        return {
            "kind": "not provided",
            "text": "not provided",
            "dtypes": [],
            "departures": [],
            "violations": [],
            "headroom": None,
            "notes": [],
        }
    kind = max(by_kind, key=lambda k: KINDS[k][1])
    mine = by_kind[kind]
    dtypes = [r.dtype for r in mine]
    qualifier = "" if len(mine) == len(rows) else f" [{', '.join(dtypes)}]"
    headrooms = [r.headroom for r in mine if r.headroom is not None]
    exact = all(r.worst_error_to_budget == 0 or r.measure in ("exact checks", "contract (exact)") for r in mine)
    headroom = min(headrooms) if headrooms else None
    departures = sorted({d for r in mine for d in r.departures})
    violations = sorted({v for r in mine for v in r.violations})
    notes: list[str] = []
    if kind in ("pass", "pass within scope"):
        text = kind + (f" ({headroom:.3g}x)" if headroom is not None else " (exact)" if exact else "")
        if kind == "pass within scope":
            notes.append("scope: " + mine[0].scope)
    elif kind == "departs":
        text = "; ".join([*(f"'{d}'" for d in departures), *(f"breaks '{v}'" for v in violations)]) + qualifier
    elif kind == "UNNAMED":
        what = sorted({r.measure for r in mine if r.measure.startswith(("crash", "hang"))})
        text = "UNNAMED failure" + (f" ({', '.join(what)})" if what else "") + qualifier
        notes += sorted({t for r in mine for t in r.unnamed_failures})
    elif kind == "known deviation":
        names = [*(f"'{d}'" for d in departures), *(f"breaks '{v}'" for v in violations)]
        text = "known deviation" + (f": {'; '.join(names)}" if names else "") + qualifier
        notes += sorted(
            {
                w.removeprefix("known deviation declared by ").split(": ", 1)[-1]
                for r in mine
                for w in r.known_deviations.values()
            }
        )
    elif kind == "inconclusive":
        text = "inconclusive" + qualifier
        notes += [
            f"{r.dtype}: {r.checked} checked, {r.not_checked} not, {r.unsupported} of {r.examples} examples unsupported"
            for r in mine
        ]
    elif kind == "out of scope":
        text = "out of scope"
        notes.append("scope: " + mine[0].scope)
    else:
        text = kind
    if kind not in (
        "pass within scope",
        "out of scope",
    ):  # a declared scope is always shown (e.g. dtypes left out, and why)
        notes += sorted({"scope: " + r.scope for r in rows if r.scope not in ("", "full domain")})
    return {
        "kind": kind,
        "text": text,
        "dtypes": dtypes,
        "departures": departures,
        "violations": violations,
        "headroom": headroom,
        "notes": notes,
    }


#: The zoo table's columns: each equation's forward pass, then every backward row combined, then every decode row
#: (the cached decoder and beam search, §3.2.3 and §6.1) combined, then one column per property of the kernels
#: (:data:`PROPERTIES`), each over every row of the implementation.
GRADIENTS = "gradients"
DECODING = "decoding"
BATCH_INVARIANCE = "batch invariance"
DETERMINISM = "determinism"
ACROSS_TILES = "across tiles"
SPLIT_KEYS = "split keys"
CANARIES = "canaries"

#: Each property column and the tests that are its checks, by the ends or parts of their names (the check modules'
#: naming: ``<equation>_is_batch_invariant``, ``<equation>_gradients_are_deterministic``, ...); split keys is the
#: rows of that direction whole.
PROPERTIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        BATCH_INVARIANCE: ("_is_batch_invariant", "_gradients_are_batch_invariant"),
        DETERMINISM: ("_gradients_are_deterministic",),
        ACROSS_TILES: ("_across_tiles",),
        SPLIT_KEYS: (),
        CANARIES: (
            "_poison_at_masked_positions_changes_nothing",
            "_masked_keys_receive_no_gradient",
            "_ignores_what_padding_holds",
            "_writes_every_element_of_out",
            "test_paged_attention",
        ),
    }
)
COLUMNS: tuple[str, ...] = (*EQUATIONS, GRADIENTS, DECODING, *PROPERTIES)


def _of(test: str, marks: tuple[str, ...]) -> bool:
    return any(m in test for m in marks)


def property_cell(report_rows: Sequence[Row | Mapping[str, Any]], column: str) -> dict[str, Any]:
    """One property column's cell from every report row of an implementation: the property's tests (:data:`PROPERTIES`)
    over all its rows, dtypes and directions. Failing: the tests that failed and what their rows name; passing: for
    batch invariance and determinism what was measured, "bit for bit" where every arrangement or rerun came out 0 ulps
    apart (declared or not), else "within budget" with the most ulps apart."""
    typed = [r if isinstance(r, Row) else Row.from_dict(r) for r in report_rows]
    marks = PROPERTIES[column]
    if column == SPLIT_KEYS:
        return cell([r for r in typed if r.direction == SPLIT])
    idle = (Status.NOT_PROVIDED, Status.SKIPPED, Status.NOT_RUN, Status.NOT_APPLICABLE, Status.OUT_OF_SCOPE)
    typed = [r for r in typed if r.status not in idle]  # rows whose tests did not run say nothing of the property
    ran = [(r, t) for r in typed for t in r.tests if _of(t, marks)]
    base = {"dtypes": sorted({r.dtype for r, _ in ran}), "headroom": None, "notes": []}
    if not ran:
        return {**base, "kind": "not run", "text": "not run", "departures": [], "violations": []}
    failing = [r for r in typed if any(_of(t, marks) for t in r.failed_tests)]
    deviating = [r for r in typed if any(_of(t, marks) for t in r.known_deviations)]
    departures = sorted({d for r in failing for d in r.departures})
    violations = sorted({v for r in failing for v in r.violations})
    if failing:
        tests = sorted({t for r in failing for t in r.failed_tests if _of(t, marks)})
        explained = all((r.departures or r.violations) and not r.unnamed_failures for r in failing)
        named = [*(f"'{d}'" for d in departures), *(f"breaks '{v}'" for v in violations)]
        text = "fails: " + ", ".join(tests) + (f"; their rows name {', '.join(named)}" if named else "")
        kind = "departs" if explained else "UNNAMED"
        return {**base, "kind": kind, "text": text, "departures": departures, "violations": violations}
    if deviating:
        tests = sorted({t for r in deviating for t in r.known_deviations if _of(t, marks)})
        return {
            **base,
            "kind": "known deviation",
            "text": "known deviation: " + ", ".join(tests),
            "departures": [],
            "violations": [],
        }
    rows = {id(r): r for r, _ in ran}.values()

    def most(directions: tuple[str, ...], key: str) -> float | None:
        seen = [r.apart[key] for r in rows if r.direction in directions and key in r.apart]
        return max(seen) if seen else None

    text = "pass"
    if column == BATCH_INVARIANCE:
        ahead, padded, grads = most((FORWARD, DECODE), "in a batch"), most((FORWARD, DECODE), "padded"), None
        grads = most((BACKWARD,), "in a batch")
        moved = sorted(
            {
                "decoding" if r.direction == DECODE else record(r.equation).short
                for r in rows
                if r.direction in (FORWARD, DECODE) and r.apart.get("in a batch", 0.0) > 0
            }
        )
        text = (
            "pass, forward bit for bit in a batch"
            if ahead == 0.0
            else f"pass within budget: forward up to {ahead:.3g} ulps in a batch ({', '.join(moved)})"
            if ahead is not None
            else "pass"
        )
        text += "".join(
            f"; {what} up to {v:.3g} ulps" for what, v in (("padded", padded), ("gradients in a batch", grads)) if v
        )
    elif column == DETERMINISM:
        reruns = most((BACKWARD,), "rerun")
        if reruns is not None:
            text = "pass, gradients bit for bit" if reruns == 0.0 else f"pass within budget: {reruns:.3g} ulps apart"
    return {**base, "kind": "pass", "text": text, "departures": [], "violations": []}


def summarise(name: str, data: Mapping[str, Any] | None, library: str, what: str) -> dict[str, Any]:
    """One zoo row from an adapter's conformance report data (None: the library is not installed)."""
    row: dict[str, Any] = {"name": name, "library": library, "library_version": installed(library), "what": what}
    if data is None:
        return {**row, "verdict": "library not installed", "version": None, "dtypes": [], "cells": {}}
    rows = [Row.from_dict(r) for r in data["rows"]]
    cells = {eq: cell([r for r in rows if r.equation == eq and r.direction == FORWARD]) for eq in EQUATIONS}
    cells[GRADIENTS] = cell([r for r in rows if r.direction == BACKWARD])
    cells[DECODING] = cell([r for r in rows if r.direction == DECODE])
    for column in PROPERTIES:
        cells[column] = property_cell(rows, column)
    contract = [r for r in rows if r.equation == CONTRACT]
    if contract and contract[0].status is Status.FAIL:
        cells["contract"] = {
            "kind": "UNNAMED",
            "text": "contract broken",
            "dtypes": [],
            "departures": [],
            "violations": [],
            "headroom": None,
            "notes": contract[0].get("failed_tests", []),
        }
    return {
        **row,
        "verdict": data["verdict"],
        "version": data.get("version"),
        "dtypes": data.get("dtypes", []),
        "cells": cells,
        "policies": data.get("policies", {}),
        "load_error": data.get("load_error"),
    }


def _session(
    names: Sequence[str], profile: str, workers: int, timeout: float | None, folder: Path, quick: bool
) -> tuple[int, float]:
    """One pytest session checking ``names`` (output streamed: progress), each report into ``folder``."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *pytest_arguments(
            names,
            profile=profile,
            workers=workers,
            timeout=timeout,
            report=folder,
            dtypes=["float32"] if quick else (),
            agreement_only=quick,
            force=True,  # run() decided already whether this run may replace the stored reports
            extra=["--tb=line", "-rN"],
        ),
    ]
    print(f"aiayn zoo: {' '.join(names)} (profile {profile}, {workers} workers)", flush=True)
    # --quick asks whether each adapter's failures are found and named, as the mutant runner does: no shrinking
    env = {**os.environ, "AIAYN_FIND_ONLY": "1"} if quick else None
    start = time.perf_counter()
    code = subprocess.run(cmd, check=False, env=env).returncode
    return code, time.perf_counter() - start


def run(
    names: Sequence[str],
    *,
    profile: str,
    workers: int,
    out: Path,
    timeout: float | None = None,
    quick: bool = False,
    force: bool = False,
) -> int:
    """Check the zoo adapters ``names`` whose library is installed; write the zoo report; return the exit status.

    ``quick``: float32 only, and only each equation's agreement test with the oracle and the
    contract (``--aiayn-agreement-only``), with failures found but not shrunk (``$AIAYN_FIND_ONLY``): the smoke
    selection CI runs (JAX compiles a kernel for every new input shape, which makes the whole suite over every
    dtype take tens of minutes).
    """
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise ValueError(f"not in the zoo: {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    scope = Scope(
        label=f"{'quick, ' if quick else ''}{len(names)} adapters",
        size=float(len(names) * (1 if quick else 4)),
        full=not quick and set(names) >= set(ZOO),
    )
    stored = stored_scope(Path(out) / "zoo.json")
    if stored is not None and not force and smaller(scope, stored):
        raise UsageError(
            f"{Path(out) / 'zoo.md'} covers more ({stored.get('label')}) than this run ({scope.label}): "
            "give another --out, or --force to replace it"
        )
    present = [n for n in names if installed(ZOO[n].library)]
    missing = [n for n in names if n not in present]
    for n in missing:
        print(
            f"aiayn zoo: {n}: {ZOO[n].library} is not installed (pip install 'aiayn[zoo]'); reported as such",
            flush=True,
        )
    folder = Path(out) / "zoo"
    folder.mkdir(parents=True, exist_ok=True)
    code, seconds = _session(present, profile, workers, timeout, folder, quick) if present else (0, 0.0)
    return _summarise_and_write(
        names,
        present,
        out,
        profile=profile + (" (quick: float32, agreement tests only)" if quick else ""),
        seconds=seconds,
        code=code,
    )


def rerender(names: Sequence[str], *, out: Path) -> int:
    """Write the zoo report again from the stored reports of a finished run (``aiayn zoo --no-run``): the
    adapters' ``zoo/conformance-<name>.json``, the session's profile, time and exit in ``zoo.json``, and the
    built-ins' own ``conformance-<name>.json`` (read afresh, as on every run)."""
    stored = Path(out) / "zoo.json"
    if not stored.exists():
        raise FileNotFoundError(f"{stored}: no stored zoo run to write again (run `aiayn zoo` first)")
    session = json.loads(stored.read_text(encoding="utf-8"))
    present = [n for n in names if n in ZOO and paths(Path(out) / "zoo", n)[1].exists()]
    return _summarise_and_write(
        names, present, out, profile=session["profile"], seconds=session["seconds"], code=session["session_exit"]
    )


def _summarise_and_write(
    names: Sequence[str], present: Sequence[str], out: Path, *, profile: str, seconds: float, code: int
) -> int:
    folder = Path(out) / "zoo"
    rows = [_builtin_row(n, Path(out)) for n in BUILTIN_ROWS]
    for n in names:
        js = paths(folder, n)[1]
        data = json.loads(js.read_text(encoding="utf-8")) if n in present and js.exists() else None
        row = {**summarise(n, data, ZOO[n].library, ZOO[n].what), "origin": "adapter"}
        if n in present and data is None:
            row["verdict"] = "no report (the session ended early)"
        rows.append(row)
    unnamed = [(r["name"], eq) for r in rows for eq, c in r["cells"].items() if c["kind"] == "UNNAMED"]
    broken = [r["name"] for r in rows if r["name"] in present and (r.get("load_error") or not r["cells"])]
    _write(rows, out, profile=profile, seconds=seconds, session_exit=code, unnamed=unnamed, broken=broken)
    return 1 if unnamed or broken else 0


def _builtin_row(name: str, out: Path) -> dict[str, Any]:
    """The row of built-in ``name`` (:data:`BUILTIN_ROWS`), from its own report ``<out>/conformance-<name>.json``.

    ``source`` names that report, ``source_run`` the run behind it (profile, commit); without the report the row
    says how to write it and has no cells.
    """
    entry = BUILTIN_ROWS[name]
    report = paths(out, name)[1]
    data = json.loads(report.read_text(encoding="utf-8")) if report.exists() else None
    row = {**summarise(name, data, entry.library, entry.what), "origin": "built-in", "source": report.name}
    if data is None:
        return {**row, "verdict": f"no {report.name}: run `aiayn check {name} --report` into this folder"}
    signed = dict(part.split(":", 1) for part in str(data.get("signature", "")).split("|") if ":" in part)
    return {**row, "source_run": f"profile {data.get('hypothesis_profile', '?')}, commit {signed.get('commit', '?')}"}


def _write(
    rows: list[dict[str, Any]],
    out: Path,
    *,
    profile: str,
    seconds: float,
    session_exit: int,
    unnamed: list[tuple[str, str]],
    broken: list[str],
) -> None:
    adapters = [r for r in rows if r["origin"] == "adapter" and r["cells"]]
    builtins = [r for r in rows if r["origin"] == "built-in" and r["cells"]]
    libraries = sorted({r["library"] for r in adapters} - {"torch"})
    own = [r for r in adapters if r["library"] == "torch"]  # over PyTorch's own modules, as the built-ins are
    rep = Report(
        "zoo",
        "The zoo: popular implementations of the paper's equations",
        precision="per dtype",
        packages=("numpy", "hypothesis", *sorted({r["library"] for r in rows if r["library_version"]})),
        fields={"profile": profile},
    )
    departing = sorted({r["name"] for r in rows for c in r["cells"].values() if c["kind"] == "departs"})
    rep.verdict = (
        f"{len(adapters) - len(own)} adapters over {len(libraries)} third-party libraries"
        + (f" and {len(own)} over PyTorch's own modules" if own else "")
        + f" checked, beside {len(builtins)} "
        f"PyTorch built-ins from their own reports; {len(departing)} implementations depart from the paper in some "
        "equation, every such failure named"
        if not unnamed and not broken
        else f"{len(unnamed)} failing cells no known departure explains; {len(broken)} adapters did not load"
    )
    shown = ", ".join(f"`{n}`" for n in BUILTIN_ROWS)
    rep.add(
        "",
        "Each adapter row is one library's code checked by `aiayn check` through a thin adapter "
        f"(`implementations/zoo/`) in this run, profile `{profile}`; its own report, with the largest discrepancies "
        f"and replay files, is `zoo/conformance-<name>.md`. The rows {shown} are aiayn's built-ins over PyTorch's "
        "own functions and modules: the zoo does not check them again, it reads the one report each has, "
        "`conformance-<name>.md` beside this file (`aiayn check <name> --report`; its profile and commit are under "
        "*What each row checks*).",
        "",
        "Each column is one equation's forward pass, its dtypes combined (the least favourable shown; brackets "
        "name the dtypes when they differ); *gradients* combines every backward row (the gradients the library "
        "gives through autograd or jax.vjp, against the oracle's VJP); *decoding* combines every decode row (the "
        "library's cached decoder fed in chunks and reordered, and its beam search, against the oracle's full "
        "forward pass and §6.1's beam search, `conformance/checks/decoding.py`); the last five columns are properties "
        "over every row: *batch invariance* (bit for bit in a batch where every forward arrangement came out 0 ulps "
        "from the example alone, measured, else the most ulps and the equations that moved), *determinism* (the "
        "gradients' reruns), *across tiles*, *split keys* (the library's log-sum-exp, merge and paged read, where it "
        "gives them) and *canaries*. *pass (Nx)*: every check within its "
        "derived budget, N the smallest headroom; *'name'*: the check failed and the output matches that catalogued "
        "departure (`conformance/diagnoses/forward.py`, `conformance/diagnoses/backward.py`, "
        "`conformance/diagnoses/decoding.py`) on the failing inputs; *known deviation*: documented behaviour the "
        "implementation declares (footnotes); *out of scope*, "
        "*not provided*; *UNNAMED*: a failure no departure explains.",
        "",
    )
    headers = [
        "implementation",
        "version",
        "verdict",
        *[record(e).short for e in EQUATIONS],
        *COLUMNS[len(EQUATIONS) :],
    ]
    notes: dict[str, int] = {}
    table = []
    for r in rows:
        cells = []
        for eq in COLUMNS:
            c = r["cells"].get(eq)
            if c is None:
                cells.append("")
                continue
            marks = "".join(f"[{notes.setdefault(r['name'] + ': ' + n, len(notes) + 1)}]" for n in c["notes"])
            cells.append(c["text"] + (f" {marks}" if marks else ""))
        table.append([f"`{r['name']}`", r["version"] or f"{r['library']} not installed", r["verdict"], *cells])
    rep.table(headers, table)
    if notes:
        rep.section("Notes", *[f"{k}. {text}" for text, k in notes.items()])
    rep.section("What each row checks", *[_what(r) for r in rows])
    rep.add("", f"Session: exit {session_exit}, {seconds / 60:.1f} minutes.")
    rep.data = {
        "profile": profile,
        "rows": rows,
        "unnamed": unnamed,
        "not_loaded": broken,
        "libraries_beyond_torch": libraries,
        "session_exit": session_exit,
        "seconds": seconds,
    }
    write_report(out, rep)
    _figure(rows, Path(out) / "zoo.png")


def _what(row: Mapping[str, Any]) -> str:
    where = ""
    if row["origin"] == "built-in":
        where = f"; row read from `{row['source']}`" + (f" ({row['source_run']})" if row.get("source_run") else "")
    return (
        f"- `{row['name']}` ({row['origin']}, {row['library']} {row['library_version'] or 'not installed'}): "
        f"{row['what']}; declared policies {json.dumps(row.get('policies', {}), sort_keys=True)}{where}"
    )


def _figure(rows: list[dict[str, Any]], path: Path) -> None:
    """The zoo table as a grid of coloured cells (kind) with short labels."""
    plt = pyplot()
    from matplotlib.patches import Patch

    with figure_style():
        fig, ax = plt.subplots(figsize=(1.05 * len(COLUMNS) + 4.2, 0.42 * max(len(rows), 4) + 1.6))
        for i, r in enumerate(rows):
            for j, eq in enumerate(COLUMNS):
                c = r["cells"].get(eq) or {"kind": "not run", "headroom": None}
                ax.add_patch(
                    plt.Rectangle((j, i), 1, 1, facecolor=KINDS[c["kind"]][0], edgecolor="#888888", linewidth=0.5)
                )
                label = {
                    "pass": "pass",
                    "pass within scope": "scope",
                    "known deviation": "known",
                    "departs": "departs",
                    "UNNAMED": "UNNAMED",
                    "inconclusive": "inconcl.",
                    "out of scope": "out",
                    "not provided": "-",
                    "not run": "-",
                }[c["kind"]]
                if c["kind"] in ("pass", "pass within scope") and c.get("headroom"):
                    label += f"\n{c['headroom']:.2g}x"
                ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=6.5)
        ax.set_xlim(0, len(COLUMNS))
        ax.set_ylim(len(rows), 0)
        ax.set_xticks(
            [j + 0.5 for j in range(len(COLUMNS))],
            [*(record(e).short for e in EQUATIONS), *COLUMNS[len(EQUATIONS) :]],
            rotation=40,
            ha="right",
            fontsize=8,
        )
        ax.set_yticks(
            [i + 0.5 for i in range(len(rows))],
            [f"{r['name']} ({r['library']} {r['library_version'] or '-'})" for r in rows],
            fontsize=8,
        )
        ax.tick_params(length=0)
        ax.legend(
            handles=[Patch(facecolor=KINDS[k][0], edgecolor="#888888", label=k) for k in KINDS if k != "not run"],
            loc="center left",
            bbox_to_anchor=(1.01, 0.5),
            ncol=1,
            fontsize=7,
            frameon=False,
        )
        ax.set_title('Conformance of popular implementations to "Attention Is All You Need" (aiayn zoo)', fontsize=9)
        fig.tight_layout()
        save_png(fig, path)
