"""aiayn false-alarms: what a unit's key covers, a unit that did not finish, and stored unit files read as data.

- a unit ended by a signal (SIGKILL) is an alarm that did not finish, named with its signal, and is not stored;
  another implementation's exit 0 in the same seed does not hide it;
- a stored unit is reused only while every module file its implementation loads from outside the standard library
  and site-packages has the same code, and every distribution it loads from has the same version; the report names
  those files;
- a stored unit file that is not one aiayn wrote is an error naming the file and the field (exit 4, one line), and
  never a verdict.

The units are fakes (``one``) that return at once; the files of a key come from the real child process, loading a
tiny implementation written into tmp_path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiayn.conformance.studies import false_alarms


def _unit(exit: int = 0) -> dict[str, Any]:
    return {"seconds": 1.0, "exit": exit, "alarms": [], "failed_lines": [], "summary": "ok"}


def _counting(calls: list[tuple[str, int]], exits: dict[str, int] | None = None):
    def one(specs: list[str], profile: str, seed: int, workers: int, folder: Path) -> dict[str, Any]:
        (spec,) = specs
        calls.append((spec, seed))
        return {"seed": seed, **_unit((exits or {}).get(spec, 0))}

    return one


def _killed(specs: list[str], profile: str, seed: int, workers: int, folder: Path) -> dict[str, Any]:
    """A unit whose process is ended by SIGKILL, as the kernel's out-of-memory killer would."""
    proc = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    return {"seed": seed, **_unit(proc.returncode)}


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "conformance-false-alarms-smoke.json").read_text(encoding="utf-8"))


def test_a_unit_killed_by_sigkill_is_an_alarm_that_did_not_finish_and_is_not_stored(tmp_path: Path) -> None:
    kwargs = dict(profile="smoke", seeds=[1], workers=1, out=tmp_path / "out", work=tmp_path / "work")
    assert false_alarms.run(["numpy"], one=_killed, **kwargs) == 1
    assert not list((tmp_path / "work").glob("*.json")), "a unit that did not finish was stored"
    (run,) = _report(tmp_path / "out")["runs"]
    assert run["exit"] == -9 and run["did_not_finish"] == [
        {"spec": "numpy", "exit": -9, "why": "killed by signal 9 (SIGKILL)"}
    ], run
    text = (tmp_path / "out" / "conformance-false-alarms-smoke.md").read_text(encoding="utf-8")
    assert "1 of 1 runs raised an alarm" in text and "numpy: killed by signal 9 (SIGKILL)" in text, text
    calls: list[tuple[str, int]] = []
    assert false_alarms.run(["numpy"], one=_counting(calls), **kwargs) == 0  # run again, not read back
    assert calls == [("numpy", 1)]


def test_a_killed_unit_beside_a_passing_one_keeps_its_seed_alarmed(tmp_path: Path) -> None:
    """max() over the exits would make -9 and 0 a 0."""
    calls: list[tuple[str, int]] = []
    one = _counting(calls, exits={"numpy-blocked": -9})
    kwargs = dict(profile="smoke", seeds=[4], workers=1, out=tmp_path / "out", work=tmp_path / "work")
    assert false_alarms.run(["numpy", "numpy-blocked"], one=one, **kwargs) == 1
    (run,) = _report(tmp_path / "out")["runs"]
    assert run["exit"] == -9 and run["exits"] == {"numpy": 0, "numpy-blocked": -9}, run
    assert [p.name for p in (tmp_path / "work").glob("*.json")] == ["seed4-numpy.json"]


@pytest.mark.parametrize(("exit", "why"), [(2, "interrupted (exit 2)"), (3, "pytest internal error (exit 3)")])
def test_a_unit_pytest_did_not_finish_is_not_stored(tmp_path: Path, exit: int, why: str) -> None:
    one = _counting([], exits={"numpy": exit})
    kwargs = dict(profile="smoke", seeds=[2], workers=1, out=tmp_path / "out", work=tmp_path / "work")
    assert false_alarms.run(["numpy"], one=one, **kwargs) == 1
    assert _report(tmp_path / "out")["runs"][0]["did_not_finish"][0]["why"] == why
    assert not list((tmp_path / "work").glob("*.json"))


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An implementation outside aiayn, ``fa_outside_impl:Impl``, that takes its class from a sibling module."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "fa_outside_impl.py").write_text("from fa_outside_sibling import Impl\n")
    (code / "fa_outside_sibling.py").write_text(
        "from aiayn.implementations.numpy_impl import NumpyImplementation as Impl\n"
    )
    monkeypatch.chdir(code)  # the unit's child processes find it as `aiayn check` would: from the current directory
    monkeypatch.syspath_prepend(str(code))
    return code


def test_a_unit_runs_again_when_a_sibling_module_of_its_implementation_changes(tmp_path: Path, outside: Path) -> None:
    calls: list[tuple[str, int]] = []
    spec = "fa_outside_impl:Impl"
    kwargs = dict(
        profile="smoke", seeds=[5], workers=1, out=tmp_path / "out", work=tmp_path / "work", one=_counting(calls)
    )
    false_alarms.run([spec], **kwargs)
    (stored,) = (tmp_path / "work").glob("*.json")
    files = json.loads(stored.read_text(encoding="utf-8"))["files"]
    sibling = str((outside / "fa_outside_sibling.py").resolve())
    assert sibling in files and str((outside / "fa_outside_impl.py").resolve()) in files, files
    assert "implementations/numpy_impl.py" in files, files  # aiayn's own, relative to its checkout
    key = _report(tmp_path / "out")["keys"][spec]
    assert sibling in key["files"] and "numpy" in key["distributions"], key
    assert f"`{sibling}`" in (tmp_path / "out" / "conformance-false-alarms-smoke.md").read_text(encoding="utf-8")
    false_alarms.run([spec], **kwargs)
    assert calls == [(spec, 5)], "an unchanged key should reuse the stored unit"
    (outside / "fa_outside_sibling.py").write_text(  # a comment is no new code
        "# the same class\nfrom aiayn.implementations.numpy_impl import NumpyImplementation as Impl\n"
    )
    false_alarms.run([spec], **kwargs)
    assert calls == [(spec, 5)]
    (outside / "fa_outside_sibling.py").write_text(
        "from aiayn.implementations.numpy_impl import NumpyImplementation as Impl\nImpl.name = 'changed'\n"
    )
    false_alarms.run([spec], **kwargs)
    assert calls == [(spec, 5)] * 2, "a changed sibling module left the stored verdict in place"


def test_a_unit_runs_again_when_a_distribution_it_loads_changes_version(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    kwargs = dict(
        profile="smoke", seeds=[6], workers=1, out=tmp_path / "out", work=tmp_path / "work", one=_counting(calls)
    )
    false_alarms.run(["numpy"], **kwargs)
    (stored,) = (tmp_path / "work").glob("*.json")
    unit = json.loads(stored.read_text(encoding="utf-8"))
    assert "numpy" in unit["distributions"], unit["distributions"]
    stored.write_text(json.dumps({**unit, "distributions": {**unit["distributions"], "numpy": "0.0.1"}}))
    false_alarms.run(["numpy"], **kwargs)
    assert calls == [("numpy", 6)] * 2


def test_an_implementation_its_child_process_cannot_load_did_not_finish(tmp_path: Path, outside: Path) -> None:
    (outside / "fa_outside_broken.py").write_text("raise RuntimeError('no such library here')\n")
    calls: list[tuple[str, int]] = []
    kwargs = dict(profile="smoke", seeds=[7], workers=1, out=tmp_path / "out", work=tmp_path / "work")
    assert false_alarms.run(["fa_outside_broken:Impl"], one=_counting(calls), **kwargs) == 1
    assert calls == [] and not list((tmp_path / "work").glob("*.json"))
    (gone,) = _report(tmp_path / "out")["runs"][0]["did_not_finish"]
    assert "loading 'fa_outside_broken:Impl' in a child process failed" in gone["why"], gone
    assert "no such library here" in gone["why"], gone


# --------------------------------------------------------------------------------------------
# stored unit files are data


def _valid(seed: int = 1) -> dict[str, Any]:
    return {
        **_unit(),
        "seed": seed,
        "spec": "numpy",
        "profile": "smoke",
        "code": "0" * 12,
        "files": {},
        "distributions": {},
    }


_CORRUPT = [
    pytest.param("{not json", "not a JSON unit file", id="not JSON"),
    pytest.param("[" * 100_000, "not a JSON unit file", id="nested too deep"),
    pytest.param("[1, 2]", "not a JSON object but list", id="a list"),
    pytest.param({k: v for k, v in _valid().items() if k != "seed"}, "field 'seed' is missing", id="no seed"),
    pytest.param({**_valid(), "exit": -9}, "field 'exit' is int -9, expected 0 or 1", id="exit of a killed unit"),
    pytest.param({**_valid(), "exit": True}, "field 'exit' is bool True", id="exit a bool"),
    pytest.param({**_valid(), "seconds": "NaN"}, "field 'seconds' is str 'NaN'", id="seconds a string"),
    pytest.param('{"seconds": NaN}', "field 'seed' is missing", id="NaN and no seed"),
    pytest.param({**_valid(), "alarms": "none"}, "field 'alarms' is str 'none'", id="alarms a string"),
    pytest.param(
        {**_valid(), "alarms": [{"impl": 1, "equation": "softmax", "dtype": "f", "status": "fail", "tests": []}]},
        "field 'alarms[0].impl' is int 1",
        id="alarm impl an int",
    ),
    pytest.param(
        {**_valid(), "alarms": [{"impl": "n", "equation": "s", "dtype": "f", "status": "pass", "tests": []}]},
        "field 'alarms[0].status' is str 'pass', expected 'fail' or 'inconclusive'",
        id="alarm that passed",
    ),
    pytest.param({**_valid(), "files": {"../../etc/passwd.py": "0"}}, "field 'files'", id="file outside the checkout"),
    pytest.param({**_valid(), "files": {"/proc/kmsg": "0"}}, "field 'files'", id="file that is no module"),
    pytest.param({**_valid(), "distributions": ["numpy"]}, "field 'distributions' is list", id="distributions a list"),
]


@pytest.mark.parametrize(("content", "named"), _CORRUPT)
def test_a_corrupt_unit_file_is_an_error_naming_the_file_and_field(tmp_path: Path, content: Any, named: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path = work / "seed1-numpy.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    calls: list[tuple[str, int]] = []
    with pytest.raises(false_alarms.StoredUnitError) as info:
        false_alarms.run(
            ["numpy"], profile="smoke", seeds=[1], workers=1, out=tmp_path, work=work, one=_counting(calls)
        )
    message = str(info.value)
    assert message.startswith(f"{path}: ") and named in message and "\n" not in message, message
    assert calls == [] and not list(tmp_path.glob("conformance-*")), "a corrupt unit file was used or ran over"


def test_a_corrupt_unit_file_stops_the_command_with_one_line_and_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main

    work = tmp_path / "work"
    work.mkdir()
    # a later unit's file is checked before the first unit runs: the run stops before any work
    (work / "seed2-numpy.json").write_text(json.dumps({**_valid(2), "alarms": [["crafted"]]}), encoding="utf-8")
    argv = ["false-alarms", "numpy", "--seeds", "1,2", "--profile", "smoke", "--out", str(tmp_path / "out")]
    assert main([*argv, "--work", str(work)]) == 4
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{work / 'seed2-numpy.json'}: field 'alarms[0]' is list" in err, err
    assert "profile smoke, seed 1" not in out, out
