"""The encoder-decoder of Figure 1 as a trainable ``nn.Module``, computed by our own equations.

Paper: §3.1 (N post-norm layers per stack, LayerNorm(x + Dropout(Sublayer(x)))), §3.2 (Eq. (1),
multi-head attention), §3.3 (Eq. (2)), §3.4 (one embedding matrix shared by source, target and
the pre-softmax projection, embeddings × sqrt(d_model)), §3.5 (sinusoids; learned positions as
Table 3 row (E)), §5.4 (residual dropout on every sub-layer output before the residual sum and on
the embedding + position sums).

Every equation is a call to :class:`aiayn.implementations.torch_impl.TorchSDPAImplementation` (the
registered ``torch-sdpa`` built-in) — the code the conformance suite checks — so the model trained
here is the model checked there. Its Eq. (1) is PyTorch's fused
``F.scaled_dot_product_attention`` (on the CPU a FlashAttention-style kernel that never holds a
score matrix). Two things still grow with n² through the built-in: it expands a boolean mask to
the full (n_q, n_k) before SDPA turns it into a float one (4 bytes per query-key pair and
sentence, not per head), and the decoder's causal mask is one (n, n) matrix. So sequences longer
than ``attention_tile`` (256) positions are tiled: queries in tiles of that many rows, each tile
one call of the built-in's Eq. (1) on projected heads under activation checkpointing (the tile's
mask is made inside the tile and recomputed in the backward pass), so a sequence costs
O(tile · n) memory at a time instead of O(n²); a causal tile reads only the keys it may see.
Sequences up to the tile length (every Bible verse of the training reproduction) take the
untiled path through ``multi_head_attention``. In evaluation mode (no dropout) :meth:`Transformer.forward`
equals ``TorchSDPAImplementation.transformer_forward`` on :meth:`Transformer.canonical_params` at
every real (unpadded) target position (``tests/test_translation.py`` checks this bit for bit).

Parameter names follow the canonical nested layout of ``reference/model.py``: ``embedding``,
``positional`` (learned only), ``encoder.<i>.self_attn.w_q``, ``decoder.<i>.cross_attn.b_o``,
``encoder.<i>.norm1.gain``, ``decoder.<i>.ffn.w1``, ...

Choices (the paper is silent): weights Xavier-uniform, biases 0, LayerNorm gain 1 and bias 0, the
shared embedding N(0, d_model^-1/2) (so that × sqrt(d_model) gives unit-variance inputs, as
tensor2tensor does); learned positions N(0, d_model^-1/2) with ``max_positions`` rows.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from aiayn.implementations.torch_impl import TorchSDPAImplementation


def _mha(d_model: int, h: int, d_k: int, d_v: int) -> nn.ParameterDict:
    shapes = {
        "w_q": (d_model, h * d_k),
        "w_k": (d_model, h * d_k),
        "w_v": (d_model, h * d_v),
        "w_o": (h * d_v, d_model),
    }
    p = {n: nn.Parameter(nn.init.xavier_uniform_(torch.empty(s))) for n, s in shapes.items()}
    p.update({f"b_{n[2]}": nn.Parameter(torch.zeros(s[1])) for n, s in shapes.items()})
    return nn.ParameterDict(p)


def _norm(d_model: int) -> nn.ParameterDict:
    return nn.ParameterDict({"gain": nn.Parameter(torch.ones(d_model)), "bias": nn.Parameter(torch.zeros(d_model))})


def _ffn(d_model: int, d_ff: int) -> nn.ParameterDict:
    return nn.ParameterDict(
        {
            "w1": nn.Parameter(nn.init.xavier_uniform_(torch.empty(d_model, d_ff))),
            "b1": nn.Parameter(torch.zeros(d_ff)),
            "w2": nn.Parameter(nn.init.xavier_uniform_(torch.empty(d_ff, d_model))),
            "b2": nn.Parameter(torch.zeros(d_model)),
        }
    )


class _Layer(nn.Module):
    """One layer's parameters: self_attn, [cross_attn], ffn and its LayerNorms (canonical names)."""

    def __init__(self, config: Any, decoder: bool) -> None:
        super().__init__()
        d, h = config.d_model, config.num_heads
        self.self_attn = _mha(d, h, config.d_k, config.d_v)
        self.norm1 = _norm(d)
        if decoder:
            self.cross_attn = _mha(d, h, config.d_k, config.d_v)
        self.norm2 = _norm(d)
        self.ffn = _ffn(d, config.d_ff)
        if decoder:
            self.norm3 = _norm(d)


class Transformer(nn.Module):
    """Figure 1's model for any ``TransformerConfig`` (Table 3 row or scaled down) and vocabulary."""

    def __init__(
        self, config: Any, vocab_size: int, *, max_positions: int = 1024, device: str = "cpu", attention_tile: int = 256
    ) -> None:
        super().__init__()
        if vocab_size < 4:
            raise ValueError(f"vocab_size: expected at least the 4 reserved ids, got {vocab_size}")
        self.config, self.vocab_size = config, vocab_size
        self.impl = TorchSDPAImplementation(device=device)
        self.eps = float(self.impl.policies["layer_norm_eps"])
        d = config.d_model
        self.embedding = nn.Parameter(torch.randn(vocab_size, d) * d**-0.5)
        if config.positional == "learned":
            self.positional = nn.Parameter(torch.randn(max_positions, d) * d**-0.5)
        else:
            self.register_buffer("pe", self.impl.positional_encoding(max_positions, d, "float32"), persistent=False)
        self.encoder = nn.ModuleList([_Layer(config, decoder=False) for _ in range(config.n_layers)])
        self.decoder = nn.ModuleList([_Layer(config, decoder=True) for _ in range(config.n_layers)])
        self.max_positions = max_positions
        if attention_tile < 1:
            raise ValueError(f"attention_tile: expected a positive number of query rows, got {attention_tile}")
        self.attention_tile = attention_tile
        self.to(device)

    # ------------------------------------------------------------------ pieces

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        """Residual dropout P_drop (§5.4)."""
        return F.dropout(x, self.config.p_drop, self.training)

    def positions(self, start: int, n: int) -> torch.Tensor:
        """Rows start..start+n-1 of the positional table (§3.5 sinusoids, or row (E)'s learned one)."""
        if start + n > self.max_positions:
            raise ValueError(f"positions: a sequence of {start + n} tokens exceeds max_positions={self.max_positions}")
        table = self.positional if self.config.positional == "learned" else self.pe
        return table[start : start + n]

    def embed(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Dropout(E[tokens] · sqrt(d_model) + PE) (§3.4, §3.5, §5.4). (B, n) -> (B, n, d_model)."""
        x = self.embedding[tokens] * math.sqrt(self.config.d_model)
        return self._drop(x + self.positions(start, tokens.shape[1]))

    def _sublayer(self, x: torch.Tensor, out: torch.Tensor, norm: nn.ParameterDict) -> torch.Tensor:
        """LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4)."""
        return self.impl.layer_norm(x + self._drop(out), norm["gain"], norm["bias"], self.eps)

    def _ffn(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        f = layer.ffn
        return self.impl.feed_forward(x, f["w1"], f["b1"], f["w2"], f["b2"])

    def key_mask(self, lengths: torch.Tensor, n: int) -> torch.Tensor:
        """(B, 1, n) bool: key j visible iff j < lengths[b] (True = may attend)."""
        return (torch.arange(n, device=lengths.device)[None, :] < lengths[:, None])[:, None, :]

    # ------------------------------------------------------------------ attention (§3.2.2), untiled or tiled

    def _attention(
        self, x: torch.Tensor, memory: torch.Tensor, p: nn.ParameterDict, key_mask: torch.Tensor | None, causal: bool
    ) -> torch.Tensor:
        """MultiHead(x, memory, memory) (§3.2.2) with a key-padding mask (B, 1, n_k) or a causal one (§3.2.3).

        Up to ``attention_tile`` positions: the built-in's ``multi_head_attention`` (one (n, n)
        causal mask, or the key mask). Longer: :meth:`_tiled_attention`. x (B, n_q, d) -> (B, n_q, d).
        """
        n_q, n_k = x.shape[1], memory.shape[1]
        if max(n_q, n_k) > self.attention_tile:
            return self._tiled_attention(x, memory, p, key_mask, causal)
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).tril() if causal else key_mask
        return self.impl.multi_head_attention(x, memory, memory, p, self.config.num_heads, mask)

    def _tiled_attention(
        self, x: torch.Tensor, memory: torch.Tensor, p: nn.ParameterDict, key_mask: torch.Tensor | None, causal: bool
    ) -> torch.Tensor:
        """The same function as :meth:`_attention`, in query tiles of ``attention_tile`` rows.

        Q, K, V projected once (§3.2.2); each tile is one call of the built-in's Eq. (1) under
        activation checkpointing, so only the tile's inputs are kept for the backward pass and its
        mask and scores exist one tile at a time; then Concat(heads) W^O.
        """
        q, k, v = (
            self._project(x, p, "q"),
            self._project(memory, p, "k"),
            self._project(memory, p, "v"),
        )  # (B, h, n, d_head)
        tiles = [
            checkpoint(self._tile, q[:, :, s : s + self.attention_tile], k, v, key_mask, s, causal, use_reentrant=False)
            for s in range(0, q.shape[2], self.attention_tile)
        ]
        heads = torch.cat(tiles, dim=2)  # (B, h, n_q, d_v)
        b, h, n, dv = heads.shape
        return torch.matmul(heads.transpose(1, 2).reshape(b, n, h * dv), p["w_o"]) + p["b_o"]

    def _tile(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, start: int, causal: bool
    ) -> torch.Tensor:
        """Eq. (1) for the query rows start..start+T-1: q (B, h, T, d_k) -> (B, h, T, d_v).

        Causal: only keys 0..start+T-1 exist for these rows, and the (T, start+T) mask says
        key j <= query i; else the key-padding mask (B, 1, 1, n_k), broadcast over the rows.
        """
        if causal:
            end = start + q.shape[2]
            rows = torch.arange(start, end, device=q.device)[:, None]
            mask = torch.arange(end, device=q.device)[None, :] <= rows  # (T, end)
            return self.impl.scaled_dot_product_attention(q, k[:, :, :end], v[:, :, :end], mask)
        return self.impl.scaled_dot_product_attention(q, k, v, None if key_mask is None else key_mask[:, None])

    # ------------------------------------------------------------------ teacher forcing

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder stack (§3.1): (B, n_src) ids -> memory (B, n_src, d_model) and its key mask (B, 1, n_src)."""
        mask = self.key_mask(src_lengths, src.shape[1])
        x = self.embed(src)
        for layer in self.encoder:
            x = self._sublayer(x, self._attention(x, x, layer.self_attn, mask, causal=False), layer.norm1)
            x = self._sublayer(x, self._ffn(x, layer), layer.norm2)
        return x, mask

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        tgt_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decoder stack and the tied pre-softmax projection (§3.1, §3.4): -> logits (B, n_tgt, vocab).

        Self-attention is causal (§3.2.3), one mask for the whole batch. Padded target positions
        need no mask of their own: a real position i < length sees only keys j <= i, which are
        all real, so padding never reaches a real position's output (``tgt_lengths`` is accepted
        for the signature's sake and changes nothing there; the loss ignores padded positions).
        A (B, n, n) mask would be materialised as B float matrices inside SDPA.
        """
        y = self.embed(tgt_in)
        for layer in self.decoder:
            y = self._sublayer(y, self._attention(y, y, layer.self_attn, None, causal=True), layer.norm1)
            y = self._sublayer(y, self._attention(y, memory, layer.cross_attn, memory_mask, causal=False), layer.norm2)
            y = self._sublayer(y, self._ffn(y, layer), layer.norm3)
        return torch.matmul(y, self.embedding.transpose(0, 1))  # (B, n, vocab), no bias (§3.4)

    def forward(
        self,
        src: torch.Tensor,
        src_lengths: torch.Tensor,
        tgt_in: torch.Tensor,
        tgt_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, n_tgt, vocab)."""
        memory, mask = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, mask, tgt_lengths)

    def canonical_params(self) -> dict[str, Any]:
        """The parameters as ``reference/model.py``'s nested layout (tensors, shared with the module)."""

        def layer(m: _Layer) -> dict[str, Any]:
            return {name: dict(pd.items()) for name, pd in m.named_children()}

        params: dict[str, Any] = {"embedding": self.embedding}
        if self.config.positional == "learned":
            params["positional"] = self.positional
        params["encoder"] = [layer(m) for m in self.encoder]
        params["decoder"] = [layer(m) for m in self.decoder]
        return params

    # ------------------------------------------------------------------ incremental decoding

    def _project(self, x: torch.Tensor, p: nn.ParameterDict, which: str) -> torch.Tensor:
        """x W^which + b^which split into heads: (B, n, d_model) -> (B, h, n, d_head) (§3.2.2)."""
        y = torch.matmul(x, p[f"w_{which}"]) + p[f"b_{which}"]
        b, n, width = y.shape
        return y.reshape(b, n, self.config.num_heads, width // self.config.num_heads).transpose(1, 2)

    def _attend_cached(
        self, x: torch.Tensor, p: nn.ParameterDict, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """MultiHead for queries x against already projected keys/values: Eq. (1) per head, then W^O."""
        q = self._project(x, p, "q")  # (B, h, 1, d_k)
        heads = self.impl.scaled_dot_product_attention(
            q, k, v, None if mask is None else mask[:, None]
        )  # (B, h, 1, d_v)
        b, h, n, dv = heads.shape
        return torch.matmul(heads.transpose(1, 2).reshape(b, n, h * dv), p["w_o"]) + p["b_o"]

    def start_state(self, memory: torch.Tensor, memory_mask: torch.Tensor) -> dict[str, Any]:
        """Decoder state before the first step: each layer's encoder-decoder keys and values, computed once."""
        cross = [
            (self._project(memory, m.cross_attn, "k"), self._project(memory, m.cross_attn, "v")) for m in self.decoder
        ]
        return {"t": 0, "cross": cross, "self": [None] * len(self.decoder), "mask": memory_mask}

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """Next-token logits (B, vocab) after feeding ``tokens`` (B,) at position ``state['t']``.

        Each layer's self-attention keys and values of earlier positions are cached (the incremental
        decoder of §6.1's beam search): step t costs O(t) attention, not a rerun of the prefix.
        """
        y = self.embed(tokens[:, None], start=state["t"])  # (B, 1, d_model)
        for i, layer in enumerate(self.decoder):
            k_new, v_new = self._project(y, layer.self_attn, "k"), self._project(y, layer.self_attn, "v")
            past = state["self"][i]
            k, v = (k_new, v_new) if past is None else (torch.cat((past[0], k_new), 2), torch.cat((past[1], v_new), 2))
            state["self"][i] = (k, v)
            y = self._sublayer(y, self._attend_cached(y, layer.self_attn, k, v, None), layer.norm1)
            ck, cv = state["cross"][i]
            y = self._sublayer(y, self._attend_cached(y, layer.cross_attn, ck, cv, state["mask"]), layer.norm2)
            y = self._sublayer(y, self._ffn(y, layer), layer.norm3)
        state["t"] += 1
        return torch.matmul(y[:, 0], self.embedding.transpose(0, 1))

    @staticmethod
    def reorder(state: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
        """Keep batch rows ``index`` of a decoder state (beam search re-selects hypotheses)."""
        pick = lambda pair: None if pair is None else (pair[0][index], pair[1][index])  # noqa: E731
        return {
            "t": state["t"],
            "cross": [pick(c) for c in state["cross"]],
            "self": [pick(s) for s in state["self"]],
            "mask": state["mask"][index],
        }


def parameter_total(model: nn.Module) -> int:
    """Number of trainable scalars (the shared embedding counted once)."""
    return sum(p.numel() for p in model.parameters())
