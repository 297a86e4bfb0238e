"""The zoo: its cells are computed from the conformance rows, and a smoke-sized run of the installed
adapters names every failure.

The zoo lists third-party code only; aiayn's PyTorch built-ins appear in its table from their one
report each (``conformance-<name>.json``, ``zoo.BUILTIN_ROWS``), never from a second run. The smoke
run checks the adapters at the ``smoke`` profile, ``--quick`` (float32, each equation's agreement
test and the contract: ``make zoo`` runs everything). With ``AIAYN_REQUIRE_ZOO=1`` (``make test``)
a missing zoo library fails the test instead of narrowing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _checks import run_check

from aiayn.conformance.equations import record
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.conformance.studies.zoo import (
    BATCH_INVARIANCE,
    BUILTIN_ROWS,
    CANARIES,
    DECODING,
    DETERMINISM,
    cell,
    installed,
    property_cell,
)
from aiayn.implementations import registry
from aiayn.implementations.protocol import EQUATIONS, contract_problems
from aiayn.implementations.zoo import ZOO

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def _row(dtype: str, status: str, **kw) -> dict:
    base = {
        "equation": "feed_forward",
        "section": "position-wise feed-forward (§3.3, Eq. (2))",
        "dtype": dtype,
        "status": status,
        "scope": "full domain",
        "departures": [],
        "headroom": None,
        "worst_error_to_budget": None,
        "measure": "",
        "failed_tests": [],
        "unnamed_failures": [],
        "violations": [],
        "known_deviations": {},
        "checked": 10,
        "not_checked": 0,
        "examples": 5,
        "unsupported": 0,
    }
    return {**base, **kw}


def test_cell_passes_with_the_smallest_headroom():
    c = cell(
        [
            _row("float64", "pass", headroom=20.0, worst_error_to_budget=0.05),
            _row("float32", "pass", headroom=3.0, worst_error_to_budget=0.33),
        ]
    )
    assert (c["kind"], c["text"], c["headroom"]) == ("pass", "pass (3x)", 3.0)


def test_cell_names_the_departure_and_the_dtypes_it_shows_in():
    c = cell(
        [
            _row("float64", "pass", headroom=9.0),
            _row("float32", "fail", departures=["sin and cos in two halves"], measure="412"),
        ]
    )
    assert c["kind"] == "departs" and c["text"] == "'sin and cos in two halves' [float32]"


@pytest.mark.parametrize("measure", ["7.5", "crash (signal 11)", "hang (time limit)"])
def test_a_failure_without_a_departure_or_a_crash_is_unnamed(measure):
    departures = ["no ReLU"] if measure != "7.5" else []
    c = cell(
        [
            _row(
                "float64",
                "fail",
                departures=departures,
                measure=measure,
                failed_tests=["test_x", "test_y"],
                unnamed_failures=["test_x"],
            )
        ]
    )
    assert c["kind"] == "UNNAMED" and c["notes"] == ["test_x"]


def test_a_property_failure_is_named_by_the_statement_it_breaks():
    c = cell(
        [
            _row(
                "float32",
                "fail",
                violations=["a masked key is as if removed: weight exactly 0 (§3.2.3)"],
                failed_tests=["test_p"],
            )
        ]
    )
    assert c["kind"] == "departs" and c["text"] == "breaks 'a masked key is as if removed: weight exactly 0 (§3.2.3)'"


def test_a_property_column_says_what_was_measured_over_every_row():
    """Batch invariance: bit for bit where every forward arrangement in a batch came out 0 ulps apart, else the most
    ulps and the equations that moved; determinism from the reruns; a failing property test names what it breaks."""
    forward = _row("float32", "pass", tests=["test_feed_forward_is_batch_invariant"], apart={"in a batch": 0.0})
    backward = _row(
        "float32",
        "pass",
        direction="backward",
        tests=["test_feed_forward_gradients_are_batch_invariant", "test_feed_forward_gradients_are_deterministic"],
        apart={"in a batch": 3.0, "rerun": 0.0},
    )
    c = property_cell([forward, backward], BATCH_INVARIANCE)
    assert (c["kind"], c["text"]) == ("pass", "pass, forward bit for bit in a batch; gradients in a batch up to 3 ulps")
    moved = {**forward, "apart": {"in a batch": 24.0, "padded": 2.0}}
    c = property_cell([moved, backward], BATCH_INVARIANCE)
    assert c["text"].startswith("pass within budget: forward up to 24 ulps in a batch (FFN (Eq. 2)); padded up to 2")
    assert property_cell([forward, backward], DETERMINISM)["text"] == "pass, gradients bit for bit"
    assert property_cell([forward], CANARIES)["kind"] == "not run"
    broken = {
        **backward,
        "status": "fail",
        "failed_tests": ["test_feed_forward_gradients_are_deterministic"],
        "violations": ["each equation is a function of its inputs (§3)"],
    }
    c = property_cell([forward, broken], DETERMINISM)
    assert c["kind"] == "departs" and "test_feed_forward_gradients_are_deterministic" in c["text"]


def test_cell_other_kinds():
    assert cell([_row("float64", "not provided")])["text"] == "not provided"
    assert cell([_row("float64", "n/a")])["kind"] == "not provided"
    scoped = cell([_row("float64", "pass within scope", scope="self-attention only", headroom=4.0)])
    assert scoped["kind"] == "pass within scope" and scoped["notes"] == ["scope: self-attention only"]
    known = cell(
        [_row("float64", "known deviation", known_deviations={"t": "known deviation declared by lib: documented X"})]
    )
    assert known["kind"] == "known deviation" and known["notes"] == ["documented X"]
    assert cell([_row("float64", "inconclusive", examples=10, unsupported=8)])["kind"] == "inconclusive"
    assert cell([_row("float64", "out of scope", scope="masks causal only")])["text"] == "out of scope"
    narrowed = cell(
        [
            _row(
                "float32",
                "known deviation",
                scope="dtypes float32; why",
                known_deviations={"t": "by lib: documented X"},
            )
        ]
    )
    assert narrowed["notes"] == [
        "documented X",
        "scope: dtypes float32; why",
    ]  # a declared scope is shown whatever the cell


def test_the_zoo_lists_third_party_code_only() -> None:
    assert not set(ZOO) & set(registry.BUILTINS), f"built-ins in the zoo: {sorted(set(ZOO) & set(registry.BUILTINS))}"
    ours = [n for n, e in ZOO.items() if not e.target.startswith("aiayn.implementations.zoo.")]
    assert not ours, f"zoo entries that are not adapters of implementations/zoo/: {ours}"
    assert set(BUILTIN_ROWS) <= set(registry.BUILTINS)
    assert all(BUILTIN_ROWS[n].target == registry.BUILTINS[n] for n in BUILTIN_ROWS)


def test_a_builtin_row_is_read_from_its_own_report(tmp_path: Path) -> None:
    from aiayn.conformance.studies.zoo import _builtin_row

    name = next(iter(BUILTIN_ROWS))
    missing = _builtin_row(name, tmp_path)
    assert missing["cells"] == {} and f"aiayn check {name} --report" in missing["verdict"], missing["verdict"]
    rows = [_row("float64", "pass", headroom=8.0), _row("float32", "fail", departures=["no ReLU"])]
    report = {
        "verdict": "FAIL",
        "version": "torch 9.9",
        "hypothesis_profile": "ci",
        "signature": "report:conformance-x|profile:ci|commit:abc1234|code:0",
        "rows": [{**r, "equation": "feed_forward"} for r in rows],
    }
    (tmp_path / f"conformance-{name}.json").write_text(json.dumps(report), encoding="utf-8")
    row = _builtin_row(name, tmp_path)
    assert (row["verdict"], row["version"], row["origin"]) == ("FAIL", "torch 9.9", "built-in")
    assert (row["source"], row["source_run"]) == (f"conformance-{name}.json", "profile ci, commit abc1234")
    assert row["cells"]["feed_forward"]["text"] == "'no ReLU' [float32]"


def _adapter(name: str):
    """The zoo adapter ``name``, loaded; where its library is absent, a failure under ``AIAYN_REQUIRE_ZOO=1``."""
    library = ZOO[name].library
    if not installed(library):
        if os.environ.get("AIAYN_REQUIRE_ZOO") == "1":
            pytest.fail(f"{library} is not installed, and AIAYN_REQUIRE_ZOO=1 (make test installs the zoo extra)")
        # nothing to check without the library (an install without the zoo extra); make test and CI set
        # AIAYN_REQUIRE_ZOO=1, where a missing library fails above instead of skipping
        pytest.skip(f"{library} not installed (pip install 'aiayn[zoo]')")
    return registry.load(name)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_names_resolve_and_adapters_keep_the_contract(name):
    impl = _adapter(name)
    assert contract_problems(impl) == []
    assert impl.provides(), f"{name} provides no equation"


def test_zoo_adapters_are_thin():
    """An adapter maps weights and arguments: about 80 logical lines of code each (statements, however they are
    laid out; docstrings and comments not counted), and about 40 more where it also decodes (the contract's
    "Decoding": encode, decode_step, reorder_cache, beam_search)."""
    import ast

    folder = Path(registry.__file__).parent / "zoo"
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        source = path.read_text(encoding="utf-8")
        classes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
        decoders = sum(any(isinstance(f, ast.FunctionDef) and f.name == "decode_step" for f in c.body) for c in classes)
        lines, allowed = _logical_lines(source), 100 * max(1, len(classes)) + 50 * decoders
        assert lines <= allowed, (
            f"{path.name}: {lines} logical lines of code for {len(classes)} adapters, {decoders} of them decoding "
            f"(about 80 each, 40 more for decoding)"
        )


def _logical_lines(source: str) -> int:
    """The logical lines of code of ``source`` (tokenize's NEWLINE tokens), docstrings left out."""
    import ast
    import io
    import tokenize

    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and ast.get_docstring(node, clean=False) is not None
        ):
            first = node.body[0]
            doc_lines.update(range(first.lineno, first.end_lineno + 1))
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for tok in tokens if tok.type == tokenize.NEWLINE and tok.start[0] not in doc_lines)


@pytest.mark.slow  # make test-slow: every zoo library loaded and checked
def test_zoo_smoke_names_every_failure(tmp_path):
    """`aiayn zoo --quick` at the smoke profile on the installed adapters: a report row each, every failure named,
    exit 0; the built-ins' rows read from their committed reports, none of them checked again."""
    present = [n for n in ZOO if installed(ZOO[n].library)]
    if os.environ.get("AIAYN_REQUIRE_ZOO") == "1":
        assert present == list(ZOO), f"missing zoo libraries: {sorted(set(ZOO) - set(present))}"
    if not present:
        # no adapter can run without its library; under AIAYN_REQUIRE_ZOO=1 (make test, CI) the assert above fails first
        pytest.skip("no zoo library installed (pip install 'aiayn[zoo]')")
    committed = {n: REPORTS / f"conformance-{n}.json" for n in BUILTIN_ROWS}
    for path in committed.values():
        if path.exists():
            (tmp_path / path.name).write_bytes(path.read_bytes())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "zoo",
            *present,
            "--profile",
            "smoke",
            "--quick",
            "--workers",  # one process for the suite (each adapter in a process of its own either way): under make
            "0",  # test's load, a worker each would import every library twice more
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    data = json.loads((tmp_path / "zoo.json").read_text(encoding="utf-8"))
    assert data["unnamed"] == [] and data["not_loaded"] == [], data["unnamed"] or data["not_loaded"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in data["rows"]}
    assert set(rows) == set(present) | set(BUILTIN_ROWS)
    for name in present:
        assert rows[name]["origin"] == "adapter"
        assert rows[name]["cells"] and any(c["kind"] != "not provided" for c in rows[name]["cells"].values()), (
            f"{name}: nothing checked"
        )
    for name, path in committed.items():
        row = rows[name]
        assert row["origin"] == "built-in" and row["source"] == path.name, row["source"]
        if path.exists():
            assert row["verdict"] == json.loads(path.read_text(encoding="utf-8"))["verdict"], name
    assert sorted(p.name for p in (tmp_path / "zoo").iterdir()) == sorted(
        f"conformance-{n}.{ext}" for n in present for ext in ("json", "md")
    ), "the zoo wrote reports of implementations it does not check"
    libraries = {ZOO[n].library for n in present} - {"torch"}
    assert set(data["libraries_beyond_torch"]) == libraries
    if present == list(ZOO):
        assert len(libraries) >= 6, f"the zoo covers {sorted(libraries)}: at least 6 libraries beyond PyTorch"
    assert (tmp_path / "zoo.md").exists() and (tmp_path / "zoo.png").exists()
    decode = record("transformer_forward").decode
    agreement = {f"test_{e}" for e in EQUATIONS} | {f"test_{c}" for c in decode.agreement}
    for name in present:  # --quick: each equation's agreement test, decoding's (and the contract) only
        report = json.loads((tmp_path / "zoo" / f"conformance-{name}.json").read_text(encoding="utf-8"))
        ran = {t for r in report["rows"] if r["equation"] != "contract" for t in r["tests"]}
        assert ran <= agreement, f"{name}: {sorted(ran)}"
    decoding = {n for n in present if rows[n]["cells"].get(DECODING, {}).get("kind") not in (None, "not provided")}
    if present == list(ZOO):
        assert len({ZOO[n].library for n in decoding}) >= 2, f"decoding checked for {sorted(decoding)} only"
    again = subprocess.run(
        [sys.executable, "-m", "aiayn", "zoo", *present, "--no-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    redone = json.loads((tmp_path / "zoo.json").read_text(encoding="utf-8"))
    assert (
        redone["rows"] == data["rows"] and redone["seconds"] == data["seconds"]
    )  # written again from the stored reports alone


_ADAM_STEP = {  # §5.3's betas and eps, a learning rate of Eq. (3), a step near warmup
    "param": np.array([1.5, -0.25, 3.0]),
    "grad": np.array([0.5, -2.0, 1e-3]),
    "m": np.array([0.1, -0.3, 0.0]),
    "v": np.array([0.04, 1.0, 1e-6]),
    "step": 4001,
    "lr": 0.0007,
    "betas": [0.9, 0.98],
    "eps": 1e-9,
}


@pytest.mark.parametrize("name", ["optax-adam", "keras-adam"])
def test_zoo_adam_steps_agree_with_the_oracle_where_their_eps_is_declared(name: str) -> None:
    """One §5.3 step in float32 within budget, the oracle placing eps as each declares: optax Algorithm 1's
    m_hat / (sqrt(v_hat) + eps) ("outside"), Keras the epsilon hat of Kingma & Ba's efficient form ("hat")."""
    impl = _adapter(name)
    assert impl.policies["adam_eps"] == {"optax-adam": "outside", "keras-adam": "hat"}[name]
    assert run_check(impl, "adam_step", "float32", **_ADAM_STEP).checked == 3 * _ADAM_STEP["param"].size


def test_keras_adam_keeps_its_learning_rate_in_float32() -> None:
    """What keras-adam's float64 row fails on, left failing: Keras holds the learning rate in a float32 variable, so
    a float64 step is the oracle's with lr rounded to float32, not with lr: given a learning rate float32 holds
    exactly, the same step passes the suite's float64 check (its own derived budget)."""
    impl = _adapter("keras-adam")
    with pytest.raises(ConformanceFailure):
        run_check(impl, "adam_step", "float64", **_ADAM_STEP)
    exact_in_float32 = {**_ADAM_STEP, "lr": float(np.float32(_ADAM_STEP["lr"]))}
    assert run_check(impl, "adam_step", "float64", **exact_in_float32).checked == 3 * _ADAM_STEP["param"].size


@pytest.mark.parametrize("name", ["flax-nnx-dropout", "keras-adam"])
def test_zoo_dropouts_return_the_mask_they_drew(name: str) -> None:
    """y agrees with the oracle given the returned mask, that mask is the library's own (y is 0 exactly where it
    drops, x being non-zero there) whatever x holds, and the kept fraction is Binomial(n, 1 - p)."""
    impl = _adapter(name)
    x = np.array([[1.0, 0.0, -2.5, 3.0], [0.0, 0.5, 7.0, -1.0]])
    assert run_check(impl, "dropout", "float32", x=x, p=0.3, seed=11).checked == x.size
    y, keep = (impl.to_numpy(a) for a in impl.dropout(impl.from_numpy(x, "float32"), 0.3, 11))
    assert keep.dtype == np.bool_ and np.array_equal(keep[x != 0], y[x != 0] != 0)
    draws = {"x": np.ones((256, 256)), "p": 0.1, "seed": 3, "other_seed": 4}
    run_check(impl, "dropout_keeps_each_element_with_probability_one_minus_p", "float32", **draws)
