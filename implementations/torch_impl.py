"""The paper's equations written with PyTorch tensor ops: the ``torch`` and ``torch-sdpa`` built-ins.

``torch`` (:class:`TorchImplementation`) spells out every equation of "Attention Is All You Need"
(§3.1-§3.5, §5.3, §5.4) with plain tensor operations (matmul, exp, sum, ...), on ``cuda`` when
PyTorch sees a GPU and on ``cpu`` otherwise. ``torch-sdpa`` (:class:`TorchSDPAImplementation`) is
the same except that Eq. (1), alone and inside multi-head attention, is
``torch.nn.functional.scaled_dot_product_attention`` — so checking it checks PyTorch's fused
attention kernels.

Precision (what "computed in float16" means here):
    - float64 and float32 compute in their own precision throughout.
    - float16 and bfloat16: the softmax, LayerNorm statistics, log-softmax and every other
      reduction but matrix products run in float32 and are rounded to the dtype at the end of the
      equation. Matrix products run in the dtype on CUDA (cuBLAS accumulates in float32 unless
      ``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`` lets split-K
      reductions round in half precision) and in float32 on the CPU (PyTorch's CPU half kernels
      do not promise a float32 accumulator). Each equation's result is rounded once to the dtype;
      composite equations (the layers, the whole model) round between sub-layers, as a
      low-precision model would.
    - Conversions from float64 to float16/bfloat16 are correctly rounded (round to nearest,
      ties to even), as the contract requires. PyTorch's own ``tensor.to(torch.float16)`` from
      float64 rounds twice (through float32) and can be off by one unit in the last place, so
      :func:`round_from_float64` goes through float32 with round-to-odd instead.

Declared policies (where the paper is silent; see ``aiayn.implementations.protocol.POLICY_CHOICES``):
    ``torch``: a fully masked query row gives NaN (the 0/0 of -inf masking), label smoothing over
    K classes, LayerNorm eps 1e-6 in the layers, lrate(0) = 0. ``torch-sdpa``: the same except
    fully masked rows give zeros — what ``scaled_dot_product_attention`` returns for them (its
    "safe softmax"; measured on the CPU with torch 2.13 and pinned by ``tests/test_torch_impl.py``;
    ``make check-cuda`` checks what the CUDA kernels do, with the same checks).

Not computed with ``reference/``: this module imports nothing from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aiayn.implementations.protocol import DEFAULT_POLICIES, ImplementationBase
from aiayn.reference.counts import DECODER_SUBLAYERS, ENCODER_SUBLAYERS

__all__ = ["TORCH_DTYPES", "TorchImplementation", "TorchSDPAImplementation", "default_device", "round_from_float64"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_LOW = (torch.float16, torch.bfloat16)
_MHA_WEIGHTS = ("w_q", "w_k", "w_v", "w_o")


def default_device() -> str:
    """``"cuda"`` when PyTorch sees a CUDA device, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cuda_numerics(device: str) -> str:
    """The GPU and the switches that change CUDA arithmetic, for the version string (and so every report).

    TF32 matmuls (10-bit significands in float32 products) would fail the float32 budgets, and are
    named so a failure can be traced to them; float16/bfloat16 reduced-precision reductions are
    within the budgets (they assume the dtype's own accumulation) and named all the same.
    """
    matmul = torch.backends.cuda.matmul
    return (
        f"{torch.cuda.get_device_name(torch.device(device))}; TF32 matmul {matmul.allow_tf32}; "
        f"fp16/bf16 reduced-precision reductions {matmul.allow_fp16_reduced_precision_reduction}/"
        f"{matmul.allow_bf16_reduced_precision_reduction}"
    )


def round_from_float64(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round a float64 tensor to ``dtype`` correctly (nearest, ties to even), on its own device.

    float64/float32 targets use PyTorch's cast (already correctly rounded). For float16 and
    bfloat16, PyTorch casts float64 through float32 and so rounds twice; instead we round to
    float32 *to odd* (truncate, then set the last bit if anything was lost) and let PyTorch round
    that to the target: with 24 >= p + 2 significand bits this double rounding is exact (Boldo &
    Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to
    odd", 2008), subnormals and overflow included.
    """
    if dtype in (torch.float64, torch.float32):
        return t.to(dtype)
    f = t.to(torch.float32)  # round to nearest
    back = f.to(torch.float64)
    inexact = (back != t) & torch.isfinite(t)
    away = inexact & (back.abs() > t.abs())  # rounded up in magnitude: step back toward zero
    f = torch.where(away, torch.nextafter(f, torch.zeros_like(f)), f)
    odd = (f.view(torch.int32) | inexact.to(torch.int32)).view(torch.float32)
    return odd.to(dtype)


def _positive_int(name: str, value: Any) -> int:
    """Validate a positive Python int argument, naming it in the error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _param(params: Mapping[str, Any], name: str, where: str) -> Any:
    """``params[name]`` with an error naming the missing entry and where it was expected."""
    try:
        return params[name]
    except (KeyError, TypeError):
        raise ValueError(f"{where}: expected a mapping with key {name!r}") from None


def _split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(..., n, h*d) -> (..., h, n, d); head i takes columns i*d:(i+1)*d (the canonical layout)."""
    *batch, n, width = x.shape
    return x.reshape(*batch, n, h, width // h).transpose(-2, -3)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(..., h, n, d) -> (..., n, h*d): Concat(head_1, ..., head_h) of §3.2.2."""
    *batch, h, n, d = x.shape
    return x.transpose(-2, -3).reshape(*batch, n, h * d)


class TorchImplementation(ImplementationBase):
    """Every equation of the paper in plain PyTorch tensor ops (registry name ``"torch"``).

    Device: ``"cuda"`` when available, else ``"cpu"`` (``device=`` overrides). Dtypes: float64
    (CPU only), float32, float16, bfloat16; see the module docstring for how each is computed.
    Policies: the oracle's defaults (fully masked rows NaN, label smoothing over K, eps 1e-6,
    lrate(0) = 0).
    """

    name = "torch"
    policies: Mapping[str, object] = DEFAULT_POLICIES

    def __init__(self, device: str | None = None) -> None:
        self.device = str(torch.device(device or default_device()))
        on_cpu = torch.device(self.device).type == "cpu"
        self.version = f"torch {torch.__version__}" + ("" if on_cpu else f" ({_cuda_numerics(self.device)})")
        self.dtypes = ("float64", "float32", "float16", "bfloat16") if on_cpu else ("float32", "float16", "bfloat16")

    # ---------------------------------------------------------------- arrays across the boundary

    def from_numpy(self, array: np.ndarray, dtype: str) -> torch.Tensor:
        """A new tensor on :attr:`device` holding ``array`` in ``dtype`` (floats correctly rounded)."""
        self.check_dtype(dtype, allow_index=True)
        arr = np.asarray(array)
        if dtype == "bool":
            if arr.dtype != np.bool_:
                raise ValueError(f"array: a 'bool' mask must be a boolean array, got {arr.dtype}")
            return torch.tensor(arr, dtype=torch.bool, device=self.device)
        if dtype == "int64":
            if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
                raise ValueError(f"array: 'int64' needs integer values (token ids, targets, lengths), got {arr.dtype}")
            return torch.tensor(arr.astype(np.int64), dtype=torch.int64, device=self.device)
        t = torch.tensor(arr.astype(np.float64), dtype=torch.float64)  # a copy, on the CPU
        return round_from_float64(t, TORCH_DTYPES[dtype]).to(self.device)

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        """A NumPy copy of ``x`` on the host: floats widened (exactly) to float64."""
        t = x.detach().to("cpu")
        if t.is_floating_point():
            t = t.to(torch.float64)
        return np.array(t.numpy(), copy=True)

    # ---------------------------------------------------------------- precision helpers

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """Where matrix products run: the dtype itself, except float16/bfloat16 on the CPU (float32)."""
        return torch.float32 if dtype in _LOW and torch.device(self.device).type == "cpu" else dtype

    @staticmethod
    def _stat(t: torch.Tensor) -> torch.Tensor:
        """The tensor in the precision reductions run in: float32 for float16/bfloat16."""
        return t.float() if t.dtype in _LOW else t

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """x @ w (+ b) in the compute dtype of ``x``'s dtype (§3.2.2 projections, Eq. (2))."""
        cd = self._compute_dtype(w.dtype)
        y = torch.matmul(x.to(cd), w.to(cd))
        return y if b is None else y + b.to(cd)

    def _softmax_last(self, scores: torch.Tensor) -> torch.Tensor:
        """Max-shifted softmax over the last axis, reductions in >= float32; an all -inf row is NaN."""
        s = self._stat(scores)
        m = s.amax(dim=-1, keepdim=True)
        e = torch.exp(s - m)  # -inf - (-inf) = NaN for a fully masked row
        return e / e.sum(dim=-1, keepdim=True)

    # ---------------------------------------------------------------- §3.2.1

    def softmax(self, x: torch.Tensor, axis: int = -1) -> torch.Tensor:
        """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x) along ``axis`` (§3.2.1, in Eq. (1))."""
        return self._softmax_last(x.movedim(axis, -1)).movedim(-1, axis).to(x.dtype)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """Eq. (1) on tensors already in the compute dtype; ``dtype`` is the caller's dtype.

        Masked scores are -inf (§3.2.3); a fully masked row is NaN (policy "nan").
        """
        d_k = q.shape[-1]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d_k)  # (..., n_q, n_k)
        if mask is not None:
            scores = torch.where(mask, scores, torch.tensor(-math.inf, dtype=scores.dtype, device=scores.device))
        p = self._softmax_last(scores).to(v.dtype)  # (..., n_q, n_k)
        return torch.matmul(p, v)  # (..., n_q, d_v)

    def scaled_dot_product_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1, Eq. (1)); mask True = may attend.

        Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v) -> (..., n_q, d_v).
        """
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ValueError(
                f"q, k, v: expected (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v), got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        cd = self._compute_dtype(q.dtype)
        return self._attend(q.to(cd), k.to(cd), v.to(cd), mask, q.dtype).to(q.dtype)

    def attention_with_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. (1) over one block of keys and the log-sum-exp of its scores (§3.2.1, split keys): (out (..., n_q, d_v),
        lse (..., n_q)); a query that sees no key of the block (n_k = 0 included) gets 0 and -inf. In the compute
        dtype (float32 for float16/bfloat16 on the CPU), the lse returned in float32 there (as FlashAttention's)."""
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ValueError(
                f"q, k, v: expected (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v), got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        cd = self._compute_dtype(q.dtype)
        s = torch.matmul(q.to(cd), k.to(cd).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        if s.shape[-1] == 0:
            lse = torch.full(s.shape[:-1], float("-inf"), dtype=cd, device=s.device)
        else:
            lse = torch.logsumexp(s, dim=-1)  # -inf where every score is -inf
        alive = (lse > float("-inf")).unsqueeze(-1)
        p = torch.where(alive, torch.exp(s - torch.where(alive, lse.unsqueeze(-1), 0.0)), 0.0)
        out = torch.matmul(p, v.to(cd))
        return out.to(q.dtype), lse.to(torch.float32 if q.dtype in _LOW else q.dtype)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        block_table: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """Eq. (1) of each sentence's queries over its paged cache (§3.2.1): q (B, n_q, d_k), pages (N, page, d)
        read through block_table (B, M), the first lengths (B,) positions each; the slots past a length are zeroed
        before any arithmetic, so whatever the pool holds there reaches nothing."""
        b, m = block_table.shape
        span = m * k_pages.shape[1]
        visible = torch.arange(span, device=q.device)[None, :] < lengths[:, None]  # (B, M page)
        k = torch.where(visible[..., None], k_pages[block_table].reshape(b, span, -1), 0.0)
        v = torch.where(visible[..., None], v_pages[block_table].reshape(b, span, -1), 0.0)
        return self.attention_with_lse(q, k.to(q.dtype), v.to(q.dtype), visible[:, None, :])[0]

    def merge_attention_states(self, outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Merge P blocks' states by their log-sum-exps (§3.2.1, split keys): outs (P, ..., n_q, d_v), lses
        (P, ..., n_q) -> (out, lse), max-shifted; no block alive gives 0 and -inf."""
        if outs.dim() < 3 or tuple(outs.shape[:-1]) != tuple(lses.shape) or outs.shape[0] == 0:
            raise ValueError(
                f"outs, lses: expected shapes (P, ..., n_q, d_v) and (P, ..., n_q) with P >= 1, got "
                f"{tuple(outs.shape)} and {tuple(lses.shape)}"
            )
        cd = self._compute_dtype(outs.dtype)
        z = lses.to(cd)
        lse = torch.logsumexp(z, dim=0)  # (..., n_q)
        alive = lse > float("-inf")
        w = torch.exp(z - torch.where(alive, lse, 0.0))  # (P, ..., n_q): the blocks' weights, summing to 1
        out = torch.where(alive.unsqueeze(-1), (w.unsqueeze(-1) * outs.to(cd)).sum(dim=0), 0.0)
        return out.to(outs.dtype), lse.to(outs.dtype)

    # ---------------------------------------------------------------- §3.2.2

    def multi_head_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

        Canonical layout: w_q, w_k (d_model, h*d_k), w_v (d_model, h*d_v), w_o (h*d_v, d_model),
        optional b_q, b_k, b_v, b_o (absent = zero). Shapes: query (..., n_q, d_model),
        key/value (..., n_k, d_model), mask broadcastable to (..., n_q, n_k) -> (..., n_q, d_model).
        """
        h = _positive_int("num_heads", num_heads)
        w = {n: _param(params, n, "params (multi-head attention)") for n in _MHA_WEIGHTS}
        for n in ("w_q", "w_v"):
            if w[n].shape[1] % h:
                raise ValueError(f"num_heads: {h} heads must divide params['{n}']'s {w[n].shape[1]} columns")
        q = _split_heads(self._linear(query, w["w_q"], params.get("b_q")), h)  # (..., h, n_q, d_k)
        k = _split_heads(self._linear(key, w["w_k"], params.get("b_k")), h)  # (..., h, n_k, d_k)
        v = _split_heads(self._linear(value, w["w_v"], params.get("b_v")), h)  # (..., h, n_k, d_v)
        head_mask = None if mask is None else mask.unsqueeze(-3)  # (..., 1, n_q, n_k): every head
        heads = self._attend(q, k, v, head_mask, query.dtype)  # (..., h, n_q, d_v)
        return self._linear(_merge_heads(heads), w["w_o"], params.get("b_o")).to(query.dtype)

    # ---------------------------------------------------------------- §3.5

    def positional_encoding(self, length: int, d_model: int, dtype: str) -> torch.Tensor:
        """PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same) (§3.5).

        Computed in float64 (angles reach ``length`` radians, so float32 angles would lose
        ~length*2^-24 before the sine) and rounded once to ``dtype``. -> (length, d_model).
        """
        self.check_dtype(dtype)
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
            raise ValueError(f"length: expected an int >= 0, got {length!r}")
        d_model = _positive_int("d_model", d_model)
        if d_model % 2:
            raise ValueError(f"d_model: expected an even width (sin/cos pairs), got {d_model}")
        pos = torch.arange(int(length), dtype=torch.float64, device=self.device)[:, None]  # (length, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=self.device)  # (d_model/2,)
        angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64, device=self.device), two_i / d_model)
        pe = torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).reshape(int(length), d_model)  # interleave
        return round_from_float64(pe, TORCH_DTYPES[dtype])

    # ---------------------------------------------------------------- §3.1, §3.3

    def layer_norm(self, x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        """(x - mean) / sqrt(var + eps) * gain + bias over the last axis, biased variance (§3.1).

        Two-pass statistics in >= float32. Shapes: x (..., d_model), gain/bias (d_model,).
        """
        if not eps > 0:
            raise ValueError(f"eps: expected a positive float, got {eps!r}")
        xs = self._stat(x)
        mean = xs.mean(dim=-1, keepdim=True)
        centred = xs - mean
        var = (centred * centred).mean(dim=-1, keepdim=True)  # biased (population) variance
        z = centred / torch.sqrt(var + eps)
        return (z * self._stat(gain) + self._stat(bias)).to(x.dtype)

    def feed_forward(
        self, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
    ) -> torch.Tensor:
        """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. (2)); x (..., d_model) -> (..., d_model)."""
        hidden = torch.relu(self._linear(x, w1, b1)).to(x.dtype)  # (..., d_ff), rounded like a stored activation
        return self._linear(hidden, w2, b2).to(x.dtype)

    # ---------------------------------------------------------------- §5.3, §5.4

    def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
        """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (§5.3, Eq. (3)), in float64.

        Step 0: policy "zero" (min(inf, 0) = 0). A negative step raises ``ValueError``.
        """
        if isinstance(step, bool) or not isinstance(step, (int, float, np.integer, np.floating)) or not step >= 0:
            raise ValueError(f"step: expected a number >= 0, got {step!r}")
        d = torch.tensor(float(_positive_int("d_model", d_model)), dtype=torch.float64)
        warm = torch.tensor(float(_positive_int("warmup_steps", warmup_steps)), dtype=torch.float64)
        if step == 0:
            if self.policies["step_zero"] == "raise":
                raise ValueError("step: 0 has no learning rate under policy step_zero='raise' (step^-0.5 is infinite)")
            return 0.0
        s = torch.tensor(float(step), dtype=torch.float64)
        return float(torch.rsqrt(d) * torch.minimum(torch.rsqrt(s), s * warm.pow(-1.5)))

    def adam_step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        m: torch.Tensor,
        v: torch.Tensor,
        step: int,
        lr: float,
        betas: Any,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of ``torch.optim.Adam`` (§5.3; what the translation reproduction trains with) from the given state:
        (param, m, v) after it, new tensors; the inputs are copied, never updated."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step: expected an int >= 1 (the first update is step 1), got {step!r}")
        p = torch.nn.Parameter(param.detach().clone())
        p.grad = grad.detach().clone()
        optimizer = torch.optim.Adam([p], lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps, foreach=False)
        optimizer.state[p] = {
            "step": torch.tensor(float(step - 1)),  # Adam counts this step itself
            "exp_avg": m.detach().clone(),
            "exp_avg_sq": v.detach().clone(),
        }
        optimizer.step()
        state = optimizer.state[p]
        return p.detach().clone(), state["exp_avg"].detach().clone(), state["exp_avg_sq"].detach().clone()

    def dropout(self, x: torch.Tensor, p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dropout (§5.4) by ``torch.nn.functional.dropout`` in training mode (what ``nn.Dropout`` calls), PyTorch's
        generator seeded by ``seed`` inside ``torch.random.fork_rng`` (the caller's state restored after): (y, keep).

        PyTorch returns no mask: keep is what the same draw gives on ones (:func:`drawn_mask`)."""
        if not 0 <= p < 1:
            raise ValueError(f"p: expected a rate in [0, 1), got {p!r}")
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(int(seed))
            return drawn_mask(lambda t: F.dropout(t, p, training=True), x)

    def _dropouts(self, p: float, seed: int) -> tuple[Any, list[torch.Tensor]]:
        """§5.4's dropout of one layer's sub-layer outputs, the k-th seeded by 4 seed + k (a layer has at most three);
        the masks kept in the order drawn."""
        masks: list[torch.Tensor] = []

        def drop(t: torch.Tensor) -> torch.Tensor:
            y, keep = self.dropout(t, p, 4 * int(seed) + len(masks))
            masks.append(keep)
            return y

        return drop, masks

    def average_checkpoints(self, checkpoints: Mapping[int, Mapping[str, torch.Tensor]], n: int) -> dict[str, Any]:
        """The mean of the ``n`` checkpoints of the largest steps (§6.1), in their dtype."""
        if not isinstance(checkpoints, Mapping) or not checkpoints:
            raise ValueError("checkpoints: expected a non-empty mapping of step -> parameters")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(checkpoints):
            raise ValueError(f"n: expected an int in [1, {len(checkpoints)}], got {n!r}")
        chosen = sorted(checkpoints)[-n:]
        return {
            name: torch.stack([checkpoints[s][name] for s in chosen]).sum(dim=0) / n for name in checkpoints[chosen[0]]
        }

    def _check_smoothing(self, targets: torch.Tensor, vocab_size: int, eps: float) -> int:
        """Validate §5.4's arguments; return K."""
        k = _positive_int("vocab_size", vocab_size)
        if k < 2:
            raise ValueError(f"vocab_size: expected >= 2 classes, got {k}")
        if not 0 <= eps < 1:
            raise ValueError(f"eps: expected 0 <= eps < 1, got {eps!r}")
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= k):
            raise ValueError(
                f"targets: expected class ids in [0, {k}), got values in [{int(targets.min())}, {int(targets.max())}]"
            )
        return k

    def label_smoothing(self, targets: torch.Tensor, vocab_size: int, eps: float) -> torch.Tensor:
        """(1 - eps) * onehot(target) + eps / K (§5.4, variant "K"), in float64 then rounded to ``dtypes[0]``.

        targets int64 (...,) -> (..., K).
        """
        k = self._check_smoothing(targets, vocab_size, eps)
        dist = torch.full((*targets.shape, k), eps / k, dtype=torch.float64, device=targets.device)
        dist.scatter_(-1, targets.unsqueeze(-1), 1.0 - eps + eps / k)
        return round_from_float64(dist, TORCH_DTYPES[self.dtypes[0]])

    def smoothed_cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
        """-sum_c q(c) log softmax(logits)_c with q the §5.4 smoothed target, per position.

        With q = (1 - eps) onehot + eps/K this is (1 - eps) * (-log p_target) + eps * mean_c(-log p_c).
        log-softmax max-shifted, in >= float32. logits (..., K), targets (...,) -> (...,).
        """
        self._check_smoothing(targets, logits.shape[-1], eps)
        x = self._stat(logits)
        m = x.amax(dim=-1, keepdim=True)
        log_p = (x - m) - torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))  # (..., K)
        nll = -log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (...,)
        uniform = -log_p.mean(dim=-1)  # (...,)
        return ((1.0 - eps) * nll + eps * uniform).to(logits.dtype)

    # ---------------------------------------------------------------- §3.1 layers

    def _norm(self, x: torch.Tensor, params: Mapping[str, Any], name: str) -> torch.Tensor:
        """This layer's LayerNorm ``name`` with the declared eps."""
        p = _param(params, name, "params (layer)")
        return self.layer_norm(
            x,
            _param(p, "gain", f"params['{name}']"),
            _param(p, "bias", f"params['{name}']"),
            float(self.policies["layer_norm_eps"]),
        )

    def _ffn(self, x: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
        """This layer's Eq. (2) sub-layer."""
        p = _param(params, "ffn", "params (layer)")
        return self.feed_forward(x, *(_param(p, n, "params['ffn']") for n in ("w1", "b1", "w2", "b2")))

    def encoder_layer(
        self, x: torch.Tensor, params: Mapping[str, Any], num_heads: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """z = LayerNorm(x + MultiHead(x, x, x)); LayerNorm(z + FFN(z)) (§3.1, post-norm, no dropout)."""
        return self._encoder(x, params, num_heads, mask, _evaluation)

    def encoder_layer_training(
        self, x: torch.Tensor, params: Mapping[str, Any], num_heads: int, p: float, seed: int, mask: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`encoder_layer` with §5.4's dropout on each sub-layer's output before its residual sum: the output and
        the masks drawn (the self-attention's, the feed-forward's)."""
        drop, masks = self._dropouts(p, seed)
        return (self._encoder(x, params, num_heads, mask, drop), *masks)

    def _encoder(self, x: torch.Tensor, params: Mapping[str, Any], num_heads: int, mask: Any, drop: Any) -> Any:
        attn = _param(params, "self_attn", "params (encoder layer)")
        z = self._norm(x + drop(self.multi_head_attention(x, x, x, attn, num_heads, mask)), params, "norm1")
        return self._norm(z + drop(self._ffn(z, params)), params, "norm2")

    def _causal(self, n: int) -> torch.Tensor:
        """(n, n) bool: query i sees keys j <= i (§3.2.3)."""
        return torch.ones(n, n, dtype=torch.bool, device=self.device).tril()

    def decoder_layer(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masked self-attention, encoder-decoder attention, FFN; each LayerNorm(x + Sublayer(x)) (§3.1).

        ``self_mask`` None = causal (§3.2.3); a given one is used as is.
        """
        return self._decoder(y, memory, params, num_heads, self_mask, memory_mask, _evaluation)

    def decoder_layer_training(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """:meth:`decoder_layer` with §5.4's dropout on each sub-layer's output before its residual sum: the output and
        the three masks drawn, in the order the sub-layers run."""
        drop, masks = self._dropouts(p, seed)
        return (self._decoder(y, memory, params, num_heads, self_mask, memory_mask, drop), *masks)

    def _decoder(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: torch.Tensor | None,
        memory_mask: torch.Tensor | None,
        drop: Any,
    ) -> torch.Tensor:
        if self_mask is None:
            self_mask = self._causal(y.shape[-2])
        self_attn = _param(params, "self_attn", "params (decoder layer)")
        cross_attn = _param(params, "cross_attn", "params (decoder layer)")
        a = self._norm(y + drop(self.multi_head_attention(y, y, y, self_attn, num_heads, self_mask)), params, "norm1")
        b = self._norm(
            a + drop(self.multi_head_attention(a, memory, memory, cross_attn, num_heads, memory_mask)), params, "norm2"
        )
        return self._norm(b + drop(self._ffn(b, params)), params, "norm3")

    # ---------------------------------------------------------------- §3.1-§3.5, Figure 1

    def _embed(self, tokens: torch.Tensor, params: Mapping[str, Any], name: str) -> torch.Tensor:
        """E[tokens] * sqrt(d_model) + positions (§3.4, §3.5): sinusoids, or params['positional'] if given."""
        emb = _param(params, "embedding", "params (transformer)")
        vocab, d_model = emb.shape
        if tokens.dim() != 2:
            raise ValueError(f"{name}: expected shape (B, n), got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(
                f"{name}: expected token ids in [0, {vocab}), got values in [{int(tokens.min())}, {int(tokens.max())}]"
            )
        n = tokens.shape[1]
        x = emb[tokens] * math.sqrt(d_model)  # (B, n, d_model)
        if "positional" in params:
            return x + params["positional"][:n]
        return x + self.positional_encoding(n, d_model, _DTYPE_NAMES[emb.dtype])

    def _key_mask(self, lengths: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """(B, 1, n) bool: key j visible iff j < lengths[b]; None when no lengths."""
        if lengths is None:
            return None
        if lengths.dim() != 1 or (lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > n)):
            raise ValueError(f"lengths: expected a 1-D int64 tensor of values in [0, {n}], got {lengths.tolist()}")
        return (torch.arange(n, device=self.device)[None, :] < lengths[:, None])[:, None, :]

    def transformer_forward(
        self,
        src_tokens: torch.Tensor,
        tgt_tokens: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        src_lengths: torch.Tensor | None = None,
        tgt_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids to pre-softmax logits (Figure 1): shared embedding, N post-norm layers each side.

        Logits = decoder output @ E^T (§3.4, no sqrt(d_model) on the output side); no final
        LayerNorm; decoder self-attention causal (and padded target keys hidden when
        ``tgt_lengths`` is given); source padding hidden in both attentions that read the source.
        -> (B, n_tgt, vocab).
        """
        if src_tokens.dim() != 2 or tgt_tokens.dim() != 2 or src_tokens.shape[0] != tgt_tokens.shape[0]:
            raise ValueError(
                f"src_tokens, tgt_tokens: expected (B, n_src) and (B, n_tgt), got {tuple(src_tokens.shape)} and "
                f"{tuple(tgt_tokens.shape)}"
            )
        src_mask = self._key_mask(src_lengths, src_tokens.shape[1])  # (B, 1, n_src)
        n_tgt = tgt_tokens.shape[1]
        tgt_mask = self._causal(n_tgt)  # (n_tgt, n_tgt)
        if tgt_lengths is not None:
            tgt_mask = tgt_mask & self._key_mask(tgt_lengths, n_tgt)  # (B, n_tgt, n_tgt)
        x = self._embed(src_tokens, params, "src_tokens")  # (B, n_src, d_model)
        for layer in _param(params, "encoder", "params (transformer)"):
            x = self.encoder_layer(x, layer, num_heads, src_mask)
        y = self._embed(tgt_tokens, params, "tgt_tokens")  # (B, n_tgt, d_model)
        for layer in _param(params, "decoder", "params (transformer)"):
            y = self.decoder_layer(y, x, layer, num_heads, tgt_mask, src_mask)
        emb = params["embedding"]
        return self._linear(y, emb.transpose(0, 1), None).to(emb.dtype)  # (B, n_tgt, vocab)

    def transformer_forward_training(
        self,
        src_tokens: torch.Tensor,
        tgt_tokens: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        p: float,
        seed: int,
        src_lengths: torch.Tensor | None = None,
        tgt_lengths: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """:meth:`transformer_forward` in training mode: the embeddings' sums dropped (:meth:`dropout`), each layer
        its :meth:`encoder_layer_training` or :meth:`decoder_layer_training`; the k-th draw seeded by 1024 seed + k.
        Returns the logits and the masks by place."""
        src_mask = self._key_mask(src_lengths, src_tokens.shape[1])  # (B, 1, n_src)
        n_tgt = tgt_tokens.shape[1]
        tgt_mask = self._causal(n_tgt)  # (n_tgt, n_tgt)
        if tgt_lengths is not None:
            tgt_mask = tgt_mask & self._key_mask(tgt_lengths, n_tgt)  # (B, n_tgt, n_tgt)
        seeds = (1024 * int(seed) + k for k in range(1024))
        out: dict[str, torch.Tensor] = {}
        x, out["src_embedding"] = self.dropout(self._embed(src_tokens, params, "src_tokens"), p, next(seeds))
        for i, layer in enumerate(_param(params, "encoder", "params (transformer)")):
            x, *masks = self.encoder_layer_training(x, layer, num_heads, p, next(seeds), src_mask)
            out |= {f"encoder.{i}.{s}": m for s, m in zip(ENCODER_SUBLAYERS, masks, strict=True)}
        y, out["tgt_embedding"] = self.dropout(self._embed(tgt_tokens, params, "tgt_tokens"), p, next(seeds))
        for i, layer in enumerate(_param(params, "decoder", "params (transformer)")):
            y, *masks = self.decoder_layer_training(y, x, layer, num_heads, p, next(seeds), tgt_mask, src_mask)
            out |= {f"decoder.{i}.{s}": m for s, m in zip(DECODER_SUBLAYERS, masks, strict=True)}
        emb = params["embedding"]
        return {"logits": self._linear(y, emb.transpose(0, 1), None).to(emb.dtype), **out}


def drawn_mask(drop: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(drop(x), keep)``: a PyTorch dropout that returns no mask, and the mask it drew, read by running ``drop`` again
    on ones of x's shape and dtype from the generator state it started from (the state after the first run restored).

    Read from drop(x) itself, an element of x that is 0 (or a subnormal flushed) would look dropped; a dropout whose
    draw depended on anything but the generator, the shape and the dtype would disagree with y given this mask, which
    the suite's comparison with the oracle catches."""
    cuda = x.device.type == "cuda"
    start = torch.cuda.get_rng_state(x.device) if cuda else torch.get_rng_state()
    y = drop(x)
    after = torch.cuda.get_rng_state(x.device) if cuda else torch.get_rng_state()
    (torch.cuda.set_rng_state(start, x.device) if cuda else torch.set_rng_state(start))
    keep = drop(torch.ones_like(x)) != 0
    (torch.cuda.set_rng_state(after, x.device) if cuda else torch.set_rng_state(after))
    return y, keep


def _evaluation(t: torch.Tensor) -> torch.Tensor:
    """No dropout (evaluation mode)."""
    return t


class TorchSDPAImplementation(TorchImplementation):
    """As ``torch``, but Eq. (1) is ``torch.nn.functional.scaled_dot_product_attention`` (``"torch-sdpa"``).

    Used for :meth:`scaled_dot_product_attention` and for the per-head step of
    :meth:`multi_head_attention` (and so inside the layers and the whole model). The kernel runs in
    the caller's dtype (its own float32 accumulation for float16/bfloat16), with its default scale
    1/sqrt(d_k) and a boolean mask (True = may attend, the same convention as the contract).

    Policy ``fully_masked = "zeros"``: SDPA returns 0 for a query row with no visible key (its
    "safe softmax"), rather than the NaN that -inf masking gives; measured on the CPU in torch 2.13.
    """

    name = "torch-sdpa"
    # Split keys (implementations/protocol.py) are not provided: PyTorch has no public API that returns attention's
    # log-sum-exp or merges partial states, and the torch built-in's own are plain tensor code, not SDPA's.
    attention_with_lse = None
    merge_attention_states = None
    paged_attention = None
    # PyTorch's CPU flash-attention kernel (4-d inputs) flushes subnormal results to zero in bfloat16:
    # F.scaled_dot_product_attention(q = k = 0, v = 2.02e-39) gives 0.0 for shape (2, 1, 1, 1), the value
    # itself for shape (2, 1, 1) (the math path), and keeps it in float16, float32 and float64 (torch
    # 2.13.0 on the CPU). Found by `aiayn false-alarms --profile dev`, seed 12. Declared as arithmetic
    # (policy "flush_subnormals") for Eq. (1) and what calls it (multi-head attention, the layers, the
    # whole model), in bfloat16 only: their budgets take 2^-126 as an underflow's error. LayerNorm, the
    # FFN, softmax and the rest do not go through the kernel and keep the IEEE budgets.
    policies: Mapping[str, object] = MappingProxyType(
        {
            **DEFAULT_POLICIES,
            "fully_masked": "zeros",
            "flush_subnormals": MappingProxyType(
                {
                    "bfloat16": (
                        "scaled_dot_product_attention",
                        "multi_head_attention",
                        "encoder_layer",
                        "decoder_layer",
                        "transformer_forward",
                    )
                }
            ),
        }
    )
    # SDPA applies a boolean mask by *adding* -inf to the scores, where §3.2.3 *sets* masked scores
    # to -inf. The two differ only when a masked score is not finite: NaN in a masked key, or a key
    # so large that q.k overflows to inf, gives NaN + (-inf) or inf + (-inf) = NaN, and the query's
    # whole output row becomes NaN. That is PyTorch's behaviour, which this implementation exists
    # to check, so it is declared (and checked strictly) rather than worked around.
    # In float16 the largest finite key (65504) cannot overflow SDPA's float32 scores, so the
    # "huge" poison deviates only in the wider formats.
    known_deviations: Mapping[str, str] = MappingProxyType(
        {
            **{
                f"attention_poison_at_masked_positions_changes_nothing[huge]@{dtype}": (
                    "PyTorch adds -inf to masked scores instead of replacing them (§3.2.3), so a masked score that "
                    "overflows to inf gives inf + (-inf) = NaN"
                )
                for dtype in ("float64", "float32", "bfloat16")
            },
            "attention_poison_at_masked_positions_changes_nothing[nan_keys]": (
                "PyTorch adds -inf to masked scores instead of replacing them (§3.2.3), so NaN in a masked key gives "
                "NaN + (-inf) = NaN"
            ),
        }
    )

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """Eq. (1) by ``F.scaled_dot_product_attention`` in ``dtype``; batch dims (and mask) broadcast explicitly."""
        batch = torch.broadcast_shapes(
            q.shape[:-2], k.shape[:-2], v.shape[:-2], () if mask is None else mask.shape[:-2]
        )
        q, k, v = (t.to(dtype).expand(*batch, *t.shape[-2:]) for t in (q, k, v))
        if mask is not None:
            # Broadcastable, not expanded over the batch: SDPA turns a boolean mask into a float one
            # of the mask's own shape, so a (n_q, n_k) mask stays one score matrix, not h of them.
            # Only the score axes are expanded (a view), for masks given as (..., 1, n_k) or (..., n_q, 1).
            mask = mask.expand(*mask.shape[:-2], q.shape[-2], k.shape[-2])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (..., n_q, d_v)
        return out.to(self._compute_dtype(dtype))
