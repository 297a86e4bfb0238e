"""Figures: the positional-encoding heatmap (§3.5) and the learning-rate schedule (§5.3).

Reproduces no printed number (the paper shows neither figure); draws two equations from the
oracle so a reader can see them: ``aiayn.reference.positional.positional_encoding`` (positions ×
dimensions, d_model = 512) and ``aiayn.reference.training.lrate`` (Eq. (3), warmup 4000) for the base
(d_model = 512, 100,000 steps) and big (d_model = 1024, 300,000 steps) models. figures.md lists
every figure the reproductions draw, with the numbers a reader would read off each. PNGs are
byte-identical from run to run (see ``_report.save_png``). Runtime: about a second.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from aiayn.kit import Report, figure_style, progress, pyplot, save_png, write_report
from aiayn.reference.counts import BASE, BIG
from aiayn.reference.positional import positional_encoding
from aiayn.reference.training import lrate
from aiayn.reproductions import paper

NAME = "figures"
PE_POSITIONS, PE_D_MODEL = 100, 512
RUNS = {"base": BASE, "big": BIG}
# Figures drawn by other reports, listed here so figures.md indexes them all.
OTHER_FIGURES = {
    "table1.png": (
        "Table 1: operations counted on the real layers against n at d = 512, with the n = d crossover (table1.md)"
    ),
    "table1-measured.png": (
        "Table 1, timed: our NumPy layers' seconds per call against n (table1-measured.md; measured, re-rendered from "
        "stored timings)"
    ),
    "saturation.png": (
        "§3.2.1: largest softmax share and Jacobian norm against d_k, and seed 000's 0.9 claim (saturation.md)"
    ),
}


def _pe_figure(out_dir: Path, pe: np.ndarray) -> Path:
    plt = pyplot()
    with figure_style():
        fig, ax = plt.subplots(figsize=(9, 4))
        image = ax.imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        fig.colorbar(image, ax=ax, label="PE(pos, dim)")
        ax.set(
            xlabel="dimension (even: sin, odd: cos)",
            ylabel="position",
            title=f"Sinusoidal positional encoding, §3.5 (d_model = {pe.shape[1]}, positions 0–{pe.shape[0] - 1})",
        )
        fig.tight_layout()
        return save_png(fig, out_dir / "positional-encoding.png")


def _lrate_figure(out_dir: Path, curves: dict[str, tuple[np.ndarray, np.ndarray]], warmup: int) -> Path:
    plt = pyplot()
    with figure_style():
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, (steps, rates) in curves.items():
            ax.plot(steps, rates * 1e4, label=f"{name}: d_model = {RUNS[name].d_model}, {steps[-1]:,} steps")
        ax.axvline(warmup, color="grey", ls="--", lw=1, label=f"warmup_steps = {warmup}")
        ax.set(
            xlabel="training step",
            ylabel="learning rate (×10⁻⁴)",
            title="Eq. (3): lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)",
        )
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        return save_png(fig, out_dir / "lrate.png")


def main(out_dir: Path) -> str:
    """Write positional-encoding.png, lrate.png, figures.md and figures.json; return the verdict."""
    out_dir = Path(out_dir)
    progress(NAME, "positional-encoding heatmap")
    pe = positional_encoding(PE_POSITIONS, PE_D_MODEL)
    _pe_figure(out_dir, pe)
    progress(NAME, "learning-rate schedule, base and big")
    warmup = int(paper.printed("s5.3.warmup_steps").value)
    curves, rows, data = {}, [], {}
    for name, config in RUNS.items():
        steps = np.arange(0, config.train_steps + 1, 100)
        curves[name] = (steps, np.asarray(lrate(steps, config.d_model, warmup)))
        peak, end = (
            float(lrate(warmup, config.d_model, warmup)),
            float(lrate(config.train_steps, config.d_model, warmup)),
        )
        closed_peak = 1 / math.sqrt(config.d_model * warmup)
        rows.append(
            [name, str(config.d_model), f"{config.train_steps:,}", f"{peak:.4e}", f"{closed_peak:.4e}", f"{end:.4e}"]
        )
        data[name] = {
            "d_model": config.d_model,
            "train_steps": config.train_steps,
            "peak_step": warmup,
            "peak": peak,
            "peak_closed_form": closed_peak,
            "final": end,
        }
    _lrate_figure(out_dir, curves, warmup)
    longest = 2 * math.pi * 10000
    report = Report(
        NAME,
        "Figures: positional encoding and the learning-rate schedule",
        precision="float64",
        packages=("numpy", "matplotlib"),
    )
    report.section(
        "Positional encoding (§3.5)",
        f"`aiayn.reference.positional.positional_encoding({PE_POSITIONS}, {PE_D_MODEL})`: rows are positions, columns "
        "dimensions (even: sin, odd: cos). Dimension pair i has wavelength 2π·10000^(2i/d_model): from 2π ≈ 6.3 "
        f"positions at the left to 2π·10000^(510/512) ≈ {2 * math.pi * 10000 ** (510 / 512):,.0f} at the right (§3.5: "
        f'"a geometric progression from 2π to 10000 · 2π", {longest:,.0f}); over {PE_POSITIONS} positions the '
        "right half barely changes.",
        "",
        "![Positional encoding heatmap](positional-encoding.png)",
    )
    report.section(
        "Learning-rate schedule (§5.3, Eq. (3))",
        f"`aiayn.reference.training.lrate(step, d_model, warmup_steps={warmup})` every 100 steps for each model's "
        "training length (Table 3). The peak is at step = warmup, where both branches of the min meet: "
        "1/√(d_model · warmup) (closed form beside the oracle's value). The paper prints no values; seed 000's "
        "7.0·10⁻⁴ peak and 1.4·10⁻⁴ at step 100,000 for the base model are checked in seeds.md.",
        "",
    )
    report.table(
        ["model", "d_model", "steps", "peak (step 4000)", "1/√(d_model·warmup)", "at the last step"], rows, "lrrrrr"
    )
    report.add("", "![Learning-rate schedule](lrate.png)")
    report.section(
        "Figures drawn by the other reports",
        *(f"- [{png}]({png}): {what}" for png, what in OTHER_FIGURES.items()),
    )
    agree = all(abs(d["peak"] - d["peak_closed_form"]) <= 4 * 2**-53 * d["peak_closed_form"] for d in data.values())
    report.verdict = (
        f"drawn from the oracle: PE heatmap ({PE_POSITIONS} × {PE_D_MODEL}) and lrate for base and big; peaks "
        + ", ".join(f"{n} {d['peak']:.3e}" for n, d in data.items())
        + f" at step {warmup} ({'equal to' if agree else 'NOT equal to'} 1/√(d_model·warmup) within 4 ulps)"
    )
    report.data = {
        "positional_encoding": {"positions": PE_POSITIONS, "d_model": PE_D_MODEL},
        "lrate": data,
        "figures": ["positional-encoding.png", "lrate.png", *OTHER_FIGURES],
    }
    write_report(out_dir, report)
    return report.verdict
