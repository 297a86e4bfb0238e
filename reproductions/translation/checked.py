"""The translation reproduction's decoder as an implementation the conformance suite checks.

``aiayn train`` translates with :func:`aiayn.reproductions.translation.decode.beam_search` over
:class:`~aiayn.reproductions.translation.model.Transformer`'s cached decoder (``encode``, ``start_state``, ``step``,
``reorder``). :class:`TranslationDecoder` hands exactly that code to the suite's decoding checks
(``implementations/protocol.py``, "Decoding"): a model built from the suite's canonical weights, the suite's tokens
fed through ``step`` and its cache reordered by ``reorder``, and the reproduction's own beam search, so the path that
produced the BLEU reports is the path checked (``reports/conformance-translation.md``, from ``aiayn check
aiayn.reproductions.translation.checked:TranslationDecoder``). The model's equations are the ``torch-sdpa``
built-in's, which the suite checks under its own name.

What the adapter adds is bookkeeping: the model feeds one token per ``step``, so a chunk of k tokens is k steps; its
beam search starts from ``BOS`` and ends at ``EOS`` (ids 2 and 3), so the suite's ids are relabelled by a
permutation of the vocabulary that sends its start and end symbols there (the embedding's rows permuted with it:
the tied model is the same function of relabelled ids); its outputs leave EOS out, so a hypothesis shorter than its
maximum length is one that ended in EOS (one cut at the maximum length has exactly that length).

Declared: float32 only (the reproduction trains and decodes in float32; its sinusoid table is a float32 buffer), and
the beam-search choices of ``decode.py``: an EOS finishes among the best k, hypotheses alive at the maximum length
finish as they stand, the early stop is the bound (``decode.py`` compares the best finished score with it, which
returns what comparing the k-th best does), |Y| counts EOS.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from aiayn.implementations.protocol import DEFAULT_POLICIES, Unsupported
from aiayn.implementations.torch_impl import TorchSDPAImplementation
from aiayn.reference.counts import TransformerConfig
from aiayn.reproductions.translation.data import BOS, EOS
from aiayn.reproductions.translation.decode import beam_search
from aiayn.reproductions.translation.model import Transformer


class TranslationDecoder(TorchSDPAImplementation):
    """``decode.py``'s beam search and ``model.py``'s cached decoder, on the suite's weights (see the module)."""

    name = "translation"
    policies = MappingProxyType(
        {
            **DEFAULT_POLICIES,
            "beam_search": {
                "eos_rank": "k",
                "early_stop": "bound",
                "at_max_length": "finished",
                "length_counts": "eos",
            },
        }
    )

    def __init__(self, device: str | None = None) -> None:
        super().__init__(device)
        self.dtypes = ("float32",)

    def _model(self, params: Mapping[str, Any], num_heads: int, perm: torch.Tensor | None = None) -> Transformer:
        """The reproduction's model with ``params`` (canonical layout) copied in, evaluation mode; ``perm`` relabels
        the vocabulary (row ``perm[v]`` of its embedding is row v of ``params['embedding']``)."""
        emb = params["embedding"]
        vocab, d_model = emb.shape
        if vocab < 4:
            raise Unsupported(f"the translation model reserves ids 0-3: a vocabulary of {vocab} is too small")
        layers = params["encoder"]
        ffn = layers[0]["ffn"]["w1"].shape[1]
        learned = "positional" in params
        config = TransformerConfig(
            n_layers=len(layers),
            d_model=d_model,
            d_ff=ffn,
            num_heads=num_heads,
            p_drop=0.0,
            positional="learned" if learned else "sinusoid",
        )
        if len(params["decoder"]) != len(layers):
            raise Unsupported("the translation model has as many decoder layers as encoder layers")
        positions = params["positional"].shape[0] if learned else 1024
        model = Transformer(config, vocab, max_positions=positions, device=str(emb.device)).to(emb.dtype).eval()
        given, target = _flat(params), _flat(model.canonical_params())
        with torch.no_grad():
            for path, tensor in target.items():  # biases the suite's weights leave out are zero
                value = given.get(path)
                if value is None:
                    tensor.zero_()
                else:
                    tensor.copy_(value[torch.argsort(perm)] if path == "embedding" and perm is not None else value)
        return model

    def provides(self) -> frozenset[str]:
        """The whole model only: its decoding is what this adapter is for (its equations are ``torch-sdpa``'s, checked
        under that name)."""
        return frozenset({"transformer_forward"})

    def encode(self, src_tokens: torch.Tensor, params: Mapping[str, Any], num_heads: int, src_lengths: Any = None):
        lengths = _lengths(src_tokens, src_lengths)
        with torch.no_grad():
            memory, _ = self._model(params, num_heads).encode(src_tokens, lengths)
        return memory

    def decode_step(self, tokens, memory, params, num_heads, cache=None, src_lengths=None):
        if cache is None:
            model = self._model(params, num_heads)
            mask = model.key_mask(_lengths(memory[..., 0], src_lengths), memory.shape[1])
            cache = {"model": model, "state": model.start_state(memory, mask)}
        with torch.no_grad():
            logits = [cache["model"].step(tokens[:, j], cache["state"]) for j in range(tokens.shape[1])]
        return torch.stack(logits, dim=1), cache

    def reorder_cache(self, cache, index):
        return {"model": cache["model"], "state": cache["model"].reorder(cache["state"], index)}

    def beam_search(self, src_tokens, params, num_heads, beam, alpha, max_lengths, bos, eos, src_lengths=None):
        vocab = params["embedding"].shape[0]
        perm = _relabelling(vocab, bos, eos)  # suite id -> model id
        inverse = torch.argsort(perm)
        model = self._model(params, num_heads, perm)
        lengths = _lengths(src_tokens, src_lengths)
        out = []
        for i in range(src_tokens.shape[0]):
            n = int(lengths[i])
            limit = int(max_lengths[i])
            extra = limit - max(n - 1, 1)  # decode.py's maximum: (source length - 1, at least 1) + extra
            if extra < 1:
                raise Unsupported(f"a maximum length of {limit} for a source of {n}: decode.py adds at least 1")
            src = perm[src_tokens[i : i + 1, :n]]
            [(tokens, score, _)] = beam_search(
                model, src, torch.tensor([n]), beam=beam, alpha=alpha, extra=extra, scores=True
            )
            ended = len(tokens) < limit  # one cut at the maximum length has exactly that length
            ids = [int(inverse[t]) for t in tokens] + ([eos] if ended else [])
            out.append((ids, float(score)))
        return out


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Canonical params by dotted path (``encoder.0.self_attn.w_q``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{path}."))
        elif isinstance(value, (list, tuple)):
            for j, item in enumerate(value):
                out.update(_flat(item, f"{path}.{j}."))
        else:
            out[path] = value
    return out


def _lengths(tokens: torch.Tensor, lengths: Any) -> torch.Tensor:
    """The source lengths the model's encoder needs (every position real when the suite gives none)."""
    if lengths is not None:
        return lengths
    return torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)


def _relabelling(vocab: int, bos: int, eos: int) -> torch.Tensor:
    """A permutation of the ids sending ``bos`` to the model's BOS and ``eos`` to its EOS, the rest in order."""
    rest = [v for v in range(vocab) if v not in (bos, eos)]
    free = [v for v in range(vocab) if v not in (BOS, EOS)]
    perm = torch.empty(vocab, dtype=torch.long)
    perm[bos], perm[eos] = BOS, EOS
    perm[torch.tensor(rest, dtype=torch.long)] = torch.tensor(free, dtype=torch.long)
    return perm
