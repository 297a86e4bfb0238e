"""Reproductions: regenerate the paper's tables and worked numbers into ``reports/``.

Each reproduction is a module ``reproductions/<name>.py`` with a ``main(out_dir) -> str`` that
writes ``<name>.md`` (and ``.json``, ``.png`` where useful) into ``out_dir`` and returns a one-line
verdict. ``python -m reproductions`` runs every one that exists (``python -m reproductions NAME``
runs one) and writes ``reports/README.md`` as the index, saying which are not built yet.
"""

from __future__ import annotations

# name -> (what it reproduces). Order is the order of the index.
PLANNED: dict[str, str] = {
    "table1": "Table 1: per-layer complexity of self-attention, recurrent, convolutional, restricted layers",
    "table2": "Table 2: training cost in FLOPs (§6.1, footnote 5) and BLEU provenance",
    "table3": "Table 3: parameter counts of every variation, and the vocabulary they imply",
    "seeds": "The worked numbers of the explanatory texts (shared/seeds/)",
    "saturation": "§3.2.1 footnote: softmax saturation against d_k with and without 1/sqrt(d_k)",
}
