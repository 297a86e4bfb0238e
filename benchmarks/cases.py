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

A case times one of three passes (:data:`PASSES`): the ``forward`` call; the ``backward`` (dQ, dK,
dV from a cotangent dO of the output, given the forward's saved state where the implementation
keeps one); ``forward+backward`` (both, as a training step runs them). The backward is counted as
FlashAttention counts it: 2.5 times the forward's flops (five n x n x d products: S recomputed,
dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, against the forward's two), so forward+backward
is 3.5 times the forward (Dao, "FlashAttention-2", 2023, §4.1; its ``benchmark_flash_attention.py``).
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
    "MASKS",
    "MEMORY_BOUNDED_IMPLS",
    "PASSES",
    "SMOKE",
    "Case",
    "SCORE_IMPLS",
    "attention_flops",
    "build_cases",
    "least_bytes",
    "make_cotangent",
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
#: The built-ins that hold a whole (B, h, n, n) score matrix during a call (:func:`least_bytes`).
SCORE_IMPLS: tuple[str, ...] = ("numpy", "torch")
DTYPES: tuple[str, ...] = ("float32", "float64")
#: The masks of a case: none (``full``) or the §3.2.3 causal mask.
MASKS: tuple[str, ...] = ("full", "causal")
#: What a case times, and its flops as a multiple of the forward's (see the module docstring).
PASSES: dict[str, float] = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}
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
    pass_: str = "forward"
    batch: int = BATCH
    heads: int = HEADS
    head_dim: int = HEAD_DIM

    @property
    def id(self) -> str:
        """``numpy-float32-n2048-causal`` (forward), ``...-causal-backward``, ``...-causal-forward+backward``: the
        pytest id and the key in every report and baseline."""
        base = f"{self.impl}-{self.dtype}-n{self.n}-{'causal' if self.causal else 'full'}"
        return base if self.pass_ == "forward" else f"{base}-{self.pass_}"

    @property
    def group(self) -> str:
        """pytest-benchmark group: the implementations side by side for one shape, mask and pass."""
        return f"attention {self.pass_} {self.dtype} n={self.n} {'causal' if self.causal else 'full'}"

    @property
    def flops_full(self) -> int:
        """4 n^2 d per head for the forward, every score counted, times the pass's multiple (module docstring)."""
        forward = attention_flops(self.batch * self.heads, self.n, self.n, self.head_dim, causal=False)
        return round(forward * PASSES[self.pass_])

    @property
    def flops_useful(self) -> int:
        """Only the visible (query, key) pairs: n (n + 1) / 2 of them when causal; times the pass's multiple."""
        forward = attention_flops(self.batch * self.heads, self.n, self.n, self.head_dim, causal=self.causal)
        return round(forward * PASSES[self.pass_])

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
    masks: Sequence[str] = MASKS,
    passes: Sequence[str] = ("forward",),
) -> list[Case]:
    """Every (impl, dtype, n, mask, pass) combination: ``sizes`` for all, also ``big_sizes`` for ``big_impls``.

    The big sizes measure how the forward's peak memory grows with n (``report.memory_exponent``) and how far each
    pass stays at its floors where the (B, h, n, n) scores would not fit in memory.

    Ordered by implementation, then pass, then dtype, then n, then full before causal. ValueError naming the
    argument for a mask or pass that does not exist.
    """
    for name, given, known in (("masks", masks, MASKS), ("passes", passes, tuple(PASSES))):
        unknown = [x for x in given if x not in known]
        if unknown or not given:
            raise ValueError(f"{name}: expected one or more of {', '.join(known)}, got {', '.join(given) or 'none'}")
    cases = []
    for impl in impls:
        for pass_ in (p for p in PASSES if p in passes):
            big = set(big_sizes) if impl in big_impls else set()
            ns = sorted(set(sizes) | big)
            for dtype in dtypes:
                for n in ns:
                    cases += [Case(impl, dtype, n, mask == "causal", pass_) for mask in MASKS if mask in masks]
    return cases


def least_bytes(case: Case) -> tuple[int, str]:
    """The fewest bytes ``case`` holds at once, and how they are counted, in words: a lower bound, so that a case
    refused for it could never have run.

    Every pass holds (B, h, n, d) arrays in the case's dtype: q, k, v and the output for the forward; those, dO, dQ,
    dK and dV for a backward. The built-ins of :data:`SCORE_IMPLS` also hold one (B, h, n, n) score matrix
    (:attr:`Case.score_bytes`); any other implementation may be O(n) in memory, so no score matrix is counted for it.
    """
    arrays = 4 if case.pass_ == "forward" else 8
    itemsize = ITEMSIZE[case.dtype]
    io = arrays * case.batch * case.heads * case.n * case.head_dim * itemsize
    words = f"{arrays} x ({case.batch}, {case.heads}, n, {case.head_dim}) arrays of {itemsize} bytes"
    if case.impl not in SCORE_IMPLS:
        return io, words
    scores = f"one ({case.batch}, {case.heads}, n, n) score matrix of {itemsize} bytes"
    return io + case.score_bytes, f"{scores} and {words}"


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


def make_cotangent(impl: Any, case: Case) -> Any:
    """A native cotangent dO of the (B, h, n, d) output for the backward passes: standard normal (seed
    :data:`SEED` + 1), rounded to ``case.dtype``."""
    rng = np.random.default_rng(SEED + 1)
    return impl.from_numpy(rng.standard_normal((case.batch, case.heads, case.n, case.head_dim)), case.dtype)
