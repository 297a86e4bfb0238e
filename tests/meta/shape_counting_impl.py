"""Implementations that record the input shapes they are called with, for ``tests/meta/test_few_shapes.py``.

Each is the NumPy built-in; every call of ``scaled_dot_product_attention`` and ``layer_norm`` appends its input
shapes, one JSON line, to the file named by ``$AIAYN_SHAPE_LOG``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from aiayn.implementations.numpy_impl import NumpyImplementation


def _log(method: str, *arrays: Any) -> None:
    shapes = [None if a is None else list(np.shape(a)) for a in arrays]
    with open(os.environ["AIAYN_SHAPE_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"method": method, "shapes": shapes}) + "\n")


class Counting(NumpyImplementation):
    """The NumPy built-in, recording shapes; sizes drawn as usual."""

    name = "counting-numpy"

    def scaled_dot_product_attention(self, q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        _log("scaled_dot_product_attention", q, k, v, mask)
        return super().scaled_dot_product_attention(q, k, v, mask)

    def layer_norm(self, x: Any, gain: Any, bias: Any, eps: float) -> Any:
        _log("layer_norm", x, gain, bias)
        return super().layer_norm(x, gain, bias, eps)


class CountingCompiled(Counting):
    """The same, declaring that each new shape costs it a compile: the suite draws sizes from a few sets."""

    name = "counting-compiled-numpy"
    compiles_per_shape = True
