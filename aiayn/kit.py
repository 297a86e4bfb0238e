"""The report kit: what every report of aiayn needs, defined once (the ground floor).

Every report is a Markdown file and a JSON file with the same stem, written byte-identically on
every run with the same code and packages, each file atomically (a temporary file, then a
rename). The last line of the Markdown and the ``signature`` key of the JSON hold one
sacreBLEU-style signature (``key:value|key:value``: report, python and package versions, the
report's own fields such as precision and seeds, the commit of aiayn itself, a hash of the code
that generated the report (:func:`code_hash`) and aiayn's version), the one part that is allowed
to change between commits; the drift test (tests/test_reproductions.py) ignores exactly that line
and key.

Used by the reproductions, the conformance report, the benchmark report and the training report:
:func:`signature`, :func:`code_hash`, :func:`md_table`, :func:`aiayn_commit`, :func:`write_text` /
:func:`write_json` (atomic), :class:`Report` / :func:`write_report`, :func:`rounded`, the number
formats and the figure helpers.
Every file written through the kit is announced on stdout with its path (:func:`announce`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from aiayn.environment import require, source_checkout

__all__ = [
    "JSON_DIGITS",
    "SIGNATURE_KEY",
    "SIGNATURE_PREFIX",
    "Report",
    "Scope",
    "GROUND_FLOOR",
    "aiayn_commit",
    "announce",
    "code_closure",
    "code_hash",
    "code_of",
    "figure_style",
    "fmt_int",
    "fmt_millions",
    "fmt_sci",
    "md_table",
    "package_version",
    "progress",
    "pyplot",
    "rounded",
    "save_png",
    "signature",
    "smaller",
    "stored_scope",
    "write_json",
    "write_report",
    "write_text",
]

SIGNATURE_PREFIX = "Signature: "
SIGNATURE_KEY = "signature"


# ---------------------------------------------------------------------------------------------
# Signature (sacreBLEU style)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def aiayn_commit() -> str:
    """The code that wrote a report: the short git hash of aiayn's own checkout (with ``+dirty``
    when it has uncommitted changes to tracked files), or ``installed`` when aiayn runs from a
    wheel. Never the commit of whatever repository the current directory belongs to."""
    root = source_checkout()
    if root is None:
        return "installed"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = head.stdout.strip() if head.returncode == 0 and head.stdout.strip() else "unknown"
    return commit + ("+dirty" if commit != "unknown" and dirty.stdout.strip() else "")


def package_version(package: str) -> str:
    """The installed version of ``package`` (its ``__version__`` if it has no metadata), or "unknown"."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(package)
        return str(getattr(module, "__version__", "unknown"))


def signature(name: str, *, packages: Sequence[str] = ("numpy",), code: str | None = None, **fields: Any) -> str:
    """``report:NAME|python:X|numpy:Y|...|<field>:<value>|...|commit:C|code:H|version:aiayn V``.

    Like sacreBLEU's signature it names everything needed to rerun the numbers: the packages the
    report used, its own fields (``precision``, ``seed``, an implementation, a profile, ...), and
    the code: the commit of aiayn itself (:func:`aiayn_commit`), ``code``, the 12-hex-digit hash
    of the generating modules' sources (:func:`code_hash`; by default the hash of the module that
    calls :func:`signature`, or of the one that calls :func:`write_report`), and aiayn's version.
    """
    if code is None:
        code = code_hash(_caller_module())
    parts = [f"report:{name}", f"python:{platform.python_version()}"]
    parts += [f"{package}:{package_version(package)}" for package in packages]
    parts += [f"{key.replace('_', '-')}:{value}" for key, value in fields.items()]
    parts += [f"commit:{aiayn_commit()}", f"code:{code}", f"version:aiayn {package_version('aiayn')}"]
    return "|".join(parts)


def _caller_module() -> str:
    """The first module outside this one on the call stack (who asked for the signature)."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "__main__") if frame is not None else "__main__"


# ---------------------------------------------------------------------------------------------
# The code that generated a report: a hash of its modules' sources
# ---------------------------------------------------------------------------------------------

#: Modules left out of every code hash: the ground floor (paths, report formatting, the command
#: line), which decides where and how numbers are written, never what they are. A change there
#: shows in the drift test of every deterministic report instead.
GROUND_FLOOR: frozenset[str] = frozenset({"aiayn", "aiayn.kit", "aiayn.environment", "aiayn.cli", "aiayn.__main__"})


@functools.cache
def _source(module: str) -> tuple[str, bytes] | None:
    """(file path, bytes) of an aiayn module's source, found without importing it; None if not found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin, Path(spec.origin).read_bytes()


@functools.cache
def _imported(module: str, source: bytes, is_package: bool) -> frozenset[str]:
    """aiayn modules named by any import statement of ``source`` (top level or inside functions); cached, as the
    sources are (a run that writes many reports parses each module once)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return frozenset(m for m in found if m == "aiayn" or m.startswith("aiayn."))


def code_closure(*modules: str) -> list[str]:
    """The aiayn modules ``modules`` import, directly or not, themselves included, sorted; the
    :data:`GROUND_FLOOR` excluded. Imports are read from the sources (nothing is imported)."""
    seen: set[str] = set()
    todo = [m for m in modules if m not in GROUND_FLOOR]
    while todo:
        module = todo.pop()
        if module in seen or module in GROUND_FLOOR:
            continue
        found = _source(module)
        if found is None:
            continue
        seen.add(module)
        path, source = found
        todo.extend(_imported(module, source, path.endswith("__init__.py")) - seen)
    return sorted(seen)


def code_hash(*modules: str) -> str:
    """12 hex digits of SHA-256 over the code of :func:`code_closure`: each module's name and its syntax tree.

    The tree is :func:`code_of` the source: layout, comments and docstrings do not count, so a
    reformatted or re-documented module keeps its hash, and any change to what the code does moves
    it. Two runs with the same hash ran the same code (outside the ground floor), whatever the
    commit; a report whose stored hash differs from its generator's current one is stale.
    """
    digest = hashlib.sha256()
    for module in code_closure(*modules):
        digest.update(module.encode() + b"\0" + code_of(_source(module)[1]) + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def code_of(source: bytes) -> bytes:
    """The code of a module's source without its layout, comments and docstrings: ``ast.dump`` of its tree
    with the docstring of the module and of every class and function left out."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


# ---------------------------------------------------------------------------------------------
# Writing: atomic, announced
# ---------------------------------------------------------------------------------------------


def announce(path: Path) -> Path:
    """Print ``wrote PATH`` (absolute) on stdout: every file aiayn writes is named with its path."""
    print(f"wrote {Path(path).resolve()}", flush=True)
    return Path(path)


def write_text(path: Path, text: str, *, quiet: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file in the same folder, then a rename),
    creating the folder; an interrupted run never leaves a half-written report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path if quiet else announce(path)


def write_json(path: Path, data: Any, *, quiet: bool = False, **dumps: Any) -> Path:
    """``json.dumps(data, indent=2, **dumps)`` plus a newline, written by :func:`write_text`."""
    return write_text(path, json.dumps(data, indent=2, **dumps) + "\n", quiet=quiet)


# ---------------------------------------------------------------------------------------------
# Number formatting (plain ASCII digits, thin constructs only)
# ---------------------------------------------------------------------------------------------


def fmt_int(n: int) -> str:
    """63082496 -> "63,082,496"."""
    return f"{n:,}"


def fmt_millions(n: int | float, digits: int = 3) -> str:
    """63082496 -> "63.082" (millions)."""
    return f"{n / 1e6:.{digits}f}"


def fmt_sci(x: float, digits: int = 2) -> str:
    """2.29824e19 -> "2.3·10^19" with ``digits`` significant digits, the way Table 2 prints."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}·10^{int(exponent)}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A Markdown table; ``align`` is one character per column: l, r or c (default all left)."""
    align = align or "l" * len(headers)
    marks = {"l": "---", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    for row in rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        if len(cells) != len(headers):
            raise ValueError(f"rows: expected {len(headers)} cells per row, got {len(cells)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------
# The report object and its writer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What a measured report covers, so that a run never replaces the report of a larger one (:func:`write_report`).

    ``label``: how a person reads it ("preset smoke", "profile dev, 2 seeds"); ``size``: comparable between two
    runs of one report (examples, seeds, tokens, cases; larger covers more); ``full``: the command's full scope.
    """

    label: str
    size: float
    full: bool = False


@dataclass
class Report:
    """A report in the making: Markdown lines, JSON data, the one-line verdict, and (measured reports) its scope."""

    name: str
    title: str
    precision: str
    seed: str = "none"
    packages: tuple[str, ...] = ("numpy",)
    generator: tuple[str, ...] = ()  # modules whose code hash the signature names (default: the caller of write_report)
    fields: dict[str, Any] = field(
        default_factory=dict
    )  # more signature fields (e.g. the results' own commit and code)
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""
    scope: Scope | None = None

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, heading: str, *lines: str) -> None:
        self.lines.extend(["", f"## {heading}", "", *lines])

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> None:
        self.lines.extend(md_table(headers, rows, align))


def write_report(
    out_dir: Path, report: Report, stem: str | None = None, *, quiet: bool = False, force: bool = False
) -> list[Path]:
    """Write ``<stem>.md`` and ``<stem>.json`` (stem defaults to the report name); return the paths.

    ``quiet``: do not print them (a caller that names them itself). A report with a :class:`Scope` never
    replaces one of larger scope at the destination (a report stored without a scope counts as a full run):
    it is written beside it as ``<stem>-<scope label>``, and a line says so; ``force`` replaces it.
    """
    if not report.verdict:
        raise ValueError(f"report {report.name!r}: verdict is empty; every report states one")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or report.name
    if report.scope is not None and not force:
        stored = stored_scope(out_dir / f"{stem}.json")
        if stored is not None and smaller(report.scope, stored):
            beside = f"{stem}-{_slug(report.scope.label)}"
            print(
                f"{out_dir / stem}.md covers more ({stored.get('label', 'a full run')}) than this run "
                f"({report.scope.label}): writing {beside}.md beside it (--force replaces it)",
                flush=True,
            )
            stem = beside
    code = code_hash(*(report.generator or (_caller_module(),)))
    sig = signature(
        report.name, packages=report.packages, code=code, precision=report.precision, seed=report.seed, **report.fields
    )
    body = [
        f"# {report.title}",
        "",
        f"**Verdict:** {report.verdict}",
        *report.lines,
        "",
        "---",
        f"{SIGNATURE_PREFIX}`{sig}`",
    ]
    md_path = write_text(out_dir / f"{stem}.md", "\n".join(body) + "\n", quiet=quiet)
    data = rounded({"report": report.name, "title": report.title, "verdict": report.verdict, **report.data})
    if report.scope is not None:
        data["scope"] = dataclasses.asdict(report.scope)
    data[SIGNATURE_KEY] = sig
    json_path = write_json(out_dir / f"{stem}.json", data, quiet=quiet, ensure_ascii=False, allow_nan=False)
    return [md_path, json_path]


def stored_scope(path: Path) -> dict[str, Any] | None:
    """The scope of the report stored at ``path`` (its JSON): None when there is none; a report stored without
    a scope counts as a full run of unknown size."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"label": "a report that could not be read", "size": math.inf, "full": True}
    scope = data.get("scope") if isinstance(data, dict) else None
    return (
        scope
        if isinstance(scope, dict)
        else {"label": "a full run (no scope recorded)", "size": math.inf, "full": True}
    )


def smaller(scope: Scope, stored: Mapping[str, Any]) -> bool:
    """Whether a run of ``scope`` covers less than the stored report's."""
    if stored.get("full") and not scope.full:
        return True
    size = stored.get("size")
    return isinstance(size, (int, float)) and scope.size < size and not (scope.full and math.isinf(size))


def _slug(label: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in label.lower()).split()) or "partial"


JSON_DIGITS = 12


def rounded(value: Any) -> Any:
    """Floats to JSON_DIGITS significant digits, recursively (tuples become lists, as JSON has them).

    Float results can differ in their last bits between CPUs (SIMD exp, BLAS kernels); twelve
    digits keep the files identical across machines while losing nothing a reader could use. A
    report re-rendered from its stored results renders these rounded values, so a first
    rendering should render them too (``rounded(rounded(x)) == rounded(x)``).
    """
    if isinstance(value, float):
        return float(f"{value:.{JSON_DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def progress(name: str, message: str) -> None:
    """One progress line on stdout (the runner prints the start and the end of each report)."""
    print(f"  {name}: {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Figures: deterministic PNGs
# ---------------------------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on demand: only the figure reports need it).

    Without matplotlib: :class:`aiayn.environment.MissingExtra`, naming the ``plots`` extra."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_style():
    """A context with matplotlib's own defaults (ignores any user matplotlibrc) for stable output."""
    plt = pyplot()
    return plt.style.context("default")


def save_png(fig: Any, path: Path) -> Path:
    """Save ``fig`` as a PNG whose bytes depend only on the figure and the matplotlib version.

    The PNG writer adds a "Software" text chunk naming the matplotlib version; it is dropped
    (``metadata={"Software": None}``), and PNGs carry no timestamp, so two runs give the same bytes.
    """
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format="png", dpi=100, metadata={"Software": None})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return announce(path)
