"""Find an implementation by name, importing it only when it is chosen.

Three ways to name an implementation (see :func:`load`):

1. a built-in name from :data:`BUILTINS` (``"numpy"``, ``"torch"``, ...);
2. a name registered by an installed package under the entry-point group
   :data:`ENTRY_POINT_GROUP` (``"aiayn.implementations"``). In your ``pyproject.toml``::

       [project.entry-points."aiayn.implementations"]
       mine = "my_package.attention:MyImplementation"

3. a direct ``"module:attr"`` reference, e.g.
   ``"aiayn.implementations.examples.my_attention:MyAttention"``.

``attr`` may be a class (instantiated with no arguments), a factory function (called with no
arguments), or a ready-made instance; dotted attributes (``"module:Class.factory"``) work too.
Whatever it yields must satisfy :class:`aiayn.implementations.protocol.Implementation`.

Loading code that is not aiayn's own (an entry point, a ``module:attr``) is probed first in a child process
(:func:`probe`): an import or constructor that ends the process (``os._exit``, a signal, an exit status changed at
shutdown) or hangs there ends the child, and the load is refused with the reason, instead of ending the run that asked
for it with a status the implementation chose. Anything it raises, ``SystemExit`` and ``KeyboardInterrupt`` included,
is a refusal too, never the end of the run.

Built-ins are plain ``"module:attr"`` strings, so importing this module imports no array
library: a NumPy-only run never imports torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aiayn.implementations.protocol import Implementation, contract_problems

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "ImplementationNotFound",
    "InvalidImplementation",
    "entry_points",
    "known_names",
    "load",
    "probe",
    "zoo",
]

#: Built-in implementation names → ``"module:attr"``, imported only by :func:`load`.
BUILTINS: Mapping[str, str] = MappingProxyType(
    {
        "numpy": "aiayn.implementations.numpy_impl:NumpyImplementation",
        "numpy-blocked": "aiayn.implementations.numpy_impl:blocked_numpy_implementation",
        "torch": "aiayn.implementations.torch_decoding:TorchDecoding",
        "torch-sdpa": "aiayn.implementations.torch_decoding:TorchSDPADecoding",
        "torch-nn": "aiayn.implementations.torch_nn:TorchNNImplementation",
        "torch-nn-fastpath": "aiayn.implementations.torch_nn:TorchNNFastPath",
    }
)

#: The entry-point group third-party packages register implementations under.
ENTRY_POINT_GROUP = "aiayn.implementations"


class ImplementationNotFound(LookupError):
    """No implementation could be loaded for a name: unknown, or its import failed.

    The message names what was asked for, what went wrong, and every known name.
    """


class InvalidImplementation(ImplementationNotFound):
    """The name resolved to an object that does not satisfy the Implementation contract."""


class _Misplaced(ValueError):
    """Internal: the implementation loads but cannot be placed on the device asked for."""


class _Flushing(ImplementationNotFound):
    """Loading the implementation turned the processor's subnormal flushing on for the whole process."""


class _UnknownName(Exception):
    """Internal: the name is neither ``module:attr``, a built-in, nor an entry point."""


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Entry points of :data:`ENTRY_POINT_GROUP` by name (the first of any duplicate wins)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def zoo() -> Mapping[str, str]:
    """The zoo's adapters (``aiayn.implementations.zoo``) by name -> ``"module:attr"``, built-ins left out."""
    from aiayn.implementations.zoo import ZOO

    return {name: entry.target for name, entry in ZOO.items() if name not in BUILTINS}


def known_names() -> list[str]:
    """Return every name :func:`load` accepts without a ``":"``: built-ins first, then the zoo, then entry points.

    A built-in name shadows a zoo name, and both shadow an entry point of the same name.
    """
    return list(BUILTINS) + list(zoo()) + sorted(n for n in entry_points() if n not in BUILTINS and n not in zoo())


def _not_found(
    spec: str, reason: str, cls: type[ImplementationNotFound] = ImplementationNotFound, *, names: bool = True
) -> ImplementationNotFound:
    """The error for ``spec``; ``names``: list the known names too (not when the name itself was found)."""
    known = (
        f" Known names: {', '.join(known_names())}; or name one directly as 'module:attr' "
        f"(e.g. 'aiayn.implementations.examples.my_attention:MyAttention')."
    )
    return cls(f"cannot load implementation {spec!r}: {reason}." + (known if names else ""))


def _import_target(target: str) -> Any:
    """Import ``"module:attr"`` (``attr`` may be dotted) and return the attribute."""
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise ValueError(f"expected 'module:attr', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _instantiate(obj: Any, device: str | None = None) -> Any:
    """Turn a class, a factory or an instance into an instance (on ``device``, when one is asked for)."""
    constructor = isinstance(obj, type) or (callable(obj) and not isinstance(obj, Implementation))
    if device is None:
        return obj() if constructor else obj
    if not constructor:
        if _same_device(getattr(obj, "device", None), device):
            return obj
        raise _Misplaced(
            f"it is a ready-made instance on device {getattr(obj, 'device', None)!r} and cannot be placed on {device!r}"
        )
    try:
        takes_device = "device" in inspect.signature(obj).parameters
    except (TypeError, ValueError):
        takes_device = False
    if not takes_device:
        impl = obj()
        declared = getattr(impl, "device", None)
        if _same_device(declared, device):  # already there (numpy on "cpu")
            return impl
        raise _Misplaced(
            f"it runs on {declared!r} only (its constructor takes no 'device' argument), so it cannot be placed on "
            f"{device!r}"
        )
    impl = obj(device=device)
    if not _same_device(getattr(impl, "device", None), device):
        raise _Misplaced(f"asked for device {device!r}, it declares device {getattr(impl, 'device', None)!r}")
    return impl


def _same_device(declared: Any, asked: str) -> bool:
    """'cuda' matches 'cuda' and 'cuda:0'; 'cuda:1' matches only itself."""
    return isinstance(declared, str) and (
        declared == asked or declared.split(":")[0] == asked or asked.split(":")[0] == declared
    )


def _resolve(spec: str) -> tuple[Any, str]:
    """Return (the object ``spec`` names, a description of where it came from)."""
    if ":" in spec:
        return _import_target(spec), spec
    if spec in BUILTINS:
        return _import_target(BUILTINS[spec]), f"built-in {BUILTINS[spec]}"
    if spec in zoo():
        return _import_target(zoo()[spec]), f"zoo adapter {zoo()[spec]}"
    registered = entry_points()
    if spec in registered:
        ep = registered[spec]
        return ep.load(), f"entry point {ep.value} ({ENTRY_POINT_GROUP})"
    raise _UnknownName(spec)


#: How long loading an implementation may take in the probe's child process (seconds): importing a large library
#: (transformers, jax) takes seconds on a small machine; one that takes minutes is taken to hang.
PROBE_LIMIT_S = 120.0

#: The child's exit status after a finished probe: an implementation whose atexit handler or thread ends the process
#: its own way changes it (any status it picks, 0 included, is then told apart from this one).
_PROBED = 86

#: The environment variable that marks the probe's child (which loads without probing again).
_PROBING = "AIAYN_PROBING"

_probed: set[tuple[str, str | None]] = set()


def _foreign(spec: str) -> bool:
    """Code that is not aiayn's own: a ``module:attr`` or an entry point (a built-in or zoo name is aiayn's code,
    tested by its own suite, and loaded unprobed; an unknown name loads nothing)."""
    return ":" in spec or (spec not in BUILTINS and spec not in zoo() and spec in entry_points())


def probe(spec: str, device: str | None = None, limit: float = PROBE_LIMIT_S) -> None:
    """Load ``spec`` in a child process first; raise :class:`ImplementationNotFound` where loading it ends or hangs
    the process, or raises something that would end it (``SystemExit``, ``KeyboardInterrupt``). An ordinary exception
    is left to the load in this process, which raises it with its usual message."""
    with tempfile.TemporaryDirectory(prefix="aiayn-probe-") as folder:
        result = Path(folder) / "result.json"
        command = [sys.executable, "-c", "import sys; from aiayn.implementations.registry import _probe_child; "
                   "_probe_child(*sys.argv[1:])", spec, device or "", str(result)]  # fmt: skip
        try:
            proc = subprocess.run(
                command,
                env={**os.environ, _PROBING: "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=limit,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _not_found(
                spec, f"loading it did not finish within {limit:g} s (probed in a child process)"
            ) from None
        try:
            said = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            said = None
    code = proc.returncode
    status = (
        f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit {code}"
    )
    if not isinstance(said, dict):
        last = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise _not_found(
            spec,
            f"its import or construction ended the process ({status}) before loading finished"
            + (f", after printing {last[0][:200]!r}" if last else "")
            + "; an implementation reports a problem by raising an exception",
            names=False,
        )
    if said.get("flushes"):
        raise _Flushing(str(said["flushes"]))
    if said.get("raised_base"):
        raise _not_found(
            spec,
            f"its import or construction raised {said['raised_base']}, which ends a process; an implementation "
            "reports a problem by raising an exception",
            names=False,
        )
    if said.get("loaded") and code != _PROBED:
        raise _not_found(
            spec,
            f"it loads, but then changes how the process ends ({status} at shutdown where the loader exits "
            f"{_PROBED}): an atexit handler or a thread of the implementation ends the process its own way, which "
            "would decide the exit status of the run that checks it",
            names=False,
        )


def flushed_subnormals() -> str | None:
    """Which of the processor's flush modes this thread runs under, tested by arithmetic: "FTZ" (a subnormal result
    becomes 0: 2^-1022 / 2), "DAZ" (a subnormal input is read as 0: 2^-1074 * 2), both joined by " and ", or None.
    Shared libraries built with -ffast-math set both when they load, for the whole process."""
    smallest_normal, smallest = float.fromhex("0x1p-1022"), float.fromhex("0x1p-1074")  # not folded at compile time
    modes = [name for name, zero in (("FTZ", smallest_normal / 2), ("DAZ", smallest * 2)) if zero == 0.0]
    return " and ".join(modes) or None


_FLUSHED_BY: list[str] = []  # in the probe's child: the module whose import turned flushing on


def _flushing(spec: str, modes: str, where: str) -> ImplementationNotFound:
    by = f" by {_FLUSHED_BY[0]}" if _FLUSHED_BY and where.startswith("while importing") else ""
    return _not_found(
        spec,
        f"your implementation flushes subnormals process-wide: {modes} set{by} {where}. Every computation of this "
        "process would then read and give subnormal numbers as 0, aiayn's oracle and its input draws included, so "
        "it cannot be judged in aiayn's process; build that library without -ffast-math (or set the mode around its "
        "own calls only)",
        _Flushing,
        names=False,
    )


def watch_flushing() -> Callable[[], None]:
    """Until the returned function is called, remember the first import after which this process flushes subnormals
    (:func:`flushing_culprit`): for a process that loads an implementation apart from aiayn's (the probe's child, the
    boundary's child)."""
    import builtins

    original = builtins.__import__

    def watching(name: str, *args: Any, **kwargs: Any) -> Any:
        module = original(name, *args, **kwargs)
        if not _FLUSHED_BY and flushed_subnormals():
            _FLUSHED_BY.append(f"the import of {name}")
        return module

    def stop() -> None:
        if builtins.__import__ is watching:
            builtins.__import__ = original

    builtins.__import__ = watching
    return stop


def flushing_culprit() -> str | None:
    """The import after which flushing was first seen ("the import of NAME"), where :func:`watch_flushing` watched."""
    return _FLUSHED_BY[0] if _FLUSHED_BY else None


def _probe_child(spec: str, device: str, result: str) -> None:
    """The probe's child: load ``spec`` (watching every import for the one that turns flushing on), write what
    happened to ``result``, exit with :data:`_PROBED`."""
    watch_flushing()
    said: dict[str, Any]
    try:
        load(spec, device=device or None)
    except _Flushing as exc:
        said = {"flushes": str(exc)}
    except ImplementationNotFound as exc:
        cause = exc.__cause__
        base = cause is not None and not isinstance(cause, Exception)
        said = {"raised_base": f"{type(cause).__name__}({cause})"} if base else {"raised": str(exc)}
    except BaseException as exc:  # noqa: BLE001 (what the implementation raised is the probe's finding)
        said = {"raised_base" if not isinstance(exc, Exception) else "raised": f"{type(exc).__name__}({exc})"}
    else:
        said = {"loaded": True}
    Path(result).write_text(json.dumps(said), encoding="utf-8")
    sys.stdout.flush()
    sys.exit(_PROBED)


def load(spec: str, *, device: str | None = None, refuse_flushing: bool = True) -> Implementation:
    """Return the implementation ``spec`` names, checked against the contract.

    ``spec`` is a built-in name (:data:`BUILTINS`), an entry-point name (group
    :data:`ENTRY_POINT_GROUP`) or ``"module:attr"``. ``device`` (e.g. ``"cuda"``) is passed to a
    class or factory that takes a ``device`` argument (the torch built-ins do); an implementation
    that cannot be placed there is an error, never silently left where it is. Raises
    :class:`ImplementationNotFound` for an unknown name or any failure to import or construct it
    (the underlying error is in the message and chained), and :class:`InvalidImplementation` when
    the object breaks the contract (see :func:`aiayn.implementations.protocol.contract_problems`).
    ``refuse_flushing=False``: an implementation that turns on flush-to-zero is loaded anyway (in a process of its
    own, where only its arithmetic flushes: ``conformance/run/boundary.py``).
    """
    if not isinstance(spec, str) or not spec:
        raise _not_found(repr(spec), "expected a non-empty string")
    inside = os.environ.get(_PROBING) or os.environ.get("PYTEST_XDIST_WORKER")  # the probe, or a probed run's worker
    if _foreign(spec) and not inside and (spec, device) not in _probed:
        probe(spec, device)
        _probed.add((spec, device))
    before = flushed_subnormals()  # already on (set by something else): not this implementation's doing
    try:
        obj, origin = _resolve(spec)
        if refuse_flushing and not before and flushed_subnormals():
            raise _flushing(spec, str(flushed_subnormals()), f"while importing {spec.split(':')[0]}")
        impl = _instantiate(obj, device)
        if refuse_flushing and not before and flushed_subnormals():
            raise _flushing(spec, str(flushed_subnormals()), "by its constructor")
    except ImplementationNotFound:
        raise
    except _UnknownName:
        raise _not_found(spec, "unknown name") from None
    except _Misplaced as exc:
        raise _not_found(spec, str(exc), names=False) from None
    except Exception as exc:  # import errors, a missing attribute, a failing constructor
        raise _not_found(spec, f"{type(exc).__name__}: {exc}") from exc
    except BaseException as exc:  # SystemExit, KeyboardInterrupt at import: a refusal, never the end of the run
        raise _not_found(
            spec,
            f"its import or construction raised {type(exc).__name__}({exc}), which ends a process; an implementation "
            "reports a problem by raising an exception",
            names=False,
        ) from exc
    problems = contract_problems(impl)
    if problems:
        raise _not_found(
            spec,
            f"{origin} gave {impl!r}, which breaks the contract: {'; '.join(problems)}",
            InvalidImplementation,
            names=False,
        )
    return impl
