"""Meta-tests of the budgets, dtype by dtype, with implementations whose arithmetic we know exactly.

The budgets (``conformance/budgets/forward.py``, ``conformance/budgets/composites/forward.py``) and the strategies
(``conformance/inputs/strategies.py``) together must

1. apply: for every equation and dtype, over what the strategies draw, the budget is finite on at
   least the stated fraction of elements (``conformance/report/coverage.py``: 99% unless stated);
2. never raise a false alarm: an honest low-precision implementation (``conformance/studies/simulated.py``:
   every intermediate rounded to the dtype, sums accumulated in the dtype left to right) passes
   every equation in every dtype;
3. catch a numerical defect: the same implementation with LayerNorm's variance as E[x^2] - E[x]^2
   in float16 fails (and the project's mutants still fail: ``tests/meta/test_conformance_mutants.py``);
4. bound the declared "uniform" policy too: the same implementation with masked scores replaced by a
   finite value (a fully masked row weighs every key 1/n_k, rounded like any row) passes attention.

Each runs the real suite (the plugin, the ``ci`` profile) in a subprocess and reads its reports.
About a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.conformance.equations import unjudged
from aiayn.conformance.report.coverage import max_unchecked
from aiayn.implementations.protocol import DTYPES

SIMULATED = {dtype: f"aiayn.conformance.studies.simulated:{dtype}" for dtype in DTYPES}

# one worker runs this module (make test's --dist loadgroup): the honest run, a minute, is made once
pytestmark = [pytest.mark.xdist_group("budget-coverage"), pytest.mark.slow]  # make test-slow: over a minute


def _suite(tmp_path: Path, specs: list[str], *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    reports = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "AIAYN_IMPL"))} | {
        "AIAYN_FAILURES": str(tmp_path / "failures"),
        "AIAYN_PROFILE": "ci",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "aiayn.conformance",
        "-q",
        "-p",
        "no:cacheprovider",
        "--tb=short",
        f"--aiayn-report={reports}",
        # in this process: the simulated implementations are aiayn's own NumPy code, and the question is whether the
        # budgets hold for them, not whether the judge is out of their reach (conformance/run/boundary.py)
        "--aiayn-in-process",
        *[f"--impl={s}" for s in specs],
        *extra,
    ]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False), reports


@pytest.fixture(scope="session")  # built once per worker, whatever other modules' tests run in between
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    tmp = tmp_path_factory.mktemp("honest")
    proc, reports = _suite(tmp, list(SIMULATED.values()))
    data = {dtype: json.loads((reports / f"conformance-simulated-{dtype}.json").read_text()) for dtype in SIMULATED}
    return proc, data


def _undecoded(row: dict) -> bool:
    """A decoding or split-keys row of the simulated implementation: it computes the equations and their gradients
    with every intermediate rounded, but has no cached decoder, beam search or split keys of its own, so those rows
    are "not provided" (their budgets are met in float16 and bfloat16 by the torch built-in,
    reports/conformance-torch.md)."""
    return row.get("direction") in ("decode", "split keys") and row["status"] == "not provided"


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_honest_low_precision_implementation_passes(honest: tuple, dtype: str) -> None:
    proc, data = honest
    rows = data[dtype]["rows"]
    bad = [
        f"{r['equation']} [{r['dtype']}]: {r['status']} {r['failed_tests']}"
        for r in rows
        if r["status"] not in ("pass", "n/a") and not _undecoded(r)
    ]
    assert not bad, (
        f"the simulated {dtype} implementation (every intermediate rounded to {dtype}) does not pass:\n"
        + "\n".join(bad)
        + f"\n{proc.stdout[-4000:]}"
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_budgets_apply_to_at_least_the_stated_fraction(honest: tuple, dtype: str) -> None:
    _, data = honest
    short = []
    for r in data[dtype]["rows"]:
        if r["status"] in ("n/a",) or r["equation"] == "contract" or _undecoded(r):
            continue
        undefined = sum(r["not_checked_reasons"].values()) - sum(unjudged(r["not_checked_reasons"]).values())
        total = r["checked"] + r["not_checked"] - undefined  # elements no caller defines are not the budgets' to cover
        assert total > 0, f"{r['equation']} [{dtype}]: nothing was checked at all"
        if (r["not_checked"] - undefined) / total > max_unchecked(r["equation"], dtype):
            short.append(
                f"{r['equation']} [{dtype}]: {r['not_checked']} of {total} not checked "
                f"(stated maximum {100 * max_unchecked(r['equation'], dtype):g}%): {r['not_checked_reasons']}"
            )
    assert not short, "\n".join(short)


def test_one_pass_variance_in_float16_fails(tmp_path: Path) -> None:
    proc, reports = _suite(tmp_path, ["aiayn.conformance.studies.simulated:one_pass_float16"], "-k", "layer_norm")
    assert proc.returncode == 1, f"exit {proc.returncode}, expected 1 (a failed check):\n{proc.stdout[-3000:]}"
    data = json.loads((reports / "conformance-simulated-one-pass-variance-float16.json").read_text())
    row = next(r for r in data["rows"] if r["equation"] == "layer_norm")
    assert row["status"] == "fail", row


def test_a_finite_masked_score_passes_under_the_uniform_policy(tmp_path: Path) -> None:
    """A fully masked row under "uniform" is the mean of the values, computed with rounding: its budget is a row's, not
    0."""
    specs = [f"aiayn.conformance.studies.simulated:finite_mask_{dtype}" for dtype in ("float32", "float16", "bfloat16")]
    proc, reports = _suite(tmp_path, specs, "-k", "attention")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-4000:]}"
    for spec in specs:
        stem = spec.split(":")[1].replace("_", "-").replace("finite-mask", "simulated-finite-mask")
        data = json.loads((reports / f"conformance-{stem}.json").read_text())
        attention = ("scaled_dot_product_attention", "multi_head_attention")
        rows = [r for r in data["rows"] if r["equation"] in attention and not _undecoded(r)]
        assert rows and all(r["status"] == "pass" and r["checked"] > 0 for r in rows), rows
