"""Our model's training step as a plug-in for the training-throughput benchmark (``aiayn bench``).

The benchmark suite (``benchmarks/``) never imports the reproductions; ``aiayn bench`` names this
factory by its spec, ``aiayn.reproductions.translation.bench:training_step``, as it names an
implementation, and the suite calls it with a configuration and a batch. The step is exactly the
training loop's (``train.py``): the model of ``model.py`` (the torch-sdpa built-in's equations,
fused attention, tiled past ``attention_tile`` positions), §5.4's loss with its closed-form gradient
summed over target tokens and divided by their number, Adam (0.9, 0.98, 1e-9) at Eq. (3)'s rate.
Not imported by the training runs, so changing it does not make their reports stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aiayn.reproductions.translation.model import Transformer
from aiayn.reproductions.translation.train import smoothed_cross_entropy

NAME = "aiayn (torch-sdpa equations)"


def training_step(
    config: Any, vocab_size: int, batch: dict[str, torch.Tensor], *, seed: int = 0, attention_tile: int = 256
) -> Callable[[], float]:
    """A no-argument function doing one training step of our model on ``batch``; returns the loss.

    ``batch``: ``src`` (B, n_src), ``src_lengths`` (B,), ``tgt_in`` (B, n_tgt), ``tgt_out`` (B, n_tgt),
    ``tgt_lengths`` (B,), int64.
    """
    torch.manual_seed(seed)
    n = max(batch["src"].shape[1], batch["tgt_in"].shape[1])
    model = Transformer(config, vocab_size, max_positions=n + 1, attention_tile=attention_tile)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    lr = model.impl.lrate(1000, config.d_model, 4000)
    for group in optimizer.param_groups:
        group["lr"] = lr
    keep = torch.arange(batch["tgt_out"].shape[1])[None, :] < batch["tgt_lengths"][:, None]
    tokens = int(keep.sum())

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch["src"], batch["src_lengths"], batch["tgt_in"], batch["tgt_lengths"])
        losses = smoothed_cross_entropy(logits, batch["tgt_out"], config.eps_ls)
        loss = torch.where(keep, losses, torch.zeros((), dtype=losses.dtype)).sum() / tokens
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step
