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

NAME = "bleu"
DATA = Path(__file__).resolve().parent / "data" / "bleu"
MAX_ORDER = 4
AT_SEPARATOR = "##AT##-##AT##"
# Our signature for the paper-style score, in sacreBLEU's key:value style. ``tok`` names our
# tokenizer and its rules' version (bump it when a rule changes: scores move with it).
TOKENIZED_SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:aiayn-moseslike-de.1|split:atat-t2t|smooth:none|impl:aiayn"
MULTI_BLEU_SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:none|split:none|smooth:none|impl:aiayn"


# ---------------------------------------------------------------------------------------------
# Tokenization (Moses-like, German)
# ---------------------------------------------------------------------------------------------

# Abbreviations whose final period stays attached (our own short German list, plus a few
# English forms that occur in German news). Single letters ("z.", "B.") are handled by rule.
ABBREVIATIONS = frozenset({
    "Abb", "Abs", "Abt", "Anm", "Bd", "Bsp", "bzw", "ca", "Co", "Dipl", "Dr", "etc", "evtl", "Fa", "ff", "Fr",
    "geb", "ggf", "Hbf", "Hr", "Hrsg", "Ing", "inkl", "Jh", "Jr", "Mio", "Mr", "Mrs", "Mrd", "Ms", "Nr", "Prof",
    "rd", "Sr", "St", "Std", "Str", "Tel", "usw", "vgl", "vs", "zzgl",
})  # fmt: skip
_PERIOD_RUN = re.compile(r"\.{2,}")
# Everything that is neither a word character (letter, digit) nor whitespace nor one of the
# characters that later rules treat in context (. , ' ` -) stands alone; so does "_".
_SYMBOL = re.compile(r"([^\w\s.,'`\-]|_)")
_COMMA = re.compile(r"(?<!\d),|,(?!\d)")  # a comma not flanked by digits on both sides
_APOSTROPHE = re.compile(r"(['`])")
_COMPOUND = re.compile(r"(\S)-(\S)")


def tokenize(text: str) -> str:
    """Moses-like tokenization of one German line; tokens joined by single spaces.

    Paper: PAPER.md "Training and decoding (§5, §6)": BLEU was computed on tokenized text.
    Rules, in order:

    1. NFC normalization (so a decomposed "u + ¨" is one letter) and whitespace collapsed.
    2. Runs of periods ("...") become one token.
    3. Every character other than a letter, digit, whitespace, ``. , ' ` -`` stands alone:
       quotes of every style („ “ " « »), brackets, ``! ? : ; % / & +`` and so on.
    4. A comma stands alone unless a digit is on both sides ("3,5" stays, "Haus," splits).
    5. Apostrophes and backticks stand alone ("geht's" → "geht ' s"), as Moses does for German.
    6. A token-final period stands alone unless (a) the rest contains a period and a letter
       ("z.B.", "U.S."), or a token follows and (b) the rest is one letter or in
       :data:`ABBREVIATIONS` ("z. B.", "Dr."), (c) the rest is a number (a German ordinal:
       "am 3. Oktober"), or (d) the next token starts with a lowercase letter (no sentence
       ends there). So the line's last period stands alone ("km/h." → "km / h .").
    7. Hyphens are left alone (no "aggressive" splitting): compounds are the job of
       :func:`split_compounds`.

    Choices: Moses escapes ``& < > ' " [ ] |`` as XML entities; we do not (escaping maps
    tokens one-to-one on both sides, so BLEU is unchanged). Rules (b)-(c) are ours; Moses reads
    its own per-language prefix lists.
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    text = " ".join(unicodedata.normalize("NFC", text).split())
    text = _PERIOD_RUN.sub(lambda m: f" {m.group()} ", text)
    text = _SYMBOL.sub(r" \1 ", text)
    text = _COMMA.sub(" , ", text)
    text = _APOSTROPHE.sub(r" \1 ", text)
    tokens = text.split()
    out: list[str] = []
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.endswith(".") and token.strip(".") and not _keeps_period(token[:-1], following):
            out += [token[:-1], "."]
        else:
            out.append(token)
    return " ".join(out)


def _keeps_period(stem: str, following: str | None) -> bool:
    """Rule 6 of :func:`tokenize`: does the period after ``stem`` stay attached?"""
    if "." in stem and any(c.isalpha() for c in stem):
        return True
    if following is None:
        return False
    if (len(stem) == 1 and stem.isalpha()) or stem in ABBREVIATIONS:
        return True
    return stem.isdigit() or following[0].islower()


def split_compounds(text: str) -> str:
    """Split hyphenated compounds: "a-b" → "a ##AT##-##AT## b".

    Paper: PAPER.md "Training and decoding (§5, §6)": hyphenated compounds split on output and
    reference. Choices: the match is a hyphen with a non-space character on each side, taken
    left to right without overlap (tensor2tensor's ``get_ende_bleu.sh`` substitution), so
    "Nord-Süd-Achse" → "Nord ##AT##-##AT## Süd ##AT##-##AT## Achse" but a one-character part
    keeps its second hyphen: "a-b-c" → "a ##AT##-##AT## b-c". "Ein- und Ausgang" and a lone
    " - " are left alone. Apply it once, to tokenized text: the marker itself contains a
    hyphen between two "#".
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    return _COMPOUND.sub(rf"\1 {AT_SEPARATOR} \2", text)


def paper_tokens(text: str) -> str:
    """The paper-style pipeline for one line: :func:`tokenize`, then :func:`split_compounds`."""
    return split_compounds(tokenize(text))


# ---------------------------------------------------------------------------------------------
# BLEU arithmetic (multi-bleu style)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BleuScore:
    """A corpus BLEU score and what it is made of.

    ``score`` is on the 0-100 scale; ``counts[n-1]`` are the clipped (n)-gram matches and
    ``totals[n-1]`` the output's (n)-grams; ``precisions`` = 100·counts/totals; ``bp`` the
    brevity penalty; ``sys_len``/``ref_len`` the output and reference lengths in tokens; and
    ``signature`` says how it was computed (sacreBLEU's own for :func:`sacre_bleu`).
    """

    score: float
    counts: tuple[int, ...]
    totals: tuple[int, ...]
    precisions: tuple[float, ...]
    bp: float
    sys_len: int
    ref_len: int
    signature: str

    def summary(self) -> str:
        """sacreBLEU's one-line form: ``41.23 70.1/46.2/33.0/24.1 (BP = 1.000 ratio = 1.012 ...)``."""
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        return (f"{self.score:.2f} " + "/".join(f"{p:.1f}" for p in self.precisions)
                + f" (BP = {self.bp:.3f} ratio = {ratio:.3f} hyp_len = {self.sys_len} ref_len = {self.ref_len})")  # fmt: skip


@dataclass(frozen=True)
class ChrfScore:
    """A corpus chrF score (0-100) and sacreBLEU's signature for it."""

    score: float
    signature: str


def _check_corpus(hyps: Sequence[str], refs: Sequence[str]) -> None:
    """Both arguments: non-empty sequences of str of equal length, one line each."""
    for name, lines in (("hyps", hyps), ("refs", refs)):
        if isinstance(lines, str) or not isinstance(lines, Sequence):
            raise TypeError(f"{name}: expected a sequence of str (one line per segment), got {type(lines).__name__}")
        if len(lines) == 0:
            raise ValueError(f"{name}: expected at least one segment, got none")
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise TypeError(f"{name}[{i}]: expected str, got {type(line).__name__}")
            if "\n" in line or "\r" in line:
                raise ValueError(f"{name}[{i}]: a segment is one line; got a line break in {line!r}")
    if len(hyps) != len(refs):
        raise ValueError(f"hyps and refs: expected one reference per output, got {len(hyps)} outputs and {len(refs)} references")


def ngram_stats(hyp: Sequence[str], ref: Sequence[str], max_order: int = MAX_ORDER) -> tuple[list[int], list[int]]:
    """Clipped matches and output n-gram totals of one segment, n = 1..max_order.

    A match of an n-gram counts at most as often as the n-gram occurs in the reference
    (BLEU's "modified precision", Papineni et al. 2002, §2.1).
    """
    return _clipped(hyp, [ngrams(ref, n) for n in range(1, max_order + 1)])


def _clipped(hyp: Sequence[str], ref_ngrams: Sequence[Counter]) -> tuple[list[int], list[int]]:
    """:func:`ngram_stats` with the reference's n-gram multisets given (orders 1..len(ref_ngrams))."""
    counts, totals = [], []
    for n, r in enumerate(ref_ngrams, 1):
        get = r.get
        counts.append(sum(min(c, get(g, 0)) for g, c in ngrams(hyp, n).items()))
        totals.append(max(len(hyp) - n + 1, 0))
    return counts, totals


@functools.lru_cache(maxsize=1 << 14)
def _reference_ngrams(line: str) -> tuple[int, tuple[Counter, ...]]:
    """Length and n-gram multisets (n = 1..4) of a reference line, cached: one reference is
    scored against many outputs (the WMT17 rescoring). Read only: a Counter lookup of a missing
    n-gram returns 0 without inserting it."""
    tokens = line.split()
    return len(tokens), tuple(ngrams(tokens, n) for n in range(1, MAX_ORDER + 1))


def ngrams(tokens: Sequence[str], n: int) -> Counter:
    """The multiset of ``tokens``' n-grams (as tuples)."""
    return Counter(zip(*(tokens[i:] for i in range(n))))


def bleu_from_counts(counts: Sequence[int], totals: Sequence[int], sys_len: int, ref_len: int) -> tuple[float, float]:
    """(BLEU on 0-100, brevity penalty) from corpus sums, with no smoothing.

    BLEU = 100 · BP · exp((1/N) Σ_n log(counts_n / totals_n)), BP = 1 if c >= r else
    exp(1 − r/c). Any zero precision (or an empty output) gives 0, as multi-bleu.perl prints.
    """
    if sys_len == 0:
        return 0.0, 0.0
    bp = 1.0 if sys_len >= ref_len else math.exp(1.0 - ref_len / sys_len)
    if min(counts) == 0:
        return 0.0, bp
    log_mean = math.fsum(math.log(c / t) for c, t in zip(counts, totals)) / len(counts)
    return 100.0 * bp * math.exp(log_mean), bp


def multi_bleu(hyps: Sequence[str], refs: Sequence[str], *, signature: str = MULTI_BLEU_SIGNATURE) -> BleuScore:
    """Corpus BLEU of already tokenized lines (tokens split on whitespace), multi-bleu style."""
    _check_corpus(hyps, refs)
    counts, totals = [0] * MAX_ORDER, [0] * MAX_ORDER
    sys_len = ref_len = 0
    for hyp, ref in zip(hyps, refs):
        h = hyp.split()
        r_len, r_ngrams = _reference_ngrams(ref)
        c, t = _clipped(h, r_ngrams)
        counts = [a + b for a, b in zip(counts, c)]
        totals = [a + b for a, b in zip(totals, t)]
        sys_len, ref_len = sys_len + len(h), ref_len + r_len
    score, bp = bleu_from_counts(counts, totals, sys_len, ref_len)
    precisions = tuple(100.0 * c / t if t else 0.0 for c, t in zip(counts, totals))
    return BleuScore(score, tuple(counts), tuple(totals), precisions, bp, sys_len, ref_len, signature)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str]) -> BleuScore:
    """The paper's BLEU: :func:`tokenize` and :func:`split_compounds` on both sides, then :func:`multi_bleu`.

    Paper: PAPER.md "Training and decoding (§5, §6)"; Table 2's BLEU columns were scored this way.
    """
    _check_corpus(hyps, refs)
    return multi_bleu([paper_tokens(h) for h in hyps], [paper_tokens(r) for r in refs], signature=TOKENIZED_SIGNATURE)


# ---------------------------------------------------------------------------------------------
# sacreBLEU
# ---------------------------------------------------------------------------------------------


def from_sacrebleu(s: object, signature: str) -> BleuScore:
    """A :class:`BleuScore` from sacreBLEU's ``BLEUScore`` and the metric's signature string."""
    return BleuScore(float(s.score), tuple(s.counts), tuple(s.totals), tuple(float(p) for p in s.precisions),
                     float(s.bp), int(s.sys_len), int(s.ref_len), signature)  # fmt: skip


def sacre_bleu(hyps: Sequence[str], refs: Sequence[str]) -> BleuScore:
    """sacreBLEU's standard BLEU on untokenized text (its defaults: 13a tokenizer, exp smoothing)."""
    from sacrebleu.metrics import BLEU

    _check_corpus(hyps, refs)
    metric = BLEU()
    return from_sacrebleu(metric.corpus_score(list(hyps), [list(refs)]), str(metric.get_signature()))


def sacre_bleu_pretokenized(hyps: Sequence[str], refs: Sequence[str]) -> BleuScore:
    """sacreBLEU on already tokenized lines, as multi-bleu scores them (``tokenize="none"``, no smoothing)."""
    from sacrebleu.metrics import BLEU

    _check_corpus(hyps, refs)
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return from_sacrebleu(metric.corpus_score(list(hyps), [list(refs)]), str(metric.get_signature()))


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> ChrfScore:
    """sacreBLEU's chrF with its defaults (chrF2: character 6-grams, β = 2, no word n-grams)."""
    from sacrebleu.metrics import CHRF

    _check_corpus(hyps, refs)
    metric = CHRF()
    s = metric.corpus_score(list(hyps), [list(refs)])
    return ChrfScore(float(s.score), str(metric.get_signature()))


def tokenize_13a(text: str) -> str:
    """sacreBLEU's default tokenizer (mteval-v13a), for showing what sacreBLEU counts."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()(text)


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


def agreement_bound(s: BleuScore) -> float:
    """Largest |ours − sacreBLEU| on identical tokens that rounding alone can explain, for score ``s``.

    u·(9 + 3L + 5L')·S with L = max_n |log p_n|, L' = max_n |log(100 p_n)|: both compute the
    same brevity penalty with the same operations, so only the geometric means differ; the
    derivation is in tests/test_bleu.py (test_multi_bleu_agrees_with_sacrebleu). 0 for S = 0.
    """
    if s.score == 0.0:
        return 0.0
    u = 2.0**-53
    big_l = max(abs(math.log(c / t)) for c, t in zip(s.counts, s.totals))
    big_l_pct = max(abs(math.log(100.0 * c / t)) for c, t in zip(s.counts, s.totals))
    return u * (9 + 3 * big_l + 5 * big_l_pct) * s.score


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
