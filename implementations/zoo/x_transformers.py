"""lucidrains' x-transformers (``Attention``, ``Encoder``, ``Decoder``) configured as the paper, as the
``x-transformers`` adapter.

Configuration (every other feature off, as by default): ``pre_norm=False`` (post-norm, §3.1; the
final norm then is ``Identity``), ``ff_custom_activation=nn.ReLU()`` (the FFN's default is GELU),
``ff_mult = d_ff / d_model``, ``attn_dim_head = d_model / h``, no rotary or relative positions,
no GLU, ``norm_add_unit_offset=False`` (the LayerNorm gain is stored as is, not as gain - 1),
``attn_project_out=True`` (with one head ``Attention`` would otherwise drop W^O), dropouts 0,
``flash=False`` (the default path). Depth 1: ``Encoder`` is one encoder layer (self-attention,
feed-forward), ``Decoder(cross_attend=True)`` one decoder layer (causal self-attention,
cross-attention, feed-forward). Weights: ``to_q``/``to_k``/``to_v``/``to_out`` = w_q^T, w_k^T,
w_v^T, w_o^T (``nn.Linear`` stores (out, in)); the FFN's two ``nn.Linear`` = w1^T, b1, w2^T, b2;
each sub-layer's ``post_main_norm.gamma`` = gain. Modules are built directly, nothing downloaded.

Scope (``Scope.no_bias``, ``shared_key_value``): its attention projections have no biases
(``LinearNoBias``; the paper's §3.2.2 has none either), its ``LayerNorm`` has no bias (its
docstring: "bias-less layernorm has been shown to be more stable"), with eps fixed at
``nn.LayerNorm``'s 1e-5 (declared as the layers' eps; the paper gives none), and keys and values
come from one tensor (``context``). The suite draws those parameters bias-free and key = value.

Masks: the contract's mask (True = may attend) is x-transformers' ``attn_mask`` convention; it is
passed as (B, 1, n_q, n_k) (a 3-D ``attn_mask`` would be read as (h, i, j)). ``mask=`` is not used:
it is a sequence mask that also zeroes the outputs of masked query positions. Cross-attention takes
only a key-padding ``context_mask`` (B, n_src); other memory masks are ``Unsupported`` (the suite
draws padding masks there). A given
decoder ``self_mask`` is used as is (``causal=False`` in that call); none means the Decoder's own
causal mask. Policy: a fully masked row gives zeros (``Attend`` zeroes such rows explicitly;
measured). Dtypes: the kit's (float64, float32 on the CPU).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from x_transformers import Attention, Decoder, Encoder

from aiayn.implementations.protocol import DEFAULT_POLICIES, Scope, Unsupported
from aiayn.implementations.torch_kit import TorchAdapter, attention_mask, batched, build, copy_linear, padding_from_mask

__all__ = ["XTransformers"]


def _load_attention(m: Attention, p: Mapping[str, Any]) -> None:
    for proj, w, b in (
        ("to_q", "w_q", "b_q"),
        ("to_k", "w_k", "b_k"),
        ("to_v", "w_v", "b_v"),
        ("to_out", "w_o", "b_o"),
    ):
        copy_linear(getattr(m, proj), p[w], p.get(b))  # no bias in the module: a non-zero one raises


class XTransformers(TorchAdapter):
    name = "x-transformers"
    library = f"x-transformers {importlib.metadata.version('x-transformers')}"
    policies: Mapping[str, object] = MappingProxyType(
        {**DEFAULT_POLICIES, "fully_masked": "zeros", "layer_norm_eps": 1e-5}
    )
    scope = MappingProxyType(
        {
            "multi_head_attention": Scope(no_bias=("attention",), shared_key_value=True),
            "encoder_layer": Scope(no_bias=("attention", "layer_norm")),
            "decoder_layer": Scope(no_bias=("attention", "layer_norm")),
        }
    )

    def _layers(self, cls: type, params: Mapping[str, Any], heads: int, dtype: torch.dtype, **kw: Any) -> Any:
        d_model, d_ff = params["ffn"]["w1"].shape
        layers = build(
            self,
            cls,
            dim=d_model,
            depth=1,
            heads=heads,
            attn_dim_head=d_model // heads,
            attn_project_out=True,
            pre_norm=False,
            ff_mult=d_ff / d_model,
            ff_custom_activation=nn.ReLU(),
            norm_add_unit_offset=False,
            dtype=dtype,
            **kw,
        )
        names = ["self_attn", "cross_attn", "ffn"] if len(layers.layers) == 3 else ["self_attn", "ffn"]
        for i, ((norms, block, _), name) in enumerate(zip(layers.layers, names)):
            norm = params[f"norm{i + 1}"]
            if bool(torch.any(norm["bias"] != 0)):
                raise ValueError(
                    "x-transformers' LayerNorm has no bias (gamma only), but the canonical one is non-zero"
                )
            norms[2].gamma.copy_(norm["gain"])  # post_main_norm (post-norm)
            if name == "ffn":
                w_in, w_out = (m for m in block.modules() if isinstance(m, nn.Linear))
                copy_linear(w_in, params["ffn"]["w1"], params["ffn"]["b1"])  # (d_ff, d_model)
                copy_linear(w_out, params["ffn"]["w2"], params["ffn"]["b2"])  # (d_model, d_ff)
            else:
                _load_attention(block, params[name])
        return layers

    @torch.no_grad()
    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        d_model, d_k = params["w_q"].shape[0], params["w_q"].shape[1] // num_heads
        m = build(
            self,
            Attention,
            d_model,
            dim_head=d_k,
            value_dim_head=params["w_v"].shape[1] // num_heads,
            heads=num_heads,
            project_out=True,
            dtype=query.dtype,
        )
        _load_attention(m, params)
        batch = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
        q = batched(query, batch)  # (B, n_q, d)
        context = None if key is query else batched(key, batch)  # (B, n_k, d); self-attention: one tensor
        out = m(
            q,
            context=context,
            attn_mask=attention_mask(mask, batch, query.shape[-2], key.shape[-2], 1, "heads", kind="allow"),
        )
        return out.reshape(*batch, query.shape[-2], -1)

    @torch.no_grad()
    def encoder_layer(self, x, params, num_heads, mask=None):
        enc = self._layers(Encoder, params, num_heads, x.dtype)
        batch, n = tuple(x.shape[:-2]), x.shape[-2]
        return enc(batched(x, batch), attn_mask=attention_mask(mask, batch, n, n, 1, "heads", kind="allow")).reshape(
            x.shape
        )

    @torch.no_grad()
    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):
        dec = self._layers(Decoder, params, num_heads, y.dtype, cross_attend=True)
        batch = tuple(torch.broadcast_shapes(y.shape[:-2], memory.shape[:-2]))
        t, s = batched(y, batch), batched(memory, batch)  # (B, n_tgt, d), (B, n_src, d)
        context_mask = padding_from_mask(memory_mask, t.shape[0])  # (B, n_src)
        if memory_mask is not None and context_mask is None:
            raise Unsupported("x-transformers' cross-attention takes a key-padding mask (context_mask) only")
        n = t.shape[1]
        self_kw = (
            {}
            if self_mask is None
            else {"attn_mask": attention_mask(self_mask, batch, n, n, 1, "heads", kind="allow"), "causal": False}
        )
        return dec(t, context=s, context_mask=context_mask, **self_kw).reshape(*batch, n, -1)
