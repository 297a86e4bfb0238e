"""The benchmark history of ``aiayn bench --history``: entries from runs, the JSON Lines file, the report.

Runs are small dicts shaped like pytest-benchmark JSON, built by hand (nothing is timed): each case
has a flop count, a ceiling and its rounds' times, chosen so that the per-round ratios, their median
and the change between runs are exact by hand.
"""

from __future__ import annotations

import json

import pytest

from aiayn.benchmarks import history
from aiayn.environment import UsageError

CEILING_GFLOPS = 100.0
FLOPS = 1e9  # one call: 1 GFLOP, so a round of t seconds at a 100 GFLOP/s ceiling is a ratio of 0.01 / t


def _case(case: str, ratios: list[float] | None, best: float, device: str = "cpu") -> dict:
    """One benchmark of the suite: ``ratios`` are its rounds' ratios (None: an older record without rounds)."""
    info = {
        "case": case,
        "device": device,
        "flops_full": FLOPS,
        "flops_useful": FLOPS,
        "ceiling_gflops": CEILING_GFLOPS,
        "ratio_full": best,
        "ratio_useful": best,
    }
    if ratios is not None:
        info["round_times_s"] = [FLOPS / (r * CEILING_GFLOPS * 1e9) for r in ratios]
    return {"name": f"test_attention[{case}]", "extra_info": info}


def _run(
    commit: str,
    when: str,
    cases: dict[str, list[float] | None],
    *,
    cpu: str = "AMD EPYC",
    numpy_build: str = "2.4.6 (openblas 0.3.29)",
    dirty: bool = False,
) -> dict:
    """A pytest-benchmark run of the attention cases ``{case id: per-round ratios}``."""
    return {
        "datetime": when,
        "version": "5.1.0",
        "commit_info": {"id": commit, "dirty": dirty, "branch": "main", "project": "main"},
        "aiayn": {"cpu_model": cpu, "threads": 1, "libraries": {"numpy": numpy_build}},
        "benchmarks": [_case(case, ratios, max(ratios) if ratios else 0.3) for case, ratios in cases.items()],
    }


A = "numpy-float32-n128-full"
B = "numpy-float32-n256-full"
FIRST = _run("a" * 40, "2026-11-01T10:00:00.000000+00:00", {A: [0.40, 0.55, 0.50, 0.60], B: [0.2, 0.3, 0.25]})
SECOND = _run("b" * 40, "2026-11-02T10:00:00.000000+00:00", {A: [0.45, 0.44, 0.46], B: [0.3]})


def test_record_takes_median_min_max_of_the_rounds():
    entry = history.record(FIRST)
    assert entry["datetime"] == FIRST["datetime"]
    assert entry["commit"] == "a" * 40
    assert entry["dirty"] is False
    assert entry["branch"] == "main"
    assert entry["environment"] == {
        "machine": "AMD EPYC",
        "device": "cpu",
        "threads": 1,
        "libraries": {"numpy": "2.4.6 (openblas 0.3.29)"},
    }
    a, b = entry["cases"][A], entry["cases"][B]
    assert a["median"] == pytest.approx(0.525)  # (0.50 + 0.55) / 2, an even count
    assert (a["min"], a["max"], a["rounds"]) == (pytest.approx(0.40), pytest.approx(0.60), 4)
    assert b["median"] == pytest.approx(0.25)
    assert (b["min"], b["max"], b["rounds"]) == (pytest.approx(0.2), pytest.approx(0.3), 3)
    json.dumps(entry, allow_nan=False)  # plain JSON


def test_record_of_an_older_run_without_rounds_keeps_its_one_figure():
    run = _run("c" * 40, "2026-10-01T00:00:00+00:00", {A: None})
    del run["commit_info"]
    entry = history.record(run)
    assert entry["cases"][A] == {"median": 0.3, "min": 0.3, "max": 0.3, "rounds": 1}
    assert (entry["commit"], entry["dirty"], entry["branch"]) == (None, None, None)


def test_record_of_a_run_without_timed_cases_is_a_usage_error():
    run = _run("c" * 40, "2026-10-01T00:00:00+00:00", {})
    with pytest.raises(UsageError, match="no timed attention case"):
        history.record(run)


def test_append_keeps_one_line_per_run_in_order(tmp_path):
    path = tmp_path / "sub" / "history.jsonl"
    first = history.append(path, FIRST)
    assert history.append(path, FIRST) == first  # the same run again: not duplicated
    history.append(path, SECOND)
    history.append(path, SECOND)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["commit"] for line in lines] == ["a" * 40, "b" * 40]
    assert [e["commit"] for e in history.load(path)] == ["a" * 40, "b" * 40]


def test_append_never_rewrites_earlier_lines(tmp_path):
    path = tmp_path / "history.jsonl"
    history.append(path, FIRST)
    before = path.read_bytes()
    history.append(path, SECOND)
    assert path.read_bytes().startswith(before)


def test_load_names_the_bad_line(tmp_path):
    path = tmp_path / "history.jsonl"
    history.append(path, FIRST)
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\n{not json\n")
    with pytest.raises(UsageError, match=r"history\.jsonl: line 3 is not JSON"):
        history.load(path)
    path.write_text(json.dumps({"datetime": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"line 1 is not a history entry"):
        history.load(path)


def test_load_missing_and_empty_files(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(UsageError, match=r"^--history: .*nowhere\.jsonl: no such file$"):
        history.load(missing)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert history.load(empty) == []
    with pytest.raises(UsageError, match="no run recorded yet"):
        history.write(empty, tmp_path / "out")


def test_write_gives_the_table_with_both_commits_and_the_change(tmp_path, capsys):
    path = tmp_path / "history.jsonl"
    history.append(path, FIRST)
    history.append(path, SECOND)
    paths = history.write(path, tmp_path / "out")
    assert [p.name for p in paths] == ["benchmarks-history.md", "benchmarks-history.json", "benchmarks-history.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert paths[2].read_bytes().startswith(b"\x89PNG")
    md = paths[0].read_text(encoding="utf-8")
    assert "2 runs from 2026-11-01T10:00:00.000000+00:00 to 2026-11-02T10:00:00.000000+00:00, 2 cases" in md
    assert "latest commit bbbbbbb" in md
    assert "| case | aaaaaaa 2026-11-01 | bbbbbbb 2026-11-02 | change |" in md
    assert f"| {A} | 0.525 | 0.450 | -14.3% |" in md  # 0.45 / 0.525 - 1
    assert f"| {B} | 0.250 | 0.300 | +20.0% |" in md
    assert "Warning" not in md
    data = json.loads(paths[1].read_text(encoding="utf-8"))
    assert [e["commit"] for e in data["entries"]] == ["a" * 40, "b" * 40]
    assert data["warning"] is None
    assert "2 runs from" in capsys.readouterr().out


def test_write_change_column_from_the_first_run_with_the_case(tmp_path):
    path = tmp_path / "history.jsonl"
    history.append(path, _run("1" * 40, "2026-11-01T00:00:00+00:00", {A: [0.5]}))
    history.append(path, _run("2" * 40, "2026-11-02T00:00:00+00:00", {A: [0.45], B: [0.2]}))
    md = history.write(path, tmp_path)[0].read_text(encoding="utf-8")
    assert f"| {A} | 0.500 | 0.450 | -10.0% |" in md
    assert f"| {B} | — | 0.200 | — |" in md  # only one run measured it: no change


def test_write_a_single_run(tmp_path):
    path = tmp_path / "history.jsonl"
    history.append(path, FIRST)
    paths = history.write(path, tmp_path / "out", stem="one")
    md = paths[0].read_text(encoding="utf-8")
    assert "1 run from" in md
    assert f"| {A} | 0.525 | — |" in md
    assert paths[2].name == "one.png" and paths[2].read_bytes().startswith(b"\x89PNG")


def test_mixed_environments_are_warned_about(tmp_path):
    path = tmp_path / "history.jsonl"
    history.append(path, FIRST)
    history.append(path, _run("c" * 40, "2026-11-03T00:00:00+00:00", {A: [0.5]}, cpu="Intel Xeon"))
    history.append(path, _run("d" * 40, "2026-11-04T00:00:00+00:00", {A: [0.5]}, numpy_build="2.3.0 (mkl)"))
    paths = history.write(path, tmp_path / "out")
    md = paths[0].read_text(encoding="utf-8")
    assert "**Warning:** the runs come from 3 environments" in md
    assert "not comparable" in md
    assert "- E2: machine Intel Xeon" in md
    data = json.loads(paths[1].read_text(encoding="utf-8"))
    assert data["environment_of_run"] == [0, 1, 2]
    assert paths[2].read_bytes().startswith(b"\x89PNG")


def test_many_cases_still_plot(tmp_path):
    cases = {f"numpy-float32-n{64 * (i + 1)}-full": [0.3 + 0.01 * i] for i in range(15)}
    path = tmp_path / "history.jsonl"
    history.append(path, _run("e" * 40, "2026-11-05T00:00:00+00:00", cases))
    history.append(path, _run("f" * 40, "2026-11-06T00:00:00+00:00", cases, dirty=True))
    paths = history.write(path, tmp_path / "out")
    md = paths[0].read_text(encoding="utf-8")
    assert "15 cases; latest commit fffffff+dirty" in md
    assert paths[2].read_bytes().startswith(b"\x89PNG")
