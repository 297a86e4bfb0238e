"""Reproductions: regenerate the paper's tables and worked numbers into ``reports/``.

Each reproduction is a module ``reproductions/<name>.py`` with a ``main(out_dir) -> str`` that
writes ``<name>.md`` and ``<name>.json`` (and ``.png`` figures where a picture says more) into
``out_dir`` and returns a one-line verdict. ``aiayn reproduce`` runs every one that exists
(``aiayn reproduce NAME`` runs one) and writes ``reports/README.md`` as the index, saying
which are not built yet.

Printed values come from ``aiayn.reproductions.paper`` (the paper's numbers as data, with provenance);
a report's "ours" column is always computed in the run. Reports are byte-identical from run to run
apart from the signature line, except the measured timings (``table1-measured.*``), which the
drift test (tests/test_reproductions.py) skips.
"""

from __future__ import annotations

# name -> (what it reproduces). Order is the order of the index.
PLANNED: dict[str, str] = {
    "table1": "Table 1: per-layer complexity of self-attention, recurrent, convolutional, restricted layers",
    "table2": "Table 2: training cost in FLOPs (§6.1, footnote 5), the 1/4 claim, 6·N·D, BLEU provenance",
    "table3": "Table 3: parameter counts of every variation, and the vocabulary they imply",
    "saturation": "§3.2.1 footnote: softmax saturation against d_k with and without 1/sqrt(d_k)",
    "seeds": "The worked numbers of the explanatory texts (shared/seeds/)",
    "figures": "Figures: positional-encoding heatmap (§3.5), learning-rate schedule (§5.3)",
    "bleu": "BLEU scoring: paper-style tokenized BLEU and sacreBLEU on a shipped sample",
}

# Files written by a reproduction that vary from run to run (wall-clock timings); the drift test
# skips them and the index marks them.
MEASURED_FILES: tuple[str, ...] = (
    "table1-measured.md", "table1-measured.json", "table1-measured.png",  # wall-clock timings
    "bleu-wmt17.md", "bleu-wmt17.json",  # needs sacreBLEU's source package (fetched into a cache)
)
