"""A third-party implementation you can copy: softmax and Eq. (1) in plain NumPy.

This class does not import or subclass anything from aiayn: it satisfies the contract
(``aiayn.implementations.protocol.Implementation``) structurally, by having the right members. Copy
this file into your own project, replace the two equations with calls into your code, and check
it with::

    aiayn check my_package.my_attention:MyAttention

(or register it under the entry-point group ``aiayn.implementations``; see
``aiayn.implementations.registry``). Equations you do not define are reported as "not provided".
"""

from __future__ import annotations

import math

import numpy as np


class MyAttention:
    """Softmax and scaled dot-product attention (§3.2.1, Eq. (1)) in float64 or float32 NumPy."""

    name = "my-attention"
    version = f"example 1.0 (numpy {np.__version__})"
    device = "cpu"
    dtypes = ("float64", "float32")
    # Where the paper is silent, say what you do: a query row with every key masked gives NaN
    # (what -inf masking yields). The other keys keep the defaults; they matter only to
    # equations this class does not provide.
    policies = {"fully_masked": "nan", "label_smoothing": "K", "layer_norm_eps": 1e-6, "step_zero": "zero"}

    def provides(self) -> frozenset[str]:
        """The equations this class implements (names from aiayn.implementations.protocol.EQUATIONS)."""
        return frozenset({"softmax", "scaled_dot_product_attention"})

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        """A fresh array in ``dtype`` ("float64", "float32", "int64" or "bool")."""
        if dtype not in self.dtypes + ("int64", "bool"):
            raise ValueError(f"dtype: expected one of {self.dtypes + ('int64', 'bool')}, got {dtype!r}")
        return np.array(array, dtype=dtype, copy=True)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        """A NumPy copy; floating-point results come back as float64."""
        return np.array(x, dtype=np.float64 if x.dtype.kind == "f" else x.dtype, copy=True)

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """exp(x_i) / sum_j exp(x_j) along ``axis``, shifted by the maximum to avoid overflow."""
        with np.errstate(invalid="ignore"):  # a row of all -inf gives NaN
            e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        """softmax(Q K^T / sqrt(d_k)) V; ``mask`` False = may not attend (score -inf, §3.2.3)."""
        scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        return self.softmax(scores) @ v  # (..., n_q, d_v)
