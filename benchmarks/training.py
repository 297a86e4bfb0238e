"""Training throughput: our model's training step beside PyTorch's ``nn.Transformer``, same configuration.

The cases (``test_bench_training.py``) time one training step (forward, §5.4's label-smoothed loss,
backward, Adam) of two models of the same configuration on the same synthetic batch, one thread,
in one run, and set each against the session's torch float32 GEMM ceiling:

- **ours**: a training-step factory named by spec (``--bench-training-step``; ``aiayn bench``
  passes ``aiayn.reproductions.translation.bench:training_step``, the model ``aiayn train``
  trains). The suite never imports the reproductions: it loads the factory as it loads an
  implementation, by its spec;
- **the peer**: :class:`Peer`, ``nn.Transformer`` built the way its documentation recommends
  (``batch_first=True``; key-padding masks; the causal mask from
  ``nn.Transformer.generate_square_subsequent_mask`` with ``tgt_is_causal=True``), with the
  paper's configuration: post-norm (``norm_first=False``), ReLU, no final LayerNorm on either stack
  (the paper has none: ``nn.TransformerEncoder/Decoder(norm=None)``), one ``nn.Embedding`` shared by
  source, target and the pre-softmax projection (§3.4) scaled by √d_model, sinusoids (§3.5), and
  dropout only where the paper puts it (residual dropout on sub-layer outputs and on the embedding
  sums: the layers' attention-weight dropout and FFN-inner dropout, which ``nn.Transformer`` adds,
  are set to 0 and identity after construction, so both models do the same arithmetic). Its loss is
  ``F.cross_entropy(label_smoothing=ε)`` (PyTorch's own §5.4 over K classes), its optimizer the same Adam.

Model FLOP utilisation: ``aiayn.reference.counts.training_step_flops`` (three forward passes'
matrix products) divided by the step's time and by the session's torch float32 GEMM ceiling.
Memory: the peak bytes of one training step at long sequence lengths (B = 1), ours with its tiled
attention, ours untiled, and the peer.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aiayn.implementations.torch_impl import TorchImplementation
from aiayn.reference.counts import BASE, TransformerConfig, training_step_flops

__all__ = [
    "CONFIGS",
    "MEMORY_LENGTHS",
    "MemoryCase",
    "Peer",
    "TrainingCase",
    "load_factory",
    "peer_step",
    "synthetic_batch",
]

#: name -> (configuration, vocabulary, sentences, positions per side): the CPU preset at its 4000-token batch, and the
#: base model (Table 3) at a 1000-token batch (one thread: a few seconds a step).
CONFIGS: dict[str, tuple[TransformerConfig, int, int, int]] = {
    "cpu": (TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4, p_drop=0.1), 4000, 100, 40),
    "base": (BASE, 37000, 25, 40),
}
#: The smoke subset: a tiny configuration, seconds.
SMOKE_CONFIG = ("tiny", (TransformerConfig(n_layers=1, d_model=32, d_ff=64, num_heads=4, p_drop=0.1), 200, 8, 12))
#: Sequence lengths of the memory cases (B = 1, the CPU preset's model).
MEMORY_LENGTHS: tuple[int, ...] = (256, 512, 1024, 2048)
SMOKE_MEMORY_LENGTHS: tuple[int, ...] = (64, 128)
MODELS = ("ours", "peer")


@dataclass(frozen=True)
class TrainingCase:
    """One training step of ``model`` ("ours" or "peer") on configuration ``name``."""

    name: str
    model: str
    config: TransformerConfig
    vocab: int
    batch: int
    n: int

    @property
    def id(self) -> str:
        return f"train-{self.name}-{self.model}"

    @property
    def group(self) -> str:
        return f"training step {self.name} (B={self.batch}, n={self.n}, V={self.vocab})"

    @property
    def target_tokens(self) -> int:
        return self.batch * self.n

    @property
    def flops(self) -> int:
        """Training-step operations from ``aiayn.reference.counts`` (three forward passes' products)."""
        return training_step_flops(self.config, self.vocab, self.batch, self.n, self.n)


@dataclass(frozen=True)
class MemoryCase:
    """Peak memory of one training step at sequence length ``n`` (B = 1): ours tiled, ours untiled, or the peer."""

    model: str  # "ours", "ours-untiled", "peer"
    n: int
    config: TransformerConfig
    vocab: int
    tile: int = 256  # ours: query rows per attention tile

    @property
    def id(self) -> str:
        return f"train-memory-{self.model}-n{self.n}"

    @property
    def group(self) -> str:
        return "training step memory (B=1)"


def synthetic_batch(batch: int, n: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids (4 .. vocab−1, ids 0-3 reserved) of ``batch`` sentences of ``n`` positions a side, no padding."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, n), generator=g)
    tgt = torch.randint(4, vocab, (batch, n + 1), generator=g)
    lengths = torch.full((batch,), n)
    return {"src": src, "src_lengths": lengths, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:], "tgt_lengths": lengths}


def load_factory(spec: str) -> Callable[..., Callable[[], float]]:
    """The training-step factory ``module:attr`` names (loaded on demand, like an implementation)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--bench-training-step: expected module:attr, got {spec!r}")
    return getattr(importlib.import_module(module), attr)


class Peer(nn.Module):
    """``nn.Transformer`` with the paper's configuration (see the module docstring)."""

    def __init__(self, config: TransformerConfig, vocab: int, max_positions: int) -> None:
        super().__init__()
        d, p = config.d_model, config.p_drop
        self.d_model = d
        self.embedding = nn.Embedding(vocab, d)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, config.num_heads, config.d_ff, p, batch_first=True),
            config.n_layers,
            norm=None,
            enable_nested_tensor=False,
        )
        decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d, config.num_heads, config.d_ff, p, batch_first=True),
            config.n_layers,
            norm=None,
        )
        self.transformer = nn.Transformer(
            d,
            config.num_heads,
            config.n_layers,
            config.n_layers,
            config.d_ff,
            p,
            batch_first=True,
            custom_encoder=encoder,
            custom_decoder=decoder,
        )
        for layer in [*encoder.layers, *decoder.layers]:
            layer.dropout = nn.Identity()  # the FFN-inner dropout the paper does not have
            for attention in ("self_attn", "multihead_attn"):
                if hasattr(layer, attention):
                    getattr(layer, attention).dropout = 0.0  # attention-weight dropout: not in the paper
        pe = TorchImplementation(device="cpu").positional_encoding(max_positions, d, "float32")
        self.register_buffer("pe", pe, persistent=False)
        self.drop = nn.Dropout(p)

    def forward(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor, tgt_lengths: torch.Tensor
    ) -> torch.Tensor:
        scale = math.sqrt(self.d_model)
        x = self.drop(self.embedding(src) * scale + self.pe[: src.shape[1]])
        y = self.drop(self.embedding(tgt_in) * scale + self.pe[: tgt_in.shape[1]])
        src_pad = torch.arange(src.shape[1])[None, :] >= src_lengths[:, None]  # True = padding, as nn.Transformer wants
        tgt_pad = torch.arange(tgt_in.shape[1])[None, :] >= tgt_lengths[:, None]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.transformer(
            x,
            y,
            tgt_mask=causal,
            src_key_padding_mask=src_pad.float().masked_fill(src_pad, -math.inf),
            tgt_key_padding_mask=tgt_pad.float().masked_fill(tgt_pad, -math.inf),
            memory_key_padding_mask=src_pad.float().masked_fill(src_pad, -math.inf),
            tgt_is_causal=True,
        )
        return F.linear(h, self.embedding.weight)  # the shared matrix as the pre-softmax projection (§3.4)


def peer_step(
    config: TransformerConfig, vocab_size: int, batch: dict[str, torch.Tensor], *, seed: int = 0
) -> Callable[[], float]:
    """One training step of :class:`Peer` on ``batch`` (the same contract as our factory)."""
    torch.manual_seed(seed)
    n = max(batch["src"].shape[1], batch["tgt_in"].shape[1])
    model = Peer(config, vocab_size, n + 1)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch["src"], batch["src_lengths"], batch["tgt_in"], batch["tgt_lengths"])
        loss = F.cross_entropy(
            logits.reshape(-1, vocab_size), batch["tgt_out"].reshape(-1), label_smoothing=config.eps_ls
        )
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def step_of(
    model: str,
    factory: Callable[..., Callable[[], float]] | None,
    config: TransformerConfig,
    vocab: int,
    batch: dict[str, torch.Tensor],
    **kwargs: Any,
) -> Callable[[], float]:
    """The step function of ``model``: "peer", or ours through ``factory`` ("ours-untiled": no tiling)."""
    if model == "peer":
        return peer_step(config, vocab, batch)
    if factory is None:
        raise ValueError("our training step needs --bench-training-step (aiayn bench passes it)")
    if model == "ours-untiled":
        return factory(config, vocab, batch, attention_tile=10**9)
    return factory(config, vocab, batch, **kwargs)


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def profile_step(step: Callable[[], float]) -> dict[str, Any]:
    """Where one step's time goes: self CPU time in matrix products against the rest, and the largest other
    operations."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    gemm = (
        sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"))
        / 1e6
    )
    others = sorted(
        (e for e in events if e.key not in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
        key=lambda e: -e.self_cpu_time_total,
    )[:6]
    return {"total_s": total, "gemm_s": gemm, "top_other": [[e.key, e.self_cpu_time_total / 1e6] for e in others]}


def training_cases(names: tuple[str, ...], smoke: bool) -> list[TrainingCase]:
    configs = dict([SMOKE_CONFIG]) if smoke else {k: CONFIGS[k] for k in names}
    return [
        TrainingCase(name, model, cfg, vocab, b, n) for name, (cfg, vocab, b, n) in configs.items() for model in MODELS
    ]


def memory_cases(smoke: bool) -> list[MemoryCase]:
    cfg, vocab = (
        (SMOKE_CONFIG[1][0], SMOKE_CONFIG[1][1])
        if smoke
        else (replace(CONFIGS["cpu"][0], p_drop=0.0), CONFIGS["cpu"][1])
    )
    lengths = SMOKE_MEMORY_LENGTHS if smoke else MEMORY_LENGTHS
    tile = 32 if smoke else 256  # the smoke lengths must exceed the tile, or nothing is tiled
    return [MemoryCase(model, n, cfg, vocab, tile) for model in ("ours", "ours-untiled", "peer") for n in lengths]
