"""The translation reproduction's decoder and training code as implementations the conformance suite checks.

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

:class:`TranslationTraining` hands the suite what ``aiayn train`` trains with (``train.py``, ``model.py``), each
through the function training calls: Adam from :func:`~aiayn.reproductions.translation.train.adam` (what ``train()``
builds) given the suite's state; residual dropout as ``Transformer._drop`` in training mode, torch's generator seeded
by the suite's seed; checkpoint averaging through the reproduction's files (written by ``save_checkpoint``, the last
n chosen by ``last_checkpoints`` as ``run.py`` chooses them, averaged by ``average_checkpoints``); and one encoder or
decoder layer in training mode as a one-layer model's ``encode`` or ``decode`` runs it, the suite's input fed in place
of the embedding step. The dropout masks are what ``_drop`` drew, read at each call by ``drawn_mask`` (the same draw
on ones), in the order the layer calls it (self-attention, [encoder-decoder attention,] feed-forward). The model
takes a key-padding mask from lengths and a causal flag, not an arbitrary mask: its layers' scopes say so (a mask of
another kind is ``Unsupported``). Declared: float32 only, as the reproduction trains.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from aiayn.implementations.protocol import DEFAULT_POLICIES, Scope, Unsupported
from aiayn.implementations.torch_impl import TorchSDPAImplementation, drawn_mask
from aiayn.reference.counts import TransformerConfig, dropout_places
from aiayn.reproductions.translation.data import BOS, EOS
from aiayn.reproductions.translation.decode import beam_search
from aiayn.reproductions.translation.model import Transformer
from aiayn.reproductions.translation.train import (
    TrainConfig,
    adam,
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
)


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

    def _model(
        self, params: Mapping[str, Any], num_heads: int, perm: torch.Tensor | None = None, p_drop: float = 0.0
    ) -> Transformer:
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
            p_drop=p_drop,
            positional="learned" if learned else "sinusoid",
        )
        if len(params["decoder"]) != len(layers):
            raise Unsupported("the translation model has as many decoder layers as encoder layers")
        positions = params["positional"].shape[0] if learned else 1024
        model = Transformer(config, vocab, max_positions=positions, device=str(emb.device)).to(emb.dtype).eval()
        given = _flat(params)
        if perm is not None:
            given["embedding"] = emb[torch.argsort(perm)]
        _copy_in(_flat(model.canonical_params()), given)
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


class TranslationTraining(TranslationDecoder):
    """``train.py``'s optimizer and checkpoint averaging, ``model.py``'s residual dropout and its layers in training
    mode, on the suite's inputs (see the module)."""

    name = "translation-training"
    scope = MappingProxyType(
        {
            "encoder_layer_training": Scope(
                masks=("none", "padding"),
                batch_dims=(1,),
                note="the self-attention mask is a key-padding mask from source lengths (Transformer.encode)",
            ),
            "decoder_layer_training": Scope(
                masks=("none", "padding"),
                batch_dims=(1,),
                note=(
                    "the self-attention mask is the causal mask alone (Transformer.decode masks no target padding: "
                    "Unsupported otherwise), the encoder-decoder one a key-padding mask from source lengths"
                ),
                note_directions=("forward", "backward"),
            ),
        }
    )

    def provides(self) -> frozenset[str]:
        """What training runs: Adam, residual dropout, checkpoint averaging, the layers and the whole model in training
        mode."""
        return frozenset(
            {
                "adam_step",
                "dropout",
                "average_checkpoints",
                "encoder_layer_training",
                "decoder_layer_training",
                "transformer_forward_training",
            }
        )

    def transformer_forward_training(
        self, src_tokens, tgt_tokens, params, num_heads, p, seed, src_lengths=None, tgt_lengths=None
    ):
        """The model's teacher-forced forward (``Transformer.forward``, what ``train.token_losses`` runs) in training
        mode with P_drop = ``p``, torch's generator seeded by ``seed``; the masks its ``_drop`` drew, in the order
        drawn (the source's embedding sum, the encoder's sub-layers, the target's, the decoder's). Target padding needs
        no mask of its own (``Transformer.decode``): a real position sees only real keys, and the logits at padded
        positions are not compared."""
        with torch.random.fork_rng():
            model = self._model(params, num_heads, p_drop=p).train()
            drawn, _ = _record(model, None)
            torch.manual_seed(seed)
            logits = model(src_tokens, _lengths(src_tokens, src_lengths), tgt_tokens, tgt_lengths)
        places = dropout_places(len(params["encoder"]), len(params["decoder"]))
        return {"logits": logits, **dict(zip(places, _sublayer_masks(drawn, len(places)), strict=True))}

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):
        """One step of the optimizer :func:`train.adam` builds, from the given state, its learning rate set on the
        param group as :func:`train.train` sets Eq. (3)'s."""
        p = torch.nn.Parameter(param.detach().clone())
        p.grad = grad.detach().clone()
        optimizer = adam([p], TrainConfig(betas=betas, adam_eps=eps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        # torch.optim.Adam's state of a parameter: "step" (the updates so far, a float32 tensor on the CPU; the step
        # counts itself), "exp_avg" (m) and "exp_avg_sq" (v)
        optimizer.state[p] = {
            "step": torch.tensor(float(step - 1), dtype=torch.float32),
            "exp_avg": m.detach().clone(),
            "exp_avg_sq": v.detach().clone(),
        }
        optimizer.step()
        state = optimizer.state[p]
        return p.detach().clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone()

    def dropout(self, x, p, seed):
        """``Transformer._drop`` in training mode with P_drop = ``p``, torch's generator seeded by ``seed`` (its state
        outside left as it was); the mask read by :func:`~aiayn.implementations.torch_impl.drawn_mask`."""
        with torch.random.fork_rng():
            model = _model_for_dropout(p, x.device).train()
            torch.manual_seed(seed)
            return drawn_mask(model._drop, x)

    def average_checkpoints(self, checkpoints, n):
        """§6.1 through ``train.py``'s files: each step's weights written by :func:`train.save_checkpoint`, the last
        ``n`` chosen by :func:`train.last_checkpoints` (what ``run.py`` averages), their mean by
        :func:`train.average_checkpoints`."""
        with tempfile.TemporaryDirectory() as folder:
            for step, weights in checkpoints.items():
                save_checkpoint(folder, _StateDict(weights), _StateDict({}), step, (0, 0), len(checkpoints), 0)
            averaged = average_checkpoints(last_checkpoints(Path(folder), n))
        return {name: t.to(self.device) for name, t in averaged.items()}

    def encoder_layer_training(self, x, params, num_heads, p, seed, mask=None):
        """A one-layer model's ``encode`` in training mode on ``x`` (its embedding step replaced by ``x``), the source
        lengths read from the padding mask; the masks its two sub-layers' ``_drop`` drew, in the order drawn."""
        lengths = _lengths_of(mask, x.shape[0], x.shape[1], x.shape[1], "mask", x.device)
        with torch.random.fork_rng():
            model = _layer_model(params, num_heads, p, x, decoder=False)
            drawn, _ = _record(model, x)
            torch.manual_seed(seed)
            out, _ = model.encode(torch.zeros(x.shape[:2], dtype=torch.long, device=x.device), lengths)
        keep_attn, keep_ffn = _sublayer_masks(drawn, 2)
        return out, keep_attn, keep_ffn

    def decoder_layer_training(self, y, memory, params, num_heads, p, seed, self_mask=None, memory_mask=None):
        """A one-layer model's ``decode`` in training mode on ``y`` (its embedding step replaced by ``y``) and
        ``memory`` (its key mask from the lengths read from ``memory_mask``); the layer's output is its last
        ``_sublayer``'s, and the masks its three sub-layers' ``_drop`` drew, in the order drawn."""
        b, n_tgt, n_src = y.shape[0], y.shape[1], memory.shape[1]
        if self_mask is not None:
            causal = torch.ones(n_tgt, n_tgt, dtype=torch.bool, device=y.device).tril()
            if not torch.equal(torch.broadcast_to(self_mask, (b, n_tgt, n_tgt)), causal.expand(b, n_tgt, n_tgt)):
                raise Unsupported(
                    "self_mask: the model's decoder self-attention is causal alone (Transformer.decode masks no target "
                    "padding), got a mask that is not the causal one"
                )
        lengths = _lengths_of(memory_mask, b, n_tgt, n_src, "memory_mask", y.device)
        with torch.random.fork_rng():
            model = _layer_model(params, num_heads, p, y, decoder=True)
            drawn, outputs = _record(model, y)
            torch.manual_seed(seed)
            tgt_in = torch.zeros((b, n_tgt), dtype=torch.long, device=y.device)
            model.decode(tgt_in, memory, model.key_mask(lengths, n_src))
        keep_self, keep_cross, keep_ffn = _sublayer_masks(drawn, 3)
        return outputs[-1], keep_self, keep_cross, keep_ffn


class _StateDict:
    """What :func:`train.save_checkpoint` reads of a model or an optimizer: its ``state_dict()``, here the suite's
    weights (name -> tensor, any names and shapes) or an empty optimizer state."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return {name: t.detach() for name, t in self.state.items()}


def _model_for_dropout(p: float, device: torch.device) -> Transformer:
    """The smallest model whose ``_drop`` is residual dropout with P_drop = ``p``."""
    config = TransformerConfig(n_layers=1, d_model=2, d_ff=1, num_heads=1, p_drop=p)
    return Transformer(config, 4, max_positions=1, device=str(device))


def _layer_model(params: Mapping[str, Any], num_heads: int, p: float, x: torch.Tensor, decoder: bool) -> Transformer:
    """A one-layer model in training mode with P_drop = ``p``, the layer's weights (canonical layout) copied into its
    encoder's (``decoder`` False) or decoder's layer."""
    attn, ffn = params["self_attn"], params["ffn"]
    config = TransformerConfig(
        n_layers=1,
        d_model=x.shape[-1],
        d_ff=ffn["w1"].shape[1],
        num_heads=num_heads,
        d_k=attn["w_q"].shape[1] // num_heads,
        d_v=attn["w_v"].shape[1] // num_heads,
        p_drop=p,
    )
    model = Transformer(config, 4, max_positions=1, device=str(x.device)).to(x.dtype).train()
    layer = model.canonical_params()["decoder" if decoder else "encoder"][0]
    _copy_in(_flat(layer), _flat(params))
    return model


def _record(model: Transformer, x: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Feed ``x`` to the model's stack in place of its embedding step (None: the model embeds its tokens), and record,
    in call order, the mask of every ``_drop`` (read by ``drawn_mask``) and the output of every ``_sublayer``: two
    lists, filled as the model runs."""
    drawn: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    drop, sublayer = model._drop, model._sublayer

    def recorded_drop(t: torch.Tensor) -> torch.Tensor:
        out, keep = drawn_mask(drop, t)
        drawn.append(keep)
        return out

    def recorded_sublayer(*args: Any) -> torch.Tensor:
        outputs.append(sublayer(*args))
        return outputs[-1]

    if x is not None:
        model.embed = lambda tokens, start=0: x
    model._drop, model._sublayer = recorded_drop, recorded_sublayer
    return drawn, outputs


def _sublayer_masks(drawn: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """The masks of ``count`` places: exactly one ``_drop`` per place §5.4 drops (a layer's sub-layers, the model's
    embedding sums)."""
    if len(drawn) != count:
        raise RuntimeError(f"the model called _drop {len(drawn)} times, expected once per place §5.4 drops ({count})")
    return drawn


def _lengths_of(mask: torch.Tensor | None, b: int, n_q: int, n_k: int, name: str, device: torch.device) -> torch.Tensor:
    """The key lengths (B,) of a key-padding mask (the one kind of mask the model builds, ``Transformer.key_mask``):
    every key where ``mask`` is None; Unsupported for a mask that is not the same prefix of keys for every query."""
    if mask is None:
        return torch.full((b,), n_k, dtype=torch.long, device=device)
    full = torch.broadcast_to(mask, (b, n_q, n_k))
    lengths = full[:, 0].sum(-1)
    prefix = torch.arange(n_k, device=mask.device)[None, None, :] < lengths[:, None, None]
    if not torch.equal(full, prefix.expand(b, n_q, n_k)):
        raise Unsupported(
            f"{name}: the model masks keys by length only (a key-padding mask, Transformer.key_mask), got a mask that "
            "is not one prefix of the keys for every query"
        )
    return lengths


def _copy_in(target: Mapping[str, torch.Tensor], given: Mapping[str, Any]) -> None:
    """Copy the suite's weights ``given`` into the model's ``target`` (both by dotted path); the biases the suite's
    weights leave out are zero."""
    with torch.no_grad():
        for path, tensor in target.items():
            value = given.get(path)
            if value is None:
                tensor.zero_()
            else:
                tensor.copy_(value)


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
