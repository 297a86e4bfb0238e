"""§3.2.3 and §6.1 for the PyTorch built-ins: the decoder one step at a time with cached keys and values, and beam
search, over the built-ins' own equations (``torch_impl.py``).

``torch`` and ``torch-sdpa`` (``registry.py``) are :class:`TorchDecoding` and :class:`TorchSDPADecoding`: the
equations of :class:`~aiayn.implementations.torch_impl.TorchImplementation` and
:class:`~aiayn.implementations.torch_impl.TorchSDPAImplementation` unchanged, with the decoding methods of the
contract (``implementations/protocol.py``, "Decoding") added. Each layer caches its self-attention keys and values as
projected (x W^K + b^K, split into heads); a step of k tokens after c cached positions embeds them at positions
c .. c + k - 1 and masks its self-attention with the causal mask aligned at the bottom right (query i sees keys
j <= c + i). The beam search is batched (every sentence's beam in one batch of B * beam rows, the cache reordered
by beam indices after each step) and accumulates log-probabilities in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from aiayn.implementations.decoding import beam_policies
from aiayn.implementations.torch_impl import TorchImplementation, TorchSDPAImplementation


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, n, h*d) -> (B, h, n, d): head i takes columns i*d:(i+1)*d (§3.2.2)."""
    b, n, width = x.shape
    return x.reshape(b, n, h, width // h).transpose(1, 2)


class _Decoding:
    """The decoding methods, for a class with the built-ins' equations (``_linear``, ``_attend``, ``_norm``, ``_ffn``,
    ``multi_head_attention``, ``encoder_layer``, ``positional_encoding``, ``_key_mask``)."""

    def encode(
        self, src_tokens: torch.Tensor, params: Mapping[str, Any], num_heads: int, src_lengths: Any = None
    ) -> torch.Tensor:
        """The encoder stack (§3.1) on the embedded source: the memory (B, n_src, d_model)."""
        mask = self._key_mask(src_lengths, src_tokens.shape[1])  # (B, 1, n_src)
        x = self._embed_at(src_tokens, params, 0)
        for layer in params["encoder"]:
            x = self.encoder_layer(x, layer, num_heads, mask)
        return x

    def _embed_at(self, tokens: torch.Tensor, params: Mapping[str, Any], start: int) -> torch.Tensor:
        """E[tokens] * sqrt(d_model) + positions start .. start + n - 1 (§3.4, §3.5). (B, n) -> (B, n, d_model)."""
        emb = params["embedding"]
        vocab, d_model = emb.shape
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected shape (B, n), got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(f"tokens: expected ids in [0, {vocab}), got [{int(tokens.min())}, {int(tokens.max())}]")
        end = start + tokens.shape[1]
        x = emb[tokens] * math.sqrt(d_model)
        if "positional" in params:
            table = params["positional"]
            if table.shape[0] < end:
                raise ValueError(f"params['positional']: {table.shape[0]} rows, a step needs {end}")
            return x + table[start:end]
        names = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16"}
        return x + self.positional_encoding(end, d_model, names.get(emb.dtype, "bfloat16"))[start:]

    def decode_step(
        self,
        tokens: torch.Tensor,
        memory: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        cache: Mapping[str, Any] | None = None,
        src_lengths: Any = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The next k tokens (B, k) through the decoder after the cache's c positions: (logits (B, k, V), the cache of
        c + k positions). The cache given is not modified."""
        h = int(num_heads)
        past = cache or {"length": 0, "self": [None] * len(params["decoder"])}
        c, k = past["length"], tokens.shape[1]
        memory_mask = self._key_mask(src_lengths, memory.shape[-2])  # (B, 1, n_src)
        causal = torch.ones(k, c + k, dtype=torch.bool, device=memory.device).tril(c)  # (k, c + k), bottom right
        y = self._embed_at(tokens, params, c)  # (B, k, d_model)
        layers = []
        for layer, held in zip(params["decoder"], past["self"]):
            p = layer["self_attn"]
            q = _heads(self._linear(y, p["w_q"], p.get("b_q")), h)  # (B, h, k, d_k), compute dtype
            k_new = _heads(self._linear(y, p["w_k"], p.get("b_k")), h)
            v_new = _heads(self._linear(y, p["w_v"], p.get("b_v")), h)
            keys = k_new if held is None else torch.cat((held[0], k_new), dim=-2)  # (B, h, c + k, d_k)
            values = v_new if held is None else torch.cat((held[1], v_new), dim=-2)
            layers.append((keys, values))
            heads = self._attend(q, keys, values, causal, y.dtype)  # (B, h, k, d_v)
            b, _, n, dv = heads.shape
            attn = self._linear(heads.transpose(1, 2).reshape(b, n, h * dv), p["w_o"], p.get("b_o")).to(y.dtype)
            a = self._norm(y + attn, layer, "norm1")
            cross = self.multi_head_attention(a, memory, memory, layer["cross_attn"], h, memory_mask)
            z = self._norm(a + cross, layer, "norm2")
            y = self._norm(z + self._ffn(z, layer), layer, "norm3")
        emb = params["embedding"]
        logits = self._linear(y, emb.transpose(0, 1), None).to(emb.dtype)  # (B, k, V)
        return logits, {"length": c + k, "self": layers}

    def reorder_cache(self, cache: Mapping[str, Any], index: torch.Tensor) -> dict[str, Any]:
        """The cache of batch rows ``index`` (B',), in that order (beam search's reordering; rows may repeat)."""
        return {"length": cache["length"], "self": [(k[index], v[index]) for k, v in cache["self"]]}

    def beam_search(
        self,
        src_tokens: torch.Tensor,
        params: Mapping[str, Any],
        num_heads: int,
        beam: int,
        alpha: float,
        max_lengths: torch.Tensor,
        bos: int,
        eos: int,
        src_lengths: Any = None,
    ) -> list[tuple[list[int], float]]:
        """§6.1's beam search with GNMT's length penalty ((5 + |Y|) / 6)^alpha over the cached decoder, per sentence
        (tokens, score); choices as ``policies["beam_search"]`` declares (``implementations/decoding.py``)."""
        rule = beam_policies(self.policies)
        k, b = int(beam), src_tokens.shape[0]
        limits = [int(m) for m in max_lengths.tolist()]
        extra = 1 if rule["length_counts"] == "bos_eos" else 0

        def lp(t: int) -> float:
            return ((5.0 + t + extra) / 6.0) ** alpha

        with torch.no_grad():
            memory = self.encode(src_tokens, params, num_heads, src_lengths)
            rows = torch.arange(b, device=memory.device).repeat_interleave(k)
            memory = memory[rows]
            lengths = None if src_lengths is None else src_lengths[rows]
            cache = None
            # (tokens, log P) per slot: one hypothesis to start from, the other slots copies that never expand
            alive = [[((), 0.0)] + [((), -math.inf)] * (k - 1) for _ in range(b)]
            finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
            done = [False] * b
            tokens = torch.full((b * k, 1), bos, dtype=torch.long, device=memory.device)
            for t in range(1, max(limits) + 1):
                logits, cache = self.decode_step(tokens, memory, params, num_heads, cache, lengths)
                logp = torch.log_softmax(logits[:, -1].to(torch.float64), dim=-1).cpu()  # (B * k, V)
                vocab = logp.shape[-1]
                index, nxt = [], []
                for i in range(b):
                    base = torch.tensor([v for _, v in alive[i]], dtype=torch.float64)
                    cand = (base[:, None] + logp[i * k : (i + 1) * k]).reshape(-1)
                    order = sorted(range(k * vocab), key=lambda j: (-float(cand[j]), j))[: 2 * k]
                    ranked = order[: 2 * k if rule["eos_rank"] == "2k" else k]
                    if not done[i]:
                        finished[i] += [
                            (float(cand[j]) / lp(t), [*alive[i][j // vocab][0], eos])
                            for j in ranked
                            if j % vocab == eos and math.isfinite(float(cand[j]))
                        ]
                    keep = [j for j in order if j % vocab != eos][:k]
                    alive[i] = [((*alive[i][j // vocab][0], j % vocab), float(cand[j])) for j in keep]
                    index += [i * k + j // vocab for j in keep]
                    nxt += [j % vocab for j in keep]
                    if done[i]:
                        continue
                    live = [(v, list(s)) for s, v in alive[i] if math.isfinite(v)]
                    if t >= limits[i]:
                        if rule["at_max_length"] == "finished":
                            finished[i] += [(v / lp(t), s) for v, s in live]
                        elif not finished[i]:
                            finished[i] += live
                        done[i] = True
                    elif rule["early_stop"] == "full":
                        done[i] = len(finished[i]) >= k
                    elif rule["early_stop"] == "bound" and finished[i]:
                        kth = sorted((f[0] for f in finished[i]), reverse=True)[:k][-1]
                        done[i] = kth > alive[i][0][1] / lp(limits[i])
                if all(done):
                    break
                cache = self.reorder_cache(cache, torch.tensor(index, device=memory.device))
                tokens = torch.tensor(nxt, dtype=torch.long, device=memory.device)[:, None]
        out = []
        for i in range(b):
            best = max(range(len(finished[i])), key=lambda j: (finished[i][j][0], -j))
            score, seq = finished[i][best]
            out.append(([int(x) for x in seq], float(score)))
        return out


class TorchDecoding(_Decoding, TorchImplementation):
    """The ``torch`` built-in: :class:`~aiayn.implementations.torch_impl.TorchImplementation` with decoding."""


class TorchSDPADecoding(_Decoding, TorchSDPAImplementation):
    """The ``torch-sdpa`` built-in: :class:`~aiayn.implementations.torch_impl.TorchSDPAImplementation` (Eq. (1) by
    ``F.scaled_dot_product_attention``) with decoding."""
