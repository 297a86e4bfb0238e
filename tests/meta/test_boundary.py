"""The judge apart from what it judges: the implementation runs in a process of its own
(``conformance/run/boundary.py``).

End to end: an implementation whose import replaces aiayn's comparison, or the oracle, with one that accepts its wrong
softmax still fails (in ``aiayn check`` with and without workers, and in ``pytest --pyargs aiayn.conformance``), where
the same patch in aiayn's own process (``--in-process``, the control) turns it into a pass; one that sets
flush-to-zero at import gets one line that says so and a verdict on its own arithmetic; a process that ends or hangs
inside a call fails that check and the run goes on, without workers too.

Below: what crosses the boundary keeps its type (tuples, sets, NumPy scalars, the contract's ``Scope``), what the
implementation raises crosses by type, and a message that does not follow the format is refused, field by field.
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
from _aiayn_check import HERE, aiayn_check

from aiayn.conformance.run import boundary
from aiayn.implementations.protocol import Scope, Unsupported

pytestmark = pytest.mark.slow  # make test-slow (CI's .ci/run runs it): minutes, not seconds

# the agreement test of softmax alone ("test_softmax" but none of its property tests "test_softmax_..."): the one the
# patches below target
_AGREEMENT = "test_softmax and not test_softmax_"

_IDENTITY = (
    "from aiayn.implementations.numpy_impl import NumpyImplementation\n"
    "class X(NumpyImplementation):\n"
    "    name = 'identity-softmax'\n"
    "    def softmax(self, x, axis=-1):\n"
    "        return x.copy()\n"
)

_PATCHES = {
    # the comparison, told that the implementation's answer is the oracle's: it still counts the elements it compares
    "the comparison": (
        "import aiayn.conformance.run.comparison as h\n_compare = h.compare\n"
        "h.compare = lambda case, got, expected, budget, **kw: _compare(case, expected, expected, budget, **kw)\n"
    ),
    "the oracle": "import aiayn.reference.attention as a\na.softmax = lambda x, axis=-1: x\n",
}


def _verdict(folder: Path) -> str:
    return json.loads((folder / "conformance-identity-softmax.json").read_text(encoding="utf-8"))["verdict"]


@pytest.mark.parametrize("patched", list(_PATCHES))
def test_a_patch_of_the_judge_at_import_cannot_turn_a_wrong_softmax_into_a_pass(tmp_path: Path, patched: str) -> None:
    """softmax(x) = x, with the comparison (or the oracle) replaced at import by one that accepts it: in its own
    process the patch changes nothing aiayn judges with (exit 1, FAIL); in aiayn's process (``--in-process``, the
    control that shows the patch is real) the same code passes, and its report says that it was not isolated."""
    (tmp_path / "patches_the_judge.py").write_text(_PATCHES[patched] + _IDENTITY, encoding="utf-8")
    common = ["patches_the_judge:X", "--profile=smoke", "--dtype=float64", "-k", _AGREEMENT]
    # workers or none (the comparison's patch; the oracle's without workers), and the control
    modes = [["--workers=0"], ["--workers=2"]][: 2 if patched == "the comparison" else 1]
    for mode in [*modes, ["--workers=0", "--in-process"]]:
        report = tmp_path / "-".join(m.strip("-") for m in mode)
        proc = aiayn_check(tmp_path, *common, *mode, f"--report={report}", AIAYN_FAILURES=str(tmp_path / "f"))
        out = proc.stdout + proc.stderr
        if "--in-process" in mode:
            assert proc.returncode == 0, f"the control: the patch works in aiayn's process ({mode}):\n{out[-3000:]}"
            markdown = (report / "conformance-identity-softmax.md").read_text(encoding="utf-8")
            assert _verdict(report) == "PASS" and "(not isolated: --in-process)" in markdown, markdown[:2000]
        else:
            assert proc.returncode == 1, f"exit {proc.returncode} with {mode}:\n{out[-3000:]}"
            assert _verdict(report).startswith("FAIL"), _verdict(report)


def test_a_patch_of_the_judge_fails_under_pytest_pyargs_too(tmp_path: Path) -> None:
    """``pytest --pyargs aiayn.conformance --impl X``, the plug-in's other door: the same FAIL."""
    (tmp_path / "patches_the_judge.py").write_text(_PATCHES["the comparison"] + _IDENTITY, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "AIAYN_"))}
    env |= {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE)]), "AIAYN_FAILURES": str(tmp_path / "f")}
    command = [sys.executable, "-m", "pytest", "--pyargs", "aiayn.conformance", "--impl=patches_the_judge:X"]
    command += ["-p", "no:cacheprovider", "--aiayn-profile=smoke", "--dtype=float64", "-k", _AGREEMENT, "-q"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    assert "failed" in out.splitlines()[-1], out[-3000:]


def test_a_built_in_passes_behind_the_boundary_forward_backward_and_decoding(tmp_path: Path) -> None:
    """The torch built-in through the boundary: its gradients by autograd in its own process, its decoding caches kept
    there as handles, its beam search's answer by value; every row passes, and the report says it ran isolated."""
    pytest.importorskip("torch", reason="the torch built-in (make test installs it)")
    keyword = "multi_head_attention or cached_decoding or reordered_cache or beam_search"
    proc = aiayn_check(
        tmp_path, "torch", "--profile=smoke", "--workers=0", "--dtype=float32", "-k", keyword, f"--report={tmp_path}"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-3000:]}"
    data = json.loads((tmp_path / "conformance-torch.json").read_text(encoding="utf-8"))
    rows = {(r["equation"], r["direction"]): r["status"] for r in data["rows"] if r["status"] != "not run"}
    assert data["isolated"] is True and data["isolation"] == "in a process of its own", data["isolation"]
    for row in [("multi_head_attention", "forward"), ("multi_head_attention", "backward")]:
        assert rows.get(row) == "pass", rows
    assert rows.get(("transformer_forward", "decode")) == "pass", rows


def test_an_implementation_that_flushes_subnormals_gets_one_line_and_a_verdict(tmp_path: Path) -> None:
    """FTZ/DAZ set by a library the implementation imports (PyTorch's set_flush_denormal here; a library built with
    -ffast-math does it on load) flushes only the implementation's own process: one line names it and the import, and
    the run ends in a verdict on its arithmetic (a report written, exit 0 or 1), never thousands of lines of Hypothesis
    refusing to draw subnormals. Without the boundary (``--in-process``) it cannot be judged: exit 4, one line."""
    pytest.importorskip("torch", reason="PyTorch sets the flush modes for this test (make test installs it)")
    (tmp_path / "flushing_library.py").write_text("import torch\ntorch.set_flush_denormal(True)\n", encoding="utf-8")
    (tmp_path / "flushes_at_load.py").write_text(
        "import flushing_library\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "class X(NumpyImplementation):\n    name = 'flushing'\n",
        encoding="utf-8",
    )
    common = ["flushes_at_load:X", "--profile=smoke", "--workers=0", "--dtype=float64", "-k", "softmax"]
    proc = aiayn_check(tmp_path, *common, f"--report={tmp_path}", AIAYN_FAILURES=str(tmp_path / "f"))
    out = proc.stdout + proc.stderr
    line = "your implementation flushes subnormals process-wide: FTZ and DAZ set by the import of flushing_library"
    assert proc.returncode in (0, 1), f"exit {proc.returncode}:\n{out[-3000:]}"
    assert sum(line in x for x in out.splitlines()) == 1, out[-3000:]
    assert len(out.splitlines()) < 60, out[-3000:]
    data = json.loads((tmp_path / "conformance-flushing.json").read_text(encoding="utf-8"))
    assert data["verdict"].startswith(("PASS", "FAIL")) and line in data["isolation"], data["verdict"]
    proc = aiayn_check(tmp_path, *common, "--in-process")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4 and "flushes subnormals process-wide" in out and len(out.splitlines()) < 20, out


_ENDS_IN_A_CALL = {
    "os._exit(0)": "import os\n        os._exit(0)",
    "SIGSEGV": "import os, signal\n        os.kill(os.getpid(), signal.SIGSEGV)",
    "a hang": "import time\n        time.sleep(600)",
}


@pytest.mark.parametrize("how", list(_ENDS_IN_A_CALL))
def test_a_process_that_ends_or_hangs_in_a_call_fails_that_check_and_the_run_goes_on(tmp_path: Path, how: str) -> None:
    """Without workers (``--workers 0``) too: the call in flight fails with how the implementation's process ended (or
    its time limit), its replay file is written, the other equations are checked, the report is written, exit 1."""
    (tmp_path / "ends_in_a_call.py").write_text(
        "from aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "class X(NumpyImplementation):\n    name = 'ends-in-softmax'\n"
        f"    def softmax(self, x, axis=-1):\n        {_ENDS_IN_A_CALL[how]}\n",
        encoding="utf-8",
    )
    proc = aiayn_check(
        tmp_path,
        "ends_in_a_call:X",
        "--profile=smoke",
        "--workers=0",
        "--timeout=3",
        "--dtype=float64",
        "-k",
        "test_softmax or test_layer_norm",
        f"--report={tmp_path}",
        AIAYN_FAILURES=str(tmp_path / "f"),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    rows = json.loads((tmp_path / "conformance-ends-in-softmax.json").read_text(encoding="utf-8"))["rows"]
    status = {(r["equation"], r["direction"]): r["status"] for r in rows if r["dtype"] == "float64"}
    assert status[("softmax", "forward")] == "fail" and status[("layer_norm", "forward")] == "pass", status
    said = "did not return within 3 s" if how == "a hang" else "the implementation's process ended"
    assert said in out and "aiayn replay" in out, out[-3000:]


# --------------------------------------------------------------------------------------------
# what crosses, and how


def _round_trip(value: Any) -> Any:
    buffers: list[memoryview] = []

    def refuse(v: Any) -> Any:
        raise TypeError(type(v).__name__)

    tree = boundary._encode(value, buffers, refuse, by_value=True)
    tree = json.loads(json.dumps(tree))
    return boundary._decode(tree, [bytes(b) for b in buffers], lambda node: pytest.fail("no handles here"))


def test_what_crosses_by_value_keeps_its_type() -> None:
    """A tuple stays a tuple, a frozenset a frozenset, a NumPy integer a NumPy integer (a beam id the contract
    allows), a bool a bool, a string of digits a string: the judge sees the types the implementation returned."""
    value = {
        "ids": [1, np.int64(2), True, "3", 2.9],
        "pair": ([1, 2], np.float32(0.5)),
        "names": frozenset({"softmax"}),
        "scope": Scope(masks=("causal",), max_length=8),
        "array": np.arange(6, dtype=np.float16).reshape(2, 3),
        "nan": float("nan"),
    }
    back = _round_trip(value)
    assert [type(x) for x in back["ids"]] == [int, np.int64, bool, str, float]
    assert type(back["pair"]) is tuple and type(back["pair"][1]) is np.float32 and back["pair"][1] == 0.5
    assert back["names"] == frozenset({"softmax"}) and back["scope"] == value["scope"]
    assert back["array"].dtype == np.float16 and np.array_equal(back["array"], value["array"])
    assert np.isnan(back["nan"])


@pytest.mark.parametrize(
    ("tree", "buffers", "message"),
    [
        ({"$": "array", "dtype": "|O", "shape": [1], "b": 0}, [b"\0" * 8], "dtype object"),
        ({"$": "array", "dtype": "<f8", "shape": [2], "b": 0}, [b"\0" * 8], "in 8 bytes"),
        ({"$": "array", "dtype": "<f8", "shape": [-1], "b": 0}, [b"\0" * 8], "shape [-1]"),
        ({"$": "array", "dtype": "<f8", "shape": [1], "b": 3}, [b"\0" * 8], "buffer 3"),
        ({"$": "pickle", "v": "..."}, [], "tagged 'pickle'"),
        ({"$": "scope", "v": {"evil": 1}}, [], "a Scope with fields"),
        ({"$": "map", "v": [[[1], 2]]}, [], "unhashable"),
    ],
)
def test_a_message_that_does_not_follow_the_format_is_refused(tree: Any, buffers: list[bytes], message: str) -> None:
    with pytest.raises(boundary.Garbled, match=re.escape(message)):
        boundary._decode(tree, buffers, lambda node: None)


class _LibraryError(Exception):
    pass


class _Raises:
    """The NumPy built-in, each method raising one kind of exception."""

    def __init__(self) -> None:
        from aiayn.implementations.numpy_impl import NumpyImplementation

        self._impl = NumpyImplementation()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._impl, name)


def test_what_the_implementation_raises_crosses_by_type() -> None:
    """NotImplementedError is NotImplementedError (a declined gradient), Unsupported is the contract's Unsupported
    (an input outside the implementation's scope), SystemExit is SystemExit (a check's failure), and an exception of
    the implementation's own keeps its name."""
    cases = {
        NotImplementedError("no vjp"): NotImplementedError,
        Unsupported("n > 512"): Unsupported,
        SystemExit(3): SystemExit,
        _LibraryError("bad shape"): None,
    }
    for raised, expected in cases.items():
        back = boundary._raised(boundary._exception(raised)["raised"])
        if expected is None:
            assert type(back).__name__ == "_LibraryError" and str(back) == "bad shape", back
        else:
            assert type(back) is expected, back
    assert boundary._raised(boundary._exception(SystemExit(3))["raised"]).code == 3


def test_a_handle_of_an_ended_process_is_refused_by_name() -> None:
    """The implementation's process ends (here: the suite ends it, as after a hang); a native array it made, handed
    back, fails by name, and the next call starts a new process; a native array handed to another implementation's
    process fails by name too."""
    remote = boundary.load("numpy")
    try:
        x = remote.from_numpy(np.ones((2, 3)), "float64")
        assert isinstance(x, boundary.Native) and x.shape == (2, 3) and str(x.dtype) == "float64"
        remote._end()
        with pytest.raises(boundary.ProcessEnded, match="made by an earlier process"):
            remote.softmax(x, -1)
        y = remote.from_numpy(np.zeros((1, 2)), "float64")
        assert np.array_equal(remote.to_numpy(remote.softmax(y, -1)), np.full((1, 2), 0.5))
        other = boundary.load("numpy")  # a handle means something only to the process that made it
        try:
            with pytest.raises(TypeError, match="made by another implementation's process"):
                other.softmax(y, -1)
        finally:
            other._close()
    finally:
        remote._close()
