"""A stand-in for code written elsewhere, for ``tests/meta/test_foreign_arrays.py``: an array library with its own
tensor type, dtypes that print under its own names (``dtypes.double``, ``dtypes.float``) and the device ``"CPU"``
(declared as ``"cpu"``).

The arithmetic is the NumPy built-in's, run on the values inside the tensors, so every equation is computed
correctly; only the array type around it is foreign. ``Aliasing`` shares the NumPy array it is built from, lazily
(rounded on each use), as some libraries' tensors do.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiayn.conformance.equations import record
from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.implementations.protocol import EQUATIONS

_DECODE = record("transformer_forward").decode  # the decoding methods, from their one record
DECODING = (*_DECODE.steps, *_DECODE.search)
_SPLIT = record("scaled_dot_product_attention").split  # attention with its log-sum-exp, the merge, a paged read
SPLIT_KEYS = (*_SPLIT.methods, _SPLIT.paged)


class DType:
    """A dtype that prints under the library's own name."""

    def __init__(self, name: str, numpy: type) -> None:
        self.name, self.numpy = name, np.dtype(numpy)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"


DTYPES = {
    "float64": DType("double", np.float64),
    "float32": DType("float", np.float32),
    "int64": DType("long", np.int64),
    "bool": DType("boolean", np.bool_),
}
_BY_NUMPY = {d.numpy: d for d in DTYPES.values()}


class Tensor:
    """The library's array: values in a private NumPy array, a DType, a device string."""

    device = "CPU"

    def __init__(self, values: np.ndarray) -> None:
        self._values = values

    @property
    def values(self) -> np.ndarray:
        return self._values

    @property
    def dtype(self) -> DType:
        return _BY_NUMPY[self.values.dtype]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape


class LazyTensor(Tensor):
    """A tensor over the caller's NumPy array, rounded when used: an edit of that array shows through."""

    def __init__(self, source: np.ndarray, dtype: str) -> None:
        self._source, self._dtype = source, np.dtype(dtype)

    @property
    def values(self) -> np.ndarray:
        return self._source.astype(self._dtype)


def _unwrap(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.values
    if isinstance(value, Mapping):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


def _wrap(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return Tensor(np.array(value, copy=True))
    if isinstance(value, Mapping):
        return {k: _wrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_wrap(v) for v in value)
    return value


def _delegate(name: str) -> Any:
    original = getattr(NumpyImplementation, name)

    @functools.wraps(original)
    def method(self: Foreign, *args: Any, **kwargs: Any) -> Any:
        return _wrap(getattr(self.inner, name)(*_unwrap(args), **_unwrap(kwargs)))

    return method


class Foreign(NumpyImplementation):
    """Every equation of the NumPy built-in, on foreign tensors."""

    name = "foreign-arrays"
    version = "stand-in 1.0"
    device = "cpu"  # declared in lower case; its tensors say "CPU"

    def __init__(self) -> None:
        super().__init__()
        self.inner = NumpyImplementation()

    def from_numpy(self, array: np.ndarray, dtype: str) -> Tensor:
        self.check_dtype(dtype, allow_index=True)
        return Tensor(np.array(array, dtype=np.dtype(dtype), copy=True))

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.inner.to_numpy(_unwrap(x))

    locals().update({name: _delegate(name) for name in (*EQUATIONS, *DECODING, *SPLIT_KEYS)})

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Tensor]:
        """The built-in's hand-written gradients, on foreign tensors."""
        return {k: _wrap(v) for k, v in self.inner.vjp(equation, _unwrap(args), _unwrap(d_out)).items()}


class Aliasing(Foreign):
    """The same, but ``from_numpy`` keeps the caller's array and rounds it when used."""

    name = "aliasing-arrays"

    def from_numpy(self, array: np.ndarray, dtype: str) -> Tensor:
        self.check_dtype(dtype, allow_index=True)
        return LazyTensor(array, dtype)
