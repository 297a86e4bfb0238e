"""PyTorch's ``nn.Transformer`` as the ``torch-nn-transformer`` adapter: the whole model (Figure 1) by the module
PyTorch ships for it.

``nn.Transformer`` builds an ``nn.TransformerEncoder`` and an ``nn.TransformerDecoder`` of post-norm layers
(``norm_first=False``, the paper's; ReLU; dropout 0; the declared eps) and, whether its layers are post-norm or not, a
final ``nn.LayerNorm`` after each stack (``encoder.norm``, ``decoder.norm``; weight 1 and bias 0 as PyTorch
initialises them): not in §3.1, and not declared here. That departure is left to the suite to find and name.

The module has no embedding, positional encoding or output projection: the adapter adds them as PyTorch's own
Transformer tutorial does, with the ``torch`` built-in's (E[x] sqrt(d_model) + PE, §3.4-§3.5; logits y E^T with the
one shared matrix). The layers' weights are the given tensors (``torch.func.functional_call``, so autograd gives the
gradients), in the ``torch-nn`` built-in's mapping; ``encoder.norm`` and ``decoder.norm`` keep their own parameters.
Masks: PyTorch's boolean masks (True = may not attend) per batch element and head, as ``torch-nn`` builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import nn

from aiayn.implementations.torch_impl import _param
from aiayn.implementations.torch_nn import TorchNNImplementation


class NNTransformer(TorchNNImplementation):
    """The whole model by ``nn.Transformer`` (registry name ``"torch-nn-transformer"``)."""

    name = "torch-nn-transformer"
    library = "torch"
    known_deviations: Mapping[str, str] = MappingProxyType({})

    def provides(self) -> frozenset[str]:
        return frozenset({"transformer_forward"})

    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):  # type: ignore[no-untyped-def]
        encoder = _param(params, "encoder", "params (transformer)")
        decoder = _param(params, "decoder", "params (transformer)")
        kwargs = self._layer_kwargs(encoder[0], num_heads)
        model = self._mode(nn.Transformer(num_encoder_layers=len(encoder), num_decoder_layers=len(decoder), **kwargs))
        d_model, h = kwargs["d_model"], kwargs["nhead"]
        tensors: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(encoder):
            mine = self._layer_tensors(layer, {"self_attn": "self_attn"}, 2, d_model)
            tensors |= {f"encoder.layers.{i}.{k}": v for k, v in mine.items()}
        for i, layer in enumerate(decoder):
            mine = self._layer_tensors(layer, {"self_attn": "self_attn", "multihead_attn": "cross_attn"}, 3, d_model)
            tensors |= {f"decoder.layers.{i}.{k}": v for k, v in mine.items()}
        b, n_src, n_tgt = src_tokens.shape[0], src_tokens.shape[1], tgt_tokens.shape[1]
        src_keys = self._key_mask(src_lengths, n_src)  # (B, 1, n_src) or None
        causal = self._causal(n_tgt)
        tgt_keys = causal if tgt_lengths is None else causal & self._key_mask(tgt_lengths, n_tgt)
        masks = {
            "src_mask": self._attn_mask(src_keys, (b,), n_src, n_src, h),
            "tgt_mask": self._attn_mask(tgt_keys.expand(b, n_tgt, n_tgt), (b,), n_tgt, n_tgt, h),
            "memory_mask": self._attn_mask(src_keys, (b,), n_tgt, n_src, h),
        }
        with self._grad_mode():
            src = self._embed(src_tokens, params, "src_tokens")  # (B, n_src, d_model)
            tgt = self._embed(tgt_tokens, params, "tgt_tokens")  # (B, n_tgt, d_model)
            y = torch.func.functional_call(model, tensors, (src, tgt), masks, strict=False)
            emb = params["embedding"]
            return y @ emb.transpose(0, 1)  # (B, n_tgt, vocab)
