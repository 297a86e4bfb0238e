"""Code that is not ours keeps its own array type: dtypes and devices are judged by meaning, not by spelling, and a
tensor that shares the memory of the NumPy array it was built from fails the contract by name.

``foreign_impl.py`` holds the stand-ins: the NumPy built-in's arithmetic inside a tensor type whose dtypes print as
``dtypes.double`` / ``dtypes.float`` and whose device is ``"CPU"`` (declared ``"cpu"``), and the same with a
``from_numpy`` that keeps the caller's array. And where the contract asks for a refusal (Eq. (3) at step 0 under
``step_zero="raise"``, a negative step), any exception is one, named in the report.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _aiayn_check import aiayn_check

from aiayn.conformance.checks import training as T
from aiayn.conformance.equations import RECORDS
from aiayn.conformance.run.harness import ConformanceFailure, Stats, contract_dtype_name, current_stats, same_device
from aiayn.implementations.numpy_impl import NumpyImplementation

HERE = Path(__file__).resolve().parent


def _check(tmp_path: Path, spec: str, workers: int = 0) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    args = [spec, f"--workers={workers}", "--profile=smoke", f"--report={tmp_path}"]
    proc = aiayn_check(tmp_path, *args, AIAYN_CACHE=str(tmp_path / "cache"))
    name = {"foreign_impl:Foreign": "foreign-arrays", "foreign_impl:Aliasing": "aliasing-arrays"}[spec]
    return proc, json.loads((tmp_path / f"conformance-{name}.json").read_text(encoding="utf-8"))


def test_foreign_dtype_names_and_device_spelling_pass_every_equation(tmp_path: Path) -> None:
    proc, data = _check(tmp_path, "foreign_impl:Foreign")
    out = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}"
    assert data["verdict"] == "PASS", out
    equations = {r["equation"] for r in data["rows"] if r["status"] == "pass"}
    assert len(equations) == len(RECORDS) + 1, f"every equation and the contract pass: {sorted(equations)}"
    backward = {r["equation"] for r in data["rows"] if r["direction"] == "backward" and r["status"] == "pass"}
    with_backward = {name for name, r in RECORDS.items() if r.backward is not None}
    assert backward == with_backward, f"every equation with a backward pass passes its gradients: {sorted(backward)}"


def test_a_tensor_that_shares_its_numpy_array_fails_the_contract_by_name_at_once(tmp_path: Path) -> None:
    """Under two workers: the failure is printed as it arrives, before the run's end, and the end-of-run table says
    why the contract row failed."""
    proc, data = _check(tmp_path, "foreign_impl:Aliasing", workers=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    failing = [r for r in data["rows"] if r["status"] == "fail"]
    assert [(r["equation"], r["failed_tests"]) for r in failing] == [("contract", ["test_from_numpy_copies_its_input"])]
    said = out.find("aiayn: FAILED conformance/test_contract.py::test_from_numpy_copies_its_input")
    table = out.find("aiayn conformance: per equation")
    assert 0 <= said < table, f"the failure was not printed before the run ended:\n{out[-3000:]}"
    row = next(line for line in out[table:].splitlines() if line.strip().startswith("the plug-in contract"))
    assert "from_numpy shares the input's memory" in row, row


@pytest.mark.parametrize(
    ("native", "name"),
    [
        (np.dtype(np.float32), "float32"),
        (np.float64, "float64"),
        ("torch.bfloat16", "bfloat16"),  # a printed name read as text: after its last dot
        ("float", None),  # np.dtype("float") would be float64: a string is never given to NumPy
        ("dtypes.double", None),  # a library's own name: the values decide alone
    ],
)
def test_a_native_dtype_is_named_by_meaning(native: Any, name: str | None) -> None:
    assert contract_dtype_name(native) == name


@pytest.mark.parametrize(
    ("native", "declared", "same"),
    [
        ("CPU", "cpu", True),
        ("cuda:0", "cuda", True),
        ("cuda", "cuda:0", True),
        ("TFRT_CPU_0", "cpu", True),
        ("cuda:1", "cuda:0", False),
        ("cpu", "cuda", False),
        ("cudnn", "cuda", False),
    ],
)
def test_a_device_is_compared_by_meaning(native: str, declared: str, same: bool) -> None:
    assert same_device(native, declared) is same


class _PythonSchedule(NumpyImplementation):
    """Eq. (3) as plain Python: step 0 is refused by Python's own ``0 ** -0.5`` (ZeroDivisionError), a negative step
    by ``math.sqrt`` of a negative number (ValueError would be the contract's own; this is a ``TypeError``)."""

    name = "python-schedule"

    def __init__(self) -> None:
        super().__init__(policies={"step_zero": "raise"})

    def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
        if step < 0:
            raise TypeError(f"step {step} is not a count")
        return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def test_a_refusal_by_any_exception_passes_and_is_named() -> None:
    impl = _PythonSchedule()
    stats = Stats()
    token = current_stats().set(stats)
    try:
        T.lrate_at_step_zero_follows_the_declared_policy(impl, "float64", d_model=512, warmup_steps=4000)
    finally:
        current_stats().reset(token)
    assert stats.notes == {"lrate(0) refused by ZeroDivisionError", "lrate(a negative step) refused by TypeError"}


def test_a_schedule_that_does_not_refuse_still_fails() -> None:
    class Accepts(_PythonSchedule):
        def lrate(self, step: int, d_model: int, warmup_steps: int) -> float:
            return 0.0 if step <= 0 else super().lrate(step, d_model, warmup_steps)

    with pytest.raises(ConformanceFailure, match="expected a refusal"):
        T.lrate_at_step_zero_follows_the_declared_policy(Accepts(), "float64", d_model=512, warmup_steps=4000)
