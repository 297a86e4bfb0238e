"""Everything a plug-in returns is judged by type before value, and nothing it returns is coerced into a pass.

Each broken implementation below is the NumPy built-in with one answer of the contract made wrong the way a careless
or hostile plug-in makes it: gradients keyed by no argument or by nothing at all, beam-search ids that are strings,
floats or bools or lie outside the vocabulary, a score that is not a number, decoding results that are not the
contract's pair, caches that are None, a process that ends (or hangs) inside a backward or decoding check. Every one
ends in a failure (or "not provided" where the contract says so), never a pass; the end-to-end runs show the exit
status and the row each failure is filed under.

The implementations are loaded by the suite's subprocesses as ``test_untrusted_plugins:NAME`` (this folder on
``PYTHONPATH``, ``_aiayn_check``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _aiayn_check import HERE, aiayn_check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.conformance.checks import decoding as C
from aiayn.conformance.checks import load_all
from aiayn.conformance.inputs import fixed as F
from aiayn.conformance.inputs import strategies as S
from aiayn.conformance.report.results import Outcome, Status, TestResult
from aiayn.conformance.report.rows import _row
from aiayn.conformance.run.harness import CHECKS, BrokenContract, ConformanceFailure
from aiayn.implementations.numpy_impl import NumpyImplementation

load_all()

# --------------------------------------------------------------------------------------------
# gradients: the implementation's own vjp


class EmptyVjp(NumpyImplementation):
    """A vjp that returns an empty mapping: it claims to differentiate and gives nothing."""

    name = "empty-vjp"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Any]:
        return {}


class MisnamedVjp(NumpyImplementation):
    """A vjp whose keys carry a "d" prefix ("dq", "dk", "dv"): names of no argument."""

    name = "misnamed-vjp"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Any]:
        return {f"d{k}": g for k, g in super().vjp(equation, args, d_out).items()}


class IndexedVjp(NumpyImplementation):
    """A vjp keyed by argument position (0, 1, 2) instead of name."""

    name = "indexed-vjp"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[Any, Any]:
        return dict(enumerate(super().vjp(equation, args, d_out).values()))


class ListGradient(NumpyImplementation):
    """A vjp whose gradients are nested Python lists, not native arrays."""

    name = "list-gradient"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Any]:
        return {k: np.asarray(g).tolist() for k, g in super().vjp(equation, args, d_out).items()}


class Float32GradientInFloat64(NumpyImplementation):
    """A vjp whose gradients are float32 arrays in a float64 check."""

    name = "float32-gradient"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Any]:
        return {k: np.asarray(g, np.float32) for k, g in super().vjp(equation, args, d_out).items()}


def _sdpa_gradients(impl: Any) -> None:
    """The fixed backward case of Eq. (1) (``conformance/inputs/fixed.py``), in float64."""
    (case,) = F.cases("scaled_dot_product_attention", "backward")
    CHECKS[case.check](impl, "float64", **case.args)


def test_the_built_ins_gradients_pass_the_fixed_case() -> None:
    _sdpa_gradients(NumpyImplementation())  # the control: what the broken ones change is what fails


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (EmptyVjp, "vjp('scaled_dot_product_attention', ...) returned no gradient of dq, dk, dv (keys: [])"),
        (MisnamedVjp, "have a key 'dq' that names no argument of it ('dq'); its arguments: k, mask, q, v"),
        (IndexedVjp, "have a key 0 of type int: expected an argument name"),
        (ListGradient, "the gradient dq is list, expected a native array"),
        (Float32GradientInFloat64, "returned native dtype float32, expected float64"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_a_vjp_that_gives_no_usable_gradient_fails_by_name(cls: type, message: str) -> None:
    with pytest.raises(ConformanceFailure) as failure:
        _sdpa_gradients(cls())
    assert message in str(failure.value), str(failure.value)


def test_a_row_whose_tests_compared_nothing_is_inconclusive_never_a_pass() -> None:
    """A test that passed without comparing one element (a property over gradients an implementation left out)
    makes no row pass: the row is inconclusive, which fails the run; one test that compared something is a pass."""
    idle = TestResult("x:Y", "softmax", "float64", "test_softmax_gradients", Outcome.PASSED, direction="backward")
    busy = TestResult("x:Y", "softmax", "float64", "test_softmax", Outcome.PASSED, checked=12)
    assert _row("softmax", "float64", [idle], None, "backward").status is Status.INCONCLUSIVE
    assert _row("softmax", "float64", [idle, busy], None, "backward").status is Status.PASS


# --------------------------------------------------------------------------------------------
# the boundary: to_numpy and the dtype_name hook


class ObjectArrays(NumpyImplementation):
    """to_numpy gives object arrays of the values as strings: a float64 cast would parse them back."""

    name = "object-arrays"

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.array([str(v) for v in np.asarray(x).reshape(-1)], dtype=object).reshape(np.shape(x))


class _Lenient(np.ndarray):
    """An ndarray subclass: its own indexing and arithmetic rules."""


class SubclassArrays(NumpyImplementation):
    name = "subclass-arrays"

    def to_numpy(self, x: Any) -> np.ndarray:
        return super().to_numpy(x).view(_Lenient)


class _EqualToAll:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False


class DtypeNameLiar(NumpyImplementation):
    """Results in float32 whatever is asked, and a dtype_name hook whose answer equals every name."""

    name = "dtype-name-liar"

    def softmax(self, x: Any, axis: int = -1) -> Any:
        return np.asarray(super().softmax(x, axis), np.float32)

    def dtype_name(self, native_dtype: Any) -> Any:
        return _EqualToAll()


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (ObjectArrays, "returned an array of dtype object; the contract says float64 for floats"),
        (SubclassArrays, "returned _Lenient"),
        (DtypeNameLiar, "returned _EqualToAll"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_what_crosses_the_boundary_is_checked_by_type(cls: type, message: str) -> None:
    case = F.cases("softmax", "forward")[0]
    CHECKS[case.check](NumpyImplementation(), "float64", **case.args)  # the control
    with pytest.raises(BrokenContract) as failure:
        CHECKS[case.check](cls(), "float64", **case.args)
    assert message in str(failure.value), str(failure.value)


# --------------------------------------------------------------------------------------------
# Adam's answer: a tuple of (param, m, v)


def _adam(transform: Any) -> type:
    """The built-in with its Adam step's answer passed through ``transform(param, m, v)``."""

    class Transformed(NumpyImplementation):
        name = "transformed-adam"

        def adam_step(self, *args: Any) -> Any:
            return transform(*super().adam_step(*args))

    return Transformed


_ADAM = {
    "param": np.array([0.5, -1.0]),
    "grad": np.array([0.1, -0.2]),
    "m": np.array([0.01, 0.0]),
    "v": np.array([1e-4, 0.0]),
    "step": 3,
    "lr": 1e-3,
    "betas": [0.9, 0.98],
    "eps": 1e-9,
}


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        (lambda p, m, v: p, "returned ndarray"),
        (lambda p, m, v: (p, m), "of 2 items, expected a tuple of 3 native arrays (param, m, v)"),
        (lambda p, m, v: (p, m, v.astype(np.float32)), "'s v returned native dtype float32, expected float64"),
        (lambda p, m, v: (p, m, v[:1]), "returned arrays of shapes param (2,), m (2,), v (1,); expected one shape"),
        (lambda p, m, v: (p, m, [float(x) for x in v]), "adam_step(...)'s v is list"),
    ],
    ids=["one-array", "two-arrays", "v-in-float32", "v-cut", "v-a-list"],
)
def test_adams_tuple_is_judged_by_type_before_value(transform: Any, message: str) -> None:
    CHECKS["adam_step"](NumpyImplementation(), "float64", **_ADAM)  # the control
    with pytest.raises(ConformanceFailure) as failure:
        CHECKS["adam_step"](_adam(transform)(), "float64", **_ADAM)
    assert message in str(failure.value), str(failure.value)


def test_an_adam_step_that_changes_between_calls_is_not_deterministic() -> None:
    calls = iter(range(10))
    broken = _adam(lambda p, m, v: (p, m, v + next(calls) * 2.0**-30))
    with pytest.raises(
        ConformanceFailure, match="adam_step is not deterministic: two calls with the same inputs differ in v"
    ):
        CHECKS["adam_step"](broken(), "float64", **_ADAM)


# --------------------------------------------------------------------------------------------
# beam search's answer


def _beam(transform: Any) -> type:
    """The built-in with each (tokens, score) pair of its beam search passed through ``transform(tokens, score,
    vocab)``."""

    class Transformed(NumpyImplementation):
        name = "transformed-beam"

        def beam_search(self, src_tokens: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
            vocab = np.asarray(params["embedding"]).shape[0]
            return [transform(t, s, vocab) for t, s in super().beam_search(src_tokens, params, *args, **kwargs)]

    return Transformed


class StringIds(_beam(lambda t, s, v: ([str(x) for x in t], s))):
    name = "string-ids"


class FloatIds(_beam(lambda t, s, v: ([x + 0.9 for x in t], s))):
    """Ids 2.9 where the search chose 2: int() would truncate them back to a right answer."""

    name = "float-ids"


class BoolIds(_beam(lambda t, s, v: ([x == x for x in t], s))):
    name = "bool-ids"


class IdsOutsideTheVocabulary(_beam(lambda t, s, v: ([t[0] + v, *t[1:]], s))):
    name = "ids-outside-the-vocabulary"


class StringScore(_beam(lambda t, s, v: (t, str(s)))):
    """The score as the string of the right number: float() would parse it back."""

    name = "string-score"


class ArrayScore(_beam(lambda t, s, v: (t, np.array([s])))):
    name = "array-score"


class StringTokens(_beam(lambda t, s, v: ("".join(str(x % 10) for x in t), s))):
    """The tokens as a string of digits: each character int()s to an id."""

    name = "string-tokens"


class NumpyIntIds(_beam(lambda t, s, v: ([np.int64(x) for x in t], np.float64(s)))):
    """NumPy integers and a NumPy float: integers and a real number, as the contract allows."""

    name = "numpy-int-ids"


@settings(max_examples=2, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_beam_search_answers_are_judged_by_type_before_value(data: st.DataObject) -> None:
    """The control passes; every broken answer fails with a message that says what came back."""
    control = NumpyIntIds()
    inputs = data.draw(S.decode_inputs("float64", kind="beam", scope=S.scope(control, "transformer_forward")))
    C.beam_search_finds_the_oracles_hypothesis(control, "float64", **inputs)
    for cls, message in [
        (StringIds, "is str '"),
        (FloatIds, "is float "),
        (BoolIds, "is bool True, expected an int"),
        (IdsOutsideTheVocabulary, "ids in [0, "),
        (StringScore, "score for sentence 0 is str "),
        (ArrayScore, "score for sentence 0 is ndarray "),
        (StringTokens, "tokens for sentence 0 are str "),
    ]:
        with pytest.raises(BrokenContract) as failure:
            C.beam_search_finds_the_oracles_hypothesis(cls(), "float64", **inputs)
        assert message in str(failure.value), (cls.__name__, str(failure.value))


# --------------------------------------------------------------------------------------------
# cached decoding's answers


class DecodeStepList(NumpyImplementation):
    name = "decode-step-list"

    def decode_step(self, *args: Any) -> Any:
        return list(super().decode_step(*args))


class DecodeStepNoneCache(NumpyImplementation):
    name = "decode-step-none-cache"

    def decode_step(self, *args: Any) -> Any:
        return super().decode_step(*args)[0], None


class ReorderNone(NumpyImplementation):
    name = "reorder-none"

    def reorder_cache(self, cache: Any, index: Any) -> Any:
        return None


@settings(max_examples=2, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_decoding_results_are_the_contracts_pair_and_caches_are_never_none(data: st.DataObject) -> None:
    scope = S.scope(NumpyImplementation(), "transformer_forward")
    steps = data.draw(S.decode_inputs("float64", scope=scope))
    reorder = data.draw(S.decode_inputs("float64", kind="reorder", scope=scope))
    C.cached_decoding_equals_the_full_forward(NumpyImplementation(), "float64", **steps)
    C.reordered_cache_equals_the_reordered_prefixes(NumpyImplementation(), "float64", **reorder)
    cached, reordered = C.cached_decoding_equals_the_full_forward, C.reordered_cache_equals_the_reordered_prefixes
    for cls, check, inputs, message in [
        (DecodeStepList, cached, steps, "decode_step returned list, expected a pair"),
        (DecodeStepNoneCache, cached, steps, "decode_step returned None as its cache"),
        (ReorderNone, reordered, reorder, "reorder_cache returned None"),
    ]:
        with pytest.raises(BrokenContract) as failure:
            check(cls(), "float64", **inputs)
        assert message in str(failure.value), (cls.__name__, str(failure.value))


# --------------------------------------------------------------------------------------------
# the contract's rounding probe


class ThroughFloat32(NumpyImplementation):
    """float16 by a cast through float32: two roundings, each to nearest, which is not one."""

    name = "through-float32"
    dtypes = ("float64", "float32", "float16")

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        if dtype == "float16" and array.dtype.kind == "f":
            return array.astype(np.float32).astype(np.float16)
        return super().from_numpy(array, dtype)


def test_a_cast_that_rounds_twice_fails_the_rounding_probe_by_name() -> None:
    """The probe just above a float16 tie (by one float64 ulp) lands on the tie in float32, which then rounds to even,
    down: correct rounding goes up. 2^-60 above the tie would be the tie itself in float64, and pass."""
    from aiayn.conformance.checks import contract
    from aiayn.conformance.test_contract import _rounding_cases

    x = _rounding_cases("float16")
    assert np.nextafter(1 + 2.0**-11, 2.0) in x  # the probe: the float64 right after float16's tie above 1
    contract.from_numpy_rounds_to_nearest_even(NumpyImplementation(), "float32", x=_rounding_cases("float32"))
    with pytest.raises(ConformanceFailure) as failure:
        contract.from_numpy_rounds_to_nearest_even(ThroughFloat32(), "float16", x=x)
    assert "it rounds twice: its values are x rounded to float32, then to float16" in str(failure.value)


# --------------------------------------------------------------------------------------------
# end to end: the exit status, and the row a crash or a hang is filed under


class HangingBeamSearch(NumpyImplementation):
    name = "hanging-beam-search"

    def beam_search(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(600)


class CrashingVjp(NumpyImplementation):
    name = "crashing-vjp"

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> dict[str, Any]:
        os._exit(0)


def _rows(report: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    data = json.loads(report.read_text(encoding="utf-8"))
    return {(r["equation"], r["direction"], r["dtype"]): r for r in data["rows"]}


@pytest.mark.parametrize(
    ("cls", "keyword", "row", "measure"),
    [
        (HangingBeamSearch, "beam_search", ("transformer_forward", "decode"), "hang (time limit)"),
        (CrashingVjp, "scaled_dot_product_attention_gradients", ("scaled_dot_product_attention", "backward"), "crash"),
    ],
    ids=["hang in beam_search", "exit in vjp"],
)
def test_a_hang_or_a_crash_is_filed_under_the_row_of_its_direction(
    tmp_path: Path, cls: type, keyword: str, row: tuple[str, str], measure: str
) -> None:
    """In worker processes, a beam search that hangs fails the decode row and a vjp that ends the process fails the
    backward row (the crash's record keeps the test's direction); the forward row of the same equation is not
    failed by them, and the run exits 1."""
    proc = aiayn_check(
        tmp_path,
        f"test_untrusted_plugins:{cls.__name__}",
        "--workers=1",
        "--timeout=5",
        "--profile=smoke",
        "--dtype=float64",
        f"--report={tmp_path}",
        "-k",
        keyword,
        AIAYN_FAILURES=str(tmp_path / "failures"),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{out[-3000:]}"
    rows = _rows(tmp_path / f"conformance-{cls.name}.json")
    failed = {key: r for key, r in rows.items() if r["status"] == "fail"}
    assert failed and all(key[:2] == row for key in failed), (sorted(failed), out[-3000:])
    assert all(r["measure"].startswith(measure) for r in failed.values()), [r["measure"] for r in failed.values()]


# --------------------------------------------------------------------------------------------
# a process that ends while loading is not a pass

_ENDS_AT_LOAD = {
    "os._exit(0) at import": "import os\nos._exit(0)\n",
    "sys.exit(0) at import": "import sys\nsys.exit(0)\n",
    "KeyboardInterrupt at import": "raise KeyboardInterrupt\n",
    "SIGKILL at import": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "os._exit(0) in the constructor": (
        "import os\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "class X(NumpyImplementation):\n    def __init__(self):\n        os._exit(0)\n"
    ),
    "os._exit(0) at shutdown": (
        "import atexit, os\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "atexit.register(lambda: os._exit(0))\n"
        "class X(NumpyImplementation):\n    def softmax(self, x, axis=-1):\n        return x\n"
    ),
}

_SAID = {
    "os._exit(0) at import": "its import or construction ended the process (exit 0) before loading finished",
    "sys.exit(0) at import": "its import or construction raised SystemExit(0), which ends a process",
    "KeyboardInterrupt at import": "its import or construction raised KeyboardInterrupt(), which ends a process",
    "SIGKILL at import": "its import or construction ended the process (killed by SIGKILL) before loading finished",
    "os._exit(0) in the constructor": "its import or construction ended the process (exit 0) before loading finished",
    "os._exit(0) at shutdown": "it loads, but then changes how the process ends (exit 0 at shutdown",
}


@pytest.mark.parametrize("how", list(_ENDS_AT_LOAD))
def test_an_implementation_that_ends_the_process_while_loading_cannot_be_loaded(tmp_path: Path, how: str) -> None:
    """``aiayn check`` exits 4 with one line that says how loading ended, never 0 with nothing printed (the module is
    imported from the working folder, which ``python -m`` puts on the path). An exit status changed at shutdown
    matters only where the implementation shares aiayn's process (``--in-process``, where loading is probed first):
    in its own process it changes nothing, and its wrong softmax is judged (exit 1)."""
    (tmp_path / "ends_at_load.py").write_text(_ENDS_AT_LOAD[how], encoding="utf-8")
    mode = ["--in-process"] if how == "os._exit(0) at shutdown" else []
    proc = aiayn_check(tmp_path, "ends_at_load:X", "--profile=smoke", "--workers=0", "-k", "softmax", *mode)
    out = proc.stdout + proc.stderr
    if mode:
        one = ["--dtype=float64", "-k", "test_softmax and not test_softmax_"]  # the agreement test alone
        judged = aiayn_check(tmp_path, "ends_at_load:X", "--profile=smoke", "--workers=0", *one)
        assert judged.returncode == 1, f"exit {judged.returncode}:\n{(judged.stdout + judged.stderr)[-3000:]}"
    assert proc.returncode == 4, f"exit {proc.returncode}:\n{out[-3000:]}"
    errors = [line for line in out.splitlines() if line.startswith("ERROR: aiayn: cannot load")]
    assert len(errors) == 1 and _SAID[how] in errors[0], out[-3000:]
    assert "Traceback" not in out, out[-3000:]


_FLUSHES_AT_LOAD = {
    "in its module": (
        "import torch\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "torch.set_flush_denormal(True)\nclass X(NumpyImplementation):\n    pass\n",
        "FTZ and DAZ set while importing flushes_at_load.",
    ),
    "in a library it imports": (
        "import flushing_library\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "class X(NumpyImplementation):\n    pass\n",
        "FTZ and DAZ set by the import of flushing_library while importing flushes_at_load.",
    ),
    "in its constructor": (
        "import torch\nfrom aiayn.implementations.numpy_impl import NumpyImplementation\n"
        "class X(NumpyImplementation):\n    def __init__(self):\n        torch.set_flush_denormal(True)\n",
        "FTZ and DAZ set by its constructor.",
    ),
}


@pytest.mark.parametrize("where", list(_FLUSHES_AT_LOAD))
def test_an_implementation_that_flushes_subnormals_is_named_in_one_line(tmp_path: Path, where: str) -> None:
    """FTZ/DAZ set while loading (as a shared library built with -ffast-math does; here by PyTorch's
    set_flush_denormal) in aiayn's own process (``--in-process``) would flush aiayn's oracle and draws too: one line
    says so, and which import set it, exit 4; never thousands of lines of Hypothesis refusing to draw subnormals. (In
    its own process, the default, it is judged: ``test_boundary.py``.)"""
    pytest.importorskip("torch", reason="PyTorch sets the flush modes for this test (make test installs it)")
    source, said = _FLUSHES_AT_LOAD[where]
    (tmp_path / "flushes_at_load.py").write_text(source, encoding="utf-8")
    (tmp_path / "flushing_library.py").write_text("import torch\ntorch.set_flush_denormal(True)\n", encoding="utf-8")
    proc = aiayn_check(tmp_path, "flushes_at_load:X", "--profile=smoke", "--workers=0", "-k", "softmax", "--in-process")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, f"exit {proc.returncode}:\n{out[-3000:]}"
    errors = [line for line in out.splitlines() if line.startswith("ERROR: aiayn:")]
    assert len(errors) == 1 and "your implementation flushes subnormals process-wide: " + said in errors[0], out[-3000:]
    assert len(out.splitlines()) < 20, out[-3000:]


def test_the_flush_modes_are_read_from_arithmetic() -> None:
    from aiayn.implementations.registry import flushed_subnormals

    assert flushed_subnormals() is None  # this test process computes with subnormals


def test_loading_that_hangs_is_refused_after_the_probes_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiayn.implementations import registry

    (tmp_path / "hangs_at_load.py").write_text("import time\ntime.sleep(600)\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(registry.ImplementationNotFound, match="loading it did not finish within 2 s"):
        registry.probe("hangs_at_load:X", limit=2)


# --------------------------------------------------------------------------------------------
# an interrupted run


class SlowSoftmax(NumpyImplementation):
    """Softmax that, after its first 100 calls in a process (a test makes at most two calls an example, 40 examples
    at profile dev: a test ended by then), writes the file $AIAYN_TEST_MARKER and takes 0.2 s a call: a run to
    interrupt in the middle. The tests selected make over 200 calls in all, so one of two workers reaches 100."""

    name = "slow-softmax"
    calls = 0

    def softmax(self, x: Any, axis: int = -1) -> Any:
        SlowSoftmax.calls += 1
        if SlowSoftmax.calls > 100:
            Path(os.environ["AIAYN_TEST_MARKER"]).touch()
            time.sleep(0.2)
        return super().softmax(x, axis)


def _default_signals() -> None:
    """In the child, before it runs: SIGINT and SIGTERM as a shell starts a command (an ignored signal stays ignored
    across exec, and a process of the test run may have left one ignored: the run would then never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(  # each signal once and each mode once: in workers (xdist's controller) and in-process
    ("sig", "workers"), [(signal.SIGTERM, 2), (signal.SIGINT, 0)], ids=["SIGTERM-workers", "SIGINT-in-process"]
)
def test_an_interrupted_run_writes_no_report_under_the_main_name(tmp_path: Path, sig: int, workers: int) -> None:
    """Exit 2 (pytest's INTERRUPTED); no conformance-slow-softmax.* (the main name); the partial report, where one
    is written, says INTERRUPTED in its verdict and file name; no in-flight record folder is left behind."""
    marker, temp = tmp_path / "started", tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "AIAYN_"))}
    env |= {"PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    env |= {"AIAYN_TEST_MARKER": str(marker), "TMPDIR": str(temp), "AIAYN_FAILURES": str(tmp_path / "failures")}
    command = [sys.executable, "-m", "aiayn", "check", "test_untrusted_plugins:SlowSoftmax", f"--workers={workers}"]
    command += ["--profile=dev", "--dtype=float64", f"--report={tmp_path}", "-k", "softmax and not gradients"]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_default_signals,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), f"the run never reached its slow calls (exit {proc.poll()})"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{out[-3000:]}"
    assert not (tmp_path / "conformance-slow-softmax.json").exists(), out[-3000:]
    assert not (tmp_path / "conformance-slow-softmax.md").exists(), out[-3000:]
    partial = tmp_path / "conformance-slow-softmax-INTERRUPTED.json"
    assert json.loads(partial.read_text(encoding="utf-8"))["verdict"] == "INTERRUPTED", out[-3000:]
    assert "INTERRUPTED: aiayn: the run was interrupted after" in out, out[-3000:]
    assert not list(temp.glob("aiayn-inflight-*")), list(temp.iterdir())
