"""The options of ``aiayn train``, ``aiayn train-report`` and ``aiayn ablation``, and what each runs.

Examples::

    aiayn train --preset smoke --work runs/smoke       # seconds, synthetic task
    aiayn train --preset cpu --work runs/cpu-en-de     # EN->DE Bible, 1.4M params, 15 min
    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 -m aiayn train --preset cpu \\
        --work runs/cpu-en-de                          # the same as 2 gloo workers (make reproduce)
    aiayn train --preset cpu --tgt-lang fr --work runs/cpu-en-fr   # EN->FR
    # the base model on WMT14 EN-DE, 8 GPUs (BPE-ready plain text prepared by the user):
    torchrun --nproc_per_node=8 -m aiayn train --preset base \\
        --train-src wmt14/train.en --train-tgt wmt14/train.de --dev-src wmt14/newstest2013.en \\
        --dev-tgt wmt14/newstest2013.de --test-src wmt14/newstest2014.en --test-tgt wmt14/newstest2014.de \\
        --work runs/base --steps 100000
    (--max-tokens is the global budget, 25000 by default, split across the 8 workers.)

A training run starts only when a preset is named. Importing this module imports no torch: the
options are read without it, and torch is imported when a command runs.
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from aiayn.environment import (
    UsageError,
    add_output_arguments,
    check_range,
    file_arguments,
    out_dir,
    writable_dir,
)

__all__ = [
    "PRESET_NAMES",
    "ROW_NAMES",
    "add_ablation_arguments",
    "add_report_arguments",
    "add_train_arguments",
    "check_device",
    "check_train_arguments",
    "run_ablation",
    "run_report",
    "run_train",
]

#: The presets of ``run.PRESETS`` (kept here so that ``--help`` needs no torch; a test keeps them equal).
PRESET_NAMES = ("smoke", "cpu", "cpu-wide", "gpu-base", "base")
#: The rows of ``ablation.ROWS`` (likewise), and of ``ablation.PAPER_ROWS`` (``--scale paper``).
ROW_NAMES = ("base", "A: h=1", "C: N=1", "C: d=64", "E: learned")
PAPER_ROW_NAMES = ("base", "A1", "C1", "C4", "E")
SCALE_ROWS = {"cpu": ROW_NAMES, "paper": PAPER_ROW_NAMES}


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        required=True,
        choices=PRESET_NAMES,
        help=(
            "smoke: seconds, synthetic task; cpu: EN->DE Bible, 1.4M parameters, 15 minutes; cpu-wide: 5.7M "
            "parameters, for machines with more cores; gpu-base: Table 3's base model on the Bible corpus, 10 minutes "
            "on a GPU; base: Table 3's base model on your corpus (--train-src ...)"
        ),
    )
    p.add_argument(
        "--config", default=None, help="a Table 3 row name (base, big, C4, E, ...) instead of the preset's model"
    )
    p.add_argument("--src-lang", default="en", choices=["en", "de", "fr"], help="source language of the Bible corpus")
    p.add_argument("--tgt-lang", default="de", choices=["en", "de", "fr"], help="target language of the Bible corpus")
    for side in ("train", "dev", "test"):
        p.add_argument(
            f"--{side}-src", type=Path, default=None, help=f"your own {side} source text (one sentence per line)"
        )
        p.add_argument(f"--{side}-tgt", type=Path, default=None, help=f"your own {side} target text")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps (overrides the preset; drops its time limit unless --minutes)",
    )
    p.add_argument("--minutes", type=float, default=None, help="training wall-time limit (default: the preset's)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="global token budget per step, split across workers (default: the preset's)",
    )
    p.add_argument("--accumulate", type=int, default=None, help="shards per worker per step")
    p.add_argument("--warmup", type=int, default=None, help="Eq. (3) warmup steps (default: the preset's)")
    p.add_argument(
        "--lr-scale",
        type=float,
        default=None,
        help="multiplies Eq. (3)'s learning rate (1 = the paper; default: the preset's)",
    )
    p.add_argument("--beam", type=int, default=4, help="beam size (0 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty")
    p.add_argument("--greedy-too", action="store_true", help="also score greedy decoding")
    p.add_argument("--seed", type=int, default=1, help="initial weights, dropout masks and batch order")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--work", default="runs/translation", help="checkpoints, vocabulary, outputs (resumed if present)")
    add_output_arguments(p)
    p.add_argument(
        "--no-report", dest="report", action="store_false", help="write results.json only, no bleu-training report"
    )


CORPUS_OPTIONS = ("train_src", "train_tgt", "dev_src", "dev_tgt", "test_src", "test_tgt")


def check_train_arguments(args: argparse.Namespace) -> None:
    """Every option of ``aiayn train`` that needs no torch, checked before the work; UsageError names the bad one."""
    corpus = {name: getattr(args, name) for name in CORPUS_OPTIONS}
    given = [name for name, path in corpus.items() if path is not None]
    if given and len(given) < len(corpus):
        missing = ", ".join("--" + n.replace("_", "-") for n in CORPUS_OPTIONS if n not in given)
        raise UsageError(f"your own corpus needs all six texts; missing {missing}")
    if args.preset == "base" and not given:
        raise UsageError(
            "--preset base trains on your corpus: give "
            "--train-src/--train-tgt/--dev-src/--dev-tgt/--test-src/--test-tgt"
        )
    file_arguments(**corpus)
    if not given and args.src_lang == args.tgt_lang:
        raise UsageError(f"--src-lang and --tgt-lang: expected two languages, got {args.src_lang} twice")
    if args.config is not None:
        from aiayn.reference.counts import TABLE3

        if args.config not in TABLE3:
            close = difflib.get_close_matches(args.config, list(TABLE3), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--config: {args.config!r} is no Table 3 row; known: {', '.join(TABLE3)}{hint}")
    for option, least in (("steps", 1), ("max_tokens", 1), ("accumulate", 1), ("warmup", 1), ("beam", 0)):
        check_range("--" + option.replace("_", "-"), getattr(args, option), least=least)
    check_range("--minutes", args.minutes, least=0, above=True)
    check_range("--lr-scale", args.lr_scale, least=0, above=True)
    check_range("--alpha", args.alpha, least=0)
    writable_dir(args.work, "--work")
    if args.report:
        args.out = str(out_dir(args.out))


def check_device(device: str | None) -> None:
    """``--device`` checked against what torch sees here, before the work; UsageError names what is missing."""
    if device is None:
        return
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device: {device!r} is no torch device ({' '.join(str(exc).split())[:160]})") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__})")
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s) here")
    if where.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {device}: torch sees no MPS device here")


def run_train(args: argparse.Namespace) -> int:
    """Train, average, decode, score; write ``<work>/results.json`` and (unless --no-report) bleu-training.*."""
    check_train_arguments(args)
    import torch
    import torch.distributed as dist

    from aiayn.reproductions.translation.run import run

    check_device(args.device)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    try:
        results = run(args)
        rank = dist.get_rank() if dist.is_initialized() else 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if args.report and rank == 0:
        from aiayn.kit import write_report
        from aiayn.reproductions.translation.report import make_report

        write_report(Path(args.out), make_report([results]), force=args.force)
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders (the --work of aiayn train)")
    add_output_arguments(p)


def run_report(args: argparse.Namespace) -> int:
    """``bleu-training.{md,json}`` from one or more finished runs."""
    from aiayn.kit import write_report
    from aiayn.reproductions.translation.report import load_run, make_report

    out = out_dir(args.out)
    runs = []
    for folder in args.runs:
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"RUN: {folder} is a file, expected a run folder (the --work of aiayn train)")
        try:
            run = load_run(folder)
            make_report([run])  # each run alone first, so that a bad one is named
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from None
        except ValueError as exc:  # json.JSONDecodeError included
            raise UsageError(f"RUN: {folder / 'results.json'} is not a results file of aiayn train ({exc})") from None
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            what = f"lacks {exc}" if isinstance(exc, KeyError) else f"does not read as one ({type(exc).__name__})"
            raise UsageError(f"RUN: {folder / 'results.json'} {what}; is it a finished run of aiayn train?") from None
        runs.append(run)
    write_report(out, make_report(runs), force=args.force)
    return 0


def add_ablation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scale",
        default="cpu",
        choices=list(SCALE_ROWS),
        help=(
            "cpu: five rows scaled down to 1.4M parameters; paper: Table 3's own rows (base, A1, C1, C4, E), for a GPU"
        ),
    )
    p.add_argument(
        "--rows", default=None, help="comma-separated rows of the scale (must include base; default: all of them)"
    )
    p.add_argument("--device", default="cpu", help="torch device of every run (cpu, cuda)")
    p.add_argument(
        "--seeds",
        default="1,2,3,4,5,6,7,8",
        help="comma-separated seeds, at least 2 (every row runs the same seeds: a paired design; 8 is the fewest "
        "with which the exact sign-flip test can separate a row under Holm over 4 rows: 4 x 2/2^8 < 0.05)",
    )
    p.add_argument("--tokens", type=int, default=800_000, help="target tokens each run trains on")
    p.add_argument("--max-tokens", type=int, default=1500, help="padded tokens per batch")
    p.add_argument("--warmup", type=int, default=300, help="Eq. (3) warmup steps")
    p.add_argument("--vocab", type=int, default=4000, help="joint BPE vocabulary size")
    p.add_argument("--beam", type=int, default=4, help="beam size")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at once, one thread each (on a 2-core machine 2 runs of 1 thread train about 1.3x faster "
        "in all than one run after another on 2 threads)",
    )
    p.add_argument(
        "--work", default="runs/ablation", help="one folder per (row, seed); finished runs are not run again"
    )
    add_output_arguments(p)


def check_ablation_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Validate and normalise the ablation options (rows and seeds as lists); UsageError names the bad one."""
    scale = getattr(args, "scale", "cpu")
    names = SCALE_ROWS[scale]
    if args.rows is None:
        args.rows = list(names)
    args.rows = (
        [r.strip() for r in args.rows.split(",") if r.strip()] if isinstance(args.rows, str) else list(args.rows)
    )
    unknown = [r for r in args.rows if r not in names]
    if unknown:
        raise UsageError(f"--rows: unknown row(s) {unknown} for --scale {scale}; known: {list(names)}")
    if "base" not in args.rows:
        raise UsageError("--rows: the comparison needs the 'base' row")
    if isinstance(args.seeds, str):
        try:
            args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise UsageError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    if len(set(args.seeds)) < 2:
        raise UsageError(f"--seeds: expected at least 2 distinct seeds (the spread is the point), got {args.seeds}")
    for name in ("tokens", "max_tokens", "warmup", "vocab", "beam", "jobs"):
        if getattr(args, name) < (0 if name == "beam" else 1):
            raise UsageError(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    writable_dir(args.work, "--work")
    args.out = str(out_dir(args.out))
    return args


def run_ablation(args: argparse.Namespace) -> int:
    """Train every (row, seed), score on the dev books, write ``bleu-ablation.{md,json}``."""
    from aiayn.kit import Scope, write_report
    from aiayn.reproductions.translation.ablation import run_all
    from aiayn.reproductions.translation.ablation_report import make_report

    report = make_report(*run_all(check_ablation_arguments(args)))
    runs = len(args.rows) * len(args.seeds)
    report.scope = Scope(
        label=f"{len(args.rows)} rows x {len(args.seeds)} seeds",
        size=float(runs * args.tokens),
        full=set(args.rows) >= set(SCALE_ROWS[args.scale]) and len(args.seeds) >= 5,
    )
    write_report(Path(args.out), report, force=args.force)
    for row in report.data["rows"]:
        print(
            f"{row['row']:12s} dev PPL {row['ppl_mean']:8.2f} {row['ppl']}  sacreBLEU {row['bleu_mean']:6.2f} "
            f"{row['bleu']}"
        )
    return 0
