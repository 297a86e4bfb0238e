"""The paper's printed values, as data with provenance.

Source: Vaswani et al., "Attention Is All You Need", arXiv:1706.03762 v7 (the latest revision),
transcribed in ``../shared/PAPER.md``; where the NIPS 2017 version (or another place in v7)
prints something else, both are kept and the record says which is which.

Every record is a :class:`Printed`: the value as a number (or a string where the cell is a
formula such as ``O(n²·d)``), the text exactly as printed, and where it is printed (table or
section, row, column, revision). Reports look values up by key with :func:`printed`; they show the
printed value beside their own and never put a printed value in their "ours" column.

Keys are dotted paths: ``table3.C4.params``, ``table2.ConvS2S.cost_en_de``, ``s5.2.base.hours``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

V7 = "arXiv:1706.03762v7"
V7_AND_NIPS = "arXiv:1706.03762v7 and NIPS 2017"
NIPS = "NIPS 2017"


@dataclass(frozen=True)
class Printed:
    """One value as the paper prints it.

    ``value``: the number (int or float) or, for formula cells, the printed string; None for a
    blank cell (Table 3: "blank = same as base"). ``text``: the characters as printed.
    ``where``: "Table 3", "§5.2", "footnote 5", ...; ``row``/``column``: the cell (or the phrase
    for text); ``revision``: which revision prints it; ``note``: anything a reader must know.
    """

    key: str
    value: float | int | str | None
    text: str
    where: str
    row: str
    column: str
    revision: str = V7_AND_NIPS
    note: str = ""

    def provenance(self) -> str:
        """One short human line: where the value is printed."""
        cell = f"{self.where}, row {self.row!r}, column {self.column!r}" if self.row else f"{self.where}, {self.column}"
        return f"{cell} ({self.revision})"


def _records() -> Iterator[Printed]:
    yield from _table1()
    yield from _table2()
    yield from _table3()
    yield from _table4()
    yield from _text()


# ---------------------------------------------------------------------------------------------
# Table 1 (and §4's two extra rows)
# ---------------------------------------------------------------------------------------------

_TABLE1 = {
    # key: (row as printed, complexity, sequential operations, maximum path length)
    "self_attention": ("Self-Attention", "O(n²·d)", "O(1)", "O(1)"),
    "recurrent": ("Recurrent", "O(n·d²)", "O(n)", "O(n)"),
    "convolutional": ("Convolutional", "O(k·n·d²)", "O(1)", "O(log_k(n))"),
    "restricted_self_attention": ("Self-Attention (restricted)", "O(r·n·d)", "O(1)", "O(n/r)"),
}


def _table1() -> Iterator[Printed]:
    columns = ("complexity", "sequential", "path")
    names = ("Complexity per Layer", "Sequential Operations", "Maximum Path Length")
    for key, (row, *cells) in _TABLE1.items():
        for column, name, cell in zip(columns, names, cells):
            yield Printed(f"table1.{key}.{column}", cell, cell, "Table 1", row, name)
    yield Printed(
        "s4.convolutional_contiguous.path",
        "O(n/k)",
        "O(n/k)",
        "§4",
        "",
        "stacked layers for contiguous kernels",
    )
    yield Printed(
        "s4.separable_convolutional.complexity",
        "O(k·n·d + n·d²)",
        "O(k·n·d + n·d²)",
        "§4",
        "",
        "complexity of a separable convolution",
    )


# ---------------------------------------------------------------------------------------------
# Table 2: BLEU (newstest2014) and training cost
# ---------------------------------------------------------------------------------------------

# row -> (BLEU EN-DE, BLEU EN-FR, cost EN-DE, cost EN-FR); None = blank cell.
_TABLE2: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "ByteNet": ("23.75", None, None, None),
    "Deep-Att + PosUnk": (None, "39.2", None, "1.0·10^20"),
    "GNMT + RL": ("24.6", "39.92", "2.3·10^19", "1.4·10^20"),
    "ConvS2S": ("25.16", "40.46", "9.6·10^18", "1.5·10^20"),
    "MoE": ("26.03", "40.56", "2.0·10^19", "1.2·10^20"),
    "Deep-Att + PosUnk Ensemble": (None, "40.4", None, "8.0·10^20"),
    "GNMT + RL Ensemble": ("26.30", "41.16", "1.8·10^20", "1.1·10^21"),
    "ConvS2S Ensemble": ("26.36", "41.29", "7.7·10^19", "1.2·10^21"),
    "Transformer (base model)": ("27.3", "38.1", "3.3·10^18", None),
    "Transformer (big)": ("28.4", "41.8", "2.3·10^19", None),
}
TABLE2_ROWS: tuple[str, ...] = tuple(_TABLE2)
TABLE2_ENSEMBLES: frozenset[str] = frozenset(r for r in _TABLE2 if r.endswith("Ensemble"))
TABLE2_TRANSFORMERS: Mapping[str, str] = MappingProxyType(
    {"base": "Transformer (base model)", "big": "Transformer (big)"}
)
_TABLE2_COLUMNS = (
    ("bleu_en_de", "BLEU EN-DE"),
    ("bleu_en_fr", "BLEU EN-FR"),
    ("cost_en_de", "Training Cost (FLOPs) EN-DE"),
    ("cost_en_fr", "Training Cost (FLOPs) EN-FR"),
)


def parse_power_of_ten(text: str) -> float:
    """``"2.3·10^19"`` -> 2.3e19 (the printed mantissa·10^exponent form)."""
    mantissa, exponent = text.split("·10^")
    return float(f"{mantissa}e{exponent}")


def _table2() -> Iterator[Printed]:
    for row, cells in _TABLE2.items():
        for (column, name), cell in zip(_TABLE2_COLUMNS, cells):
            if cell is None:
                continue
            value = parse_power_of_ten(cell) if column.startswith("cost") else float(cell)
            note = ""
            if row.startswith("Transformer") and column == "cost_en_de":
                note = "one cell spanning EN-DE and EN-FR"
            if row == "Transformer (big)" and column == "bleu_en_fr":
                note = "v7 Table 2 and abstract; the v7 §6.1 text and the NIPS version print 41.0"
            revision = V7 if note.startswith("v7 Table 2") else V7_AND_NIPS
            yield Printed(f"table2.{row}.{column}", value, cell, "Table 2", row, name, revision, note)
    yield Printed(
        "s6.1.big.bleu_en_fr",
        41.0,
        "41.0",
        "§6.1",
        "",
        "big EN-FR BLEU in the text",
        V7_AND_NIPS,
        "v7 Table 2 and the v7 abstract print 41.8; the NIPS version prints 41.0",
    )
    for gpu, rate in (("K80", "2.8"), ("K40", "3.7"), ("M40", "6.0"), ("P100", "9.5")):
        yield Printed(
            f"footnote5.{gpu}",
            float(rate),
            rate,
            "footnote 5",
            "",
            f"sustained TFLOPS of {gpu}",
        )
    yield Printed(
        "s6.1.cost_claim",
        0.25,
        "less than 1/4 the training cost of the previous state-of-the-art model",
        "§6.1",
        "",
        "big EN-FR cost claim",
    )
    yield Printed(
        "s6.1.en_de_margin",
        2.0,
        "by more than 2.0 BLEU",
        "§6.1",
        "",
        "big EN-DE outperforms the best previous models (including ensembles)",
    )


# ---------------------------------------------------------------------------------------------
# Table 3: variations on newstest2013
# ---------------------------------------------------------------------------------------------

TABLE3_COLUMNS: tuple[str, ...] = (
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "P_drop",
    "eps_ls",
    "steps",
    "PPL",
    "BLEU",
    "params",
)
# label -> (row group as printed, cells in TABLE3_COLUMNS order, "" = blank = same as base).
_TABLE3: dict[str, tuple[str, tuple[str, ...]]] = {
    "base": ("base", ("6", "512", "2048", "8", "64", "64", "0.1", "0.1", "100K", "4.92", "25.8", "65")),
    "A1": ("(A)", ("", "", "", "1", "512", "512", "", "", "", "5.29", "24.9", "")),
    "A2": ("(A)", ("", "", "", "4", "128", "128", "", "", "", "5.00", "25.5", "")),
    "A3": ("(A)", ("", "", "", "16", "32", "32", "", "", "", "4.91", "25.8", "")),
    "A4": ("(A)", ("", "", "", "32", "16", "16", "", "", "", "5.01", "25.4", "")),
    "B1": ("(B)", ("", "", "", "", "16", "", "", "", "", "5.16", "25.1", "58")),
    "B2": ("(B)", ("", "", "", "", "32", "", "", "", "", "5.01", "25.4", "60")),
    "C1": ("(C)", ("2", "", "", "", "", "", "", "", "", "6.11", "23.7", "36")),
    "C2": ("(C)", ("4", "", "", "", "", "", "", "", "", "5.19", "25.3", "50")),
    "C3": ("(C)", ("8", "", "", "", "", "", "", "", "", "4.88", "25.5", "80")),
    "C4": ("(C)", ("", "256", "", "", "32", "32", "", "", "", "5.75", "24.5", "28")),
    "C5": ("(C)", ("", "1024", "", "", "128", "128", "", "", "", "4.66", "26.0", "168")),
    "C6": ("(C)", ("", "", "1024", "", "", "", "", "", "", "5.12", "25.4", "53")),
    "C7": ("(C)", ("", "", "4096", "", "", "", "", "", "", "4.75", "26.2", "90")),
    "D1": ("(D)", ("", "", "", "", "", "", "0.0", "", "", "5.77", "24.6", "")),
    "D2": ("(D)", ("", "", "", "", "", "", "0.2", "", "", "4.95", "25.5", "")),
    "D3": ("(D)", ("", "", "", "", "", "", "", "0.0", "", "4.67", "25.3", "")),
    "D4": ("(D)", ("", "", "", "", "", "", "", "0.2", "", "5.47", "25.7", "")),
    "E": ("(E)", ("", "", "", "", "", "", "", "", "", "4.92", "25.7", "")),
    "big": ("big", ("6", "1024", "4096", "16", "", "", "0.3", "", "300K", "4.33", "26.4", "213")),
}
TABLE3_ROWS: tuple[str, ...] = tuple(_TABLE3)
TABLE3_ROW_E_TEXT = "positional embedding instead of sinusoids"


def _table3_value(column: str, cell: str) -> float | int | None:
    if cell == "":
        return None
    if column == "steps":
        return int(cell.removesuffix("K")) * 1000
    if column in ("P_drop", "eps_ls", "PPL", "BLEU"):
        return float(cell)
    return int(cell)


def _table3() -> Iterator[Printed]:
    for label, (group, cells) in _TABLE3.items():
        for column, cell in zip(TABLE3_COLUMNS, cells):
            note = "blank: same as base" if cell == "" else ""
            if column == "params" and cell:
                note = "×10^6, rounded to an integer number of millions"
            yield Printed(
                f"table3.{label}.{column}",
                _table3_value(column, cell),
                cell,
                "Table 3",
                f"{group} {label}",
                column,
                V7_AND_NIPS,
                note,
            )
    yield Printed(
        "s5.1.vocab_en_de",
        37000,
        "about 37000 tokens",
        "§5.1",
        "",
        "shared source-target BPE vocabulary, EN-DE",
    )
    yield Printed("s5.1.vocab_en_fr", 32000, "32000 word-piece vocabulary", "§5.1", "", "vocabulary, EN-FR")


# ---------------------------------------------------------------------------------------------
# Table 4 and the text (§5, §6)
# ---------------------------------------------------------------------------------------------


def _table4() -> Iterator[Printed]:
    yield Printed("table4.wsj_only", 91.3, "91.3", "Table 4", "Transformer (4 layers)", "WSJ only, discriminative")
    yield Printed("table4.semi_supervised", 92.7, "92.7", "Table 4", "Transformer (4 layers)", "semi-supervised")


def _text() -> Iterator[Printed]:
    hardware = [
        ("s5.2.num_gpus", 8, "8 NVIDIA P100 GPUs", "GPUs on one machine"),
        ("s5.2.base.seconds_per_step", 0.4, "about 0.4 seconds", "base: time per training step"),
        ("s5.2.base.steps", 100_000, "100,000 steps", "base: training steps"),
        ("s5.2.base.hours", 12.0, "12 hours", "base: training time"),
        ("s5.2.big.seconds_per_step", 1.0, "1.0 seconds", "big: time per training step"),
        ("s5.2.big.steps", 300_000, "300,000 steps", "big: training steps"),
        ("s5.2.big.days", 3.5, "3.5 days", "big: training time"),
    ]
    for key, value, text, column in hardware:
        yield Printed(key, value, text, "§5.2", "", column)
    yield Printed(
        "s5.1.batch_source_tokens",
        25000,
        "approximately 25000 source tokens",
        "§5.1",
        "",
        "source tokens per training batch",
    )
    yield Printed(
        "s5.1.batch_target_tokens",
        25000,
        "and 25000 target tokens",
        "§5.1",
        "",
        "target tokens per training batch",
    )
    yield Printed("s5.3.warmup_steps", 4000, "warmup_steps = 4000", "§5.3", "", "Eq. (3) warmup")
    yield Printed("s5.4.eps_ls", 0.1, "ε_ls = 0.1", "§5.4", "", "label smoothing")


PRINTED: Mapping[str, Printed] = MappingProxyType({p.key: p for p in _records()})


def printed(key: str) -> Printed:
    """The printed record for ``key``; raise KeyError listing near keys when unknown."""
    try:
        return PRINTED[key]
    except KeyError:
        prefix = key.rsplit(".", 1)[0]
        near = [k for k in PRINTED if k.startswith(prefix)][:8]
        raise KeyError(f"key: no printed value {key!r}; keys under {prefix!r}: {near}") from None
