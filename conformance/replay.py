"""Rerun failed checks from their saved inputs (``aiayn replay FILE.npz [--impl SPEC]``).

A failing check saves its inputs under ``aiayn.environment.failure_dir()`` (``$AIAYN_FAILURES``,
else ``~/.cache/aiayn/failures``) and prints the replay command. The file names the
implementation (as given to ``--impl``), the dtype and the check; ``--impl`` overrides the
implementation (e.g. to try a fix under another name).

A replay file is data. Every field is checked by type before use (``failures.load_case``, then the check's name,
the dtype and each argument the check's signature types here), and the implementation it names is imported only
when it is a name aiayn knows (a built-in, a zoo adapter, or an installed package's entry point): a ``module:attr``
named by a file is refused, with the command that runs it once you have read it (``--impl module:attr``), because
importing it would run whatever code the file points at. Before a check runs, the spec that will run is printed.

A file that is not a replay file, that names an implementation it may not import, or whose dtype the
implementation does not declare for the check's equation, is a usage error (:class:`ReplayError`, one line
naming the file and the field), never a failure of the implementation.
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ReplayError", "replay"]


class ReplayError(Exception):
    """A replay file or implementation that cannot be used; the message is one line."""


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


#: The argument types a check's signature names (as written in its annotation) -> (test, what is expected). An
#: argument whose annotation is not here (``Any``, the ``**args`` of an agreement check) is checked only as
#: ``failures.load_case`` checks every argument.
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "np.ndarray": (lambda v: isinstance(v, np.ndarray), "an array"),
    "np.ndarray | None": (lambda v: v is None or isinstance(v, np.ndarray), "an array or null"),
    "int": (_is_int, "an integer"),
    "float": (_is_number, "a number"),
    "str": (lambda v: type(v) is str, "a string"),
    "bool": (lambda v: type(v) is bool, "a boolean"),
    "list[int]": (lambda v: type(v) is list and all(map(_is_int, v)), "a list of integers"),
    "dict[str, np.ndarray]": (
        lambda v: type(v) is dict and all(isinstance(x, np.ndarray) for x in v.values()),
        "an object of arrays",
    ),
    "dict[str, Any]": (lambda v: type(v) is dict, "an object"),
}


def _read(path: Path) -> tuple[str, str, str, dict]:
    from aiayn.conformance.run.failures import load_case
    from aiayn.conformance.run.harness import CHECKS
    from aiayn.implementations.protocol import DTYPES

    if not path.exists():
        raise ReplayError(f"{path}: no such file (failure files are in $AIAYN_FAILURES, else ~/.cache/aiayn/failures)")
    try:
        spec, dtype, name, inputs = load_case(path)
    except Exception as exc:  # the file is data: whatever reading it raises says only that it is not a replay file
        why = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
        raise ReplayError(
            f"{path}: not a replay file written by the conformance suite ({' '.join(why.split())[:300]})"
        ) from None
    if name not in CHECKS:
        raise ReplayError(
            f"{path}: names check {name[:80]!r} (field 'check'), which this version of aiayn does not have"
        )
    if dtype not in DTYPES:
        raise ReplayError(
            f"{path}: its dtype {dtype[:80]!r} is not one of the contract's dtypes {', '.join(DTYPES)} (field 'dtype')"
        )
    signature = inspect.signature(CHECKS[name])
    try:
        signature.bind(None, **inputs)
    except TypeError as exc:
        raise ReplayError(f"{path}: its saved arguments do not fit check {name} ({exc})") from None
    for argument, value in inputs.items():
        parameter = signature.parameters.get(argument)
        annotation = parameter.annotation if parameter is not None else None
        if isinstance(annotation, str) and annotation in _TYPES:
            test, expected = _TYPES[annotation]
            if not test(value):
                found = f"{type(value).__name__} {repr(value)[:60]}" if not isinstance(value, np.ndarray) else "array"
                raise ReplayError(
                    f"{path}: its field 'args/{argument}' is {found}, expected {expected} (check {name}'s argument)"
                )
    return spec, dtype, name, inputs


#: A spec that can be shown as a shell word to copy: ``module:attr`` of Python identifiers.
_PLAIN_SPEC = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")


def _known_origin(spec: str) -> str | None:
    """Where a name aiayn knows comes from (a built-in, a zoo adapter, an installed package's entry point); None for
    anything else, ``module:attr`` included."""
    from aiayn.implementations import registry

    if ":" in spec:
        return None
    if spec in registry.BUILTINS:
        return f"built-in {registry.BUILTINS[spec]}"
    zoo = registry.zoo()
    if spec in zoo:
        return f"zoo adapter {zoo[spec]}"
    entry_point = registry.entry_points().get(spec)
    if entry_point is not None:
        dist = entry_point.dist.name if entry_point.dist else "?"
        return f"entry point {entry_point.value} of {dist}"
    return None


def _chosen(path: Path, recorded: str, impl: str | None) -> tuple[str, str]:
    """(the spec to run, where it comes from): ``--impl`` as the user named it, else the file's spec when it is a
    name aiayn knows; ReplayError for any other spec a file names."""
    if impl:
        return impl, "named by --impl"
    origin = _known_origin(recorded)
    if origin is not None:
        return recorded, f"named by the file: {origin}"
    command = f"aiayn replay {shlex.quote(str(path))} --impl "
    if _PLAIN_SPEC.fullmatch(recorded):
        what, how = "a module:attr", f"if you trust that code, run it by name: {command}{recorded}"
    else:
        what, how = "neither a name aiayn knows nor a module:attr", f"name an implementation: {command}SPEC"
    raise ReplayError(
        f"{path}: its field 'impl' names {recorded[:120]!r}, {what}; aiayn imports only built-in, zoo and "
        f"entry-point names that a file names; {how}"
    )


def _runs_in(path: Path, implementation: Any, spec: str, dtype: str, name: str) -> None:
    """Raise ReplayError unless ``implementation`` declares ``dtype`` for the equation of check ``name``: a file of
    another dtype is a mismatch of file and implementation, not a failure of the implementation."""
    from aiayn.conformance.run.harness import CHECKS
    from aiayn.implementations.protocol import scope_of

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


def replay(files: Sequence[str | Path], impl: str | None = None, *, in_process: bool = False) -> int:
    """Rerun the check saved in each file; print which spec runs, then PASS or the failure. 0 all pass, 1 one
    fails; ReplayError for a bad file or spec, before anything of that file is imported or run. The implementation
    runs in a process of its own (``run/boundary.py``), or in this one with ``in_process`` (for a debugger)."""
    from aiayn.conformance.checks import load_all
    from aiayn.conformance.run import boundary, declarations
    from aiayn.conformance.run.failures import register_spec
    from aiayn.conformance.run.harness import CHECKS, ConformanceFailure
    from aiayn.conformance.run.isolation import CallTimedOut, ProcessCrashed
    from aiayn.conformance.run.plugin import deviation_names
    from aiayn.environment import missing_extra
    from aiayn.implementations import registry

    load_all()
    declarations.tests_from(deviation_names)  # the contract check reads known_deviations' names against them
    status = 0
    for file in files:
        path = Path(file)
        recorded, dtype, name, inputs = _read(path)
        spec, origin = _chosen(path, recorded, impl)
        where = "in this process" if in_process else "in a process of its own"
        print(f"replaying {path}: check {name} in {dtype} on implementation {spec!r} ({origin}), {where}", flush=True)
        try:
            implementation = registry.load(spec) if in_process else boundary.load(spec)
        except registry.ImplementationNotFound as exc:
            extra = missing_extra(exc)
            raise ReplayError(
                f"{path}: cannot load implementation {spec!r}: {extra or ' '.join(str(exc).split())}"
            ) from None
        _runs_in(path, implementation, spec, dtype, name)
        register_spec(implementation, spec)
        try:
            CHECKS[name](implementation, dtype, **inputs)
        except (ConformanceFailure, ProcessCrashed, CallTimedOut) as failure:
            print(f"FAIL {path}\n{failure}")
            status = 1
        else:
            print(f"PASS {path}: check {name} of {spec} in {dtype}")
        finally:
            boundary.close(implementation)
    return status
