"""``aiayn bench`` loses nothing and shows no traceback on bad input: exit 4 (pytest's usage error), one line on stderr
naming the file, option or field and what was expected.

- ``--save FILE`` keeps a stored run of more cases (the report writer's scope rule, :func:`aiayn.kit.smaller`), or a
  file that is no run of aiayn bench, unless ``--force``;
- a baseline that shares no case with the run (another implementation, other sizes) compared nothing: exit 4;
- two spec lists that share a report name (``a:b`` and ``a-b``; two classes that both say ``name = "numpy"``) never
  write one report, and a SPEC given twice is refused;
- every JSON aiayn bench reads (``--baseline``, ``--from-run``, ``--history``) is checked field by field;
- a ``--save`` folder that is missing or not writable, a SPEC without Eq. (1), sizes beyond this machine's memory,
  names longer than the system takes, and a deleted working directory are one line each.

Runs are built by hand (nothing is timed) and given as ``--from-run`` or ``--baseline``; only
``test_two_classes_named_numpy_measured_write_two_reports`` measures (one case each, n = 16).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from aiayn.benchmarks import runfile
from aiayn.benchmarks.cases import Case
from aiayn.benchmarks.report import spec_stem
from aiayn.cli import main

CEILING_GFLOPS = 50.0


def _entry(impl: str, dtype: str, n: int, causal: bool, pass_: str = "forward") -> dict[str, Any]:
    """One timed attention case as aiayn bench records it: ten rounds at 0.50 to 0.59 of the ceiling."""
    case = Case(impl, dtype, n, causal, pass_)
    times = [case.flops_full / ((0.5 + 0.01 * i) * CEILING_GFLOPS * 1e9) for i in range(10)]
    best = min(times)
    full = case.flops_full / best / 1e9
    useful = full * case.flops_useful / case.flops_full
    info = {
        "case": case.id,
        "impl": impl,
        "library": "numpy",
        "device": "cpu",
        "dtype": dtype,
        "n": n,
        "causal": causal,
        "pass_": pass_,
        "flops_full": case.flops_full,
        "flops_useful": case.flops_useful,
        "score_bytes": case.score_bytes,
        "peak_bytes": case.score_bytes,
        "time_min_s": best,
        "time_median_s": sorted(times)[5],
        "gflops_full": full,
        "gflops_useful": useful,
        "ceiling_gflops": CEILING_GFLOPS,
        "ratio_full": full / CEILING_GFLOPS,
        "ratio_useful": useful / CEILING_GFLOPS,
        "round_times_s": times,
    }
    return {"name": f"test_attention[{case.id}]", "extra_info": info}


def _run(*impls: str, sizes: tuple[int, ...] = (64,), causal: tuple[bool, ...] = (False,), when: str = "1") -> dict:
    """A stored run of aiayn bench: every impl x size x mask, float64 forward."""
    return {
        "datetime": f"2026-01-0{when}T00:00:00+00:00",
        "version": "5.1.0",
        "commit_info": {"id": "a" * 40, "dirty": False, "branch": "main"},
        "aiayn": {
            "cpu_model": "a test CPU",
            "threads": 1,
            "smoke": False,
            "libraries": {"numpy": "2.0 (a test build)"},
            "implementations": {impl: {"version": "1.0", "device": "cpu"} for impl in impls},
            "ceilings_best": [{"library": "numpy", "dtype": "float64", "device": "cpu", "gflops": CEILING_GFLOPS}],
            "loadavg_start": [0.1, 0.2, 0.3],
        },
        "benchmarks": [_entry(i, "float64", n, c) for i in impls for n in sizes for c in causal],
    }


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _refused(status: int, capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """The one error line of a refusal (exit 4, no traceback) that holds every fragment."""
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    assert status == 4, f"exit {status}, expected 4:\n{out[-2000:]}\n{err[-2000:]}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    for fragment in fragments:
        assert fragment in lines[0], f"the line does not say {fragment!r}:\n{lines[0]}"
    return lines[0]


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))


# --- 1. --save keeps a stored run of larger scope -------------------------------------------------------------------


def test_save_keeps_a_baseline_of_more_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _write(tmp_path / "base.json", _run("numpy", sizes=(64, 128), causal=(False, True)))
    before = base.read_bytes()
    small = _write(tmp_path / "small.json", _run("numpy", when="2"))
    status = main(["bench", "--from-run", str(small), "--out", str(tmp_path / "out"), "--save", str(base)])
    _refused(status, capsys, "--save: ", "base.json holds 4 cases, this run 1: not replaced (--force to replace)")
    assert base.read_bytes() == before
    assert not (tmp_path / "out" / "bench-numpy.md").exists(), "a refused --from-run wrote its report"
    argv = ["bench", "--from-run", str(small), "--out", str(tmp_path / "out"), "--save", str(base), "--force"]
    assert main(argv) == 0
    assert json.loads(base.read_text(encoding="utf-8")) == json.loads(small.read_text(encoding="utf-8"))


def test_save_replaces_a_baseline_of_as_many_cases(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.json", _run("numpy", sizes=(64,), causal=(False, True)))
    other = _write(tmp_path / "other.json", _run("numpy", sizes=(128,), causal=(False, True), when="2"))
    assert main(["bench", "--from-run", str(other), "--out", str(tmp_path / "out"), "--save", str(base)]) == 0
    assert base.read_bytes() == other.read_bytes()


def test_save_keeps_a_file_that_is_no_stored_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text("my notes, not a run\n", encoding="utf-8")
    run = _write(tmp_path / "run.json", _run("numpy"))
    status = main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out"), "--save", str(notes)])
    _refused(status, capsys, "notes.json is not a stored run of aiayn bench", "not replaced (--force to replace)")
    assert notes.read_text(encoding="utf-8") == "my notes, not a run\n"


def test_save_refuses_a_smaller_run_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The planned cases already number fewer than the stored run's: refused before pytest starts."""
    base = _write(tmp_path / "base.json", _run("numpy", sizes=(64, 128), causal=(False, True)))
    argv = ["bench", "numpy", "--sizes", "64", "--dtypes", "float64", "--passes", "forward", "--no-causal"]
    status = main([*argv, "--out", str(tmp_path / "out"), "--save", str(base)])
    _refused(status, capsys, "base.json holds 4 cases, this run 1: not replaced")
    assert not (tmp_path / "out" / "tmp").exists(), "the run was measured"


def test_save_and_the_report_share_one_scope_rule(tmp_path: Path) -> None:
    """The report's stored scope is the run's scope that --save compares (one rule, aiayn.kit.smaller)."""
    run = _write(tmp_path / "run.json", _run("numpy", sizes=(64, 128)))
    assert main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "bench-numpy.json").read_text(encoding="utf-8"))
    assert report["scope"] == asdict(runfile.run_scope(runfile.load_run(run, "--from-run")))
    assert report["scope"]["size"] == 2


# --- 2. a baseline that shares no case compared nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    ("baseline", "holds"),
    [
        (_run("mypkg.attn:Other"), "it holds 1 case of mypkg.attn:Other"),
        (_run("numpy", sizes=(256, 512)), "the baseline holds 2 cases of numpy (float64; n = 256, 512)"),
    ],
    ids=["another-implementation", "other-sizes"],
)
def test_a_baseline_sharing_no_case_compared_nothing(
    baseline: dict, holds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _write(tmp_path / "base.json", baseline)
    run = _write(tmp_path / "run.json", _run("numpy", when="2"))
    status = main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out"), "--baseline", str(base)])
    line = _refused(status, capsys, "--baseline: ", "base.json", "compared nothing", "1 case of numpy")
    assert holds.split("holds ")[1] in line, line


def test_a_baseline_from_another_host_is_not_comparable_and_one_from_this_host_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two VMs of one kind (same CPU model, builds, threads) differ by the host identity: exit 4, never "regressed";
    the same host compares (a halved run regressed, exit 1); --reference shows the other host's run, exit 0."""
    base, run = _run("numpy"), _run("numpy", when="2")
    base["aiayn"]["host"], run["aiayn"]["host"] = "a" * 16, "b" * 16
    for entry in run["benchmarks"]:  # every round twice as slow: a regression if the two runs may be compared
        info = entry["extra_info"]
        info["round_times_s"] = [2 * t for t in info["round_times_s"]]
        info["time_min_s"], info["time_median_s"] = 2 * info["time_min_s"], 2 * info["time_median_s"]
        info["ratio_full"], info["ratio_useful"] = info["ratio_full"] / 2, info["ratio_useful"] / 2
        info["gflops_full"], info["gflops_useful"] = info["gflops_full"] / 2, info["gflops_useful"] / 2
    base_path, run_path = _write(tmp_path / "base.json", base), _write(tmp_path / "run.json", run)
    argv = ["bench", "--from-run", str(run_path), "--out", str(tmp_path / "out")]
    status = main([*argv, "--baseline", str(base_path)])
    _refused(status, capsys, "base.json", "baseline from another host", "'aaaaaaaaaaaaaaaa' vs 'bbbbbbbbbbbbbbbb'")
    status = main([*argv, "--reference", str(base_path)])
    out, err = capsys.readouterr()
    assert status == 0 and not err.strip(), (status, err)
    assert "no verdict: not comparable (baseline from another host" in out and "-50.0%" in out, out
    report = (tmp_path / "out" / "bench-numpy.md").read_text(encoding="utf-8")
    assert "## Beside a stored run (reference only, no verdict)" in report and "-50.0%" in report, report
    base["aiayn"]["host"] = "b" * 16
    status = main([*argv, "--baseline", str(_write(tmp_path / "same-host.json", base)), "--force"])
    out, _ = capsys.readouterr()
    assert status == 1 and "REGRESSED" in out, out
    status = main([*argv, "--reference", str(base_path), "--baseline", str(base_path)])
    _refused(status, capsys, "--reference", "give no --baseline")


def test_one_of_several_baselines_sharing_no_case_compared_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [str(_write(tmp_path / f"base-{i}.json", _run("numpy", when=str(i + 3)))) for i in range(2)]
    files.append(str(_write(tmp_path / "base-other.json", _run("mypkg.attn:Other", when="5"))))
    run = _write(tmp_path / "run.json", _run("numpy", when="2"))
    status = main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out"), "--baseline", *files])
    _refused(status, capsys, "compared nothing: baseline run 3 holds 1 case of mypkg.attn:Other")


def test_a_baseline_of_another_implementation_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _write(tmp_path / "base.json", _run("mypkg.attn:Other"))
    argv = ["bench", "numpy", "--sizes", "64", "--dtypes", "float64", "--passes", "forward", "--no-causal"]
    status = main([*argv, "--out", str(tmp_path / "out"), "--baseline", str(base)])
    _refused(status, capsys, "base.json: compared nothing", "this run would time 1 case of numpy")
    assert not (tmp_path / "out" / "tmp").exists(), "the run was measured"


# --- 3. two spec lists never write one report ---------------------------------------------------------------------


NAMED_NUMPY = """
import numpy as np

from aiayn.implementations.examples.my_attention import MyAttention


class Impl(MyAttention):
    name = "numpy"  # the same name as the built-in and as the other module's class
"""


def test_two_classes_named_numpy_write_two_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for module in ("first_attn", "second_attn"):
        run = _write(tmp_path / f"{module}.json", _run(f"{module}:Impl"))
        assert main(["bench", "--from-run", str(run), "--out", str(out)]) == 0
    for module in ("first_attn", "second_attn"):
        report = json.loads((out / f"{spec_stem([f'{module}:Impl'])}.json").read_text(encoding="utf-8"))
        assert {c["impl"] for c in report["cases"]} == {f"{module}:Impl"}


@pytest.mark.parametrize(
    ("first", "second"),
    [("mypkg.attn:Impl", "mypkg.attn-Impl"), ("x" * 130 + ":A", "x" * 130 + ":B")],
    ids=["colon-and-dash", "long-specs-one-beginning"],
)
def test_specs_with_one_report_name_are_keyed_apart(first: str, second: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for spec in (first, second):
        run = _write(tmp_path / "run.json", _run(spec))
        assert main(["bench", "--from-run", str(run), "--out", str(out)]) == 0
    reports = sorted(out.glob("bench-*.json"))
    assert len(reports) == 2, reports
    impls = {frozenset(c["impl"] for c in json.loads(p.read_text(encoding="utf-8"))["cases"]) for p in reports}
    assert impls == {frozenset({first}), frozenset({second})}
    run = _write(tmp_path / "run.json", _run(first, when="3"))  # the first list again: its own report, not the other
    assert main(["bench", "--from-run", str(run), "--out", str(out)]) == 0
    assert len(sorted(out.glob("bench-*.json"))) == 2


def test_a_spec_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    _refused(main(["bench", "numpy", "numpy", "--sizes", "64"]), capsys, "SPEC: 'numpy' given twice")


def test_two_classes_named_numpy_measured_write_two_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Measured (one case each, n = 16, two rounds): each spec's cases under its own id, in one report."""
    for module in ("first_attn", "second_attn"):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(NAMED_NUMPY), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    argv = ["bench", "first_attn:Impl", "second_attn:Impl", "--sizes", "16", "--dtypes", "float64"]
    argv += ["--passes", "forward", "--no-causal", "--out", str(tmp_path / "out"), "--save", str(tmp_path / "b.json")]
    argv += ["--", "-q", "--bench-gemm-n=64", "--bench-budget=0", "--bench-min-rounds=2", "--bench-max-rounds=2"]
    status = main(argv)
    out, err = capfd.readouterr()
    assert status == 0, out[-3000:] + err[-3000:]
    stem = spec_stem(["first_attn:Impl", "second_attn:Impl"])
    report = json.loads((tmp_path / "out" / f"{stem}.json").read_text(encoding="utf-8"))
    assert sorted(c["case"] for c in report["cases"]) == [
        "first_attn:Impl-float64-n16-full",
        "second_attn:Impl-float64-n16-full",
    ]
    assert len(runfile.timed_cases(runfile.load_run(tmp_path / "b.json", "--save"))) == 2


FLOAT64_ONLY = """
from aiayn.implementations.examples.my_attention import MyAttention


class Impl(MyAttention):
    dtypes = ("float64",)
"""


def test_save_keeps_a_baseline_of_more_cases_than_the_run_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two cases planned (so not refused before measuring), one measured (the other's dtype is not declared): the
    stored run of two cases is kept, the report is written, the run stays in the reports' tmp folder, exit 4."""
    (tmp_path / "float64_only.py").write_text(textwrap.dedent(FLOAT64_ONLY), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    base = _write(tmp_path / "base.json", _run("float64_only:Impl", sizes=(16,), causal=(False, True)))
    before = base.read_bytes()
    argv = ["bench", "float64_only:Impl", "--sizes", "16", "--dtypes", "float32,float64", "--passes", "forward"]
    argv += ["--no-causal", "--out", str(tmp_path / "out"), "--save", str(base), "--", "-q"]
    monkeypatch.setenv("PYTEST_ADDOPTS", "--bench-gemm-n=64 --bench-budget=0 --bench-min-rounds=2")
    status = main(argv)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    assert status == 4, out[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("aiayn bench")]
    assert len(lines) == 1 and "base.json holds 2 cases, this run 1: not replaced (--force to replace)" in lines[0]
    stem = spec_stem(["float64_only:Impl"])
    assert f"; this run stays in {tmp_path / 'out' / 'tmp' / stem}-run.json" in lines[0], lines[0]
    assert base.read_bytes() == before
    assert (tmp_path / "out" / f"{stem}.md").exists()


# --- 4. every JSON aiayn bench reads, checked field by field ------------------------------------------------------


def _set(path: str, value: Any) -> Any:
    """A change to a stored run: ``path`` (dotted, list indices as numbers) set to ``value``; ``...``: removed."""

    def change(run: dict) -> dict:
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        holder = run
        for key in keys[:-1]:
            holder = holder[key]
        if value is ...:
            del holder[keys[-1]]
        else:
            holder[keys[-1]] = value
        return run

    return change


INFO = "benchmarks.0.extra_info"
#: (id, the change, the text of the file instead (bytes) or None, what the one line must say)
RUN_ROWS: list[tuple[str, Any, bytes | None, str]] = [
    ("a-list-not-an-object", None, b"[1, 2]", "is not a pytest-benchmark JSON (no 'benchmarks' list)"),
    ("benchmarks-an-object", _set("benchmarks", {}), None, "is not a pytest-benchmark JSON"),
    ("entry-a-string", _set("benchmarks.0", "x"), None, "benchmarks[0] is not a pytest-benchmark entry"),
    ("extra-info-a-list", _set(f"{INFO}", []), None, "benchmarks[0].extra_info: expected an object, got a list"),
    ("entry-without-name", _set("benchmarks.0.name", ...), None, "benchmarks[0].name: missing (expected a string)"),
    ("ratio-a-string", _set(f"{INFO}.ratio_full", "0.5"), None, "extra_info.ratio_full: expected a number"),
    ("round-time-negative", _set(f"{INFO}.round_times_s.2", -1.0), None, "round_times_s[2]: expected a number"),
    ("round-time-zero", _set(f"{INFO}.round_times_s.0", 0), None, "round_times_s[0]: expected a number"),
    ("round-times-an-object", _set(f"{INFO}.round_times_s", {}), None, "round_times_s: expected a list"),
    ("round-time-nan", None, b"NaN-round", "round_times_s[1]: expected a finite number, got NaN"),
    ("unknown-field-infinity", None, b"Infinity-extra", "extra_info.note: expected a finite number, got Infinity"),
    ("ceiling-huge", _set(f"{INFO}.ceiling_gflops", 1e308), None, "ceiling_gflops: expected a number"),
    ("ceiling-zero", _set(f"{INFO}.ceiling_gflops", 0), None, "ceiling_gflops: expected a number"),
    ("flops-huge-integer", _set(f"{INFO}.flops_full", 10**40), None, "flops_full: expected a number"),
    ("integer-of-5000-digits", None, b"huge-int", "is not JSON that can be read (Exceeds the limit"),
    ("nested-too-deeply", None, b"[" * 100000 + b"]" * 100000, "is not JSON that can be read (nested too deeply)"),
    ("not-utf-8", None, b'{"benchmarks": ["\xff\xfe"]}', "is not JSON (not UTF-8 text: byte 17)"),
    ("empty-file", None, b"", "is not JSON (Expecting value"),
    ("impl-missing", _set(f"{INFO}.impl", ...), None, "extra_info.impl: missing (expected a string)"),
    ("n-zero", _set(f"{INFO}.n", 0), None, "extra_info.n: expected an integer (a sequence length)"),
    ("n-a-float", _set(f"{INFO}.n", 64.5), None, "extra_info.n: expected an integer"),
    ("causal-a-string", _set(f"{INFO}.causal", "yes"), None, "extra_info.causal: expected true or false, got 'yes'"),
    ("pass-unknown", _set(f"{INFO}.pass_", "sideways"), None, "pass_: expected one of forward, backward"),
    ("peak-negative", _set(f"{INFO}.peak_bytes", -5), None, "peak_bytes: expected an integer (a byte count)"),
    ("device-a-list", _set(f"{INFO}.device", ["cpu"]), None, "extra_info.device: expected a string, got a list"),
    ("record-a-list", _set("aiayn", []), None, "aiayn: expected an object, got a list"),
    ("library-build-a-number", _set("aiayn.libraries.numpy", 2), None, "aiayn.libraries.numpy: expected a string"),
    ("threads-zero", _set("aiayn.threads", 0), None, "aiayn.threads: expected an integer (a count)"),
    ("ceiling-record-without-gflops", _set("aiayn.ceilings_best.0.gflops", ...), None, "ceilings_best[0].gflops: miss"),
    ("load-a-string", _set("aiayn.loadavg_start.0", "high"), None, "aiayn.loadavg_start[0]: expected a number"),
    ("implementation-a-string", _set("aiayn.implementations.numpy", "1.0"), None, "implementations.numpy: expected"),
    ("commit-info-a-string", _set("commit_info", "abc"), None, "commit_info: expected an object, got 'abc'"),
    ("datetime-a-number", _set("datetime", 20260101), None, "datetime: expected a string or null"),
    ("case-twice", "twice", None, "benchmarks[1].extra_info.case: expected a case not timed before (benchmarks[0]"),
]


def _bad_run(change: Any, text: bytes | None) -> bytes:
    run = _run("numpy", sizes=(64, 128))
    if text == b"NaN-round":
        return json.dumps(run).replace(str(run["benchmarks"][0]["extra_info"]["round_times_s"][1]), "NaN").encode()
    if text == b"Infinity-extra":
        return json.dumps(run).replace('"case":', '"note": Infinity, "case":', 1).encode()
    if text == b"huge-int":
        return json.dumps(run).replace('"threads": 1', '"threads": 1' + "0" * 5000).encode()
    if text is not None:
        return text
    if change == "twice":
        run["benchmarks"][1] = copy.deepcopy(run["benchmarks"][0])
        return json.dumps(run).encode()
    return json.dumps(change(run)).encode()


@pytest.mark.parametrize("option", ["--baseline", "--from-run"])
@pytest.mark.parametrize(("change", "text", "fragment"), [r[1:] for r in RUN_ROWS], ids=[r[0] for r in RUN_ROWS])
def test_a_bad_stored_run_is_one_line_naming_the_file_and_the_field(
    option: str, change: Any, text: bytes | None, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "crafted.json"
    bad.write_bytes(_bad_run(change, text))
    good = _write(tmp_path / "good.json", _run("numpy", sizes=(64, 128), when="2"))
    argv = ["bench", "--out", str(tmp_path / "out")]
    argv += ["--from-run", str(good), "--baseline", str(bad)] if option == "--baseline" else ["--from-run", str(bad)]
    _refused(main(argv), capsys, f"{option}: {bad}", fragment)
    assert not (tmp_path / "out" / "bench-numpy.md").exists(), "a report was written from a refused file"


def test_a_stored_run_with_a_training_profile_beyond_its_total_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run("numpy")
    info = dict(run["benchmarks"][0]["extra_info"], training="cpu", model="ours", batch=2, vocab=100, d_model=64)
    info.update(n_layers=2, tokens_per_s=1e4, flops=1e9, gflops=1.0, mfu=0.02)
    info["profile"] = {"total_s": 1.0, "gemm_s": 2.0, "top_other": [["aten::exp", 0.1]]}
    run["benchmarks"].append({"name": "test_training_step[cpu-ours]", "extra_info": dict(info, case="train-cpu-ours")})
    bad = _write(tmp_path / "crafted.json", run)
    _refused(
        main(["bench", "--from-run", str(bad), "--out", str(tmp_path / "out")]),
        capsys,
        "benchmarks[1].extra_info.profile.gemm_s: expected at most total_s (1), got 2.0",
    )


def _history_line(**change: Any) -> dict:
    entry = {
        "datetime": "2026-01-01T00:00:00+00:00",
        "commit": "a" * 40,
        "dirty": False,
        "branch": "main",
        "environment": {"machine": "a test CPU", "threads": 1, "libraries": {"numpy": "2.0"}},
        "cases": {"numpy-float64-n64-full": {"median": 0.5, "min": 0.4, "max": 0.6, "rounds": 10}},
    }
    for path, value in change.items():
        _set(path.replace("__", "."), value)(entry)
    return entry


CASE = "cases.numpy-float64-n64-full"
HISTORY_ROWS: list[tuple[str, bytes, str]] = [
    (
        "median-a-string",
        json.dumps(_history_line(**{"cases__numpy-float64-n64-full__median": "x"})).encode(),
        f"{CASE}.median: expected a number",
    ),
    ("median-nan", json.dumps(_history_line()).replace("0.5", "NaN").encode(), f"{CASE}.median: expected a finite"),
    ("min-negative", json.dumps(_history_line(**{"cases__numpy-float64-n64-full__min": -1})).encode(), ".min: "),
    ("rounds-zero", json.dumps(_history_line(**{"cases__numpy-float64-n64-full__rounds": 0})).encode(), ".rounds: "),
    ("case-a-list", json.dumps(_history_line(**{"cases__numpy-float64-n64-full": [1]})).encode(), f"{CASE}: expected"),
    ("libraries-a-list", json.dumps(_history_line(environment__libraries=[])).encode(), "environment.libraries: "),
    ("threads-a-string", json.dumps(_history_line(environment__threads="1")).encode(), "environment.threads: "),
    ("commit-a-number", json.dumps(_history_line(commit=7)).encode(), "commit: expected a string or null, got 7"),
    ("a-list-not-an-object", b"[1, 2]", "line 1 is not a history entry"),
    ("no-cases", json.dumps({"datetime": "x"}).encode(), "line 1 is not a history entry"),
    ("huge-integer", b'{"datetime": 1' + b"0" * 5000 + b', "cases": {}}', "line 1 is not JSON that can be read"),
    ("not-utf-8", b'{"datetime": "\xff", "cases": {}}', "cannot read a history file"),
    ("not-json", b"{not json", "line 1 is not JSON"),
]


@pytest.mark.parametrize(("text", "fragment"), [r[1:] for r in HISTORY_ROWS], ids=[r[0] for r in HISTORY_ROWS])
def test_a_bad_history_file_is_one_line_naming_the_line_and_the_field(
    text: bytes, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "history.jsonl"
    bad.write_bytes(text + b"\n")
    before = bad.read_bytes()
    run = _write(tmp_path / "run.json", _run("numpy"))
    status = main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out"), "--history", str(bad)])
    _refused(status, capsys, f"--history: {bad}", fragment)
    assert bad.read_bytes() == before, "the history file was changed"


# --- 5. the rest: --save folders, a SPEC without Eq. (1), memory, long names, a deleted working directory ---------


NO_EQ1 = """
from aiayn.implementations.examples.my_attention import MyAttention


class SoftmaxOnly(MyAttention):
    name = "softmax-only"

    def provides(self):
        return frozenset({"softmax"})
"""


def _save_row(tmp_path: Path, where: str) -> tuple[Path, str]:
    if where == "a-folder":
        (tmp_path / "folder").mkdir()
        return tmp_path / "folder", "--save: {} is a folder, expected a file name"
    if where == "missing-folder":
        return tmp_path / "nowhere" / "base.json", "--save: {}: its folder " + str(tmp_path / "nowhere") + " does not"
    if where == "folder-is-a-file":
        (tmp_path / "a-file").write_text("x", encoding="utf-8")
        return tmp_path / "a-file" / "base.json", "--save: {}: its folder"
    if where == "read-only-folder":
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        if os.access(folder, os.W_OK):
            # root ignores the mode bits: the case cannot be posed; the "/proc" row poses an unwritable folder instead
            pytest.skip("this user writes into read-only folders (root)")
        return folder / "base.json", "--save: cannot write into"
    return Path("/proc/aiayn-bench-base.json"), "--save: cannot write into /proc"


@pytest.mark.parametrize("where", ["a-folder", "missing-folder", "folder-is-a-file", "read-only-folder", "proc"])
def test_a_save_destination_that_cannot_take_the_file_is_one_line(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if where == "proc" and not Path("/proc/self").exists():
        pytest.skip("no /proc here")  # the machine cannot pose this row; the read-only row poses the same case
    dest, fragment = _save_row(tmp_path, where)
    run = _write(tmp_path / "run.json", _run("numpy"))
    status = main(["bench", "--from-run", str(run), "--out", str(tmp_path / "out"), "--save", str(dest)])
    _refused(status, capsys, fragment.format(dest))
    assert not (tmp_path / "nowhere").exists(), "--save made a folder"
    assert not (tmp_path / "out" / "bench-numpy.md").exists(), "the report was written before the refusal"


@pytest.mark.parametrize("option", ["--history", "--from-run", "--baseline"])
def test_a_folder_given_for_a_file_to_read_is_one_line(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    run = _write(tmp_path / "run.json", _run("numpy"))
    argv = ["bench", "--out", str(tmp_path / "out"), option, str(folder)]
    if option != "--from-run":
        argv += ["--from-run", str(run)]
    _refused(main(argv), capsys, f"{option}: {folder}", "folder" if option != "--history" else "Is a directory")


def test_a_spec_without_eq1_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "softmax_only.py").write_text(textwrap.dedent(NO_EQ1), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    status = main(["bench", "softmax_only:SoftmaxOnly", "--sizes", "64", "--out", str(tmp_path / "out")])
    _refused(status, capsys, "SPEC: 'softmax_only:SoftmaxOnly' does not provide Eq. (1)", "softmax")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("numpy", "numpy-float64-n1000000000-full-backward (n = 1000000000), holds at least 55.5 EiB (one (1, 8, n"),
        ("aiayn.implementations.examples.my_attention:MyAttention", "at least 29.8 TiB (8 x (1, 8, n, 64) arrays"),
    ],
    ids=["scores-and-arrays", "arrays-only"],
)
def test_sizes_beyond_this_machines_memory_are_refused_by_an_estimate(
    spec: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["bench", spec, "--sizes", "64,1000000000", "--out", str(tmp_path / "out")])
    _refused(status, capsys, "--sizes: the largest case, ", fragment, "available here (")
    assert not (tmp_path / "out" / "tmp").exists(), "the run was measured"


def test_sizes_beyond_any_sequence_length_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "numpy", "--sizes", "64," + "9" * 400])
    _refused(status, capsys, "--sizes: expected sequence lengths of at most 2^31 = 2147483648, got 9999")


@pytest.mark.parametrize("option", ["--save", "--out", "--history", "--from-run", "--baseline"])
@pytest.mark.parametrize("length", ["name", "path"])
def test_a_name_longer_than_the_system_takes_is_one_line(
    option: str, length: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = tmp_path / ("a" * 300 + ".json") if length == "name" else tmp_path.joinpath(*["b" * 200] * 25, "x.json")
    run = _write(tmp_path / "run.json", _run("numpy"))
    argv = ["bench", "--out", str(tmp_path / "out"), option, str(long)]
    if option != "--from-run":
        argv += ["--from-run", str(run)]
    _refused(main(argv), capsys, f"{option}: {str(long)[:60]}...", "name too long")


def test_a_long_spec_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    _refused(main(["bench", "a" * 300, "--sizes", "64"]), capsys, "SPEC: 'aaaa", "cannot be loaded")


def test_a_deleted_working_directory_is_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    code = "import os, sys\nos.chdir(sys.argv[1]); os.rmdir(sys.argv[1])\nfrom aiayn.cli import main\n"
    code += "sys.exit(main(['bench', 'numpy', '--sizes', '64', '--out', sys.argv[2]]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(gone), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the working directory: No such file or directory (was it deleted?)" in lines[0], lines


def test_big_sizes_run_every_chosen_pass_of_the_o_n_memory_built_ins_and_a_bad_one_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aiayn.cli import _bench_selection, build_parser

    args = build_parser("bench").parse_args(
        ["bench", "--sizes", "64", "--big-sizes", "128", "--dtypes", "float32", "--passes", "forward,forward+backward"]
    )
    args.pytest_args = []  # what main() takes from after --
    cmd, plan = _bench_selection(args)
    assert "--bench-big-sizes=128" in cmd, cmd
    big = sorted((c.impl, c.pass_, c.causal) for c in plan if c.n == 128)
    assert big == sorted(
        (impl, pass_, causal)
        for impl in ("numpy-blocked", "torch-sdpa")
        for pass_ in ("forward", "forward+backward")
        for causal in (False, True)
    ), big
    args = build_parser("bench").parse_args(["bench", "--sizes", "64"])
    args.pytest_args = []
    assert "--bench-big-sizes=" in _bench_selection(args)[0], "--sizes alone drops the big sizes"
    _refused(main(["bench", "--big-sizes", "8k"]), capsys, "--big-sizes: expected comma-separated positive integers")
