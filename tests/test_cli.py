"""The ``aiayn`` command: help at every level, pytest's exit codes, one-line errors at the edges.

(The command end to end from an installed wheel is tests/test_installed.py; here the parts that need
no fresh environment.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiayn.cli import COMMANDS, build_parser, main


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name} " in out or f"    {name}\n" in out, f"aiayn --help does not list {name}"
    assert "Exit status" in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help_with_defaults(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: aiayn {command}"), out[:200]
    options = [line for line in out.splitlines() if line.strip().startswith("--") and "--help" not in line]
    if command not in ("list",):
        assert "(default:" in out, f"aiayn {command} --help shows no defaults:\n{out}"
    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    formatter = sub._get_formatter()
    twice = [a.dest for a in sub._actions if (formatter._get_help_string(a) or "").count("default:") > 1]
    assert not twice, f"aiayn {command} --help states the default of {twice} twice:\n{out}"
    assert options or command in ("replay",), f"aiayn {command} --help lists no options"


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["nosuchcommand"],
        ["check", "numpy", "--workers", "x"],
        ["reproduce", "--bogus"],
        ["train", "--preset", "nosuch"],
        ["replay"],
    ],
)
def test_a_bad_command_line_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 4
    assert "error:" in capsys.readouterr().err


def test_no_command_prints_help_and_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 4
    assert "usage: aiayn" in capsys.readouterr().out


def test_replay_of_a_missing_or_unreadable_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.npz")]) == 4
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such file" in err, err
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    assert main(["replay", str(bad)]) == 4
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a replay file" in err, err
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    assert main(["replay", str(other)]) == 4
    assert "not a replay file" in capsys.readouterr().err


def test_unknown_reproduction_and_positional_passthrough(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "table9"]) == 4
    assert "unknown reproduction(s) table9" in capsys.readouterr().err
    assert main(["reproduce", "--", "-x"]) == 4
    assert "passed to pytest by check and bench only" in capsys.readouterr().err


def _without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``aiayn ARGV`` in a fresh interpreter in which importing any of ``modules`` fails."""
    code = (
        f"import sys\nfor m in {modules!r}: sys.modules[m] = None\nfrom aiayn.cli import main\nsys.exit(main({argv!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(
    ("modules", "argv", "extra"),
    [
        (
            ["torch"],
            ["train", "--preset", "smoke", "--work", "/nonexistent/never-written"],
            "pip install 'aiayn[torch]'",
        ),
        (["torch"], ["check", "torch", "--workers", "0"], "pip install 'aiayn[torch]'"),
        (["matplotlib"], ["reproduce", "figures", "--out", "/nonexistent/never-written"], "pip install 'aiayn[plots]'"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(modules: list[str], argv: list[str], extra: str) -> None:
    proc = _without(modules, argv)
    assert proc.returncode == 4, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if extra in line]
    assert lines, f"no line names {extra!r}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_preset_and_row_names_match_the_training_code() -> None:
    from aiayn.reproductions.translation.ablation import ROWS
    from aiayn.reproductions.translation.cli import PRESET_NAMES, ROW_NAMES
    from aiayn.reproductions.translation.run import PRESETS

    assert tuple(PRESETS) == PRESET_NAMES and tuple(ROWS) == ROW_NAMES


def test_list_names_every_builtin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.implementations import registry
    from aiayn.implementations.zoo import ZOO

    assert main(["list", "--no-load"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in [*registry.BUILTINS, *ZOO])
    # loaded, the built-ins only: importing every zoo library (JAX, Keras, transformers) takes half a minute, and
    # tests/test_zoo.py loads each adapter already
    monkeypatch.setattr(registry, "zoo", dict)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "numpy 2" in out  # the numpy built-in's version string names numpy's
    assert all(f"{name} " in out for name in registry.BUILTINS) and "not available" not in out


def test_python_dash_m_aiayn_is_the_same_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("aiayn "), proc.stdout + proc.stderr


@pytest.mark.parametrize(("flag", "direction"), [("--no-decode", "decode"), ("--no-grad", "backward")])
def test_no_grad_and_no_decode_leave_their_rows_not_run(tmp_path: Path, flag: str, direction: str) -> None:
    """``aiayn check --no-grad`` / ``--no-decode``: the whole model's backward / decode row is 'not run', the forward
    row still checked."""
    run = subprocess.run(
        [sys.executable, "-m", "aiayn", "check", "numpy", "--profile", "smoke", "--workers", "0", "--dtype", "float64"]
        + ["-k", "transformer", "--report", str(tmp_path), flag],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    import json

    rows = json.loads((tmp_path / "conformance-numpy.json").read_text(encoding="utf-8"))["rows"]
    status = {
        r["direction"]: r["status"] for r in rows if r["equation"] == "transformer_forward" and r["dtype"] == "float64"
    }
    assert status[direction] == "not run" and status["forward"] == "pass", status
