"""aiayn false-alarms: the count over seeds and implementations, resumable unit by unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.conformance.studies import false_alarms


def _fake(calls: list[tuple[str, int]], alarm: tuple[str, int] | None = None):
    def one(specs: list[str], profile: str, seed: int, workers: int, folder: Path) -> dict[str, Any]:
        (spec,) = specs
        calls.append((spec, seed))
        alarms = (
            [{"impl": spec, "equation": "softmax", "dtype": "float32", "status": "fail", "tests": ["t"]}]
            if alarm == (spec, seed)
            else []
        )
        return {
            "seed": seed,
            "seconds": 1.0,
            "exit": 1 if alarms else 0,
            "alarms": alarms,
            "failed_lines": [],
            "summary": "ok",
        }

    return one


def test_units_are_stored_and_skipped_for_the_same_code(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    kwargs = dict(profile="smoke", seeds=[1, 2], workers=1, out=tmp_path / "out", work=tmp_path / "work")
    specs = ["numpy", "numpy-blocked"]
    assert false_alarms.run(specs, one=_fake(calls, alarm=("numpy-blocked", 2)), **kwargs) == 1
    assert sorted(calls) == [("numpy", 1), ("numpy", 2), ("numpy-blocked", 1), ("numpy-blocked", 2)]
    calls.clear()
    assert false_alarms.run(specs, one=_fake(calls), **kwargs) == 1  # the stored alarm still counts
    assert calls == []
    data = json.loads((tmp_path / "out" / "conformance-false-alarms-smoke.json").read_text(encoding="utf-8"))
    assert data["reused_units"] == 4 and [r["exit"] for r in data["runs"]] == [0, 1]


def test_a_unit_stored_for_other_code_or_profile_runs_again(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    work = tmp_path / "work"
    false_alarms.run(["numpy"], profile="smoke", seeds=[3], workers=1, out=tmp_path, work=work, one=_fake(calls))
    (path,) = work.glob("*.json")
    stored = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**stored, "code": "0" * 12}), encoding="utf-8")
    false_alarms.run(["numpy"], profile="smoke", seeds=[3], workers=1, out=tmp_path, work=work, one=_fake(calls))
    false_alarms.run(["numpy"], profile="dev", seeds=[3], workers=1, out=tmp_path, work=work, one=_fake(calls))
    assert calls == [("numpy", 3)] * 3


def test_the_code_hash_covers_the_suite_and_a_builtins_module() -> None:
    assert false_alarms.suite_code("numpy") != false_alarms.suite_code("torch")  # different implementation modules
    assert false_alarms.suite_code("numpy") == false_alarms.suite_code("numpy-blocked")  # same module


def test_an_outside_implementations_own_code_is_in_its_units_key(tmp_path: Path, monkeypatch) -> None:
    """A unit stored for an implementation outside aiayn is not reused once that implementation's code changes."""
    module = tmp_path / "outside_impl.py"
    module.write_text("from aiayn.implementations.numpy_impl import NumpyImplementation as Impl\n")
    monkeypatch.chdir(tmp_path)  # the unit's child process loads it from the current directory
    calls: list[tuple[str, int]] = []
    kwargs = dict(profile="smoke", seeds=[8], workers=1, out=tmp_path, work=tmp_path / "work", one=_fake(calls))
    false_alarms.run(["outside_impl:Impl"], **kwargs)
    false_alarms.run(["outside_impl:Impl"], **kwargs)
    assert calls == [("outside_impl:Impl", 8)]
    module.write_text("from aiayn.implementations.numpy_impl import NumpyImplementation as Impl\nX = 1\n")
    false_alarms.run(["outside_impl:Impl"], **kwargs)
    assert calls == [("outside_impl:Impl", 8)] * 2


def test_a_spec_that_cannot_be_loaded_is_a_usage_error_and_nothing_is_stored(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "false-alarms",
            "no_such_module:Impl",
            "--seeds",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "'no_such_module:Impl' cannot be loaded" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "work").glob("*.json"))
