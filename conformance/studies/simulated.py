"""An honest low-precision implementation: every equation with every intermediate rounded to the dtype.

The meta-tests of the budgets (``tests/meta/test_budget_coverage.py``) need an implementation that is
*right* in a dtype but no more accurate than that dtype allows: if the suite failed it, a budget
would be too tight (a false alarm); if a variant with a real numerical defect passed, a budget
would be too loose. Real kernels keep intermediates in the dtype, or wider; this simulates the
narrow end faithfully:

- Every elementary operation (+, -, *, /, sqrt, and the transcendental exp, log, sin, cos) is
  computed in float64 on dtype values and rounded once to the dtype, to nearest, ties to even
  (``numerics.round_to``). For +, -, *, /, sqrt that is the correctly rounded result of the dtype
  (float64 has p = 53 >= 2p + 2 for p <= 24, so computing wider then rounding is exact rounding;
  Higham, §2.6 / Figueroa 1995); exp/log/sin/cos are within half an ulp plus float64's error.
- Sums and dot products accumulate left to right, rounding after every product and every
  addition: the longest error chain of any summation order (Higham, §4.2), never a wider
  accumulator.
- The algorithms are the standard stable ones the budgets assume: max-shifted softmax, two-pass
  LayerNorm with eps inside the square root, log-softmax by shifting, post-norm layers.

Native arrays are :class:`Sim` (float64 values that are all dtype values, and the dtype's name);
masks and ids are NumPy arrays. Instantiate ``Simulated(dtypes)``; the registry names
``aiayn.conformance.studies.simulated:float16`` (and ``bfloat16``, ``float32``, ``float64``) are
single-dtype instances, so that lrate and label smoothing (checked in the first dtype) are
computed in that dtype too.

``OnePassVariance`` is the same with LayerNorm's variance as E[x^2] - E[x]^2: the numerical
defect the budgets must catch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from aiayn.conformance.numerics import precision, round_to
from aiayn.implementations.protocol import DEFAULT_POLICIES, DTYPES, ImplementationBase
from aiayn.reference.counts import dropout_places

__all__ = ["OnePassVariance", "Sim", "Simulated", "bfloat16", "float16", "float32", "float64", "one_pass_float16"]


class Sim:
    """A native array of :class:`Simulated`: float64 ``values`` that are exactly values of ``dtype``."""

    __slots__ = ("dtype", "values")

    def __init__(self, values: np.ndarray, dtype: str) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    def __repr__(self) -> str:
        return f"Sim({self.dtype}, shape={self.shape})"


class Simulated(ImplementationBase):
    """Every equation of the paper with each intermediate rounded to the dtype (module docstring)."""

    name = "simulated"
    version = "per-operation rounding"
    device = "cpu"

    def __init__(self, dtypes: Sequence[str] = DTYPES, name: str | None = None) -> None:
        self.dtypes = tuple(dtypes)
        if name:
            self.name = name

    # ---------------------------------------------------------------- the boundary

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        self.check_dtype(dtype, allow_index=True)
        if dtype in ("int64", "bool"):
            return np.array(array, dtype=dtype, copy=True)
        return Sim(round_to(np.asarray(array, dtype=np.float64), dtype), dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        if isinstance(x, Sim):
            return x.values.copy()
        arr = np.asarray(x)
        return np.array(arr, dtype=np.int64 if arr.dtype.kind in "iu" else arr.dtype, copy=True)

    # ---------------------------------------------------------------- rounded arithmetic

    @staticmethod
    def _dtype(*arrays: Any) -> str:
        dtypes = {a.dtype for a in arrays if isinstance(a, Sim)}
        if len(dtypes) != 1:
            raise ValueError(f"expected float inputs of one dtype, got {sorted(dtypes)}")
        return dtypes.pop()

    @staticmethod
    def _sum(x: np.ndarray, dtype: str, axis: int = -1) -> np.ndarray:
        """Left-to-right sum along ``axis``, rounded after every addition (keepdims)."""
        x = np.moveaxis(x, axis, -1)
        acc = x[..., :1].copy() if x.shape[-1] else np.zeros((*x.shape[:-1], 1))
        with np.errstate(invalid="ignore"):
            for i in range(1, x.shape[-1]):
                acc = round_to(acc + x[..., i : i + 1], dtype)
        return np.moveaxis(acc, -1, axis)

    @staticmethod
    def _dot(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
        """a @ b accumulated left to right over the inner axis, every product and addition rounded."""
        k = a.shape[-1]
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        acc = np.zeros(shape)
        with np.errstate(invalid="ignore", over="ignore"):
            for i in range(k):
                term = round_to(a[..., :, i : i + 1] * b[..., i : i + 1, :], dtype)
                acc = term if i == 0 else round_to(acc + term, dtype)
        return acc

    def _affine(self, x: np.ndarray, w: Any, b: Any, dtype: str) -> np.ndarray:
        out = self._dot(x, w.values, dtype)
        return out if b is None else round_to(out + b.values, dtype)

    # ---------------------------------------------------------------- §3.2.1, §3.2.3

    def _softmax_last(self, z: np.ndarray, dtype: str) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            m = np.max(z, axis=-1, keepdims=True)  # exact
            e = round_to(np.exp(round_to(z - m, dtype)), dtype)
            return round_to(e / self._sum(e, dtype), dtype)

    def softmax(self, x: Sim, axis: int = -1) -> Sim:
        dtype = self._dtype(x)
        z = np.moveaxis(x.values, axis, -1)
        return Sim(np.moveaxis(self._softmax_last(z, dtype), -1, axis), dtype)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, dtype: str) -> np.ndarray:
        root = round_to(np.sqrt(float(q.shape[-1])), dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            s = round_to(self._dot(q, np.swapaxes(k, -1, -2), dtype) / root, dtype)  # (..., n_q, n_k)
        if mask is not None:
            s = np.where(np.asarray(mask, dtype=bool), s, self.masked_score(dtype))
        p = self._softmax_last(
            s, dtype
        )  # a fully masked row: NaN (policy "nan"), or 1/n_k each (a finite masked score)
        return self._dot(p, v, dtype)  # (..., n_q, d_v)

    def masked_score(self, dtype: str) -> float:
        """What a masked score becomes: -inf (§3.2.3)."""
        return -np.inf

    def scaled_dot_product_attention(self, q: Sim, k: Sim, v: Sim, mask: np.ndarray | None = None) -> Sim:
        dtype = self._dtype(q, k, v)
        return Sim(self._attend(q.values, k.values, v.values, mask, dtype), dtype)

    # ---------------------------------------------------------------- §3.2.2

    def _mha(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        params: Mapping[str, Any],
        h: int,
        mask: np.ndarray | None,
        dtype: str,
    ) -> np.ndarray:
        def heads(x: np.ndarray) -> np.ndarray:  # (..., n, h*d) -> (..., h, n, d)
            return np.swapaxes(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -2, -3)

        q = heads(self._affine(query, params["w_q"], params.get("b_q"), dtype))
        k = heads(self._affine(key, params["w_k"], params.get("b_k"), dtype))
        v = heads(self._affine(value, params["w_v"], params.get("b_v"), dtype))
        m = None if mask is None else np.asarray(mask, dtype=bool)[..., None, :, :]
        out = np.swapaxes(self._attend(q, k, v, m, dtype), -2, -3)  # (..., n_q, h, d_v)
        merged = out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        return self._affine(merged, params["w_o"], params.get("b_o"), dtype)

    def multi_head_attention(
        self,
        query: Sim,
        key: Sim,
        value: Sim,
        params: Mapping[str, Any],
        num_heads: int,
        mask: np.ndarray | None = None,
    ) -> Sim:
        dtype = self._dtype(query, key, value)
        return Sim(self._mha(query.values, key.values, value.values, params, int(num_heads), mask, dtype), dtype)

    # ---------------------------------------------------------------- §3.5

    def _pe(self, length: int, d_model: int, dtype: str) -> np.ndarray:
        exponent = round_to(np.arange(0, d_model, 2, dtype=np.float64) / d_model, dtype)  # 2i / d_model
        log_base = round_to(np.log(10000.0), dtype)
        w = round_to(np.exp(round_to(-log_base * exponent, dtype)), dtype)  # 10000^(-2i/d)
        theta = round_to(np.arange(length, dtype=np.float64)[:, None] * w[None, :], dtype)  # (length, d/2)
        pe = np.empty((length, d_model))
        pe[:, 0::2], pe[:, 1::2] = round_to(np.sin(theta), dtype), round_to(np.cos(theta), dtype)
        return pe

    def positional_encoding(self, length: int, d_model: int, dtype: str) -> Sim:
        self.check_dtype(dtype)
        return Sim(self._pe(int(length), int(d_model), dtype), dtype)

    # ---------------------------------------------------------------- §3.1, §3.3

    def _variance(self, c: np.ndarray, x: np.ndarray, mean: np.ndarray, dtype: str) -> np.ndarray:
        """Two-pass: mean of the squared centred values."""
        return round_to(self._sum(round_to(c * c, dtype), dtype) / c.shape[-1], dtype)

    def _layer_norm(self, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, dtype: str) -> np.ndarray:
        d = x.shape[-1]
        mean = round_to(self._sum(x, dtype) / d, dtype)
        c = round_to(x - mean, dtype)
        var = self._variance(c, x, mean, dtype)
        with np.errstate(invalid="ignore"):
            s = round_to(np.sqrt(round_to(var + eps, dtype)), dtype)
        return round_to(round_to(round_to(c / s, dtype) * gain, dtype) + bias, dtype)

    def layer_norm(self, x: Sim, gain: Sim, bias: Sim, eps: float) -> Sim:
        dtype = self._dtype(x, gain, bias)
        return Sim(self._layer_norm(x.values, gain.values, bias.values, float(eps), dtype), dtype)

    def _ffn(self, x: np.ndarray, w1: Any, b1: Any, w2: Any, b2: Any, dtype: str) -> np.ndarray:
        hidden = np.maximum(self._affine(x, w1, b1, dtype), 0.0)
        return self._affine(hidden, w2, b2, dtype)

    def feed_forward(self, x: Sim, w1: Sim, b1: Sim, w2: Sim, b2: Sim) -> Sim:
        dtype = self._dtype(x, w1, b1, w2, b2)
        return Sim(self._ffn(x.values, w1, b1, w2, b2, dtype), dtype)

    # ---------------------------------------------------------------- §5.3, §5.4

    def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
        if step < 0:
            raise ValueError(f"step: expected >= 0, got {step}")
        dtype = self.dtypes[0]
        r = lambda v: float(round_to(np.float64(v), dtype))  # noqa: E731
        if step == 0:
            return 0.0  # min(inf, 0) = 0 (policy "zero")
        # the integers are operands, each power and product one rounding (step itself is not stored
        # in the dtype: float16 would overflow at 65520)
        return r(r(d_model**-0.5) * min(r(step**-0.5), r(step * r(warmup_steps**-1.5))))

    def adam_step(self, param: Sim, grad: Sim, m: Sim, v: Sim, step: int, lr: float, betas: Any, eps: float) -> Any:
        """Algorithm 1 of Kingma & Ba with the constants rounded to the dtype, every operation rounded (beta^t: the
        float64 power of the rounded beta, rounded once)."""
        dtype = self._dtype(param, grad, m, v)

        def r(x: Any) -> np.ndarray:
            return round_to(np.asarray(x, dtype=np.float64), dtype)

        b1, b2, e, rate = (r(x) for x in (betas[0], betas[1], eps, lr))
        g = grad.values
        m1 = r(r(b1 * m.values) + r(r(1 - b1) * g))
        v1 = r(r(b2 * v.values) + r(r(1 - b2) * r(g * g)))
        c1, c2 = r(1 - r(b1**step)), r(1 - r(b2**step))
        with np.errstate(divide="ignore", invalid="ignore"):
            update = r(r(rate * r(m1 / c1)) / r(r(np.sqrt(r(v1 / c2))) + e))
        return Sim(r(param.values - update), dtype), Sim(m1, dtype), Sim(v1, dtype)

    def dropout(self, x: Sim, p: float, seed: int) -> tuple[Sim, np.ndarray]:
        """keep x times 1 / (1 - p) rounded to the dtype, the product rounded."""
        keep = np.random.default_rng(seed).random(x.shape) >= p
        scale = round_to(np.float64(1 / (1 - p)), x.dtype)
        return Sim(np.where(keep, round_to(x.values * scale, x.dtype), 0.0), x.dtype), keep

    def average_checkpoints(self, checkpoints: Mapping[int, Mapping[str, Sim]], n: int) -> dict[str, Sim]:
        """The last n checkpoints by step summed left to right, each addition rounded, then divided (rounded)."""
        chosen = sorted(checkpoints)[-n:]
        out = {}
        for name, first in checkpoints[chosen[0]].items():
            stacked = np.stack([checkpoints[s][name].values for s in chosen], axis=-1)
            out[name] = Sim(round_to(self._sum(stacked, first.dtype)[..., 0] / n, first.dtype), first.dtype)
        return out

    def _smoothed(self, targets: np.ndarray, k: int, eps: float, dtype: str) -> np.ndarray:
        off = float(round_to(np.float64(eps / k), dtype))
        on = float(round_to(round_to(np.float64(1.0 - eps), dtype) + off, dtype))
        q = np.full((*np.shape(targets), k), off)
        np.put_along_axis(q, np.asarray(targets)[..., None], on, axis=-1)
        return q

    def label_smoothing(self, targets: np.ndarray, vocab_size: int, eps: float) -> Sim:
        dtype = self.dtypes[0]
        return Sim(self._smoothed(targets, int(vocab_size), float(eps), dtype), dtype)

    def smoothed_cross_entropy(self, logits: Sim, targets: np.ndarray, eps: float) -> Sim:
        dtype = self._dtype(logits)
        z = logits.values
        k = z.shape[-1]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            d = round_to(z - np.max(z, axis=-1, keepdims=True), dtype)
            log_s = round_to(np.log(self._sum(round_to(np.exp(d), dtype), dtype)), dtype)
            log_p = round_to(d - log_s, dtype)
            q = self._smoothed(targets, k, float(eps), dtype)
            loss = -self._sum(round_to(q * log_p, dtype), dtype)[..., 0]
        return Sim(round_to(loss, dtype), dtype)

    # ---------------------------------------------------------------- the backward pass

    def vjp(self, equation: str, args: Sequence[Any], d_out: Sim) -> dict[str, Sim]:
        """The gradients of ``equation`` for the cotangent ``d_out``, every intermediate rounded to the dtype (the
        formulas of ``conformance/budgets/backward.py``, each operation once, sums left to right)."""
        backward = getattr(self, f"_{equation}_vjp", None)
        if backward is None:
            raise NotImplementedError(f"no backward pass of {equation} in the simulated implementation")
        dtype = d_out.dtype
        return {name: Sim(g, dtype) for name, g in backward(*args, g=d_out.values, dtype=dtype).items()}

    def _rows_sum(self, x: np.ndarray, dtype: str) -> np.ndarray:
        """Sum over every row (all axes but the last), left to right, rounded after every addition."""
        return self._sum(x.reshape(-1, x.shape[-1]), dtype, axis=0)[0]

    def _softmax_vjp(self, x: Sim, axis: int, *, g: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
        y = self._softmax_last(np.moveaxis(x.values, axis, -1), dtype)
        gl = np.moveaxis(g, axis, -1)
        with np.errstate(invalid="ignore"):
            t = self._sum(round_to(y * gl, dtype), dtype)
            dx = round_to(y * round_to(gl - t, dtype), dtype)
        return {"x": np.moveaxis(dx, -1, axis)}

    def _scaled_dot_product_attention_vjp(
        self, q: Sim, k: Sim, v: Sim, mask: np.ndarray | None, *, g: np.ndarray, dtype: str
    ) -> dict[str, np.ndarray]:
        qv, kv, vv = q.values, k.values, v.values
        root = round_to(np.sqrt(float(qv.shape[-1])), dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            s = round_to(self._dot(qv, np.swapaxes(kv, -1, -2), dtype) / root, dtype)  # (..., n_q, n_k)
            if mask is not None:
                s = np.where(np.asarray(mask, dtype=bool), s, self.masked_score(dtype))
            p = self._softmax_last(s, dtype)
            dv = self._dot(np.swapaxes(p, -1, -2), g, dtype)  # (..., n_k, d_v)
            dp = self._dot(g, np.swapaxes(vv, -1, -2), dtype)  # (..., n_q, n_k)
            d = self._sum(round_to(p * dp, dtype), dtype)  # (..., n_q, 1)
            ds = round_to(p * round_to(dp - d, dtype), dtype)
            if mask is not None and self.masked_score(dtype) != -np.inf:  # a finite masked score is a constant
                ds = np.where(np.asarray(mask, dtype=bool), ds, 0.0)
            dq = round_to(self._dot(ds, kv, dtype) / root, dtype)
            dk = round_to(self._dot(np.swapaxes(ds, -1, -2), qv, dtype) / root, dtype)
        return {"q": dq, "k": dk, "v": dv}

    def _multi_head_attention_vjp(
        self,
        query: Sim,
        key: Sim,
        value: Sim,
        params: Mapping[str, Any],
        num_heads: int,
        mask: np.ndarray | None = None,
        *,
        g: np.ndarray,
        dtype: str,
    ) -> dict[str, np.ndarray]:
        h = int(num_heads)

        def heads(x: np.ndarray) -> np.ndarray:  # (..., n, h*d) -> (..., h, n, d)
            return np.swapaxes(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -2, -3)

        def merge(x: np.ndarray) -> np.ndarray:  # (..., h, n, d) -> (..., n, h*d)
            x = np.swapaxes(x, -2, -3)
            return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])

        def rows(x: np.ndarray) -> np.ndarray:
            return x.reshape(-1, x.shape[-1])

        given = {"query": query.values, "key": key.values, "value": value.values}
        qkv = {
            x: Sim(heads(self._affine(given[name], params[f"w_{x}"], params.get(f"b_{x}"), dtype)), dtype)
            for name, x in (("query", "q"), ("key", "k"), ("value", "v"))
        }
        m = None if mask is None else np.asarray(mask, dtype=bool)[..., None, :, :]
        concat = merge(self._attend(qkv["q"].values, qkv["k"].values, qkv["v"].values, m, dtype))
        grads = {"w_o": self._dot(rows(concat).T, rows(g), dtype)}
        if "b_o" in params:
            grads["b_o"] = self._rows_sum(g, dtype)
        d_heads = heads(self._dot(g, params["w_o"].values.T, dtype))
        d = self._scaled_dot_product_attention_vjp(qkv["q"], qkv["k"], qkv["v"], m, g=d_heads, dtype=dtype)
        for name, x in (("query", "q"), ("key", "k"), ("value", "v")):
            merged = merge(d[x])
            grads[f"w_{x}"] = self._dot(rows(given[name]).T, rows(merged), dtype)
            if f"b_{x}" in params:
                grads[f"b_{x}"] = self._rows_sum(merged, dtype)
            grads[name] = self._dot(merged, params[f"w_{x}"].values.T, dtype)
        return grads

    def _layer_norm_vjp(self, x: Sim, gain: Sim, bias: Sim, eps: float, *, g: np.ndarray, dtype: str) -> dict:
        xv, d = x.values, x.shape[-1]
        mean = round_to(self._sum(xv, dtype) / d, dtype)
        c = round_to(xv - mean, dtype)
        var = self._variance(c, xv, mean, dtype)
        s = round_to(np.sqrt(round_to(var + float(eps), dtype)), dtype)
        x_hat = round_to(c / s, dtype)
        h = round_to(gain.values * g, dtype)
        a = round_to(self._sum(h, dtype) / d, dtype)
        b = round_to(self._sum(round_to(h * x_hat, dtype), dtype) / d, dtype)
        dx = round_to(round_to(round_to(h - a, dtype) - round_to(x_hat * b, dtype), dtype) / s, dtype)
        return {
            "x": dx,
            "gain": self._rows_sum(round_to(g * x_hat, dtype), dtype),
            "bias": self._rows_sum(g, dtype),
        }

    def _feed_forward_vjp(self, x: Sim, w1: Sim, b1: Sim, w2: Sim, b2: Sim, *, g: np.ndarray, dtype: str) -> dict:
        z = self._affine(x.values, w1, b1, dtype)
        r = np.maximum(z, 0.0)
        xs, gs, rs, zs = (a.reshape(-1, a.shape[-1]) for a in (x.values, g, r, z))
        dz = np.where(zs > 0, self._dot(gs, w2.values.T, dtype), 0.0)  # ReLU's derivative at 0: 0
        return {
            "x": self._dot(dz, w1.values.T, dtype).reshape(x.shape),
            "w1": self._dot(xs.T, dz, dtype),
            "b1": self._rows_sum(dz, dtype),
            "w2": self._dot(rs.T, gs, dtype),
            "b2": self._rows_sum(gs, dtype),
        }

    def _smoothed_cross_entropy_vjp(
        self, logits: Sim, targets: np.ndarray, eps: float, *, g: np.ndarray, dtype: str
    ) -> dict[str, np.ndarray]:
        p = self._softmax_last(logits.values, dtype)
        q = round_to(self._smoothed(targets, logits.shape[-1], float(eps), dtype), dtype)
        total = self._sum(q, dtype)
        diff = round_to(round_to(p * total, dtype) - q, dtype)
        return {"logits": round_to(g[..., None] * diff, dtype)}

    # ---------------------------------------------------------------- §3.1 layers, Figure 1

    def _eps(self) -> float:
        return float(self.policies["layer_norm_eps"])

    def _norm(self, x: np.ndarray, p: Mapping[str, Any], dtype: str) -> np.ndarray:
        return self._layer_norm(x, p["gain"].values, p["bias"].values, self._eps(), dtype)

    def _encoder(
        self, x: np.ndarray, params: Mapping[str, Any], h: int, mask: np.ndarray | None, dtype: str, drop: Any = None
    ) -> np.ndarray:
        # drop: §5.4's dropout of each sub-layer's output (training mode); None: evaluation
        d = drop or _identity
        z = self._norm(
            round_to(x + d(self._mha(x, x, x, params["self_attn"], h, mask, dtype)), dtype), params["norm1"], dtype
        )
        f = params["ffn"]
        return self._norm(
            round_to(z + d(self._ffn(z, f["w1"], f["b1"], f["w2"], f["b2"], dtype)), dtype), params["norm2"], dtype
        )

    def _decoder(
        self,
        y: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        h: int,
        self_mask: np.ndarray | None,
        memory_mask: np.ndarray | None,
        dtype: str,
        drop: Any = None,
    ) -> np.ndarray:
        d = drop or _identity  # as _encoder's
        n = y.shape[-2]
        if self_mask is None:
            self_mask = np.arange(n)[None, :] <= np.arange(n)[:, None]  # causal, §3.2.3
        a = self._norm(
            round_to(y + d(self._mha(y, y, y, params["self_attn"], h, self_mask, dtype)), dtype),
            params["norm1"],
            dtype,
        )
        b = self._norm(
            round_to(a + d(self._mha(a, memory, memory, params["cross_attn"], h, memory_mask, dtype)), dtype),
            params["norm2"],
            dtype,
        )
        f = params["ffn"]
        return self._norm(
            round_to(b + d(self._ffn(b, f["w1"], f["b1"], f["w2"], f["b2"], dtype)), dtype), params["norm3"], dtype
        )

    def encoder_layer(self, x: Sim, params: Mapping[str, Any], num_heads: int, mask: np.ndarray | None = None) -> Sim:
        dtype = self._dtype(x)
        return Sim(self._encoder(x.values, params, int(num_heads), mask, dtype), dtype)

    def encoder_layer_training(
        self, x: Sim, params: Mapping[str, Any], num_heads: int, p: float, seed: int, mask: np.ndarray | None = None
    ) -> tuple[Sim, ...]:
        """The layer with each sub-layer's output dropped (:meth:`dropout`, the k-th mask from the stream (seed, k))
        before its rounded residual sum."""
        dtype = self._dtype(x)
        drop, masks = self._dropouts(p, seed, dtype)
        return (Sim(self._encoder(x.values, params, int(num_heads), mask, dtype, drop), dtype), *masks)

    def decoder_layer_training(
        self,
        y: Sim,
        memory: Sim,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
    ) -> tuple[Sim, ...]:
        """As :meth:`encoder_layer_training`, the three sub-layers' masks."""
        dtype = self._dtype(y, memory)
        drop, masks = self._dropouts(p, seed, dtype)
        out = self._decoder(y.values, memory.values, params, int(num_heads), self_mask, memory_mask, dtype, drop)
        return (Sim(out, dtype), *masks)

    def _dropouts(self, p: float, seed: int, dtype: str) -> tuple[Any, list[np.ndarray]]:
        masks: list[np.ndarray] = []

        def drop(t: np.ndarray) -> np.ndarray:
            y, keep = self.dropout(Sim(t, dtype), p, [seed, len(masks)])
            masks.append(keep)
            return y.values

        return drop, masks

    def decoder_layer(
        self,
        y: Sim,
        memory: Sim,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
    ) -> Sim:
        dtype = self._dtype(y, memory)
        return Sim(self._decoder(y.values, memory.values, params, int(num_heads), self_mask, memory_mask, dtype), dtype)

    def _stacks(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        h: int,
        src_lengths: np.ndarray | None,
        tgt_lengths: np.ndarray | None,
        dtype: str,
        drop: Any = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None, np.ndarray]:
        """Figure 1 up to the logits: each encoder layer's input then the memory, each decoder layer's input then
        the decoder's output, and the masks (source padding; target causal and padding). ``drop``: §5.4's dropout of
        the embeddings' sums and every sub-layer's output (training mode); None: evaluation."""
        d_ = drop or _identity
        emb = params["embedding"]
        if "positional" in params:
            raise ValueError("params['positional']: learned positions are not simulated (sinusoids only)")
        d = emb.shape[1]
        root = round_to(np.sqrt(float(d)), dtype)

        def embed(tokens: np.ndarray) -> np.ndarray:
            n = tokens.shape[-1]
            return round_to(round_to(emb.values[tokens] * root, dtype) + self._pe(n, d, dtype), dtype)

        n_src, n_tgt = src_tokens.shape[-1], tgt_tokens.shape[-1]
        src_mask = (
            None if src_lengths is None else (np.arange(n_src)[None, :] < np.asarray(src_lengths)[:, None])[:, None, :]
        )
        tgt_mask = np.arange(n_tgt)[None, :] <= np.arange(n_tgt)[:, None]
        if tgt_lengths is not None:
            tgt_mask = tgt_mask & (np.arange(n_tgt)[None, :] < np.asarray(tgt_lengths)[:, None])[:, None, :]
        xs = [d_(embed(src_tokens))]
        for layer in params["encoder"]:
            xs.append(self._encoder(xs[-1], layer, h, src_mask, dtype, drop))
        ys = [d_(embed(tgt_tokens))]
        for layer in params["decoder"]:
            ys.append(self._decoder(ys[-1], xs[-1], layer, h, tgt_mask, src_mask, dtype, drop))
        return xs, ys, src_mask, tgt_mask

    def transformer_forward(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: np.ndarray | None = None,
        tgt_lengths: np.ndarray | None = None,
    ) -> Sim:
        dtype = params["embedding"].dtype
        _, ys, _, _ = self._stacks(src_tokens, tgt_tokens, params, int(num_heads), src_lengths, tgt_lengths, dtype)
        return Sim(self._dot(ys[-1], params["embedding"].values.T, dtype), dtype)

    def transformer_forward_training(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        src_lengths: np.ndarray | None = None,
        tgt_lengths: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The model with §5.4's dropout on the embeddings' sums and each sub-layer's output (:meth:`dropout`, the k-th
        mask from the stream (seed, k)): the logits and the masks by place, in the order drawn."""
        dtype = params["embedding"].dtype
        drop, masks = self._dropouts(p, seed, dtype)
        h = int(num_heads)
        _, ys, _, _ = self._stacks(src_tokens, tgt_tokens, params, h, src_lengths, tgt_lengths, dtype, drop)
        places = dropout_places(len(params["encoder"]), len(params["decoder"]))
        logits = Sim(self._dot(ys[-1], params["embedding"].values.T, dtype), dtype)
        return {"logits": logits, **dict(zip(places, masks, strict=True))}

    # ---------------------------------------------------------------- §3.1 layers, Figure 1: the backward pass

    def _norm_vjp(self, r: np.ndarray, p: Mapping[str, Any], g: np.ndarray, dtype: str, grads: dict, name: str):
        out = self._layer_norm_vjp(Sim(r, dtype), p["gain"], p["bias"], self._eps(), g=g, dtype=dtype)
        grads[f"{name}.gain"], grads[f"{name}.bias"] = out["gain"], out["bias"]
        return out["x"]

    def _ffn_vjp(self, x: np.ndarray, f: Mapping[str, Any], g: np.ndarray, dtype: str, grads: dict) -> np.ndarray:
        out = self._feed_forward_vjp(Sim(x, dtype), f["w1"], f["b1"], f["w2"], f["b2"], g=g, dtype=dtype)
        grads.update((f"ffn.{k}", out[k]) for k in ("w1", "b1", "w2", "b2"))
        return out["x"]

    def _attention_vjp(self, name: str, q, k, v, p, h: int, mask, g: np.ndarray, dtype: str, grads: dict) -> dict:
        out = self._multi_head_attention_vjp(Sim(q, dtype), Sim(k, dtype), Sim(v, dtype), p, h, mask, g=g, dtype=dtype)
        grads.update((f"{name}.{key}", value) for key, value in out.items() if key not in ("query", "key", "value"))
        return out

    def _add(self, dtype: str, *terms: np.ndarray) -> np.ndarray:
        total = terms[0]
        for t in terms[1:]:
            total = round_to(total + t, dtype)
        return total

    def _encoder_vjp(self, x: np.ndarray, params: Mapping[str, Any], h: int, mask, g: np.ndarray, dtype: str):
        """(dx, parameter gradients by path) of one encoder layer, every intermediate rounded."""
        f = params["ffn"]
        r1 = round_to(x + self._mha(x, x, x, params["self_attn"], h, mask, dtype), dtype)
        z = self._norm(r1, params["norm1"], dtype)
        r2 = round_to(z + self._ffn(z, f["w1"], f["b1"], f["w2"], f["b2"], dtype), dtype)
        grads: dict[str, np.ndarray] = {}
        d_r2 = self._norm_vjp(r2, params["norm2"], g, dtype, grads, "norm2")
        d_r1 = self._norm_vjp(
            r1, params["norm1"], self._add(dtype, d_r2, self._ffn_vjp(z, f, d_r2, dtype, grads)), dtype, grads, "norm1"
        )
        a = self._attention_vjp("self_attn", x, x, x, params["self_attn"], h, mask, d_r1, dtype, grads)
        return self._add(dtype, d_r1, a["query"], a["key"], a["value"]), grads

    def _decoder_vjp(self, y, memory, params: Mapping[str, Any], h: int, self_mask, memory_mask, g, dtype: str):
        """(dy, dmemory, parameter gradients by path) of one decoder layer, every intermediate rounded."""
        n = y.shape[-2]
        if self_mask is None:
            self_mask = np.arange(n)[None, :] <= np.arange(n)[:, None]  # causal, §3.2.3
        f = params["ffn"]
        r1 = round_to(y + self._mha(y, y, y, params["self_attn"], h, self_mask, dtype), dtype)
        a = self._norm(r1, params["norm1"], dtype)
        r2 = round_to(a + self._mha(a, memory, memory, params["cross_attn"], h, memory_mask, dtype), dtype)
        b = self._norm(r2, params["norm2"], dtype)
        r3 = round_to(b + self._ffn(b, f["w1"], f["b1"], f["w2"], f["b2"], dtype), dtype)
        grads: dict[str, np.ndarray] = {}
        d_r3 = self._norm_vjp(r3, params["norm3"], g, dtype, grads, "norm3")
        d_r2 = self._norm_vjp(
            r2, params["norm2"], self._add(dtype, d_r3, self._ffn_vjp(b, f, d_r3, dtype, grads)), dtype, grads, "norm2"
        )
        c = self._attention_vjp(
            "cross_attn", a, memory, memory, params["cross_attn"], h, memory_mask, d_r2, dtype, grads
        )
        d_r1 = self._norm_vjp(r1, params["norm1"], self._add(dtype, d_r2, c["query"]), dtype, grads, "norm1")
        s = self._attention_vjp("self_attn", y, y, y, params["self_attn"], h, self_mask, d_r1, dtype, grads)
        return self._add(dtype, d_r1, s["query"], s["key"], s["value"]), self._add(dtype, c["key"], c["value"]), grads

    def _encoder_layer_vjp(self, x: Sim, params, num_heads, mask=None, *, g: np.ndarray, dtype: str) -> dict:
        dx, grads = self._encoder_vjp(x.values, params, int(num_heads), mask, g, dtype)
        return {"x": dx, **grads}

    def _decoder_layer_vjp(
        self, y: Sim, memory: Sim, params, num_heads, self_mask=None, memory_mask=None, *, g: np.ndarray, dtype: str
    ) -> dict:
        dy, dm, grads = self._decoder_vjp(
            y.values, memory.values, params, int(num_heads), self_mask, memory_mask, g, dtype
        )
        return {"y": dy, "memory": dm, **grads}

    def _transformer_forward_vjp(
        self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None, *, g, dtype: str
    ) -> dict:
        h, emb = int(num_heads), params["embedding"].values
        xs, ys, src_mask, tgt_mask = self._stacks(src_tokens, tgt_tokens, params, h, src_lengths, tgt_lengths, dtype)
        vocab, d = emb.shape
        grads: dict[str, np.ndarray] = {}
        d_emb = self._dot(g.reshape(-1, vocab).T, ys[-1].reshape(-1, d), dtype)  # logits = y E^T
        d_y, d_memory = self._dot(g, emb, dtype), None
        for i in reversed(range(len(params["decoder"]))):
            d_y, dm, layer = self._decoder_vjp(ys[i], xs[-1], params["decoder"][i], h, tgt_mask, src_mask, d_y, dtype)
            d_memory = dm if d_memory is None else round_to(d_memory + dm, dtype)
            grads.update((f"decoder.{i}.{k}", v) for k, v in layer.items())
        d_x = d_memory
        for i in reversed(range(len(params["encoder"]))):
            d_x, layer = self._encoder_vjp(xs[i], params["encoder"][i], h, src_mask, d_x, dtype)
            grads.update((f"encoder.{i}.{k}", v) for k, v in layer.items())
        root = round_to(np.sqrt(float(d)), dtype)
        for tokens, cot in ((src_tokens, d_x), (tgt_tokens, d_y)):  # each lookup's share added row by row
            for token, row in zip(np.asarray(tokens).reshape(-1), cot.reshape(-1, d)):
                d_emb[token] = round_to(d_emb[token] + round_to(row * root, dtype), dtype)
        grads["embedding"] = d_emb
        return grads


class OnePassVariance(Simulated):
    """The simulated implementation with LayerNorm's variance as E[x^2] - E[x]^2, in the dtype (a numerical defect)."""

    name = "simulated-one-pass-variance"

    def _variance(self, c: np.ndarray, x: np.ndarray, mean: np.ndarray, dtype: str) -> np.ndarray:
        mean_sq = round_to(self._sum(round_to(x * x, dtype), dtype) / x.shape[-1], dtype)
        return round_to(mean_sq - round_to(mean * mean, dtype), dtype)


class FiniteMask(Simulated):
    """The simulated implementation with masked scores *replaced* by a finite value, -0.7 x the dtype's largest (JAX's
    ``dot_product_attention`` uses that value): a fully masked row weighs every key 1/n_k, the declared policy
    "uniform"."""

    name = "simulated-finite-mask"
    policies = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "uniform"})

    def masked_score(self, dtype: str) -> float:
        return float(round_to(np.array(-0.7 * precision(dtype).max), dtype))


float64 = Simulated(("float64",), "simulated-float64")
float32 = Simulated(("float32",), "simulated-float32")
float16 = Simulated(("float16",), "simulated-float16")
bfloat16 = Simulated(("bfloat16",), "simulated-bfloat16")
one_pass_float16 = OnePassVariance(("float16",), "simulated-one-pass-variance-float16")
finite_mask_float32 = FiniteMask(("float32",), "simulated-finite-mask-float32")
finite_mask_float16 = FiniteMask(("float16",), "simulated-finite-mask-float16")
finite_mask_bfloat16 = FiniteMask(("bfloat16",), "simulated-finite-mask-bfloat16")


def _identity(t: np.ndarray) -> np.ndarray:
    """No dropout (evaluation mode)."""
    return t
