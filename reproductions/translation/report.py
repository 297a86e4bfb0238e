"""``aiayn train-report RUN [RUN ...]``: ``bleu-training.{md,json}`` from finished runs.

Each RUN is a ``--work`` folder of ``aiayn train`` (it holds the run's ``results.json``). The
report puts every run in one table (language pair, corpus, model, compute, dev perplexity, test
sacreBLEU / paper-style tokenized BLEU / chrF / repetition) beside the paper's Table 2 EN-DE and
EN-FR cells, transcribed and labelled as such, never presented as comparable; then why beam search
repeats (``diagnose.py``'s measurements, with the verdict they support); then each run's details,
signatures and first test examples. Every number comes from the runs' own results, which the
report's JSON stores (key ``results``): :func:`rerender` renders the report again from them, and the
registry marks the report STALE when the training code has changed since the runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiayn.kit import Report, Scope, rounded, write_report

STEM = "bleu-training"
PAIR_NAMES = {"en": "EN", "de": "DE", "fr": "FR"}
#: A majority: the model "prefers" its loops when it scores more than half of them above the references.
MAJORITY = 0.5


def load_run(folder: Path) -> dict[str, Any]:
    """The ``results.json`` of a finished run folder (a clear error when the run did not finish)."""
    path = Path(folder) / "results.json"
    if not path.exists():
        raise FileNotFoundError(
            f"run folder {folder}: no results.json; run `aiayn train --work {folder} ...` to the end first"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def pair_of(r: dict[str, Any]) -> str:
    langs = r.get("langs") or ["en", "de"]
    return f"{PAIR_NAMES.get(langs[0], langs[0])}→{PAIR_NAMES.get(langs[1], langs[1])}"


def _brevity(score: dict[str, Any]) -> str:
    """sacreBLEU's brevity penalty, read from its summary line ("... (BP = 0.872 ratio = ...")."""
    m = re.search(r"BP = ([0-9.]+)", score.get("sacrebleu_summary", ""))
    return m.group(1) if m else "n/a"


def _threads(n: int) -> str:
    return "1 thread" if n == 1 else f"{n} threads"


def _rep(score: dict[str, Any]) -> str:
    if "repetition_rate" not in score:
        return "n/a"
    return f"{score['repetition_rate']:.1%} ({score['looping_lines']} looping)"


#: Level of the two-sided test behind a claimed change in looping lines.
LEVEL = 0.05


def looping_trend(low: tuple[float, int], high: tuple[float, int]) -> str:
    """Whether looping lines change from the smallest α to the largest, as a stated test.

    The same sentences are decoded at both α, so the comparison is paired: McNemar's exact test on
    the lines that loop under one α only. Only the counts are stored, not which lines loop; the
    discordant lines are at least |n_high - n_low|, and the smallest p any pairing can give is
    2 * 0.5^|n_high - n_low| (all discordant lines one way). If even that exceeds :data:`LEVEL`, the
    change is not separable from chance; otherwise a change is possible but the counts cannot show it.
    """
    (a0, n0), (a1, n1) = low, high
    k = abs(n1 - n0)
    p_min = min(1.0, 2.0 * 0.5**k)
    if k == 0:
        return f"no change from α = {a0:g} to α = {a1:g}"
    if p_min > LEVEL:
        return (
            f"{n0} to {n1} from α = {a0:g} to α = {a1:g} is not separable from chance "
            f"(McNemar's exact test: even the most favourable pairing of the lines gives p = {p_min:.3g} > {LEVEL})"
        )
    return (
        f"{n0} to {n1} from α = {a0:g} to α = {a1:g}: McNemar's exact p could be as low as {p_min:.2g}, but the "
        "stored counts do not say which lines loop, so the paired test cannot be completed (not checked)"
    )


def diagnosis_verdict(d: dict[str, Any]) -> dict[str, str]:
    """What the diagnosis supports, each part a comparison with its criterion (see ``diagnose.py``).

    - bug: ruled out when every sentence's search log-probability equals the teacher-forced
      rescoring within ``AGREE_NATS``; else a possible bug;
    - length penalty: how the looping lines change from α = 0 to the run's α and to α = 1;
    - model: the model prefers its loops when it scores more than :data:`MAJORITY` of the looping
      outputs above the references (length-normalised as the search scores).
    """
    res = d["rescoring"]
    bug = (
        (
            "ruled out: the search's log-probabilities equal a float64 teacher-forced rescoring within "
            f"{res['agree_nats']} nats (max {res['max_abs_nats']:.1e} over {res['sentences']} sentences)"
        )
        if res["agree"]
        else (
            "POSSIBLE BUG: the search's log-probabilities differ from the rescoring by up to "
            f"{res['max_abs_nats']:.3g} nats"
        )
    )
    by_alpha = sorted((v["alpha"], v["looping_lines"]) for v in d["decodes"].values() if v["alpha"] is not None)
    loops = ", ".join(f"{n} at α = {a:g}" for a, n in by_alpha)
    greedy = d["decodes"].get("greedy", {}).get("looping_lines")
    penalty = f"looping lines by α: {loops}; greedy {greedy}; {looping_trend(by_alpha[0], by_alpha[-1])}"
    looping, preferred = d["looping_outputs"], d["model_prefers_looping_output_over_reference"]
    if looping == 0:
        model = "no looping output to judge"
    elif preferred > MAJORITY * looping:
        model = (
            f"the model scores {preferred} of its {looping} looping outputs above the references: the search finds "
            "what the model prefers"
        )
    else:
        model = f"the model scores only {preferred} of its {looping} looping outputs above the references"
    return {"bug": bug, "length_penalty": penalty, "model": model}


def _section_diagnosis(rep: Report, r: dict[str, Any]) -> None:
    d = r.get("diagnosis")
    if d is None:
        return
    v = diagnosis_verdict(d)
    rows = [
        [
            label,
            f"{x['sacrebleu']:.2f}",
            f"{x['chrf']:.2f}",
            f"{x['bp']:.3f}",
            f"{x['repetition_rate']:.1%}",
            f"{x['looping_lines']} / {x['lines']}",
            str(x["at_max_length"]),
        ]
        for label, x in d["decodes"].items()
    ]
    mean = d["mean_normalised_logprob"]
    rep.section(
        f"{pair_of(r)}: why beam search repeats",
        "The averaged model decoded four ways on the test books (`reproductions/translation/diagnose.py`). Repetition: "
        "of all 4-grams of the outputs (whitespace tokens), the share that repeat an earlier 4-gram of the same line; "
        'looping lines: lines where some 4-gram occurs 3 times or more. "at max length": outputs cut at input + 50 '
        "tokens.",
        "",
    )
    rep.table(
        ["decoding", "sacreBLEU", "chrF", "BP", "repeated 4-grams", "looping lines", "at max length"], rows, "lrrrrrr"
    )
    rep.add(
        "",
        f"Reference repetition for comparison: {r['test'].get('reference_repetition_rate', float('nan')):.1%} of "
        f"4-grams, {r['test'].get('reference_looping_lines', 'n/a')} looping lines.",
        "",
        f"- A bug in the search or its cache: {v['bug']}; the search's accumulated score is the same number a plain "
        "forward pass gives (float32 rounding of that pass: at most "
        f"{d['rescoring']['float32_rounding_max_abs_nats']:.1e} nats).",
        f"- The length penalty: {v['length_penalty']}.",
        f"- The model: {v['model']}; over all {d['sentences']} sentences it scores its beam output above the reference "
        f"{d['model_prefers_output_over_reference']} times (mean length-normalised log-probability: beam "
        f"{mean['beam']:.2f}, greedy {mean['greedy']:.2f}, reference {mean['reference']:.2f}), and the beam's output "
        f"scores at least as well as greedy's for {d['beam_scores_at_least_greedy']} of {d['sentences']} sentences "
        "(the search does its job).",
    )


def _measurement(runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {
        "codes": sorted({r.get("measurement", {}).get("code", "unknown") for r in runs}),
        "commits": sorted({r.get("measurement", {}).get("commit", "unknown") for r in runs}),
    }


def make_report(runs: list[dict[str, Any]]) -> Report:
    """``bleu-training.{md,json}``: our runs beside Table 2's transcribed cells (not comparable)."""
    from aiayn.reproductions.paper import printed
    from aiayn.reproductions.registry import BY_NAME, staleness_line

    if not runs:
        raise ValueError("runs: expected at least one finished run")
    runs = rounded(runs)
    measurement = _measurement(runs)
    seeds = ",".join(str(r["seed"]) for r in runs)
    rep = Report(
        STEM,
        "BLEU reproduction: the paper's recipe trained with our own equations",
        precision="float32",
        seed=seeds,
        packages=("torch", "sacrebleu", "sentencepiece", "numpy"),
    )
    rep.generator = (__name__,)
    presets = sorted({str(r["preset"]) for r in runs})
    rep.scope = Scope(
        label=f"preset {', '.join(presets)}, {len(runs)} run{'s' if len(runs) > 1 else ''}",
        size=float(sum(r.get("train_target_tokens") or 0 for r in runs)),
        full="smoke" not in presets,
    )
    rep.fields = {"results_commit": ",".join(measurement["commits"]), "results_code": ",".join(measurement["codes"])}
    rep.verdict = (
        "; ".join(
            f"{pair_of(r)} ({r['preset']}, {r['parameters'] / 1e6:.1f}M parameters, {r['train_seconds'] / 60:.0f} min "
            f"on {r['device']}): sacreBLEU {r['test']['sacrebleu']:.2f}, tokenized BLEU "
            f"{r['test']['tokenized_bleu']:.2f}, chrF {r['test']['chrf']:.2f}"
            + (f", {r['test']['repetition_rate']:.0%} repeated 4-grams" if "repetition_rate" in r["test"] else "")
            + (
                f" (bug {'ruled out' if r['diagnosis']['rescoring']['agree'] else 'NOT ruled out'})"
                if "diagnosis" in r
                else ""
            )
            for r in runs
        )
        + " on held-out test books; not comparable to Table 2's WMT14 figures"
    )
    rep.add(
        "",
        "What: the paper's encoder-decoder trained by `aiayn train` (model, training and decoding "
        "computed by the equations `aiayn check torch-sdpa` checks), checkpoints averaged, beam search as §6.1 "
        "through the cached decoder and beam search the suite's decoding checks pass "
        "([conformance-translation.md](conformance-translation.md), `aiayn check "
        "aiayn.reproductions.translation.checked:TranslationDecoder`), "
        "scored on whole held-out books with sacreBLEU, the paper-style tokenized BLEU (German: compound splitting; "
        "French: French rules, no splitting) and chrF. How each score is computed, and how the two BLEUs differ on "
        "sixteen real WMT17 systems: [bleu.md](bleu.md); Table 3's model variations at this scale: "
        "[bleu-ablation.md](bleu-ablation.md).",
        "",
        staleness_line(BY_NAME[STEM], measurement),
    )
    rep.section("Our runs (test books, averaged checkpoints, beam 4)")
    body = []
    for r in runs:
        s = r["summary"]
        greedy = f"{r['test_greedy']['sacrebleu']:.2f}" if "test_greedy" in r else "n/a"
        body.append(
            [
                pair_of(r),
                r["preset"],
                f"{r['parameters']:,}",
                f"{s['steps']:,}",
                f"{s['tokens']:,}",
                f"{r['train_seconds'] / 60:.1f} min, {r['world']} x {r['device']} ({_threads(r['threads'])})",
                f"{s['tokens'] / r['train_seconds']:,.0f}",
                f"{r['dev_last']['ppl']:.1f} / {r['dev_averaged']['ppl']:.1f}",
                f"**{r['test']['sacrebleu']:.2f}**",
                f"{r['test']['tokenized_bleu']:.2f}",
                f"{r['test']['chrf']:.2f}",
                _brevity(r["test"]),
                _rep(r["test"]),
                greedy,
                _brevity(r["test_greedy"]) if "test_greedy" in r else "n/a",
            ]
        )
    rep.table(
        [
            "pair",
            "preset",
            "parameters",
            "steps",
            "target tokens seen",
            "training",
            "target tokens/s",
            "dev PPL last / averaged",
            "sacreBLEU",
            "tokenized BLEU (paper style)",
            "chrF",
            "BP",
            "repeated 4-grams",
            "greedy sacreBLEU",
            "greedy BP",
        ],
        body,
        "llrrrlrrrrrrrrr",
    )
    loads = [
        f"{pair_of(r)} {r['loadavg']['start'][0]:.1f} → {r['loadavg']['end'][0]:.1f} on {r['cpus']} CPUs"
        for r in runs
        if "loadavg" in r
    ]
    rep.add(
        "",
        "Dev PPL: exp of the mean plain NLL (no smoothing) per target BPE piece on the dev books, of the last "
        "checkpoint and of the average of the last checkpoints (§6.1) that is then decoded. BP: sacreBLEU's brevity "
        "penalty (1 when the output is at least as long as the reference). Repeated 4-grams: of all 4-grams of the "
        "outputs, the share that repeat an earlier 4-gram of the same line (see the diagnosis below). The time limit "
        "counts wall-clock time, so other work on the machine costs training tokens: 1-minute load average at the "
        "start and end of training " + ("; ".join(loads) if loads else "not recorded") + ".",
    )
    for r in runs:
        _section_diagnosis(rep, r)
    rep.section(
        "The paper's Table 2 (transcribed, newstest2014) — for orientation only",
        'Printed values (PAPER.md, Table 2 rows "Transformer (base model)" and "Transformer (big)"): WMT14 results of '
        "4.5M (EN-DE) and 36M (EN-FR) sentence pairs, 8 P100 GPUs for 12 hours (base) or 3.5 days (big), tokenized "
        "BLEU with compound splitting. Ours is a different corpus, register, model size and compute budget: no number "
        "here is comparable to them.",
        "",
    )
    rep.table(
        ["model (Table 2 row)", "EN-DE BLEU (printed)", "EN-FR BLEU (printed)"],
        [
            [m, printed(f"table2.{m}.bleu_en_de").text, printed(f"table2.{m}.bleu_en_fr").text]
            for m in ("Transformer (base model)", "Transformer (big)")
        ],
        "lrr",
    )
    seen = ", ".join(
        f"{r['summary']['tokens'] / 1e6:.1f}M target tokens ({pair_of(r)})"
        + (
            f", {r['summary']['tokens'] / r['train_target_tokens']:.1f} passes over its training side"
            if r.get("train_target_tokens")
            else ""
        )
        for r in runs
    )
    sizes = ", ".join(f"{r['parameters'] / 1e6:.1f}M ({pair_of(r)})" for r in runs)
    pairs = ", ".join(f"{r['pairs']['train']:,} verse pairs ({pair_of(r)})" for r in runs)
    base_tokens = printed("s5.2.base.steps").value * printed("s5.1.batch_target_tokens").value  # printed, §5.1 and §5.2
    rep.section(
        "Why our numbers are far from the paper's",
        *[
            f"- {x}"
            for x in (
                f"Compute: minutes on a CPU instead of 8 P100 GPUs for 12 hours; our models saw {seen}, where the base "
                f"model sees {printed('s5.2.base.steps').value:,} steps of about "
                f"{printed('s5.1.batch_target_tokens').value:,} target tokens (about {base_tokens / 1e9:.1f} billion; "
                "§5.1 and §5.2, printed).",
                f"Size: {sizes} parameters instead of 65M (Table 3, base); {pairs} instead of 4.5M (EN-DE) or 36M "
                "(EN-FR) sentence pairs (§5.1).",
                "Data: Bible translations of 1910-1951 (Schlachter German, Segond French) against a modern English one "
                "(World English Bible); they are not sentence-for-sentence literal, and the held-out books hold names "
                "and topics unseen in training.",
                "Scoring: one reference; sacreBLEU is detokenized, the paper's BLEU is tokenized (German: with "
                "compound splitting; both shown; their gap on real WMT17 systems is in bleu.md).",
            )
        ],
    )
    for r in runs:
        c, s, t = r["config"], r["summary"], r["test"]
        rep.section(
            f"{pair_of(r)} ({r['preset']}): what was run",
            *[
                f"- {line}"
                for line in (
                    f"Corpus: {r['source']['corpus']}"
                    + (
                        f"; dev books {r['source']['dev_books']}, test books {r['source']['test_books']} (whole books "
                        "held out)"
                        if "dev_books" in r["source"]
                        else ""
                    ),
                    f"Pairs: train {r['pairs']['train']:,}, dev {r['pairs']['dev']:,}, test {r['pairs']['test']:,}; "
                    f"joint BPE vocabulary {r['vocab']:,} (trained on the training side only)",
                    f"Model: N={c['n_layers']}, d_model={c['d_model']}, d_ff={c['d_ff']}, h={c['num_heads']}, "
                    f"P_drop={c['p_drop']}, eps_ls={c['eps_ls']}, {c['positional']} positions; {r['parameters']:,} "
                    "parameters (the shared embedding counted once)",
                    f"Training: {s['steps']:,} steps, {s['tokens']:,} target tokens, {r['train_seconds']:.0f} s on "
                    f"{r['device']} ({r['cpu']}, {_threads(r['threads'])} per worker), {r['world']} worker(s); "
                    f"{s['config']['max_tokens']:,} padded tokens per step, Eq. (3) warmup {s['config']['warmup']}, "
                    f"seed {r['seed']}",
                    f"Averaged checkpoints: {', '.join(r['averaged'])}",
                    f"Decoding: beam {r['beam']}, α = {r['alpha']}, maximum length input + 50, early stopping; "
                    f"{r['decode_seconds']:.0f} s for the test books"
                    + (f"; the diagnosis took {r['diagnosis_seconds']:.0f} s" if "diagnosis_seconds" in r else ""),
                    f"sacreBLEU: `{t['sacrebleu_summary']}`",
                    f"Signatures: BLEU `{t['sacrebleu_signature']}`; chrF `{t['chrf_signature']}`; tokenized "
                    f"`{t['tokenized_signature']}`",
                    f"Measured at commit {r.get('measurement', {}).get('commit', 'unknown')} by code "
                    f"{r.get('measurement', {}).get('code', 'unknown')}",
                )
            ],
        )
        rep.add("", "First test verses:", "")
        for e in r["examples"]:
            rep.add(f"- src: {e['src']}", f"  - ref: {e['ref']}", f"  - hyp: {e['hyp']}")
    rep.data.update(
        results=runs,
        measurement=measurement,
        diagnosis_verdicts={pair_of(r): diagnosis_verdict(r["diagnosis"]) for r in runs if "diagnosis" in r},
        paper_table2_transcribed={
            m: {lang: printed(f"table2.{m}.bleu_{lang}").value for lang in ("en_de", "en_fr")}
            for m in ("Transformer (base model)", "Transformer (big)")
        },
    )
    return rep


def rerender(data: dict[str, Any], out_dir: Path) -> str:
    """bleu-training.{md,json} again from the runs' results stored in its JSON (``data["results"]``)."""
    report = make_report(data["results"])
    write_report(Path(out_dir), report)
    return report.verdict
