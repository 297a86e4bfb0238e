"""``python -m reproductions.translation``: train, average, decode and score; write reports/bleu-training.*.

Examples:
    python -m reproductions.translation --preset smoke                 # seconds, synthetic task
    python -m reproductions.translation --preset cpu                   # EN->DE Bible, 1.4M params, 15 min
    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 -m reproductions.translation --preset cpu \
        --work runs/cpu-en-de                                          # the same as 2 gloo workers (make reproduce)
    python -m reproductions.translation --preset cpu --tgt-lang fr --work runs/cpu-en-fr   # EN->FR
    # the base model on WMT14 EN-DE, 8 GPUs (paths prepared by the user: BPE-ready plain text):
    torchrun --nproc_per_node=8 -m reproductions.translation --preset base \\
        --train-src wmt14/train.en --train-tgt wmt14/train.de --dev-src wmt14/newstest2013.en \\
        --dev-tgt wmt14/newstest2013.de --test-src wmt14/newstest2014.en --test-tgt wmt14/newstest2014.de \\
        --work runs/base --steps 100000
    (``--max-tokens`` is the global budget, 25000 by default, split across the 8 workers.)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from reproductions.translation.run import PRESETS, run

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reproductions.translation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--config", default=None, help="a Table 3 row name (base, big, C4, E, ...) instead of the preset's model")
    p.add_argument("--src-lang", default="en", choices=["en", "de", "fr"])
    p.add_argument("--tgt-lang", default="de", choices=["en", "de", "fr"])
    for side in ("train", "dev", "test"):
        p.add_argument(f"--{side}-src", type=Path, default=None)
        p.add_argument(f"--{side}-tgt", type=Path, default=None)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides the preset; drops its time limit unless --minutes)")
    p.add_argument("--minutes", type=float, default=None, help="training wall-time limit")
    p.add_argument("--max-tokens", type=int, default=None, help="global token budget per step (split across workers)")
    p.add_argument("--accumulate", type=int, default=None, help="shards per worker per step")
    p.add_argument("--warmup", type=int, default=None, help="Eq. (3) warmup steps (overrides the preset)")
    p.add_argument("--lr-scale", type=float, default=None, help="multiplies Eq. (3)'s learning rate (1 = the paper; overrides the preset)")
    p.add_argument("--beam", type=int, default=4, help="beam size (0 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty")
    p.add_argument("--greedy-too", action="store_true", help="also score greedy decoding")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default=None)
    p.add_argument("--work", default="runs/translation", help="checkpoints, vocabulary, outputs (resumed if present)")
    p.add_argument("--out", default=str(REPORTS))
    p.add_argument("--no-report", dest="report", action="store_false")
    args = p.parse_args(argv)
    if args.train_src and not all((args.train_tgt, args.dev_src, args.dev_tgt, args.test_src, args.test_tgt)):
        p.error("--train-src needs --train-tgt, --dev-src, --dev-tgt, --test-src and --test-tgt")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    try:
        run(args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
