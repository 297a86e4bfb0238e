"""An implementation that compiles per shape (``compiles_per_shape = True``) is called with a few shapes per strategy,
not one per example (``conformance/inputs/strategies.py``, ``few_shapes``).

The same NumPy code, recording its input shapes, runs through the agreement checks of Eq. (1) and LayerNorm at the
ci profile twice: declared, the strategy behind each check gives at most ``FEW_SHAPES`` distinct shapes (masks of
each kind still drawn: a mask's kind changes its shape, so Eq. (1) may see up to FEW_SHAPES x 4 mask shapes per set);
undeclared, the same checks see many more. Both runs pass: values are still drawn in full.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from _aiayn_check import aiayn_check

from aiayn.conformance.inputs.strategies import FEW_SHAPES

HERE = Path(__file__).resolve().parent


def _shapes_seen(tmp_path: Path, spec: str) -> dict[str, set[tuple]]:
    log = tmp_path / f"{spec.split(':')[1]}.jsonl"
    args = [spec, "--workers=0", "--profile=ci", "--dtype=float64"]
    args += ["-k", "test_scaled_dot_product_attention or test_layer_norm", "--", "--aiayn-agreement-only"]
    proc = aiayn_check(tmp_path, *args, AIAYN_SHAPE_LOG=str(log), AIAYN_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
    seen: dict[str, set[tuple]] = defaultdict(set)
    for line in log.read_text(encoding="utf-8").splitlines():
        call = json.loads(line)
        seen[call["method"]].add(tuple(tuple(s) if s is not None else None for s in call["shapes"]))
    return seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, set[tuple]]]:
    tmp = tmp_path_factory.mktemp("few-shapes")
    return {
        "declared": _shapes_seen(tmp, "shape_counting_impl:CountingCompiled"),
        "undeclared": _shapes_seen(tmp, "shape_counting_impl:Counting"),
    }


def test_a_library_that_compiles_per_shape_sees_a_few_shapes(runs: dict[str, dict[str, set[tuple]]]) -> None:
    declared, undeclared = runs["declared"], runs["undeclared"]
    # LayerNorm's sizes: (rows, d) and the batch dims, all from one set: at most FEW_SHAPES shapes
    assert 1 <= len(declared["layer_norm"]) <= FEW_SHAPES, sorted(declared["layer_norm"])
    # Eq. (1): q, k, v from one set; the mask's kind (none, random, padding, causal) still drawn
    qkv = {shapes[:3] for shapes in declared["scaled_dot_product_attention"]}
    assert 1 <= len(qkv) <= FEW_SHAPES, sorted(qkv)
    assert len(declared["scaled_dot_product_attention"]) <= 4 * FEW_SHAPES
    # the same checks with sizes drawn see many more (derandomized: the same counts every run)
    assert len(undeclared["layer_norm"]) > 2 * FEW_SHAPES, sorted(undeclared["layer_norm"])
    assert len({shapes[:3] for shapes in undeclared["scaled_dot_product_attention"]}) > 2 * FEW_SHAPES
