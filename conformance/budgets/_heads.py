"""Splitting a model-width array into heads and merging them back (§3.2.2), and a projection x W + b: the one copy
the budgets and the diagnoses' models share (both compute on the values, in whatever dtype they are given)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["affine", "merge", "split"]


def split(x: np.ndarray, h: int) -> np.ndarray:
    """(..., n, h*d) -> (..., h, n, d), head i = columns i*d:(i+1)*d (the paper's layout)."""
    *batch, n, width = x.shape
    return np.swapaxes(x.reshape(*batch, n, h, width // h), -2, -3)


def merge(x: np.ndarray) -> np.ndarray:
    """(..., h, n, d) -> (..., n, h*d): Concat(head_1, ..., head_h)."""
    *batch, h, n, d = x.shape
    return np.swapaxes(x, -2, -3).reshape(*batch, n, h * d)


def affine(x: np.ndarray, w: Any, b: Any) -> np.ndarray:
    """x W + b (no b: x W), in the dtype of the arrays given."""
    out = np.matmul(x, w)
    return out if b is None else out + b
