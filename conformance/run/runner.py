"""How ``aiayn check`` (and the mutant runner) start the suite: pytest, isolated from the current directory.

The suite runs as ``pytest --pyargs aiayn.conformance`` with the plugin's options, in pytest-xdist
worker processes by default (a crash or a hang in the implementation then fails one check, not the
run; ``run/isolation.py``), and with a configuration of its own: an empty ini file and the folder that
holds the suite as the root, so a ``pytest.ini``, ``conftest.py`` or ``addopts`` of the project you run it
from does not change what is checked, and nothing (no ``.pytest_cache``, no ``.hypothesis``) is
written into the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["default_workers", "pytest_arguments"]


def default_workers() -> int:
    """Worker processes of ``aiayn check`` by default: the CPUs this process may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _empty_ini() -> Path:
    """An ini file with an empty [pytest] section, so that no project configuration applies. It travels with the
    package (a name pytest never finds on its own), so no shared temporary path can be taken or be a folder."""
    return Path(__file__).resolve().parent.parent / "isolated.ini"


def pytest_arguments(
    specs: Sequence[str],
    *,
    dtypes: Sequence[str] = (),
    profile: str | None = None,
    report: str | Path | None = None,
    workers: int = 1,
    timeout: float | None = None,
    keyword: str | None = None,
    seed: int | None = None,
    device: str | None = None,
    quiet: bool = True,
    agreement_only: bool = False,
    no_grad: bool = False,
    no_decode: bool = False,
    force: bool = False,
    in_process: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line (without ``pytest`` itself) that checks ``specs``."""
    root = (
        Path(__file__).resolve().parents[2]
    )  # the folder holding the suite's folder: test ids read conformance/test_*.py
    args = [
        "--pyargs",
        "aiayn.conformance",
        "-c",
        str(_empty_ini()),
        "--rootdir",
        str(root),
        "-p",
        "no:cacheprovider",
        "--aiayn-own-session",
        # aiayn (this command) is imported before pytest marks the plugin's package for assertion rewriting; the
        # suite's checks report through their own messages, not through rewritten asserts
        "-W",
        "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning",
    ]
    # -rN: no short summary, whose ids pytest writes relative to the current directory (long paths into
    # site-packages); each failure is printed with its suite-relative id as it happens, and the run ends with
    # the per-equation table (-r after -- brings the summary back)
    args += ["-q", "-rN"] if quiet else []
    args += [f"--impl={spec}" for spec in specs]
    args += [f"--dtype={dtype}" for dtype in dtypes]
    if profile:
        args.append(f"--aiayn-profile={profile}")
    if device:
        args.append(f"--aiayn-device={device}")
    if report is not None:
        args.append(f"--aiayn-report={report}")
        args += ["--aiayn-force"] if force else []
    if timeout is not None:
        args.append(f"--aiayn-timeout={timeout:g}")
    if keyword:
        args += ["-k", keyword]
    if agreement_only:
        args.append("--aiayn-agreement-only")
    if no_grad:
        args.append("--aiayn-no-grad")
    if no_decode:
        args.append("--aiayn-no-decode")
    if in_process:
        args.append("--aiayn-in-process")
    if seed is not None:
        args.append(f"--hypothesis-seed={seed}")
    if workers > 0:
        # a worker that crashes is replaced; each crash is one failed check, so allow many
        args += ["-n", str(workers), "--max-worker-restart=1000"]
    else:
        args += ["-p", "no:xdist"]
    return args + list(extra)
