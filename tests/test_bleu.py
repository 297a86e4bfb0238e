"""Tests of reproductions/bleu_scoring.py, bleu.py and bleu_wmt17.py: the paper's tokenized BLEU
(PAPER.md "Training and decoding (§5, §6)"), sacreBLEU beside it, and the WMT17 rescoring.

- Tokenizer and compound splitting: hand-written cases for every rule, an independent
  character scanner for tensor2tensor's non-overlapping substitution, and properties
  (no character lost, idempotent tokenization, splitting undone by removing the markers).
- BLEU arithmetic: small corpora worked by hand (n-gram precisions, clipping, brevity penalty,
  corpus-level sums), exact values from mpmath at 40 digits as the reference, and agreement with
  sacreBLEU run with ``tokenize="none"`` on the same tokens; each tolerance derived below.
- Inputs: empty and mismatched corpora fail with a clear message.
- WMT17: parsing, the data-only unpickler, the cache, the report with synthetic data offline, and
  uedin-nmt = 28.30 sacreBLEU when the real data is in the cache.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import math
import pickle
import tarfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.reproductions import bleu, bleu_scoring, bleu_wmt17
from aiayn.reproductions.bleu_scoring import (
    AT_SEPARATOR,
    multi_bleu,
    ngram_stats,
    paper_tokens,
    sacre_bleu,
    sacre_bleu_pretokenized,
    split_compounds,
    tokenize,
    tokenized_bleu,
)

U = 2.0**-53  # binary64 unit roundoff


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

TOKENIZER_CASES = [
    ("Der Hund bellt.", "Der Hund bellt ."),  # line-final period stands alone
    ("„Wir werden nicht aufgeben“, sagte sie.", "„ Wir werden nicht aufgeben “ , sagte sie ."),  # German quotes
    ('Er sagte: "Ja!"', 'Er sagte : " Ja ! "'),  # ASCII quotes, colon, exclamation mark
    ("um 3,5 % gestiegen", "um 3,5 % gestiegen"),  # decimal comma between digits stays
    ("Äpfel, Birnen und 1.000 Kirschen", "Äpfel , Birnen und 1.000 Kirschen"),  # comma after a word splits
    ("z.B. Dr. Weber am 3. Oktober.", "z.B. Dr. Weber am 3. Oktober ."),  # rules 6a, 6b, 6c
    ("z. B. Handwerker", "z. B. Handwerker"),  # single letters followed by a token keep their period
    ("Es waren 3.", "Es waren 3 ."),  # a number at the end of the line is not an ordinal
    ("Sie kam an. danach ging sie.", "Sie kam an. danach ging sie ."),  # rule 6d: lowercase follows
    ("Sie kam an. Danach ging sie.", "Sie kam an . Danach ging sie ."),
    ("80 km/h.", "80 km / h ."),  # slash; the line's last single letter loses its period
    ("Morgen gibt's Regen", "Morgen gibt ' s Regen"),  # apostrophe stands alone
    ("Warte... was?", "Warte ... was ?"),  # a run of periods is one token
    ("Die US-Wahl (2024) war knapp!", "Die US-Wahl ( 2024 ) war knapp !"),  # hyphens untouched, brackets split
    ("Ein- und Ausgang", "Ein- und Ausgang"),
    ("a_b", "a _ b"),  # underscore is not a letter
    ("  viel \t Platz \n ", "viel Platz"),  # whitespace collapsed
    ("u\u0308ber", "über"),  # NFC: decomposed umlaut becomes one letter
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), TOKENIZER_CASES)
def test_tokenize_cases(text: str, expected: str) -> None:
    got = tokenize(text)
    assert got == expected, f"tokenize({text!r}) = {got!r}, expected {expected!r}"


def test_tokenize_rejects_non_text() -> None:
    with pytest.raises(TypeError, match="text: expected str"):
        tokenize(["a list"])  # type: ignore[arg-type]


TRICKY = st.text(alphabet="aBü19 .,'`-„“\"/()…_?", max_size=40)


@settings(deadline=None)
@given(TRICKY)
def test_tokenize_only_inserts_spaces(text: str) -> None:
    """No character is lost or changed (after NFC): tokens only separate the input."""
    got = tokenize(text)
    assert got.replace(" ", "") == "".join(text.split()), f"{text!r} -> {got!r}"
    assert "  " not in got and got == got.strip(), f"{text!r} -> {got!r} has stray spaces"


@settings(deadline=None)
@given(TRICKY)
def test_tokenize_is_idempotent(text: str) -> None:
    """Tokenizing tokenized text changes nothing (a pre-tokenized reference keeps its tokens)."""
    once = tokenize(text)
    assert tokenize(once) == once, f"{text!r}: {once!r} -> {tokenize(once)!r}"


# ---------------------------------------------------------------------------------------------
# Compound splitting
# ---------------------------------------------------------------------------------------------

SPLIT_CASES = [
    ("US-Präsident", "US ##AT##-##AT## Präsident"),
    ("Nord-Süd-Verbindung", "Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung"),
    ("34-jährige", "34 ##AT##-##AT## jährige"),
    ("a-b-c", "a ##AT##-##AT## b-c"),  # the left-to-right, non-overlapping quirk
    ("Vitamin-D-Mangel", "Vitamin ##AT##-##AT## D-Mangel"),
    ("x--y", "x ##AT##-##AT## -y"),  # (\S)-(\S) takes "x--", then "y" alone cannot match
    ("Ein- und Ausgang", "Ein- und Ausgang"),  # no character after the hyphen
    ("ja - nein", "ja - nein"),
    ("-5 Grad", "-5 Grad"),
    ("Hund", "Hund"),
]


@pytest.mark.parametrize(("text", "expected"), SPLIT_CASES)
def test_split_compounds_cases(text: str, expected: str) -> None:
    got = split_compounds(text)
    assert got == expected, f"split_compounds({text!r}) = {got!r}, expected {expected!r}"


def _scan_split(text: str) -> str:
    """Independent of the regex: scan left to right; at each position, if three characters
    read <non-space> - <non-space>, emit them with the marker and skip past all three."""
    out, i = [], 0
    while i < len(text):
        window = text[i : i + 3]
        if len(window) == 3 and window[1] == "-" and not window[0].isspace() and not window[2].isspace():
            out.append(f"{window[0]} {AT_SEPARATOR} {window[2]}")
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@settings(deadline=None)
@given(st.text(alphabet="ab1- .", max_size=30))
def test_split_compounds_matches_a_scanner_and_is_undone_by_removing_markers(text: str) -> None:
    got = split_compounds(text)
    assert got == _scan_split(text), f"{text!r}: regex {got!r}, scanner {_scan_split(text)!r}"
    assert got.replace(f" {AT_SEPARATOR} ", "-") == text, f"{text!r} -> {got!r} does not invert"


def test_paper_tokens_tokenize_then_split() -> None:
    assert paper_tokens("Der US-Präsident sagte „Nein“.") == "Der US ##AT##-##AT## Präsident sagte „ Nein “ ."


# ---------------------------------------------------------------------------------------------
# BLEU arithmetic worked by hand
# ---------------------------------------------------------------------------------------------


def _our_bound(counts: list[int], totals: list[int], sys_len: int, ref_len: int) -> float:
    """Relative error bound of our float64 BLEU (first order in u), from bleu_from_counts' operations.

    - fl(c/t) = (c/t)(1 + δ), |δ| <= u, so log of it is off by <= u (absolute); math.log's own
      rounding is <= 1 ulp <= 2u relative, i.e. <= 2u·L absolute with L = max_n |log p_n|;
    - math.fsum is correctly rounded: <= u·|Σ| <= 4uL, and /4 is exact, so the mean is off by
      <= u + 2uL + uL = u(1 + 3L); exp turns that into the same relative error, plus 2u (1 ulp);
    - BP: fl(r/c) off by u·r/c absolute; 1 − r/c is exact for r/c in [1/2, 2] (Sterbenz) and
      within u|1 − r/c| otherwise; exp adds 2u;
    - the two products (100·BP, then × exp) add 2u.
    Total: u(7 + 3L + r/c + |1 − r/c|).
    """
    big_l = max(abs(math.log(c / t)) for c, t in zip(counts, totals))
    ratio = ref_len / sys_len
    return U * (7 + 3 * big_l + ratio + abs(1 - ratio))


def _exact_bleu(counts: list[int], totals: list[int], sys_len: int, ref_len: int) -> float:
    """BLEU from the integer statistics in 40-digit arithmetic (an independent evaluation)."""
    with mpmath.workdps(40):
        bp = mpmath.mpf(1) if sys_len >= ref_len else mpmath.exp(1 - mpmath.mpf(ref_len) / sys_len)
        geo = mpmath.exp(mpmath.fsum(mpmath.log(mpmath.mpf(c) / t) for c, t in zip(counts, totals)) / len(counts))
        return float(100 * bp * geo)


def test_brevity_penalty_by_hand() -> None:
    """Output "die Katze sitzt auf der" against "die Katze sitzt auf der Matte": every n-gram of
    the output is in the reference, so the precisions are 5/5, 4/4, 3/3, 2/2 and BLEU is the
    brevity penalty alone: c = 5, r = 6, BP = exp(1 − 6/5) = exp(−0.2), BLEU = 100·e^(−0.2) = 81.873..."""
    s = multi_bleu(["die Katze sitzt auf der"], ["die Katze sitzt auf der Matte"])
    assert (s.counts, s.totals, s.sys_len, s.ref_len) == ((5, 4, 3, 2), (5, 4, 3, 2), 5, 6)
    assert s.precisions == (100.0, 100.0, 100.0, 100.0)
    exact = float(100 * mpmath.exp(mpmath.mpf(-1) / 5))
    assert abs(s.score - exact) <= _our_bound([5, 4, 3, 2], [5, 4, 3, 2], 5, 6) * exact, f"{s.score!r} vs {exact!r}"
    assert abs(s.bp - math.exp(-0.2)) <= 4 * U, f"BP {s.bp!r} vs exp(-0.2)"


def test_clipping_by_hand() -> None:
    """Output "der der der der" against "der Hund und der Hase": "der" occurs twice in the
    reference, so only 2 of the 4 unigrams count; no bigram matches, so BLEU (unsmoothed) is 0.
    BP = exp(1 − 5/4) = exp(−0.25) is still reported."""
    s = multi_bleu(["der der der der"], ["der Hund und der Hase"])
    assert (s.counts, s.totals) == ((2, 0, 0, 0), (4, 3, 2, 1))
    assert s.precisions == (50.0, 0.0, 0.0, 0.0)
    assert s.score == 0.0
    assert abs(s.bp - math.exp(-0.25)) <= 4 * U


def test_corpus_sums_before_dividing() -> None:
    """Two segments. (1) "wir fahren nach Berlin" = its reference: 4/4, 3/3, 2/2, 1/1.
    (2) "sie kommt heute nach Hause" against "sie kommt morgen nach Hause": unigrams sie, kommt,
    nach, Hause match (4/5); bigrams "sie kommt", "nach Hause" (2/4); trigrams 0/3; 4-grams 0/2.
    Alone, (2) scores 0; the corpus sums 8/9, 5/7, 2/5, 1/3 with c = r = 9 (BP = 1), so
    BLEU = 100·(8/9 · 5/7 · 2/5 · 1/3)^(1/4) = 100·(16/189)^(1/4) = 53.94..."""
    hyps = ["wir fahren nach Berlin", "sie kommt heute nach Hause"]
    refs = ["wir fahren nach Berlin", "sie kommt morgen nach Hause"]
    assert multi_bleu(hyps[1:], refs[1:]).score == 0.0
    s = multi_bleu(hyps, refs)
    assert (s.counts, s.totals, s.sys_len, s.ref_len, s.bp) == ((8, 5, 2, 1), (9, 7, 5, 3), 9, 9, 1.0)
    assert Fraction(8, 9) * Fraction(5, 7) * Fraction(2, 5) * Fraction(1, 3) == Fraction(16, 189)
    with mpmath.workdps(40):
        exact = float(100 * mpmath.root(mpmath.mpf(16) / 189, 4))
    assert abs(s.score - exact) <= _our_bound([8, 5, 2, 1], [9, 7, 5, 3], 9, 9) * exact, f"{s.score!r} vs {exact!r}"
    assert 53.94 < s.score < 53.95


def test_ngram_stats_by_hand() -> None:
    """ "a b a b" against "a b b": unigrams a×2 (ref has 1) + b×2 (ref 2) → 3; bigrams ab×2 (ref 1),
    ba×1 (ref 0) → 1; trigrams aba, bab (ref: abb) → 0; no 4-gram but the one of the output."""
    assert ngram_stats(["a", "b", "a", "b"], ["a", "b", "b"]) == ([3, 1, 0, 0], [4, 3, 2, 1])
    assert ngram_stats([], ["a"]) == ([0, 0, 0, 0], [0, 0, 0, 0])


def test_perfect_match_is_100() -> None:
    """All precisions 1 and BP 1: log 1 = 0 and exp 0 = 1 exactly, so ours is exactly 100.
    sacreBLEU evaluates exp(log 100) instead; within u(6 + 5 log 100)·100 (its error terms
    from test_multi_bleu_agrees_with_sacrebleu with L' = log 100)."""
    sample = bleu.load_sample()
    refs = sample["ref.de"]
    assert tokenized_bleu(refs, refs).score == 100.0
    assert multi_bleu(["a b"], ["a b"]).score == 0.0  # no 3- or 4-grams: zero precision, as multi-bleu
    theirs = sacre_bleu(refs, refs).score
    assert abs(theirs - 100.0) <= U * (6 + 5 * math.log(100)) * 100, f"sacreBLEU on identical text: {theirs!r}"


def test_empty_output_scores_zero() -> None:
    s = multi_bleu(["", ""], ["a b c d", "e f"])
    assert (s.score, s.bp, s.sys_len, s.ref_len) == (0.0, 0.0, 0, 6)


# ---------------------------------------------------------------------------------------------
# Agreement with sacreBLEU and with exact arithmetic
# ---------------------------------------------------------------------------------------------

WORDS = st.sampled_from(["der", "die", "Hund", "Katze", "läuft", ".", ","])
SEGMENT = st.lists(WORDS, min_size=0, max_size=12).map(" ".join)


@st.composite
def corpora(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    n = draw(st.integers(1, 5))
    return draw(st.lists(SEGMENT, min_size=n, max_size=n)), draw(st.lists(SEGMENT, min_size=n, max_size=n))


@settings(deadline=None)
@given(corpora())
def test_multi_bleu_agrees_with_sacrebleu(corpus: tuple[list[str], list[str]]) -> None:
    """Same tokens, same statistics exactly; scores within u(9 + 3L + 5L')·S.

    sacreBLEU (``tokenize="none"``, no smoothing) computes p'_n = fl(100·c/t) (100·c exact, one
    rounding), sums math.log(p'_n) with plain ``sum`` (γ_3 on |terms| <= 4L', L' = max |log p'_n|),
    divides by 4 and multiplies exp of that by BP: its mean is off by <= u + 2uL' + 3uL' =
    u(1 + 5L'), exp adds 2u and the product u. Ours (see _our_bound) has u(1 + 3L) in the mean,
    2u in exp and 2u in its two products. Both compute BP = exp(1 − r/c) by the same float
    operations, so it contributes nothing to the difference. Exactly, exp(mean log 100p) =
    100·exp(mean log p). So |ours − theirs| <= u(9 + 3L + 5L')·S to first order (the second-order
    terms are below 1e-12 of this). A zero precision gives exactly 0 in both.
    """
    hyps, refs = corpus
    ours, theirs = multi_bleu(hyps, refs), sacre_bleu_pretokenized(hyps, refs)
    assert (ours.counts, ours.totals, ours.sys_len, ours.ref_len) == (
        theirs.counts,
        theirs.totals,
        theirs.sys_len,
        theirs.ref_len,
    )
    if min(ours.counts) == 0 or ours.sys_len == 0:
        assert ours.score == theirs.score == 0.0, f"{hyps} / {refs}: {ours.score} vs {theirs.score}"
        return
    big_l = max(abs(math.log(c / t)) for c, t in zip(ours.counts, ours.totals))
    big_l_pct = max(abs(math.log(100 * c / t)) for c, t in zip(ours.counts, ours.totals))
    bound = U * (9 + 3 * big_l + 5 * big_l_pct) * ours.score
    miss = abs(ours.score - theirs.score)
    assert miss <= bound, (
        f"{hyps} / {refs}: ours {ours.score!r}, sacreBLEU {theirs.score!r}, miss {miss:.3g} > {bound:.3g}"
    )
    assert bleu_scoring.agreement_bound(ours) == bound, "the report's agreement_bound differs from this derivation"


@settings(deadline=None)
@given(corpora())
def test_multi_bleu_against_exact_arithmetic(corpus: tuple[list[str], list[str]]) -> None:
    """Our float64 BLEU against the same formula in 40 digits, within _our_bound."""
    hyps, refs = corpus
    s = multi_bleu(hyps, refs)
    if min(s.counts) == 0 or s.sys_len == 0:
        assert s.score == 0.0
        return
    exact = _exact_bleu(list(s.counts), list(s.totals), s.sys_len, s.ref_len)
    bound = _our_bound(list(s.counts), list(s.totals), s.sys_len, s.ref_len) * exact
    assert abs(s.score - exact) <= bound, f"{hyps} / {refs}: {s.score!r} vs exact {exact!r}, bound {bound:.3g}"


def test_sample_13a_counts_sum_to_sacrebleus() -> None:
    """The report's per-sentence 13a columns (our n-gram counting on sacreBLEU's 13a tokens) sum
    to sacreBLEU's own corpus statistics, so the two columns count the same thing."""
    sample = bleu.load_sample()
    segs = bleu.segments(sample)
    s = sacre_bleu(sample["hyp.de"], sample["ref.de"])
    assert tuple(sum(x) for x in zip(*(g.counts_13a for g in segs))) == s.counts
    assert tuple(sum(x) for x in zip(*(g.totals_13a for g in segs))) == s.totals


def test_tokenized_bleu_is_multi_bleu_on_paper_tokens() -> None:
    sample = bleu.load_sample()
    hyps, refs = sample["hyp.de"], sample["ref.de"]
    direct = multi_bleu([paper_tokens(h) for h in hyps], [paper_tokens(r) for r in refs])
    s = tokenized_bleu(hyps, refs)
    assert (s.score, s.counts, s.totals) == (direct.score, direct.counts, direct.totals)
    assert s.signature == bleu_scoring.TOKENIZED_SIGNATURE


def test_signatures_are_sacrebleus_own() -> None:
    import sacrebleu

    sample = bleu.load_sample()
    v = sacrebleu.__version__
    assert (
        sacre_bleu(sample["hyp.de"], sample["ref.de"]).signature
        == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{v}"
    )
    assert (
        bleu_scoring.chrf(sample["hyp.de"], sample["ref.de"]).signature
        == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{v}"
    )


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scorer", [multi_bleu, tokenized_bleu, sacre_bleu, bleu_scoring.chrf])
def test_bad_corpora_fail_clearly(scorer: Callable[[list, list], object]) -> None:
    with pytest.raises(ValueError, match="hyps: expected at least one segment"):
        scorer([], [])
    with pytest.raises(ValueError, match="one reference per output, got 2 outputs and 1 references"):
        scorer(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="hyps: expected a sequence of str"):
        scorer("a b c", ["a b c"])
    with pytest.raises(TypeError, match=r"refs\[1\]: expected str, got int"):
        scorer(["a", "b"], ["a", 3])
    with pytest.raises(ValueError, match=r"hyps\[0\]: a segment is one line"):
        scorer(["a\nb"], ["a b"])


# ---------------------------------------------------------------------------------------------
# The report on the shipped sample
# ---------------------------------------------------------------------------------------------


def test_worked_examples_show_their_mechanisms() -> None:
    """Each example the report works in full still shows the mechanism its heading names."""
    segs = {s.index: s for s in bleu.segments(bleu.load_sample())}

    def only_paper(i: int) -> set[str]:
        s = segs[i]
        return set(bleu.matched_unigrams(s.hyp_paper, s.ref_paper) - bleu.matched_unigrams(s.hyp_13a, s.ref_13a))

    assert segs[2].gain > 0 and AT_SEPARATOR in only_paper(2), "2: a correct compound counts several times"
    assert "„Wir" in segs[5].ref_13a.split() and "Wir" in only_paper(5), "5: German quotes glue to words under 13a"
    assert segs[9].gain < 0 and "z.B." in segs[9].ref_paper.split(), "9: 13a splits abbreviations"
    assert "SPD" in only_paper(28), "28: a compound's part matches"
    assert "D-Mangel" in segs[33].ref_paper.split(), "33: the splitting quirk"
    assert set(bleu.EXAMPLES) == {2, 5, 9, 28, 33}


def test_sample_files_align() -> None:
    sample = bleu.load_sample()
    assert {len(v) for v in sample.values()} == {33}
    assert all(line.strip() == line and line for lines in sample.values() for line in lines)


def test_main_without_data_writes_the_worked_example_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline with an empty cache: bleu.md leads with the WMT17 section saying it was not measured (and how
    to measure it), then the worked example; the sample's own statistics are computed all the same."""
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "empty"))
    verdict = bleu.main(tmp_path / "out", measure=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bleu.json", "bleu.md"]
    data = json.loads((tmp_path / "out" / "bleu.json").read_text(encoding="utf-8"))
    assert data["verdict"] == verdict and data["agreement"]["within_bound"] and data["agreement"]["same_counts"]
    assert verdict.startswith("WMT17 data not available") and not data["wmt17"]["available"]
    md = (tmp_path / "out" / "bleu.md").read_text(encoding="utf-8")
    assert bleu_wmt17.PIP_COMMAND in md and bleu_wmt17.SDIST_SHA256 in md and "{" not in md
    assert md.index("## Sixteen WMT17 systems: not measured") < md.index("## Worked example")
    density = data["sample"]["hyphen_density"]
    assert density["markers"] == sum(
        r.split().count(AT_SEPARATOR) for r in (paper_tokens(x) for x in bleu.load_sample()["ref.de"])
    )


# ---------------------------------------------------------------------------------------------
# WMT17 rescoring
# ---------------------------------------------------------------------------------------------


def test_kendall_tau_by_hand() -> None:
    """Same order: all 3 pairs concordant → 1; reversed → −1; one swap of three: (2 − 1)/3."""
    assert bleu_wmt17.kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert bleu_wmt17.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert bleu_wmt17.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3, rel=0, abs=U)
    assert bleu_wmt17.kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(
        2 / 3, rel=0, abs=U
    )  # the tie counts as neither
    with pytest.raises(ValueError, match="same length"):
        bleu_wmt17.kendall_tau([1], [1])


def test_short_names() -> None:
    assert bleu_wmt17.short_name("newstest2017.uedin-nmt.4722.en-de") == "uedin-nmt"
    assert bleu_wmt17.short_name("newstest2017.online-A.0.en-de") == "online-A"
    with pytest.raises(ValueError, match="expected newstest2017"):
        bleu_wmt17.short_name("reference")


TEST_SH = """
declare -A CHRF=( ["newstest2017.C-3MA.4959.en-de.sgm"]=51.9533
                  ["newstest2017.online-A.0.en-fi.sgm"]=49.5458
                )
declare -A CHRFPP=( ["newstest2017.C-3MA.4959.en-de.sgm"]=49.1683
                  )
declare -A MTEVAL=( ["newstest2017.uedin-nmt.4722.en-de.sgm"]=28.3
                    ["newstest2017.C-3MA.4959.en-de.sgm"]=22.67
                    ["newstest2017.uedin-nmt.4956.en-cs.sgm"]=22.8
                  )
"""


def test_recorded_tables_parse_en_de_only() -> None:
    assert bleu_wmt17._recorded(TEST_SH, "MTEVAL") == {"uedin-nmt": 28.3, "C-3MA": 22.67}
    assert bleu_wmt17._recorded(TEST_SH, "CHRF") == {"C-3MA": 51.9533}
    with pytest.raises(ValueError, match="no table TER"):
        bleu_wmt17._recorded(TEST_SH, "TER")


def test_unpickler_accepts_data_and_refuses_objects() -> None:
    data = [("newstest2017.x.1.en-de", ["a", "b"]), ("reference", [["a", "b"]])]
    assert bleu_wmt17._DataOnly(io.BytesIO(pickle.dumps(data))).load() == data
    with pytest.raises(pickle.UnpicklingError, match="refusing to load fractions.Fraction"):
        bleu_wmt17._DataOnly(io.BytesIO(pickle.dumps(Fraction(1, 2)))).load()


def _synthetic_sdist(folder: Path, refs: list[str], systems: dict[str, list[str]], test_sh: str) -> Path:
    """A stand-in for sacrebleu-2.6.0.tar.gz holding the two members the rescoring reads."""
    named = [(f"newstest2017.{name}.1.en-de", lines) for name, lines in systems.items()] + [("reference", [refs])]
    members = {
        bleu_wmt17.SYSTEMS_MEMBER: bz2.compress(pickle.dumps(named)),
        bleu_wmt17.TEST_SH_MEMBER: test_sh.encode(),
    }
    path = folder / bleu_wmt17.SDIST
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_fetch_without_network_reports_a_missing_or_wrong_file(tmp_path: Path) -> None:
    path, why = bleu_wmt17.fetch(tmp_path, network=False)
    assert path is None and "not in the cache" in why
    (tmp_path / bleu_wmt17.SDIST).write_bytes(b"not the sdist")
    path, why = bleu_wmt17.fetch(tmp_path, network=False)
    assert path is None and "wrong SHA-256" in why


def test_rescoring_on_synthetic_data_and_rerendering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three made-up systems: uedin-nmt copies the reference (sacreBLEU 100, so the known 28.30 is
    NOT reproduced and the verdict must say so), C-3MA and FBK differ by one hyphenated word.
    The recorded mteval figure 100 for uedin-nmt agrees; 50 for C-3MA does not. Re-rendering from the
    stored JSON gives the same report (signature aside)."""
    refs = [
        "Der US-Präsident traf die EU-Kommissarin am Dienstag in Berlin .",
        "Das ist ein sehr guter Test für uns alle .",
    ]
    systems = {
        "uedin-nmt": list(refs),
        "C-3MA": ["Der US-Präsident traf die EU-Kommissarin am Montag in Berlin .", refs[1]],
        "FBK": ["Der Präsident traf die EU-Kommissarin am Dienstag in Berlin .", refs[1]],
    }
    test_sh = TEST_SH.replace("=28.3", "=100").replace("=22.67", "=50")
    cache = tmp_path / "cache"
    cache.mkdir()
    sdist = _synthetic_sdist(cache, refs, systems, test_sh)
    monkeypatch.setenv("AIAYN_CACHE", str(cache))
    monkeypatch.setattr(bleu_wmt17, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    verdict = bleu.main(tmp_path / "a", measure=False)
    assert verdict.startswith("uedin-nmt 100.00 sacreBLEU (NOT the known 28.30)"), verdict
    data = json.loads((tmp_path / "a" / "bleu.json").read_text(encoding="utf-8"))
    rows = {r["system"]: r for r in data["wmt17"]["systems"]}
    assert rows["uedin-nmt"]["scores"]["sacre"] == 100.0 and rows["uedin-nmt"]["scores"]["paper"] == 100.0
    assert (
        rows["FBK"]["mteval_recorded"] is None and rows["FBK"]["markers"] == 1 and rows["FBK"]["markers_matched"] == 1
    )
    sacre = [r["scores"]["sacre"] for r in data["wmt17"]["systems"]]
    assert sacre == sorted(sacre, reverse=True) and data["wmt17"]["systems"][0]["system"] == "uedin-nmt"
    assert "1 of 3 WMT17 systems equal" in verdict
    assert bleu.rerender(data, tmp_path / "b") == verdict
    strip = lambda p: [x for x in p.read_text(encoding="utf-8").splitlines() if not x.startswith("Signature: ")]  # noqa: E731
    assert strip(tmp_path / "a" / "bleu.md") == strip(tmp_path / "b" / "bleu.md")


@pytest.mark.skipif(
    not (bleu_wmt17.cache_dir() / bleu_wmt17.SDIST).exists(), reason="sacreBLEU 2.6.0's sdist is not in the cache"
)
def test_uedin_nmt_is_28_30_sacrebleu() -> None:
    """The known figure: uedin-nmt scores 28.30 sacreBLEU on newstest2017 EN→DE."""
    sdist, _ = bleu_wmt17.fetch(bleu_wmt17.cache_dir(), network=False)
    assert sdist is not None, "the cached sdist has the wrong hash"
    data = bleu_wmt17.load(sdist)
    assert len(data.systems) == 16 and len(data.refs) == 3004
    score = sacre_bleu(data.systems["uedin-nmt"], data.refs).score
    assert round(score, 2) == 28.30, f"uedin-nmt: {score} sacreBLEU, expected 28.30"


# ---------------------------------------------------------------------------------------------
# French and English rules; repetition
# ---------------------------------------------------------------------------------------------

OTHER_LANGUAGE_CASES = [
    (
        "fr",
        "Car Dieu a tant aimé le monde qu'il a donné son Fils.",
        "Car Dieu a tant aimé le monde qu' il a donné son Fils .",
    ),
    (
        "fr",
        "L’homme d'aujourd'hui dit : « peut-être ».",
        "L’ homme d' aujourd' hui dit : « peut-être » .",
    ),  # elision, no split
    ("fr", "M. Dupont et Mme. Durand arrivent.", "M. Dupont et Mme. Durand arrivent ."),  # French abbreviations
    ("fr", "Il en avait 3. Puis il partit.", "Il en avait 3 . Puis il partit ."),  # no German ordinal rule in French
    ("fr", "l' 'isolé'", "l ' ' isolé '"),  # an apostrophe not between two letters stands alone
    ("de", "Es war am 3. Oktober.", "Es war am 3. Oktober ."),  # the German ordinal rule (c)
    ("en", "I don't know John's dog.", "I don 't know John 's dog ."),  # English clitics start the right part
]


@pytest.mark.parametrize(("lang", "text", "expected"), OTHER_LANGUAGE_CASES)
def test_tokenize_by_language(lang: str, text: str, expected: str) -> None:
    assert tokenize(text, lang) == expected


def test_french_paper_style_does_not_split_compounds() -> None:
    """EN→FR is scored with French rules and no compound splitting; German splits."""
    assert paper_tokens("Vous êtes peut-être arrivés.", "fr") == "Vous êtes peut-être arrivés ."
    assert paper_tokens("Der US-Präsident", "de") == "Der US ##AT##-##AT## Präsident"
    s = tokenized_bleu(["Vous êtes peut-être arrivés."], ["Vous êtes peut-être arrivés."], "fr")
    assert s.score == 100.0 and "tok:aiayn-moseslike-fr.1|split:none" in s.signature
    with pytest.raises(ValueError, match="lang"):
        tokenize("x", "xx")


def test_repetition_rate_by_hand() -> None:
    """ "der Fürsten der Fürsten der Fürsten der Fürsten": 8 tokens, 5 4-grams of which 2 distinct
    ("der Fürsten der Fürsten" x3, "Fürsten der Fürsten der" x2): 3 repeats, and a 4-gram occurs 3 times
    (a loop). "a b c d e": 2 distinct 4-grams. Pooled: 3 repeats of 7 4-grams."""
    from aiayn.reproductions.bleu_scoring import repetition_rate

    r = repetition_rate(["der Fürsten der Fürsten der Fürsten der Fürsten", "a b c d e", "kurz"])
    assert (r.repeated, r.ngrams, r.looping_lines, r.lines) == (3, 7, 1, 3) and r.rate == 3 / 7
    assert repetition_rate(["a b a b"], n=2).repeated == 1 and repetition_rate([]).rate == 0.0


def test_scoring_and_rescoring_do_not_import_the_report() -> None:
    """One direction only: bleu.py (the report) imports bleu_scoring and bleu_wmt17; neither imports the report,
    and the scoring module imports no other reproduction (the training runs score with it)."""
    import ast

    def imported(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        return {n for n in names if n.startswith("aiayn.reproductions")}

    assert "aiayn.reproductions.bleu" not in imported(bleu_wmt17) | imported(bleu_scoring)
    assert imported(bleu_scoring) == set()
    assert {"aiayn.reproductions.bleu_scoring"} <= imported(bleu)
