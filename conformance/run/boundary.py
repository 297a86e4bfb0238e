"""The implementation in a process of its own: the judge out of its reach.

The verdict is computed by the oracle, the budgets, the diagnoses and the report, all in aiayn's process. The
implementation it judges is loaded in a child process (:func:`serve`) behind a proxy (:class:`Remote`) that has the
contract's members, so the suite calls it as it would call the implementation itself. Every call crosses the boundary
as data, never as code:

- **What crosses.** JSON for the structure (None, bool, int, float, str, lists, tuples, mappings, sets, the contract's
  ``Scope``) and raw bytes for NumPy arrays and scalars (their dtype and shape in the JSON); never pickle. What the
  implementation makes (its native arrays, decoding caches, dtype objects) stays in the child and crosses as a handle
  (:class:`Native`) that carries its type, shape, dtype and device; handed back, it is the child's own object again.
  The answers the suite reads as values cross by value (:data:`BY_VALUE`: ``to_numpy``'s array by its bytes,
  ``beam_search``'s pairs, ``lrate``'s number, ``provides()``'s names, ``dtype_name``'s string), so they are judged
  exactly as they came back, with their types.
- **Gradients by autograd** (``run/autodiff.py``: torch, JAX) are computed in the child, where the autodiff state
lives; the gradients cross as handles and are judged like every result.
- **What the implementation raises** crosses by type name and message: the built-in exceptions as themselves
  (``NotImplementedError``, ``MemoryError``, ``SystemExit`` ...), the contract's ``Unsupported`` as itself, anything
  else as an exception of the same name.
- **A child that ends** (``os._exit`` with any code, a signal, a segfault) fails the call in flight with how it ended
  and the last line it printed (:class:`ProcessEnded`); the run goes on and the next call starts a new child (a handle
  of the old one handed back fails by name). A call interrupted in the parent (the time limit of ``run/isolation.py``,
  Ctrl-C) ends the child too. The child ends with its parent (``PR_SET_PDEATHSIG`` on Linux, and at its parent's exit).
- **Its floating-point environment** is read after loading: a library that sets flush-to-zero or denormals-are-zero
  on load (as libraries built with -ffast-math have done) changes the child's arithmetic only, which is judged as it
  is; :func:`flushes` says so in one line, which the report carries.
- **The judged code cannot reach the judge**: a module whose import replaces ``comparison.compare`` or an oracle
  function replaces the child's copy, which judges nothing.

``aiayn check --in-process`` (``pytest --aiayn-in-process``) loads the implementation into aiayn's own process
instead, for a debugger; the report then says that its verdict was not isolated.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import faulthandler
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.implementations import protocol, registry

__all__ = [
    "BY_VALUE",
    "Native",
    "ProcessEnded",
    "Remote",
    "autograd",
    "call_each",
    "close",
    "flushes",
    "from_numpy_then_fill",
    "isolation",
    "load",
    "serve",
]

#: The methods whose answers the suite reads as values: they cross by value (an ndarray by its bytes), never as a
#: handle, whatever they are; every other method's answer keeps what the implementation made in its process.
BY_VALUE = frozenset({"to_numpy", "dtype_name", "provides", "lrate", "beam_search"})

#: How long loading may take in the child (seconds): an import that hangs is "cannot be loaded".
LOAD_LIMIT_S = registry.PROBE_LIMIT_S

_PLAIN = ("op", "name", "library", "equation", "names")  # a request's fields that are plain JSON (str, list of str)
_ARRAY_KINDS = "biufc"  # NumPy kinds that cross by value: bool, integers, floats, complex (never object or void)
_HEADER = struct.Struct("<II")  # JSON length, number of buffers
_LENGTH = struct.Struct("<Q")


class ProcessEnded(Exception):
    """The implementation's process ended during a call (the message says how, and what it printed last; ``cause``
    in a few words: "exit 0", "killed by SIGSEGV")."""

    def __init__(self, message: str, cause: str = "process ended") -> None:
        super().__init__(message)
        self.cause = cause


class Garbled(Exception):
    """A message across the boundary that does not follow its format (the child's process is then ended)."""


# --------------------------------------------------------------------------------------------
# the wire: one message is a JSON tree plus raw buffers


def _send(sock: socket.socket, tree: Any, buffers: list[memoryview]) -> None:
    text = json.dumps(tree, allow_nan=True, separators=(",", ":")).encode("utf-8")
    head = _HEADER.pack(len(text), len(buffers)) + b"".join(_LENGTH.pack(b.nbytes) for b in buffers)
    if sum(b.nbytes for b in buffers) < 1 << 20:  # small: one write
        sock.sendall(b"".join([head, text, *buffers]))
        return
    sock.sendall(head + text)
    for b in buffers:
        if b.nbytes:
            sock.sendall(b)


def _exactly(reader: Any, n: int) -> bytes | None:
    data = reader.read(n)
    return data if len(data) == n else None  # short: the other end closed


def _receive(reader: Any) -> tuple[Any, list[bytes]] | None:
    """The next message from ``reader`` (a socket's buffered reader), or None where the other end has closed."""
    sock = reader
    head = _exactly(sock, _HEADER.size)
    if head is None:
        return None
    n_text, n_buffers = _HEADER.unpack(head)
    if n_buffers > 1 << 20:
        raise Garbled(f"a message announces {n_buffers} buffers")
    lengths_raw = _exactly(sock, _LENGTH.size * n_buffers) if n_buffers else b""
    text = _exactly(sock, n_text)
    if lengths_raw is None or text is None:
        return None
    buffers = []
    for i in range(n_buffers):
        (n,) = _LENGTH.unpack_from(lengths_raw, i * _LENGTH.size)
        buf = _exactly(sock, n) if n else b""
        if buf is None:
            return None
        buffers.append(buf)
    try:
        tree = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Garbled(f"a message is not JSON: {exc}") from None
    return tree, buffers


def _encode(value: Any, buffers: list[memoryview], keep: Callable[[Any], Any], *, by_value: bool) -> Any:
    """``value`` as a JSON tree (arrays' bytes appended to ``buffers``); an object that does not cross by value is
    ``keep(value)`` (the child: a new handle; the parent: an error, it sends only data and handles)."""

    def enc(v: Any) -> Any:
        t = type(v)
        if v is None or t is str or t is int or t is float or t is bool:
            return v
        if t is list:
            return [enc(x) for x in v]
        if t is tuple:
            return {"$": "tuple", "v": [enc(x) for x in v]}
        if t is set or t is frozenset:
            return {"$": t.__name__, "v": [enc(x) for x in v]}
        if t is dict or (t is not Native and isinstance(v, Mapping)):
            return {"$": "map", "v": [[enc(k), enc(x)] for k, x in v.items()]}
        if t is protocol.Scope:
            return {"$": "scope", "v": {f.name: enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        if by_value and t is np.ndarray and v.dtype.kind in _ARRAY_KINDS and not v.dtype.hasobject:
            a = np.ascontiguousarray(v)
            buffers.append(memoryview(a.reshape(-1).view(np.uint8)))
            return {"$": "array", "dtype": a.dtype.str, "shape": list(a.shape), "b": len(buffers) - 1}
        if by_value and isinstance(v, np.generic) and v.dtype.kind in _ARRAY_KINDS:
            buffers.append(memoryview(np.array(v).reshape(-1).view(np.uint8)))
            return {"$": "scalar", "dtype": v.dtype.str, "b": len(buffers) - 1}
        return keep(v)

    return enc(value)


def _decode(tree: Any, buffers: list[bytes], handle: Callable[[dict[str, Any]], Any]) -> Any:
    """The value of a JSON tree from :func:`_encode`; every field is checked, for the tree may come from the
    implementation's process (:class:`Garbled` where it does not follow the format)."""

    def array(node: dict[str, Any], shape: Any) -> np.ndarray:
        b = node.get("b")
        if type(b) is not int or not 0 <= b < len(buffers) or type(node.get("dtype")) is not str:
            raise Garbled(f"an array with buffer {b!r} of {len(buffers)} and dtype {node.get('dtype')!r}")
        try:
            dtype = np.dtype(node["dtype"])
        except (TypeError, ValueError):
            raise Garbled(f"an array of dtype {node['dtype']!r}") from None
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject:
            raise Garbled(f"an array of dtype {dtype}")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise Garbled(f"an array of shape {shape!r}")
        raw = buffers[b]
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise Garbled(f"an array of shape {shape} and dtype {dtype} in {len(raw)} bytes")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def dec(x: Any) -> Any:
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is list:
            return [dec(v) for v in x]
        if type(x) is not dict:
            raise Garbled(f"a value {x!r}")
        tag = x.get("$")
        items = x.get("v")
        if tag in ("tuple", "set", "frozenset") and type(items) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](dec(v) for v in items)
        if tag == "map" and type(items) is list and all(type(p) is list and len(p) == 2 for p in items):
            return {dec(k): dec(v) for k, v in items}
        if tag == "scope" and type(items) is dict:
            names = {f.name for f in dataclasses.fields(protocol.Scope)}
            if not set(items) <= names:
                raise Garbled(f"a Scope with fields {sorted(items)}")
            return protocol.Scope(**{k: dec(v) for k, v in items.items()})
        if tag == "array":
            return array(x, x.get("shape"))
        if tag == "scalar":
            return array(x, [])[()]
        if tag == "h":
            return handle(x)
        raise Garbled(f"a value tagged {tag!r}")

    try:
        return dec(tree)
    except (TypeError, RecursionError) as exc:  # unhashable keys, a nesting too deep
        raise Garbled(f"{type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------------
# the parent: a proxy with the contract's members


class Native:
    """Something the implementation made (a native array, a cache, a dtype object), kept in its process.

    It has what the suite reads of a native value where the object has it: ``shape`` (a tuple of ints), ``dtype``
    (a :class:`Native` of the dtype object, printed as the implementation prints it) and ``device`` (the device's
    printed name); handed back to the implementation, it is the object itself again.
    """

    __slots__ = ("_remote", "_id", "_generation", "_meta", "__weakref__")

    def __init__(self, remote: Remote, ident: int, generation: int, meta: dict[str, Any]) -> None:
        self._remote, self._id, self._generation, self._meta = remote, ident, generation, meta

    def __getattr__(self, name: str) -> Any:
        meta = object.__getattribute__(self, "_meta")
        if name in ("shape", "dtype", "device") and name in meta:
            return meta[name]
        raise AttributeError(f"{self.type_name} has no attribute {name!r} readable across the process boundary")

    @property
    def type_name(self) -> str:
        """The type of the object in the implementation's process, e.g. ``torch.Tensor``."""
        return str(self._meta.get("type", "?"))

    @property
    def library(self) -> str:
        """The top-level module of the object's type, e.g. ``torch``, ``jaxlib``, ``numpy``."""
        return self.type_name.split(".", 1)[0]

    def __str__(self) -> str:
        text = self._meta.get("str")
        return text if isinstance(text, str) else f"<{self.type_name}>"

    __repr__ = __str__

    def __del__(self) -> None:
        remote = self._remote
        if remote is not None and remote._generation == self._generation:
            remote._released.append(self._id)


def _why_ended(code: int | None) -> str:
    if code is None:
        return "ended"
    if code < 0 and -code in signal.valid_signals():
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


class Remote:
    """The implementation ``spec`` names, loaded in a child process: the contract's attributes (read once, at load)
    and methods (each call forwarded); :func:`autograd` gives the gradients of an implementation without ``vjp``.

    Raises :class:`registry.ImplementationNotFound` where it cannot be loaded: an import that raises, ends the child
    (``os._exit``, ``sys.exit``, a signal) or does not finish within :data:`LOAD_LIMIT_S`.
    """

    def __init__(self, spec: str, *, device: str | None = None) -> None:
        self._spec, self._device = spec, device
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: Any = None  # the socket's buffered reader
        self._log: Path | None = None
        self._generation = 0
        self._released: list[int] = []
        self._methods: dict[str, Callable[..., Any]] = {}
        manifest = self._start()
        self._attrs: dict[str, Any] = manifest["attrs"]
        self._callables: frozenset[str] = frozenset(manifest["methods"])
        self._repr = str(manifest["repr"])
        self._flushes: str | None = manifest["flushes"]

    # ---- the contract's members

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._callables:
            method = self._methods.get(name)
            if method is None:
                method = self._methods[name] = self._forwarder(name)
            return method
        if name in self._attrs:
            return self._attrs[name]
        raise AttributeError(f"{self._repr} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._attrs) | self._callables)

    def __repr__(self) -> str:
        return self._repr

    def _forwarder(self, name: str) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._request({"op": "call", "name": name, "args": list(args), "kwargs": kwargs})

        forward.__name__ = forward.__qualname__ = name
        return forward

    # ---- the child

    def _start(self) -> dict[str, Any]:
        if self._log is not None:
            self._log.unlink(missing_ok=True)  # the log of an ended child, read already
        ours, theirs = socket.socketpair()
        handle, log = tempfile.mkstemp(prefix="aiayn-impl-", suffix=".log")
        self._log = Path(log)
        command = [
            sys.executable,
            "-c",
            "from aiayn.conformance.run.boundary import serve; serve()",
            str(theirs.fileno()),
        ]
        try:
            self._proc = subprocess.Popen(
                command,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                env={**os.environ, "AIAYN_PROBING": "1"},  # the child is the probe: it loads without probing again
            )
        finally:
            theirs.close()
            os.close(handle)
        self._sock, self._reader = ours, ours.makefile("rb", buffering=1 << 16)
        self._generation += 1
        self._released = []
        _LIVE.add(self)
        ours.settimeout(LOAD_LIMIT_S)
        try:
            # the child imports as this process does: the same path, and the same modules known to be absent
            absent = sorted(name for name, module in sys.modules.items() if module is None)
            hello = {"spec": self._spec, "device": self._device, "path": list(sys.path), "absent": absent}
            _send(ours, hello, [])
            reply = _receive(self._reader)
        except TimeoutError:
            self._end()
            raise self._not_loaded(f"loading it did not finish within {LOAD_LIMIT_S:g} s") from None
        except (Garbled, OSError) as exc:
            self._end()
            raise self._not_loaded(f"its process sent no readable answer ({exc})") from None
        ours.settimeout(None)
        if reply is None:
            code = self._end()
            last = self._last_line()
            raise self._not_loaded(
                f"its import or construction ended the process ({_why_ended(code)}) before loading finished"
                + (f", after printing {last!r}" if last else "")
                + "; an implementation reports a problem by raising an exception"
            )
        tree, buffers = reply
        if type(tree) is not dict:
            self._end()
            raise self._not_loaded(f"its process sent an unreadable description ({type(tree).__name__})")
        if "not_found" in tree:
            self._end()
            error = registry.ImplementationNotFound(str(tree["not_found"]))
            extra = tree.get("missing_extra")
            if isinstance(extra, str):
                from aiayn.environment import MissingExtra

                raise error from MissingExtra(extra)
            raise error
        try:
            manifest = self._decoded(tree.get("manifest"), buffers)
            if not (
                type(manifest) is dict
                and type(manifest.get("attrs")) is dict
                and all(type(k) is str for k in manifest["attrs"])
                and type(manifest.get("methods")) is list
                and all(type(m) is str for m in manifest["methods"])
                and type(manifest.get("repr")) is str
                and (manifest.get("flushes") is None or type(manifest["flushes"]) is str)
            ):
                raise Garbled("a manifest without its fields")
        except Garbled as exc:
            self._end()
            raise self._not_loaded(f"its process sent an unreadable description ({exc})") from None
        return manifest

    def _not_loaded(self, reason: str) -> registry.ImplementationNotFound:
        return registry.ImplementationNotFound(f"cannot load implementation {self._spec!r}: {reason}.")

    def _request(self, request: dict[str, Any]) -> Any:
        if self._proc is None:
            manifest = self._start()  # a new child, after one ended
            self._flushes = manifest["flushes"]
        assert self._sock is not None
        buffers: list[memoryview] = []
        generation = self._generation

        def handle_of(value: Any) -> Any:
            if isinstance(value, Native):
                if value._remote is not self:
                    raise TypeError(f"an argument ({value.type_name}) was made by another implementation's process")
                if value._generation != generation:
                    raise ProcessEnded(
                        f"an argument ({value.type_name}) was made by an earlier process of the implementation, "
                        "which has ended"
                    )
                return {"$": "h", "id": value._id}
            raise TypeError(f"cannot hand {type(value).__name__} to the implementation's process")

        data = {k: v for k, v in request.items() if k not in _PLAIN}
        tree = {k: request[k] for k in _PLAIN if k in request}
        tree["data"] = _encode(data, buffers, handle_of, by_value=True)
        tree["release"], self._released = self._released, []
        try:
            _send(self._sock, tree, buffers)
            reply = _receive(self._reader)
        except BaseException:  # the time limit, Ctrl-C, a broken pipe: the child is mid-call, so it ends
            self._end()
            raise
        if reply is None:
            code = self._end()
            last = self._last_line()
            what = request.get("name") or request.get("op")
            frames = self._fatal_frames()
            raise ProcessEnded(
                f"the implementation's process ended ({_why_ended(code)}) during {what}"
                + (f", after printing {last!r}" if last else "")
                + "; an implementation reports a problem by raising an exception"
                + "".join(f"\n  {line}" for line in frames),
                _why_ended(code),
            )
        said, buffers = reply
        try:
            if type(said) is dict and "value" in said:
                return self._decoded(said["value"], buffers)
            if type(said) is dict and "raised" in said:
                raise _raised(said["raised"])
            if type(said) is dict and "mapped" in said:
                got = self._decoded(said["mapped"], buffers)
                if type(got) is list:
                    return got, (_raised(said["raised"]) if "raised" in said else None)
            if type(said) is dict and "autograd" in said:
                got = self._decoded(said["autograd"], buffers)
                if type(got) is list and len(got) == 2 and type(got[0]) is str:
                    return tuple(got)
            raise Garbled(f"an answer {str(said)[:100]}")
        except Garbled as exc:
            self._end()
            raise ProcessEnded(
                f"the implementation's process sent an unreadable answer ({exc}); it was ended"
            ) from None

    def _decoded(self, tree: Any, buffers: list[bytes]) -> Any:
        generation = self._generation

        def native(node: dict[str, Any]) -> Native:
            ident = node.get("id")
            if type(ident) is not int:
                raise Garbled(f"a handle {ident!r}")
            meta: dict[str, Any] = {"type": node.get("type") if type(node.get("type")) is str else "?"}
            shape = node.get("shape")
            if type(shape) is list and all(type(n) is int for n in shape):
                meta["shape"] = tuple(shape)
            if type(node.get("device")) is str:
                meta["device"] = node["device"]
            if type(node.get("str")) is str:
                meta["str"] = node["str"]
            if "dtype" in node:
                meta["dtype"] = dec_inner(node["dtype"])
            return Native(self, ident, generation, meta)

        def dec_inner(sub: Any) -> Any:
            return _decode(sub, buffers, native)

        return _decode(tree, buffers, native)

    def _printed(self) -> list[str]:
        try:
            return self._log.read_text(encoding="utf-8", errors="replace").strip().splitlines() if self._log else []
        except OSError:
            return []

    def _last_line(self) -> str:
        """What the child printed last; where it died of a fatal error, faulthandler's line naming it."""
        lines = self._printed()
        fatal = [line for line in lines if line.startswith("Fatal Python error:")]
        return (fatal or lines or [""])[-1][:200]

    def _fatal_frames(self) -> list[str]:
        """Where the child was when a fatal error ended it (faulthandler's frames of the thread that crashed, most
        recent first, at most 8), else nothing."""
        lines = self._printed()
        starts = [i for i, line in enumerate(lines) if line.startswith("Current thread 0x")]
        if not starts:
            return []
        frames = [line.strip() for line in lines[starts[-1] + 1 :] if line.strip().startswith("File ")]
        return ["where (faulthandler, most recent call first):", *frames[:8]] if frames else []

    def _end(self) -> int | None:
        """End the child (if it runs) and return its exit status."""
        proc, sock, reader = self._proc, self._sock, self._reader
        self._proc = self._sock = self._reader = None
        self._generation += 1  # every handle of the old child is stale
        self._released = []
        _LIVE.discard(self)
        code = None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.05)  # it was ending already (its socket closed): let it say how
                except subprocess.TimeoutExpired:
                    proc.kill()
            code = proc.wait()
        return code

    def _close(self) -> None:
        """End the child (a new one starts at the next call) and remove its log."""
        self._end()
        if self._log is not None:
            self._log.unlink(missing_ok=True)


_LIVE: weakref.WeakSet[Remote] = weakref.WeakSet()


@atexit.register
def _end_children() -> None:
    for remote in list(_LIVE):
        remote._close()


class _Raised(Exception):
    """An exception the implementation raised whose type is not a built-in one: it keeps its type's name."""


def _raised(said: Any) -> BaseException:
    if type(said) is not dict or type(said.get("type")) is not str:
        return ProcessEnded(f"the implementation's process sent an unreadable exception {said!r}")
    name, message = said["type"], str(said.get("message", ""))
    if said.get("unsupported"):
        return protocol.Unsupported(message)
    if name == "SystemExit":
        return SystemExit(said.get("code") if type(said.get("code")) in (int, str) else None)
    cls = getattr(builtins, name, None)
    if said.get("builtin") and isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:  # one that takes other arguments (UnicodeDecodeError)
            pass
    return type(name, (_Raised,), {"__module__": "implementation"})(message)


def call_each(remote: Remote, name: str, calls: list[tuple[Any, ...]]) -> tuple[list[Any], BaseException | None]:
    """Call method ``name`` of the implementation with each argument tuple of ``calls`` in one exchange: the answers
    in order, up to the first call that raised, and what it raised (None where none did). One exchange instead of one
    per array: ``harness.Case`` converts the arrays of a mapping (a model's parameters) or a list so."""
    return remote._request({"op": "map", "name": name, "calls": [list(c) for c in calls]})


def autograd(remote: Remote, library: str, equation: str, names: list[str], args: list[Any], d_out: Any) -> Any:
    """Run ``run/autodiff.py``'s autograd of ``library`` ("torch" or "jax") through ``equation`` in the
    implementation's process: ``("gradients", {name: Native})``, ``("not provided", why)`` or ``("failed",
    message)``."""
    request = {"op": "autograd", "library": library, "equation": equation, "names": names, "args": args}
    return remote._request({**request, "d_out": d_out})


def from_numpy_then_fill(remote: Remote, array: np.ndarray, dtype: str, value: float) -> Any:
    """``from_numpy(array, dtype)`` in the implementation's process, then every element of the array it was handed
    set to ``value`` there: what it made must not change (the contract's from_numpy copies; a native array that shares
    the caller's memory, at once or lazily, would change with it)."""
    return remote._request({"op": "fill", "array": array, "dtype": dtype, "value": value})


def isolation(impl: Any) -> str:
    """How ``impl`` ran, for the report: in a process of its own (and whether that process flushes subnormals), or
    in aiayn's (not isolated)."""
    if not isinstance(impl, Remote):
        return "in aiayn's process (--in-process): not isolated, its code could change the judge"
    return "in a process of its own" + (f"; {impl._flushes}" if impl._flushes else "")


def flushes(impl: Any) -> str | None:
    """The one line that says ``impl``'s process flushes subnormals (FTZ/DAZ) and what set it, else None."""
    return impl._flushes if isinstance(impl, Remote) else None


def close(impl: Any) -> None:
    """End ``impl``'s process where it has one (a call after this starts a new one)."""
    if isinstance(impl, Remote):
        impl._close()


def load(spec: str, *, device: str | None = None) -> Remote:
    """The implementation ``spec`` names, in a process of its own (:class:`Remote`), checked against the contract
    here, in aiayn's process (the child's own check could have been changed by the code it loads)."""
    remote = Remote(spec, device=device)
    problems = protocol.contract_problems(remote)
    if problems:
        remote._close()
        raise registry.InvalidImplementation(
            f"cannot load implementation {spec!r}: {remote!r} breaks the contract: {'; '.join(problems)}."
        )
    return remote


# --------------------------------------------------------------------------------------------
# the child: load the implementation, answer calls


def _end_with_parent() -> None:
    """Linux: the kernel ends this process when its parent ends (a worker ended by its time limit)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve() -> None:
    """The child's loop: load the implementation the first message names, send its description, then answer each
    call until the parent closes the socket."""
    _end_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends this process
    faulthandler.enable()  # a segfault or an abort prints where it happened, into the log the parent reads
    sock = socket.socket(fileno=int(sys.argv[1]))
    reader = sock.makefile("rb", buffering=1 << 16)
    first = _receive(reader)
    if first is None:
        return
    hello = first[0]
    sys.path[:] = [p for p in hello.get("path", sys.path) if isinstance(p, str)]
    for name in hello.get("absent", ()):
        sys.modules.setdefault(name, None)  # type: ignore[assignment]  (an import of it raises ModuleNotFoundError)
    objects: dict[int, Any] = {}
    counter = [0]

    def keep(value: Any, *, printed: bool = False) -> dict[str, Any]:
        """A new handle of ``value``; an array-like's shape, device and dtype (a handle printed as it prints)."""
        counter[0] += 1
        objects[counter[0]] = value
        kind = type(value)
        node: dict[str, Any] = {"$": "h", "id": counter[0], "type": f"{kind.__module__}.{kind.__qualname__}"}
        if printed:
            node["str"] = _safely(lambda: str(value)[:200])
            return node
        shape = _safely(lambda: [int(n) for n in value.shape])
        if shape is None:
            return node
        node["shape"] = shape
        device = _safely(lambda: value.device)
        if device is not None and not callable(device):
            node["device"] = _safely(lambda: str(device))
        dtype = _safely(lambda: value.dtype)
        if dtype is not None:
            node["dtype"] = keep(dtype, printed=True)
        return node

    def answer(tree: Any, buffers: list[memoryview] | None = None) -> None:
        _send(sock, tree, buffers or [])

    stop_watching = registry.watch_flushing()
    try:
        impl = registry.load(str(hello.get("spec")), device=hello.get("device") or None, refuse_flushing=False)
    except BaseException as exc:  # noqa: BLE001 (what loading raised is the parent's to report)
        from aiayn.environment import missing_extra

        if not isinstance(exc, registry.ImplementationNotFound):
            exc = registry.ImplementationNotFound(f"cannot load implementation {hello.get('spec')!r}: {exc!r}.")
        extra = missing_extra(exc)
        answer({"not_found": str(exc), "missing_extra": None if extra is None else str(extra)})
        return
    stop_watching()  # imports at call time (lazy ones inside libraries) pay nothing
    modes = registry.flushed_subnormals()
    culprit = registry.flushing_culprit()
    flushes = (
        None
        if modes is None
        else f"your implementation flushes subnormals process-wide: {modes} set"
        + (f" by {culprit}" if culprit else "")
        + " at import; its own arithmetic is judged as it is, in its own process"
    )
    attrs, methods = {}, []
    for name in dir(impl):
        if name.startswith("_"):
            continue
        try:
            value = getattr(impl, name)
        except Exception:  # noqa: BLE001 (a property that raises reads as absent)
            continue
        if callable(value):
            methods.append(name)
        else:
            attrs[name] = value
    buffers: list[memoryview] = []
    try:
        description = {"attrs": attrs, "methods": methods, "repr": repr(impl)[:200], "flushes": flushes}
        tree = _encode(description, buffers, keep, by_value=True)
    except Exception as exc:  # noqa: BLE001
        answer({"not_found": f"cannot load implementation {hello.get('spec')!r}: its attributes: {exc!r}."})
        return
    answer({"manifest": tree}, buffers)

    from aiayn.conformance.run import autodiff

    while True:
        message = _receive(reader)
        if message is None:
            return
        tree, raw = message
        for ident in tree.get("release", ()):
            objects.pop(ident, None)
        buffers = []
        try:
            request = {**tree, **_decode(tree["data"], raw, lambda node: objects[node["id"]])}
            if request["op"] == "call":
                result = getattr(impl, request["name"])(*request["args"], **request["kwargs"])
                reply = {"value": _encode(result, buffers, keep, by_value=request["name"] in BY_VALUE)}
            elif request["op"] == "fill":
                made = impl.from_numpy(request["array"], request["dtype"])
                request["array"][...] = request["value"]
                reply = {"value": _encode(made, buffers, keep, by_value=False)}
            elif request["op"] == "map":
                reply = _mapped(impl, request["name"], request["calls"], buffers, keep)
            else:
                reply = {"autograd": _encode(_autograd(autodiff, impl, request), buffers, keep, by_value=False)}
        except KeyError as exc:
            if isinstance(exc.args[0] if exc.args else None, int):
                reply = {"raised": {"type": "LookupError", "builtin": True, "message": "a handle of an ended call"}}
            else:
                reply = _exception(exc)
            buffers = []
        except BaseException as exc:  # noqa: BLE001 (what the implementation raised crosses to the parent)
            reply, buffers = _exception(exc), []
        answer(reply, buffers)


def _mapped(impl: Any, name: str, calls: list[list[Any]], buffers: list[memoryview], keep: Any) -> dict[str, Any]:
    method, results = getattr(impl, name), []
    for args in calls:
        try:
            results.append(method(*args))
        except BaseException as exc:  # noqa: BLE001 (the answers so far, and what this call raised)
            return {"mapped": _encode(results, buffers, keep, by_value=name in BY_VALUE), **_exception(exc)}
    return {"mapped": _encode(results, buffers, keep, by_value=name in BY_VALUE)}


def _safely(read: Callable[[], Any]) -> Any:
    """What ``read()`` gives, or None where it raises (an attribute the suite reads where the object has it)."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return None


def _exception(exc: BaseException) -> dict[str, Any]:
    said: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "builtin": type(exc).__module__ == "builtins",
        "unsupported": isinstance(exc, protocol.Unsupported),
    }
    if isinstance(exc, SystemExit):
        said["code"] = exc.code if type(exc.code) in (int, str) else None
    return {"raised": said}


class _Failed(Exception):
    pass


class _ChildCase:
    """What ``run/autodiff.py`` needs of a case, in the child: calls that raise become the check's
    failure."""

    def __init__(self, impl: Any, equation: str) -> None:
        self.impl, self.equation = impl, equation

    def call(self, method: str, *args: Any) -> Any:
        return self.guard(f"{getattr(self.impl, 'name', '?')}.{method}(...)", getattr(self.impl, method), *args)

    def guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except protocol.Unsupported:
            raise
        except BaseException as exc:  # noqa: BLE001 (the check's failure, in the parent)
            raise _Failed(f"{what} raised {type(exc).__name__}: {exc}") from None

    def fail(self, message: str) -> None:
        raise _Failed(message)


def _autograd(autodiff: Any, impl: Any, request: dict[str, Any]) -> list[Any]:
    case = _ChildCase(impl, request["equation"])
    run = {"torch": autodiff.torch_vjp, "jax": autodiff.jax_vjp}[request["library"]]
    try:
        return ["gradients", run(case, request["names"], request["args"], request["d_out"])]
    except autodiff.NotProvided as exc:
        return ["not provided", str(exc)]
    except _Failed as exc:
        return ["failed", str(exc)]
