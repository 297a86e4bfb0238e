"""A kit for adapters over PyTorch modules: the layout work, so that an adapter is tens of lines.

An adapter maps the canonical weights and arguments of the contract onto a library's module and
calls it; it never repairs the module's behaviour. What every such adapter needs is here:

- :class:`TorchAdapter`, a base implementation: the correctly rounded array boundary
  (``from_numpy``/``to_numpy`` on a device), float64 without touching torch's global default
  dtype, inference mode, and ``provides()`` from the methods defined;
- :func:`linear_weight`, :func:`copy_linear`: the canonical layout computes x @ W with W of shape
  (in, out); ``nn.Linear`` stores W^T (out, in);
- :func:`fused_qkv`: one (3 d, d) in-projection (``nn.MultiheadAttention``, GPT's ``c_attn``)
  from the canonical w_q, w_k, w_v and their biases;
- :func:`build`: a module made directly in a dtype and on a device (``dtype=``/``device=``
  factory arguments, or ``.to()`` for modules without them), in eval mode, no gradients;
- :func:`attention_mask`: the contract's mask (True = may attend, broadcastable) as the library
  wants it: inverted (PyTorch's True = may not attend), additive (0 / -inf), expanded to exactly
  (B, n_q, n_k), (B*h, n_q, n_k) or (B, h, n_q, n_k);
- :func:`padding_from_mask`: a (B, 1, n_k) mask as the key-padding vector (B, n_k) modules take;
- :func:`causal_and_padding`: any mask that is key padding, causal, or both, as (key padding (B, n_k), causal?) for
  modules that take a key-padding mask and build their own causal mask;
- :func:`batched`: (..., n, d) broadcast and flattened to the (B, n, d) most modules take;
- :func:`copy_layer_norm`: canonical {"gain", "bias"} into an ``nn.LayerNorm``.

Example (``nn.MultiheadAttention`` as §3.2.2)::

    class MHA(TorchAdapter):
        name = "my-mha"

        def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
            d = query.shape[-1]
            m = build(self, nn.MultiheadAttention, d, num_heads, bias=True, batch_first=True)
            w, b = fused_qkv(params, d)
            with torch.no_grad():
                m.in_proj_weight.copy_(w); m.in_proj_bias.copy_(b)
                copy_linear(m.out_proj, params["w_o"], params.get("b_o"))
            flat = attention_mask(mask, query.shape[:-2], query.shape[-2], key.shape[-2], num_heads, "flat")
            out, _ = m(query, key, value, attn_mask=flat, need_weights=False)
            return out
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.implementations.protocol import ImplementationBase
from aiayn.implementations.torch_impl import TORCH_DTYPES, default_device, round_from_float64

__all__ = [
    "TorchAdapter",
    "attention_mask",
    "batched",
    "build",
    "causal_and_padding",
    "copy_layer_norm",
    "copy_linear",
    "fused_qkv",
    "linear_weight",
    "padding_from_mask",
]


class TorchAdapter(ImplementationBase):
    """Base of adapters over PyTorch code: the array boundary and the declarations; subclasses add the equations.

    ``device``: where tensors live (default: cuda if available, else cpu). ``dtypes``: float64 and
    float32 on the CPU, float32, float16, bfloat16 on a GPU, unless the subclass sets its own.
    """

    def __init__(self, device: str | None = None) -> None:
        self.device = str(torch.device(device or default_device()))
        self.version = f"torch {torch.__version__}" + (f"; {self.library}" if getattr(self, "library", "") else "")
        if not type(self).dtypes:
            self.dtypes = (
                ("float64", "float32")
                if torch.device(self.device).type == "cpu"
                else ("float32", "float16", "bfloat16")
            )

    #: The library wrapped, with its version, for the version string (e.g. "transformers 5.24.0").
    library: str = ""

    def from_numpy(self, array: np.ndarray, dtype: str) -> torch.Tensor:
        """A new tensor on the device; floats correctly rounded to ``dtype`` (ties to even), ids int64, masks bool."""
        self.check_dtype(dtype, allow_index=True)
        arr = np.asarray(array)
        if dtype in ("bool", "int64"):
            return torch.tensor(arr.astype(dtype), device=self.device)
        return round_from_float64(torch.tensor(arr.astype(np.float64), dtype=torch.float64), TORCH_DTYPES[dtype]).to(
            self.device
        )

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        t = x.detach().to("cpu")
        return np.array((t.to(torch.float64) if t.is_floating_point() else t).numpy(), copy=True)


def linear_weight(w: torch.Tensor) -> torch.Tensor:
    """The canonical (in, out) matrix as ``nn.Linear.weight`` stores it, (out, in)."""
    return w.transpose(0, 1)


def copy_linear(linear: nn.Linear, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Load canonical x @ w + b into ``linear`` (its weight is w^T; an absent bias is zero)."""
    with torch.no_grad():
        linear.weight.copy_(linear_weight(w))
        if linear.bias is not None:
            linear.bias.copy_(b if b is not None else torch.zeros_like(linear.bias))
        elif b is not None and bool(torch.any(b != 0)):
            raise ValueError("the module's projection has no bias, but the canonical parameters give a non-zero one")


def fused_qkv(params: Mapping[str, Any], d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (3 d, d), bias (3 d,)) of a fused in-projection: [w_q^T; w_k^T; w_v^T] and [b_q; b_k; b_v] (absent biases
    zero)."""
    ws = [params[n] for n in ("w_q", "w_k", "w_v")]
    like = ws[0]
    bs = [
        params.get(n) if params.get(n) is not None else torch.zeros(d_model, dtype=like.dtype, device=like.device)
        for n in ("b_q", "b_k", "b_v")
    ]
    return torch.cat([linear_weight(w) for w in ws], dim=0), torch.cat(bs, dim=0)


def build(adapter: Any, cls: type[nn.Module], *args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> nn.Module:
    """``cls(*args, **kwargs)`` in ``dtype`` (default float64 on the CPU's ``float64`` runs: pass the inputs' dtype)
    on the adapter's device, in eval mode; torch's global default dtype is never changed (``dtype=`` factory argument,
    else ``.to``)."""
    factory = {"device": adapter.device, **({"dtype": dtype} if dtype is not None else {})}
    try:
        accepts = {"dtype", "device"} <= set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        accepts = False
    module = cls(*args, **kwargs, **factory) if accepts else cls(*args, **kwargs).to(**factory)
    return module.eval().requires_grad_(False)


def attention_mask(
    mask: torch.Tensor | None,
    batch: tuple[int, ...],
    n_q: int,
    n_k: int,
    heads: int = 1,
    layout: str = "batch",
    *,
    kind: str = "block",
) -> torch.Tensor | None:
    """The contract's mask (True = may attend, broadcastable to batch + (n_q, n_k)) in a library's convention.

    ``layout``: "batch" (B, n_q, n_k) with B the product of ``batch``; "flat" (B*h, n_q, n_k)
    (``nn.MultiheadAttention``'s 3-D attn_mask); "heads" (B, h, n_q, n_k); "broadcast" as given.
    ``kind``: "block" (True = may *not* attend, PyTorch's boolean convention), "allow" (True = may
    attend, kept), or "additive" (0.0 where allowed, -inf where not, float32).
    """
    if mask is None:
        return None
    if layout != "broadcast":
        full = mask.expand(*batch, n_q, n_k).reshape(-1, n_q, n_k)  # (B, n_q, n_k)
        if layout == "flat":
            full = full.repeat_interleave(heads, dim=0)  # (B*h, n_q, n_k), index b*h + head
        elif layout == "heads":
            full = full[:, None].expand(-1, heads, n_q, n_k)  # (B, h, n_q, n_k)
        mask = full
    if kind == "allow":
        return mask
    if kind == "block":
        return ~mask
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))


def padding_from_mask(mask: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """A key-padding mask (B, 1, n_k) or (1, n_k), True = may attend, as the (B, n_k) vector modules take (True = may
    attend)."""
    if mask is None:
        return None
    return mask.reshape(-1, mask.shape[-1]).expand(batch, -1) if mask.shape[-2] == 1 else None


def causal_and_padding(
    mask: torch.Tensor | None, batch: tuple[int, ...], n_q: int, n_k: int
) -> tuple[torch.Tensor | None, bool]:
    """The contract's mask (True = may attend, broadcastable to batch + (n_q, n_k)) as (key padding, causal).

    For a module that takes a key-padding mask (B, n_k), True = may attend (None: every key), and makes its own
    causal mask (end-aligned: query i sees keys j <= i + n_k - n_q, §3.2.3) when told to. The last query may see
    every key the causal mask allows, so its row is the padding; the mask must then be exactly that padding, or the
    causal mask and that padding together. Raises ValueError for any other mask (a random mask: out of the module's
    scope, which its adapter declares).
    """
    if mask is None:
        return None, False
    full = mask.expand(*batch, n_q, n_k).reshape(-1, n_q, n_k)  # (B, n_q, n_k)
    padding = full[:, -1, :]  # (B, n_k)
    rows = padding[:, None, :].expand_as(full)
    causal = torch.ones(n_q, n_k, dtype=torch.bool, device=full.device).tril(n_k - n_q)  # (n_q, n_k)
    kept = None if bool(padding.all()) else padding
    if torch.equal(full, rows):
        return kept, False
    if torch.equal(full, rows & causal):
        return kept, True
    raise ValueError(
        "mask: neither key padding nor the causal mask with key padding (the module takes a key-padding mask and "
        "makes its own causal mask)"
    )


def batched(t: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """(..., n, d) broadcast to ``batch`` + (n, d) and flattened to (B, n, d), B the product of ``batch``."""
    return t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])


def copy_layer_norm(norm: nn.Module, params: Mapping[str, Any]) -> None:
    """Load the canonical LayerNorm {"gain", "bias"} (d_model,) into ``norm`` (``weight``, and ``bias`` where it has
    one)."""
    with torch.no_grad():
        norm.weight.copy_(params["gain"])
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(params["bias"])
        elif bool(torch.any(params["bias"] != 0)):
            raise ValueError("the module's LayerNorm has no bias, but the canonical parameters give a non-zero one")
