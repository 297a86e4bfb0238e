"""transformers' BERT (``BertModel``'s parts) as the ``bert`` adapter: its attention and its encoder layer.

BERT's layer is the paper's post-norm encoder layer; what BERT documents doing differently from the
paper (GELU, learned positions, token types, a LayerNorm on the embeddings, eps 1e-12) is either
configurable (``hidden_act``, ``layer_norm_eps``) or outside the layer, so it is configured the
paper's way or not involved. Modules are built from a ``BertConfig`` with random weights (nothing is
downloaded), then the canonical weights are copied in:

- multi-head attention (§3.2.2) -> ``BertSelfAttention`` (``query``/``key``/``value`` = w_q^T,
  w_k^T, w_v^T; ``nn.Linear`` stores (out, in)) followed by W^O, which BERT keeps in
  ``BertSelfOutput.dense`` (w_o^T): only that projection is called, since ``BertSelfOutput``'s
  forward goes on with the residual and the LayerNorm of §3.1, which are not part of §3.2.2.
  Keys other than the queries go through BERT's cross-attention (BERT as a decoder); both take
  keys and values from one tensor: declared as ``Scope(shared_key_value=True)``. Absent biases are
  zero.
- LayerNorm: BERT's is ``nn.LayerNorm`` itself (``torch-nn`` checks it), so it is not provided here.
- encoder layer (§3.1) -> ``BertLayer`` (``hidden_act="relu"``, dropouts 0,
  ``layer_norm_eps = policies["layer_norm_eps"]`` = 1e-6): ``attention.self`` and
  ``attention.output.dense`` as above, ``attention.output.LayerNorm`` = norm1,
  ``intermediate.dense`` = w1^T, ``output.dense`` = w2^T, ``output.LayerNorm`` = norm2.

Masks: the contract's boolean mask becomes the prepared 4-D mask (B, 1, n_q, n_k) made by
transformers' ``create_bidirectional_mask`` (the mask as its ``and_mask_function``), the form the
configured attention function takes (boolean for "sdpa", BERT's default; 0 / ``finfo.min`` for
"eager"). Policies (measured, transformers 5.24, torch 2.13 CPU): a fully masked row gives zeros
with "sdpa" (PyTorch's safe softmax), the mean of the values with "eager". Dtypes: the kit's.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import transformers
from transformers import BertConfig
from transformers.models.bert import modeling_bert as mb

from aiayn.implementations.protocol import DEFAULT_POLICIES, Scope
from aiayn.implementations.torch_kit import TorchAdapter, batched, build, copy_layer_norm, copy_linear
from aiayn.implementations.zoo._hf import hf_mask

__all__ = ["Bert"]


class Bert(TorchAdapter):
    name = "bert"
    library = f"transformers {transformers.__version__}"
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "zeros"})
    scope = MappingProxyType({"multi_head_attention": Scope(shared_key_value=True)})

    def _config(self, d_model: int, heads: int, d_ff: int = 1) -> BertConfig:
        return BertConfig(
            vocab_size=1,
            hidden_size=d_model,
            num_hidden_layers=1,
            num_attention_heads=heads,
            intermediate_size=d_ff,
            hidden_act="relu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=1,
            layer_norm_eps=float(self.policies["layer_norm_eps"]),
            pad_token_id=0,
            attn_implementation="sdpa",
        )  # BertModel's default

    @staticmethod
    def _load_attention(attn: Any, p: Mapping[str, Any]) -> None:
        """Canonical MHA params -> a ``BertAttention`` (its ``self`` projections and ``output.dense``)."""
        for proj, w, b in (("query", "w_q", "b_q"), ("key", "w_k", "b_k"), ("value", "w_v", "b_v")):
            copy_linear(getattr(attn.self, proj), p[w], p.get(b))
        copy_linear(attn.output.dense, p["w_o"], p.get("b_o"))

    @torch.no_grad()
    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        batch = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
        config = self._config(query.shape[-1], num_heads)
        cross = key is not query  # self-attention: one tensor
        attn = build(self, mb.BertAttention, config, layer_idx=0, is_cross_attention=cross, dtype=query.dtype)
        self._load_attention(attn, params)
        q = batched(query, batch)  # (B, n_q, d)
        kv = batched(key, batch) if cross else None  # (B, n_k, d)
        heads, _ = (
            attn.self(q, encoder_hidden_states=kv, attention_mask=hf_mask(config, mask, batch, q, kv))
            if cross
            else attn.self(q, attention_mask=hf_mask(config, mask, batch, q))
        )  # Concat(head_1..h): (B, n_q, d)
        return attn.output.dense(heads).reshape(
            *batch, query.shape[-2], -1
        )  # W^O only, not BertSelfOutput's residual + LayerNorm

    @torch.no_grad()
    def encoder_layer(self, x, params, num_heads, mask=None):
        ffn = params["ffn"]
        config = self._config(x.shape[-1], num_heads, ffn["w1"].shape[1])
        layer = build(self, mb.BertLayer, config, layer_idx=0, dtype=x.dtype)
        self._load_attention(layer.attention, params["self_attn"])
        copy_layer_norm(layer.attention.output.LayerNorm, params["norm1"])
        copy_layer_norm(layer.output.LayerNorm, params["norm2"])
        copy_linear(layer.intermediate.dense, ffn["w1"], ffn["b1"])  # (d_ff, d_model)
        copy_linear(layer.output.dense, ffn["w2"], ffn["b2"])  # (d_model, d_ff)
        batch = tuple(x.shape[:-2])
        h = batched(x, batch)  # (B, n, d)
        return layer(h, attention_mask=hf_mask(config, mask, batch, h)).reshape(x.shape)
