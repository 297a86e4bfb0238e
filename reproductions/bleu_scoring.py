"""BLEU and chrF scoring: the paper's tokenized BLEU, sacreBLEU's detokenized BLEU, chrF, repetition.

The scoring module of the BLEU reproduction (its report is ``reproductions/bleu.py``; the WMT17
rescoring ``reproductions/bleu_wmt17.py`` and the training reproduction score with it too).

The paper-style pipeline (PAPER.md "Training and decoding (§5, §6)": "tokenized BLEU (multi-bleu
style) with hyphenated compounds split ("a-b" → "a ##AT##-##AT## b") on output and reference"),
each step ours:

1. :func:`tokenize`: a Moses-like tokenizer written for this project, with German, French and
   English rules (Moses' ``tokenizer.perl -l de|fr|en`` is what tensor2tensor's scoring ran; we
   did not copy it; the rules are our own statement of what such a tokenizer does, and where we
   chose, the docstring says so).
2. :func:`split_compounds`, German only: every hyphen between two non-space characters becomes
   `` ##AT##-##AT## ``, scanning left to right without overlap, as the one-line substitution
   ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` of tensor2tensor's ``get_ende_bleu.sh`` does. So
   where a part between two hyphens is one character, its second hyphen stays:
   "Vitamin-D-Mangel" → "Vitamin ##AT##-##AT## D-Mangel" (the first match consumed the "D");
   the quirk is kept on purpose, as it is what the published numbers used. French output (EN→FR)
   is tokenized with French rules and not split.
3. :func:`multi_bleu`: corpus BLEU over whitespace tokens with our own arithmetic, as
   ``multi-bleu.perl`` defines it: clipped n-gram matches for n = 1..4 summed over the corpus,
   geometric mean of the four precisions, brevity penalty exp(1 − r/c) when the output is
   shorter (c < r), no smoothing (any zero precision gives 0), case-sensitive, one reference.
   The tests check it against sacreBLEU run with ``tokenize="none"`` on the same tokens.

sacreBLEU's BLEU (:func:`sacre_bleu`) and chrF (:func:`chrf`) are sacreBLEU's own defaults
(``tok:13a``, ``smooth:exp``; chrF2 with character 6-grams) on the untokenized text; their
signatures are returned verbatim. :func:`repetition_rate` measures how much of an output repeats
itself (the degenerate loops of an undertrained model's beam search).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ORDER = 4
AT_SEPARATOR = "##AT##-##AT##"
# Our signatures for the paper-style score, in sacreBLEU's key:value style. ``tok`` names our
# tokenizer, its language and its rules' version (bump it when a rule changes: scores move with it).
TOKENIZED_SIGNATURES: dict[str, str] = {
    "de": "nrefs:1|case:mixed|eff:no|tok:aiayn-moseslike-de.1|split:atat-t2t|smooth:none|impl:aiayn",
    "fr": "nrefs:1|case:mixed|eff:no|tok:aiayn-moseslike-fr.1|split:none|smooth:none|impl:aiayn",
    "en": "nrefs:1|case:mixed|eff:no|tok:aiayn-moseslike-en.1|split:none|smooth:none|impl:aiayn",
}
TOKENIZED_SIGNATURE = TOKENIZED_SIGNATURES["de"]
MULTI_BLEU_SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:none|split:none|smooth:none|impl:aiayn"


# ---------------------------------------------------------------------------------------------
# Tokenization (Moses-like: German, French, English)
# ---------------------------------------------------------------------------------------------

# Abbreviations whose final period stays attached, per language (our own short lists; Moses
# reads its own per-language "nonbreaking prefix" files). Single letters ("z.", "B.") are handled
# by rule in every language.
ABBREVIATIONS: dict[str, frozenset[str]] = {
    "de": frozenset(
        {
            "Abb",
            "Abs",
            "Abt",
            "Anm",
            "Bd",
            "Bsp",
            "bzw",
            "ca",
            "Co",
            "Dipl",
            "Dr",
            "etc",
            "evtl",
            "Fa",
            "ff",
            "Fr",
            "geb",
            "ggf",
            "Hbf",
            "Hr",
            "Hrsg",
            "Ing",
            "inkl",
            "Jh",
            "Jr",
            "Mio",
            "Mr",
            "Mrs",
            "Mrd",
            "Ms",
            "Nr",
            "Prof",
            "rd",
            "Sr",
            "St",
            "Std",
            "Str",
            "Tel",
            "usw",
            "vgl",
            "vs",
            "zzgl",
        }
    ),
    "fr": frozenset(
        {
            "av",
            "apr",
            "art",
            "cf",
            "chap",
            "Cie",
            "Dr",
            "éd",
            "env",
            "etc",
            "ex",
            "fig",
            "Me",
            "Mgr",
            "Mlle",
            "Mlles",
            "MM",
            "Mme",
            "Mmes",
            "no",
            "Pr",
            "St",
            "Ste",
            "vol",
            "vs",
        }
    ),
    "en": frozenset(
        {
            "Co",
            "Corp",
            "Dr",
            "etc",
            "e.g",
            "Fig",
            "i.e",
            "Inc",
            "Jr",
            "Ltd",
            "Mr",
            "Mrs",
            "Ms",
            "No",
            "Prof",
            "Sr",
            "St",
            "vs",
        }
    ),
}
LANGUAGES: tuple[str, ...] = tuple(ABBREVIATIONS)
_PERIOD_RUN = re.compile(r"\.{2,}")
# Everything that is neither a word character (letter, digit) nor whitespace nor one of the
# characters that later rules treat in context (. , ' ’ ` -) stands alone; so does "_".
_SYMBOL = re.compile(r"([^\w\s.,'’`\-]|_)")
_COMMA = re.compile(r"(?<!\d),|,(?!\d)")  # a comma not flanked by digits on both sides
_APOSTROPHE = re.compile(r"(['’`])")
_COMPOUND = re.compile(r"(\S)-(\S)")


def _check_language(lang: str) -> str:
    if lang not in ABBREVIATIONS:
        raise ValueError(f"lang: expected one of {list(LANGUAGES)}, got {lang!r}")
    return lang


def tokenize(text: str, lang: str = "de") -> str:
    """Moses-like tokenization of one line in ``lang`` ("de", "fr", "en"); tokens joined by single spaces.

    Paper: PAPER.md "Training and decoding (§5, §6)": BLEU was computed on tokenized text.
    Rules, in order:

    1. NFC normalization (so a decomposed "u + ¨" is one letter) and whitespace collapsed.
    2. Runs of periods ("...") become one token.
    3. Every character other than a letter, digit, whitespace, ``. , ' ’ ` -`` stands alone:
       quotes of every style („ “ " « »), brackets, ``! ? : ; % / & +`` and so on.
    4. A comma stands alone unless a digit is on both sides ("3,5" stays, "Haus," splits).
    5. Apostrophes (' and ’) and backticks, by language as Moses' rules treat them: German: they
       stand alone ("geht's" → "geht ' s"); French: between two letters the apostrophe stays
       with the left part (elision: "l'homme" → "l' homme", "aujourd'hui" → "aujourd' hui"),
       elsewhere it stands alone; English: between two letters it starts the right part
       ("don't" → "don 't", "John's" → "John 's"), elsewhere it stands alone.
    6. A token-final period stands alone unless (a) the rest contains a period and a letter
       ("z.B.", "U.S."), or a token follows and (b) the rest is one letter or in the language's
       :data:`ABBREVIATIONS` ("z. B.", "Dr.", "Mme."), (c) in German only, the rest is a number
       (a German ordinal: "am 3. Oktober"), or (d) the next token starts with a lowercase letter
       (no sentence ends there). So the line's last period stands alone ("km/h." → "km / h .").
    7. Hyphens are left alone (no "aggressive" splitting): German compounds are the job of
       :func:`split_compounds`; French and English keep theirs ("peut-être").

    Choices: Moses escapes ``& < > ' " [ ] |`` as XML entities; we do not (escaping maps
    tokens one-to-one on both sides, so BLEU is unchanged). Rules (b)-(c) are ours; Moses reads
    its own per-language prefix lists.
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    _check_language(lang)
    text = " ".join(unicodedata.normalize("NFC", text).split())
    text = _PERIOD_RUN.sub(lambda m: f" {m.group()} ", text)
    text = _SYMBOL.sub(r" \1 ", text)
    text = _COMMA.sub(" , ", text)
    text = _apostrophes(text, lang)
    tokens = text.split()
    out: list[str] = []
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.endswith(".") and token.strip(".") and not _keeps_period(token[:-1], following, lang):
            out += [token[:-1], "."]
        else:
            out.append(token)
    return " ".join(out)


def _apostrophes(text: str, lang: str) -> str:
    """Rule 5 of :func:`tokenize`: apostrophes and backticks by language."""

    def one(m: re.Match) -> str:
        s, i = m.string, m.start()
        between_letters = 0 < i < len(s) - 1 and s[i - 1].isalpha() and s[i + 1].isalpha()
        if between_letters and lang == "fr":
            return m.group() + " "  # elision: l' homme
        if between_letters and lang == "en":
            return " " + m.group()  # clitic: don 't
        return f" {m.group()} "

    return _APOSTROPHE.sub(one, text)


def _keeps_period(stem: str, following: str | None, lang: str = "de") -> bool:
    """Rule 6 of :func:`tokenize`: does the period after ``stem`` stay attached?"""
    if "." in stem and any(c.isalpha() for c in stem):
        return True
    if following is None:
        return False
    if (len(stem) == 1 and stem.isalpha()) or stem in ABBREVIATIONS[lang]:
        return True
    return (lang == "de" and stem.isdigit()) or following[0].islower()


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


def paper_tokens(text: str, lang: str = "de") -> str:
    """The paper-style pipeline for one line: :func:`tokenize` in ``lang``, then, for German only,
    :func:`split_compounds` (tensor2tensor's ``get_ende_bleu.sh`` splits EN→DE output; French and
    English keep their hyphens)."""
    tokens = tokenize(text, lang)
    return split_compounds(tokens) if lang == "de" else tokens


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
        return (
            f"{self.score:.2f} "
            + "/".join(f"{p:.1f}" for p in self.precisions)
            + f" (BP = {self.bp:.3f} ratio = {ratio:.3f} hyp_len = {self.sys_len} ref_len = {self.ref_len})"
        )


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
        raise ValueError(
            f"hyps and refs: expected one reference per output, got {len(hyps)} outputs and {len(refs)} references"
        )


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


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> BleuScore:
    """The paper's BLEU: :func:`paper_tokens` in ``lang`` on both sides, then :func:`multi_bleu`.

    Paper: PAPER.md "Training and decoding (§5, §6)"; Table 2's BLEU columns were scored this way
    (EN→DE with compound splitting; EN→FR with French rules and no splitting).
    """
    _check_corpus(hyps, refs)
    _check_language(lang)
    return multi_bleu(
        [paper_tokens(h, lang) for h in hyps],
        [paper_tokens(r, lang) for r in refs],
        signature=TOKENIZED_SIGNATURES[lang],
    )


# ---------------------------------------------------------------------------------------------
# sacreBLEU
# ---------------------------------------------------------------------------------------------


def from_sacrebleu(s: object, signature: str) -> BleuScore:
    """A :class:`BleuScore` from sacreBLEU's ``BLEUScore`` and the metric's signature string."""
    return BleuScore(
        float(s.score),
        tuple(s.counts),
        tuple(s.totals),
        tuple(float(p) for p in s.precisions),
        float(s.bp),
        int(s.sys_len),
        int(s.ref_len),
        signature,
    )


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


# ---------------------------------------------------------------------------------------------
# Repetition
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repetition:
    """How much a corpus repeats itself within each line.

    ``rate``: of all n-grams (whitespace tokens) in the corpus, the fraction that repeat an earlier
    n-gram of the same line (Welleck et al. 2019's seq-rep-n, pooled over the corpus);
    ``looping_lines``: lines in which some n-gram occurs at least ``loops`` times (a loop such as
    "der Fürsten der Fürsten der Fürsten"); ``lines``: all lines.
    """

    n: int
    rate: float
    repeated: int
    ngrams: int
    looping_lines: int
    lines: int


def repetition_rate(lines: Sequence[str], n: int = 4, loops: int = 3) -> Repetition:
    """Repeated n-grams within each line, pooled over ``lines`` (see :class:`Repetition`)."""
    if isinstance(lines, str) or not isinstance(lines, Sequence):
        raise TypeError(f"lines: expected a sequence of str, got {type(lines).__name__}")
    if n < 1 or loops < 2:
        raise ValueError(f"n, loops: expected n >= 1 and loops >= 2, got n={n}, loops={loops}")
    repeated = total = looping = 0
    for line in lines:
        grams = ngrams(line.split(), n)
        count = sum(grams.values())
        total += count
        repeated += count - len(grams)
        looping += bool(grams) and max(grams.values()) >= loops
    return Repetition(n, repeated / total if total else 0.0, repeated, total, looping, len(lines))
