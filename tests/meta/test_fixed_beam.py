"""The fixed beam-search inputs (``conformance/fixed.py``, ``_beam``) force the beam bugs they were chosen for: on each,
the NumPy built-in passes the beam check, and the mutant with the bug fails it (a failure is raised only where every
choice of the oracle's search was wider than the scores' error) and is named by its departure."""

from __future__ import annotations

import pytest

from aiayn.conformance import fixed as F
from aiayn.conformance import mutants as M
from aiayn.conformance.checks import load_all
from aiayn.conformance.harness import CHECKS
from aiayn.implementations.numpy_impl import NumpyImplementation

load_all()

#: Which mutant each fixed beam case is built to catch, by the start of its label.
FORCES = {
    "beam: an EOS among": "BeamExtendsFinished",
    "beam: best continuations": "BeamPerHypothesisBest",
    "beam: a longer hypothesis": "BeamBoundAtCurrentLength",
    "beam: two sentences": "BeamBatchMaxLength",
}


def _case(prefix: str) -> F.Fixed:
    (case,) = [c for c in F.cases("transformer_forward", "decode") if c.label.startswith(prefix)]
    return case


def test_every_fixed_beam_case_is_built_for_a_bug() -> None:
    labels = [c.label for c in F.cases("transformer_forward", "decode")]
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
