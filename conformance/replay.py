"""Rerun failed checks from their saved inputs (``aiayn replay FILE.npz [--impl SPEC]``).

A failing check saves its inputs under ``aiayn.environment.failure_dir()`` (``$AIAYN_FAILURES``,
else ``~/.cache/aiayn/failures``) and prints the replay command. The file names the
implementation (as given to ``--impl``), the dtype and the check; ``--impl`` overrides the
implementation (e.g. to try a fix under another name). A file that is not a replay file, or whose dtype the
implementation does not declare for the check's equation, is a usage error (:class:`ReplayError`), never a
failure of the implementation.
"""

from __future__ import annotations

import inspect
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ReplayError", "replay"]


class ReplayError(Exception):
    """A replay file or implementation that cannot be used; the message is one line."""


def _read(path: Path) -> tuple[str, str, str, dict]:
    from aiayn.conformance.harness import CHECKS, load_case

    if not path.exists():
        raise ReplayError(f"{path}: no such file (failure files are in $AIAYN_FAILURES, else ~/.cache/aiayn/failures)")
    try:
        spec, dtype, name, inputs = load_case(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        why = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ReplayError(f"{path}: not a replay file written by the conformance suite ({why})") from None
    if name not in CHECKS:
        raise ReplayError(f"{path}: names check {name!r}, which this version of aiayn does not have")
    try:
        inspect.signature(CHECKS[name]).bind(None, **inputs)
    except TypeError as exc:
        raise ReplayError(f"{path}: its saved arguments do not fit check {name} ({exc})") from None
    return spec, dtype, name, inputs


def _runs_in(path: Path, implementation: Any, spec: str, dtype: str, name: str) -> None:
    """Raise ReplayError unless ``implementation`` declares ``dtype`` for the equation of check ``name``: a file of
    another dtype is a mismatch of file and implementation, not a failure of the implementation."""
    from aiayn.conformance.harness import CHECKS
    from aiayn.implementations.protocol import DTYPES, scope_of

    if dtype not in DTYPES:
        raise ReplayError(f"{path}: its dtype {dtype!r} is not one of the contract's dtypes {', '.join(DTYPES)}")
    declared = tuple(getattr(implementation, "dtypes", ()) or ())
    if dtype not in declared:
        raise ReplayError(
            f"{path}: the check ran in {dtype}, which implementation {spec!r} does not declare "
            f"(it declares {', '.join(map(str, declared)) or 'no dtype'})"
        )
    equation = getattr(CHECKS[name], "equation", "contract")
    scoped = None if equation == "contract" else scope_of(implementation, equation).dtypes
    if scoped is not None and dtype not in scoped:
        raise ReplayError(
            f"{path}: the check ran in {dtype}; implementation {spec!r} declares {equation} only in "
            f"{', '.join(scoped)} (its scope)"
        )


def replay(files: Sequence[str | Path], impl: str | None = None) -> int:
    """Rerun the check saved in each file; print PASS or the failure. 0 all pass, 1 one fails; ReplayError for a bad
    file or spec."""
    from aiayn.conformance.checks import load_all
    from aiayn.conformance.harness import CHECKS, ConformanceFailure, register_spec
    from aiayn.environment import missing_extra
    from aiayn.implementations import registry

    load_all()
    status = 0
    for file in files:
        path = Path(file)
        spec, dtype, name, inputs = _read(path)
        spec = impl or spec
        try:
            implementation = registry.load(spec)
        except registry.ImplementationNotFound as exc:
            extra = missing_extra(exc)
            raise ReplayError(
                f"{path}: cannot load implementation {spec!r}: {extra or ' '.join(str(exc).split())}"
            ) from None
        _runs_in(path, implementation, spec, dtype, name)
        register_spec(implementation, spec)
        try:
            CHECKS[name](implementation, dtype, **inputs)
        except ConformanceFailure as failure:
            print(f"FAIL {path}\n{failure}")
            status = 1
        else:
            print(f"PASS {path}: check {name} of {spec} in {dtype}")
    return status
