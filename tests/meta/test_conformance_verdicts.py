"""Verdicts that can always fail: no pass on a bound that does not apply, honest report cells, one replay per failure.

- ``comparison.compare`` never turns an infinite, NaN or vacuous budget into a pass: such elements
  are counted as not checked (with the reason), and nothing else about them is claimed;
- 0-d and empty results are compared without crashing;
- a report row with more unchecked elements than stated is "inconclusive" and fails the run,
  unless the implementation declares it;
- report cells say what happened (contract, NaN mismatch, not measured) instead of a number;
- two distinct failures of one test get two messages and two replay files, each replaying its own
  failure, and the report keeps the largest discrepancy found for the check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.conformance.report import rows as report
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, NaNMismatch, OverBudget, Stats, current_stats
from aiayn.implementations.numpy_impl import NumpyImplementation

TESTS = Path(__file__).resolve().parent
MODULE = Path(__file__).stem


@pytest.fixture
def stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))
    s = Stats()
    token = current_stats().set(s)
    yield s
    current_stats().reset(token)


def _case(kind: str = "agreement") -> Case:
    return Case(NumpyImplementation(), "float32", "softmax", "softmax", {"x": np.zeros(3)}, kind)


@pytest.mark.parametrize("bad", [np.inf, np.nan, 1e300])
def test_a_budget_that_does_not_apply_is_never_a_pass(stats: Stats, bad: float) -> None:
    got = np.array([1.0, 5.0, 3.0])
    expected = np.array([1.0, 2.0, 3.0])  # the middle element is off by 3
    ratio = compare(_case(), got, expected, np.array([0.1, bad, 0.1]), budget_name="test bound")
    assert ratio == 0.0, "the worst ratio must come from the checked elements only"
    assert stats.checked == 2 and sum(stats.unchecked.values()) == 1, stats
    assert "test bound" in next(iter(stats.unchecked)), stats.unchecked
    with pytest.raises(OverBudget):  # the same element with a budget that applies fails
        compare(_case(), got, expected, np.array([0.1, 1.0, 0.1]))


def test_nothing_checked_gives_no_ratio(stats: Stats) -> None:
    assert compare(_case(), np.array([7.0]), np.array([1.0]), np.array([np.inf])) is None
    assert stats.worst is None and stats.checked == 0


def test_zero_d_and_empty_results(stats: Stats) -> None:
    with pytest.raises(NaNMismatch, match=r"NaN at index \(\)"):
        compare(_case(), np.array(np.nan), np.array(0.5), np.array(0.1))
    with pytest.raises(NaNMismatch, match=r"at index \(\), where the oracle gives NaN"):
        compare(_case(), np.array(0.5), np.array(np.nan), np.array(0.1))
    assert compare(_case(), np.array(0.5), np.array(0.5), np.array(0.1)) == 0.0
    assert compare(_case(), np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3))) is None


def _results(**row: Any) -> list[dict[str, Any]]:
    base = {
        "spec": "x",
        "equation": "layer_norm",
        "dtype": "float32",
        "test": "test_layer_norm",
        "outcome": "passed",
        "reason": "",
        "examples": 10,
        "checked": 90,
        "unchecked": {"why": 10},
        "exact": 0,
        "worst": 0.5,
        "nan_mismatches": 0,
        "largest": None,
    }
    return [base | row]


class _Entry:
    def __init__(self, impl: Any) -> None:
        self.impl, self.spec, self.name, self.error = impl, "x", "x", ""


def _row(data: dict[str, Any], equation: str = "layer_norm") -> dict[str, Any]:
    return next(r for r in data["rows"] if r["equation"] == equation and r["dtype"] in ("float32", "all"))


def test_a_row_above_the_stated_unchecked_fraction_is_inconclusive_unless_declared() -> None:
    impl = NumpyImplementation()
    data = report.build(_Entry(impl), _results(), {})
    assert (
        _row(data)["status"] == "inconclusive"
        and _row(data)["fraction_checked"] == 0.9
        and data["verdict"] == "INCONCLUSIVE"
    )
    impl.declared_inconclusive = {"layer_norm@float32": "our rows are near-constant"}
    data = report.build(_Entry(impl), _results(), {})
    assert _row(data)["status"] == "inconclusive (declared)" and data["verdict"] == "PASS"
    assert _row(report.build(_Entry(NumpyImplementation()), _results(unchecked={"why": 0}), {}))["status"] == "pass"


@pytest.mark.parametrize(
    ("row", "cell"),
    [
        ({"equation": "contract", "checked": 5, "exact": 5, "unchecked": {}, "worst": None}, "contract (exact)"),
        ({"outcome": "failed", "nan_mismatches": 1, "worst": None, "unchecked": {}}, "NaN mismatch"),
        ({"checked": 0, "unchecked": {"why": 4}, "worst": None}, "not measured"),
        ({"worst": 0.25, "unchecked": {}}, "0.25"),
    ],
)
def test_report_cells_say_what_happened(row: dict[str, Any], cell: str) -> None:
    data = report.build(_Entry(NumpyImplementation()), _results(**row), {})
    assert _row(data, row.get("equation", "layer_norm"))["measure"] == cell


# --------------------------------------------------------------------------------------------
# end to end, through the plugin


class UnbiasedStdLayerNorm(NumpyImplementation):
    """LayerNorm as a tutorial writes it: the unbiased (n - 1) std, eps added to the std (NaN for one element)."""

    name = "unbiased-std-layer-norm"

    def provides(self) -> frozenset[str]:
        return frozenset({"layer_norm"})

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        mean = x.mean(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            std = x.std(axis=-1, keepdims=True, ddof=1)
        return (gain * (x - mean) / (std + eps) + bias).astype(x.dtype)


class LayerNormOnly(NumpyImplementation):
    """The NumPy LayerNorm alone, in float64."""

    name = "layer-norm-only"
    dtypes = ("float64",)

    def provides(self) -> frozenset[str]:
        return frozenset({"layer_norm"})


class DeclaredInconclusive(LayerNormOnly):
    name = "declared-inconclusive"
    declared_inconclusive = {"layer_norm": "this run checks LayerNorm on rows no budget covers, on purpose"}


_ROWS_NO_BUDGET_COVERS = """
import numpy as np
import pytest
from aiayn.conformance.checks import layers as L


@pytest.mark.aiayn_equation("layer_norm")
def test_layer_norm_on_rows_no_budget_covers(impl, dtype):
    # rows at 1e300: the bound's own magnitudes overflow, so no element can be checked
    L.layer_norm(impl, dtype, x=np.full((2, 4), 1e300), gain=np.ones(4), bias=np.zeros(4), eps=1e-6)
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        "AIAYN_FAILURES": str(tmp_path / "failures"),
        "AIAYN_PROFILE": "ci",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    ("impl", "status", "code"),
    [("LayerNormOnly", "inconclusive", 1), ("DeclaredInconclusive", "inconclusive (declared)", 0)],
)
def test_inconclusive_fails_the_run_unless_declared(tmp_path: Path, impl: str, status: str, code: int) -> None:
    (tmp_path / "test_rows.py").write_text(textwrap.dedent(_ROWS_NO_BUDGET_COVERS))
    proc = _pytest(tmp_path, "test_rows.py", f"--impl={MODULE}:{impl}", f"--aiayn-report={tmp_path / 'r'}")
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{proc.stdout[-3000:]}"
    data = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    row = next(r for r in data["rows"] if r["equation"] == "layer_norm")
    assert (
        row["status"] == status and row["checked"] == 0 and row["not_checked"] == 8 and row["measure"] == "not measured"
    ), row
    assert ("INCONCLUSIVE" in proc.stdout) == bool(code)


def test_two_distinct_failures_get_their_own_messages_and_replay_files(tmp_path: Path) -> None:
    proc = _pytest(
        tmp_path,
        "--pyargs",
        "aiayn.conformance",
        f"--impl={MODULE}:UnbiasedStdLayerNorm",
        "--dtype=float64",
        "-k",
        "test_layer_norm and not shifting and not fixed and not batch_invariant",
        f"--aiayn-report={tmp_path / 'r'}",
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "NaNMismatch" in out and "OverBudget" in out, f"expected both failures reported:\n{out[-4000:]}"
    replays = sorted(set(re.findall(r"replay: aiayn replay (\S+\.npz)", out)))
    assert len(replays) >= 2, f"expected one replay file per failure, got {replays}"
    from aiayn.conformance.replay import replay

    for path in replays:
        assert Path(path).exists(), f"{path} is named in a message but not on disk"
        # the file names a module:attr, which replay imports only when the user names it
        assert replay([path], impl=f"{MODULE}:UnbiasedStdLayerNorm") == 1, f"{path} does not reproduce its failure"
    left = {str(f) for f in (tmp_path / "failures").glob("*.npz")}
    assert left <= set(replays), f"replay files no message names were left behind: {sorted(left - set(replays))}"
    data = json.loads((tmp_path / "r" / "conformance-unbiased-std-layer-norm.json").read_text())
    row = next(r for r in data["rows"] if r["equation"] == "layer_norm")
    assert row["status"] == "fail" and row["largest_failure"] and row["largest_failure"]["ratio"] > 1e3, row
    # the message leads with the largest miss and names the defect on it, not only the shrunk symptom
    lead = re.findall(r"largest discrepancy found for this check: [^\n]*", out)
    assert lead and all("the output matches 'unbiased variance, eps added to the std'" in line for line in lead), lead
    assert row["largest_failure"]["departures"] == ["unbiased variance, eps added to the std"], row["largest_failure"]
    assert "unbiased variance, eps added to the std" in row["departures"], row


class PaddedGarbage(NumpyImplementation):
    """A whole model that writes 1e6 into the logits at padded target positions (an incremental decoder's
    adapter fills what it never computes)."""

    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):  # type: ignore[no-untyped-def]
        out = super().transformer_forward(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths)
        if tgt_lengths is not None:
            out[np.arange(out.shape[1])[None, :] >= tgt_lengths[:, None]] = 1e6
        return out


def test_logits_at_padded_target_positions_are_not_compared_and_are_counted(stats: Stats) -> None:
    """The whole model's agreement and its batch property pass the stand-in; its padded positions are counted as
    not checked, with the reason; a wrong logit at a real position still fails."""
    import types

    from aiayn.conformance.checks import model as M
    from aiayn.conformance.equations import PADDED_TARGET
    from aiayn.reference import model as RM

    cfg = types.SimpleNamespace(n_layers=1, d_model=4, d_ff=8, num_heads=2, d_k=2, d_v=2)
    params = RM.init_params(cfg, 7, np.random.default_rng(3), biases=True)
    src, tgt = np.array([[1, 2, 3], [4, 5, 6]]), np.array([[0, 1, 2], [2, 3, 4]])
    args = {"src": src, "tgt": tgt, "params": params, "num_heads": 2, "src_lengths": np.array([3, 2])}
    M.transformer_forward(PaddedGarbage(), "float64", **args, tgt_lengths=np.array([3, 1]))
    assert stats.unchecked == {PADDED_TARGET: 2 * 7}, stats.unchecked  # sentence 2's positions 1 and 2, V = 7 each
    M.transformer_batch_elements_are_independent(
        PaddedGarbage(), "float64", **args, tgt_lengths=np.array([3, 1]), index=1
    )

    class AlsoWrongInside(PaddedGarbage):
        def transformer_forward(self, *a, **k):  # type: ignore[no-untyped-def]
            out = super().transformer_forward(*a, **k)
            out[1, 0, 0] += 1e-3
            return out

    with pytest.raises(OverBudget):
        M.transformer_forward(AlsoWrongInside(), "float64", **args, tgt_lengths=np.array([3, 1]))


def test_elements_no_caller_defines_are_shown_but_do_not_make_a_row_inconclusive() -> None:
    """10% of a whole model's logits at padded target positions: counted as not checked, the row passes; the same
    10% for any other reason is inconclusive."""
    from aiayn.conformance.equations import PADDED_TARGET

    impl = NumpyImplementation()
    padded = [r | {"equation": "transformer_forward", "test": "test_transformer_forward"} for r in _results()]
    padded = [r | {"unchecked": {PADDED_TARGET: 10}} for r in padded]
    row = _row(report.build(_Entry(impl), padded, {}), "transformer_forward")
    assert row["status"] == "pass" and row["not_checked"] == 10 and row["fraction_checked"] == 0.9, row
    other = [r | {"unchecked": {"why": 10}} for r in padded]
    assert _row(report.build(_Entry(impl), other, {}), "transformer_forward")["status"] == "inconclusive"


def test_a_nan_in_an_equation_without_attention_names_no_attention_policy(stats: Stats) -> None:
    """A positional table with NaN (an engine's timescale 0/0 at d_model = 2): the message says where, and names
    no fully_masked policy (an attention's); a NaN in attention's output still names it."""
    from aiayn.conformance.checks import attention as A
    from aiayn.conformance.checks import positional as P

    class NaNTable(NumpyImplementation):
        def positional_encoding(self, length, d_model, dtype):  # type: ignore[no-untyped-def]
            return np.full((length, d_model), np.nan, dtype=np.dtype(dtype))

    with pytest.raises(NaNMismatch) as failure:
        P.positional_encoding(NaNTable(), "float64", length=3, d_model=2)
    assert "NaN at index (0, 0)" in str(failure.value) and "fully_masked" not in str(failure.value), failure.value

    class NaNAttention(NumpyImplementation):
        def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
            return np.full((*q.shape[:-1], v.shape[-1]), np.nan, dtype=q.dtype)

    q = np.ones((1, 2, 2))
    with pytest.raises(NaNMismatch) as failure:
        A.scaled_dot_product_attention(NaNAttention(), "float64", q=q, k=q, v=q, mask=None)
    assert "declared fully_masked policy" in str(failure.value), failure.value


def test_the_cotangent_at_padded_target_positions_is_zero(stats: Stats) -> None:
    """A whole model whose backward pass reads no cotangent at padded target positions (an incremental decoder never
    computes them) passes the gradient check: the suite's cotangent is 0 there, as a loss's is."""
    import types

    from aiayn.conformance.checks import model as M
    from aiayn.reference import model as RM

    class IgnoresPadded(PaddedGarbage):
        def vjp(self, equation, args, d_out):  # type: ignore[no-untyped-def]
            if equation == "transformer_forward" and args[5] is not None:
                d_out = d_out.copy()
                d_out[np.arange(d_out.shape[1])[None, :] >= args[5][:, None]] = 0.0
            return super().vjp(equation, args, d_out)

    cfg = types.SimpleNamespace(n_layers=1, d_model=4, d_ff=8, num_heads=2, d_k=2, d_v=2)
    params = RM.init_params(cfg, 7, np.random.default_rng(3), biases=True)
    src, tgt = np.array([[1, 2, 3], [4, 5, 6]]), np.array([[0, 1, 2], [2, 3, 4]])
    d_logits = np.random.default_rng(4).normal(size=(2, 3, 7))
    M.transformer_forward_gradients(
        IgnoresPadded(),
        "float64",
        d_out=d_logits,
        src=src,
        tgt=tgt,
        params=params,
        num_heads=2,
        src_lengths=np.array([3, 2]),
        tgt_lengths=np.array([3, 1]),
    )
    assert stats.checked > 0, stats


def test_the_report_says_where_the_time_went() -> None:
    """Each test's seconds by part are summed into its row, and the report breaks the run's time down: the
    implementation, the oracle and budgets, the diagnoses, the rest."""
    seconds = {"test": 4.0, "implementation": 1.5, "oracle": 1.0, "diagnosis": 0.5}
    results = _results(seconds=seconds) + _results(test="test_layer_norm_rows", seconds=seconds)
    data = report.build(_Entry(NumpyImplementation()), results, {})
    assert _row(data)["seconds"] == {"test": 8.0, "implementation": 3.0, "oracle": 2.0, "diagnosis": 1.0}
    lines = report._time_lines([report.Row.from_dict(r) for r in data["rows"]])
    assert (
        "- all rows: 8.0 s: implementation 3.0, oracle and budgets 2.0, diagnoses 1.0, "
        "the rest (Hypothesis, the harness) 2.0"
    ) in lines, lines
