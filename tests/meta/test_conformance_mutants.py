"""The conformance suite has teeth, and fails well.

1. Every NumPy mutant (``MUTANTS`` of ``conformance/studies/mutants.py``: the NumPy built-in with one
   realistic bug, in its forward pass or in its hand-written backward) is caught by ``pytest conformance`` and
   diagnosed as its own departure, and the unbroken NumPy built-in, run alongside as the control, passes; a
   backward mutant passes its forward rows. This runs the suite in a
   subprocess at the derandomized ``smoke`` profile (8 examples per check, the same every run), each mutant in one
   dtype (about half a minute on two cores); ``aiayn mutants`` runs it at ``dev`` (40, random) in every dtype the
   NumPy built-in declares for the report. The PyTorch mutants
   (``TORCH_MUTANTS``) are run by ``tests/test_torch_impl.py``.
2. A failure message names the equation and section, the worst element, the error as a multiple
   of its budget, the input shapes and dtypes, and a replay command that reruns that one check.
3. A plugin that raises, returns the wrong shape, NaN, values outside its dtype, a different
   answer the second time, or modifies its input fails the check it is in with a message saying
   so, never with an unrelated exception.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from aiayn.conformance.checks import attention as A
from aiayn.conformance.checks import load_all
from aiayn.conformance.replay import replay
from aiayn.conformance.run.failures import register_spec
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.conformance.studies import mutants
from aiayn.implementations.numpy_impl import NumpyImplementation

pytestmark = pytest.mark.slow  # make test-slow (CI's .ci/run runs it): minutes, not seconds

load_all()


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))


BEAM_CHECK = "beam_search_finds_the_oracles_hypothesis"


def _one_dtype_each() -> list[tuple[str, dict[str, type], str, list[str]]]:
    """The mutants split by the dtype, profile and tests they are run with here: float32 (every equation the NumPy
    built-in declares is checked in it, and its rounding is what shows the cancelling forms: in float64 a one-pass
    variance looks like float32 arithmetic), float64 for those whose equations are checked in the first dtype only
    (lrate); a decoding mutant on the decoding checks where its bug shows (``diagnoses.decoding``; its forward and
    backward are the built-in's), a beam search's at the derandomized ``ci`` profile (its bugs show only on sentences
    long enough for the length penalty and the stopping rule to decide something, rare among ``smoke``'s 8 simplest
    examples); a mutant whose bug shows in one dtype only (``Bug.shows_in``) in that dtype."""
    from aiayn.conformance.diagnoses.decoding import DECODING_CATALOGUE
    from aiayn.conformance.equations import RECORDS

    first_only = {name for name, r in RECORDS.items() if r.first_dtype_only}
    in_float64 = {n: c for n, c in mutants.MUTANTS.items() if c.targets <= first_only or c.shows_in == "float64"}
    shows = {d.name: d.checks for d in DECODING_CATALOGUE}
    # a departure of the model rather than of decoding (a positional table, diagnoses.CATALOGUE) that only the search
    # runs over shows in the beam check
    search = {n: c for n, c in mutants.DECODE_MUTANTS.items() if shows.get(c.departure, {BEAM_CHECK}) == {BEAM_CHECK}}
    decoder = {n: c for n, c in mutants.DECODE_MUTANTS.items() if n not in search}
    rest = {n: c for n, c in mutants.MUTANTS.items() if n not in in_float64 and n not in mutants.DECODE_MUTANTS}
    return [
        ("float32", rest, "smoke", []),
        ("float64", in_float64, "smoke", []),
        (
            "float32",
            decoder,
            "smoke",
            ["--aiayn-no-grad", "-k", "cached_decoding or reordered_cache or decoding_on_fixed"],
        ),
        ("float32", search, "ci", ["--aiayn-no-grad", "-k", f"{BEAM_CHECK} or decoding_on_fixed_inputs"]),
    ]


def test_every_mutant_is_caught_and_the_unbroken_numpy_implementation_passes(tmp_path: Path) -> None:
    """Each mutant in one dtype (:func:`_one_dtype_each`; ``aiayn mutants`` runs every declared dtype for the report),
    with the control alongside in that dtype."""
    rows: list[dict] = []
    total = 0
    for n, (dtype, group, profile, only) in enumerate(_one_dtype_each()):
        folder = tmp_path / f"{n}-{dtype}"
        proc = mutants.run_mutants(folder, workers=2, profile=profile, mutants=group, extra=[f"--dtype={dtype}", *only])
        assert (folder / "conformance-numpy.json").exists(), (
            f"the suite did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        table = mutants.kill_table(folder, group)
        assert table["control"]["verdict"] == "PASS", (
            f"the unbroken numpy implementation failed in {dtype}: {table['control']['failing']}"
        )
        rows += table["mutants"]
        total += table["total"]
        forward_failed = []  # a backward or decoding mutant's bug is in its gradients or decoding: its forward passes
        for name, cls in {**mutants.BACKWARD_MUTANTS, **mutants.DECODE_MUTANTS}.items():
            if name not in group:
                continue
            data = json.loads((folder / f"conformance-{cls.name}.json").read_text())
            forward_failed += [
                f"{name}: {r['section']} [{r['dtype']}]"
                for r in data["rows"]
                if r["direction"] == "forward" and r["status"] == "fail"
            ]
        assert not forward_failed, f"backward mutants failed a forward row: {forward_failed}"
    assert total == len(mutants.MUTANTS) >= 15 + 12
    missed = [f"{r['mutant']}: {r['bug']}" for r in rows if not r["caught"]]
    assert not missed, f"{len(missed)} of {total} mutants were not caught: {missed}"
    wrong = [
        f"{r['mutant']}: diagnosed as {r['diagnosed_as']}, expected {r['departure']!r}"
        for r in rows
        if not r["diagnosed"]
    ]
    assert not wrong, f"{len(wrong)} of {total} mutants were not diagnosed as themselves:\n" + "\n".join(wrong)


def _no_scale_case() -> dict[str, np.ndarray | None]:
    q = np.array([[1.0, 2.0, 0.5], [0.25, -1.0, 3.0]])
    k = np.array([[0.5, 1.0, -1.0], [2.0, 0.0, 1.5], [-0.5, 0.75, 0.25]])
    v = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 1.0]])
    return {"q": q, "k": k, "v": v, "mask": None}


def test_a_failure_message_says_what_where_by_how_much_on_what_and_how_to_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    impl = mutants.NoScale()
    register_spec(impl, "aiayn.conformance.studies.mutants:NoScale")
    with pytest.raises(ConformanceFailure) as failure:
        A.scaled_dot_product_attention(impl, "float64", **_no_scale_case())
    message = str(failure.value)
    for part in (
        "scaled dot-product attention (§3.2.1, Eq. (1))",
        "disagrees with the oracle",
        "worst element at index (",
        "x budget",
        "elements over budget",
        "q float64 (2, 3); k float64 (3, 3); v float64 (3, 2)",
        "replay: aiayn replay ",
    ):
        assert part in message, f"{part!r} missing from the failure message:\n{message}"
    ratio = float(message.split(" x budget")[0].rsplit("= ", 1)[1])
    assert ratio > 1e6, f"no scaling is an O(1) error, expected a huge multiple of the budget, got {ratio}"
    path = message.rsplit("replay: aiayn replay ", 1)[1].strip()
    # the file names a module:attr, which replay imports only when the user names it
    assert replay([path], impl="aiayn.conformance.studies.mutants:NoScale") == 1, (
        "replaying the failure should fail again"
    )
    assert "disagrees with the oracle" in capsys.readouterr().out
    assert replay([path], impl="numpy") == 0, "the same inputs should pass on the unbroken implementation"


class _Broken(NumpyImplementation):
    """The NumPy implementation with its softmax replaced by ``bad``."""

    name = "broken"

    def __init__(self, bad) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.bad = bad

    def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
        return self.bad(self, x, axis)


def _raises(self, x, axis):  # type: ignore[no-untyped-def]
    raise RuntimeError("kernel exploded")


def _wrong_shape(self, x, axis):  # type: ignore[no-untyped-def]
    return NumpyImplementation.softmax(self, x, axis)[..., :1]


def _nan(self, x, axis):  # type: ignore[no-untyped-def]
    out = NumpyImplementation.softmax(self, x, axis)
    out[0, 0] = np.nan
    return out


def _mutates(self, x, axis):  # type: ignore[no-untyped-def]
    out = NumpyImplementation.softmax(self, x, axis)
    x -= 1.0
    return out


_calls = {"n": 0}


def _nondeterministic(self, x, axis):  # type: ignore[no-untyped-def]
    _calls["n"] += 1
    out = NumpyImplementation.softmax(self, x, axis)
    return out * (1.0 + _calls["n"] * 2.0**-20)


def _widened(self, x, axis):  # type: ignore[no-untyped-def]
    return NumpyImplementation.softmax(self, x.astype(np.float64), axis)


@pytest.mark.parametrize(
    "bad, dtype, words",
    [
        (_raises, "float64", "raised RuntimeError: kernel exploded"),
        (_wrong_shape, "float64", "result has shape (2, 1), expected (2, 3)"),
        (_nan, "float64", "NaN at index (0, 0)"),
        (_mutates, "float64", "modified its input"),
        (_nondeterministic, "float64", "not deterministic"),
        (_widened, "float32", "returned native dtype float64, expected float32"),
    ],
)
def test_a_broken_plugin_fails_the_check_it_is_in_with_a_message_saying_how(bad, dtype: str, words: str) -> None:  # type: ignore[no-untyped-def]
    x = np.array([[0.5, -1.0, 2.0], [3.0, 3.0, math.pi]])
    with pytest.raises(ConformanceFailure) as failure:
        A.softmax(_Broken(bad), dtype, x=x, axis=-1)
    assert words in str(failure.value), str(failure.value)
    assert "softmax (§3.2.1, inside Eq. (1))" in str(failure.value)
    A.softmax(NumpyImplementation(), dtype, x=x, axis=-1)  # the same check passes on the real thing


# --------------------------------------------------------------------------------------------
# declared known deviations: reported when they deviate, a failure when they no longer do

_POISON = "attention_poison_at_masked_positions_changes_nothing"


class _DeclaredAdditiveMask(mutants.AdditiveMask):
    """The additive-mask mutant, declaring its poison failures as known deviations."""

    name = "declared-additive-mask"
    known_deviations = {f"{_POISON}[huge]": "adds -1e4 instead of setting -inf", f"{_POISON}[nan_keys]": "adds -1e4"}


class _StaleDeclaration(NumpyImplementation):
    """The correct NumPy implementation, declaring a deviation it does not have."""

    known_deviations = {f"{_POISON}[huge]": "a declaration that outlived its deviation"}


def _run_poison_checks(spec: str, tmp_path: Path) -> tuple[int, str, dict]:
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "AIAYN_PROFILE": "ci", "AIAYN_FIND_ONLY": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "conformance/test_attention.py",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "poison",
            "--impl",
            spec,
            "--dtype",
            "float64",
            "--aiayn-report",
            str(tmp_path),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = list(tmp_path.glob("conformance-*.json"))
    return proc.returncode, proc.stdout + proc.stderr, json.loads(reports[0].read_text()) if reports else {}


def test_a_declared_deviation_that_deviates_is_reported_not_failed(tmp_path: Path) -> None:
    code, out, report = _run_poison_checks("tests.meta.test_conformance_mutants:_DeclaredAdditiveMask", tmp_path)
    assert code == 0, f"declared deviations should not fail the run:\n{out[-3000:]}"
    assert "2 xfailed" in out, out[-2000:]
    assert report["verdict"] == "PASS WITH KNOWN DEVIATIONS", report.get("verdict")


def test_a_declaration_that_no_longer_deviates_fails_the_run(tmp_path: Path) -> None:
    code, out, _ = _run_poison_checks("tests.meta.test_conformance_mutants:_StaleDeclaration", tmp_path)
    assert code != 0 and "XPASS(strict)" in out, f"a stale declaration must fail (strict xfail):\n{out[-3000:]}"
