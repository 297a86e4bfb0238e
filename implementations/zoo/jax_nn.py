"""JAX's own attention functions as the paper's equations: the ``jax-sdpa`` zoo adapter.

What is mapped onto what:

- softmax (§3.2.1) -> ``jax.nn.softmax(x, axis=axis)``.
- Eq. (1) -> ``jax.nn.dot_product_attention(q, k, v, mask=mask)`` (the default, XLA,
  implementation; scale left to JAX: 1/sqrt(d_k)). JAX takes (B, T, N, H) arrays: the contract's
  (..., n, d) are broadcast to one batch shape and flattened to B; the mask, whose True means
  "may attend" in both the contract and JAX, is broadcast to (B, 1, n_q, n_k). JAX requires
  value and key of the same shape (d_v = d_k): v is cut into ceil(d_v / d_k) column blocks of
  width d_k (the last one padded with zero columns), given to JAX as that many heads, each with
  the same q and k, and the blocks' outputs are put back side by side (padding dropped). Each
  output column depends only on its own column of v, so every score and output is what one call
  with the whole v would give.

Dtypes: float64 (JAX needs its x64 mode: each call with float64 arrays runs inside the scoped
``with jax.enable_x64(True)`` context manager, so the process-wide setting is never changed),
float32, float16 and bfloat16 (ml_dtypes' bfloat16, rounded by NumPy to nearest even), on the CPU.

Declared policy: a fully masked query row gives the mean of the values ("uniform"), measured with
jax 0.10: the XLA implementation replaces masked scores by a large finite negative number, so the
softmax of such a row is uniform; the docstring of ``jax.nn.dot_product_attention``
(https://docs.jax.dev/en/latest/_autosummary/jax.nn.dot_product_attention.html) does not say what
it returns there. Not declared (undocumented, left for the suite to find): that implementation
computes the softmax in float32 whatever the input dtype, float64 included, and XLA's CPU
backend flushes subnormal results to zero (a maintainer calls it intended in
https://github.com/jax-ml/jax/issues/16200; the documentation does not say it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from aiayn.implementations.protocol import DEFAULT_POLICIES, ImplementationBase

__all__ = ["JaxAttention", "as_heads", "jax_array", "numpy_array", "x64_for"]

_NUMPY_DTYPES = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int64": np.int64,
    "bool": np.bool_,
}


def x64_for(*arrays: Any) -> contextlib.AbstractContextManager:
    """``jax.enable_x64(True)`` when any of ``arrays`` (or dtype names) is 64-bit, else a no-op context."""
    wide = any(str(getattr(a, "dtype", a)) in ("float64", "int64") for a in arrays)
    return jax.enable_x64(True) if wide else contextlib.nullcontext()


def jax_array(array: np.ndarray, dtype: str) -> jax.Array:
    """float64 NumPy -> a fresh JAX array in ``dtype``, rounded by NumPy (nearest, ties to even)."""
    rounded = np.array(array, dtype=_NUMPY_DTYPES[dtype], copy=True)
    with x64_for(dtype):
        return jnp.array(rounded, copy=True)


def numpy_array(x: Any) -> np.ndarray:
    """A JAX array -> a NumPy copy; floats of every precision come back as float64 (exact)."""
    host = np.asarray(x)
    if host.dtype.kind == "f" or host.dtype == ml_dtypes.bfloat16:
        return host.astype(np.float64)
    return host.astype(np.int64) if host.dtype.kind in "iu" else np.array(host, copy=True)


def as_heads(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> tuple[Any, ...]:
    """The contract's Eq. (1) arguments in JAX's (B, T, N, H) layout, and the map of the result back.

    q (..., n_q, d_k) -> (B, n_q, N, d_k), k likewise, v (..., n_k, d_v) -> (B, n_k, N, d_k) with
    N = ceil(d_v / d_k) column blocks of v as heads (zero columns pad the last), mask ->
    (B, 1, n_q, n_k) or None; ``back`` takes (B, n_q, N, d_k) to (..., n_q, d_v).
    """
    batch = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], () if mask is None else mask.shape[:-2])
    (n_q, d_k), (n_k, d_v) = q.shape[-2:], v.shape[-2:]
    b, heads = math.prod(batch), -(-d_v // d_k)
    q4, k4 = (
        jnp.broadcast_to(t[..., None, :], (*batch, t.shape[-2], heads, d_k)).reshape(b, t.shape[-2], heads, d_k)
        for t in (q, k)
    )
    v4 = jnp.broadcast_to(v, (*batch, n_k, d_v)).reshape(b, n_k, d_v)
    v4 = jnp.pad(v4, ((0, 0), (0, 0), (0, heads * d_k - d_v))).reshape(b, n_k, heads, d_k)
    m4 = None if mask is None else jnp.broadcast_to(mask, (*batch, n_q, n_k)).reshape(b, 1, n_q, n_k)

    def back(out: jax.Array) -> jax.Array:
        return out.reshape(*batch, n_q, heads * d_k)[..., :d_v]

    return q4, k4, v4, m4, back


class JaxAdapter(ImplementationBase):
    """What the JAX-based adapters share: the array boundary, the four dtypes, and fully masked rows
    'uniform' (measured: XLA's attention masks with a finite value)."""

    device = "cpu"
    dtypes = ("float64", "float32", "float16", "bfloat16")
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "uniform"})
    compiles_per_shape = True  # XLA compiles each new input shape (about 0.1-1 s here, against ms once compiled)

    def from_numpy(self, array: np.ndarray, dtype: str) -> jax.Array:
        return jax_array(array, self.check_dtype(dtype, allow_index=True))

    def to_numpy(self, x: Any) -> np.ndarray:
        return numpy_array(x)


class JaxAttention(JaxAdapter):
    """``jax.nn.softmax`` and ``jax.nn.dot_product_attention`` (registry name ``"jax-sdpa"``); see the module
    docstring."""

    name = "jax-sdpa"
    version = f"jax {jax.__version__}"

    def softmax(self, x: jax.Array, axis: int = -1) -> jax.Array:
        with x64_for(x):
            return jax.nn.softmax(x, axis=axis)

    def scaled_dot_product_attention(
        self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None
    ) -> jax.Array:
        """Eq. (1); q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v) -> (..., n_q, d_v)."""
        with x64_for(q):
            q4, k4, v4, m4, back = as_heads(q, k, v, mask)
            return back(jax.nn.dot_product_attention(q4, k4, v4, mask=m4))
