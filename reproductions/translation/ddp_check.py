"""A few data-parallel steps on a tiny synthetic corpus, for the DDP test (run under torchrun).

``torchrun --nproc_per_node=2 -m aiayn.reproductions.translation.ddp_check OUT.pt`` trains the model of
:func:`tiny_setup` for :data:`STEPS` steps with the gloo backend and rank 0 saves the final
state dict to OUT.pt; ``tests/test_translation.py`` compares it with one process running the same
global batches as 2 accumulated shards.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from aiayn.reference.counts import TransformerConfig
from aiayn.reproductions.translation import data as D
from aiayn.reproductions.translation.model import Transformer
from aiayn.reproductions.translation.train import TrainConfig, train

STEPS = 3


def tiny_setup(world: int, accumulate: int) -> tuple[Transformer, list[D.Example], TrainConfig]:
    """The same initial model, corpus and settings on every worker (p_drop 0: no RNG in the step)."""
    torch.manual_seed(5)
    vocab = D.synthetic_vocab()
    cfg = TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.0)
    model = Transformer(cfg, vocab.size, max_positions=32)
    examples = D.encode_pairs(D.synthetic_pairs(200, 3), vocab)
    tc = TrainConfig(
        max_tokens=200, steps=STEPS, warmup=2, accumulate=accumulate, checkpoint_steps=10**6, log_steps=10**6
    )
    return model, examples, tc


def main(out: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        model, examples, tc = tiny_setup(dist.get_world_size(), 1)
        train(model, examples, tc, Path(tempfile.mkdtemp(prefix=f"aiayn-ddp{dist.get_rank()}-")), log=lambda *a: None)
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
