"""Keras 3's attention and normalisation layers as the paper's equations: the ``keras-mha`` zoo adapter.

Backend: Keras 3 picks its backend once, when it is first imported, from ``KERAS_BACKEND``. This
module sets it to ``"jax"`` only if the user has not chosen one (``os.environ.setdefault``, before
importing keras); the version string names the backend in use. Arrays cross the boundary through
``keras.ops.convert_to_tensor`` / ``keras.ops.convert_to_numpy``, so any backend works; on the jax
backend float64 calls run inside the scoped ``jax.enable_x64`` context manager (see ``jax_nn``).

What is mapped onto what:

- multi-head attention (§3.2.2) -> ``keras.layers.MultiHeadAttention(h, key_dim=d_k,
  value_dim=d_v, use_bias=True, dropout=0)`` in the dtype, built with ``build(query_shape,
  value_shape, key_shape)`` (each (None, None, d_model)) and called as ``layer(query, value,
  key=key, attention_mask=..., training=False)`` (Keras takes value before key). Its
  ``EinsumDense`` kernels keep the heads as an axis: ``query_dense/key_dense.kernel`` (d_model,
  h, d_k) = ``w_q/w_k.reshape(d_model, h, d_k)`` (head i = columns i*d_k:(i+1)*d_k, the
  canonical layout), ``value_dense.kernel``
  (d_model, h, d_v), biases (h, d_k) / (h, d_v), ``output_dense.kernel`` (h, d_v, d_model) =
  ``w_o.reshape(h, d_v, d_model)``, ``output_dense.bias`` (d_model,) = ``b_o``; absent biases are
  zeros. Query, key and value are broadcast to one batch size B. The mask: Keras' boolean
  ``attention_mask`` (B, T, S) means, as the contract does, True (1) = may attend; it is
  broadcast to (B, n_q, n_k), the shape Keras documents.
- layer normalisation (§3.1) -> ``keras.layers.LayerNormalization(epsilon=eps)`` with
  ``gamma`` = gain and ``beta`` = bias (Keras' default epsilon 1e-3 is never used).

Scope: multi-head attention with exactly one batch dimension. Keras documents query (B, T, dim),
and with more axes ``attention_axes=None`` attends over every axis but the batch, heads and
features, a different function (https://keras.io/api/layers/attention_layers/multi_head_attention/).

Dtypes: float64, float32, float16, bfloat16 on the jax backend (CPU); float64, float32 otherwise.

Declared policy: a fully masked query row gives the mean of the values ("uniform"), measured with
keras 3.15.1 on the jax backend: Keras hands the projected heads to ``keras.ops.dot_product_attention``,
which calls ``jax.nn.dot_product_attention`` (large finite negative masked scores, see ``jax_nn``);
Keras does not document the fully masked case. Not declared (undocumented, left for the suite):
under float64, LayerNormalization computes in float32 (Keras' type promotion,
``keras.backend.result_type``, maps 64-bit dtypes to 32-bit) and the attention's softmax is
float32 (JAX's); LayerNormalization evaluates x * inv + (beta - mean * inv), which cancels when
|mean| is large against the spread of the row; XLA's CPU backend flushes subnormals to zero.
"""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Mapping  # noqa: E402
from types import MappingProxyType  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from aiayn.implementations.protocol import DEFAULT_POLICIES, ImplementationBase, Scope  # noqa: E402

__all__ = ["KerasMHA"]

_BACKEND = keras.backend.backend()
_ROUND = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int64": np.int64,
    "bool": np.bool_,
}


def _scoped(dtype: Any) -> contextlib.AbstractContextManager:
    """The jax backend's 64-bit mode, scoped, for float64 / int64 work; a no-op otherwise."""
    if _BACKEND == "jax" and str(getattr(dtype, "dtype", dtype)) in ("float64", "int64"):
        import jax

        return jax.enable_x64(True)
    return contextlib.nullcontext()


class KerasMHA(ImplementationBase):
    """``keras.layers.MultiHeadAttention`` and ``keras.layers.LayerNormalization`` (registry name ``"keras-mha"``)."""

    name = "keras-mha"
    version = f"keras {keras.__version__} ({_BACKEND} backend)"
    device = "cpu"
    dtypes = ("float64", "float32", "float16", "bfloat16") if _BACKEND == "jax" else ("float64", "float32")
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "uniform"})
    compiles_per_shape = True  # a layer built per call is traced for each new input shape
    scope = MappingProxyType(
        {"multi_head_attention": Scope(batch_dims=(1,), note="query (B, T, d_model) as Keras documents")}
    )

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        rounded = np.array(
            array, dtype=_ROUND[self.check_dtype(dtype, allow_index=True)], copy=True
        )  # nearest, ties to even
        with _scoped(dtype):
            return keras.ops.convert_to_tensor(rounded, dtype=dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        host = np.asarray(keras.ops.convert_to_numpy(x))
        if host.dtype.kind == "f" or host.dtype == ml_dtypes.bfloat16:
            return host.astype(np.float64)
        return host.astype(np.int64) if host.dtype.kind in "iu" else np.array(host, copy=True)

    def multi_head_attention(
        self, query: Any, key: Any, value: Any, params: Mapping[str, Any], num_heads: int, mask: Any | None = None
    ) -> Any:
        """§3.2.2; query (B, n_q, d_model), key/value (B, n_k, d_model) -> (B, n_q, d_model)."""
        dtype = keras.backend.standardize_dtype(query.dtype)
        h = int(num_heads)
        d_model, d_k, d_v = query.shape[-1], params["w_q"].shape[1] // h, params["w_v"].shape[1] // h
        with _scoped(dtype):
            layer = keras.layers.MultiHeadAttention(
                h, key_dim=d_k, value_dim=d_v, use_bias=True, dropout=0.0, dtype=dtype
            )
            layer.build((None, None, d_model), (None, None, d_model), (None, None, d_model))
            for dense, w, b, kernel, bias in (
                (layer.query_dense, "w_q", "b_q", (d_model, h, d_k), (h, d_k)),
                (layer.key_dense, "w_k", "b_k", (d_model, h, d_k), (h, d_k)),
                (layer.value_dense, "w_v", "b_v", (d_model, h, d_v), (h, d_v)),
                (layer.output_dense, "w_o", "b_o", (h, d_v, d_model), (d_model,)),
            ):
                dense.kernel.assign(keras.ops.reshape(params[w], kernel))
                dense.bias.assign(
                    keras.ops.zeros(bias, dtype) if params.get(b) is None else keras.ops.reshape(params[b], bias)
                )
            batch = max(query.shape[0], key.shape[0], value.shape[0])  # (1 broadcasts; Keras wants one B)
            q, k, v = (keras.ops.broadcast_to(t, (batch, *t.shape[1:])) for t in (query, key, value))
            m = None if mask is None else keras.ops.broadcast_to(mask, (batch, q.shape[1], k.shape[1]))
            return layer(q, v, key=k, attention_mask=m, training=False)

    def layer_norm(self, x: Any, gain: Any, bias: Any, eps: float) -> Any:
        """§3.1's LayerNorm over the last axis; x (..., d_model), gain/bias (d_model,)."""
        dtype = keras.backend.standardize_dtype(x.dtype)
        with _scoped(dtype):
            layer = keras.layers.LayerNormalization(axis=-1, epsilon=float(eps), dtype=dtype)
            layer.build(tuple(x.shape))
            layer.gamma.assign(gain)
            layer.beta.assign(bias)
            return layer(x)
