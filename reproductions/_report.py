"""Shared machinery of the reproductions: formatting, the signature line, deterministic writing.

Every report is a Markdown file and a JSON file with the same stem, written byte-identically on
every run with the same code and packages. The last line of the Markdown and the ``signature``
key of the JSON hold a sacreBLEU-style signature (``key:value|key:value``: report, package
versions, precision, seeds, git commit), the one part that is allowed to change between commits;
the drift test (tests/test_reproductions.py) ignores exactly that line and key.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIGNATURE_PREFIX = "Signature: "
SIGNATURE_KEY = "signature"


# ---------------------------------------------------------------------------------------------
# Signature (sacreBLEU style)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short hash of HEAD, or "unknown" outside a git checkout (or without git)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(package)
        return str(getattr(module, "__version__", "unknown"))


def signature(name: str, *, precision: str, seed: str = "none", packages: Sequence[str] = ("numpy",)) -> str:
    """``report:NAME|python:X|numpy:Y|...|precision:P|seed:S|commit:C|version:aiayn V``.

    Like sacreBLEU's signature it names everything needed to rerun the numbers: the packages the
    report used, the arithmetic (``precision``), the random seeds, and the code (git commit).
    """
    parts = [f"report:{name}", f"python:{platform.python_version()}"]
    parts += [f"{package}:{_version(package)}" for package in packages]
    parts += [f"precision:{precision}", f"seed:{seed}", f"commit:{git_commit()}", f"version:{_version('aiayn')}"]
    return "|".join(parts)


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


@dataclass
class Report:
    """A report in the making: Markdown lines, JSON data, and the one-line verdict."""

    name: str
    title: str
    precision: str
    seed: str = "none"
    packages: tuple[str, ...] = ("numpy",)
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def section(self, heading: str, *lines: str) -> None:
        self.lines.extend(["", f"## {heading}", "", *lines])

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> None:
        self.lines.extend(md_table(headers, rows, align))


def write_report(out_dir: Path, report: Report, stem: str | None = None) -> list[Path]:
    """Write ``<stem>.md`` and ``<stem>.json`` (stem defaults to the report name); return the paths."""
    if not report.verdict:
        raise ValueError(f"report {report.name!r}: verdict is empty; every report states one")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or report.name
    sig = signature(report.name, precision=report.precision, seed=report.seed, packages=report.packages)
    body = [f"# {report.title}", "", f"**Verdict:** {report.verdict}", *report.lines, "", "---", f"{SIGNATURE_PREFIX}`{sig}`"]
    md_path, json_path = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    md_path.write_text("\n".join(body) + "\n", encoding="utf-8")
    data = _rounded({"report": report.name, "title": report.title, "verdict": report.verdict, **report.data})
    data[SIGNATURE_KEY] = sig
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return [md_path, json_path]


JSON_DIGITS = 12


def _rounded(value: Any) -> Any:
    """Floats to JSON_DIGITS significant digits, recursively (tuples become lists, as JSON has them).

    Float results can differ in their last bits between CPUs (SIMD exp, BLAS kernels); twelve
    digits keep the files identical across machines while losing nothing a reader could use.
    """
    if isinstance(value, float):
        return float(f"{value:.{JSON_DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def progress(name: str, message: str) -> None:
    """One progress line on stdout (the runner prints the start and the end of each report)."""
    print(f"  {name}: {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Figures: deterministic PNGs
# ---------------------------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on demand: only the figure reports need it)."""
    import matplotlib

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
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return Path(path)
