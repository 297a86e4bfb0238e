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

The whole model and decoding (§3.2.3): ``TransformerWrapper`` over an ``Encoder`` and a
``Decoder(cross_attend=True)`` of the canonical depth, ``scaled_sinu_pos_emb=True`` (x-transformers' sinusoids,
``ScaledSinusoidalEmbedding``, its learned scale loaded as 1: cat((sin, cos)), sin and cos in two halves, declared as a
known deviation; its frequencies are float32 in any dtype, so the whole model is declared in float32 only), the token
embedding holding sqrt(d_model) E and an untied ``to_logits`` E (§3.4). ``decode_step`` is the decoder wrapper with
x-transformers' own cache (``cache=``, ``return_intermediates=True``, ``input_not_include_cache=True`` so that a step
gets only its new tokens, positions offset by the cache length, ``cache_age`` = the step's token count);
``reorder_cache`` is x-transformers' ``modify_cached_kv``. Its ``AutoregressiveWrapper.beam_search`` has no EOS ("eos
token not supported yet") and no length penalty: no §6.1 beam search to check (``beam_search`` not provided).

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
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from x_transformers import Attention, Decoder, Encoder, TransformerWrapper
from x_transformers.autoregressive_wrapper import modify_cached_kv

from aiayn.implementations.protocol import DEFAULT_POLICIES, Scope, Unsupported
from aiayn.implementations.torch_kit import TorchAdapter, attention_mask, batched, build, copy_linear, padding_from_mask

__all__ = ["XTransformers"]

_HALVES = (
    "x-transformers' ScaledSinusoidalEmbedding (its sinusoidal positions) returns cat((sin, cos), dim=-1): sin and cos "
    "in two halves (§3.5 interleaves them)"
)
_POSITIONS = 4096


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
            "transformer_forward": Scope(
                no_bias=("attention", "layer_norm"),
                dtypes=("float32",),
                note="ScaledSinusoidalEmbedding's frequencies are float32 (arange(half_dim).float()) in any dtype: no "
                "float64 claim",
            ),
        }
    )
    known_deviations = MappingProxyType(
        {
            f"{test}@float32": _HALVES
            for test in (
                "transformer_forward",
                "transformer_forward_on_fixed_inputs[N=1, d 8, h 2, vocab 11, no padding]",
                "transformer_forward_on_fixed_inputs[padding: src [5, 3], tgt [4, 2]]",
                "cached_decoding_equals_the_full_forward",
                "reordered_cache_equals_the_reordered_prefixes",
            )
        }
    )

    @staticmethod
    def _stack_config(params: Mapping[str, Any], heads: int, depth: int) -> dict[str, Any]:
        d_model, d_ff = params["ffn"]["w1"].shape
        return {
            "dim": d_model,
            "depth": depth,
            "heads": heads,
            "attn_dim_head": d_model // heads,
            "attn_project_out": True,
            "pre_norm": False,
            "ff_mult": d_ff / d_model,
            "ff_custom_activation": nn.ReLU(),
            "norm_add_unit_offset": False,
        }

    @staticmethod
    def _load(layers: Any, params: Sequence[Mapping[str, Any]]) -> None:
        """The canonical layers ``params`` into an ``Encoder``/``Decoder``'s flat list of sub-layers (two per encoder
        layer: self-attention, feed-forward; three per decoder layer: self-attention, cross-attention, feed-forward)."""
        per = 3 if "cross_attn" in params[0] else 2
        names = ["self_attn", "cross_attn", "ffn"] if per == 3 else ["self_attn", "ffn"]
        for j, (norms, block, _) in enumerate(layers.layers):
            p, i = params[j // per], j % per
            name, norm = names[i], params[j // per][f"norm{i + 1}"]
            if bool(torch.any(norm["bias"] != 0)):
                raise ValueError(
                    "x-transformers' LayerNorm has no bias (gamma only), but the canonical one is non-zero"
                )
            norms[2].gamma.copy_(norm["gain"])  # post_main_norm (post-norm)
            if name == "ffn":
                w_in, w_out = (m for m in block.modules() if isinstance(m, nn.Linear))
                copy_linear(w_in, p["ffn"]["w1"], p["ffn"]["b1"])  # (d_ff, d_model)
                copy_linear(w_out, p["ffn"]["w2"], p["ffn"]["b2"])  # (d_model, d_ff)
            else:
                _load_attention(block, p[name])

    def _layers(self, cls: type, params: Mapping[str, Any], heads: int, dtype: torch.dtype, **kw: Any) -> Any:
        layers = build(self, cls, **self._stack_config(params, heads, 1), dtype=dtype, **kw)
        self._load(layers, [params])
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

    # decoding (implementations/protocol.py, "Decoding"): x-transformers' TransformerWrapper and its key-value cache

    def _wrapper(self, layers: Any, params: Mapping[str, Any], **kw: Any) -> TransformerWrapper:
        """A ``TransformerWrapper`` over ``layers`` with the canonical embedding: its token embedding holds
        sqrt(d_model) E (§3.4's scaled lookup, one rounding as the paper's), its sinusoidal positions scale 1, its
        untied ``to_logits`` E (§3.4's shared matrix; x-transformers' tied logits would rescale by
        ``tie_embedding_scale``)."""
        emb = params["embedding"]  # (vocab, d_model)
        vocab, d_model = emb.shape
        wrapper = build(
            self,
            TransformerWrapper,
            num_tokens=vocab,
            max_seq_len=_POSITIONS,  # sinusoids have no table; 0 would switch positions off
            attn_layers=layers,
            scaled_sinu_pos_emb=True,
            tie_embedding=False,
            dtype=emb.dtype,
            **kw,
        )
        wrapper.token_emb.emb.weight.copy_(emb * math.sqrt(d_model))
        wrapper.pos_emb.scale.fill_(1.0)  # x-transformers learns this scale (initialised d^-1/2); §3.5 has none
        if wrapper.to_logits is not None:
            wrapper.to_logits.weight.copy_(emb)  # nn.Linear (vocab, d_model): logits = y E^T
        return wrapper

    def _held(self, params: Mapping[str, Any], num_heads: int) -> tuple[TransformerWrapper, TransformerWrapper]:
        """(encoder, decoder) ``TransformerWrapper``s with the canonical weights, built once for a decode (the same
        ``params`` object, step after step) and held with it."""
        held = getattr(self, "_decoder", None)
        if held is None or held[0] is not params or held[1] != num_heads:
            dtype = params["embedding"].dtype
            encoder = Encoder(**self._stack_config(params["encoder"][0], num_heads, len(params["encoder"])))
            self._load(encoder, params["encoder"])
            decoder = Decoder(
                **self._stack_config(params["decoder"][0], num_heads, len(params["decoder"])), cross_attend=True
            )
            self._load(decoder, params["decoder"])
            held = (
                params,
                num_heads,
                self._wrapper(encoder.to(dtype), params, return_only_embed=True),
                self._wrapper(decoder.to(dtype), params, input_not_include_cache=True),
            )
            self._decoder = held
        return held[2], held[3]

    @staticmethod
    def _padding(n: int, lengths: torch.Tensor | None, batch: int, device: Any) -> torch.Tensor | None:
        """x-transformers' key-padding ``context_mask`` (B, n), True = a token; None without lengths."""
        if lengths is None:
            return None
        return torch.arange(n, device=device)[None, :] < lengths[:, None]

    @torch.no_grad()
    def encode(self, src_tokens, params, num_heads, src_lengths=None):
        encoder, _ = self._held(params, num_heads)
        b, n = src_tokens.shape
        keys = self._padding(n, src_lengths, b, src_tokens.device)  # (B, n_src)
        mask = None if keys is None else attention_mask(keys[:, None, :], (b,), n, n, 1, "heads", kind="allow")
        return encoder(src_tokens, attn_mask=mask, return_embeddings=True)  # (B, n_src, d_model)

    @torch.no_grad()
    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):
        if "positional" in params:
            raise ValueError(
                "the adapter builds x-transformers' sinusoidal positions; learned ones (params['positional']) are not "
                "loaded"
            )
        _, decoder = self._held(params, num_heads)
        memory = self.encode(src_tokens, params, num_heads, src_lengths)
        b, n = tgt_tokens.shape
        self_kw = {}
        if tgt_lengths is not None:  # causal and the target's padding, as one mask (the Decoder's own causal off)
            allowed = (
                torch.ones(n, n, dtype=torch.bool, device=tgt_tokens.device).tril()[None]
                & (self._padding(n, tgt_lengths, b, tgt_tokens.device)[:, None, :])
            )  # (B, n, n)
            self_kw = {"attn_mask": attention_mask(allowed, (b,), n, n, 1, "heads", kind="allow"), "causal": False}
        return decoder(
            tgt_tokens,
            context=memory,
            context_mask=self._padding(memory.shape[1], src_lengths, b, memory.device),
            **self_kw,
        )  # (B, n_tgt, vocab)

    @torch.no_grad()
    def decode_step(self, tokens, memory, params, num_heads, cache=None, src_lengths=None):
        _, decoder = self._held(params, num_heads)
        b, k = tokens.shape
        logits, cache = decoder(
            tokens,
            context=memory,
            context_mask=self._padding(memory.shape[1], src_lengths, b, memory.device),
            cache=cache,
            cache_age=k,  # the new positions the layers compute (x-transformers' default: 1)
            return_intermediates=True,
        )
        return logits, cache  # (B, k, vocab); x-transformers' LayerIntermediates of c + k positions

    @torch.no_grad()
    def reorder_cache(self, cache, index):
        modify_cached_kv(cache, lambda t: t[index])  # in place: every layer's cached keys and values, rows index
        return cache
