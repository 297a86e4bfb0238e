"""transformers' Marian (``MarianMTModel``), the Hugging Face model closest to the paper, as the ``marian`` adapter.

Marian is a post-norm encoder-decoder with sinusoidal positions, embeddings scaled by
sqrt(d_model) (``scale_embedding=True``) and one embedding matrix shared by encoder, decoder and
output projection. Every module is built from a ``MarianConfig`` with random weights (nothing is
downloaded), then the canonical weights are copied in:

- multi-head attention (§3.2.2) -> ``MarianAttention``: ``q_proj``/``k_proj``/``v_proj``/
  ``out_proj`` hold w_q^T, w_k^T, w_v^T, w_o^T (``nn.Linear`` stores (out, in)); absent biases are
  zero. It projects d_model -> d_model and takes keys and values from one tensor
  (``key_value_states``): a value different from the key is ``Unsupported``.
- positional encoding (§3.5) -> ``MarianSinusoidalPositionalEmbedding``, its table made by its own
  ``create_weight`` (what ``MarianPreTrainedModel`` does at initialisation), read through
  ``forward``. It lays sin and cos out in two halves; the adapter leaves that to the suite.
- encoder / decoder layer (§3.1) -> ``MarianEncoderLayer`` / ``MarianDecoderLayer``
  (``activation_function="relu"``, every dropout 0): ``self_attn``, ``encoder_attn``, ``fc1``/
  ``fc2`` (w1^T, w2^T), ``self_attn_layer_norm``/``encoder_attn_layer_norm``/``final_layer_norm``.
- the whole model (Figure 1) -> ``MarianMTModel``: ``model.shared`` = the embedding (tied to both
  ``embed_tokens`` and ``lm_head``), ``final_logits_bias`` = 0, Marian's own static sinusoids.
  Lengths become the 2-D ``attention_mask`` / ``decoder_attention_mask`` the model documents.

Masks: the contract's boolean mask (True = may attend) becomes the prepared 4-D mask
(B, 1, n_q, n_k) through transformers' own ``create_bidirectional_mask`` (the given mask as its
``and_mask_function``), so it takes the form the configured attention function expects: boolean for
"sdpa" (the default ``MarianMTModel`` picks), 0 / ``finfo(dtype).min`` additive for "eager". A
decoder layer without ``self_mask`` gets ``create_causal_mask``'s mask, as ``MarianDecoder`` makes it.

Policies (measured, transformers 5.24, torch 2.13 CPU): a fully masked row gives zeros with "sdpa"
(``scaled_dot_product_attention``'s safe softmax) and the mean of the values with "eager" (a
finite mask value). ``layer_norm_eps`` = 1e-5: Marian's LayerNorms are ``nn.LayerNorm(d_model)``,
PyTorch's default eps, not configurable (the paper gives none). Dtypes: the kit's (float64, float32
on the CPU); modules are built in float32 and moved to the input dtype (``build``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import transformers
from transformers import MarianConfig, MarianMTModel
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.models.marian import modeling_marian as mm

from aiayn.implementations.protocol import DEFAULT_POLICIES, Unsupported
from aiayn.implementations.torch_impl import TORCH_DTYPES
from aiayn.implementations.torch_kit import TorchAdapter, attention_mask, build, copy_linear

__all__ = ["Marian"]


def _flat(t: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """(..., n, d) broadcast to batch + (n, d), as the (B, n, d) HF modules take."""
    return t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])


def hf_mask(config: Any, mask: torch.Tensor | None, batch: tuple[int, ...], q: torch.Tensor, kv: torch.Tensor | None = None) -> Any:
    """The contract's mask (broadcastable to batch + (n_q, n_k)) as transformers prepares it for ``config``'s attention."""
    if mask is None:
        return None
    full = attention_mask(mask, batch, q.shape[-2], (q if kv is None else kv).shape[-2], kind="allow")  # (B, n_q, n_k)
    return create_bidirectional_mask(config=config, inputs_embeds=q, attention_mask=None, encoder_hidden_states=kv,
                                     and_mask_function=lambda b, h, i, j: full[b, i, j])


class Marian(TorchAdapter):
    name = "marian"
    library = f"transformers {transformers.__version__}"
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "zeros", "layer_norm_eps": 1e-5})

    def __init__(self, device: str | None = None, *, attention: str = "sdpa") -> None:
        super().__init__(device)
        self.attention = attention  # transformers' attn_implementation: "sdpa" (MarianMTModel's default) or "eager"
        if attention != "sdpa":
            self.name, self.policies = f"marian-{attention}", MappingProxyType({**self.policies, "fully_masked": "uniform"})

    def _config(self, d_model: int, heads: int, d_ff: int = 1, vocab: int = 1, enc: int = 1, dec: int = 1, positions: int = 1) -> MarianConfig:
        return MarianConfig(vocab_size=vocab, d_model=d_model, encoder_layers=enc, decoder_layers=dec, encoder_attention_heads=heads,
                            decoder_attention_heads=heads, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff, max_position_embeddings=positions,
                            activation_function="relu", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
                            pad_token_id=0, decoder_start_token_id=0, eos_token_id=0, forced_eos_token_id=None, use_cache=False,
                            attn_implementation=self.attention)

    @staticmethod
    def _load_attention(m: Any, p: Mapping[str, Any]) -> None:
        if p["w_q"].shape[-1] != p["w_q"].shape[0] or p["w_v"].shape[-1] != p["w_v"].shape[0]:
            raise Unsupported("MarianAttention projects d_model -> d_model (h d_k = h d_v = d_model)")
        for proj, w, b in (("q_proj", "w_q", "b_q"), ("k_proj", "w_k", "b_k"), ("v_proj", "w_v", "b_v"), ("out_proj", "w_o", "b_o")):
            copy_linear(getattr(m, proj), p[w], p.get(b))

    @staticmethod
    def _load_norm(norm: torch.nn.LayerNorm, p: Mapping[str, Any]) -> None:
        norm.weight.copy_(p["gain"])
        norm.bias.copy_(p["bias"])

    def _load_layer(self, layer: Any, p: Mapping[str, Any]) -> None:
        self._load_attention(layer.self_attn, p["self_attn"])
        self._load_norm(layer.self_attn_layer_norm, p["norm1"])
        if "cross_attn" in p:
            self._load_attention(layer.encoder_attn, p["cross_attn"])
            self._load_norm(layer.encoder_attn_layer_norm, p["norm2"])
        copy_linear(layer.fc1, p["ffn"]["w1"], p["ffn"]["b1"])  # (d_ff, d_model)
        copy_linear(layer.fc2, p["ffn"]["w2"], p["ffn"]["b2"])  # (d_model, d_ff)
        self._load_norm(layer.final_layer_norm, p["norm3" if "cross_attn" in p else "norm2"])

    def _layer_config(self, p: Mapping[str, Any], heads: int) -> MarianConfig:
        return self._config(p["ffn"]["w1"].shape[0], heads, p["ffn"]["w1"].shape[1])

    @torch.no_grad()
    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        if not torch.equal(key, value):
            raise Unsupported("MarianAttention takes keys and values from one tensor (key_value_states)")
        batch = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
        config = self._config(query.shape[-1], num_heads)
        m = build(self, mm.MarianAttention, query.shape[-1], num_heads, bias=True, config=config, layer_idx=0, dtype=query.dtype)
        self._load_attention(m, params)
        q = _flat(query, batch)  # (B, n_q, d)
        kv = None if query.shape == key.shape and torch.equal(query, key) else _flat(key, batch)  # (B, n_k, d): cross-attention
        out, _ = m(q, key_value_states=kv, attention_mask=hf_mask(config, mask, batch, q, kv))
        return out.reshape(*batch, query.shape[-2], -1)

    @torch.no_grad()
    def positional_encoding(self, length, d_model, dtype):
        m = build(self, mm.MarianSinusoidalPositionalEmbedding, max(length, 1), d_model, dtype=TORCH_DTYPES[self.check_dtype(dtype)])
        m.weight.copy_(m.create_weight())  # the table MarianPreTrainedModel._init_weights puts there
        return m((1, length))  # (length, d_model)

    @torch.no_grad()
    def encoder_layer(self, x, params, num_heads, mask=None):
        config = self._layer_config(params, num_heads)
        layer = build(self, mm.MarianEncoderLayer, config, layer_idx=0, dtype=x.dtype)
        self._load_layer(layer, params)
        h = _flat(x, tuple(x.shape[:-2]))  # (B, n, d)
        return layer(h, attention_mask=hf_mask(config, mask, tuple(x.shape[:-2]), h)).reshape(x.shape)

    @torch.no_grad()
    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):
        config = self._layer_config(params, num_heads)
        layer = build(self, mm.MarianDecoderLayer, config, layer_idx=0, dtype=y.dtype)
        self._load_layer(layer, params)
        batch = tuple(torch.broadcast_shapes(y.shape[:-2], memory.shape[:-2]))
        t, s = _flat(y, batch), _flat(memory, batch)  # (B, n_tgt, d), (B, n_src, d)
        causal = create_causal_mask(config=config, inputs_embeds=t, attention_mask=torch.ones(t.shape[:2], device=t.device), cache=None)
        out = layer(t, attention_mask=causal if self_mask is None else hf_mask(config, self_mask, batch, t), encoder_hidden_states=s,
                    encoder_attention_mask=hf_mask(config, memory_mask, batch, t, s), use_cache=False)
        return out.reshape(*batch, y.shape[-2], -1)

    @torch.no_grad()
    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):
        if "positional" in params:
            raise ValueError("Marian has static sinusoidal positions only; learned positions (params['positional']) are not supported")
        emb = params["embedding"]  # (vocab, d_model)
        d_ff = params["encoder"][0]["ffn"]["w1"].shape[1]
        config = self._config(emb.shape[1], num_heads, d_ff, emb.shape[0], len(params["encoder"]), len(params["decoder"]),
                              max(src_tokens.shape[1], tgt_tokens.shape[1]))
        model = build(self, MarianMTModel, config, dtype=emb.dtype)
        model.model.shared.weight.copy_(emb)  # tied: encoder and decoder embed_tokens, lm_head
        model.final_logits_bias.zero_()
        for layer, p in zip(model.model.encoder.layers, params["encoder"]):
            self._load_layer(layer, p)
        for layer, p in zip(model.model.decoder.layers, params["decoder"]):
            self._load_layer(layer, p)

        def padding(tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor | None:  # (B, n), 1 = a token
            return None if lengths is None else (torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None]).long()

        out = model(input_ids=src_tokens, attention_mask=padding(src_tokens, src_lengths), decoder_input_ids=tgt_tokens,
                    decoder_attention_mask=padding(tgt_tokens, tgt_lengths), use_cache=False)
        return out.logits  # (B, n_tgt, vocab)
