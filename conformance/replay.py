"""Rerun failed checks from their saved inputs (``aiayn replay FILE.npz [--impl SPEC]``).

A failing check saves its inputs under ``aiayn.environment.failure_dir()`` (``$AIAYN_FAILURES``,
else ``~/.cache/aiayn/failures``) and prints the replay command. The file names the
implementation (as given to ``--impl``), the dtype and the check; ``--impl`` overrides the
implementation (e.g. to try a fix under another name).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

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
        raise ReplayError(
            f"{path}: not a replay file written by the conformance suite ({type(exc).__name__}: {exc})"
        ) from None
    if name not in CHECKS:
        raise ReplayError(f"{path}: names check {name!r}, which this version of aiayn does not have")
    return spec, dtype, name, inputs


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
        register_spec(implementation, spec)
        try:
            CHECKS[name](implementation, dtype, **inputs)
        except ConformanceFailure as failure:
            print(f"FAIL {path}\n{failure}")
            status = 1
        else:
            print(f"PASS {path}: check {name} of {spec} in {dtype}")
    return status
