"""The duet (``aiayn bench NEW --against OLD``): its verdict on simulated rounds, its protocol, its refusals.

The verdict logic is tested on simulated ratios (no timing is asserted anywhere): the sign-test bound against the
binomial law computed by brute force, the blocks cancelling the advantage of going first, a slow case flagged and a
steady one not, the level shared among the cases. The duet itself runs for real on a tiny case (two processes, a few
rounds) only to check what it records and refuses, never how fast anything was.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from aiayn.benchmarks import duet
from aiayn.benchmarks import verdict as V
from aiayn.benchmarks.cases import Case
from aiayn.cli import main


def _binomial_cdf_by_enumeration(m: int, j: int) -> float:
    """P(Binomial(m, 1/2) <= j) by counting the 2^m outcomes."""
    return sum(sum(o) <= j for o in itertools.product((0, 1), repeat=m)) / 2**m


@pytest.mark.parametrize("m", [1, 4, 7, 10, 13])
@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.00125])
def test_the_sign_bound_rank_is_the_largest_with_its_level(m: int, alpha: float) -> None:
    k = V.sign_bound_rank(m, alpha)
    if k is None:
        assert 2.0**-m > alpha
        return
    assert _binomial_cdf_by_enumeration(m, k - 1) <= alpha < _binomial_cdf_by_enumeration(m, k)


def test_the_sign_bound_covers_the_median_as_often_as_it_says() -> None:
    """Draws of a known median: the bound lies above it in at most alpha of the trials (plus sampling error)."""
    rng = np.random.default_rng(3)
    m, alpha, trials = 20, 0.05, 4000
    k = V.sign_bound_rank(m, alpha)
    draws = np.sort(rng.lognormal(0.0, 0.05, size=(trials, m)), axis=1)
    above = float(np.mean(draws[:, k - 1] > 1.0))
    assert above <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials), (above, k)


def test_blocks_cancel_the_advantage_of_going_first() -> None:
    """Equal code with the first call of each round 8% faster: rounds alternate 0.926, 1.08; every block is 1."""
    ratios = [1 / 1.08 if r % 2 == 0 else 1.08 for r in range(40)]
    assert all(math.isclose(b, 1.0) for b in V.duet_blocks(ratios))
    v = V.duet_case("c", ratios, V.DEFAULT_MARGIN, 0.01)
    assert not v.regressed and math.isclose(v.ratio, 1.0)


def _rounds(rng: np.random.Generator, slowdown: float, spread: float = 0.03, n: int = 40) -> list[float]:
    return list((1 + slowdown) * rng.lognormal(0.0, spread, size=n))


def test_a_slow_case_is_flagged_and_a_steady_one_is_not() -> None:
    rng = np.random.default_rng(11)
    steady = [V.duet_case("c", _rounds(rng, 0.0), 0.02, 0.01 / 8) for _ in range(200)]
    slow = [V.duet_case("c", _rounds(rng, 0.08), 0.02, 0.01 / 8) for _ in range(200)]
    assert sum(v.regressed for v in steady) == 0
    assert sum(v.regressed for v in slow) >= 190, sum(v.regressed for v in slow)
    assert "beyond the margin 1.020" in next(v for v in slow if v.regressed).reason


def test_too_few_rounds_are_undecided_never_a_pass_of_a_slow_case() -> None:
    v = V.duet_case("c", [1.5] * 8, 0.02, 0.01)  # 4 blocks: even the smallest is no bound at 0.01
    assert v.undecided and not v.regressed and "too few" in v.reason


def test_the_level_is_shared_among_the_cases() -> None:
    """Of 16 cases, each is judged at 0.01 / 16: a bound that 8 blocks reach alone is not reached by each of many."""
    ratios = [1.1] * 16  # 8 blocks, all slow: the smallest block bounds the median at 2^-8 = 0.0039
    assert V.duet_compare({"a": ratios}, 0.02)[0].regressed  # 0.0039 <= 0.01
    many = V.duet_compare({f"c{i}": ratios for i in range(16)}, 0.02)
    assert all(v.undecided for v in many)  # 0.0039 > 0.01 / 16


@pytest.mark.parametrize(
    ("ratios", "match"),
    [
        ([], "at least one round"),
        ([1.0], "at least 2 rounds"),
        ([1.0, -1.0], "positive time ratios"),
        ([1.0, float("nan")], "ratios"),
    ],
)
def test_bad_ratios_are_named(ratios: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        V.duet_case("c", ratios, 0.02, 0.01)


def test_a_duet_records_both_sides_rounds_on_one_cpu() -> None:
    """Two processes of one spec, a tiny forward and forward+backward case: every round of both sides recorded, the
    ratios new / old, the gradient source, the ceilings before and after (their values are not judged)."""
    cases = [Case("numpy", "float64", 16, False), Case("numpy", "float64", 16, True, "forward+backward")]
    run = duet.run(duet.Side("numpy", "new"), duet.Side("numpy", "old"), cases, rounds=4, gemm_n=64)
    assert [c["case"] for c in run["cases"]] == ["float64-n16-full", "float64-n16-causal-forward+backward"]
    for c in run["cases"]:
        assert len(c["new_times_s"]) == len(c["old_times_s"]) == len(c["ratios"]) == 4
        assert all(math.isclose(r, a / b) for r, a, b in zip(c["ratios"], c["new_times_s"], c["old_times_s"]))
    assert run["cases"][1]["gradient_sources"] == ["numpy.vjp", "numpy.vjp"]
    assert [(c["library"], c["dtype"]) for c in run["ceilings"]] == [("numpy", "float64")]


def test_a_side_that_cannot_load_stops_the_duet_with_its_words() -> None:
    with pytest.raises(RuntimeError, match="no_such_module"):
        duet.run(duet.Side("numpy", "new"), duet.Side("no_such_module:Impl", "old"), [Case("x", "float64", 8, False)])


def test_the_cli_duet_writes_its_report(tmp_path: Path) -> None:
    argv = ["bench", "numpy", "--against", "numpy", "--sizes", "16", "--dtypes", "float64", "--passes", "forward"]
    status = main([*argv, "--no-causal", "--rounds", "4", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "duet-numpy.json").read_text(encoding="utf-8"))
    assert [v["case"] for v in data["verdicts"]] == ["numpy float64-n16-full"]
    # 2 blocks are too few for the level whatever the times: undecided, so no regression and exit 0 (no timing read)
    assert data["verdicts"][0]["undecided"] and not data["verdicts"][0]["regressed"] and status == 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--against", "numpy", "--against-rev", "HEAD"], "one old side"),
        (["--against", "numpy", "--save", "x.json"], "--save: a duet decides on its own rounds"),
        (["--rounds", "10"], "--rounds: the rounds of a duet"),
        (["--against", "numpy", "--rounds", "3"], "at least 4 paired rounds"),
        (["--against-rev", "no-such-revision-anywhere"], "no commit"),
    ],
)
def test_a_duet_refuses_what_it_cannot_do_in_one_line(
    extra: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    status = main(["bench", "numpy", "--sizes", "16", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert status == 4 and fragment in err and len(err.strip().splitlines()) == 1, (status, err)


@pytest.mark.slow
def test_against_a_revision_loads_the_old_side_from_its_own_install(tmp_path: Path, monkeypatch) -> None:
    """--against-rev HEAD: this checkout's HEAD installed (pip, no dependencies) into the cache, the old side's
    implementation loaded from there even when run at the checkout's root, the new side's from here."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: no revision to install")
    monkeypatch.chdir(root)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    argv = ["bench", "numpy", "--against-rev", "HEAD", "--sizes", "16", "--dtypes", "float64", "--passes", "forward"]
    assert main([*argv, "--no-causal", "--rounds", "4", "--out", str(tmp_path / "out")]) == 0  # 2 blocks: undecided
    run = json.loads((tmp_path / "out" / "duet-numpy.json").read_text(encoding="utf-8"))["runs"][0]
    assert run["old"]["file"].startswith(str(tmp_path / "cache" / "duet")), run["old"]
    assert run["new"]["file"].startswith(str(root)) and not run["new"]["file"].startswith(str(tmp_path)), run["new"]
