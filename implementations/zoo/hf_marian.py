"""transformers' Marian (``MarianMTModel``), the Hugging Face model closest to the paper, as the ``marian`` adapter.

Marian is a post-norm encoder-decoder with sinusoidal positions, embeddings scaled by
sqrt(d_model) (``scale_embedding=True``) and one embedding matrix shared by encoder, decoder and
output projection. Every module is built from a ``MarianConfig`` with random weights (nothing is
downloaded), then the canonical weights are copied in:

- multi-head attention (§3.2.2) -> ``MarianAttention``: ``q_proj``/``k_proj``/``v_proj``/
  ``out_proj`` hold w_q^T, w_k^T, w_v^T, w_o^T (``nn.Linear`` stores (out, in)); absent biases are
  zero. It projects d_model -> d_model and takes keys and values from one tensor
  (``key_value_states``): declared as ``Scope(shared_key_value=True)``.
- positional encoding (§3.5) -> ``MarianSinusoidalPositionalEmbedding``, its table made by its own
  ``create_weight`` (what ``MarianPreTrainedModel`` does at initialisation), read through
  ``forward``. Its docstring documents the layout: "features are not interleaved. The cos features
  are in the 2nd half of the vector" (§3.5 interleaves them): a known deviation, declared in
  float32 for the table and the whole model, and diagnosed as 'sin and cos in two halves'.
  ``create_weight`` also rounds the table to float32 (``torch.FloatTensor``) whatever the model's
  dtype, undocumented: the table and the whole model are declared in scope for float32 only (the
  scope's note says why). Checked in float64 they fail by the halves and the float32 rounding
  together, a pair the catalogue does not name (its budgets are laid out as the paper's table).
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

Decoding (§3.2.3, §6.1): ``encode`` is ``model.encoder``; ``decode_step`` is ``MarianMTModel``'s forward with
``encoder_outputs``, ``cache`` (transformers' ``EncoderDecoderCache``: self-attention keys and values grown step by
step, cross-attention ones computed at the first step) and ``use_cache=True``; ``reorder_cache`` is the cache's own
``reorder_cache``. Its steps embed with the same table in two halves (declared as for the whole model). The model is
built once per decode (``_held``). ``beam_search`` is ``generate(num_beams=k, length_penalty=alpha,
early_stopping="never")``, one sentence at a time (one ``max_new_tokens`` each), the score its ``sequences_scores``:
log P / |Y|^alpha, transformers' documented penalty, not §6.1's ((5 + |Y|) / 6)^alpha; that departure is left to the
suite to name. With one beam ``generate`` is greedy search, which returns no score: the adapter sums
``compute_transition_scores(normalize_logits=True)`` and divides by |Y|^alpha, the reconstruction transformers
documents.

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
from transformers import GenerationConfig, MarianConfig, MarianMTModel
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.marian import modeling_marian as mm

from aiayn.implementations.protocol import DEFAULT_POLICIES, Scope
from aiayn.implementations.torch_impl import TORCH_DTYPES
from aiayn.implementations.torch_kit import TorchAdapter, batched, build, copy_layer_norm, copy_linear
from aiayn.implementations.zoo._hf import hf_mask

__all__ = ["Marian"]

_HALVES = (
    "transformers documents MarianSinusoidalPositionalEmbedding.create_weight: 'features are not interleaved. The cos "
    "features are in the 2nd half of the vector' (§3.5 interleaves sin and cos)"
)


class Marian(TorchAdapter):
    name = "marian"
    library = f"transformers {transformers.__version__}"
    policies: Mapping[str, object] = MappingProxyType(
        {
            **DEFAULT_POLICIES,
            "fully_masked": "zeros",
            "layer_norm_eps": 1e-5,
            # generate(num_beams=k, early_stopping="never"): a candidate ending in EOS finishes among the best k
            # of its step; the search stops when no running beam can beat the finished ones at the maximum length
            # (transformers' "canonical beam search"); beams still running at the maximum length finish; |Y| counts
            # the generated tokens, EOS included (cur_len + 1 - decoder_prompt_len)
            "beam_search": MappingProxyType(
                {"eos_rank": "k", "early_stop": "bound", "at_max_length": "finished", "length_counts": "eos"}
            ),
        }
    )
    _f32 = Scope(
        dtypes=("float32",), note="table rounded to float32 by create_weight (torch.FloatTensor): no float64 claim"
    )
    scope = MappingProxyType(
        {"multi_head_attention": Scope(shared_key_value=True), "positional_encoding": _f32, "transformer_forward": _f32}
    )
    known_deviations = MappingProxyType(
        {
            f"{test}@float32": _HALVES
            for test in (
                "positional_encoding",
                "positional_encoding_pairs_rotate_by_k",
                "positional_encoding_on_fixed_inputs[length 50, d_model 16]",
                "positional_encoding_on_fixed_inputs[length 2048, d_model 64]",
                "transformer_forward",
                "transformer_forward_on_fixed_inputs[N=1, d 8, h 2, vocab 11, no padding]",
                "transformer_forward_on_fixed_inputs[padding: src [5, 3], tgt [4, 2]]",
                # the cached decoder embeds its steps with the same table
                "cached_decoding_equals_the_full_forward",
                "reordered_cache_equals_the_reordered_prefixes",
            )
        }
    )

    def _config(
        self, d_model: int, heads: int, d_ff: int = 1, vocab: int = 1, enc: int = 1, dec: int = 1, positions: int = 1
    ) -> MarianConfig:
        return MarianConfig(
            vocab_size=vocab,
            d_model=d_model,
            encoder_layers=enc,
            decoder_layers=dec,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=d_ff,
            decoder_ffn_dim=d_ff,
            max_position_embeddings=positions,
            activation_function="relu",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            scale_embedding=True,
            pad_token_id=0,
            decoder_start_token_id=0,
            eos_token_id=0,
            forced_eos_token_id=None,
            use_cache=False,
            attn_implementation="sdpa",
        )  # MarianMTModel's default

    @staticmethod
    def _load_attention(m: Any, p: Mapping[str, Any]) -> None:
        for proj, w, b in (
            ("q_proj", "w_q", "b_q"),
            ("k_proj", "w_k", "b_k"),
            ("v_proj", "w_v", "b_v"),
            ("out_proj", "w_o", "b_o"),
        ):
            copy_linear(getattr(m, proj), p[w], p.get(b))

    def _load_layer(self, layer: Any, p: Mapping[str, Any]) -> None:
        self._load_attention(layer.self_attn, p["self_attn"])
        copy_layer_norm(layer.self_attn_layer_norm, p["norm1"])
        if "cross_attn" in p:
            self._load_attention(layer.encoder_attn, p["cross_attn"])
            copy_layer_norm(layer.encoder_attn_layer_norm, p["norm2"])
        copy_linear(layer.fc1, p["ffn"]["w1"], p["ffn"]["b1"])  # (d_ff, d_model)
        copy_linear(layer.fc2, p["ffn"]["w2"], p["ffn"]["b2"])  # (d_model, d_ff)
        copy_layer_norm(layer.final_layer_norm, p["norm3" if "cross_attn" in p else "norm2"])

    def _layer_config(self, p: Mapping[str, Any], heads: int) -> MarianConfig:
        return self._config(p["ffn"]["w1"].shape[0], heads, p["ffn"]["w1"].shape[1])

    @torch.no_grad()
    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        batch = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
        config = self._config(query.shape[-1], num_heads)
        m = build(
            self,
            mm.MarianAttention,
            query.shape[-1],
            num_heads,
            bias=True,
            config=config,
            layer_idx=0,
            dtype=query.dtype,
        )
        self._load_attention(m, params)
        q = batched(query, batch)  # (B, n_q, d)
        kv = None if key is query else batched(key, batch)  # (B, n_k, d): cross-attention (self-attention: one tensor)
        out, _ = m(q, key_value_states=kv, attention_mask=hf_mask(config, mask, batch, q, kv))
        return out.reshape(*batch, query.shape[-2], -1)

    @torch.no_grad()
    def positional_encoding(self, length, d_model, dtype):
        m = build(
            self,
            mm.MarianSinusoidalPositionalEmbedding,
            max(length, 1),
            d_model,
            dtype=TORCH_DTYPES[self.check_dtype(dtype)],
        )
        m.weight.copy_(m.create_weight())  # the table MarianPreTrainedModel._init_weights puts there
        return m((1, length))  # (length, d_model)

    @torch.no_grad()
    def encoder_layer(self, x, params, num_heads, mask=None):
        config = self._layer_config(params, num_heads)
        layer = build(self, mm.MarianEncoderLayer, config, layer_idx=0, dtype=x.dtype)
        self._load_layer(layer, params)
        h = batched(x, tuple(x.shape[:-2]))  # (B, n, d)
        return layer(h, attention_mask=hf_mask(config, mask, tuple(x.shape[:-2]), h)).reshape(x.shape)

    @torch.no_grad()
    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):
        config = self._layer_config(params, num_heads)
        layer = build(self, mm.MarianDecoderLayer, config, layer_idx=0, dtype=y.dtype)
        self._load_layer(layer, params)
        batch = tuple(torch.broadcast_shapes(y.shape[:-2], memory.shape[:-2]))
        t, s = batched(y, batch), batched(memory, batch)  # (B, n_tgt, d), (B, n_src, d)
        causal = create_causal_mask(
            config=config, inputs_embeds=t, attention_mask=torch.ones(t.shape[:2], device=t.device), cache=None
        )
        out = layer(
            t,
            attention_mask=causal if self_mask is None else hf_mask(config, self_mask, batch, t),
            encoder_hidden_states=s,
            encoder_attention_mask=hf_mask(config, memory_mask, batch, t, s),
            use_cache=False,
        )
        return out.reshape(*batch, y.shape[-2], -1)

    def _whole(self, params: Mapping[str, Any], num_heads: int, positions: int) -> MarianMTModel:
        """``MarianMTModel`` with the canonical weights and a table of ``positions`` rows (Marian's static sinusoids,
        each row the same whatever their number)."""
        if "positional" in params:
            raise ValueError(
                "Marian has static sinusoidal positions only; learned positions (params['positional']) are not "
                "supported"
            )
        emb = params["embedding"]  # (vocab, d_model)
        d_ff = params["encoder"][0]["ffn"]["w1"].shape[1]
        config = self._config(
            emb.shape[1], num_heads, d_ff, emb.shape[0], len(params["encoder"]), len(params["decoder"]), positions
        )
        model = build(self, MarianMTModel, config, dtype=emb.dtype)
        model.model.shared.weight.copy_(emb)  # tied: encoder and decoder embed_tokens, lm_head
        model.final_logits_bias.zero_()
        for layer, p in zip(model.model.encoder.layers, params["encoder"]):
            self._load_layer(layer, p)
        for layer, p in zip(model.model.decoder.layers, params["decoder"]):
            self._load_layer(layer, p)
        return model

    def _held(self, params: Mapping[str, Any], num_heads: int, positions: int) -> MarianMTModel:
        """:meth:`_whole`, built once for a decode (the same ``params`` object, step after step) and held with it."""
        held = getattr(self, "_decoder", None)
        if held is None or held[0] is not params or held[1] != num_heads or held[2] < positions:
            held = (params, num_heads, max(positions, 64), self._whole(params, num_heads, max(positions, 64)))
            self._decoder = held
        return held[3]

    @staticmethod
    def _padding(tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor | None:
        """The 2-D ``attention_mask`` transformers documents (B, n): 1 = a token, 0 = padding."""
        if lengths is None:
            return None
        return (torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None]).long()

    @torch.no_grad()
    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):
        model = self._whole(params, num_heads, max(src_tokens.shape[1], tgt_tokens.shape[1]))
        out = model(
            input_ids=src_tokens,
            attention_mask=self._padding(src_tokens, src_lengths),
            decoder_input_ids=tgt_tokens,
            decoder_attention_mask=self._padding(tgt_tokens, tgt_lengths),
            use_cache=False,
        )
        return out.logits  # (B, n_tgt, vocab)

    # decoding (implementations/protocol.py, "Decoding"): transformers' own cache and generate()

    @torch.no_grad()
    def encode(self, src_tokens, params, num_heads, src_lengths=None):
        model = self._held(params, num_heads, src_tokens.shape[1])
        out = model.model.encoder(input_ids=src_tokens, attention_mask=self._padding(src_tokens, src_lengths))
        return out.last_hidden_state  # (B, n_src, d_model)

    @torch.no_grad()
    def decode_step(self, tokens, memory, params, num_heads, cache=None, src_lengths=None):
        c = 0 if cache is None else cache.get_seq_length()
        model = self._held(params, num_heads, max(c + tokens.shape[1], memory.shape[1]))
        out = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=memory),
            attention_mask=self._padding(memory[..., 0], src_lengths),
            decoder_input_ids=tokens,
            cache=cache,
            use_cache=True,
        )
        return out.logits, out.cache  # (B, k, vocab); an EncoderDecoderCache of c + k positions

    @torch.no_grad()
    def reorder_cache(self, cache, index):
        cache.reorder_cache(index)  # in place: self- and cross-attention keys and values, rows index
        return cache

    @torch.no_grad()
    def beam_search(self, src_tokens, params, num_heads, beam, alpha, max_lengths, bos, eos, src_lengths=None):
        limits = [int(m) for m in max_lengths.tolist()]
        model = self._held(params, num_heads, max([*limits, src_tokens.shape[1]]) + 1)
        out = []
        for i, limit in enumerate(limits):  # one sentence at a time: generate() takes one max_new_tokens
            src = src_tokens[i : i + 1]
            # explicit, never inferred from pad ids (the source may hold the id generate() pads with)
            mask = self._padding(
                src, (src_lengths[i : i + 1] if src_lengths is not None else torch.tensor([src.shape[1]]))
            )
            gen = model.generate(
                input_ids=src,
                attention_mask=mask,
                generation_config=GenerationConfig(
                    **(
                        {"num_beams": int(beam), "length_penalty": float(alpha), "early_stopping": "never"}
                        if int(beam) > 1
                        else {"num_beams": 1}  # greedy search, which takes neither
                    ),
                    max_new_tokens=limit,
                    do_sample=False,
                    num_return_sequences=1,
                    decoder_start_token_id=int(bos),
                    bos_token_id=int(bos),
                    eos_token_id=int(eos),
                    pad_token_id=int(eos),
                    forced_eos_token_id=None,
                    output_scores=True,
                    return_dict_in_generate=True,
                    use_cache=True,
                ),
            )
            tokens = [int(t) for t in gen.sequences[0, 1:].tolist()]  # after the start token
            if eos in tokens:
                tokens = tokens[: tokens.index(eos) + 1]
            if int(beam) > 1:
                score = float(gen.sequences_scores[0])
            else:  # num_beams=1 is greedy search, which returns no score: generate()'s documented reconstruction
                steps = model.compute_transition_scores(gen.sequences, gen.scores, normalize_logits=True)
                score = float(steps[0, : len(tokens)].sum()) / len(tokens) ** float(alpha)
            out.append((tokens, score))
        return out
