"""Input validation shared by every reference function.

Every check raises with a message that names the argument, what was expected and what was
given, so a user who calls the oracle wrongly learns what to change without reading the code.
``ValueError`` for a wrong value or shape, ``TypeError`` for a wrong kind of object.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def as_float_array(name: str, x: Any, *, min_ndim: int = 0, allow_nonfinite: bool = False) -> np.ndarray:
    """Return ``x`` as a float64 array, or raise naming ``name``.

    Accepts real numbers (ints, floats, float arrays of any precision). Rejects booleans,
    complex numbers, objects that are not numeric, too few dimensions, and (unless
    ``allow_nonfinite``) NaN or infinite entries.
    """
    arr = np.asarray(x)
    if arr.dtype == bool:
        raise TypeError(f"{name}: expected a real-valued array, got a boolean array of shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name}: expected a real-valued array, got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimension(s), got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not allow_nonfinite and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(
            f"{name}: expected finite values, found {arr[tuple(bad)]} at index {tuple(int(i) for i in bad)}"
        )
    return arr


def as_mask(name: str, mask: Any, target_shape: tuple[int, ...]) -> np.ndarray:
    """Return a boolean mask broadcast to ``target_shape`` (True = may attend), or raise naming ``name``."""
    arr = np.asarray(mask)
    if arr.dtype != bool:
        raise TypeError(f"{name}: expected a boolean array (True = may attend), got dtype {arr.dtype}")
    try:
        return np.broadcast_to(arr, target_shape)
    except ValueError:
        raise ValueError(
            f"{name}: shape {arr.shape} does not broadcast to the score shape {target_shape} (..., n_q, n_k)"
        ) from None


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``, or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    return int(value)


def same_size(name_a: str, size_a: int, name_b: str, size_b: int, what: str) -> None:
    """Raise unless two sizes that the equation needs equal (e.g. q's and k's d_k) agree."""
    if size_a != size_b:
        raise ValueError(f"{name_a} and {name_b} must agree on {what}: got {size_a} and {size_b}")


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed``, or raise listing the options."""
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


def batch_shape(names: str, *arrays: np.ndarray) -> tuple[int, ...]:
    """The broadcast of the arrays' batch dimensions (all but the last two), or raise naming them."""
    try:
        return np.broadcast_shapes(*(a.shape[:-2] for a in arrays))
    except ValueError:
        given = ", ".join(str(a.shape[:-2]) for a in arrays)
        raise ValueError(f"{names}: batch dimensions {given} do not broadcast") from None
