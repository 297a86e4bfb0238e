"""aiayn as a user gets it: the wheel in a fresh virtual environment, pointed at an outside package.

One test: build the wheel from this checkout (its tracked and new files, copied to a temporary
folder so the checkout stays clean), install it (not editable) into a new virtual environment with
the tested versions of its dependencies, write a package of "someone else's" implementations into
another temporary folder, and from there (the repository not on ``sys.path``) run:

- ``aiayn check ext.impl:Good`` -> 0; ``aiayn check ext.impl:Broken`` -> 1, naming LayerNorm;
- ``aiayn check nosuch:X`` -> 4; ``aiayn check ext.impl:Good --dtype bfloat16`` (not declared) -> 4;
- ``pytest --pyargs aiayn.conformance --impl ext.impl:Good`` -> 0;
- the outside package's own pytest run, which pulls the suite in (``aiayn.conformance.suite``) and
  loads a Hypothesis profile of its own: its own test still runs that profile's 7 examples, and the
  suite's tests keep aiayn's;
- an implementation that segfaults in softmax and hangs in LayerNorm -> 1, both equations named
  with a replay file, every other equation still checked, the report written;
- the wheel's top-level modules: exactly ``aiayn``.

About 1-2 minutes on two cores (the install is from the local package index or pip's cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# one worker runs this module (make test's --dist loadgroup): the wheel and its environment are built once
pytestmark = [pytest.mark.xdist_group("installed"), pytest.mark.slow]  # make test-slow: over a minute

OUTSIDE_IMPL = '''
"""Someone else's implementations, written against the contract only."""
import ctypes
import time

import numpy as np

from aiayn.implementations.numpy_impl import NumpyImplementation


class Good(NumpyImplementation):
    name = "ext-good"


class Broken(NumpyImplementation):
    """LayerNorm with the unbiased (n - 1) variance: a departure from §3.1's biased one."""

    name = "ext-broken"

    def provides(self):
        return frozenset({"layer_norm", "softmax"})

    def layer_norm(self, x, gain, bias, eps=None):
        eps = self.policies["layer_norm_eps"] if eps is None else eps
        mean = x.mean(axis=-1, keepdims=True)
        var = x.var(axis=-1, keepdims=True, ddof=1) if x.shape[-1] > 1 else np.zeros_like(mean)
        return (gain * (x - mean) / np.sqrt(var + eps) + bias).astype(x.dtype)


class Fragile(NumpyImplementation):
    """Segfaults in softmax and hangs in LayerNorm; everything else is NumPy's."""

    name = "ext-fragile"

    def provides(self):
        return frozenset({"softmax", "layer_norm", "scaled_dot_product_attention", "positional_encoding", "lrate"})

    def softmax(self, x, axis=-1):
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    def layer_norm(self, *args, **kwargs):
        while True:
            time.sleep(0.05)
'''

OUTSIDE_TESTS = '''
"""The outside package's own test module: one test of its own, plus aiayn's suite for its implementation."""
from hypothesis import given, strategies as st

from aiayn.conformance import suite

globals().update(suite("ext.impl:Good", dtypes=["float32"]))


@given(st.integers())
def test_our_own_property(n):
    with open("own-examples.txt", "a") as f:
        f.write("x")
'''

OUTSIDE_CONFTEST = """
from hypothesis import settings

settings.register_profile("mine", max_examples=7, derandomize=True, database=None)
settings.load_profile("mine")
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _copy_checkout(target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    )
    for name in files.stdout.splitlines():
        source = REPO / name
        if source.is_file() and not name.startswith("reports/"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / "reports").mkdir(exist_ok=True)


@pytest.fixture(scope="session")  # built once per worker, whatever other modules' tests run in between
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build the wheel, make a fresh venv with it, write the outside package; return the paths."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("this test builds the wheel from the git checkout; git or .git is missing")
    root = tmp_path_factory.mktemp("installed")
    source, wheels, venv, outside = root / "source", root / "wheels", root / "venv", root / "outside"
    source.mkdir()
    _copy_checkout(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH", "AIAYN_"))}
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(wheels),
            str(source),
        ],
        root,
        env,
    )
    assert built.returncode == 0, f"building the wheel failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    wheel = next(wheels.glob("aiayn-*.whl"))
    made = _run([sys.executable, "-m", "venv", str(venv)], root, env)
    assert made.returncode == 0, made.stderr
    pip = _run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            str(REPO / "constraints.txt"),
            str(wheel),
        ],
        root,
        env,
    )
    assert pip.returncode == 0, f"installing the wheel failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    (outside / "ext").mkdir(parents=True)
    (outside / "ext" / "__init__.py").write_text("")
    (outside / "ext" / "impl.py").write_text(textwrap.dedent(OUTSIDE_IMPL))
    (outside / "tests").mkdir()
    (outside / "tests" / "conftest.py").write_text(textwrap.dedent(OUTSIDE_CONFTEST))
    (outside / "tests" / "test_with_aiayn.py").write_text(textwrap.dedent(OUTSIDE_TESTS))
    return {"wheel": wheel, "venv": venv, "outside": outside, "root": root}


def _env(installed: dict[str, Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH", "AIAYN_", "HYPOTHESIS_"))}
    env["PYTHONPATH"] = str(installed["outside"])  # the outside package only: never the repository
    env["AIAYN_FAILURES"] = str(installed["root"] / "failures")
    env["AIAYN_CACHE"] = str(installed["root"] / "cache")
    env["PATH"] = f"{installed['venv'] / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _aiayn(installed: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(installed["venv"] / "bin" / "aiayn"), *args], installed["outside"], _env(installed))


def test_the_wheel_installs_only_aiayn_and_runs_from_outside(installed: dict[str, Path]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        top = {name.split("/")[0] for name in wheel.namelist()}
        names = wheel.namelist()
    assert {t for t in top if not t.endswith(".dist-info")} == {"aiayn"}, f"the wheel installs top-level {sorted(top)}"
    for data in ("aiayn/benchmarks/baseline/benchmarks-baseline.json", "aiayn/reproductions/data/bleu/ref.de.txt"):
        assert data in names, f"{data} (read at run time) is not in the wheel"
    where = _run(
        [str(installed["venv"] / "bin" / "python"), "-c", "import aiayn, sys; print(aiayn.__file__); print(sys.path)"],
        installed["outside"],
        _env(installed),
    )
    assert str(installed["venv"]) in where.stdout.splitlines()[0], (
        f"aiayn imported from outside the fresh venv: {where.stdout}"
    )
    assert str(REPO) not in where.stdout, f"the repository is on sys.path: {where.stdout}"

    good = _aiayn(installed, "check", "ext.impl:Good", "--profile", "smoke", "--report", "out")
    assert good.returncode == 0, (
        f"aiayn check ext.impl:Good exited {good.returncode}:\n{good.stdout[-4000:]}\n{good.stderr[-2000:]}"
    )
    assert "aiayn conformance: per equation" in good.stdout and "LayerNorm (§3.1)" in good.stdout, good.stdout[-3000:]
    # the command imported aiayn before pytest marked the plugin's package for assertion rewriting: nothing to warn
    assert "PytestAssertRewriteWarning" not in good.stdout + good.stderr, good.stdout[-3000:]
    assert (installed["outside"] / "out" / "conformance-ext-good.md").exists()

    broken = _aiayn(installed, "check", "ext.impl:Broken", "--profile", "smoke")
    assert broken.returncode == 1, f"aiayn check ext.impl:Broken exited {broken.returncode}:\n{broken.stdout[-3000:]}"
    assert "LayerNorm (§3.1)" in broken.stdout and "fail" in broken.stdout

    assert not list(installed["outside"].glob(".hypothesis")) and not list(
        installed["outside"].glob(".pytest_cache")
    ), "aiayn check wrote into the current directory"

    missing = _aiayn(installed, "check", "nosuch:X")
    assert missing.returncode == 4 and "nosuch" in missing.stdout + missing.stderr, (
        missing.returncode,
        missing.stdout[-2000:],
    )
    undeclared = _aiayn(installed, "check", "ext.impl:Good", "--dtype", "bfloat16")
    assert undeclared.returncode == 4 and "does not declare dtype bfloat16" in undeclared.stdout + undeclared.stderr, (
        undeclared.stdout[-2000:]
    )

    plain = _run(
        [
            str(installed["venv"] / "bin" / "python"),
            "-m",
            "pytest",
            "--pyargs",
            "aiayn.conformance",
            "--impl",
            "ext.impl:Good",
            "--aiayn-profile",
            "smoke",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        installed["outside"],
        _env(installed),
    )
    assert plain.returncode == 0, (
        f"pytest --pyargs aiayn.conformance exited {plain.returncode}:\n{plain.stdout[-3000:]}"
    )


def test_the_suite_inside_the_users_own_run_leaves_their_profile_alone(installed: dict[str, Path]) -> None:
    env = _env(installed) | {"AIAYN_PROFILE": "smoke"}
    counter = installed["outside"] / "own-examples.txt"
    counter.unlink(missing_ok=True)
    own = _run(
        [
            str(installed["venv"] / "bin" / "python"),
            "-m",
            "pytest",
            "tests",
            "-q",
            "-p",
            "no:cacheprovider",
            "--aiayn-report",
            "own-report",
        ],
        installed["outside"],
        env,
    )
    assert own.returncode == 0, f"the outside package's own run failed:\n{own.stdout[-4000:]}\n{own.stderr[-2000:]}"
    assert counter.read_text() == "x" * 7, (
        f"their test ran {len(counter.read_text())} examples under their 7-example profile"
    )
    report = json.loads((installed["outside"] / "own-report" / "conformance-ext-good.json").read_text())
    softmax = next(r for r in report["rows"] if r["equation"] == "softmax" and r["dtype"] == "float32")
    assert report["hypothesis_profile"] == "smoke" and softmax["status"] == "pass" and softmax["examples"] >= 8, softmax


def test_a_crash_and_a_hang_fail_their_equations_and_the_run_goes_on(installed: dict[str, Path]) -> None:
    run = _aiayn(
        installed,
        "check",
        "ext.impl:Fragile",
        "--profile",
        "smoke",
        "--timeout",
        "3",
        "--report",
        "fragile",
        "--no-grad",
    )  # the forward passes are what crash and hang here
    out = run.stdout
    assert run.returncode == 1, f"exit {run.returncode}:\n{out[-4000:]}\n{run.stderr[-2000:]}"
    crashed = "the implementation's process ended (killed by SIGSEGV) during softmax, after printing 'Fatal Python"
    assert "softmax (§3.2.1, inside Eq. (1)): ext-fragile.softmax(" in out and crashed in out, out[-4000:]
    assert "Segmentation fault" in out and "where (faulthandler, most recent call first):" in out, out[-4000:]
    assert "LayerNorm (§3.1): ext-fragile.layer_norm(" in out and "did not return within 3 s" in out, out[-4000:]
    assert out.count("replay: aiayn replay ") >= 2
    report = json.loads((installed["outside"] / "fragile" / "conformance-ext-fragile.json").read_text())
    status = {(r["equation"], r["dtype"]): r["status"] for r in report["rows"] if r["direction"] == "forward"}
    assert status[("softmax", "float64")] == "fail" and status[("layer_norm", "float64")] == "fail", status
    for equation in ("scaled_dot_product_attention", "positional_encoding"):
        for dtype in ("float64", "float32"):
            assert status[(equation, dtype)] == "pass", (
                f"{equation} [{dtype}] was not checked after the crash: {status}"
            )
    assert status[("lrate", "float64")] == "pass", status
