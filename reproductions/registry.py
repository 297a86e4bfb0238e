"""Every reproduction of aiayn, declared once: name, title, kind, entry point, and how it is watched.

Two kinds:

- **deterministic**: the entry point regenerates the report byte for byte from the code (apart from
  the signature line); ``aiayn reproduce`` runs it and the drift test (tests/test_reproductions.py)
  regenerates it and compares.
- **measured**: the numbers come from a measurement that is slow or depends on the machine or on
  fetched data (wall-clock timings, a training run, sacreBLEU's WMT17 data). The measurement stores
  its results, with the commit and the code hash of the code that measured (``measurement``, hashed
  by :func:`aiayn.kit.code_hash`), in the report's JSON; ``rerender`` renders the report again from
  those stored results with the current code. ``aiayn reproduce`` re-renders every measured report
  whose JSON exists (and reruns the quick measurements unless ``--no-measure``); the drift test
  re-renders each one from its committed JSON and compares. A report whose measurement code has
  changed since its results were taken says so in its own text and in the index (``STALE``): its
  numbers need the measurement run again (``command``).

``aiayn reproduce`` writes ``reports/README.md`` from this registry (:mod:`aiayn.reproductions.runner`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.kit import code_hash

DETERMINISTIC, MEASURED = "deterministic", "measured"


@dataclass(frozen=True)
class Reproduction:
    """One report and how it is made.

    ``entry``: "module:function" that computes and writes the report (``function(out_dir)``, or
    ``function(out_dir, measure=...)``); None when a separate command measures (``command``).
    ``rerender``: "module:function" taking (stored JSON data, out_dir) and writing the report again
    (measured reports only). ``measurement``: the module whose code hash stored results carry.
    ``files``: what it writes (the .md first).
    """

    name: str
    title: str
    kind: str
    entry: str | None
    command: str
    files: tuple[str, ...]
    rerender: str | None = None
    measurement: str | None = None
    quick: bool = True  # ``aiayn reproduce`` may run the entry (seconds to a minute)

    @property
    def markdown(self) -> str:
        return self.files[0]


def _files(stem: str, *extra: str) -> tuple[str, ...]:
    return (f"{stem}.md", f"{stem}.json", *extra)


REPRODUCTIONS: tuple[Reproduction, ...] = (
    Reproduction(
        "table1",
        "Table 1: operations, sequential depth and path length of self-attention, recurrent, convolutional and "
        "restricted layers, measured on real layers",
        DETERMINISTIC,
        "aiayn.reproductions.table1:write_counts",
        "aiayn reproduce table1",
        _files("table1", "table1.png"),
    ),
    Reproduction(
        "table1-measured",
        "Table 1, timed: our NumPy layers on one thread (wall clock)",
        MEASURED,
        "aiayn.reproductions.table1:write_measured",
        "aiayn reproduce table1-measured",
        _files("table1-measured", "table1-measured.png"),
        rerender="aiayn.reproductions.table1:rerender_measured",
        measurement="aiayn.reproductions._layers",
    ),
    Reproduction(
        "table2",
        "Table 2: training cost in FLOPs (§6.1, footnote 5), the 1/4 claim, 6·N·D at both vocabularies, "
        "Epoch AI's estimate, BLEU provenance",
        DETERMINISTIC,
        "aiayn.reproductions.table2:main",
        "aiayn reproduce table2",
        _files("table2"),
    ),
    Reproduction(
        "table3",
        "Table 3: parameter counts of every variation, the vocabulary they imply, hypotheses for big's 213M",
        DETERMINISTIC,
        "aiayn.reproductions.table3:main",
        "aiayn reproduce table3",
        _files("table3"),
    ),
    Reproduction(
        "saturation",
        "§3.2.1 footnote: softmax saturation against d_k with and without 1/sqrt(d_k)",
        DETERMINISTIC,
        "aiayn.reproductions.saturation:main",
        "aiayn reproduce saturation",
        _files("saturation", "saturation.png"),
    ),
    Reproduction(
        "seeds",
        "The worked numbers of the explanatory texts (shared/seeds/)",
        DETERMINISTIC,
        "aiayn.reproductions.seeds:main",
        "aiayn reproduce seeds",
        _files("seeds"),
    ),
    Reproduction(
        "figures",
        "Figures: positional-encoding heatmap (§3.5), learning-rate schedule (§5.3)",
        DETERMINISTIC,
        "aiayn.reproductions.figures:main",
        "aiayn reproduce figures",
        _files("figures", "positional-encoding.png", "lrate.png"),
    ),
    Reproduction(
        "bleu",
        "BLEU scoring: the paper's tokenized BLEU against sacreBLEU on sixteen WMT17 systems, the gap explained; "
        "a worked example",
        MEASURED,
        "aiayn.reproductions.bleu:main",
        "aiayn reproduce bleu",
        _files("bleu"),
        rerender="aiayn.reproductions.bleu:rerender",
        measurement="aiayn.reproductions.bleu_wmt17",
    ),
    Reproduction(
        "bleu-training",
        "BLEU reproduction: the paper's recipe trained on CPU with our equations (EN→DE, EN→FR), "
        "repetition, why beam search repeats",
        MEASURED,
        None,
        "make reproduce (EN→DE) / make reproduce-bleu (and EN→FR): aiayn train ..., then aiayn train-report",
        _files("bleu-training"),
        rerender="aiayn.reproductions.translation.report:rerender",
        measurement="aiayn.reproductions.translation.run",
        quick=False,
    ),
    Reproduction(
        "bleu-ablation",
        "Table 3's variations at CPU scale: 8 paired seeds per row, paired t-tests and exact sign-flip tests, "
        "verdicts against the paper's direction",
        MEASURED,
        None,
        "make reproduce-bleu (aiayn ablation --jobs 2)",
        _files("bleu-ablation"),
        rerender="aiayn.reproductions.translation.ablation_report:rerender",
        measurement="aiayn.reproductions.translation.ablation",
        quick=False,
    ),
)
BY_NAME: dict[str, Reproduction] = {r.name: r for r in REPRODUCTIONS}


def resolve(spec: str) -> Callable[..., Any]:
    """The function a "module:function" spec names (imported on demand: only the chosen reproduction's code)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def stored(out_dir: Path, reproduction: Reproduction) -> dict[str, Any] | None:
    """The JSON a measured report left in ``out_dir``, or None."""
    path = Path(out_dir) / reproduction.files[1]
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def status(reproduction: Reproduction, data: dict[str, Any] | None) -> dict[str, Any]:
    """Is a measured report's stored measurement still the current code's? ``{"state": ..., ...}``.

    States: "deterministic" (regenerated every time), "missing" (no stored results), "current" (every
    stored code hash equals the measurement module's current one), "stale" (some does not).
    """
    if reproduction.kind == DETERMINISTIC:
        return {"state": "deterministic"}
    if data is None:
        return {"state": "missing"}
    measured = data.get("measurement") or {}
    codes, commits = measured.get("codes", []), measured.get("commits", [])
    now = code_hash(reproduction.measurement)
    return {
        "state": "current" if codes and all(c == now for c in codes) else "stale",
        "codes": codes,
        "commits": commits,
        "now": now,
        "command": reproduction.command,
    }


def staleness_line(reproduction: Reproduction, measurement: dict[str, Any]) -> str:
    """The sentence a measured report carries about its results' code (the index carries the same state)."""
    now = code_hash(reproduction.measurement)
    codes, commits = measurement.get("codes", []), measurement.get("commits", [])
    where = (
        f"commit {', '.join(commits) or 'unknown'}, code {', '.join(codes) or 'unknown'} (`{reproduction.measurement}`)"
    )
    if codes and all(c == now for c in codes):
        return f"Results measured at {where}: the measurement code is unchanged since (current)."
    return (
        f"**STALE:** results measured at {where}; that code has changed since, so the numbers may no longer be what it "
        f"measures: rerun `{reproduction.command}`."
    )
