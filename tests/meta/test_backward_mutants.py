"""The gradient checks have teeth: every backward mutant (``BACKWARD_MUTANTS`` of ``conformance/mutants.py``: the
NumPy built-in's hand-written VJP with one real backward bug, its forward intact) fails the backward row of its
equation, in every dtype, while its forward rows pass; the unbroken NumPy built-in, run alongside, passes every row.

The suite runs in a subprocess at the derandomized ``smoke`` profile (8 examples per check, the same every run).
"""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.conformance import mutants
from aiayn.conformance.results import Row, Status


def test_every_backward_mutant_fails_its_gradients_and_passes_its_forward(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    proc = mutants.run_mutants(reports, workers=2, profile="smoke", mutants=mutants.BACKWARD_MUTANTS)
    assert (reports / "conformance-numpy.json").exists(), f"the suite did not run:\n{proc.stdout[-3000:]}"
    assert len(mutants.BACKWARD_MUTANTS) >= 12
    missed, forward_failed = [], []
    for name, cls in mutants.BACKWARD_MUTANTS.items():
        rows = [Row.from_dict(r) for r in json.loads((reports / f"conformance-{cls.name}.json").read_text())["rows"]]
        mine = [r for r in rows if r.equation in cls.targets]
        backward = [r for r in mine if r.direction == "backward"]
        assert backward, f"{name}: no backward row for {sorted(cls.targets)}"
        missed += [f"{name} [{r.dtype}]: {r.status}" for r in backward if r.status is not Status.FAIL]
        forward = [r for r in mine if r.direction == "forward"]
        forward_failed += [f"{name}: {r.section} [{r.dtype}]" for r in forward if r.status is Status.FAIL]
    assert not missed, f"backward mutants not caught: {missed}\n{proc.stdout[-3000:]}"
    assert not forward_failed, (
        f"a backward mutant failed a forward row (its forward is the built-in's): {forward_failed}"
    )
    control = json.loads((reports / "conformance-numpy.json").read_text())
    assert control["verdict"] == "PASS", [r for r in control["rows"] if r["status"] == "fail"]
