"""The noise measurement's parts that need no timing: the slowed copies' extra work and the rates' arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.benchmarks import noise, slowed


class _Counting:
    """An inner implementation that records the query rows of every call."""

    name = "counting"

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.vjp_rows: list[int] = []

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        assert mask is None or mask.shape[-2] == q.shape[-2], "the mask must be cut to the same query rows"
        self.rows.append(q.shape[-2])
        return q

    def vjp(self, equation, args, d_out):
        assert d_out.shape[-2] == args[0].shape[-2], "the cotangent must be cut to the same query rows"
        self.vjp_rows.append(args[0].shape[-2])
        return {"q": args[0]}


@pytest.mark.parametrize(("fraction", "extra_rows"), [(0.0, []), (0.05, [7]), (0.2, [26]), (1.0, [128])])
def test_slowed_repeats_the_call_on_that_fraction_of_the_rows(fraction, extra_rows):
    inner = _Counting()
    copy = slowed.SlowedVjp(inner, fraction)
    q = np.zeros((1, 2, 128, 4))
    mask = np.ones((128, 128), dtype=bool)
    assert copy.scaled_dot_product_attention(q, q, q, mask) is q  # the first call's result, untouched
    assert inner.rows == [128, *extra_rows]  # ceil(fraction * 128) more rows
    copy.vjp("scaled_dot_product_attention", [q, q, q, mask], q)
    assert inner.vjp_rows == [128, *extra_rows]
    assert copy.name == "counting"  # everything else is the inner implementation's


def test_slowed_without_a_vjp_leaves_autograd_to_the_caller():
    class NoVjp:
        name = "no-vjp"

        def scaled_dot_product_attention(self, q, k, v, mask=None):
            return q

    copy = slowed.Slowed(NoVjp(), 0.1)
    assert not hasattr(copy, "vjp")


@pytest.mark.parametrize("text", ["x", "-0.1", "1.5"])
def test_extra_work_names_the_variable(monkeypatch, text):
    monkeypatch.setenv(slowed.EXTRA_WORK_VAR, text)
    with pytest.raises(ValueError, match=slowed.EXTRA_WORK_VAR):
        slowed.extra_work()


def test_summarise_counts_flagged_runs_per_kind():
    def run(extra, status, change, load):
        verdicts = [{"change": change, "regressed": status == 1}, {"change": change / 2, "regressed": False}]
        return {"extra": extra, "exit": status, "loadavg_before": [load, 0, 0], "verdicts": verdicts}

    measured = {
        "settings": {"slowdowns": [0.2]},
        "runs": [run(0.0, 0, 0.01, 1.0), run(0.0, 1, -0.12, 2.5), run(0.2, 1, -0.17, 1.5), run(0.2, 1, -0.16, 0.5)],
    }
    unchanged, slow = noise.summarise(measured)
    assert (unchanged["runs"], unchanged["flagged"], unchanged["rate"]) == (2, 1, 0.5)
    assert unchanged["case_rate"] == 0.25 and unchanged["load_range"] == [1.0, 2.5]
    assert (slow["flagged"], slow["rate"], slow["case_rate"]) == (2, 1.0, 0.5)
    assert slow["median_change"] == pytest.approx(np.median([-0.17, -0.085, -0.16, -0.08]))
