"""Every command refuses bad input before any work: exit 4 (pytest's usage error), one line naming the option (or
variable, or argument) and what was expected, and no traceback.

One row per bad input. The rows run ``aiayn`` in this process, except those that reach pytest (``aiayn check``
loading an implementation), which run as a subprocess. Each row would start real work (a training run, a suite run,
a benchmark) if its input were not refused first; the exit status and the line tell a refusal from a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli import main

# (id, argv, environment, the fragment the one error line must hold). In argv and the environment, {file} is a
# plain file, {dir} an empty folder, {junk} a file of non-JSON bytes, {nojson} a folder whose results.json is not
# JSON, {empty} a folder whose results.json is {}, {benchjunk} a JSON with entries that are not pytest-benchmark's,
# {benchother} a pytest-benchmark JSON of no aiayn case.
TRAIN = ["train", "--preset", "smoke", "--work", "{dir}/run", "--no-report"]
ROWS: list[tuple[str, list[str], dict[str, str], str]] = [
    ("train-steps-0", [*TRAIN, "--steps", "0"], {}, "--steps: expected an integer, 1 or more; got 0"),
    ("train-steps-negative", [*TRAIN, "--steps", "-1"], {}, "--steps: expected an integer, 1 or more; got -1"),
    ("train-minutes-negative", [*TRAIN, "--minutes", "-1"], {}, "--minutes: expected a finite number, more than 0"),
    ("train-minutes-nan", [*TRAIN, "--minutes", "nan"], {}, "--minutes: expected a finite number"),
    ("train-beam-negative", [*TRAIN, "--beam", "-2"], {}, "--beam: expected an integer, 0 or more; got -2"),
    ("train-max-tokens-0", [*TRAIN, "--max-tokens", "0"], {}, "--max-tokens: expected an integer, 1 or more"),
    ("train-accumulate-0", [*TRAIN, "--accumulate", "0"], {}, "--accumulate: expected an integer, 1 or more"),
    ("train-warmup-0", [*TRAIN, "--warmup", "0"], {}, "--warmup: expected an integer, 1 or more"),
    ("train-lr-scale-0", [*TRAIN, "--lr-scale", "0"], {}, "--lr-scale: expected a finite number, more than 0"),
    ("train-alpha-inf", [*TRAIN, "--alpha", "inf"], {}, "--alpha: expected a finite number, 0 or more"),
    ("train-config-unknown", [*TRAIN, "--config", "bigg"], {}, "--config: 'bigg' is no Table 3 row"),
    ("train-device-unknown", [*TRAIN, "--device", "nosuch"], {}, "--device: 'nosuch' is no torch device"),
    ("train-same-languages", [*TRAIN, "--src-lang", "de"], {}, "--src-lang and --tgt-lang: expected two languages"),
    ("train-work-is-a-file", ["train", "--preset", "smoke", "--work", "{file}"], {}, "--work: "),
    ("train-out-is-a-file", [*TRAIN[:-1], "--out", "{file}"], {}, "--out: "),
    ("train-corpus-incomplete", [*TRAIN, "--train-src", "{file}"], {}, "your own corpus needs all six texts"),
    (
        "train-corpus-missing-file",
        [
            *TRAIN,
            *("--train-src", "{dir}/none.en", "--train-tgt", "{file}", "--dev-src", "{file}"),
            *("--dev-tgt", "{file}", "--test-src", "{file}", "--test-tgt", "{file}"),
        ],
        {},
        "--train-src: ",
    ),
    ("train-base-without-corpus", ["train", "--preset", "base", "--work", "{dir}/r"], {}, "--preset base trains on"),
    ("train-report-no-run", ["train-report", "{dir}/none"], {}, "no results.json"),
    ("train-report-a-file", ["train-report", "{file}"], {}, "RUN: "),
    ("train-report-not-json", ["train-report", "{nojson}"], {}, "is not a results file of aiayn train"),
    ("train-report-missing-keys", ["train-report", "{empty}"], {}, "is it a finished run of aiayn train?"),
    ("ablation-one-seed", ["ablation", "--seeds", "1", "--work", "{dir}/a"], {}, "--seeds: expected at least 2"),
    ("ablation-unknown-row", ["ablation", "--rows", "base,Z", "--work", "{dir}/a"], {}, "--rows: unknown row"),
    ("ablation-tokens-0", ["ablation", "--tokens", "0", "--work", "{dir}/a"], {}, "--tokens: expected a positive"),
    ("check-k-unparsable", ["check", "numpy", "-k", "softmax and ("], {}, "-k: 'softmax and (' is not a pytest -k"),
    ("check-timeout-negative", ["check", "numpy", "--timeout", "-1"], {}, "--timeout: expected a finite number"),
    ("check-timeout-nan", ["check", "numpy", "--timeout", "nan"], {}, "--timeout: expected a finite number"),
    ("check-workers-negative", ["check", "numpy", "--workers", "-1"], {}, "--workers: expected an integer, 0 or"),
    ("check-report-is-a-file", ["check", "numpy", "--report", "{file}"], {}, "--report: "),
    ("check-report-name-too-long", ["check", "numpy", "--report", "{dir}/" + "x" * 300], {}, "(File name too long)"),
    ("check-profile-from-env", ["check", "numpy"], {"AIAYN_PROFILE": "nosuch"}, "$AIAYN_PROFILE: 'nosuch' is not"),
    ("check-failures-is-a-file", ["check", "numpy"], {"AIAYN_FAILURES": "{file}"}, "$AIAYN_FAILURES: "),
    ("check-cache-is-a-file", ["check", "numpy"], {"AIAYN_CACHE": "{file}"}, "$AIAYN_CACHE: "),
    ("check-dtype-unknown", ["check", "numpy", "--dtype", "float128"], {}, "--dtype: invalid choice"),
    ("bench-from-run-missing", ["bench", "--from-run", "{dir}/none.json"], {}, "--from-run: "),
    ("bench-from-run-not-json", ["bench", "--from-run", "{junk}"], {}, "is not JSON"),
    ("bench-from-run-junk-entries", ["bench", "--from-run", "{benchjunk}"], {}, "is not a pytest-benchmark entry"),
    ("bench-from-run-other-cases", ["bench", "--from-run", "{benchother}"], {}, "holds no case of aiayn bench"),
    ("bench-baseline-missing", ["bench", "--baseline", "{dir}/none.json"], {}, "--baseline: "),
    ("bench-baseline-not-a-run", ["bench", "--baseline", "{benchother}"], {}, "holds no case of aiayn bench"),
    ("bench-spec-unknown", ["bench", "no-such-impl"], {}, "SPEC: 'no-such-impl' cannot be loaded"),
    ("bench-sizes-junk", ["bench", "numpy", "--sizes", "12,x"], {}, "--sizes: expected comma-separated"),
    ("bench-sizes-zero", ["bench", "numpy", "--sizes", "0"], {}, "--sizes: expected comma-separated"),
    ("bench-dtypes-junk", ["bench", "numpy", "--dtypes", "float8"], {}, "--dtypes: expected one or more of"),
    ("bench-passes-junk", ["bench", "numpy", "--passes", "sideways"], {}, "--passes: expected one or more of"),
    ("bench-factor-below-one", ["bench", "numpy", "--factor", "0.9"], {}, "--factor: expected"),
    ("bench-alpha-one", ["bench", "numpy", "--alpha", "1"], {}, "--alpha: expected"),
    ("bench-history-junk", ["bench", "--from-run", "{benchrun}", "--history", "{junk}"], {}, "is not JSON"),
    ("bench-out-is-a-file", ["bench", "--out", "{file}"], {}, "--out: "),
    ("false-alarms-seeds-junk", ["false-alarms", "--seeds", "1,x"], {}, "--seeds: expected comma-separated"),
    ("false-alarms-no-seed", ["false-alarms", "--seeds", ","], {}, "--seeds: give at least one seed"),
    ("false-alarms-workers", ["false-alarms", "--workers", "-1"], {}, "--workers: expected an integer"),
    ("false-alarms-unloadable", ["false-alarms", "nosuch", "--seeds", "1"], {}, "SPEC: 'nosuch' cannot be loaded"),
    ("false-alarms-work-is-a-file", ["false-alarms", "--work", "{file}"], {}, "--work: "),
    ("zoo-unknown-name", ["zoo", "nosuch"], {}, "NAME: 'nosuch' not in the zoo"),
    ("zoo-workers", ["zoo", "--workers", "-1"], {}, "--workers: expected an integer"),
    ("zoo-timeout", ["zoo", "--timeout", "inf"], {}, "--timeout: expected a finite number"),
    ("mutants-workers", ["mutants", "--workers", "-1"], {}, "--workers: expected an integer"),
    ("mutants-out-is-a-file", ["mutants", "--out", "{file}"], {}, "--out: "),
    ("reproduce-unknown", ["reproduce", "table9"], {}, "table9"),
    ("reproduce-out-is-a-file", ["reproduce", "--out", "{file}"], {}, "--out: "),
    ("replay-missing", ["replay", "{dir}/none.npz"], {}, "no such file"),
    ("passthrough-elsewhere", ["reproduce", "--", "-x"], {}, "options after -- are passed to pytest by check"),
]

# Rows that reach pytest (the implementation is loaded by the plugin): run as a subprocess.
SUBPROCESS_ROWS: list[tuple[str, list[str], str]] = [
    ("check-unknown-implementation", ["check", "nosuch"], "cannot load implementation 'nosuch': unknown name"),
    ("check-numpy-on-another-device", ["check", "numpy", "--device", "meta"], "it runs on 'cpu' only"),
    ("check-undeclared-dtype", ["check", "numpy", "--dtype", "bfloat16"], "does not declare dtype bfloat16"),
]


#: A stored run of aiayn bench (the committed baseline), for the rows that need a readable one.
BENCH_RUN = Path(__file__).resolve().parent.parent / "benchmarks" / "baseline" / "benchmarks-baseline.json"


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    """The files and folders the rows name."""
    file = tmp_path / "a-file.txt"
    file.write_text("a line\n", encoding="utf-8")
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\x00\x01 not json")
    nojson, empty = tmp_path / "run-nojson", tmp_path / "run-empty"
    nojson.mkdir()
    (nojson / "results.json").write_text("{not json", encoding="utf-8")
    empty.mkdir()
    (empty / "results.json").write_text("{}", encoding="utf-8")
    benchjunk, benchother = tmp_path / "bench-junk.json", tmp_path / "bench-other.json"
    benchjunk.write_text(json.dumps({"benchmarks": [1, "two"]}), encoding="utf-8")
    benchother.write_text(json.dumps({"benchmarks": [{"name": "t", "extra_info": {}}]}), encoding="utf-8")
    folder = tmp_path / "work"
    folder.mkdir()
    return {
        "file": str(file),
        "dir": str(folder),
        "junk": str(junk),
        "nojson": str(nojson),
        "empty": str(empty),
        "benchjunk": str(benchjunk),
        "benchother": str(benchother),
        "benchrun": str(BENCH_RUN),
    }


def _error_lines(err: str) -> list[str]:
    """The lines of stderr that state an error (argparse's usage lines left out)."""
    return [line for line in err.splitlines() if "error:" in line or line.startswith(("ERROR", "aiayn"))]


@pytest.mark.parametrize(("argv", "env", "fragment"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_a_bad_input_is_refused_before_the_work(
    argv: list[str],
    env: dict[str, str],
    fragment: str,
    places: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**places))
    status = main([a.format(**places) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out, err
    assert status == 4, f"exit {status}, expected 4 (a usage error):\n{err[-2000:]}"
    lines = _error_lines(err)
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{err}"
    assert fragment in lines[0], f"the error line does not say {fragment!r}:\n{lines[0]}"
    assert not (tmp_path / "work" / "run").exists() or not any((tmp_path / "work" / "run").iterdir()), "work began"


@pytest.mark.parametrize(
    ("argv", "fragment"), [row[1:] for row in SUBPROCESS_ROWS], ids=[row[0] for row in SUBPROCESS_ROWS]
)
def test_a_bad_implementation_or_placement_is_refused_before_the_work(
    argv: list[str], fragment: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", *argv, "--workers", "0"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "AIAYN_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    assert proc.returncode == 4, f"exit {proc.returncode}, expected 4:\n{out[-3000:]}"
    lines = [line for line in out.splitlines() if fragment in line]
    assert len(lines) == 1, f"expected one line saying {fragment!r}:\n{out[-3000:]}"
    assert "Known names" not in lines[0] or "unknown name" in fragment, lines[0]


@pytest.mark.parametrize("command", [["check", "numpy"], ["list"], ["reproduce", "--out", "r"]])
def test_a_deleted_working_directory_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """Every command checks its working directory first (relative paths and default folders resolve against it)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"import os, sys; from aiayn.cli import main; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
    script += f"sys.exit(main({command!r}))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 4, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the working directory: No such file or directory (was it deleted?)" in lines[0], lines
