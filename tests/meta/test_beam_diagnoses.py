"""Beam search's diagnoses end to end. The fixed beam-search inputs (``conformance/inputs/fixed.py``, ``_beam``) force
the beam bugs they were chosen for: on each, the NumPy built-in passes the beam check, and the mutant with the bug fails
it (a failure is raised only where every choice of the oracle's search was wider than the scores' error) and is named
by its departure. A search with two departures at once has both named in its row, each with the number of failing
examples it explains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _aiayn_check import aiayn_check

from aiayn.conformance.checks import load_all
from aiayn.conformance.inputs import fixed as F
from aiayn.conformance.run.harness import CHECKS
from aiayn.conformance.studies import mutants as M
from aiayn.implementations.numpy_impl import NumpyImplementation

load_all()

#: Which mutant each fixed beam case is built to catch, by the start of its label.
FORCES = {
    "beam: an EOS among": "BeamExtendsFinished",
    "beam: best continuations": "BeamPerHypothesisBest",
    "beam: a longer hypothesis": "BeamBoundAtCurrentLength",
    "beam: two sentences": "BeamBatchMaxLength",
    "beam: sentences that stop": "BeamStopsWithItsBatch",
}


def _case(prefix: str) -> F.Fixed:
    (case,) = [c for c in F.cases("transformer_forward", "decode") if c.label.startswith(prefix)]
    return case


def test_every_fixed_beam_case_is_built_for_a_bug() -> None:
    labels = [c.label for c in F.cases("transformer_forward", "decode") if c.label.startswith("beam: ")]
    assert sorted(labels) == sorted(_case(p).label for p in FORCES)


@pytest.mark.parametrize("prefix", sorted(FORCES))
def test_the_fixed_case_catches_its_bug_and_not_the_paper_search(prefix: str) -> None:
    case = _case(prefix)
    check = CHECKS[case.check]
    check(NumpyImplementation(), "float32", **case.args)  # the paper's search passes
    mutant = M.DECODE_MUTANTS[FORCES[prefix]]
    with pytest.raises(BaseException) as failed:
        check(mutant(), "float32", **case.args)
    assert f"'{mutant.departure}'" in str(failed.value), str(failed.value)


def test_a_row_names_every_cause_with_its_count(tmp_path: Path) -> None:
    """|Y|^alpha and an undeclared eos_rank='k' together (``beam_standin_impl.py``): the beam row names both."""
    proc = aiayn_check(
        tmp_path,
        "beam_standin_impl:PowerPenaltyEosRankK",
        "--profile=ci",
        "--dtype=float32",
        "--no-grad",
        "--workers=0",
        "-k",
        "beam_search_finds or decoding_on_fixed",
        f"--report={tmp_path}",
        AIAYN_FAILURES=str(tmp_path / "failures"),
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "conformance-beam-power-penalty-eos-rank-k.json").read_text())
    (row,) = [r for r in data["rows"] if r["status"] == "fail"]
    penalty = "length penalty |Y|^alpha instead of ((5 + |Y|) / 6)^alpha"
    eos_rank = "the search with eos_rank='k' (declared eos_rank='2k'): declare it in policies['beam_search']"
    assert row["causes"].get(penalty, 0) >= 1 and row["causes"].get(eos_rank, 0) >= 1, row["causes"]
    assert all(0 < n <= row["diagnosed"] for n in row["causes"].values()), row
    table = (tmp_path / "conformance-beam-power-penalty-eos-rank-k.md").read_text().replace("\\|", "|")
    for name in (penalty, eos_rank):
        assert f"'{name}' ({row['causes'][name]} of {row['diagnosed']} failing examples diagnosed)" in table
