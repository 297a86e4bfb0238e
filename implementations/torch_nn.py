"""PyTorch's own modules, mapped to the oracle's canonical layout: the ``torch-nn`` built-in.

This adapter is how aiayn checks whether PyTorch's built-in building blocks compute the paper's
equations. Each call builds the module, copies the canonical weights into it, and runs it:

- multi-head attention (§3.2.2) -> ``nn.MultiheadAttention(d_model, h, batch_first=True)``:
  ``in_proj_weight = [w_q^T; w_k^T; w_v^T]`` (PyTorch computes x @ W^T, we compute x @ W),
  ``in_proj_bias = [b_q; b_k; b_v]``, ``out_proj.weight = w_o^T``, ``out_proj.bias = b_o``;
  absent canonical biases are zeros. PyTorch splits heads as the canonical layout does (head i
  takes columns i*d_k:(i+1)*d_k). It requires h*d_k = h*d_v = d_model; other shapes raise
  ``ValueError``. Masks: the contract's True = may attend is inverted to PyTorch's
  ``attn_mask`` True = may *not* attend, as a (B*h, n_q, n_k) mask (or (n_q, n_k)).
- layer normalisation (§3.1) -> ``nn.LayerNorm(d_model, eps)``; the layers use
  ``layer_norm_eps = policies["layer_norm_eps"] = 1e-6`` (the oracle's, the authors'
  tensor2tensor value; the paper is silent). PyTorch's default is 1e-5: with it the check would
  fail by up to ~0.5 * 1e-5 / var relative, which is a different function, not a rounding error.
- encoder and decoder layers (§3.1) -> ``nn.TransformerEncoderLayer`` /
  ``nn.TransformerDecoderLayer`` with ``norm_first=False`` (post-norm, the paper's),
  ``activation="relu"`` (Eq. (2)), ``dropout=0.0``, ``batch_first=True``, ``bias=True``.
- the whole model (Figure 1) -> our own composition of those layers (inherited from
  ``TorchImplementation.transformer_forward``), *not* ``nn.Transformer``: ``nn.Transformer``
  appends a final LayerNorm to the encoder and to the decoder stack, which the paper's post-norm
  model does not have (it would normalise twice at the top of each stack).
- Eq. (1) alone is ``torch.nn.functional.scaled_dot_product_attention`` (what
  ``nn.MultiheadAttention`` calls inside), inherited from ``torch-sdpa``;
- the other equations (softmax, feed-forward, positional encoding, lrate, label smoothing,
  cross-entropy) have no module of their own and are ``TorchImplementation``'s.

The inference "fast path". In eval mode, without autograd, PyTorch may replace the Python
forward of ``nn.MultiheadAttention`` (self-attention only) and ``nn.TransformerEncoderLayer`` by
fused kernels (``torch._native_multi_head_attention``, ``torch._transformer_encoder_layer_fwd``).
Their rounding differs, and so does their answer on a fully masked row: NaN, where the Python
forward (which goes through ``scaled_dot_product_attention``) gives zeros — measured on the CPU in
torch 2.13. By default (``fastpath=False``) this adapter therefore checks the documented Python
forward, which is one consistent function: it keeps the modules in training mode, which the fast
path excludes (every dropout probability is 0, and dropout with p = 0 returns its input
unchanged), without touching the process-wide ``torch.backends.mha`` switch. ``fastpath=True``
runs the modules in eval mode instead, so PyTorch takes its fused kernels where it can; its
declared fully-masked policy stays "zeros", and a conformance run then reports the fused kernels'
NaN on fully masked self-attention rows as the disagreement it is.

Declared policies: fully masked rows give zeros (``scaled_dot_product_attention``'s safe softmax,
reached because the adapter calls the modules with ``need_weights=False``), label smoothing over K,
LayerNorm eps 1e-6, lrate(0) = 0. Dtypes: float64 and float32 on the CPU; float32, float16 and
bfloat16 on CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from aiayn.implementations.protocol import DEFAULT_POLICIES
from aiayn.implementations.torch_impl import TorchSDPAImplementation, _param, _positive_int, drawn_mask

__all__ = ["TorchNNFastPath", "TorchNNImplementation"]


def _batched(t: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """(..., n, d) broadcast to ``batch`` + (n, d), flattened to the (N, n, d) PyTorch's layers take."""
    return t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])


#: Why PyTorch's layers in training mode depart from §5.4 (measured on the CPU in torch 2.13: with the attention's and
#: the feed-forward's inner dropout set to 0 by hand, the layer agrees with the oracle given its two masks to 1e-15).
_EXTRA_DROPOUT = (
    "nn.TransformerEncoderLayer's and nn.TransformerDecoderLayer's one dropout argument also drops the attention "
    "weights (nn.MultiheadAttention's dropout) and the feed-forward's hidden units (the layer's dropout module, "
    "between linear1 and linear2), where §5.4 drops only each sub-layer's output and the embeddings' sums"
)


class TorchNNImplementation(TorchSDPAImplementation):
    """PyTorch's ``nn`` modules in the canonical layout (registry name ``"torch-nn"``).

    See the module docstring for the mapping, the eps, and the fast path. ``fastpath=False``
    (default) checks the modules' Python forward; ``True`` lets PyTorch use its fused inference
    kernels.
    """

    name = "torch-nn"
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "zeros"})
    # known_deviations: torch-sdpa's (nn.MultiheadAttention masks through SDPA), and nn.LayerNorm's backward on a row
    # of one element: x_hat = (x - mean) rstd is exactly 0 there (the mean of one number is itself), so dx and
    # dweight are exactly 0, but PyTorch's native layer_norm backward gives neither (e.g. dweight -4.8e-15 in float64,
    # -3.7e-06 in float32, dx -3.1e-05 in float32; PyTorch #188372), measured on the CPU in torch 2.13.
    known_deviations: Mapping[str, str] = MappingProxyType(
        {
            **TorchSDPAImplementation.known_deviations,
            "layer_norm_one_element_rows_have_no_gradient": (
                "nn.LayerNorm's native backward gives a nonzero dx and dweight on rows of one element, where x_hat is "
                "exactly 0 (PyTorch #188372); measured on the CPU in torch 2.13"
            ),
            "encoder_layer_training": _EXTRA_DROPOUT,
            "decoder_layer_training": _EXTRA_DROPOUT,
            "transformer_forward_training": _EXTRA_DROPOUT,
        }
    )

    def __init__(self, device: str | None = None, *, fastpath: bool = False) -> None:
        super().__init__(device)
        self.fastpath = bool(fastpath)
        on_cpu = torch.device(self.device).type == "cpu"
        self.dtypes = ("float64", "float32") if on_cpu else ("float32", "float16", "bfloat16")
        if self.fastpath:
            self.name = "torch-nn-fastpath"

    # ---------------------------------------------------------------- building the modules

    def _factory(self, like: torch.Tensor) -> dict[str, Any]:
        return {"device": like.device, "dtype": like.dtype}

    def _mode(self, module: nn.Module) -> nn.Module:
        """Training mode (fast path excluded; dropout p = 0 is the identity) unless ``fastpath``."""
        return module.train(not self.fastpath)

    def _mha_tensors(self, params: Mapping[str, Any], d_model: int) -> dict[str, torch.Tensor]:
        """Canonical MHA params as ``nn.MultiheadAttention``'s parameters, built from the given tensors (so that
        autograd reaches them through ``torch.func.functional_call``): x @ W^T layout, absent biases zero."""
        w = [_param(params, n, "params (multi-head attention)") for n in ("w_q", "w_k", "w_v")]
        for name, weight in zip(("w_q", "w_k", "w_v"), w):
            if tuple(weight.shape) != (d_model, d_model):
                raise ValueError(
                    f"params['{name}']: nn.MultiheadAttention needs h*d_k = h*d_v = d_model, i.e. a ({d_model}, "
                    f"{d_model}) matrix; got {tuple(weight.shape)}"
                )

        def bias(name: str) -> torch.Tensor:
            b = params.get(name)
            return torch.zeros(d_model, dtype=w[0].dtype, device=w[0].device) if b is None else b

        return {
            "in_proj_weight": torch.cat([t.transpose(0, 1) for t in w], dim=0),  # (3 d_model, d_model)
            "in_proj_bias": torch.cat([bias(n) for n in ("b_q", "b_k", "b_v")]),
            "out_proj.weight": _param(params, "w_o", "params (multi-head attention)").transpose(0, 1),
            "out_proj.bias": bias("b_o"),
        }

    def _grad_mode(self) -> contextlib.AbstractContextManager[Any]:
        """No autograd on the fast path (PyTorch's fused inference kernels have no backward: gradients "not
        provided"); otherwise autograd reaches the canonical tensors (the suite's gradient checks)."""
        return torch.no_grad() if self.fastpath else contextlib.nullcontext()

    def _layer_kwargs(self, params: Mapping[str, Any], num_heads: int) -> dict[str, Any]:
        """The constructor arguments shared by both layer classes: the paper's, not PyTorch's defaults."""
        w1 = _param(_param(params, "ffn", "params (layer)"), "w1", "params['ffn']")
        d_model, d_ff = w1.shape
        return dict(
            d_model=d_model,
            nhead=_positive_int("num_heads", num_heads),
            dim_feedforward=d_ff,
            dropout=0.0,
            activation="relu",
            layer_norm_eps=float(self.policies["layer_norm_eps"]),
            batch_first=True,
            norm_first=False,
            bias=True,
            **self._factory(w1),
        )

    @staticmethod
    def _attn_mask(
        mask: torch.Tensor | None, batch: tuple[int, ...], n_q: int, n_k: int, h: int
    ) -> torch.Tensor | None:
        """Contract mask (True = may attend, broadcastable to batch + (n_q, n_k)) -> PyTorch's attn_mask.

        PyTorch's boolean ``attn_mask`` means True = may *not* attend, shaped (n_q, n_k) or
        (N*h, n_q, n_k) with index b*h + head.
        """
        if mask is None:
            return None
        if mask.dim() == 2:  # (n_q, n_k), or a broadcastable (1, n_k) / (n_q, 1), which PyTorch rejects
            return ~mask.expand(n_q, n_k)
        full = mask.expand(*batch, n_q, n_k).reshape(-1, n_q, n_k)  # (N, n_q, n_k)
        return (~full).repeat_interleave(h, dim=0)  # (N*h, n_q, n_k)

    # ---------------------------------------------------------------- the equations

    def multi_head_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """§3.2.2 by ``nn.MultiheadAttention`` (need_weights=False), its parameters the given tensors. Shapes as in
        the contract."""
        h = _positive_int("num_heads", num_heads)
        with self._grad_mode():
            w_q = _param(params, "w_q", "params (multi-head attention)")
            d_model = w_q.shape[0]
            if d_model % h:
                raise ValueError(
                    f"num_heads: nn.MultiheadAttention needs num_heads to divide d_model={d_model}, got {h}"
                )
            module = self._mode(
                nn.MultiheadAttention(d_model, h, dropout=0.0, bias=True, batch_first=True, **self._factory(w_q))
            )
            batch = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]))
            n_q, n_k = query.shape[-2], key.shape[-2]
            q = _batched(query, batch)
            k = q if key is query else _batched(key, batch)  # keep self-attention recognisable (fast path)
            v = k if value is key else _batched(value, batch)
            mask_ = self._attn_mask(mask, batch, n_q, n_k, h)
            out, _ = torch.func.functional_call(
                module, self._mha_tensors(params, d_model), (q, k, v), {"attn_mask": mask_, "need_weights": False}
            )
            return out.reshape(*batch, n_q, -1)

    def layer_norm(self, x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        """§3.1's LayerNorm by ``nn.LayerNorm(d_model, eps=eps)`` with weight = gain, bias = bias (the given
        tensors)."""
        if not eps > 0:
            raise ValueError(f"eps: expected a positive float, got {eps!r}")
        with self._grad_mode():
            module = nn.LayerNorm(x.shape[-1], eps=float(eps), **self._factory(x))
            return torch.func.functional_call(module, {"weight": gain, "bias": bias}, (x,))

    @staticmethod
    def _norm_tensors(params: Mapping[str, Any], name: str) -> dict[str, torch.Tensor]:
        p = _param(params, name, "params (layer)")
        return {
            f"{name}.weight": _param(p, "gain", f"params['{name}']"),
            f"{name}.bias": _param(p, "bias", f"params['{name}']"),
        }

    @staticmethod
    def _ffn_tensors(params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        p = _param(params, "ffn", "params (layer)")
        return {
            "linear1.weight": _param(p, "w1", "params['ffn']").transpose(0, 1),  # (d_ff, d_model)
            "linear1.bias": _param(p, "b1", "params['ffn']"),
            "linear2.weight": _param(p, "w2", "params['ffn']").transpose(0, 1),  # (d_model, d_ff)
            "linear2.bias": _param(p, "b2", "params['ffn']"),
        }

    def _layer_tensors(self, params: Mapping[str, Any], attention: Mapping[str, str], norms: int, d_model: int):
        """A layer's canonical params as the module's parameters, the given tensors themselves (so that autograd
        reaches them through ``torch.func.functional_call``): ``attention`` maps the module's attribute to our
        key ("self_attn" -> "self_attn", "multihead_attn" -> "cross_attn")."""
        tensors: dict[str, torch.Tensor] = {}
        for attr, key in attention.items():
            mha = self._mha_tensors(_param(params, key, "params (layer)"), d_model)
            tensors |= {f"{attr}.{k}": v for k, v in mha.items()}
        for i in range(1, norms + 1):
            tensors |= self._norm_tensors(params, f"norm{i}")
        return tensors | self._ffn_tensors(params)

    def _run_layer(self, layer: nn.Module, tensors: dict[str, torch.Tensor], args: tuple, kwargs: dict) -> Any:
        """The layer on ``args``: with its parameters copied in under ``no_grad`` on the fast path (PyTorch's fused
        kernels read the module's own parameters and have no backward), else through ``functional_call``."""
        if self.fastpath:
            with torch.no_grad():
                for name, value in tensors.items():
                    layer.get_parameter(name).copy_(value)
                return self._mode(layer)(*args, **kwargs)
        return torch.func.functional_call(self._mode(layer), tensors, args, kwargs)

    def transformer_forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The built-in's forward pass (``torch_impl``) on these layers; on the fast path wholly without autograd (a
        graph through the embeddings alone would give the tied matrix one of its three gradients)."""
        with self._grad_mode():
            return super().transformer_forward(*args, **kwargs)

    def encoder_layer(
        self, x: torch.Tensor, params: Mapping[str, Any], num_heads: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """§3.1's encoder layer by ``nn.TransformerEncoderLayer`` (post-norm, ReLU, dropout 0, eps 1e-6)."""
        kwargs = self._layer_kwargs(params, num_heads)
        layer = nn.TransformerEncoderLayer(**kwargs)
        tensors = self._layer_tensors(params, {"self_attn": "self_attn"}, 2, kwargs["d_model"])
        batch, n = tuple(x.shape[:-2]), x.shape[-2]
        src_mask = self._attn_mask(mask, batch, n, n, layer.self_attn.num_heads)
        out = self._run_layer(layer, tensors, (_batched(x, batch),), {"src_mask": src_mask})
        return out.reshape(x.shape)

    def decoder_layer(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """§3.1's decoder layer by ``nn.TransformerDecoderLayer``; ``self_mask`` None = causal."""
        kwargs = self._layer_kwargs(params, num_heads)
        layer = nn.TransformerDecoderLayer(**kwargs)
        attention = {"self_attn": "self_attn", "multihead_attn": "cross_attn"}
        tensors = self._layer_tensors(params, attention, 3, kwargs["d_model"])
        n_tgt, n_src = y.shape[-2], memory.shape[-2]
        if self_mask is None:
            self_mask = self._causal(n_tgt)
        batch = tuple(torch.broadcast_shapes(y.shape[:-2], memory.shape[:-2]))
        h = layer.self_attn.num_heads
        masks = {
            "tgt_mask": self._attn_mask(self_mask, batch, n_tgt, n_tgt, h),
            "memory_mask": self._attn_mask(memory_mask, batch, n_tgt, n_src, h),
        }
        out = self._run_layer(layer, tensors, (_batched(y, batch), _batched(memory, batch)), masks)
        return out.reshape(*batch, n_tgt, -1)

    def encoder_layer_training(
        self, x: torch.Tensor, params: Mapping[str, Any], num_heads: int, p: float, seed: int, mask: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """§3.1's encoder layer by ``nn.TransformerEncoderLayer(dropout=p)`` in training mode, as PyTorch users train
        it: the output and the masks its ``dropout1`` and ``dropout2`` drew (the sub-layers' outputs, §5.4)."""
        kwargs = {**self._layer_kwargs(params, num_heads), "dropout": float(p)}
        layer = nn.TransformerEncoderLayer(**kwargs)
        tensors = self._layer_tensors(params, {"self_attn": "self_attn"}, 2, kwargs["d_model"])
        batch, n = tuple(x.shape[:-2]), x.shape[-2]
        src_mask = self._attn_mask(mask, batch, n, n, layer.self_attn.num_heads)
        out, masks = self._train_layer(
            layer, ("dropout1", "dropout2"), tensors, (_batched(x, batch),), {"src_mask": src_mask}, seed
        )
        return (out.reshape(x.shape), *(m.reshape(x.shape) for m in masks))

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
        """§3.1's decoder layer by ``nn.TransformerDecoderLayer(dropout=p)`` in training mode: the output and the masks
        its ``dropout1``, ``dropout2`` and ``dropout3`` drew."""
        kwargs = {**self._layer_kwargs(params, num_heads), "dropout": float(p)}
        layer = nn.TransformerDecoderLayer(**kwargs)
        tensors = self._layer_tensors(
            params, {"self_attn": "self_attn", "multihead_attn": "cross_attn"}, 3, kwargs["d_model"]
        )
        n_tgt, n_src = y.shape[-2], memory.shape[-2]
        if self_mask is None:
            self_mask = self._causal(n_tgt)
        batch = tuple(torch.broadcast_shapes(y.shape[:-2], memory.shape[:-2]))
        h = layer.self_attn.num_heads
        masks = {
            "tgt_mask": self._attn_mask(self_mask, batch, n_tgt, n_tgt, h),
            "memory_mask": self._attn_mask(memory_mask, batch, n_tgt, n_src, h),
        }
        out, kept = self._train_layer(
            layer,
            ("dropout1", "dropout2", "dropout3"),
            tensors,
            (_batched(y, batch), _batched(memory, batch)),
            masks,
            seed,
        )
        shape = (*batch, n_tgt, out.shape[-1])
        return (out.reshape(shape), *(m.reshape(shape) for m in kept))

    def _train_layer(
        self, layer: nn.Module, drops: tuple[str, ...], tensors: dict, args: tuple, kwargs: dict, seed: int
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The layer in training mode, PyTorch's generator seeded by ``seed`` (``torch.random.fork_rng``: the caller's
        state restored after), with the mask each of its ``drops`` modules (``nn.Dropout``) drew: each module's forward
        run through :func:`~aiayn.implementations.torch_impl.drawn_mask`, which reads it on ones from the same
        generator state."""
        seen: dict[str, torch.Tensor] = {}
        patched = []
        for name in drops:
            module = layer.get_submodule(name)

            def forward(t: torch.Tensor, module: nn.Module = module, name: str = name) -> torch.Tensor:
                y, seen[name] = drawn_mask(lambda a: type(module).forward(module, a), t)
                return y

            module.forward = forward
            patched.append(module)
        devices = [args[0].device] if args[0].device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(int(seed))
                out = torch.func.functional_call(layer.train(), tensors, args, kwargs)
        finally:
            for module in patched:
                del module.forward
        return out, [seen[name] for name in drops]


class TorchNNFastPath(TorchNNImplementation):
    """PyTorch's modules in eval mode, so that its fused inference kernels run (registry name ``"torch-nn-fastpath"``).

    What an inference server runs: ``nn.MultiheadAttention`` self-attention and
    ``nn.TransformerEncoderLayer`` take ``torch._native_multi_head_attention`` and
    ``torch._transformer_encoder_layer_fwd`` where PyTorch allows it (module docstring). Its
    declared policy is the modules' documented one (zeros for a fully masked row); the fused
    self-attention kernel gives NaN there instead, which is declared below and still checked.
    """

    name = "torch-nn-fastpath"
    known_deviations = MappingProxyType(
        {
            **TorchNNImplementation.known_deviations,
            "multi_head_attention_fully_masked_self_attention_row": (
                "PyTorch's fused inference kernel (torch._native_multi_head_attention) returns NaN for a fully masked "
                "query row of self-attention, where the documented forward of nn.MultiheadAttention (through "
                "scaled_dot_product_attention) returns 0; measured on the CPU in torch 2.13"
            ),
            "multi_head_attention_on_fixed_inputs[self-attention with a fully masked row]": (
                "the same fused kernel, on the fixed case with a fully masked self-attention row: NaN instead of the "
                "documented 0"
            ),
        }
    )

    # the fused kernels are inference's: training mode is the torch-nn row's
    encoder_layer_training = None  # type: ignore[assignment]
    decoder_layer_training = None  # type: ignore[assignment]
    transformer_forward_training = None  # type: ignore[assignment]

    def __init__(self, device: str | None = None) -> None:
        super().__init__(device, fastpath=True)
