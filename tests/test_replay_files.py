"""aiayn replay: a replay file is data, never code.

- the implementation a file names is imported only when it is a built-in, zoo or entry-point name; a ``module:attr``
  named by a file (``builtins:exit``, ``os:_exit``, ``os:system``, a module whose import writes a canary file) is
  refused in one line that names it and how to run it (``--impl``), before anything is imported or run;
- ``--impl`` runs what the user names; the spec that runs is printed first;
- every field of the file's metadata is checked by type before use: one line naming the file and the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.cli import main

_X = {"__array__": "args/x"}


def _replay_file(path: Path, meta: Any, **arrays: Any) -> Path:
    """An .npz written as ``failures.save_case`` writes one (``__meta__`` a JSON string, arrays by path), or crafted."""
    arrays = {"args|x": np.ones((2, 3)), **arrays}
    with open(path, "wb") as handle:
        np.savez(handle, __meta__=np.array(meta if isinstance(meta, str) else json.dumps(meta)), **arrays)
    return path


def _softmax(impl: str, **args: Any) -> dict[str, Any]:
    return {"impl": impl, "dtype": "float64", "check": "softmax", "args": {"__dict__": {"x": _X, "axis": -1, **args}}}


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module, ``replay_canary_impl``, whose import writes the file this fixture returns; its ``Impl`` is the NumPy
    implementation."""
    flag = tmp_path / "canary"
    code = tmp_path / "code"
    code.mkdir()
    (code / "replay_canary_impl.py").write_text(
        f"from pathlib import Path\nPath({str(flag)!r}).write_text('imported')\n"
        "from aiayn.implementations.numpy_impl import NumpyImplementation as Impl\n"
    )
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))
    monkeypatch.delitem(sys.modules, "replay_canary_impl", raising=False)
    return flag


@pytest.mark.parametrize("spec", ["builtins:exit", "os:_exit", "os:system", "replay_canary_impl:Impl"])
def test_a_module_attr_named_by_a_file_is_refused_before_it_is_imported(
    tmp_path: Path, canary: Path, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    path = _replay_file(tmp_path / "crafted.npz", _softmax(spec))
    assert main(["replay", str(path)]) == 4  # this process is still here to compare
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{path}: its field 'impl' names {spec!r}" in err and f"--impl {spec}" in err, err
    assert "replaying" not in out and "PASS" not in out, out
    assert not canary.exists() and "replay_canary_impl" not in sys.modules, "the file's module was imported"


def test_the_command_refuses_builtins_exit_named_by_a_file_and_exits_4(tmp_path: Path) -> None:
    """In a process of its own: ``builtins:exit`` imported and called would end it with exit 0."""
    path = _replay_file(tmp_path / "crafted.npz", _softmax("builtins:exit"))
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", "replay", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "'builtins:exit'" in proc.stderr, proc.stderr


def test_a_spec_that_is_no_name_nor_module_attr_is_refused_without_a_command_to_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _replay_file(tmp_path / "crafted.npz", _softmax("x; rm -rf ~"))
    assert main(["replay", str(path)]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--impl SPEC" in err and "--impl x;" not in err, err


def test_a_built_in_name_in_a_file_runs_and_says_which_spec_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _replay_file(tmp_path / "case.npz", _softmax("numpy"))
    assert main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        f"replaying {path}: check softmax in float64 on implementation 'numpy' "
        "(named by the file: built-in aiayn.implementations.numpy_impl:NumpyImplementation)" in out
    ), out
    assert f"PASS {path}" in out, out


def test_impl_overrides_the_file_and_runs_what_the_user_names(
    tmp_path: Path, canary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _replay_file(tmp_path / "case.npz", _softmax("os:system"))
    assert main(["replay", str(path), "--impl", "numpy"]) == 0
    assert "on implementation 'numpy' (named by --impl)" in capsys.readouterr().out
    assert not canary.exists()
    path = _replay_file(tmp_path / "mine.npz", _softmax("replay_canary_impl:Impl"))
    assert main(["replay", str(path), "--impl", "replay_canary_impl:Impl"]) == 0
    assert "on implementation 'replay_canary_impl:Impl' (named by --impl)" in capsys.readouterr().out
    assert canary.exists(), "the implementation the user named did not run"


class _Canary:
    """Unpickling it would write the file at ``flag``."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.flag, "unpickled"))


_CRAFTED = [
    pytest.param(_softmax("numpy") | {"impl": 5}, {}, "its __meta__ field 'impl' is int 5", id="impl an int"),
    pytest.param(_softmax("numpy") | {"dtype": []}, {}, "its __meta__ field 'dtype' is list []", id="dtype a list"),
    pytest.param(_softmax("numpy") | {"check": ""}, {}, "its __meta__ field 'check' is str ''", id="check empty"),
    pytest.param(
        _softmax("numpy") | {"args": "x"}, {}, "its __meta__ field 'args' is not an object", id="args a string"
    ),
    pytest.param(
        _softmax("numpy", x={"__array__": "args/y"}),
        {},
        "its __meta__ field 'args/x' names array 'args/y', which the file does not hold",
        id="array not held",
    ),
    pytest.param(_softmax("numpy", x=[1.0, 2.0]), {}, "its __meta__ field 'args/x' is list [1.0, 2.0]", id="bare list"),
    pytest.param(
        _softmax("numpy", x={"__array__": ["args/x"]}),
        {},
        "its __meta__ field 'args/x' is dict",
        id="array named by a list",
    ),
    pytest.param(
        _softmax("numpy", x={"__list__": [{"__list__": []}] * 2, "extra": 1}),
        {},
        "its __meta__ field 'args/x' is dict",
        id="two tags",
    ),
    pytest.param(
        '{"impl": "numpy", "args": ' + "[" * 100_000 + "]" * 100_000 + "}",
        {},
        "its __meta__ is not JSON",
        id="nested too deep for JSON",
    ),
    pytest.param(
        _softmax("numpy", x=json.loads('{"__list__": [' * 70 + "1" + "]}" * 70)),
        {},
        "is nested deeper than the suite writes",
        id="nested deeper than the suite writes",
    ),
    pytest.param(
        _softmax("numpy"), {"args|x": np.array(["a", "b"])}, "its entry 'args|x' is a <U1 array", id="strings"
    ),
    pytest.param(
        {
            "impl": "numpy",
            "dtype": "float64",
            "check": "softmax_rows_sum_to_one",
            "args": {"__dict__": {"x": _X, "axis": "a"}},
        },
        {},
        "its field 'args/axis' is str 'a', expected an integer (check softmax_rows_sum_to_one's argument)",
        id="argument of the wrong type",
    ),
    pytest.param(_softmax("numpy") | {"check": "no_such_check"}, {}, "names check 'no_such_check'", id="unknown check"),
    pytest.param(_softmax("numpy") | {"dtype": "float8"}, {}, "its dtype 'float8' is not one", id="unknown dtype"),
]


@pytest.mark.parametrize(("meta", "arrays", "named"), _CRAFTED)
def test_every_field_of_a_replay_file_is_checked_before_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], meta: Any, arrays: dict, named: str
) -> None:
    path = _replay_file(tmp_path / "crafted.npz", meta, **arrays)
    assert main(["replay", str(path)]) == 4
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and str(path) in err and named in err, err
    assert "Traceback" not in err and "replaying" not in out, out + err


def test_meta_that_is_not_a_string_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "crafted.npz"
    np.savez(path, __meta__=np.zeros(3))
    assert main(["replay", str(path)]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its __meta__ is not a JSON string but a float64 array of shape (3,)" in err, err


def test_a_pickled_array_in_a_replay_file_is_never_unpickled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = tmp_path / "canary"
    crafted = np.empty(1, dtype=object)
    crafted[0] = _Canary(flag)
    path = tmp_path / "crafted.npz"
    np.savez(path, __meta__=np.array(json.dumps(_softmax("numpy"))), **{"args|x": crafted})  # pickled by numpy
    assert main(["replay", str(path)]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its entry 'args|x' is not an array of booleans or numbers" in err, err
    assert not flag.exists(), "a pickle in a replay file was loaded"
