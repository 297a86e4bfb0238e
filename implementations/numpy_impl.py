"""A NumPy implementation of every equation, computed in the requested precision (CPU).

Everything is computed in the dtype of the inputs (``float64`` or ``float32``): a float32 call
never widens to float64 internally, so what the suite measures is float32 arithmetic, as a real
float32 implementation would do it. (Scalars are Python floats, which NumPy >= 2 treats as
"weak" and never lets widen an array; NumPy scalars such as ``np.sqrt(d_k)`` would.)

Scaled dot-product attention (§3.2.1, Eq. (1)) has two paths, both computing
``softmax(Q K^T / sqrt(d_k)) V``:

- *direct*: the whole (n_q, n_k) score matrix at once; peak memory grows with n_q * n_k;
- *blocked*: FlashAttention-style online softmax over (block x block) tiles (Milakov &
  Gimelshein 2018; Dao et al. 2022): for each query tile, key tiles are visited in turn keeping a
  running row maximum m, a running denominator l and an unnormalised output acc; when the maximum
  grows from m to m', l and acc are rescaled by exp(m - m'). The output is acc / l. Peak memory
  grows with n * block, not n^2.

``attention="auto"`` (the default) takes the blocked path when n_q * n_k exceeds
``blocked_threshold``. The registry's ``"numpy-blocked"`` always takes it.

This module does not use ``reference/`` (the oracle it is checked against).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiayn.implementations import numpy_backward as backward
from aiayn.implementations.decoding import beam_policies
from aiayn.implementations.protocol import (
    DEFAULT_POLICIES,
    ImplementationBase,
    _policy_problems,
)
from aiayn.reference.counts import dropout_places

__all__ = ["NumpyImplementation", "blocked_numpy_implementation"]

ATTENTION_PATHS = ("auto", "direct", "blocked")
#: Default tile edge of the blocked path: a float32 512x512 score tile is 1 MiB.
DEFAULT_BLOCK_SIZE = 512
#: Default n_q * n_k above which ``attention="auto"`` takes the blocked path (a 1024x1024 matrix).
DEFAULT_BLOCKED_THRESHOLD = 1024 * 1024


class NumpyImplementation(ImplementationBase):
    """Every equation of :data:`aiayn.implementations.protocol.EQUATIONS` in NumPy, float64 or float32.

    Args:
        attention: ``"auto"`` (blocked when n_q * n_k > ``blocked_threshold``), ``"direct"`` or
            ``"blocked"`` — the path of scaled dot-product attention (also inside multi-head
            attention and the layers).
        block_size: tile edge (queries and keys) of the blocked path, a positive int.
        blocked_threshold: n_q * n_k above which ``"auto"`` takes the blocked path.
        policies: overrides of :data:`aiayn.implementations.protocol.DEFAULT_POLICIES` (e.g.
            ``{"fully_masked": "zeros"}``); the NumPy implementation honours every allowed value.
    """

    name = "numpy"
    version = f"numpy {np.__version__}"
    device = "cpu"
    dtypes = ("float64", "float32")

    def __init__(
        self,
        attention: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE,
        blocked_threshold: int = DEFAULT_BLOCKED_THRESHOLD,
        policies: Mapping[str, object] | None = None,
    ) -> None:
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention: expected one of {ATTENTION_PATHS}, got {attention!r}")
        for arg, value in (("block_size", block_size), ("blocked_threshold", blocked_threshold)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg}: expected a positive int, got {value!r}")
        merged = {**DEFAULT_POLICIES, **(policies or {})}
        problems = _policy_problems(merged)
        if problems:
            raise ValueError("policies: " + "; ".join(problems))
        beam_policies(merged)  # a wrong beam-search declaration: ValueError naming it
        self.attention = attention
        self.block_size = block_size
        self.blocked_threshold = blocked_threshold
        self.policies = merged

    # ----------------------------------------------------------------------------------------
    # the boundary

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        """Copy ``array`` into a new ndarray of ``dtype`` (float64 → float32 rounds to nearest even)."""
        self.check_dtype(dtype, allow_index=True)
        return np.array(array, dtype=np.dtype(dtype), copy=True)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        """Copy ``x``: floats as float64 (exact widening), integers as int64, booleans as bool."""
        arr = np.asarray(x)
        kind = {"f": np.float64, "i": np.int64, "u": np.int64, "b": np.bool_}.get(arr.dtype.kind)
        if kind is None:
            raise TypeError(f"x: expected a float, integer or boolean array, got dtype {arr.dtype}")
        return np.array(arr, dtype=kind, copy=True)

    # ----------------------------------------------------------------------------------------
    # §3.2.1-§3.2.3 attention

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """Max-shifted softmax along ``axis`` (§3.2.1): exp(x - max x) / sum exp(x - max x)."""
        self._float_dtype(x=x)
        with np.errstate(invalid="ignore"):  # an all -inf slice gives NaN (0/0), as the formula does
            e = x - np.max(x, axis=axis, keepdims=True)
        np.exp(e, out=e)
        e /= np.sum(e, axis=axis, keepdims=True)
        return e

    def scaled_dot_product_attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """softmax(Q K^T / sqrt(d_k)) V (§3.2.1, Eq. (1)); masked scores are -inf (§3.2.3).

        q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask bool broadcastable to the
        score shape (..., n_q, n_k) -> (..., n_q, d_v). Fully masked rows follow
        ``policies["fully_masked"]``. The path (direct or blocked) is chosen per the constructor.
        ``out``: an array of the result's shape and dtype to write it into (returned); declared in
        ``policies["writes_out"]``.
        """
        self._float_dtype(q=q, k=k, v=v)
        _check_attention_shapes(q, k, v)
        n_q, n_k = q.shape[-2], k.shape[-2]
        blocked = self.attention == "blocked" or (self.attention == "auto" and n_q * n_k > self.blocked_threshold)
        block_q, block_k = (self.block_size, self.block_size) if blocked else (max(n_q, 1), max(n_k, 1))
        policy = self.policies["fully_masked"]
        fill = 0.0 if policy == "zeros" else np.nan
        mask = _as_mask(mask)
        out = _attention_tiled(q, k, v, mask, block_q, block_k, fill, out)
        if policy == "uniform" and mask is not None:  # a fully masked row: every key weighs 1/n_k
            shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask.shape[:-2]) + (n_q, n_k)
            dead = ~np.any(np.broadcast_to(mask, shape), axis=-1)  # (..., n_q)
            if np.any(dead):
                np.copyto(out, np.mean(v, axis=-2, keepdims=True), where=dead[..., None])
        return out

    def attention_with_lse(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (1) over one block of keys and the log-sum-exp of its scores (§3.2.1; ``reference.attention``'s
        "split keys"): (out (..., n_q, d_v), lse (..., n_q)); a query that sees no key of the block (n_k = 0
        included) gets out 0 and lse -inf. Max-shifted, in the inputs' dtype."""
        dt = self._float_dtype(q=q, k=k, v=v)
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            _check_attention_shapes(q, k, v)
        s = np.matmul(q * (1.0 / math.sqrt(q.shape[-1])), np.swapaxes(k, -1, -2))  # (..., n_q, n_k)
        mask = _as_mask(mask)
        if mask is not None:
            s = np.where(_broadcast_mask(mask, s.shape), s, dt.type(-np.inf))
        m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)  # (..., n_q, 1)
        alive = m > -np.inf
        e = np.exp(s - np.where(alive, m, 0.0).astype(dt))  # masked: exp(-inf) = 0
        total = np.sum(e, axis=-1, keepdims=True)
        out = np.matmul(e, v) / np.where(alive, total, 1.0).astype(dt)
        lse = np.where(alive, m + np.log(np.where(alive, total, 1.0).astype(dt)), dt.type(-np.inf))[..., 0]
        return out.astype(dt, copy=False), lse.astype(dt, copy=False)

    def merge_attention_states(self, outs: np.ndarray, lses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Merge P blocks' states by their log-sum-exps (§3.2.1, split keys): outs (P, ..., n_q, d_v), lses
        (P, ..., n_q) -> (out, lse), out = sum_p exp(L_p - L) O_p, L = log sum_p exp(L_p), max-shifted; no block
        alive gives out 0 and lse -inf."""
        dt = self._float_dtype(outs=outs, lses=lses)
        if outs.ndim < 3 or outs.shape[:-1] != lses.shape or outs.shape[0] == 0:
            raise ValueError(
                f"outs, lses: expected shapes (P, ..., n_q, d_v) and (P, ..., n_q) with P >= 1, got {outs.shape} "
                f"and {lses.shape}"
            )
        m = np.max(lses, axis=0)  # (..., n_q)
        alive = m > -np.inf
        w = np.exp(lses - np.where(alive, m, 0.0).astype(dt))  # (P, ..., n_q); an empty block: 0
        total = np.sum(w, axis=0)
        out = np.sum(w[..., None] * outs, axis=0) / np.where(alive, total, 1.0).astype(dt)[..., None]
        lse = np.where(alive, m + np.log(np.where(alive, total, 1.0).astype(dt)), dt.type(-np.inf))
        return out.astype(dt, copy=False), lse.astype(dt, copy=False)

    def paged_attention(
        self, q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray, block_table: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray:
        """Eq. (1) of each sentence's queries over its paged cache (§3.2.1; ``reference.attention.paged_keys``): q
        (B, n_q, d_k), pages (N, page, d) read through block_table (B, M), the first lengths (B,) positions each;
        the slots past a length are zeroed before any arithmetic, so whatever the pool holds there reaches nothing."""
        dt = self._float_dtype(q=q, k_pages=k_pages, v_pages=v_pages)
        table, n = np.asarray(block_table), np.asarray(lengths)
        b, m = table.shape
        span = m * k_pages.shape[1]
        visible = np.arange(span)[None, :] < n[:, None]  # (B, M page)
        k = np.where(visible[..., None], k_pages[table].reshape(b, span, -1), dt.type(0))
        v = np.where(visible[..., None], v_pages[table].reshape(b, span, -1), dt.type(0))
        return self.attention_with_lse(q, k, v, visible[:, None, :])[0]

    def multi_head_attention(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        params: Mapping[str, np.ndarray],
        num_heads: int,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

        Canonical params: w_q, w_k (d_model, h*d_k), w_v (d_model, h*d_v), w_o (h*d_v, d_model),
        optional biases b_q, b_k, b_v, b_o. The mask applies to every head.
        """
        self._float_dtype(query=query, key=key, value=value, **{f"params[{n!r}]": a for n, a in params.items()})
        h = _positive_int("num_heads", num_heads)
        for w in ("w_q", "w_k", "w_v", "w_o"):
            if w not in params:
                raise ValueError(f"params: missing {w!r}; expected w_q, w_k, w_v, w_o and optional b_q, b_k, b_v, b_o")
        q = _split_heads(_affine(query, params["w_q"], params.get("b_q")), h, "w_q")  # (..., h, n_q, d_k)
        k = _split_heads(_affine(key, params["w_k"], params.get("b_k")), h, "w_k")  # (..., h, n_k, d_k)
        v = _split_heads(_affine(value, params["w_v"], params.get("b_v")), h, "w_v")  # (..., h, n_k, d_v)
        head_mask = None if mask is None else _as_mask(mask)[..., None, :, :]  # (..., 1, n_q, n_k)
        heads = self.scaled_dot_product_attention(q, k, v, head_mask)  # (..., h, n_q, d_v)
        concat = _merge_heads(heads)  # (..., n_q, h*d_v)
        return _affine(concat, params["w_o"], params.get("b_o"))  # (..., n_q, d_model)

    # ----------------------------------------------------------------------------------------
    # §3.5 positional encoding

    def positional_encoding(self, length: int, d_model: int, dtype: str) -> np.ndarray:
        """PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same) (§3.5), in ``dtype``.

        Computed in ``dtype``: exponent 2i/d_model, frequency 10000^-(2i/d_model), angle, sin/cos.
        """
        dt = np.dtype(self.check_dtype(dtype))
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length: expected an int >= 0, got {length!r}")
        d_model = _positive_int("d_model", d_model)
        if d_model % 2:
            raise ValueError(f"d_model: expected an even number (sin/cos pairs, §3.5), got {d_model}")
        exponent = np.arange(0, d_model, 2, dtype=dt) / dt.type(d_model)  # (d_model/2,) 2i/d_model
        inv_freq = np.power(dt.type(10000.0), -exponent)  # (d_model/2,)
        angle = np.arange(length, dtype=dt)[:, None] * inv_freq  # (length, d_model/2)
        pe = np.empty((length, d_model), dtype=dt)
        np.sin(angle, out=pe[:, 0::2])
        np.cos(angle, out=pe[:, 1::2])
        return pe

    # ----------------------------------------------------------------------------------------
    # §3.1, §3.3 layers

    def layer_norm(self, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
        """(x - mean) / sqrt(var + eps) * gain + bias over the last axis, biased variance (§3.1).

        Two-pass: the variance is the mean of the squared centred values (no cancellation).
        """
        self._float_dtype(x=x, gain=gain, bias=bias)
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"eps: expected a float >= 0, got {eps!r}")
        centred = x - np.mean(x, axis=-1, keepdims=True)  # (..., d_model)
        var = np.mean(np.square(centred), axis=-1, keepdims=True)  # (..., 1)
        var += float(eps)
        np.sqrt(var, out=var)
        centred /= var
        centred *= gain
        centred += bias
        return centred

    def feed_forward(self, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
        """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. (2))."""
        self._float_dtype(x=x, w1=w1, b1=b1, w2=w2, b2=b2)
        hidden = _affine(x, w1, b1)  # (..., d_ff)
        np.maximum(hidden, 0, out=hidden)
        return _affine(hidden, w2, b2)  # (..., d_model)

    # ----------------------------------------------------------------------------------------
    # §5.3, §5.4 training

    def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
        """d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (§5.3, Eq. (3)), a Python float.

        Step 0 follows ``policies["step_zero"]`` ("zero": 0.0, the formula's limit; "raise"; "one": as step 1).
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step: expected an int >= 0, got {step!r}")
        d_model = _positive_int("d_model", d_model)
        warmup_steps = _positive_int("warmup_steps", warmup_steps)
        if step == 0:
            if self.policies["step_zero"] == "raise":
                raise ValueError("step: 0 has step^-0.5 = inf (policy step_zero='raise')")
            if self.policies["step_zero"] == "zero":
                return 0.0
            step = 1  # "one"
        step = int(step)
        return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    def adam_step(
        self,
        param: np.ndarray,
        grad: np.ndarray,
        m: np.ndarray,
        v: np.ndarray,
        step: int,
        lr: float,
        betas: Any,
        eps: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One Adam step (§5.3; Kingma & Ba, Algorithm 1) in the parameter's dtype: (param, m, v), new arrays.

        m_t = beta1 m + (1 - beta1) g, v_t = beta2 v + (1 - beta2) g^2; the corrections 1 - beta^t in float64
        (Python numbers), the update lr / (1 - beta1^t) * m_t / (sqrt(v_t / (1 - beta2^t)) + eps).
        """
        dt = self._float_dtype(param=param, grad=grad, m=m, v=v)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"step: expected an int >= 1 (the first update is step 1), got {step!r}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas: expected a pair of numbers in [0, 1), got {betas!r}")
        if not lr >= 0 or not eps > 0:
            raise ValueError(f"lr, eps: expected lr >= 0 and eps > 0, got {lr!r}, {eps!r}")
        m1, v1 = adam_moments(grad, m, v, betas, dt)
        c1, c2 = 1.0 - float(betas[0]) ** int(step), 1.0 - float(betas[1]) ** int(step)
        den = np.sqrt(v1 / dt.type(c2)) + dt.type(eps)
        return param - dt.type(lr / c1) * m1 / den, m1, v1

    def dropout(self, x: np.ndarray, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Dropout (§5.4): keep = uniform(seed) >= p, y = keep x (1 / (1 - p)), in x's dtype."""
        dt = self._float_dtype(x=x)
        if not 0 <= p < 1:
            raise ValueError(f"p: expected a rate in [0, 1), got {p!r}")
        keep = np.random.default_rng(seed).random(x.shape) >= p
        return np.where(keep, x * dt.type(1 / (1 - p)), dt.type(0)), keep

    def average_checkpoints(self, checkpoints: Mapping[int, Mapping[str, np.ndarray]], n: int) -> dict[str, np.ndarray]:
        """The mean of the ``n`` checkpoints of the largest steps (§6.1), in their dtype."""
        chosen = _last_steps(checkpoints, n)
        first = checkpoints[chosen[0]]
        dt = self._float_dtype(**{str(name): value for name, value in first.items()})
        return {
            name: np.sum(np.stack([checkpoints[s][name] for s in chosen]), axis=0) / dt.type(len(chosen))
            for name in first
        }

    def label_smoothing(self, targets: np.ndarray, vocab_size: int, eps: float) -> np.ndarray:
        """Smoothed one-hot targets (§5.4) in ``dtypes[0]``; variant per ``policies["label_smoothing"]``.

        "K": (1 - eps) * onehot + eps / K; "K-1": target 1 - eps, every other class eps / (K - 1);
        "K-2": the padding class ``policies.get("padding_id", 0)`` gets 0 and every other class but
        the target eps / (K - 2); rows whose target is padding are 0.
        """
        return self._smoothed_targets(targets, vocab_size, eps, np.dtype(self.dtypes[0]))

    def smoothed_cross_entropy(self, logits: np.ndarray, targets: np.ndarray, eps: float) -> np.ndarray:
        """-sum_c q_c log softmax(logits)_c per position (§5.4), q the smoothed targets.

        log softmax = z - max z - log sum exp(z - max z) (no overflow). Result (...,).
        """
        dt = self._float_dtype(logits=logits)
        if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
            raise ValueError(
                f"targets: expected shape {logits.shape[:-1]} (logits without its last axis), got {targets.shape}"
            )
        q = self._smoothed_targets(targets, logits.shape[-1], eps, dt)  # (..., K)
        shifted = logits - np.max(logits, axis=-1, keepdims=True)  # (..., K)
        log_sum = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))  # (..., 1)
        shifted -= log_sum  # log softmax
        shifted *= q
        return -np.sum(shifted, axis=-1)

    def _smoothed_targets(self, targets: np.ndarray, vocab_size: int, eps: float, dt: np.dtype) -> np.ndarray:
        targets = np.asarray(targets)
        if targets.dtype.kind not in "iu":
            raise TypeError(f"targets: expected an integer array, got dtype {targets.dtype}")
        k = _positive_int("vocab_size", vocab_size)
        if k < 2:
            raise ValueError(f"vocab_size: expected >= 2, got {k}")
        if not (isinstance(eps, (int, float)) and 0 <= eps < 1):
            raise ValueError(f"eps: expected a float in [0, 1), got {eps!r}")
        if targets.size and (targets.min() < 0 or targets.max() >= k):
            raise ValueError(f"targets: expected ids in [0, {k}), got values in [{targets.min()}, {targets.max()}]")
        variant = self.policies["label_smoothing"]
        if variant == "K":
            off, on = eps / k, (1.0 - eps) + eps / k
        elif variant == "K-1":
            off, on = eps / (k - 1), 1.0 - eps
        else:  # "K-2": a padding class takes no mass
            if k < 3:
                raise ValueError(f"vocab_size: label smoothing 'K-2' needs vocab_size >= 3, got {k}")
            off, on = eps / (k - 2), 1.0 - eps
        q = np.full(targets.shape + (k,), off, dtype=dt)  # (..., K)
        np.put_along_axis(q, targets[..., None].astype(np.intp), dt.type(on), axis=-1)
        if variant == "K-2":
            pad = int(self.policies.get("padding_id", 0))
            q[..., pad] = 0
            q[targets == pad] = 0
        return q

    # ----------------------------------------------------------------------------------------
    # the backward pass, by hand (implementations/numpy_backward.py)

    def vjp(self, equation: str, args: list[Any], d_out: np.ndarray) -> dict[str, np.ndarray]:
        """The gradients of ``equation`` at ``args`` for the cotangent ``d_out``, by argument name, in the arguments'
        dtype (the contract's ``vjp``, ``implementations/protocol.py``). Equations without a hand-written backward
        raise NotImplementedError (reported "not provided")."""
        method = getattr(self, f"_{equation}_vjp", None)
        if method is None:
            raise NotImplementedError(f"no hand-written backward of {equation}")
        return method(*args, d_out=d_out)

    def _softmax_vjp(self, x: np.ndarray, axis: int, *, d_out: np.ndarray) -> dict[str, np.ndarray]:
        return {"x": backward.softmax_vjp(self.softmax(x, axis), d_out, axis)}

    def _scaled_dot_product_attention_vjp(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *, d_out: np.ndarray
    ) -> dict[str, np.ndarray]:
        self._float_dtype(q=q, k=k, v=v, d_out=d_out)
        _check_attention_shapes(q, k, v)
        n_q, n_k = q.shape[-2], k.shape[-2]
        blocked = self.attention == "blocked" or (self.attention == "auto" and n_q * n_k > self.blocked_threshold)
        tile = min(self.block_size, max(2, -(-n_k // _BACKWARD_TILES))) if blocked else None
        return backward.attention_vjp(q, k, v, _as_mask(mask), None, d_out, self.policies["fully_masked"], tile)

    def _multi_head_attention_vjp(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        params: Mapping[str, np.ndarray],
        num_heads: int,
        mask: np.ndarray | None = None,
        *,
        d_out: np.ndarray,
    ) -> dict[str, np.ndarray]:
        h = _positive_int("num_heads", num_heads)
        proj = {x: _affine(a, params[f"w_{x}"], params.get(f"b_{x}")) for x, a in zip("qkv", (query, key, value))}
        q, k, v = (_split_heads(proj[x], h, f"w_{x}") for x in "qkv")  # (..., h, n, d)
        head_mask = None if mask is None else _as_mask(mask)[..., None, :, :]
        # this class's own Eq. (1) and its backward (a subclass may restrict its public methods to fewer shapes)
        concat = _merge_heads(NumpyImplementation.scaled_dot_product_attention(self, q, k, v, head_mask))
        rows = {x: a.reshape(-1, a.shape[-1]) for x, a in (("concat", concat), ("d_out", d_out))}
        grads = {"w_o": rows["concat"].T @ rows["d_out"]}
        if "b_o" in params:
            grads["b_o"] = np.sum(rows["d_out"], axis=0)
        d_heads = _split_heads(d_out @ params["w_o"].T, h, "w_o")  # (..., h, n_q, d_v)
        d = NumpyImplementation._scaled_dot_product_attention_vjp(self, q, k, v, head_mask, d_out=d_heads)
        for name, x, given in (("query", "q", query), ("key", "k", key), ("value", "v", value)):
            merged = _merge_heads(d[x])  # (..., n, h*d)
            inputs = np.broadcast_to(given, merged.shape[:-1] + given.shape[-1:]).reshape(-1, given.shape[-1])
            grads[f"w_{x}"] = inputs.T @ merged.reshape(-1, merged.shape[-1])
            if f"b_{x}" in params:
                grads[f"b_{x}"] = np.sum(merged.reshape(-1, merged.shape[-1]), axis=0)
            grads[name] = backward.sum_to(merged @ params[f"w_{x}"].T, given.shape)
        return grads

    def _layer_norm_vjp(
        self, x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, *, d_out: np.ndarray
    ) -> dict[str, np.ndarray]:
        self._float_dtype(x=x, gain=gain, bias=bias, d_out=d_out)
        return backward.layer_norm_vjp(x, gain, eps, d_out)

    def _feed_forward_vjp(
        self, x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, *, d_out: np.ndarray
    ) -> dict[str, np.ndarray]:
        self._float_dtype(x=x, w1=w1, b1=b1, w2=w2, b2=b2, d_out=d_out)
        return backward.feed_forward_vjp(x, w1, b1, w2, d_out)

    def _smoothed_cross_entropy_vjp(
        self, logits: np.ndarray, targets: np.ndarray, eps: float, *, d_out: np.ndarray
    ) -> dict[str, np.ndarray]:
        dt = self._float_dtype(logits=logits, d_out=d_out)
        q = self._smoothed_targets(targets, logits.shape[-1], eps, dt)
        return backward.cross_entropy_vjp(logits, q, d_out)

    # ----------------------------------------------------------------------------------------
    # §3.1 the encoder-decoder stacks

    def encoder_layer(
        self, x: np.ndarray, params: Mapping[str, Any], num_heads: int, mask: np.ndarray | None = None
    ) -> np.ndarray:
        """LayerNorm(z + FFN(z)), z = LayerNorm(x + MultiHead(x, x, x)) (§3.1, post-norm)."""
        return self._encoder(x, params, num_heads, mask, _evaluation)

    def encoder_layer_training(
        self, x: np.ndarray, params: Mapping[str, Any], num_heads: int, p: float, seed: int, mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encoder_layer` with §5.4's dropout on each sub-layer's output before its residual sum; returns the
        output and the masks drawn (the self-attention's, the feed-forward's)."""
        drop = _Dropouts(self, p, seed)
        return (self._encoder(x, params, num_heads, mask, drop), *drop.masks)

    def _encoder(self, x: np.ndarray, params: Mapping[str, Any], num_heads: int, mask: Any, drop: Any) -> np.ndarray:
        z = self._residual_norm(
            x, drop(self.multi_head_attention(x, x, x, params["self_attn"], num_heads, mask)), params["norm1"]
        )
        return self._residual_norm(z, drop(self.feed_forward(z, **params["ffn"])), params["norm2"])

    def decoder_layer(
        self,
        y: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Masked self-attention, encoder-decoder attention, FFN, each post-norm (§3.1).

        ``self_mask`` None means causal (query i sees keys j <= i, §3.2.3).
        """
        return self._decoder(y, memory, params, num_heads, self_mask, memory_mask, _evaluation)

    def decoder_layer_training(
        self,
        y: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`decoder_layer` with §5.4's dropout on each sub-layer's output before its residual sum; returns the
        output and the three masks drawn, in the order the sub-layers run."""
        drop = _Dropouts(self, p, seed)
        return (self._decoder(y, memory, params, num_heads, self_mask, memory_mask, drop), *drop.masks)

    def _decoder(
        self,
        y: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: np.ndarray | None,
        memory_mask: np.ndarray | None,
        drop: Any,
    ) -> np.ndarray:
        if self_mask is None:
            n = y.shape[-2]
            self_mask = np.tri(n, n, dtype=bool)  # (n_tgt, n_tgt)
        a = self._residual_norm(
            y, drop(self.multi_head_attention(y, y, y, params["self_attn"], num_heads, self_mask)), params["norm1"]
        )
        b = self._residual_norm(
            a,
            drop(self.multi_head_attention(a, memory, memory, params["cross_attn"], num_heads, memory_mask)),
            params["norm2"],
        )
        return self._residual_norm(b, drop(self.feed_forward(b, **params["ffn"])), params["norm3"])

    def transformer_forward(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: np.ndarray | None = None,
        tgt_lengths: np.ndarray | None = None,
    ) -> np.ndarray:
        """Token ids to pre-softmax logits (Figure 1): embed, N encoder layers, N decoder layers, E^T.

        Embedding E[tokens] * sqrt(d_model) + PE (§3.4, §3.5), one E shared with the output
        projection (§3.4); ``params["positional"]`` (max_len, d_model), if present, is a learned
        position table used instead of the sinusoids (Table 3 row E). Masks from lengths (padding
        keys hidden; decoder self-attention also causal).
        """
        _, ys, _, _ = self._stacks(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths)
        return ys[-1] @ params["embedding"].T  # (B, n_tgt, V)

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
    ) -> dict[str, np.ndarray]:
        """:meth:`transformer_forward` with §5.4's dropout on the embeddings' sums and on each sub-layer's output: the
        logits and the masks drawn, by place."""
        drop = _Dropouts(self, p, seed)
        _, ys, _, _ = self._stacks(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths, drop)
        places = dropout_places(len(params["encoder"]), len(params["decoder"]))
        return {"logits": ys[-1] @ params["embedding"].T, **dict(zip(places, drop.masks, strict=True))}

    def _stacks(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: np.ndarray | None,
        tgt_lengths: np.ndarray | None,
        drop: Any = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None, np.ndarray]:
        """Figure 1 up to the logits: each encoder layer's input then the memory (B, n_src, d_model), each decoder
        layer's input then the decoder's output (B, n_tgt, d_model), and the masks (source padding; target causal
        and padding). ``drop``: §5.4's dropout (training mode), drawn in the order applied; None: evaluation."""
        embedding, positional = params["embedding"], params.get("positional")  # (V, d_model), (max_len, d_model)
        arrays = {"params['embedding']": embedding} | (
            {} if positional is None else {"params['positional']": positional}
        )
        dt = self._float_dtype(**arrays)
        src_tokens, tgt_tokens = _token_array("src_tokens", src_tokens), _token_array("tgt_tokens", tgt_tokens)
        if src_tokens.shape[0] != tgt_tokens.shape[0]:
            raise ValueError(
                f"tgt_tokens: batch size {tgt_tokens.shape[0]} differs from src_tokens' {src_tokens.shape[0]}"
            )
        n_src, n_tgt = src_tokens.shape[1], tgt_tokens.shape[1]
        src_mask = None if src_lengths is None else _padding_mask(src_lengths, n_src, "src_lengths")  # (B, 1, n_src)
        causal = np.tri(n_tgt, n_tgt, dtype=bool)  # (n_tgt, n_tgt)
        tgt_mask = (
            causal if tgt_lengths is None else causal & _padding_mask(tgt_lengths, n_tgt, "tgt_lengths")
        )  # (B, n_tgt, n_tgt)
        if drop is None:
            xs = [self._embed(src_tokens, embedding, positional, dt)]
            for layer in params["encoder"]:
                xs.append(self.encoder_layer(xs[-1], layer, num_heads, src_mask))
            ys = [self._embed(tgt_tokens, embedding, positional, dt)]
            for layer in params["decoder"]:
                ys.append(self.decoder_layer(ys[-1], xs[-1], layer, num_heads, tgt_mask, src_mask))
            return xs, ys, src_mask, tgt_mask
        xs = [drop(self._embed(src_tokens, embedding, positional, dt))]
        for layer in params["encoder"]:
            xs.append(self._encoder(xs[-1], layer, num_heads, src_mask, drop))
        ys = [drop(self._embed(tgt_tokens, embedding, positional, dt))]
        for layer in params["decoder"]:
            ys.append(self._decoder(ys[-1], xs[-1], layer, num_heads, tgt_mask, src_mask, drop))
        return xs, ys, src_mask, tgt_mask

    def _embed(
        self, tokens: np.ndarray, embedding: np.ndarray, positional: np.ndarray | None, dt: np.dtype, start: int = 0
    ) -> np.ndarray:
        """E[tokens] * sqrt(d_model) + PE (§3.4, §3.5) at positions ``start`` .. ``start`` + n - 1 (a decode step after
        ``start`` cached positions). tokens (B, n) -> (B, n, d_model).

        ``positional`` (max_len, d_model) replaces the sinusoids when given (learned positions).
        """
        vocab, d_model = embedding.shape
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(f"tokens: expected ids in [0, {vocab}), got values in [{tokens.min()}, {tokens.max()}]")
        end = start + tokens.shape[1]
        x = embedding[tokens]  # (B, n, d_model), a copy
        x *= math.sqrt(d_model)
        if positional is None:
            x += self.positional_encoding(end, d_model, dt.name)[start:]  # (n, d_model), §3.5 sinusoids
        elif positional.ndim != 2 or positional.shape[0] < end or positional.shape[1] != d_model:
            raise ValueError(f"params['positional']: expected (max_len >= {end}, {d_model}), got {positional.shape}")
        else:
            x += positional[start:end]  # learned positions (Table 3 row E)
        return x

    # ----------------------------------------------------------------------------------------
    # §3.2.3 and §6.1: the decoder one step at a time with cached keys and values, and beam search

    def encode(
        self, src_tokens: np.ndarray, params: Mapping[str, Any], num_heads: int, src_lengths: np.ndarray | None = None
    ) -> np.ndarray:
        """The encoder stack on the embedded source (§3.1): the memory (B, n_src, d_model) the decoder attends to."""
        embedding, positional = params["embedding"], params.get("positional")
        dt = self._float_dtype(embedding=embedding)
        src_tokens = _token_array("src_tokens", src_tokens)
        n_src = src_tokens.shape[1]
        src_mask = None if src_lengths is None else _padding_mask(src_lengths, n_src, "src_lengths")  # (B, 1, n_src)
        x = self._embed(src_tokens, embedding, positional, dt)
        for layer in params["encoder"]:
            x = self.encoder_layer(x, layer, num_heads, src_mask)
        return x

    def decode_step(
        self,
        tokens: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        cache: Mapping[str, Any] | None = None,
        src_lengths: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """The next k target tokens through the decoder after the c positions held in ``cache``: (logits (B, k, V) at
        positions c .. c + k - 1, the cache of c + k positions).

        Each layer caches its self-attention keys and values, projected (x W^K + b^K split into heads), so a step
        projects only its new tokens; its queries (absolute positions c + i) see keys j <= c + i: the causal mask
        aligned at the end (bottom right). The encoder-decoder attention reads ``memory`` (with the source padding
        mask of ``src_lengths``) at every step. The cache given is not modified: a new one is returned.
        """
        embedding, positional = params["embedding"], params.get("positional")
        dt = self._float_dtype(embedding=embedding, memory=memory)
        tokens = _token_array("tokens", tokens)
        h = _positive_int("num_heads", num_heads)
        past = cache or {"length": 0, "self": [None] * len(params["decoder"])}
        if len(past["self"]) != len(params["decoder"]):
            raise ValueError(f"cache: holds {len(past['self'])} layers, params['decoder'] has {len(params['decoder'])}")
        c, k = past["length"], tokens.shape[1]
        n_src = memory.shape[-2]
        memory_mask = None if src_lengths is None else _padding_mask(src_lengths, n_src, "src_lengths")
        causal = self._step_mask(k, c)  # (k, c + k)
        y = self._embed(tokens, embedding, positional, dt, start=c)  # (B, k, d_model)
        layers = []
        for layer, held in zip(params["decoder"], past["self"]):
            p = layer["self_attn"]
            k_new = _split_heads(_affine(y, p["w_k"], p.get("b_k")), h, "w_k")  # (B, h, k, d_k)
            v_new = _split_heads(_affine(y, p["w_v"], p.get("b_v")), h, "w_v")  # (B, h, k, d_v)
            keys = k_new if held is None else self._join(held[0], k_new)  # (B, h, c + k, d_k)
            values = v_new if held is None else self._join(held[1], v_new)  # (B, h, c + k, d_v)
            k_kept, v_kept = self._cached(k_new, v_new, p, h)
            layers.append(
                (k_kept, v_kept) if held is None else (self._join(held[0], k_kept), self._join(held[1], v_kept))
            )
            q = _split_heads(_affine(y, p["w_q"], p.get("b_q")), h, "w_q")  # (B, h, k, d_k)
            heads = self.scaled_dot_product_attention(q, keys, values, causal)  # (B, h, k, d_v)
            a = self._residual_norm(y, _affine(_merge_heads(heads), p["w_o"], p.get("b_o")), layer["norm1"])
            cross = self.multi_head_attention(a, memory, memory, layer["cross_attn"], h, memory_mask)
            b = self._residual_norm(a, cross, layer["norm2"])
            y = self._residual_norm(b, self.feed_forward(b, **layer["ffn"]), layer["norm3"])
        return y @ embedding.T, {"length": c + k, "self": layers}  # (B, k, V)

    def _join(self, held: np.ndarray, new: np.ndarray) -> np.ndarray:
        """The cached positions then the new ones: (B, h, c, d), (B, h, k, d) -> (B, h, c + k, d)."""
        return np.concatenate((held, new), axis=-2)

    def _step_mask(self, k: int, c: int) -> np.ndarray:
        """The self-attention mask of k new queries after c cached positions: query i (position c + i) sees keys
        j <= c + i, the causal mask aligned at the bottom right. (k, c + k) bool."""
        return np.tri(k, c + k, c, dtype=bool)

    def _cached(
        self, keys: np.ndarray, values: np.ndarray, p: Mapping[str, np.ndarray], h: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """What a layer keeps of a step's new positions for later steps: their projected keys and values (B, h, k, d),
        as this step's attention used them."""
        return keys, values

    def reorder_cache(self, cache: Mapping[str, Any], index: np.ndarray) -> dict[str, Any]:
        """The cache of batch rows ``index`` (B',) int64, in that order, rows may repeat (beam search's reordering)."""
        index = np.asarray(index)
        if index.dtype.kind not in "iu" or index.ndim != 1:
            raise ValueError(f"index: expected a 1-D integer array, got dtype {index.dtype} shape {index.shape}")
        return {"length": cache["length"], "self": [(k[index], v[index]) for k, v in cache["self"]]}

    def beam_search(
        self,
        src_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        beam: int,
        alpha: float,
        max_lengths: np.ndarray,
        bos: int,
        eos: int,
        src_lengths: np.ndarray | None = None,
    ) -> list[tuple[list[int], float]]:
        """§6.1's beam search with GNMT's length penalty over the cached decoder, per sentence: (tokens, score).

        ``max_lengths`` (B,) int64: the most tokens each sentence may generate (§6.1: input length + 50). Policies
        ``policies["beam_search"]`` (``implementations/decoding.py``, ``BEAM_POLICY_CHOICES``): which candidates
        ending in EOS finish, the early stop, what happens at the maximum length, what |Y| counts. All sentences'
        beams run as one batch of B * beam rows; log-probabilities are accumulated in float64.
        """
        rule = beam_policies(self.policies)
        k = _positive_int("beam", beam)
        src_tokens = _token_array("src_tokens", src_tokens)
        b = src_tokens.shape[0]
        limits = [int(m) for m in np.asarray(max_lengths).reshape(-1)]
        if len(limits) != b or min(limits, default=1) < 1:
            raise ValueError(f"max_lengths: expected {b} positive ints, got {max_lengths!r}")
        limits = self._limits(limits)
        extra = 1 if rule["length_counts"] == "bos_eos" else 0

        def lp(t: int) -> float:
            return self._length_penalty(t + extra, alpha)

        memory = self.encode(src_tokens, params, num_heads, src_lengths)
        rows = np.repeat(np.arange(b), k)  # row r of the beam batch belongs to sentence rows[r]
        memory = memory[rows]
        lengths = None if src_lengths is None else np.asarray(src_lengths)[rows]
        cache: dict[str, Any] | None = None
        alive_logp = np.full((b, k), -np.inf)
        alive_logp[:, 0] = 0.0  # one hypothesis to start from: the others are copies
        alive_seq = np.zeros((b, k, 0), dtype=np.int64)
        tokens = np.full((b * k, 1), bos, dtype=np.int64)
        finished: list[list[tuple[float, list[int], int]]] = [[] for _ in range(b)]  # (score, tokens, order)
        done = [False] * b
        for t in range(1, max(limits) + 1):
            logits, cache = self.decode_step(tokens, memory, params, num_heads, cache, lengths)
            z = logits[:, -1].astype(np.float64)  # (B * k, V)
            z = z - z.max(axis=-1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
            vocab = logp.shape[-1]
            logp = self._without_eos(logp, t, eos)
            cand = (alive_logp[..., None] + logp.reshape(b, k, vocab)).reshape(b, k * vocab)
            order = np.argsort(-cand, axis=-1, kind="stable")  # (b, k * V): best first, ties lower index
            top = np.take_along_axis(cand, order, -1)
            src_beam, tok = order // vocab, order % vocab
            ranked = 2 * k if rule["eos_rank"] == "2k" else k
            new_seq = np.zeros((b, k, t), dtype=np.int64)
            new_logp = np.full((b, k), -np.inf)  # a sentence already done keeps no alive hypothesis
            beams = np.zeros((b, k), dtype=np.int64)
            for i in range(b):
                if done[i]:
                    continue
                for j in range(ranked):
                    if tok[i, j] == eos and np.isfinite(top[i, j]):
                        seq = [*alive_seq[i, src_beam[i, j]].tolist(), eos]
                        finished[i].append((top[i, j] / lp(t), seq, len(finished[i])))
                keep = self._survivors(top[i], src_beam[i], tok[i], t, k, eos)
                for slot, j in enumerate(keep):
                    beams[i, slot] = src_beam[i, j]
                    new_logp[i, slot] = top[i, j]
                    new_seq[i, slot] = [*alive_seq[i, src_beam[i, j]].tolist(), tok[i, j]]
            alive_seq, alive_logp = new_seq, new_logp
            stopping: dict[int, bool] = {}  # sentence -> whether its early stop holds at this step
            for i in range(b):
                if done[i]:
                    continue
                if t >= limits[i]:
                    live = [
                        (alive_logp[i, j], alive_seq[i, j].tolist()) for j in range(k) if np.isfinite(alive_logp[i, j])
                    ]
                    if rule["at_max_length"] == "finished":
                        finished[i] += [(v / lp(t), seq, len(finished[i]) + n) for n, (v, seq) in enumerate(live)]
                    elif not finished[i]:  # "dropped", but nothing finished: the alive ones by their log-probability
                        finished[i] += [(v, seq, n) for n, (v, seq) in enumerate(live)]
                    done[i] = True
                else:
                    stopping[i] = self._stops(
                        rule["early_stop"],
                        [f[0] for f in finished[i]],
                        alive_logp[i, 0],
                        lp(self._bound_at(t, limits[i])),
                        k,
                    )
            for i in self._stopped(stopping):
                done[i] = True
            if all(done):
                break
            index = (np.arange(b)[:, None] * k + beams).reshape(-1)
            cache = self.reorder_cache(cache, index)
            tokens = alive_seq[:, :, -1].reshape(-1, 1)
        out = []
        for i in range(b):
            score, seq, _ = max(finished[i], key=lambda f: (f[0], -f[2]))
            out.append((seq, float(score)))
        return out

    # the composites' backward: the chain rule through the sub-layers' own hand-written backward, from the output
    # back (a post-norm sub-layer: LayerNorm's VJP, then the residual's two paths; self-attention's one input gets
    # its three uses' gradients; the tied embedding its projection's and both lookups')

    def _post_norm_vjp(
        self, r: np.ndarray, norm: Mapping[str, np.ndarray], d: np.ndarray, grads: dict, name: str
    ) -> np.ndarray:
        """LayerNorm(r)'s backward: its gain and bias gradients into ``grads``; returns dr."""
        g = NumpyImplementation._layer_norm_vjp(
            self, r, norm["gain"], norm["bias"], float(self.policies["layer_norm_eps"]), d_out=d
        )
        grads[f"{name}.gain"], grads[f"{name}.bias"] = g["gain"], g["bias"]
        return g["x"]

    def _ffn_vjp(self, x: np.ndarray, ffn: Mapping[str, np.ndarray], d: np.ndarray, grads: dict) -> np.ndarray:
        g = NumpyImplementation._feed_forward_vjp(self, x, **ffn, d_out=d)
        grads.update((f"ffn.{k}", g[k]) for k in ("w1", "b1", "w2", "b2"))
        return g["x"]

    def _attention_vjp(self, name: str, q, k, v, params, num_heads, mask, d, grads: dict) -> dict[str, np.ndarray]:
        g = NumpyImplementation._multi_head_attention_vjp(self, q, k, v, params, num_heads, mask, d_out=d)
        grads.update((f"{name}.{key}", value) for key, value in g.items() if key not in ("query", "key", "value"))
        return g

    def _encoder_layer_vjp(
        self, x: np.ndarray, params: Mapping[str, Any], num_heads: int, mask: np.ndarray | None = None, *, d_out
    ) -> dict[str, np.ndarray]:
        r1 = self.multi_head_attention(x, x, x, params["self_attn"], num_heads, mask) + x
        z = self.layer_norm(
            r1, params["norm1"]["gain"], params["norm1"]["bias"], float(self.policies["layer_norm_eps"])
        )
        r2 = self.feed_forward(z, **params["ffn"]) + z
        grads: dict[str, np.ndarray] = {}
        d_r2 = self._post_norm_vjp(r2, params["norm2"], d_out, grads, "norm2")
        d_r1 = self._post_norm_vjp(
            r1, params["norm1"], d_r2 + self._ffn_vjp(z, params["ffn"], d_r2, grads), grads, "norm1"
        )
        g = self._attention_vjp("self_attn", x, x, x, params["self_attn"], num_heads, mask, d_r1, grads)
        grads["x"] = d_r1 + g["query"] + g["key"] + g["value"]
        return grads

    def _decoder_layer_vjp(
        self,
        y: np.ndarray,
        memory: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        *,
        d_out: np.ndarray,
    ) -> dict[str, np.ndarray]:
        if self_mask is None:
            self_mask = np.tri(y.shape[-2], y.shape[-2], dtype=bool)
        r1 = self.multi_head_attention(y, y, y, params["self_attn"], num_heads, self_mask) + y
        a = self.layer_norm(
            r1, params["norm1"]["gain"], params["norm1"]["bias"], float(self.policies["layer_norm_eps"])
        )
        r2 = self.multi_head_attention(a, memory, memory, params["cross_attn"], num_heads, memory_mask) + a
        b = self.layer_norm(
            r2, params["norm2"]["gain"], params["norm2"]["bias"], float(self.policies["layer_norm_eps"])
        )
        r3 = self.feed_forward(b, **params["ffn"]) + b
        grads: dict[str, np.ndarray] = {}
        d_r3 = self._post_norm_vjp(r3, params["norm3"], d_out, grads, "norm3")
        d_r2 = self._post_norm_vjp(
            r2, params["norm2"], d_r3 + self._ffn_vjp(b, params["ffn"], d_r3, grads), grads, "norm2"
        )
        gc = self._attention_vjp(
            "cross_attn", a, memory, memory, params["cross_attn"], num_heads, memory_mask, d_r2, grads
        )
        d_r1 = self._post_norm_vjp(r1, params["norm1"], d_r2 + gc["query"], grads, "norm1")
        ga = self._attention_vjp("self_attn", y, y, y, params["self_attn"], num_heads, self_mask, d_r1, grads)
        grads["y"] = d_r1 + ga["query"] + ga["key"] + ga["value"]
        grads["memory"] = gc["key"] + gc["value"]
        return grads

    def _tied_embedding_vjp(
        self, d_projection: np.ndarray, lookups: tuple[tuple[np.ndarray, np.ndarray], ...]
    ) -> np.ndarray:
        """E's gradient (§3.4: one matrix, three uses): the output projection's share plus, for each lookup,
        sqrt(d_model) times its cotangents added to the rows of its ids."""
        root = d_projection.dtype.type(math.sqrt(d_projection.shape[1]))
        for tokens, d in lookups:
            np.add.at(d_projection, tokens.reshape(-1), d.reshape(-1, d.shape[-1]) * root)
        return d_projection

    def _transformer_forward_vjp(
        self,
        src_tokens: np.ndarray,
        tgt_tokens: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: np.ndarray | None = None,
        tgt_lengths: np.ndarray | None = None,
        *,
        d_out: np.ndarray,
    ) -> dict[str, np.ndarray]:
        embedding, positional = params["embedding"], params.get("positional")
        self._float_dtype(embedding=embedding, d_out=d_out)
        xs, ys, src_mask, tgt_mask = self._stacks(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths)
        n_src, n_tgt = xs[0].shape[1], ys[0].shape[1]
        vocab, d_model = embedding.shape
        grads: dict[str, np.ndarray] = {}
        d_embedding = d_out.reshape(-1, vocab).T @ ys[-1].reshape(-1, d_model)  # logits = y E^T
        d_y, d_memory = d_out @ embedding, np.zeros_like(xs[-1])
        for i in reversed(range(len(params["decoder"]))):
            g = self._decoder_layer_vjp(ys[i], xs[-1], params["decoder"][i], num_heads, tgt_mask, src_mask, d_out=d_y)
            d_y, d_memory = g.pop("y"), d_memory + g.pop("memory")
            grads.update((f"decoder.{i}.{k}", v) for k, v in g.items())
        d_x = d_memory
        for i in reversed(range(len(params["encoder"]))):
            g = self._encoder_layer_vjp(xs[i], params["encoder"][i], num_heads, src_mask, d_out=d_x)
            d_x = g.pop("x")
            grads.update((f"encoder.{i}.{k}", v) for k, v in g.items())
        grads["embedding"] = self._tied_embedding_vjp(d_embedding, ((src_tokens, d_x), (tgt_tokens, d_y)))
        if positional is not None:
            d_positional = np.zeros_like(positional)
            d_positional[:n_src] += d_x.sum(axis=0)
            d_positional[:n_tgt] += d_y.sum(axis=0)
            grads["positional"] = d_positional
        return grads

    def _residual_norm(self, x: np.ndarray, sublayer_out: np.ndarray, norm: Mapping[str, np.ndarray]) -> np.ndarray:
        """LayerNorm(x + Sublayer(x)) (§3.1) with eps = policies["layer_norm_eps"]."""
        sublayer_out += x  # sublayer_out is a fresh array of ours
        return self.layer_norm(sublayer_out, norm["gain"], norm["bias"], float(self.policies["layer_norm_eps"]))

    # ----------------------------------------------------------------------------------------
    # argument checks

    def _length_penalty(self, length: int, alpha: float) -> float:
        """lp(Y) = ((5 + |Y|) / 6)^alpha, GNMT's (Wu et al. 2016), the penalty §6.1 cites [38]."""
        return ((5.0 + length) / 6.0) ** alpha

    def _limits(self, limits: list[int]) -> list[int]:
        """The number of tokens each sentence may generate: its own maximum length (§6.1: input length + 50)."""
        return limits

    def _without_eos(self, logp: np.ndarray, t: int, eos: int) -> np.ndarray:
        """Step ``t``'s log-probabilities (B * k, V) as the search ranks them: all of them (§6.1 sets no minimum
        length)."""
        return logp

    def _survivors(self, top: np.ndarray, parents: np.ndarray, tokens: np.ndarray, t: int, k: int, eos: int) -> list:
        """Which of a sentence's candidates, ranked best first (values ``top``, from beam ``parents``, extended by
        ``tokens``; each (k * V,)), stay alive at step ``t``: the best k that do not end in EOS (a finished
        hypothesis leaves the beam)."""
        return [j for j in range(len(tokens)) if tokens[j] != eos][:k]

    def _bound_at(self, t: int, limit: int) -> int:
        """The length whose penalty bounds what an alive hypothesis may still score: the maximum length (lp only grows
        and log P only falls)."""
        return limit

    def _stops(self, rule: str, scores: list[float], best_alive: float, lp_max: float, k: int) -> bool:
        """Whether a sentence's search ends early (``policies["beam_search"]["early_stop"]``): "full" once k
        hypotheses finished; "bound" once the k-th best finished score beats the best alive log-probability over
        lp(maximum length), which no alive hypothesis can exceed; "none" never."""
        if rule == "full":
            return len(scores) >= k
        if rule == "bound" and scores:
            return sorted(scores, reverse=True)[:k][-1] > best_alive / lp_max
        return False

    def _stopped(self, stopping: Mapping[int, bool]) -> list[int]:
        """The sentences whose search ends early at this step: each whose own rule holds (a sentence's search never
        depends on the others of its batch)."""
        return [i for i, stop in stopping.items() if stop]

    def _float_dtype(self, **arrays: Any) -> np.dtype:
        """Return the one float dtype shared by ``arrays`` (one of ``dtypes``), or raise naming the culprit."""
        first_name, first = next(iter(arrays.items()))
        for name, arr in arrays.items():
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{name}: expected a numpy.ndarray made by from_numpy, got {type(arr).__name__}")
            if arr.dtype.name not in self.dtypes:
                raise TypeError(f"{name}: expected dtype in {self.dtypes}, got {arr.dtype}")
            if arr.dtype != first.dtype:
                raise TypeError(
                    f"{name}: dtype {arr.dtype} differs from {first_name}'s {first.dtype}; use one dtype per call"
                )
        return first.dtype


def _last_steps(checkpoints: Mapping[int, Any], n: int) -> list[int]:
    """The ``n`` largest steps of ``checkpoints`` (§6.1's last checkpoints), or ValueError naming the argument."""
    if not isinstance(checkpoints, Mapping) or not checkpoints:
        raise ValueError(f"checkpoints: expected a non-empty mapping of step -> parameters, got {checkpoints!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= len(checkpoints):
        raise ValueError(f"n: expected an int in [1, {len(checkpoints)}], got {n!r}")
    return sorted(checkpoints)[-int(n) :]


def blocked_numpy_implementation() -> NumpyImplementation:
    """The NumPy implementation with attention always on the blocked (online-softmax) path, its tiles written into
    the caller's ``out`` where one is given (declared: ``policies["writes_out"]``)."""
    impl = NumpyImplementation(attention="blocked", policies={"writes_out": ("scaled_dot_product_attention",)})
    impl.name = "numpy-blocked"
    return impl


# --------------------------------------------------------------------------------------------
# attention kernels


#: The blocked path's backward cuts the keys into at most this many tiles, of at least 2 keys and at most
#: ``block_size``: the suite's short sequences (up to 5 keys) span several tiles and a tail, so that merging the
#: tiles' statistics into the log-sum-exp is what gets checked; long ones span a few wide tiles.
_BACKWARD_TILES = 8

#: Query rows per tile of the blocked path (at most ``block_size``): a float32 256 x 512 score tile is 512 KiB, the
#: size of these machines' L2, and half as many tiles as 128 rows halves the calls per tile (one thread, float32,
#: B = 1, h = 8, d = 64: 3-5% faster than 128 rows at n = 2048 full and causal and at n = 8192).
QUERY_TILE_ROWS = 256


def _attention_tiled(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    block_q: int,
    block_k: int,
    fill: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. (1) over (block_q x block_k) tiles of the score matrix, one (batch, head) slice at a time.

    With block_q >= n_q and block_k >= n_k this is the direct computation (one tile per slice);
    otherwise query tiles have at most min(block_q, :data:`QUERY_TILE_ROWS`) rows. ``fill`` (NaN
    or 0) is written to rows with no visible key. Key tiles a mask hides entirely are skipped. ``out``: the
    (..., n_q, d_v) array to write into (a new one if None).
    The softmax is unshifted when :func:`_unshifted_is_safe` proves exp(score) cannot overflow or
    leave the normal range (then no row maximum and no rescaling are needed); otherwise it is the
    max-shifted online softmax (:func:`_attend_query_tile`).
    """
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])  # batch of the scores
    visible = None if mask is None else _broadcast_mask(mask, batch + (n_q, n_k))  # a view: no n_q x n_k copy
    out_batch = np.broadcast_shapes(batch, v.shape[:-2])
    if out is None:
        out = np.empty(out_batch + (n_q, d_v), dtype=q.dtype)  # (..., n_q, d_v)
    elif not isinstance(out, np.ndarray) or out.shape != out_batch + (n_q, d_v) or out.dtype != q.dtype:
        shown = f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}"
        raise ValueError(f"out: expected a {q.dtype} array of shape {out_batch + (n_q, d_v)}, got {shown}")
    if n_k == 0:  # no key at all: every row is fully masked
        out[...] = fill
        return out
    if n_q == 0:
        return out
    q = q * (1.0 / math.sqrt(d_k))  # (..., n_q, d_k), scaled once; a Python float keeps q's dtype
    unshifted = _unshifted_is_safe(q, k, v)
    b_q = n_q if block_q >= n_q else min(block_q, QUERY_TILE_ROWS)
    b_k = min(block_k, n_k)
    if visible is not None:
        visible = np.broadcast_to(visible, out_batch + (n_q, n_k))  # still a view
    tiles: dict[tuple[Any, ...], dict[tuple[int, int], int]] = {}  # tile states per distinct mask slice
    if out_batch and n_q * n_k >= backward.PER_SLICE_MIN:  # one (batch, head) slice at a time
        qb, kb, vb = (np.broadcast_to(a, out_batch + a.shape[-2:]) for a in (q, k, v))  # views
        for idx in np.ndindex(*out_batch):
            vis = None if visible is None else visible[idx]
            _attend_slice(qb[idx], kb[idx], vb[idx], vis, b_q, b_k, fill, out[idx], unshifted, tiles)
    else:
        _attend_slice(q, k, v, visible, b_q, b_k, fill, out, unshifted, tiles)
    return out


def _unshifted_is_safe(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """True when exp of every (scaled) score may be taken without subtracting the row maximum.

    Cauchy-Schwarz: |s_ij| <= |q_i| |k_j| <= b. If b (with margin) keeps every visible weight
    exp(s) in [e^-b, e^b] inside the normal range, the sums (<= n_k e^b max|v|) below the largest
    finite number, and every product exp(s) v (v != 0) above the smallest normal number, then
    exp(s) carries the same relative error as exp(s - max s) (no subtraction; no underflow or
    overflow anywhere) and the softmax ratio is unchanged. A row sum is then 0 exactly when the row
    has no visible key. NaN or infinite inputs fail the test (the shifted path handles them).
    """
    info = np.finfo(q.dtype)
    log_max, log_tiny = math.log(float(info.max)), math.log(float(info.tiny))
    n_k = v.shape[-2]
    if not (q.size and k.size and v.size):
        return False
    q_norm = math.sqrt(float(np.max(np.einsum("...i,...i->...", q, q))))
    k_norm = math.sqrt(float(np.max(np.einsum("...i,...i->...", k, k))))
    bound = q_norm * k_norm * 1.01 + 1.0  # margin for the rounding of the norms and scores
    mag = np.abs(v)
    v_max, v_min = float(np.max(mag)), float(np.min(mag))
    if not (bound + math.log(n_k) + math.log(max(v_max, 1.0)) <= log_max - 2.0 and bound <= -log_tiny - 2.0):
        return False  # also False for NaN
    floor = math.exp(log_tiny + 2.0 + bound)  # smallest |v| whose products exp(s) v stay normal
    return v_min >= floor or not np.any((mag < floor) & (mag > 0))


def _tile_states(
    vis: np.ndarray, b_q: int, b_k: int, cache: dict[tuple[Any, ...], dict[tuple[int, int], int]]
) -> dict[tuple[int, int], int]:
    """Per (query start, key start) tile: 0 hidden entirely, 1 visible entirely, 2 mixed.

    Cached per mask slice (its address, strides and shape): a mask broadcast over heads is
    classified once, not once per head.
    """
    key = (vis.__array_interface__["data"][0], vis.strides, vis.shape)
    states = cache.get(key)
    if states is None:
        n_q, n_k = vis.shape[-2:]
        states = {}
        for qs in range(0, n_q, b_q):
            for ks in range(0, n_k, b_k):
                block = vis[..., qs : qs + b_q, ks : ks + b_k]
                states[qs, ks] = 1 if block.all() else (2 if block.any() else 0)
        cache[key] = states
    return states


def _attend_slice(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    vis: np.ndarray | None,
    b_q: int,
    b_k: int,
    fill: float,
    out: np.ndarray,
    unshifted: bool,
    cache: dict[tuple[Any, ...], dict[tuple[int, int], int]],
) -> None:
    """Write Eq. (1) of one slice (or of a whole broadcast batch) into ``out`` (..., n_q, d_v)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    k_t = np.ascontiguousarray(np.swapaxes(k, -1, -2))  # (..., d_k, n_k): a GEMM operand read in order
    states = None if vis is None else _tile_states(vis, b_q, b_k, cache)
    if not unshifted:
        for qs in range(0, n_q, b_q):
            rows = slice(qs, qs + b_q)
            live = range(0, n_k, b_k) if states is None else [ks for ks in range(0, n_k, b_k) if states[qs, ks]]
            out[..., rows, :] = _attend_query_tile(q[..., rows, :], k_t, v, vis, rows, live, b_k, fill)
        return
    _attend_unshifted(q, k_t, v, vis, b_q, b_k, fill, out, states)


def _attend_unshifted(
    q: np.ndarray,
    k_t: np.ndarray,
    v: np.ndarray,
    vis: np.ndarray | None,
    b_q: int,
    b_k: int,
    fill: float,
    out: np.ndarray,
    states: dict[tuple[int, int], int] | None,
) -> None:
    """P V with P = exp(S) unnormalised (safe by :func:`_unshifted_is_safe`), row sums from the same product.

    V gets a column of ones, so [P V | P 1] comes out of one matrix product: no separate pass for
    the row sums, and key tiles just add up (no maximum, no rescaling). Score and product tiles are
    preallocated once and reused (contiguous, so exp runs on a contiguous buffer).
    """
    n_q, n_k = q.shape[-2], k_t.shape[-1]
    d_v = v.shape[-1]
    lead = np.broadcast_shapes(q.shape[:-2], k_t.shape[:-2], v.shape[:-2])
    v1 = np.empty(lead + (n_k, d_v + 1), dtype=v.dtype)  # [V | 1], O(n_k d_v)
    v1[..., :d_v] = v
    v1[..., d_v] = 1.0
    width = d_v + 1
    score_buf = np.empty(lead + (b_q * b_k,), dtype=q.dtype)
    acc_buf, part_buf = (np.empty(lead + (b_q * width,), dtype=q.dtype) for _ in range(2))
    for qs in range(0, n_q, b_q):
        rows = min(b_q, n_q - qs)
        q_tile = q[..., qs : qs + rows, :]
        acc = acc_buf[..., : rows * width].reshape(lead + (rows, width))  # [P V | P 1] so far
        started = False
        for ks in range(0, n_k, b_k):
            cols = min(b_k, n_k - ks)
            state = 1 if states is None else states[qs, ks]
            if state == 0:  # hidden entirely: contributes nothing
                continue
            s = score_buf[..., : rows * cols].reshape(lead + (rows, cols))  # contiguous
            np.matmul(q_tile, k_t[..., :, ks : ks + cols], out=s)  # scores
            np.exp(s, out=s)  # unnormalised weights
            if state == 2:
                np.copyto(s, 0.0, where=~vis[..., qs : qs + rows, ks : ks + cols])  # masked: weight 0 (§3.2.3)
            target = part_buf[..., : rows * width].reshape(lead + (rows, width)) if started else acc
            np.matmul(s, v1[..., ks : ks + cols, :], out=target)
            if started:
                acc += target
            started = True
        dst = out[..., qs : qs + rows, :]
        if not started:
            dst[...] = fill
            continue
        row_sum = acc[..., d_v:]  # (..., rows, 1)
        dead = row_sum == 0  # no visible key (a visible weight is >= e^-b > 0)
        if dead.any():
            np.copyto(row_sum, 1.0, where=dead)
            np.divide(acc[..., :d_v], row_sum, out=dst)
            np.copyto(dst, fill, where=np.broadcast_to(dead, dst.shape))
        else:
            np.divide(acc[..., :d_v], row_sum, out=dst)


def _attend_query_tile(
    q: np.ndarray,
    k_t: np.ndarray,
    v: np.ndarray,
    visible: np.ndarray | None,
    rows: slice,
    live: Any,
    block_k: int,
    fill: float,
) -> np.ndarray:
    """Max-shifted online softmax of one query tile against the key tiles starting at ``live``.

    q (..., b_q, d_k) -> (..., b_q, d_v). When the maximum grows from m to m', the running sum and
    output are rescaled by exp(m - m').
    """
    row_max = row_sum = acc = None
    for ks in live:
        cols = slice(ks, ks + block_k)
        s = np.matmul(q, k_t[..., :, cols])  # (..., b_q, b_k) scores
        if visible is not None:
            np.copyto(s, -np.inf, where=np.logical_not(visible[..., rows, cols]))  # masked: -inf (§3.2.3)
        tile_max = np.max(s, axis=-1, keepdims=True)  # (..., b_q, 1)
        new_max = tile_max if row_max is None else np.maximum(row_max, tile_max)
        shift = np.where(new_max == -np.inf, 0.0, new_max).astype(s.dtype, copy=False)  # all-masked so far: shift 0
        s -= shift
        np.exp(s, out=s)  # probabilities up to the factor exp(shift) / l
        tile_sum = np.sum(s, axis=-1, keepdims=True)  # (..., b_q, 1)
        tile_out = np.matmul(s, v[..., cols, :])  # (..., b_q, d_v)
        if row_max is None:
            row_sum, acc = tile_sum, tile_out
        else:
            alpha = np.exp(row_max - shift)  # rescales the previous tiles to the new maximum
            row_sum *= alpha
            row_sum += tile_sum
            acc *= alpha
            acc += tile_out
        row_max = new_max
    n_rows = q.shape[-2]
    if acc is None:  # every key tile hidden
        shape = np.broadcast_shapes(q.shape[:-2], k_t.shape[:-2], v.shape[:-2]) + (n_rows, v.shape[-1])
        return np.full(shape, fill, dtype=q.dtype)
    dead = row_sum == 0  # no visible key in the whole row (a visible maximum contributes exp(0) = 1)
    acc /= np.where(dead, 1.0, row_sum).astype(acc.dtype, copy=False)
    np.copyto(acc, fill, where=dead)
    return acc


# --------------------------------------------------------------------------------------------
# small helpers


def _check_attention_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"q, k, v: expected at least 2 dimensions, got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: last axis (d_k) {k.shape[-1]} differs from q's {q.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"v: n_k {v.shape[-2]} (axis -2) differs from k's {k.shape[-2]}")
    if q.shape[-1] == 0:
        raise ValueError("q: d_k must be positive (the scale is 1/sqrt(d_k))")


def _broadcast_mask(mask: np.ndarray, score_shape: tuple[int, ...]) -> np.ndarray:
    """A read-only view of ``mask`` broadcast to the score shape (..., n_q, n_k), or raise naming it."""
    try:
        return np.broadcast_to(mask, score_shape)
    except ValueError:
        raise ValueError(
            f"mask: shape {mask.shape} does not broadcast to the score shape {score_shape} (..., n_q, n_k)"
        ) from None


def _as_mask(mask: Any) -> np.ndarray | None:
    if mask is None:
        return None
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(
            f"mask: expected a boolean numpy.ndarray (True = may attend), got {getattr(mask, 'dtype', type(mask))}"
        )
    return mask


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w (+ b), bias added in place. x (..., n, d_in), w (d_in, d_out) -> (..., n, d_out)."""
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"weight: expected {x.shape[-1]} rows to match the input width, got shape {w.shape}")
    y = np.matmul(x, w)
    if b is not None:
        y += b
    return y


def _split_heads(x: np.ndarray, h: int, weight: str) -> np.ndarray:
    """(..., n, h*d) -> (..., h, n, d): head i takes columns i*d:(i+1)*d."""
    if x.shape[-1] % h:
        raise ValueError(f"params[{weight!r}]: {x.shape[-1]} columns do not split into num_heads={h} equal heads")
    return np.swapaxes(x.reshape(x.shape[:-1] + (h, x.shape[-1] // h)), -2, -3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., h, n, d) -> (..., n, h*d), the Concat of §3.2.2."""
    x = np.swapaxes(x, -2, -3)  # (..., n, h, d)
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _token_array(name: str, tokens: Any) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
        raise ValueError(
            f"{name}: expected a 2-D integer array (batch, length), got dtype {tokens.dtype} shape {tokens.shape}"
        )
    return tokens


def _padding_mask(lengths: Any, n: int, name: str) -> np.ndarray:
    """(B,) lengths -> (B, 1, n) bool: key j visible iff j < lengths[b]."""
    lengths = np.asarray(lengths)
    if (
        lengths.dtype.kind not in "iu"
        or lengths.ndim != 1
        or (lengths.size and (lengths.min() < 0 or lengths.max() > n))
    ):
        raise ValueError(f"{name}: expected a 1-D integer array of lengths in [0, {n}], got {lengths!r}")
    return (np.arange(n) < lengths[:, None])[:, None, :]


def _evaluation(t: np.ndarray) -> np.ndarray:
    """No dropout (evaluation mode)."""
    return t


class _Dropouts:
    """§5.4's dropout of one layer's sub-layer outputs, the k-th drawn from the stream (seed, k); the masks kept in the
    order drawn."""

    def __init__(self, impl: NumpyImplementation, p: float, seed: int) -> None:
        self.impl, self.p, self.seed = impl, p, seed
        self.masks: list[np.ndarray] = []

    def __call__(self, t: np.ndarray) -> np.ndarray:
        y, keep = self.impl.dropout(t, self.p, [self.seed, len(self.masks)])
        self.masks.append(keep)
        return y


def adam_moments(grad: np.ndarray, m: np.ndarray, v: np.ndarray, betas: Any, dt: np.dtype) -> tuple[Any, Any]:
    """Adam's moments after one step in ``dt`` (Kingma & Ba, Algorithm 1): m_t = beta1 m + (1 - beta1) g and
    v_t = beta2 v + (1 - beta2) g^2, each beta rounded to ``dt``."""
    b1, b2 = dt.type(betas[0]), dt.type(betas[1])
    return b1 * m + (dt.type(1) - b1) * grad, b2 * v + (dt.type(1) - b2) * (grad * grad)
