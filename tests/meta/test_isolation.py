"""The worker's record of the call in flight (``conformance/run/isolation.py``, ``_Slot``): what the controller reads
after a worker died names the equation and the call, so the slot must hold the latest record, stay parseable
whatever is written to it, and outlive the process that wrote it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from aiayn.conformance.run.isolation import _Slot


def test_the_slot_returns_the_latest_record(tmp_path: Path) -> None:
    slot = _Slot(tmp_path / "gw0.json")
    assert _Slot.read(tmp_path / "gw0.json") is None  # nothing written yet: no record, not a crash
    slot.write({"equation": "layer_norm", "call": "layer_norm", "inputs": "x (2, 3) float32"})
    slot.write({"equation": "softmax", "call": None})  # shorter than the one before: the length says where it ends
    assert _Slot.read(tmp_path / "gw0.json") == {"equation": "softmax", "call": None}


def test_an_oversized_record_is_cut_to_fit_and_stays_json(tmp_path: Path) -> None:
    """Every value is cut to an equal share, whatever the characters (12 bytes each, escaped, at worst)."""
    huge = {
        "equation": "softmax",
        "inputs": "\U0001f600" * _Slot.SIZE,
        "test": "t" * (2 * _Slot.SIZE),
        "dtype": "float32",
    }
    _Slot(tmp_path / "gw1.json").write(huge)
    record = _Slot.read(tmp_path / "gw1.json")
    assert record is not None, "the cut record did not parse"
    assert record["equation"] == "softmax" and record["dtype"] == "float32"
    assert record["inputs"].endswith(" ... (cut)") and record["test"].endswith(" ... (cut)")
    assert len(json.dumps(record).encode()) <= _Slot.SIZE - 8


def test_the_record_outlives_a_killed_writer(tmp_path: Path) -> None:
    """A process that writes its record and is then killed (SIGKILL: no flush, no atexit) leaves the record readable."""
    path = tmp_path / "gw2.json"
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from aiayn.conformance.run.isolation import _Slot\n"
        f"_Slot(Path({str(path)!r})).write({{'equation': 'decoder_layer', 'call': 'multi_head_attention'}})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
    assert _Slot.read(path) == {"equation": "decoder_layer", "call": "multi_head_attention"}
