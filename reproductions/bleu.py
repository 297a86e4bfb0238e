"""BLEU scoring two ways: the paper's tokenized BLEU and sacreBLEU's detokenized BLEU (and chrF).

Reproduces: how the paper scored its translations (``../shared/PAPER.md``, "Training and decoding
(§5, §6)": "tokenized BLEU (multi-bleu style) with hyphenated compounds split ("a-b" →
"a ##AT##-##AT## b") on output and reference"; the scores are Table 2's BLEU columns and §6.1's
text), beside today's standard, sacreBLEU's detokenized BLEU with its signature, and chrF. The
report scores a small German sample shipped in ``reproductions/data/bleu/`` both ways and shows,
sentence by sentence, why the two numbers differ. Runtime: about a second. With ``measure`` it
also writes ``bleu-wmt17.*``: sixteen WMT17 systems rescored both ways (``aiayn.reproductions.bleu_wmt17``;
data fetched at run time, so the drift test does not compare it).

The paper-style pipeline, each step ours:

1. :func:`tokenize`: a Moses-like tokenizer for German written for this project (Moses'
   ``tokenizer.perl -l de`` is what tensor2tensor's scoring script ran; we did not copy it, and
   the rules below are our own statement of what such a tokenizer does; where we chose, the
   docstring says so).
2. :func:`split_compounds`: every hyphen between two non-space characters becomes
   `` ##AT##-##AT## ``, scanning left to right without overlap, as the one-line substitution
   ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` of tensor2tensor's ``get_ende_bleu.sh`` does. So
   where a part between two hyphens is one character, its second hyphen stays:
   "Vitamin-D-Mangel" → "Vitamin ##AT##-##AT## D-Mangel" (the first match consumed the "D");
   the quirk is kept on purpose, as it is what the published numbers used.
3. :func:`multi_bleu`: corpus BLEU over whitespace tokens with our own arithmetic, as
   ``multi-bleu.perl`` defines it: clipped n-gram matches for n = 1..4 summed over the corpus,
   geometric mean of the four precisions, brevity penalty exp(1 − r/c) when the output is
   shorter (c < r), no smoothing (any zero precision gives 0), case-sensitive, one reference.
   The tests check it against sacreBLEU run with ``tokenize="none"`` on the same tokens.

sacreBLEU's BLEU (:func:`sacre_bleu`) and chrF (:func:`chrf`) are sacreBLEU's own defaults
(``tok:13a``, ``smooth:exp``; chrF2 with character 6-grams) on the untokenized text; their
signatures are returned verbatim.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.kit import Report, progress, write_report
from aiayn.reproductions.bleu_scoring import (
    AT_SEPARATOR,
    TOKENIZED_SIGNATURE,
    BleuScore,
    ChrfScore,
    agreement_bound,
    chrf,
    multi_bleu,
    ngram_stats,
    paper_tokens,
    sacre_bleu,
    sacre_bleu_pretokenized,
    tokenize,
    tokenize_13a,
    tokenized_bleu,
)

NAME = "bleu"
DATA = Path(__file__).resolve().parent / "data" / "bleu"


# ---------------------------------------------------------------------------------------------
# The shipped sample and the report
# ---------------------------------------------------------------------------------------------


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends."""
    return Path(path).read_text(encoding="utf-8").splitlines()


def load_sample(data: Path = DATA) -> dict[str, list[str]]:
    """The shipped sample: English sources, German references and German outputs, line-aligned."""
    sample = {side: read_lines(data / f"{side}.txt") for side in ("src.en", "ref.de", "hyp.de")}
    lengths = {side: len(lines) for side, lines in sample.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{data}: the three files must have the same number of lines, got {lengths}")
    return sample


@dataclass(frozen=True)
class Segment:
    """One sentence pair seen both ways: tokens and n-gram statistics under 13a and paper style."""

    index: int  # 1-based line number in the sample files
    src: str
    hyp: str
    ref: str
    hyp_13a: str
    ref_13a: str
    hyp_paper: str
    ref_paper: str
    counts_13a: tuple[int, ...]
    totals_13a: tuple[int, ...]
    counts_paper: tuple[int, ...]
    totals_paper: tuple[int, ...]

    @property
    def gain(self) -> int:
        """Matched n-grams (all orders) under paper style minus under 13a."""
        return sum(self.counts_paper) - sum(self.counts_13a)


def segments(sample: dict[str, list[str]]) -> list[Segment]:
    """Every sentence pair of ``sample`` tokenized both ways, with its n-gram statistics."""
    out = []
    for i, (src, hyp, ref) in enumerate(zip(sample["src.en"], sample["hyp.de"], sample["ref.de"]), 1):
        h13, r13, hp, rp = tokenize_13a(hyp), tokenize_13a(ref), paper_tokens(hyp), paper_tokens(ref)
        c13, t13 = ngram_stats(h13.split(), r13.split())
        cp, tp = ngram_stats(hp.split(), rp.split())
        out.append(Segment(i, src, hyp, ref, h13, r13, hp, rp, tuple(c13), tuple(t13), tuple(cp), tuple(tp)))
    return out


def matched_unigrams(hyp: str, ref: str) -> Counter:
    """The output's unigrams that count as matches (clipped by the reference), as a multiset."""
    return Counter(hyp.split()) & Counter(ref.split())


def _ratio(counts: Sequence[int], totals: Sequence[int]) -> str:
    return "/".join(f"{c}" for c in counts) + " of " + "/".join(f"{t}" for t in totals)


def _score_row(label: str, s: BleuScore) -> list[str]:
    return [label, f"{s.score:.2f}", "/".join(f"{p:.1f}" for p in s.precisions), f"{s.bp:.3f}",
            f"{s.sys_len} / {s.ref_len}", f"`{s.signature}`"]  # fmt: skip


def _as_dict(s: BleuScore) -> dict:
    return {"score": s.score, "counts": list(s.counts), "totals": list(s.totals), "precisions": list(s.precisions),
            "bp": s.bp, "sys_len": s.sys_len, "ref_len": s.ref_len, "signature": s.signature}  # fmt: skip


def _section_scores(report: Report, scores: dict[str, BleuScore], chrf_score: ChrfScore) -> dict:
    check = scores["paper_via_sacrebleu"]
    ours = scores["paper"]
    miss = abs(ours.score - check.score)
    bound = agreement_bound(ours)
    report.section(
        "Scores",
        "BLEU on the 0-100 scale; precisions are clipped n-gram matches over output n-grams, n = 1..4; BP is the "
        "brevity penalty exp(1 − r/c) when the output is shorter than the reference.",
        "",
    )
    report.table(
        ["scoring", "BLEU", "1/2/3/4-gram precision (%)", "BP", "output / reference tokens", "signature"],
        [
            _score_row("sacreBLEU: untokenized text, 13a tokenizer (today's standard)", scores["sacre"]),
            _score_row("Moses-like tokenization only (our tokenizer, no compound split)", scores["moses"]),
            _score_row("**paper style**: Moses-like tokenization + compound split, multi-bleu arithmetic (ours)", ours),
            _score_row("paper-style tokens scored by sacreBLEU (`tokenize=\"none\"`, no smoothing): cross-check", check),
        ],
        "lrrrrl",
    )
    same_counts = ours.counts == check.counts and ours.totals == check.totals and (ours.sys_len, ours.ref_len) == (check.sys_len, check.ref_len)
    report.add(
        "",
        f"chrF (sacreBLEU, untokenized text): **{chrf_score.score:.2f}**, signature `{chrf_score.signature}`.",
        "",
        f"Cross-check of our BLEU arithmetic: on the same paper-style tokens, sacreBLEU counts "
        f"{'the same' if same_counts else 'DIFFERENT'} n-gram matches, totals and lengths, and its score differs from ours "
        f"by {miss:.1e}, against {bound:.1e} that rounding can explain (the derivation is in tests/test_bleu.py).",
    )
    return {"agreement": {"same_counts": same_counts, "abs_difference": miss, "rounding_bound": bound,
                          "within_bound": miss <= bound}}  # fmt: skip


def _section_why(report: Report, scores: dict[str, BleuScore], segs: list[Segment]) -> dict:
    sacre, moses, paper = scores["sacre"], scores["moses"], scores["paper"]
    added_tot = [p - m for p, m in zip(paper.totals, moses.totals)]
    added_cnt = [p - m for p, m in zip(paper.counts, moses.counts)]
    markers_hyp = sum(s.hyp_paper.split().count(AT_SEPARATOR) for s in segs)
    markers_ref = sum(s.ref_paper.split().count(AT_SEPARATOR) for s in segs)
    markers_matched = sum(matched_unigrams(s.hyp_paper, s.ref_paper)[AT_SEPARATOR] for s in segs)
    differ = [s.index for s in segs if s.hyp_13a.split() != tokenize(s.hyp).split() or s.ref_13a.split() != tokenize(s.ref).split()]
    report.section(
        "Why the two scores differ",
        "The same translations get different BLEU because the two methods count different tokens. "
        "Going from sacreBLEU to the paper's number in two steps:",
        "",
    )
    report.table(
        ["step", "BLEU", "change", "matched / output n-grams, n = 1..4"],
        [
            ["sacreBLEU (13a tokens)", f"{sacre.score:.2f}", "", _ratio(sacre.counts, sacre.totals)],
            ["Moses-like tokens", f"{moses.score:.2f}", f"{moses.score - sacre.score:+.2f}", _ratio(moses.counts, moses.totals)],
            ["+ compound split (paper style)", f"{paper.score:.2f}", f"{paper.score - moses.score:+.2f}", _ratio(paper.counts, paper.totals)],
        ],
        "lrrl",
    )
    rates = [f"{n}-grams {c}/{t} = {c / t:.0%} (precision before: {mc / mt:.0%})" for n, (c, t, mc, mt)
             in enumerate(zip(added_cnt, added_tot, moses.counts, moses.totals), 1) if t > 0]  # fmt: skip
    report.add(
        "",
        f"1. **Tokenization** ({moses.score - sacre.score:+.2f}). The tokenizers disagree on {len(differ)} of {len(segs)} "
        "sentence pairs. sacreBLEU's 13a tokenizer splits a hyphen after a digit (\"34-jährige\" → \"34 - jährige\", "
        "three tokens that match when the number is right) and every period not between digits (\"z.B.\" → "
        "\"z . B .\", \"Dr.\" → \"Dr .\"), but separates ASCII punctuation only: German quotes stay glued to their "
        "word (\"„Ist\" is one token, which matches only an identically quoted word). Ours keeps \"34-jährige\", "
        "\"z.B.\" and \"Dr.\" whole and separates every quote sign. Neither is wrong; they count different things.",
        f"2. **Compound splitting** ({paper.score - moses.score:+.2f}). Splitting \"a-b\" into \"a ##AT##-##AT## b\" put "
        f"{markers_hyp} marker tokens into the outputs and {markers_ref} into the references; {markers_matched} of the "
        "outputs' markers match. A marker matches whenever both sides contain any hyphenated compound, whatever its "
        "words, and a compound that was one token (one unigram) becomes three unigrams, two bigrams and a trigram, "
        "so a correct compound counts several times over, and a compound whose parts are right but whose whole is "
        "not (\"SPD-Fraktionschef\" against \"SPD\") now earns partial matches. Counted over the sample, the "
        "n-grams the splitting added to the outputs (net) match far more often than the outputs' n-grams did before: "
        + "; ".join(rates) + ". That is the inflation: the added n-grams are easy ones.",
        "",
        "So a tokenized BLEU with compound splitting, like the paper's Table 2 figures, is not comparable with a "
        "sacreBLEU figure: the two differ by tokenization and splitting even on identical translations, and the "
        f"sign and size of the gap depend on the text (here {moses.score - sacre.score:+.2f} and "
        f"{paper.score - moses.score:+.2f}, {paper.score - sacre.score:+.2f} in all; on sixteen real WMT17 systems: "
        "[bleu-wmt17.md](bleu-wmt17.md)).",
    )
    return {"steps": {"sacre_to_moses": moses.score - sacre.score, "moses_to_paper": paper.score - moses.score,
                      "sacre_to_paper": paper.score - sacre.score},
            "tokenizers_disagree_on": differ, "markers_in_outputs": markers_hyp, "markers_in_references": markers_ref,
            "markers_matched": markers_matched, "split_added_counts": added_cnt, "split_added_totals": added_tot}  # fmt: skip


# Sentence pairs of the sample worked in full, each showing one mechanism (tests/test_bleu.py
# checks that each still shows it).
EXAMPLES: dict[int, str] = {
    2: "a correct compound counts several times over",
    5: "German quotes against ASCII quotes",
    9: "abbreviations: 13a splits every period, ours keeps \"z.B.\"",
    28: "a compound's part earns a match the whole could not",
    33: "the splitting quirk: a one-character middle part keeps its second hyphen",
}


def _unigram_list(counter: Counter) -> str:
    return ", ".join(f"`{t}`" + (f" ×{k}" if k > 1 else "") for t, k in sorted(counter.items())) or "none"


def _section_examples(report: Report, segs: list[Segment]) -> list[dict]:
    """The sentence pairs of :data:`EXAMPLES`, worked in full."""
    report.section(
        "Worked examples",
        "One sentence pair for each mechanism. Tokens are separated by spaces exactly as counted; a match is an "
        "output n-gram also in the reference (clipped to the reference's count).",
    )
    out = []
    for index, mechanism in EXAMPLES.items():
        s = segs[index - 1]
        only_paper = matched_unigrams(s.hyp_paper, s.ref_paper) - matched_unigrams(s.hyp_13a, s.ref_13a)
        only_13a = matched_unigrams(s.hyp_13a, s.ref_13a) - matched_unigrams(s.hyp_paper, s.ref_paper)
        report.add("", f"### Sentence {s.index}: {mechanism} ({s.gain:+d} matched n-grams with paper-style tokens)", "",
                   f"- source: {s.src}", f"- reference: {s.ref}", f"- output: {s.hyp}", "")  # fmt: skip
        report.table(
            ["", "13a (sacreBLEU)", "paper style"],
            [["reference tokens", f"`{s.ref_13a}`", f"`{s.ref_paper}`"], ["output tokens", f"`{s.hyp_13a}`", f"`{s.hyp_paper}`"]]
            + [[f"{n}-grams matched / in output", f"{c13} / {t13}", f"{cp} / {tp}"]
               for n, (c13, t13, cp, tp) in enumerate(zip(s.counts_13a, s.totals_13a, s.counts_paper, s.totals_paper), 1)],
            "lll",
        )
        report.add("", f"Unigrams matched only with paper-style tokens: {_unigram_list(only_paper)}; "
                       f"only with 13a tokens: {_unigram_list(only_13a)}.")  # fmt: skip
        out.append({"index": s.index, "mechanism": mechanism, "gain": s.gain,
                    "only_paper": dict(sorted(only_paper.items())), "only_13a": dict(sorted(only_13a.items()))})  # fmt: skip
    return out


def _section_all(report: Report, segs: list[Segment]) -> None:
    report.section(
        "Every sentence pair",
        "Matched / output n-grams for n = 1/2/3/4 under each tokenization; the corpus scores sum these columns "
        "(BLEU is a corpus statistic, not a mean of sentence scores). The 13a columns sum to sacreBLEU's counts above.",
        "",
    )
    report.table(
        ["#", "output", "13a matched of output n-grams", "paper style matched of output n-grams", "change in matches"],
        [[s.index, s.hyp, _ratio(s.counts_13a, s.totals_13a), _ratio(s.counts_paper, s.totals_paper), f"{s.gain:+d}"] for s in segs],
        "rlllr",
    )


def _section_choices(report: Report, scores: dict[str, BleuScore]) -> None:
    smoothing_used = min(scores["sacre"].counts) == 0
    report.section(
        "Choices and caveats",
        "- Our tokenizer is Moses-like, not Moses: its rules are stated in `aiayn.reproductions.bleu.tokenize` (no XML "
        "escaping, which cannot change BLEU; our own short abbreviation list; numbers before a period are ordinals "
        "unless at the end of the line). Scores from Moses' `tokenizer.perl` can differ slightly.",
        "- Compound splitting follows tensor2tensor's substitution exactly, including its one quirk: in a chain "
        "whose middle part is one character, the second hyphen stays (\"Vitamin-D-Mangel\" → \"Vitamin ##AT##-##AT## "
        "D-Mangel\", sentence 33).",
        "- multi-bleu arithmetic: corpus sums of clipped matches, one reference, no smoothing (a zero precision "
        "gives 0), cased. sacreBLEU's default `smooth:exp` changes only n-gram orders without any match; "
        + ("some order has none here, so smoothing affects the sacreBLEU figure." if smoothing_used
           else "every order has matches here, so smoothing plays no part in the sacreBLEU figure."),
        "- The sample (reproductions/data/bleu/, 33 pairs) was written for this project; its outputs imitate typical "
        "machine-translation slips (paraphrase, wrong gender, hyphenated vs closed compounds, quote styles, casing). "
        "The paper prints no score for it: the report compares methods, not systems.",
    )


def score_sample(sample: dict[str, list[str]]) -> tuple[dict[str, BleuScore], ChrfScore]:
    """The sample scored every way the report shows."""
    hyps, refs = sample["hyp.de"], sample["ref.de"]
    hyp_paper, ref_paper = [paper_tokens(h) for h in hyps], [paper_tokens(r) for r in refs]
    scores = {
        "sacre": sacre_bleu(hyps, refs),
        "moses": multi_bleu([tokenize(h) for h in hyps], [tokenize(r) for r in refs],
                            signature=TOKENIZED_SIGNATURE.replace("split:atat-t2t", "split:none")),
        "paper": tokenized_bleu(hyps, refs),
        "paper_via_sacrebleu": sacre_bleu_pretokenized(hyp_paper, ref_paper),
    }
    return scores, chrf(hyps, refs)


def main(out_dir: Path, *, measure: bool = True) -> str:
    """Write bleu.md and bleu.json into ``out_dir``; return the one-line verdict.

    With ``measure`` (the default; ``--no-measure`` and the drift test turn it off), also write
    bleu-wmt17.{md,json}: the WMT17 rescoring of ``aiayn.reproductions.bleu_wmt17``, which fetches its
    data (or says it could not) and so is not compared by the drift test.
    """
    report = Report(NAME, "BLEU scoring: the paper's tokenized BLEU beside sacreBLEU, on a shipped sample",
                    precision="float64", packages=("numpy", "sacrebleu"))  # fmt: skip
    sample = load_sample()
    progress(NAME, f"scoring {len(sample['hyp.de'])} sentence pairs both ways")
    scores, chrf_score = score_sample(sample)
    segs = segments(sample)
    report.add(
        "",
        f"What: {len(segs)} German outputs and references (with English sources) written for this project, in "
        "`reproductions/data/bleu/`, scored the paper's way (PAPER.md, \"Training and decoding (§5, §6)\": tokenized "
        "BLEU, multi-bleu style, hyphenated compounds split \"a-b\" → \"a ##AT##-##AT## b\" on output and reference) "
        "and today's standard way (sacreBLEU on untokenized text), with chrF beside them. Every number is computed "
        "in this run by `reproductions/bleu.py`. Runtime: about a second.",
    )
    agreement = _section_scores(report, scores, chrf_score)
    why = _section_why(report, scores, segs)
    examples = _section_examples(report, segs)
    _section_all(report, segs)
    _section_choices(report, scores)
    sacre, paper = scores["sacre"], scores["paper"]
    report.verdict = (
        f"paper-style tokenized BLEU {paper.score:.2f} vs sacreBLEU {sacre.score:.2f} ({paper.score - sacre.score:+.2f}) on "
        f"{len(segs)} shipped pairs: Moses-like tokenization {why['steps']['sacre_to_moses']:+.2f}, compound splitting "
        f"{why['steps']['moses_to_paper']:+.2f}; chrF {chrf_score.score:.2f}; our BLEU arithmetic "
        + ("equals sacreBLEU's on the same tokens" if agreement["agreement"]["within_bound"] and agreement["agreement"]["same_counts"]
           else "DISAGREES with sacreBLEU's on the same tokens")
    )
    report.data = {
        "sample": {"pairs": len(segs), "path": "reproductions/data/bleu/"},
        "scores": {k: _as_dict(v) for k, v in scores.items()},
        "chrf": {"score": chrf_score.score, "signature": chrf_score.signature},
        **agreement,
        "why": why,
        "examples": examples,
        "segments": [{"index": s.index, "hyp_13a": s.hyp_13a, "ref_13a": s.ref_13a, "hyp_paper": s.hyp_paper,
                      "ref_paper": s.ref_paper, "counts_13a": list(s.counts_13a), "totals_13a": list(s.totals_13a),
                      "counts_paper": list(s.counts_paper), "totals_paper": list(s.totals_paper)} for s in segs],
    }
    write_report(out_dir, report)
    if measure:
        from aiayn.reproductions import bleu_wmt17

        progress(NAME, "WMT17 rescoring: " + bleu_wmt17.run(Path(out_dir), network=True))
    return report.verdict
