"""The benchmark history: one entry per run of ``aiayn bench``, and ``benchmarks-history.{md,json,png}`` from it.

A run's report (:mod:`aiayn.benchmarks.report`) says how each case did against the GEMM ceiling
that run measured; the history says how those ratios moved from commit to commit. Each run can add
one entry to a history file (:func:`append`), and :func:`write` turns the file into a table and a
plot of the ratio per case over the runs.

The file is JSON Lines: UTF-8 text, one JSON object per line, one line per run, oldest first. Lines
are only ever appended, never rewritten, so the file can be kept under version control or shared
and grows by one line per run. An entry (:func:`record`) holds:

- ``datetime``: when the run started (pytest-benchmark's ``datetime``, ISO 8601);
- ``commit``: the commit the run measured (pytest-benchmark's ``commit_info.id``), or null;
- ``dirty``: whether that checkout had uncommitted changes (``commit_info.dirty``), or null;
- ``branch``: its branch (``commit_info.branch``), or null;
- ``environment``: what a ratio depends on besides the code (:func:`aiayn.benchmarks.compare.environment`:
  machine kind, host, devices, thread count, library builds); ratios of entries with different
  environments are not comparable;
- ``cases``: ``{case id: {"median", "min", "max", "rounds"}}``: the median, least and largest of the
  case's per-round fractions of the GEMM ceiling (``ratio_full``, :func:`aiayn.benchmarks.compare.case_samples`)
  and how many rounds there were (1 for a run recorded before rounds were kept: its best round).

A run is identified by its ``datetime`` and ``commit``: appending a run already in the file adds
nothing, so re-rendering one stored run with ``--history`` twice leaves one entry.

Reading the file never guesses: a line that is not JSON or not an entry (a field of another type, a
NaN, a negative ratio) is a :class:`aiayn.environment.UsageError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.benchmarks.compare import case_samples, environment
from aiayn.benchmarks.runfile import check_history_entry, parse_json
from aiayn.environment import UsageError
from aiayn.kit import Report, figure_style, md_table, pyplot, save_png, write_report

__all__ = ["DEFAULT_STEM", "FIGURE", "append", "build_report", "load", "record", "write"]

#: The figure of merit the history keeps per case: the fraction of the GEMM ceiling, counting full flops.
FIGURE = "ratio_full"
DEFAULT_STEM = "benchmarks-history"
#: Above this many cases, the plot's legend moves outside the axes, in a small font.
LEGEND_INSIDE_MAX = 12
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


# ---------------------------------------------------------------------------------------------
# the file


def record(run: dict[str, Any]) -> dict[str, Any]:
    """The history entry of one run of ``aiayn bench`` (a pytest-benchmark JSON dict); see the module docstring.

    UsageError when the run has no timed attention case (a run with ``--benchmark-disable``): there is
    nothing to keep.
    """
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list):
        raise ValueError("run: expected pytest-benchmark JSON (a dict with a 'benchmarks' list)")
    samples = case_samples(run, FIGURE)
    if not samples:
        raise UsageError(f"--history: the run of {run.get('datetime', 'unknown date')} has no timed attention case")
    commit_info = run.get("commit_info") or {}
    cases = {
        case: {
            "median": float(np.median(values)),
            "min": float(min(values)),
            "max": float(max(values)),
            "rounds": len(values),
        }
        for case, values in samples.items()
    }
    return {
        "datetime": run.get("datetime"),
        "commit": commit_info.get("id"),
        "dirty": commit_info.get("dirty"),
        "branch": commit_info.get("branch"),
        "environment": environment(run),
        "cases": cases,
    }


def _key(entry: dict[str, Any]) -> tuple[Any, Any]:
    return entry.get("datetime"), entry.get("commit")


def append(path: Path, run: dict[str, Any]) -> dict[str, Any]:
    """Append :func:`record` of ``run`` to the history file ``path`` as one line; return the entry.

    Creates the file (and its folder) when missing; earlier lines are never rewritten. A run whose
    ``(datetime, commit)`` is already in the file is not appended again: the stored entry is returned.
    """
    path = Path(path)
    entry = record(run)
    if path.exists():
        for stored in load(path):
            if _key(stored) == _key(entry):
                return stored
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, ensure_ascii=False, allow_nan=False)
    with path.open("a+b") as handle:
        handle.seek(0, 2)
        if handle.tell() > 0:
            handle.seek(-1, 2)
            if handle.read(1) != b"\n":  # a last line written without its newline stays intact
                handle.write(b"\n")
        handle.write(line.encode("utf-8") + b"\n")
    return entry


def load(path: Path, option: str = "--history") -> list[dict[str, Any]]:
    """The entries of the history file ``path``, in file order (an empty file: none).

    Blank lines are skipped. UsageError naming ``option``, the file and the line number when a line is
    not JSON or not an entry (an object with ``datetime`` and ``cases``, every field of its type and range:
    :func:`aiayn.benchmarks.runfile.check_history_entry`), or when the file is missing.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{option}: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option}: {path}: cannot read a history file ({exc})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{option}: {path}: line {number}"
        entries.append(check_history_entry(parse_json(line, where), where))
    return entries


# ---------------------------------------------------------------------------------------------
# the report


def _short(entry: dict[str, Any]) -> str:
    """The entry's commit in 7 hex digits (``+dirty`` when the checkout had changes), or "no commit"."""
    commit = entry.get("commit")
    if not commit:
        return "no commit"
    return str(commit)[:7] + ("+dirty" if entry.get("dirty") else "")


def _date(entry: dict[str, Any]) -> str:
    return str(entry.get("datetime") or "unknown date")[:10]


def _case_ids(entries: list[dict[str, Any]]) -> list[str]:
    """Every case of any entry, in the order they first appear (the order the suite runs them)."""
    return list(dict.fromkeys(case for entry in entries for case in entry["cases"]))


def _environments(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """The distinct environments in order of first appearance, and each entry's index into them."""
    distinct: list[dict[str, Any]] = []
    keys: list[str] = []
    index = []
    for entry in entries:
        key = json.dumps(entry.get("environment") or {}, sort_keys=True)
        if key not in keys:
            keys.append(key)
            distinct.append(entry.get("environment") or {})
        index.append(keys.index(key))
    return distinct, index


def _describe(env: dict[str, Any]) -> str:
    """One line naming an environment: machine, host, device, threads, library builds."""
    parts = [f"{key} {env[key]}" for key in ("machine", "host", "device", "threads") if key in env]
    libraries = env.get("libraries") or {}
    if libraries:
        parts.append("libraries " + ", ".join(f"{k} {v}" for k, v in sorted(libraries.items())))
    return "; ".join(parts) or "not recorded"


def _change(entries: list[dict[str, Any]], case: str) -> str:
    """The relative change of the case's median from the first run that has it to the last one that has it."""
    medians = [e["cases"][case]["median"] for e in entries if case in e["cases"]]
    if len(medians) < 2 or not medians[0]:
        return "—"
    return f"{medians[-1] / medians[0] - 1:+.1%}"


def _table(entries: list[dict[str, Any]], cases: list[str]) -> list[str]:
    headers = ["case", *(f"{_short(e)} {_date(e)}" for e in entries), "change"]
    rows = [
        [
            case,
            *(f"{e['cases'][case]['median']:.3f}" if case in e["cases"] else "—" for e in entries),
            _change(entries, case),
        ]
        for case in cases
    ]
    return md_table(headers, rows, "l" + "r" * (len(entries) + 1))


def build_report(entries: list[dict[str, Any]], source: str = "history") -> Report:
    """The Markdown/JSON report of the history ``entries`` (at least one); ``source`` names the file in the text."""
    if not entries:
        raise ValueError("entries: expected at least one history entry, got none")
    cases = _case_ids(entries)
    envs, env_of = _environments(entries)
    report = Report(
        name="benchmarks-history",
        title="Attention benchmarks over commits: fraction of the GEMM ceiling per case",
        precision="as recorded",
        packages=("numpy", "matplotlib"),
    )
    runs = f"{len(entries)} run{'s' if len(entries) != 1 else ''}"
    report.verdict = (
        f"{runs} from {entries[0].get('datetime')} to {entries[-1].get('datetime')}, {len(cases)} cases; "
        f"latest commit {_short(entries[-1])}"
    )
    warning = None
    if len(envs) > 1:
        warning = (
            f"the runs come from {len(envs)} environments (host, machine, device, threads or library builds differ): "
            "ratios from different environments are not comparable, a trend line at most (between two VMs of one "
            "kind a case moves by tens of percent); the plot marks each environment differently."
        )
        report.add("", f"**Warning:** {warning}")
    report.add(
        "",
        f"Every run recorded in `{source}` (one line per run of `aiayn bench --history`), oldest first. Each cell is "
        "the median over the case's timed rounds of its fraction of the GEMM ceiling measured in the same run "
        '(`ratio_full`: flops over round time over the session ceiling); "—": the run did not measure the case. '
        "Change: from the first run that measured the case to the last one that did.",
    )
    report.section("Ratio per case", *_table(entries, cases))
    run_rows = [
        [str(i), _short(e), str(e.get("branch") or "—"), str(e.get("datetime")), f"E{env_of[i] + 1}"]
        for i, e in enumerate(entries)
    ]
    env_lines = [f"- E{i + 1}: {_describe(env)}" for i, env in enumerate(envs)]
    report.section(
        "Runs",
        *md_table(["run", "commit", "branch", "datetime", "environment"], run_rows, "rllll"),
        "",
        *env_lines,
    )
    report.data.update(
        figure=FIGURE, warning=warning, environments=envs, environment_of_run=env_of, entries=entries, cases=cases
    )
    return report


def _colors(plt: Any, count: int) -> list[Any]:
    """``count`` distinguishable colours: tab10 or tab20 when they suffice, else samples of a continuous map."""
    if count <= 10:
        return [f"C{i}" for i in range(count)]
    if count <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(count)]
    cmap = plt.get_cmap("turbo")
    return [cmap(i / (count - 1)) for i in range(count)]


def _plot(entries: list[dict[str, Any]], cases: list[str], env_of: list[int], path: Path) -> Path:
    """Median ratio per case against the run (x: short commits), min..max as error bars, one marker per environment."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    n_envs = max(env_of) + 1
    outside = len(cases) > LEGEND_INSIDE_MAX
    handles_count = len(cases) + (n_envs if n_envs > 1 else 0)
    columns = math.ceil(handles_count / 40) if outside else 1
    axes_width = max(6.4, 0.5 * len(entries) + 3.0)
    legend_width = 2.4 * columns if outside else 0.0
    with figure_style():
        fig, ax = plt.subplots(figsize=(axes_width + legend_width, 6.0))
        colors = _colors(plt, len(cases))
        for case, color in zip(cases, colors, strict=True):
            runs = [i for i, e in enumerate(entries) if case in e["cases"]]
            stats = [entries[i]["cases"][case] for i in runs]
            ax.plot(runs, [s["median"] for s in stats], "-", color=color, linewidth=1.2)
            for env in range(n_envs):
                picked = [(i, s) for i, s in zip(runs, stats, strict=True) if env_of[i] == env]
                if not picked:
                    continue
                med = np.array([s["median"] for _, s in picked])
                low = np.array([s["min"] for _, s in picked])
                high = np.array([s["max"] for _, s in picked])
                ax.errorbar(
                    [i for i, _ in picked],
                    med,
                    yerr=[np.maximum(med - low, 0.0), np.maximum(high - med, 0.0)],
                    fmt=_MARKERS[env % len(_MARKERS)],
                    color=color,
                    markersize=5,
                    capsize=3,
                    linewidth=1,
                )
        case_marker = _MARKERS[0] if n_envs == 1 else None  # with several environments, markers name those
        handles: list[Any] = [Line2D([], [], color=color, marker=case_marker) for color in colors]
        labels = list(cases)
        if n_envs > 1:
            for env in range(n_envs):
                handles.append(Line2D([], [], linestyle="none", marker=_MARKERS[env % len(_MARKERS)], color="black"))
                labels.append(f"environment E{env + 1}")
        ax.set_xticks(range(len(entries)), labels=[_short(e) for e in entries])
        if len(entries) > 6:
            plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
        ax.set_xlim(-0.5, len(entries) - 0.5)
        ax.set_ylim(bottom=0)
        ax.set(
            xlabel="run (commit)",
            ylabel="fraction of the GEMM ceiling (median of the rounds)",
            title="aiayn bench: ratio per case over commits",
        )
        ax.grid(True, axis="y", linewidth=0.5, alpha=0.5)
        if outside:
            split = axes_width / (axes_width + legend_width)
            fig.tight_layout(rect=(0, 0, split, 1))
            fig.legend(
                handles, labels, loc="upper left", bbox_to_anchor=(split, 0.98), fontsize=6, ncol=columns, frameon=False
            )
        else:
            ax.legend(handles, labels, loc="best", fontsize=8)
            fig.tight_layout()
        return save_png(fig, path)


def write(path: Path, out: Path, *, stem: str = DEFAULT_STEM, force: bool = False) -> list[Path]:
    """Read the history file ``path`` and write ``<stem>.md``, ``<stem>.json`` and ``<stem>.png`` into ``out``.

    UsageError when the file is missing, unreadable or holds no run yet. ``force`` is passed to
    :func:`aiayn.kit.write_report`.
    """
    path = Path(path)
    entries = load(path)
    if not entries:
        raise UsageError(f"--history: {path}: no run recorded yet (an empty history file)")
    report = build_report(entries, source=path.name)
    paths = write_report(Path(out), report, stem, force=force)
    _, env_of = _environments(entries)
    paths.append(_plot(entries, _case_ids(entries), env_of, paths[0].with_suffix(".png")))
    print(report.verdict)
    if report.data["warning"]:
        print(f"warning: {report.data['warning']}")
    return paths
