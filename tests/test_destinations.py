"""Where reports go, and nothing lost: destinations relative to the current folder, checked before the work, and a
smaller run never replacing the report of a larger one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn import environment, kit
from aiayn.conformance.studies import false_alarms
from aiayn.environment import UsageError

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*")) if p.is_file()}


def test_reports_go_where_you_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert environment.reports_dir() == ROOT / "reports"
    monkeypatch.chdir(tmp_path)
    assert environment.reports_dir() == tmp_path / "aiayn-reports"  # never the checkout's reports/ from elsewhere
    monkeypatch.chdir(ROOT / "reproductions")
    assert environment.reports_dir() == ROOT / "reproductions" / "aiayn-reports"


def test_a_destination_is_tried_before_the_work(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(UsageError, match=r"^--report: .*a-file is a file, expected a folder$"):
        environment.writable_dir(a_file, "--report")
    with pytest.raises(UsageError, match=r"^--out: cannot write into .*a-file/sub"):
        environment.writable_dir(a_file / "sub", "--out")
    made = environment.writable_dir(tmp_path / "new" / "deeper", "--out")
    assert made.is_dir() and list(made.iterdir()) == []  # the trial file is gone


def _report(size: float, *, full: bool, label: str) -> kit.Report:
    rep = kit.Report("demo", "Demo", precision="float64", verdict=f"{label} run")
    rep.scope = kit.Scope(label=label, size=size, full=full)
    rep.data = {"size": size}
    return rep


def test_a_smaller_run_writes_beside_a_larger_report_and_force_replaces_it(tmp_path: Path) -> None:
    kit.write_report(tmp_path, _report(20, full=True, label="20 seeds"))
    full = (tmp_path / "demo.json").read_bytes()
    kit.write_report(tmp_path, _report(1, full=False, label="1 seed"))
    assert (tmp_path / "demo.json").read_bytes() == full
    assert json.loads((tmp_path / "demo-1-seed.json").read_text())["scope"]["label"] == "1 seed"
    kit.write_report(tmp_path, _report(40, full=True, label="40 seeds"))  # a larger run replaces
    assert json.loads((tmp_path / "demo.json").read_text())["scope"]["size"] == 40
    kit.write_report(tmp_path, _report(1, full=False, label="1 seed"), force=True)
    assert json.loads((tmp_path / "demo.json").read_text())["scope"]["size"] == 1


def test_a_report_stored_without_a_scope_counts_as_a_full_run(tmp_path: Path) -> None:
    (tmp_path / "demo.json").write_text(json.dumps({"report": "demo"}))
    kit.write_report(tmp_path, _report(3, full=False, label="smoke"))
    assert json.loads((tmp_path / "demo.json").read_text()) == {"report": "demo"}
    assert (tmp_path / "demo-smoke.md").exists()
    kit.write_report(tmp_path, _report(3, full=True, label="full"))  # a full run replaces it
    assert json.loads((tmp_path / "demo.json").read_text())["scope"]["label"] == "full"


def test_a_two_seed_false_alarm_count_leaves_the_committed_count_alone(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    for name in ("conformance-false-alarms-dev.md", "conformance-false-alarms-dev.json"):
        shutil.copy(REPORTS / name, out / name)
    before = _digest(out)

    def one(specs: list[str], profile: str, seed: int, workers: int, folder: Path) -> dict:
        return {"seed": seed, "seconds": 1.0, "exit": 0, "alarms": [], "failed_lines": [], "summary": "ok"}

    false_alarms.run(["numpy"], profile="dev", seeds=[31, 32], workers=1, out=out, work=tmp_path / "w", one=one)
    after = _digest(out)
    assert {k: after[k] for k in before} == before
    assert "conformance-false-alarms-dev-2-seeds-x-1-implementations.json" in after


def test_a_smoke_benchmark_leaves_the_committed_report_alone(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from aiayn.benchmarks.report import write

    out = tmp_path / "reports"
    out.mkdir()
    for name in ("benchmarks.md", "benchmarks.json", "benchmarks.png"):
        shutil.copy(REPORTS / name, out / name)
    before = _digest(out)
    run = ROOT / "benchmarks" / "baseline" / "benchmarks-baseline.json"
    paths = write(run, out, smoke=True)
    assert _digest(out).items() >= before.items()
    assert [p.name for p in paths] == [
        "benchmarks-smoke-cases.md",
        "benchmarks-smoke-cases.json",
        "benchmarks-smoke-cases.png",
    ]


def _aiayn(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "aiayn", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_check_refuses_a_report_destination_that_is_a_file_before_running(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    proc = _aiayn("check", "numpy", "--report", str(a_file), cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == [f"aiayn check: error: --report: {a_file} is a file, expected a folder"], lines
    assert "passed" not in proc.stdout


def test_a_smoke_training_run_outside_the_checkout_leaves_its_reports_alone(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("sacrebleu")
    before = _digest(REPORTS)
    proc = _aiayn("train", "--preset", "smoke", "--work", "runs/smoke", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _digest(REPORTS) == before
    written = tmp_path / "aiayn-reports" / "bleu-training.md"
    assert written.exists() and f"wrote {written}" in proc.stdout
