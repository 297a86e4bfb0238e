"""The noise measurement's parts that need no timing: the slowed copies' extra work and the rates' arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aiayn.benchmarks import noise, slowed, verdict


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


#: Eight unchanged runs' changes of two cases: "a" calm (+-1%), "b" noisy (+-10%).
EIGHT_UNCHANGED = [
    (0.01, 0.1),
    (-0.01, -0.1),
    (0.0, 0.05),
    (0.01, -0.05),
    (-0.01, 0.0),
    (0.0, 0.1),
    (0.0, -0.1),
    (0.01, 0.0),
]


def _measured(changes_by_kind, cases=("a", "b")):
    """Stored runs: for each kind (extra work), one run per list of changes, case by case; repeats count up."""
    runs = []
    for extra, per_run in changes_by_kind.items():
        for repeat, changes in enumerate(per_run):
            verdicts = [{"case": c, "change": x, "regressed": x < -0.2} for c, x in zip(cases, changes)]
            runs.append(
                {
                    "repeat": repeat,
                    "extra": extra,
                    "exit": int(any(x < -0.2 for x in changes)),
                    "loadavg_before": [1.0, 1.0, 1.0],
                    "verdicts": verdicts,
                }
            )
    return {"settings": {"slowdowns": [k for k in changes_by_kind if k]}, "runs": runs}


def test_cross_validated_judges_each_run_by_the_other_fold():
    # The slowed runs drop both cases by 30%.
    unchanged = EIGHT_UNCHANGED
    slowed_runs = [(-0.3, -0.3)] * 8
    cv = noise.cross_validated(_measured({0.0: unchanged, 0.2: slowed_runs}))
    unchanged_row, slowed_row = cv["rows"]
    assert (unchanged_row["runs"], unchanged_row["flagged"]) == (8, 0)
    assert (slowed_row["runs"], slowed_row["flagged"], slowed_row["rate"]) == (8, 8, 1.0)
    even = [c for i, c in enumerate(unchanged) if i % 2 == 0]  # fold 1 learns from the even repeats
    assert [b["training_runs"] for b in cv["bounds"]] == [4, 4]
    expected = verdict.run_level_bound([c[0] for c in even], cases=2)
    assert cv["bounds"][1]["bounds"]["a"] == pytest.approx(expected)
    assert cv["bounds"][1]["bounds"]["b"] < cv["bounds"][1]["bounds"]["a"]  # the noisy case gets the lower bound


def test_cross_validated_flags_a_run_below_a_calm_cases_bound():
    unchanged = [*EIGHT_UNCHANGED[:6], (-0.3, 0.0), EIGHT_UNCHANGED[7]]
    row = noise.cross_validated(_measured({0.0: unchanged}))["rows"][0]
    assert row["flagged"] == 1  # the seventh run's case "a" fell 30%


def test_cross_validated_needs_three_runs_outside_each_fold():
    assert noise.cross_validated(_measured({0.0: [(0.0, 0.0)] * 5})) is None


def test_spread_by_case_sets_rounds_beside_runs():
    measured = _measured({0.0: [(0.0, 0.1), (0.0, -0.1), (0.0, 0.0), (0.0, -0.3)]})
    measured["baseline_samples"] = {"a": [1.0, 1.0, 1.0], "b": [1.0, 2.0, 4.0]}
    a, b = noise.spread_by_case(measured)
    assert (a["case"], a["rounds"], a["within_run_spread"], a["between_run_spread"]) == ("a", 3, 0.0, 0.0)
    assert b["within_run_spread"] == pytest.approx(1.4826 * np.log(2.0))  # logs 0, log 2, log 4: MAD log 2
    assert (b["runs"], b["flagged"]) == (4, 1)


def _report(monkeypatch, tmp_path, unchanged, slowed_runs):
    """``aiayn bench-noise``'s report written from these stored runs (no timing): its Markdown and its JSON."""
    measured = _measured({0.0: unchanged, 0.2: slowed_runs})
    measured["settings"].update(spec=noise.DEFAULT_SPEC, repeats=len(unchanged), **noise.DEFAULT_CASES)
    measured["baseline"] = {"cpu_model": "test CPU", "cpu_count": 2}
    measured["baseline_samples"] = {"a": [1.0, 1.1, 0.9], "b": [1.0, 1.2, 0.8]}
    monkeypatch.setattr(noise, "measure", lambda settings, work: measured)
    args = noise.argparse.Namespace(
        out=str(tmp_path),
        force=True,
        repeats=len(unchanged),
        slowdowns="0.2",
        spec=noise.DEFAULT_SPEC,
        work=tmp_path / "w",
        duet=False,
        rounds=None,
        causal=None,
        **noise.DEFAULT_CASES,
    )
    assert noise.run(args) == 0
    text = (tmp_path / "benchmarks-noise.md").read_text(encoding="utf-8")
    return text, json.loads((tmp_path / "benchmarks-noise.json").read_text(encoding="utf-8"))


def test_report_states_both_gates_rates(monkeypatch, tmp_path):
    unchanged = [(0.01, 0.1), (-0.01, -0.1), (0.0, 0.05), (0.01, -0.25), (-0.01, 0.0), (0.0, 0.1)]
    text, data = _report(monkeypatch, tmp_path, unchanged, [(-0.3, -0.3)] * 6)
    assert "1 of 6 runs of the unchanged code flagged" in text  # the asv rule: the run with "b" at -25%
    assert "A gate with the run as its unit" in text and "Where the false regressions come from" in text
    assert data["run_level_gate"]["rows"][1]["rate"] == 1.0
    assert [r["case"] for r in data["spread_by_case"]] == ["a", "b"]
    assert data["run_level_gate_small"] is None  # 3 runs per fold: no K = 5 column


def test_cross_validated_with_k_learns_from_the_first_k_runs_of_the_other_fold():
    unchanged = EIGHT_UNCHANGED
    cv = noise.cross_validated(_measured({0.0: unchanged}), k=3)
    assert [b["training_runs"] for b in cv["bounds"]] == [3, 3] and cv["k"] == 3
    assert cv["bounds"][1]["bounds"]["a"] == pytest.approx(verdict.run_level_bound([0.01, 0.0, -0.01], cases=2))
    assert noise.cross_validated(_measured({0.0: unchanged}), k=5) is None  # 4 runs per fold


def test_report_with_a_small_baseline_column(monkeypatch, tmp_path):
    unchanged = [(0.01 * (i % 3 - 1), 0.02 * (i % 5 - 2)) for i in range(12)]
    text, data = _report(monkeypatch, tmp_path, unchanged, [(-0.3, -0.3)] * 12)
    assert f"K = 6 runs | K = {noise.SMALL_K} runs" in text
    assert data["run_level_gate_small"]["k"] == noise.SMALL_K


def test_the_duets_report_states_its_rates(monkeypatch, tmp_path):
    """Simulated duets (no timing): 1 of 4 unchanged duets flagged, 4 of 4 at 5% more work."""

    def duets(settings, work):
        out = []
        for repeat in range(4):
            for extra, flagged in ((0.0, repeat == 2), (0.05, True)):
                ratio = 1.0 + extra
                out.append(
                    {
                        "repeat": repeat,
                        "extra": extra,
                        "flagged": flagged,
                        "loadavg_before": [0.5, 0.5, 0.5],
                        "seconds": 30.0,
                        "verdicts": [{"case": "a", "ratio": ratio, "lower": ratio - 0.01, "regressed": flagged}],
                        "ratios": {"a": [ratio] * 4},
                    }
                )
        return out

    monkeypatch.setattr(noise, "duet_measure", duets)
    args = noise.argparse.Namespace(
        out=str(tmp_path),
        force=True,
        repeats=4,
        slowdowns="0.05",
        spec=noise.DEFAULT_SPEC,
        work=tmp_path / "w",
        duet=True,
        rounds=40,
        causal=False,
        **noise.DEFAULT_CASES,
    )
    assert noise.run(args) == 0
    text = (tmp_path / "benchmarks-noise-duet.md").read_text(encoding="utf-8")
    assert "1 of 4 duets of the unchanged code flagged a regression" in text, text
    assert "detection 100% at 5% more work" in text and "smallest slowdown detected in >= 95% of duets here: 5%" in text
