"""``aiayn check`` in a subprocess, as the meta-tests run it on their stand-in implementations (modules of this
folder, put on PYTHONPATH): an environment without the outer run's xdist and aiayn variables, one thread, and the
output pytest gives a terminal of 80 columns outside CI (CI, BUILD_NUMBER and COLUMNS removed: under CI pytest
prints a failure's message in full twice, in the traceback and in the short summary)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def aiayn_check(cwd: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m aiayn check ARGS`` in ``cwd``; ``env``: more variables (e.g. AIAYN_FAILURES)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "AIAYN_"))}
    base = {k: v for k, v in base.items() if k not in ("CI", "BUILD_NUMBER", "COLUMNS")}
    base |= {
        "COLUMNS": "80",
        "PYTHONPATH": os.pathsep.join([str(HERE), base.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "aiayn", "check", *args],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
