"""§3.2.1's footnote: how far the softmax saturates as d_k grows, with and without 1/√d_k.

Paper: §3.2.1 and footnote 4: for q, k with independent components of mean 0 and variance 1,
q·k has variance d_k, so "the dot products grow large in magnitude, pushing the softmax function
into regions where it has extremely small gradients"; Eq. (1) divides by √d_k. The paper prints no
number for this; seed 000 (§3.2.1, "Why it matters today") claims "at d_k = 512 without scaling,
the largest share averages above 0.9 and the gradient collapses", without saying over how many keys.

Measured here, for one query against n keys, all components drawn N(0, 1) (NumPy PCG64, fixed
seeds, so the numbers are deterministic): the mean largest softmax share and the mean Frobenius norm
of the softmax Jacobian J = diag(p) − p pᵀ, for d_k = 1 ... 1024, scaled (÷√d_k) and unscaled.

1. The d_k sweep (n = 10 and 100) samples q and the keys directly.
2. The claim check (d_k = 512, n = 2 ... 3000) uses an exact identity to afford many more trials:
   given q, the scores q·k_j are independent N(0, |q|²), and |q|² ~ χ²(d_k); so a score vector is
   |q|·z with z ~ N(0, I_n). The two samplers are compared where they overlap.

Error bars are Monte Carlo standard errors (sample standard deviation / √trials). Runtime: a few
seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aiayn.kit import Report, figure_style, progress, pyplot, save_png, write_report

NAME = "saturation"
SEED = 20170612  # arXiv submission date of 1706.03762 v1
D_K = tuple(2**e for e in range(11))  # 1 ... 1024
SWEEP_N = (10, 100, 1000)
CHECK = ((64, 10), (64, 100), (512, 10), (512, 100))  # (d_k, n) where the direct sampler checks the χ one
CHECK_TRIALS = 300
CLAIM_D_K, CLAIM_SHARE = 512, 0.9
CLAIM_N = (2, 4, 10, 30, 100, 300, 1000, 3000)
CHUNK_ELEMENTS = 2**18  # bound on the numbers drawn at once (keeps temporaries in cache)


def sweep_trials(n: int) -> int:
    """Trials for the d_k sweep: 2000, fewer for many keys (cost grows with n)."""
    return min(2000, 200_000 // n)


def claim_trials(n: int) -> int:
    """Trials for the claim check: 10000, fewer for many keys (standard errors are reported)."""
    return min(10_000, 8_000_000 // n)


# ---------------------------------------------------------------------------------------------
# Softmax statistics (rows of scores)
# ---------------------------------------------------------------------------------------------


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Max-shifted softmax over the last axis (§3.2.1)."""
    z = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def jacobian_frobenius(p: np.ndarray) -> np.ndarray:
    """‖diag(p) − p pᵀ‖_F for each row p of probabilities, without forming the n × n matrix.

    ‖J‖_F² = Σ_i p_i² (1 − p_i)² + Σ_i p_i² Σ_(j≠i) p_j². Written naively (Σp² − 2Σp³ + (Σp²)²) it
    cancels catastrophically when p is nearly one-hot, exactly the saturated case measured here;
    so for the largest entry 1 − p_max and Σ_(j≠max) p_j² are summed from the other entries
    directly, and for the others (p_i <= 1/2) the subtractions lose no more than a factor 2.
    """
    top = np.argmax(p, axis=-1)[..., None]  # (..., 1)
    is_top = np.arange(p.shape[-1]) == top  # (..., n)
    others = np.where(is_top, 0.0, p)
    square_sum = (p * p).sum(axis=-1, keepdims=True)
    rest = np.where(is_top, others.sum(axis=-1, keepdims=True), 1.0 - p)  # 1 - p_i
    rest_sq = np.where(is_top, (others * others).sum(axis=-1, keepdims=True), square_sum - p * p)  # Σ_(j≠i) p_j²
    return np.sqrt((p * p * (rest * rest + rest_sq)).sum(axis=-1))


def _stats(scores: np.ndarray, d_k: int) -> dict[str, np.ndarray]:
    """Largest share and Jacobian norm per row, unscaled and scaled by 1/√d_k."""
    out = {}
    for label, s in (("unscaled", scores), ("scaled", scores / math.sqrt(d_k))):
        p = softmax_rows(s)
        out[f"{label}_max_share"] = p.max(axis=-1)
        out[f"{label}_jacobian"] = jacobian_frobenius(p)
    return out


def _summary(samples: dict[str, list[np.ndarray]]) -> dict[str, float]:
    out = {}
    for key, parts in samples.items():
        x = np.concatenate(parts)
        out[f"{key}_mean"] = float(x.mean())
        out[f"{key}_se"] = float(x.std(ddof=1) / math.sqrt(x.size))
    return out


# ---------------------------------------------------------------------------------------------
# The two samplers
# ---------------------------------------------------------------------------------------------


def _draw(
    scores_of: Callable[[np.random.Generator, int], np.ndarray],
    rng: np.random.Generator,
    trials: int,
    per_trial: int,
    d_k: int,
    stats: Callable[[np.ndarray, int], dict[str, np.ndarray]],
) -> dict[str, float]:
    """Draw ``trials`` score rows in chunks of at most CHUNK_ELEMENTS numbers; summarise ``stats`` of them."""
    per_chunk = max(1, CHUNK_ELEMENTS // per_trial)
    samples: dict[str, list[np.ndarray]] = {}
    done = 0
    while done < trials:
        t = min(per_chunk, trials - done)
        for key, value in stats(scores_of(rng, t), d_k).items():
            samples.setdefault(key, []).append(value)
        done += t
    return _summary(samples)


def direct(d_k: int, n: int, trials: int, seed: int = SEED) -> dict[str, float]:
    """Sample q (d_k) and n keys (n, d_k) with N(0, 1) components; scores are the dot products."""

    def scores(rng: np.random.Generator, t: int) -> np.ndarray:
        q = rng.standard_normal((t, d_k, 1))  # (t, d_k, 1)
        keys = rng.standard_normal((t, n, d_k))  # (t, n, d_k)
        return (keys @ q)[..., 0]  # (t, n)

    return _draw(scores, np.random.default_rng([seed, 1, d_k, n]), trials, n * d_k, d_k, _stats)


def via_chi(d_k: int, n: int, trials: int, seed: int = SEED, *, max_share_only: bool = False) -> dict[str, float]:
    """Same distribution as :func:`direct`: scores = |q|·z, |q|² ~ χ²(d_k), z ~ N(0, I_n)."""

    def scores(rng: np.random.Generator, t: int) -> np.ndarray:
        norm = np.sqrt(rng.chisquare(d_k, size=(t, 1)))  # (t, 1)
        return norm * rng.standard_normal((t, n))  # (t, n)

    stats = _unscaled_max_share if max_share_only else _stats
    return _draw(scores, np.random.default_rng([seed, 2, d_k, n]), trials, n, d_k, stats)


def _unscaled_max_share(scores: np.ndarray, d_k: int) -> dict[str, np.ndarray]:
    """max_j softmax(s)_j = 1 / Σ_j exp(s_j − max s): the one statistic the claim needs."""
    z = scores - scores.max(axis=-1, keepdims=True)
    return {"unscaled_max_share": 1.0 / np.exp(z).sum(axis=-1)}


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _pm(stats: dict[str, float], key: str) -> str:
    """ "mean ± standard error", the error to two significant digits."""
    return f"{stats[key + '_mean']:.4f} ± {stats[key + '_se']:.2g}"


def crossing(ns: list[int], means: list[float], level: float) -> float | None:
    """First n (log-linear interpolation) where the decreasing series ``means`` falls below ``level``."""
    for i in range(1, len(ns)):
        if means[i - 1] >= level > means[i]:
            t = (means[i - 1] - level) / (means[i - 1] - means[i])
            return math.exp(math.log(ns[i - 1]) + t * (math.log(ns[i]) - math.log(ns[i - 1])))
    return None


def _versus(mean: float, se: float, level: float) -> str:
    """ "above"/"below" only when the mean is more than 3 standard errors from ``level``."""
    if mean - 3 * se > level:
        return f"above {level}"
    if mean + 3 * se < level:
        return f"below {level}"
    return f"within 3 SE of {level}"


def _section_sweep(report: Report, sweep: dict[int, dict[int, dict[str, float]]]) -> None:
    for n, by_dk in sweep.items():
        report.section(f"Against d_k, n = {n} keys ({sweep_trials(n):,} trials per d_k)")
        report.table(
            ["d_k", "largest share, unscaled", "largest share, scaled", "‖J‖_F unscaled", "‖J‖_F scaled"],
            [
                [
                    str(d_k),
                    _pm(s, "unscaled_max_share"),
                    _pm(s, "scaled_max_share"),
                    _pm(s, "unscaled_jacobian"),
                    _pm(s, "scaled_jacobian"),
                ]
                for d_k, s in by_dk.items()
            ],
            "rrrrr",
        )


def _section_check(report: Report, sweep: dict[int, dict[int, dict[str, float]]]) -> list[dict]:
    rows, data = [], []
    for d_k, n in CHECK:
        a, b = direct(d_k, n, CHECK_TRIALS), sweep[n][d_k]
        for key in ("unscaled_max_share", "scaled_max_share", "unscaled_jacobian", "scaled_jacobian"):
            diff = a[key + "_mean"] - b[key + "_mean"]
            se = math.hypot(a[key + "_se"], b[key + "_se"])
            rows.append([str(d_k), str(n), key.replace("_", " "), _pm(a, key), _pm(b, key), f"{diff / se:+.1f}"])
            data.append(
                {
                    "d_k": d_k,
                    "n": n,
                    "statistic": key,
                    "direct": a[key + "_mean"],
                    "chi": b[key + "_mean"],
                    "z": diff / se,
                }
            )
    report.section(
        "Check: the χ sampler against sampling q and the keys directly",
        f"Direct: q and the n keys drawn component by component and multiplied ({CHECK_TRIALS} trials); χ: as in the "
        "tables above. z is the difference in combined standard errors; |z| < 3 is agreement.",
        "",
    )
    report.table(["d_k", "n", "statistic", "direct", "χ", "z"], rows, "rrlrrr")
    return data


def main(out_dir: Path) -> str:
    """Write saturation.{md,json,png} into ``out_dir``; return the one-line verdict."""
    out_dir = Path(out_dir)
    sweep: dict[int, dict[int, dict[str, float]]] = {}
    for n in SWEEP_N:
        progress(NAME, f"d_k sweep, n = {n} keys, {sweep_trials(n)} trials per d_k")
        sweep[n] = {d_k: via_chi(d_k, n, sweep_trials(n)) for d_k in D_K}
    progress(NAME, f"claim check at d_k = {CLAIM_D_K}: n = {CLAIM_N[0]} ... {CLAIM_N[-1]}")
    claim = {n: via_chi(CLAIM_D_K, n, claim_trials(n), max_share_only=True) for n in CLAIM_N}
    report = Report(
        NAME,
        "§3.2.1: softmax saturation against d_k, with and without 1/√d_k",
        precision="float64",
        seed=f"{SEED}(PCG64)",
        packages=("numpy", "matplotlib"),
    )
    report.add(
        "",
        "One query against n keys, every component N(0, 1); p = softmax(q·k_j) unscaled or softmax(q·k_j / √d_k) "
        "scaled (Eq. (1)). Reported: the mean largest share max_j p_j, and the mean Frobenius norm of the softmax "
        "Jacobian ∂p/∂s = diag(p) − p pᵀ (how much the shares move per unit change of the scores: the factor every "
        "gradient through the softmax is multiplied by). ± is one Monte Carlo standard error. Given q, the scores "
        "q·k_j are independent N(0, |q|²) with |q|² ~ χ²(d_k), so rows are drawn as |q|·z, z ~ N(0, I_n) (the χ "
        "sampler; checked against direct sampling below). The paper prints no value here (footnote 4 gives the "
        "variance argument); the printed claim checked is seed 000's. Runtime: a few seconds.",
    )
    _section_sweep(report, sweep)
    progress(NAME, "checking the χ sampler against direct sampling")
    check = _section_check(report, sweep)
    means = [claim[n]["unscaled_max_share_mean"] for n in CLAIM_N]
    cross = crossing(list(CLAIM_N), means, CLAIM_SHARE)
    verdicts = {
        n: _versus(claim[n]["unscaled_max_share_mean"], claim[n]["unscaled_max_share_se"], CLAIM_SHARE) for n in CLAIM_N
    }
    report.section(
        f'Seed 000\'s claim: "at d_k = {CLAIM_D_K} without scaling, the largest share averages above 0.9"',
        "Printed (seed 000, §3.2.1): above 0.9; the number of keys is not stated. Ours: the χ sampler, unscaled. "
        '"above"/"below" only when the mean is more than 3 standard errors from 0.9.',
        "",
    )
    report.table(
        ["keys n", "trials", "largest share, unscaled", "vs 0.9"],
        [[str(n), f"{claim_trials(n):,}", _pm(claim[n], "unscaled_max_share"), verdicts[n]] for n in CLAIM_N],
        "rrrl",
    )
    above = [n for n in CLAIM_N if verdicts[n].startswith("above")]
    below = [n for n in CLAIM_N if verdicts[n].startswith("below")]
    cross_text = (
        "stays above 0.9 over the whole range"
        if cross is None
        else f"crosses 0.9 near n ≈ {cross:.0f} keys (interpolated)"
    )
    report.add(
        "",
        f"The mean largest share falls as the number of keys grows (more keys, smaller gaps between the top scores) "
        f"and {cross_text}: the claim holds for n <= {max(above) if above else '—'} "
        f"and fails for n >= {min(below) if below else '— (not reached)'}. Sentence-length key sets (the seed's own "
        "example has 10 tokens) are well inside the range where it holds.",
    )
    ratio = {
        n: sweep[n][CLAIM_D_K]["unscaled_jacobian_mean"] / sweep[n][CLAIM_D_K]["scaled_jacobian_mean"] for n in SWEEP_N
    }
    peak = {n: max(D_K, key=lambda d: sweep[n][d]["unscaled_jacobian_mean"]) for n in SWEEP_N}
    report.section(
        "What the scaling does",
        "Scaled, the scores have unit variance whatever d_k (footnote 4's argument), and both scaled columns stay "
        "flat across d_k. Unscaled, the largest share climbs towards 1, and the Jacobian norm first rises (peaking "
        "at d_k = " + ", ".join(f"{peak[n]} for n = {n}" for n in SWEEP_N) + ") and then falls: at d_k = "
        f"{CLAIM_D_K} it is " + ", ".join(f"{r:.2f}× the scaled value for n = {n}" for n, r in ratio.items()) + ". "
        'So the "extremely small gradients" of §3.2.1 are the d_k → ∞ trend at a fixed number of keys; at '
        "d_k = 512 the unscaled softmax's Jacobian is smaller than the scaled one only where the scaled softmax is "
        "not already nearly uniform (a uniform softmax over n keys has ‖J‖_F = √(n−1)/n, small for large n).",
        "",
        "![Saturation against d_k](saturation.png)",
    )
    _figure(out_dir, sweep, claim)
    small = SWEEP_N[0]
    report.verdict = (
        f"seed 000's claim holds for short key sets (d_k = {CLAIM_D_K} unscaled: mean largest share "
        f"{claim[10]['unscaled_max_share_mean']:.3f} at n = 10, {claim[100]['unscaled_max_share_mean']:.3f} at n = "
        f"100) but not for every n: it {cross_text}; with 1/√d_k the share is flat in d_k "
        f"({min(sweep[small][d]['scaled_max_share_mean'] for d in D_K):.3f}–"
        f"{max(sweep[small][d]['scaled_max_share_mean'] for d in D_K):.3f} at n = {small}), and at d_k = {CLAIM_D_K} "
        f"the unscaled Jacobian norm is {ratio[small]:.2f}× the scaled one at n = {small}, {ratio[SWEEP_N[-1]]:.2f}× "
        f"at n = {SWEEP_N[-1]}."
    )
    report.data = {
        "seed": SEED,
        "d_k": list(D_K),
        "sweep": {
            str(n): {"trials": sweep_trials(n), "by_d_k": {str(d): s for d, s in v.items()}} for n, v in sweep.items()
        },
        "sampler_check": check,
        "claim_d_k": CLAIM_D_K,
        "claim": {str(n): {"trials": claim_trials(n), **s, "verdict": verdicts[n]} for n, s in claim.items()},
        "crossing_n": cross,
        "jacobian_ratio_unscaled_over_scaled_at_claim_d_k": {str(n): r for n, r in ratio.items()},
    }
    write_report(out_dir, report)
    return report.verdict


def _figure(out_dir: Path, sweep: dict, claim: dict) -> Path:
    plt = pyplot()
    styles = dict(zip(SWEEP_N, ("-", "--", ":")))
    with figure_style():
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for n in SWEEP_N:
            for label, color in (("unscaled", "tab:red"), ("scaled", "tab:blue")):
                kw = dict(color=color, marker="o", ms=3, ls=styles[n], label=f"{label}, n = {n}")
                axes[0].plot(D_K, [sweep[n][d][f"{label}_max_share_mean"] for d in D_K], **kw)
                axes[1].plot(D_K, [sweep[n][d][f"{label}_jacobian_mean"] for d in D_K], **kw)
        axes[0].set(xscale="log", xlabel="d_k", ylabel="mean largest softmax share", title="Largest share")
        axes[1].set(
            xscale="log",
            yscale="log",
            xlabel="d_k",
            ylabel="mean ‖diag(p) − p pᵀ‖_F",
            title="Softmax Jacobian norm (lines as on the left)",
        )
        ns = list(CLAIM_N)
        axes[2].errorbar(
            ns,
            [claim[n]["unscaled_max_share_mean"] for n in ns],
            yerr=[3 * claim[n]["unscaled_max_share_se"] for n in ns],
            color="tab:red",
            marker="o",
            ms=3,
            capsize=2,
            label="unscaled (± 3 SE)",
        )
        axes[2].axhline(CLAIM_SHARE, color="grey", ls="--", lw=1, label="seed 000's 0.9")
        axes[2].set(
            xscale="log",
            xlabel="number of keys n",
            ylabel="mean largest share",
            title=f"Seed 000's claim at d_k = {CLAIM_D_K}",
        )
        for ax in axes:
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7, loc="center right")  # the middle panel uses the same lines
        axes[2].legend(fontsize=7)
        fig.tight_layout()
        return save_png(fig, out_dir / "saturation.png")
