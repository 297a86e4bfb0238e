"""A failed check's inputs as a replay file: its name, how it is written, and how it is read back (as data, checked
field by field; never unpickled, never imported). ``aiayn replay FILE`` runs the check again on them
(``conformance/replay.py``). A case here is what the harness's ``Case`` gives: ``impl``, ``dtype``, ``check`` and
``args`` (the raw float64/int64/bool arguments).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.environment import failure_dir

__all__ = ["failure_name", "load_case", "register_spec", "save", "save_case", "spec_of"]

#: id(impl) -> the spec it was loaded from (``--impl``), so that a replay file can load it again.
_SPECS: dict[int, str] = {}


def register_spec(impl: Any, spec: str) -> None:
    """Remember how ``impl`` was loaded, for the replay command of its failures."""
    _SPECS[id(impl)] = spec


def spec_of(impl: Any) -> str:
    """The spec ``impl`` was loaded from (its name, else its class's path where none was registered)."""
    spec = _SPECS.get(id(impl))
    if spec is None:
        name = getattr(impl, "name", "")
        spec = name if isinstance(name, str) and name else f"{type(impl).__module__}:{type(impl).__qualname__}"
    return spec


def _encode(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """JSON for the arguments, arrays put into ``arrays`` by path; one array under several names is stored once."""
    if isinstance(value, np.ndarray):
        for existing, array in arrays.items():
            if array is value:
                return {"__array__": existing}
        arrays[path] = value
        return {"__array__": path}
    if isinstance(value, Mapping):
        return {"__dict__": {str(k): _encode(v, f"{path}/{k}", arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"__list__": [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The arguments back from :func:`_encode` (an array stored once comes back as one object under each name)."""
    if isinstance(value, dict):
        if "__array__" in value:
            return arrays[value["__array__"]]
        if "__dict__" in value:
            return {k: _decode(v, arrays) for k, v in value["__dict__"].items()}
        if "__list__" in value:
            return [_decode(v, arrays) for v in value["__list__"]]
    return value


def failure_name(impl_name: str, check_name: str, dtype: str) -> str:
    """The file name of a failure's inputs: ``<impl>-<check>-<dtype>.npz`` with unsafe characters replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{impl_name}-{check_name}-{dtype}") + ".npz"


def save(case: Any) -> Path:
    """Write the case's raw inputs to ``<failure_dir>/<impl>-<check>-<dtype>-<digest>.npz`` and return the path.

    One file per distinct input (``digest``: the first 10 hex digits of the SHA-256 of the saved
    inputs), so two failures of one test never share a file; the plugin deletes the files of
    intermediate examples that no failure message names. The folder is
    ``aiayn.environment.failure_dir()`` (``$AIAYN_FAILURES``, else aiayn's cache folder), never the
    current directory.
    """
    arrays: dict[str, np.ndarray] = {}
    encoded = json.dumps(_encode(case.args, "args", arrays), sort_keys=True, default=str)
    digest = hashlib.sha256(spec_of(case.impl).encode() + b"\0" + encoded.encode())  # two implementations of one
    # name in one run never share a file
    for key in sorted(arrays):
        digest.update(
            key.encode()
            + str(arrays[key].dtype).encode()
            + str(arrays[key].shape).encode()
            + np.ascontiguousarray(arrays[key]).tobytes()
        )
    name = (
        failure_name(getattr(case.impl, "name", "impl"), case.check, case.dtype).removesuffix(".npz")
        + f"-{digest.hexdigest()[:10]}.npz"
    )
    return save_case(case, failure_dir() / name)


def save_case(case: Any, path: Path) -> Path:
    """Write the case's raw inputs (and which implementation, dtype and check) to ``path`` as a replay file."""
    arrays: dict[str, np.ndarray] = {}
    meta = {
        "impl": spec_of(case.impl),
        "dtype": case.dtype,
        "check": case.check,
        "args": _encode(case.args, "args", arrays),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        np.savez(handle, __meta__=np.array(json.dumps(meta)), **{k.replace("/", "|"): v for k, v in arrays.items()})
    return path


def load_case(path: str | os.PathLike[str]) -> tuple[str, str, str, dict[str, Any]]:
    """Read a failure file: (implementation spec, dtype, check name, raw arguments).

    The file is data, checked field by field before any of it is used. Raises ``ValueError`` naming what is wrong
    with a file that is not one :func:`save_case` wrote: not an .npz archive; no ``__meta__`` entry, or one that is
    not a JSON string; a ``__meta__`` that is not an object; a field ``impl``, ``dtype`` or ``check`` that is not a
    non-empty string; an ``args`` that is not an object of arguments; an argument (named by its path, e.g.
    ``args/params/w_q``) that is not null, a boolean, a number, a string, or an ``__array__``, ``__dict__`` or
    ``__list__`` object as :func:`_encode` writes them; an array that is not of booleans or numbers, or that an
    argument names and the file does not hold.
    """
    if not zipfile.is_zipfile(path):
        raise ValueError("not an .npz archive")
    with np.load(path, allow_pickle=False) as data:
        if "__meta__" not in data.files:
            raise ValueError("the archive has no __meta__ entry")
        raw = data["__meta__"]
        if raw.shape != () or raw.dtype.kind != "U":
            raise ValueError(f"its __meta__ is not a JSON string but a {raw.dtype} array of shape {raw.shape}")
        try:
            meta = json.loads(str(raw))
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"its __meta__ is not JSON ({' '.join(str(exc).split())[:120]})") from None
        arrays = {}
        for key in data.files:
            if key == "__meta__":
                continue
            try:
                array = data[key]
            except ValueError:  # an object array: numpy refuses it without pickle, and so does the suite
                raise ValueError(f"its entry {key!r} is not an array of booleans or numbers") from None
            if array.dtype.kind not in "biuf":
                raise ValueError(f"its entry {key!r} is a {array.dtype} array, not one of booleans or numbers")
            arrays[key.replace("|", "/")] = array
    if not isinstance(meta, dict):
        raise ValueError(f"its __meta__ is not a JSON object but {type(meta).__name__} {str(meta)[:80]!r}")
    missing = [k for k in ("impl", "dtype", "check") if k not in meta]
    if missing:
        raise ValueError(f"its __meta__ lacks the string field(s) {', '.join(missing)}")
    for key in ("impl", "dtype", "check"):
        if type(meta[key]) is not str or not meta[key]:
            raise ValueError(
                f"its __meta__ field {key!r} is {type(meta[key]).__name__} {repr(meta[key])[:80]}, "
                "expected a non-empty string"
            )
    if not (isinstance(meta.get("args"), dict) and set(meta["args"]) == {"__dict__"}):
        raise ValueError("its __meta__ field 'args' is not an object of arguments ({'__dict__': {...}})")
    pending: list[tuple[str, Any, int]] = [("args", meta["args"], 0)]  # (path, encoded value, depth)
    while pending:
        where, value, depth = pending.pop()
        if value is None or type(value) in (bool, int, float, str):
            continue
        tag, inner = next(iter(value.items())) if isinstance(value, dict) and len(value) == 1 else (None, None)
        if depth > 64:
            raise ValueError(f"its __meta__ field {where!r} is nested deeper than the suite writes")
        if tag == "__array__" and type(inner) is str:
            if inner not in arrays:
                raise ValueError(f"its __meta__ field {where!r} names array {inner!r}, which the file does not hold")
        elif tag == "__dict__" and isinstance(inner, dict):
            pending += [(f"{where}/{k}", v, depth + 1) for k, v in inner.items()]
        elif tag == "__list__" and isinstance(inner, list):
            pending += [(f"{where}/{i}", v, depth + 1) for i, v in enumerate(inner)]
        else:
            raise ValueError(
                f"its __meta__ field {where!r} is {type(value).__name__} {json.dumps(value)[:60]}, not a value the "
                "suite writes (null, a boolean, a number, a string, or an __array__, __dict__ or __list__ object)"
            )
    return meta["impl"], meta["dtype"], meta["check"], _decode(meta["args"], arrays)
