"""What is benchmarked: the attention cases, their inputs, and their operation counts.

A case is one call of Eq. (1), Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1), through
an implementation's own :meth:`scaled_dot_product_attention` on its own native arrays, with
B = 1, h = 8, d_k = d_v = 64 (the base model's head shape, §3.2.2) and n_q = n_k = n.

Operation count (per head, the convention of FlashAttention and of §3.2.1's two matrix products):
``4 * n_q * n_k * d`` -- ``2 n_q n_k d`` for Q K^T and ``2 n_q n_k d_v`` for P V; the softmax's
O(n_q n_k) exponentials, maxima and sums are not counted (they cost time, not GEMM flops). A
causal case (§3.2.3, query i sees keys j <= i) is counted two ways: *full* (the same
``4 n^2 d``, what an implementation that computes every score does) and *useful* (only the
``n (n + 1) / 2`` visible pairs: ``4 d n (n + 1) / 2``, about half).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BATCH",
    "HEADS",
    "HEAD_DIM",
    "SEED",
    "FULL_SIZES",
    "BIG_SIZES",
    "BUILTIN_IMPLS",
    "DTYPES",
    "MEMORY_BOUNDED_IMPLS",
    "SMOKE",
    "Case",
    "attention_flops",
    "build_cases",
    "make_inputs",
]

BATCH, HEADS, HEAD_DIM = 1, 8, 64
#: Seed of the query/key/value draws (standard normal, then rounded to the case's dtype).
SEED = 0
#: Sequence lengths every implementation is benchmarked at.
FULL_SIZES: tuple[int, ...] = (128, 512, 2048)
#: Extra lengths for the paths whose memory grows linearly in n (the O(n^2) paths would need
#: h * n^2 * itemsize = 2 GiB (float32) or 4 GiB (float64) for one score matrix at n = 8192).
BIG_SIZES: tuple[int, ...] = (8192,)
#: The built-in implementations of the registry that compute Eq. (1) themselves.
BUILTIN_IMPLS: tuple[str, ...] = ("numpy", "numpy-blocked", "torch", "torch-sdpa")
#: The built-ins whose attention memory is O(n): the blocked online softmax and PyTorch's fused
#: (FlashAttention-style) CPU kernel.
MEMORY_BOUNDED_IMPLS: tuple[str, ...] = ("numpy-blocked", "torch-sdpa")
DTYPES: tuple[str, ...] = ("float32", "float64")
#: Bytes per element of every dtype the contract knows (NumPy has no bfloat16).
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class SmokeSet:
    """The CI subset: every implementation and dtype, tiny sizes, one round (seconds in all)."""

    sizes: tuple[int, ...] = (128,)
    #: One size past the blocked path's tile (512) so its tiling and its memory bound are exercised.
    big_sizes: tuple[int, ...] = (1024,)
    gemm_n: int = 256


SMOKE = SmokeSet()


@dataclass(frozen=True)
class Case:
    """One benchmarked call: implementation ``impl`` on (B, h, n, d) inputs of ``dtype``."""

    impl: str
    dtype: str
    n: int
    causal: bool
    batch: int = BATCH
    heads: int = HEADS
    head_dim: int = HEAD_DIM

    @property
    def id(self) -> str:
        """``numpy-float32-n2048-causal``: the pytest id and the key in every report."""
        return f"{self.impl}-{self.dtype}-n{self.n}-{'causal' if self.causal else 'full'}"

    @property
    def group(self) -> str:
        """pytest-benchmark group: the implementations side by side for one shape and mask."""
        return f"attention {self.dtype} n={self.n} {'causal' if self.causal else 'full'}"

    @property
    def flops_full(self) -> int:
        """4 n^2 d per head, every score counted (see the module docstring)."""
        return attention_flops(self.batch * self.heads, self.n, self.n, self.head_dim, causal=False)

    @property
    def flops_useful(self) -> int:
        """Only the visible (query, key) pairs: n (n + 1) / 2 of them when causal."""
        return attention_flops(self.batch * self.heads, self.n, self.n, self.head_dim, causal=self.causal)

    @property
    def score_bytes(self) -> int:
        """Bytes of one materialised (B, h, n, n) score matrix in ``dtype``: the O(n^2) yardstick."""
        return self.batch * self.heads * self.n * self.n * ITEMSIZE[self.dtype]


def attention_flops(heads: int, n_q: int, n_k: int, d: int, *, causal: bool) -> int:
    """Floating-point operations of Eq. (1) over ``heads`` heads: 4 * pairs * d per head.

    ``pairs`` is n_q * n_k, or with ``causal`` the pairs (i, j) with j <= i (square n_q = n_k = n:
    n (n + 1) / 2). Q K^T and P V each take one multiply and one add per pair and per feature.
    """
    if causal:
        if n_q != n_k:
            raise ValueError(f"n_q, n_k: a causal count needs a square score matrix, got {n_q} x {n_k}")
        pairs = n_q * (n_q + 1) // 2
    else:
        pairs = n_q * n_k
    return 4 * heads * pairs * d


def build_cases(
    impls: Sequence[str],
    dtypes: Sequence[str],
    sizes: Iterable[int],
    big_sizes: Iterable[int],
    big_impls: Sequence[str],
) -> list[Case]:
    """Every (impl, dtype, n, causal) combination: ``sizes`` for all, ``big_sizes`` for ``big_impls``.

    Ordered by implementation, then dtype, then n, then full before causal.
    """
    cases = []
    for impl in impls:
        ns = sorted(set(sizes) | (set(big_sizes) if impl in big_impls else set()))
        for dtype in dtypes:
            for n in ns:
                cases += [Case(impl, dtype, n, causal) for causal in (False, True)]
    return cases


def make_inputs(impl: Any, case: Case) -> tuple[Any, Any, Any, Any]:
    """Native (q, k, v, mask) for ``case``, made by the implementation's own ``from_numpy``.

    q, k, v: (B, h, n, d) standard normal draws (seed :data:`SEED`), rounded to ``case.dtype``;
    mask: None, or for a causal case the (n, n) lower-triangular boolean matrix (True = may
    attend, §3.2.3), broadcast by the implementation over (B, h).
    """
    rng = np.random.default_rng(SEED)
    shape = (case.batch, case.heads, case.n, case.head_dim)
    q, k, v = (impl.from_numpy(rng.standard_normal(shape), case.dtype) for _ in range(3))
    mask = impl.from_numpy(np.tri(case.n, case.n, dtype=bool), "bool") if case.causal else None
    return q, k, v, mask
