"""The NumPy attention's stages timed one at a time: what bounds a NumPy Eq. (1).

A NumPy Eq. (1) (§3.2.1) is at best two matrix products and one exponential per score:
``S = Q K^T`` (n x d times d x n), ``P = exp(S - rowmax S)``, ``O = P V`` (n x n times n x d),
plus row maxima, a subtraction, row sums and a division, each a pass over the n x n scores. Each
stage here does one whole call's worth of that work (B = 1, h = 8, d = 64, realistic shifted
scores as the exponential's input) in one of two layouts:

- ``tile``: one head at a time in tiles of :data:`TILE_ROWS` query rows (128 x 2048 float32 scores
  = 1 MiB: cache-resident on these machines, 512 KiB L2 per core and a 32 MiB L3), the best case
  for the element-wise passes;
- ``full``: all heads' (h, n, n) scores at once (128 MiB at n = 2048 float32: main memory), what a
  direct implementation does.

The report turns these into bounds: the sum ``qk_gemm + pv_gemm + exp`` is the least time any
NumPy attention built from these calls can take, so ``flops / that / ceiling`` caps its ratio.

The backward (dQ, dK, dV from dO, recomputing what it needs, as a FlashAttention backward does) is at best five
products of the same sizes and one exponential: ``S = Q K^T`` again and ``dP = dO V^T`` (each the shape of
``qk_gemm``), ``dQ = dS K`` (that of ``pv_gemm``), and ``dV = P^T dO`` and ``dK = dS^T Q``, whose left factor is an
n x n matrix read transposed: the stage ``pvt_gemm``. Its floor is ``2 qk_gemm + pv_gemm + 2 pvt_gemm + exp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.benchmarks.cases import HEAD_DIM, HEADS, SEED

__all__ = ["FULL_LAYOUT_BYTES", "STAGES", "TILE_ROWS", "StageCase", "layout_fits", "make_stage"]

#: Query rows per tile in the ``tile`` layout.
TILE_ROWS = 128
#: (layout, stage) pairs benchmarked for each (dtype, n).
STAGES: tuple[tuple[str, str], ...] = tuple(
    (layout, name)
    for layout in ("tile", "full")
    for name in ("qk_gemm", "pv_gemm", "pvt_gemm", "exp", "max", "subtract", "sum")
)


#: Most bytes the ``full`` layout's four (h, n, n) arrays may take (scores, shifted scores, weights, output): 512 MiB
#: at n = 2048 in float32, 8 GiB at n = 8192, where no NumPy built-in holds the whole scores (its blocked path runs).
FULL_LAYOUT_BYTES = 1 << 30


def layout_fits(layout: str, dtype: str, n: int) -> bool:
    """Whether ``layout``'s stages at (dtype, n) are timed: the ``tile`` layout always, ``full`` within
    :data:`FULL_LAYOUT_BYTES`."""
    return layout != "full" or 4 * HEADS * n * n * np.dtype(dtype).itemsize <= FULL_LAYOUT_BYTES


@dataclass(frozen=True)
class StageCase:
    """One stage of a NumPy Eq. (1) at (h, n, d) = (8, n, 64) in ``dtype``, in ``layout``."""

    dtype: str
    n: int
    layout: str
    name: str

    @property
    def id(self) -> str:
        return f"numpy-{self.dtype}-n{self.n}-{self.layout}-{self.name}"

    @property
    def group(self) -> str:
        return f"numpy stages {self.dtype} n={self.n} {self.layout}"

    @property
    def elements(self) -> int:
        """Scores of one call: h * n^2."""
        return HEADS * self.n * self.n

    @property
    def flops(self) -> int:
        """2 h n^2 d for each GEMM stage; 0 for the element-wise ones."""
        return 2 * HEADS * self.n * self.n * HEAD_DIM if self.name.endswith("gemm") else 0

    @property
    def bytes_moved(self) -> int:
        """Score bytes read plus written by an element-wise stage (reductions only read)."""
        passes = {"exp": 2, "subtract": 2, "max": 1, "sum": 1}.get(self.name, 0)
        return passes * self.elements * np.dtype(self.dtype).itemsize


def _inputs(dtype: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    q, k, v = (rng.standard_normal((HEADS, n, HEAD_DIM)).astype(dtype) for _ in range(3))
    q *= 1.0 / math.sqrt(HEAD_DIM)
    return q, np.ascontiguousarray(np.swapaxes(k, -1, -2)), v  # (h, n, d), (h, d, n), (h, n, d)


def make_stage(stage: StageCase) -> Callable[[], Any]:
    """A no-argument function doing ``stage``'s share of one attention call (buffers preallocated)."""
    q, k_t, v = _inputs(stage.dtype, stage.n)
    if stage.layout == "full":
        return _full(stage.name, q, k_t, v)
    if stage.layout == "tile":
        return _tiled(stage.name, q, k_t, v, min(TILE_ROWS, stage.n))
    raise ValueError(f"stage.layout: expected 'tile' or 'full', got {stage.layout!r}")


def _shifted(scores: np.ndarray) -> np.ndarray:
    """S - rowmax S: the exponential's real input (values <= 0, as in attention)."""
    return scores - scores.max(axis=-1, keepdims=True)


def _full(name: str, q: np.ndarray, k_t: np.ndarray, v: np.ndarray) -> Callable[[], Any]:
    scores = np.matmul(q, k_t)  # (h, n, n)
    src = _shifted(scores)
    dst = np.empty_like(src)
    probs = np.exp(src)
    row = np.empty(src.shape[:-1] + (1,), src.dtype)  # (h, n, 1)
    out = np.empty_like(v)  # (h, n, d)
    kernels = {
        "qk_gemm": lambda: np.matmul(q, k_t, out=dst),
        "pv_gemm": lambda: np.matmul(probs, v, out=out),
        "pvt_gemm": lambda: np.matmul(np.swapaxes(probs, -1, -2), v, out=out),  # (h, n, n)^T (h, n, d)
        "exp": lambda: np.exp(src, out=dst),
        "max": lambda: np.max(src, axis=-1, keepdims=True, out=row),
        "subtract": lambda: np.subtract(src, row, out=dst),
        "sum": lambda: np.sum(src, axis=-1, keepdims=True, out=row),
    }
    return kernels[name]


def _tiled(name: str, q: np.ndarray, k_t: np.ndarray, v: np.ndarray, rows: int) -> Callable[[], Any]:
    heads, n, _ = q.shape
    starts = range(0, n, rows)
    src = _shifted(np.matmul(q[0, :rows], k_t[0]))  # (rows, n), the same value range as every tile
    dst = np.empty_like(src)
    probs = np.exp(src)
    row = np.empty((rows, 1), src.dtype)
    out = np.empty((rows, v.shape[-1]), v.dtype)

    def qk_gemm() -> None:
        for h in range(heads):
            for s in starts:
                np.matmul(q[h, s : s + rows], k_t[h], out=dst)

    def pv_gemm() -> None:
        for h in range(heads):
            for _ in starts:
                np.matmul(probs, v[h], out=out)

    into = np.empty((n, v.shape[-1]), v.dtype)  # (n, d): a tile's share of dV = P^T dO, summed over the tiles

    def pvt_gemm() -> None:
        for h in range(heads):
            for s in starts:
                np.matmul(probs.T, v[h, s : s + rows], out=into)  # (n, rows) (rows, d)

    def elementwise(op: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(heads * len(starts)):
                op()

        return run

    kernels = {
        "qk_gemm": qk_gemm,
        "pv_gemm": pv_gemm,
        "pvt_gemm": pvt_gemm,
        "exp": elementwise(lambda: np.exp(src, out=dst)),
        "max": elementwise(lambda: np.max(src, axis=-1, keepdims=True, out=row)),
        "subtract": elementwise(lambda: np.subtract(src, row, out=dst)),
        "sum": elementwise(lambda: np.sum(src, axis=-1, keepdims=True, out=row)),
    }
    return kernels[name]
