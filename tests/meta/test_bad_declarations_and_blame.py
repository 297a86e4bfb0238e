"""Declarations are validated, and blame lands where it belongs.

- a declaration that names nothing (a policy key, a known deviation, a declared inconclusive row) is a contract
  problem that names the closest valid name;
- a replay file the suite cannot use, or one whose dtype the implementation does not declare, is a usage error
  (exit 4, one line), never a failure of the implementation;
- ``from_numpy``/``to_numpy`` returning the wrong thing is named as such;
- an implementation that ends the process inside an equation (``sys.exit``, ``os._exit`` with code 0) fails that
  check, with its replay file: in worker processes for both, in the pytest process itself for ``sys.exit``.

The implementations below are loaded by the suite's subprocesses as ``test_bad_declarations_and_blame:NAME`` (this
folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.conformance.run.declarations import declaration_problems
from aiayn.implementations.examples.my_attention import MyAttention
from aiayn.implementations.protocol import Scope, contract_problems

TESTS = Path(__file__).resolve().parent
_POISON = "attention_poison_at_masked_positions_changes_nothing"


# --------------------------------------------------------------------------------------------
# implementations


class Float32Softmax(MyAttention):
    """Softmax checked in float32 only (its scope); scaled dot-product attention in both dtypes."""

    name = "float32-softmax"
    scope = {"softmax": Scope(dtypes=("float32",))}


class DeviationTypo(MyAttention):
    """A known deviation that names no test: a letter missing."""

    name = "deviation-typo"
    known_deviations = {"softmax_rows_sum_to_on": "a typo of softmax_rows_sum_to_one"}


class SysExit(MyAttention):
    name = "sys-exit"

    def softmax(self, x: Any, axis: int = -1) -> Any:
        sys.exit(3)


class OsExitZero(MyAttention):
    name = "os-exit-zero"

    def softmax(self, x: Any, axis: int = -1) -> Any:
        os._exit(0)


class FromNumpyNone(MyAttention):
    name = "from-numpy-none"

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        return None


class FromNumpyList(MyAttention):
    name = "from-numpy-list"

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        return array.tolist()


class ToNumpyNone(MyAttention):
    name = "to-numpy-none"

    def to_numpy(self, x: Any) -> Any:
        return None


class ToNumpyFlattens(MyAttention):
    name = "to-numpy-flattens"

    def to_numpy(self, x: Any) -> np.ndarray:
        return super().to_numpy(x).reshape(-1)


# --------------------------------------------------------------------------------------------
# declarations


def _declaring(**members: Any) -> MyAttention:
    return type("Declaring", (MyAttention,), members)()


_BAD_DECLARATIONS = [
    pytest.param(
        {"policies": {**MyAttention.policies, "label_smoothing": "K-2", "padding_idx": 3}},
        "policies: unknown key 'padding_idx' (did you mean 'padding_id'?)",
        id="policy key",
    ),
    pytest.param(
        {"policies": {**MyAttention.policies, "beam_search": {"early_stop": "soon"}}},
        "policies['beam_search']['early_stop']: expected one of ('bound', 'full', 'none'), got 'soon'",
        id="beam search choice",
    ),
    pytest.param(
        {"known_deviations": {"softmax_rows_sum_to_on": "why"}},
        "known_deviations: 'softmax_rows_sum_to_on' names no test of the suite "
        "(did you mean 'softmax_rows_sum_to_one'?)",
        id="deviation name",
    ),
    pytest.param(
        {"known_deviations": {f"{_POISON}[hug]@float32": "why"}},
        f"known_deviations: '{_POISON}[hug]@float32': test {_POISON} is not run with parameters [hug] "
        "(did you mean 'huge'?)",
        id="deviation parameters",
    ),
    pytest.param(
        {"known_deviations": {_POISON: "why"}},
        f"known_deviations: '{_POISON}': test {_POISON} runs once per parameter set; name one: [huge], [nan_keys]",
        id="deviation without its parameters",
    ),
    pytest.param(
        {"known_deviations": {"softmax[huge]": "why"}},
        "known_deviations: 'softmax[huge]': test softmax takes no parameters; declare it as 'softmax'",
        id="deviation with parameters a test does not take",
    ),
    pytest.param(
        {"known_deviations": {"positional_encoding_on_fixed_inputs[length 50, d_model 61]": "why"}},
        "known_deviations: 'positional_encoding_on_fixed_inputs[length 50, d_model 61]': test "
        "positional_encoding_on_fixed_inputs is not run with parameters [length 50, d_model 61] "
        "(did you mean 'length 50, d_model 16'?)",
        id="fixed case",
    ),
    pytest.param(
        {"known_deviations": {"softmax@flaot32": "why"}},
        "known_deviations: 'softmax@flaot32': 'flaot32' is not one of",
        id="deviation dtype",
    ),
    pytest.param(
        {"known_deviations": {"softmax": ""}},
        "known_deviations['softmax']: expected a non-empty reason (str), got ''",
        id="deviation without a reason",
    ),
    pytest.param(
        {"declared_inconclusive": {"layer_nrom@float32": "why"}},
        "declared_inconclusive: 'layer_nrom@float32' names no equation (did you mean 'layer_norm'?)",
        id="inconclusive equation",
    ),
    pytest.param(
        {"declared_inconclusive": {"layer_norm@float23": "why"}},
        "declared_inconclusive: 'layer_norm@float23': 'float23' is not one of",
        id="inconclusive dtype",
    ),
    pytest.param(
        {"declared_inconclusive": ["layer_norm"]},
        "declared_inconclusive: expected a mapping of 'equation' or 'equation@dtype' -> reason (str)",
        id="inconclusive not a mapping",
    ),
]


@pytest.mark.parametrize(("members", "problem"), _BAD_DECLARATIONS)
def test_a_declaration_that_names_nothing_is_a_contract_problem_with_the_closest_name(
    members: dict[str, Any], problem: str
) -> None:
    from aiayn.conformance.run.plugin import deviation_names

    problems = contract_problems(_declaring(**members)) + declaration_problems(_declaring(**members), deviation_names())
    assert any(p.startswith(problem) for p in problems), problems
    assert len(problems) == 1, problems


def test_valid_declarations_of_every_form_are_no_problem() -> None:
    from aiayn.conformance.run.plugin import deviation_names

    impl = _declaring(
        policies={
            **MyAttention.policies,
            "label_smoothing": "K-2",
            "padding_id": 3,
            "flush_subnormals": {},
            "batch_invariant": True,  # the declared properties are keys the suite reads
            "deterministic": False,
        },
        known_deviations={
            "softmax": "why",
            "softmax_rows_sum_to_one@float32": "why",
            f"{_POISON}[huge]": "why",
            f"{_POISON}[nan_keys]@float64": "why",
            "transformer_forward_on_fixed_inputs[padding: src [5, 3], tgt [4, 2]]@float32": "brackets inside",
        },
        declared_inconclusive={"layer_norm": "why", "softmax@float32": "why", "contract": "why"},
    )
    assert contract_problems(impl) + declaration_problems(impl, deviation_names()) == []


def _aiayn(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        "AIAYN_FAILURES": str(tmp_path / "failures"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "aiayn", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _check(tmp_path: Path, cls: str, workers: int, keyword: str) -> subprocess.CompletedProcess[str]:
    return _aiayn(
        tmp_path,
        "check",
        f"test_bad_declarations_and_blame:{cls}",
        f"--workers={workers}",
        "--profile=smoke",
        "--dtype=float64",
        "-k",
        keyword,
    )


def test_a_known_deviation_naming_no_test_fails_the_contract_check(tmp_path: Path) -> None:
    proc = _check(tmp_path, "DeviationTypo", 0, "declarations_follow_the_contract")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    assert "FAILED" in out and "test_declarations_follow_the_contract" in out, out[-3000:]
    assert "did you mean 'softmax_rows_sum_to_one'?" in out, out[-3000:]


# --------------------------------------------------------------------------------------------
# replay misuse: exit 4 and one line


def _replay_file(tmp_path: Path, dtype: str, name: str = "case.npz") -> Path:
    from aiayn.conformance.run.failures import save_case
    from aiayn.conformance.run.harness import Case
    from aiayn.implementations.numpy_impl import NumpyImplementation

    case = Case(NumpyImplementation(), dtype, "softmax", "softmax", {"x": np.ones((2, 3)), "axis": -1}, "agreement")
    return save_case(case, tmp_path / name)


def _npz(tmp_path: Path, **entries: Any) -> Path:
    path = tmp_path / "made.npz"
    with open(path, "wb") as handle:
        np.savez(handle, **entries)
    return path


_REPLAY_MISUSE = [
    pytest.param(
        lambda t: _replay_file(t, "float16"),
        ["--impl", "numpy"],
        "the check ran in float16, which implementation 'numpy' does not declare (it declares float64, float32)",
        id="dtype not declared",
    ),
    pytest.param(
        lambda t: _replay_file(t, "float64"),
        ["--impl", "test_bad_declarations_and_blame:Float32Softmax"],
        "the check ran in float64; implementation 'test_bad_declarations_and_blame:Float32Softmax' declares softmax "
        "only in float32 (its scope)",
        id="dtype outside the equation's scope",
    ),
    pytest.param(
        lambda t: _replay_file(t, "float8"),
        [],
        "its dtype 'float8' is not one of the contract's dtypes",
        id="dtype not of the contract",
    ),
    pytest.param(
        lambda t: _npz(t, __meta__=np.array(json.dumps(["impl", "dtype"]))),
        [],
        "its __meta__ is not a JSON object but list",
        id="meta a list",
    ),
    pytest.param(
        lambda t: _npz(t, __meta__=np.array("{not json")),
        [],
        "its __meta__ is not JSON",
        id="meta not JSON",
    ),
    pytest.param(
        lambda t: _npz(t, __meta__=np.array(json.dumps({"impl": "numpy", "dtype": "float32"}))),
        [],
        "its __meta__ lacks the string field(s) check",
        id="meta without check",
    ),
    pytest.param(
        lambda t: _npz(t, x=np.zeros(3)),
        [],
        "the archive has no __meta__ entry",
        id="no meta",
    ),
    pytest.param(
        lambda t: (t / "notes.txt", (t / "notes.txt").write_text("a text file\n"))[0],
        [],
        "not a replay file written by the conformance suite (not an .npz archive)",
        id="text file",
    ),
]


@pytest.mark.parametrize(("make", "extra", "line"), _REPLAY_MISUSE)
def test_a_replay_file_the_implementation_cannot_run_is_a_usage_error_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make: Any,
    extra: list,
    line: str,
) -> None:
    from aiayn.cli import main

    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))
    monkeypatch.syspath_prepend(str(TESTS))
    path = make(tmp_path)
    status = main(["replay", str(path), *extra])
    out, err = capsys.readouterr()
    assert status == 4, f"exit {status}:\n{out}{err}"
    assert err.count("\n") == 1 and line in err and str(path) in err, err
    assert "Traceback" not in out + err and "allow_pickle" not in err
    assert not (tmp_path / "failures").exists(), "a usage error wrote a failure file"


def test_the_replay_command_of_a_text_file_prints_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("a text file\n")
    proc = _aiayn(tmp_path, "replay", "notes.txt")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "not an .npz archive" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------
# the boundary named


@pytest.mark.parametrize(
    ("cls", "named"),
    [
        (FromNumpyNone, "from_numpy(<float64 (2, 3)>, 'float64') returned None, expected a native array"),
        (FromNumpyList, "from_numpy(<float64 (2, 3)>, 'float64') returned list [[1.0, 1.0, 1.0]"),
        (ToNumpyNone, "to_numpy(x) returned None, expected a numpy.ndarray"),
        (ToNumpyFlattens, "to_numpy(x) returned shape (6,) for what from_numpy made of a (2, 3) array"),
    ],
)
def test_from_numpy_or_to_numpy_returning_the_wrong_thing_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type, named: str
) -> None:
    from aiayn.conformance.checks import load_all
    from aiayn.conformance.run.harness import CHECKS, ConformanceFailure

    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path))
    load_all()
    with pytest.raises(ConformanceFailure) as info:
        CHECKS["softmax"](cls(), "float64", x=np.ones((2, 3)), axis=-1)
    message = str(info.value)
    assert named in message, message
    assert "AttributeError" not in message and "replay: aiayn replay" in message, message


# --------------------------------------------------------------------------------------------
# an implementation that ends the process


def test_sys_exit_in_this_process_fails_the_check_with_its_replay_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn.conformance.checks import load_all
    from aiayn.conformance.run.harness import CHECKS, ConformanceFailure

    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path))
    load_all()
    with pytest.raises(ConformanceFailure) as info:
        CHECKS["softmax"](SysExit(), "float64", x=np.ones((2, 3)), axis=-1)
    message = str(info.value)
    assert "sys-exit.softmax(<float64 (2, 3)>, -1) tried to end the process (SystemExit(3))" in message, message
    replay = re.search(r"replay: aiayn replay (\S+)", message)
    assert replay and Path(replay.group(1)).is_file(), message


_ONE_TEST = "softmax_on_fixed_inputs and axis"  # one fixed case of softmax: one call that ends the process


@pytest.mark.parametrize(
    ("cls", "workers", "why"),
    [
        (SysExit, 0, "tried to end the process (SystemExit(3))"),
        (SysExit, 1, "tried to end the process (SystemExit(3))"),
        (OsExitZero, 1, "(called twice): the implementation's process ended (exit 0) during softmax"),
        (OsExitZero, 0, "(called twice): the implementation's process ended (exit 0) during softmax"),
    ],
    ids=["sys.exit, no workers", "sys.exit, a worker", "os._exit(0), a worker", "os._exit(0), no workers"],
)
def test_an_implementation_that_ends_the_process_fails_that_check_with_its_replay_file(
    tmp_path: Path, cls: type, workers: int, why: str
) -> None:
    proc = _check(tmp_path, cls.__name__, workers, _ONE_TEST)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    assert re.search(r"FAILED \S*test_softmax_on_fixed_inputs\[", out) and "1 failed" in out, out[-3000:]
    assert why in out, out[-3000:]
    replay = re.search(r"replay: aiayn replay (\S+\.npz)", out)
    assert replay and Path(replay.group(1)).is_file(), out[-3000:]
