"""``bleu-ablation.{md,json}``: Table 3's variations at CPU scale, with statistics, from the runs' results.

Rendering only: :func:`make_report` turns the per-run results of ``aiayn ablation``
(``ablation.py``) into the report, so the report can be re-rendered from its own JSON (the drift
test does) without training anything again.

Statistics (the paired design): every row is trained with the same seeds, and a seed fixes the
batch order (the same batches for every row) as well as the row's initial weights and dropout
masks, so row and base are compared seed by seed.

- Per row: the geometric mean of the seeds' dev perplexities, exp(mean dev NLL), and a 95%
  confidence interval, exp of the mean dev NLL ± the t-quantile times its standard error
  (perplexity is exp(NLL), so the interval is taken on the NLL scale, where seeds vary additively).
- Against base, two tests of the per-seed differences (row − base) of dev NLL, and the same two
  for dev sacreBLEU, each two-sided with p-values Holm-adjusted over the rows compared (Holm 1979),
  per metric and per test:

  - the **paired t-test**, with the mean difference, its 95% confidence interval (unadjusted: a
    per-row interval, not a simultaneous one), the perplexity ratio exp(mean difference) and the
    effect size Cohen's d_z = mean / sd of the differences. It assumes the differences are
    independent draws from a normal distribution; with a handful of seeds that cannot be checked.
  - the **exact sign-flip permutation test**: p is the share of all 2^n sign patterns of the n
    differences whose sum is at least as far from 0 as the observed one. It assumes only that
    under no effect each difference is as likely negative as positive; its smallest attainable p
    is 2/2^n, so with m rows compared under Holm it can separate any row only when
    m · 2/2^n < 0.05 (:func:`seeds_needed`: 8 seeds for 4 rows).

- Verdict per row against the paper's direction (the printed Table 3 value of the analogous row
  against base's, read by :func:`paper_direction`, one rule for perplexity and BLEU): each test
  gives **agrees** (Holm-adjusted p < 0.05 and the difference has the paper's sign),
  **disagrees** (p < 0.05 and the opposite sign, or any separable difference where the paper
  prints none) or **not separable** (p >= 0.05: the seeds do not tell the row from base; not
  evidence of equality). The row's verdict is that when both tests give it; when only one test
  separates the row, the verdict names the test it rests on ("disagrees (t-test only)").

The t distribution is evaluated with mpmath (the regularized incomplete beta function), so the
report needs no SciPy; ``tests/test_translation.py`` checks it against ``scipy.stats``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import mpmath

from aiayn.kit import Report, rounded, write_report

STEM = "bleu-ablation"
ALPHA = 0.05  # the test level of every per-row verdict
AGREES, DISAGREES, NOT_SEPARABLE = "agrees", "disagrees", "not separable"

#: row -> (what changes, the analogous printed Table 3 row); the models are ``ablation.ROWS``.
ROW_INFO: dict[str, tuple[str, str]] = {
    "base": ("reference row", "base"),
    "A: h=1": ("one head, d_k = d_v = 128", "A1"),
    "C: N=1": ("one layer per stack", "C1"),
    "C: d=64": ("d_model = 64, d_k = d_v = 16", "C4"),
    "E: learned": ("learned positional embedding", "E"),
    # --scale paper: Table 3's own rows
    "A1": ("h = 1, d_k = d_v = 512", "A1"),
    "C1": ("N = 2", "C1"),
    "C4": ("d_model = 256, d_k = d_v = 32", "C4"),
    "E": ("learned positional embedding", "E"),
}


# ---------------------------------------------------------------------------------------------
# The t distribution and the tests
# ---------------------------------------------------------------------------------------------


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    if df < 1:
        raise ValueError(f"df: expected at least 1 degree of freedom, got {df}")
    if not math.isfinite(t):
        return 0.0
    with mpmath.workdps(30):
        x = mpmath.mpf(df) / (df + mpmath.mpf(t) ** 2)
        return float(mpmath.betainc(mpmath.mpf(df) / 2, mpmath.mpf(1) / 2, 0, x, regularized=True))


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t (0.5 < q < 1), by solving 1 − p/2 = q with bisection in 30 digits."""
    if not 0.5 < q < 1:
        raise ValueError(f"q: expected a probability in (0.5, 1), got {q}")
    lo, hi = 0.0, 1.0
    while 1 - t_two_sided_p(hi, df) / 2 < q:
        hi *= 2
    for _ in range(200):  # the interval halves each time: 200 halvings leave far below one ulp
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if 1 - t_two_sided_p(mid, df) / 2 < q else (lo, mid)
    return hi


def paired_t_test(differences: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """The paired t-test on per-seed differences: mean, sd, t, df, two-sided p, CI, Cohen's d_z.

    t = mean / (sd / sqrt(n)), df = n − 1; the CI is mean ± t_{(1+level)/2, df} · sd / sqrt(n).
    A zero sd with a non-zero mean gives t = ±inf, p = 0; all differences zero gives p = 1.
    """
    n = len(differences)
    if n < 2:
        raise ValueError(f"differences: the paired t-test needs at least 2 pairs, got {n}")
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    se = sd / math.sqrt(n)
    if se == 0:
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)
    else:
        t = mean / se
    half = t_quantile((1 + level) / 2, n - 1) * se
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "se": se,
        "t": t,
        "df": n - 1,
        "p": 1.0 if t == 0 else t_two_sided_p(t, n - 1),
        "ci": [mean - half, mean + half],
        "d_z": (mean / sd) if sd > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean)),
    }


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (Holm 1979), in the order given: p_(i) · (m − i + 1), made monotone, capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def sign_flip_test(differences: Sequence[float]) -> dict[str, Any]:
    """The exact two-sided sign-flip permutation test of a zero mean on paired differences.

    p = #{s in {−1, +1}^n : |Σ s_i·d_i| >= |Σ d_i|} / 2^n, every one of the 2^n sign patterns
    enumerated and each sum exact (the differences as the rationals their floats are), so ties
    are counted exactly. No normality is assumed, only that under no effect each difference is
    symmetric about 0.
    """
    exact = [Fraction(d) for d in differences]
    n = len(exact)
    if n < 1:
        raise ValueError("differences: the sign-flip test needs at least one pair")
    observed = abs(sum(exact))
    extreme = sum(
        abs(sum(s * d for s, d in zip(signs, exact))) >= observed for signs in itertools.product((1, -1), repeat=n)
    )
    return {"n": n, "patterns": 2**n, "at_least_as_extreme": extreme, "p": extreme / 2**n, "min_p": min_p(n)}


def min_p(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with n pairs: 2/2^n (all signs alike)."""
    return 2 / 2**n


def _min_p_text(n: int) -> str:
    """ "2/2^5 = 1/16 = 0.0625": the smallest attainable p, exactly."""
    return f"2/2^{n} = {Fraction(2, 2**n)} = {min_p(n):.4g}"


def seeds_needed(rows_compared: int, level: float = ALPHA) -> int:
    """The fewest seeds per row with which the sign-flip test can separate a row under Holm: the least n with
    rows_compared · 2/2^n < level (Holm's first step multiplies the smallest p, at best 2/2^n, by m; with n that
    large, every row whose differences all share one sign is separable)."""
    n = 1
    while not rows_compared * min_p(n) < level:
        n += 1
    return n


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean of ``values`` (n >= 2)."""
    n = len(values)
    mean, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(n)
    half = t_quantile((1 + level) / 2, n - 1) * se
    return mean, mean - half, mean + half


def printed_direction(row_text: str, base_text: str) -> str:
    """ "higher" or "lower" when two printed values differ by more than one unit of their last printed digit,
    "equal" otherwise: a one-unit difference lets the two true values be arbitrarily close (25.7 and 25.8 may be
    25.749 and 25.751)."""

    def decimals(text: str) -> int:
        return len(text.split(".")[1]) if "." in text else 0

    row, base = Fraction(row_text), Fraction(base_text)
    unit = Fraction(1, 10 ** max(decimals(row_text), decimals(base_text)))
    if abs(row - base) <= unit:
        return "equal"
    return "higher" if row > base else "lower"


def paper_direction(row: str, metric: str) -> str:
    """The printed row's metric against base's (Table 3), by :func:`printed_direction` (the same rule for PPL and
    BLEU; §6.2 calls row E's 25.7 BLEU against base's 25.8 "nearly identical")."""
    from aiayn.reproductions.paper import printed

    ours, base = printed(f"table3.{ROW_INFO[row][1]}.{metric}").text, printed(f"table3.base.{metric}").text
    return printed_direction(ours, base)


def verdict(p_holm: float, mean_difference: float, paper: str, level: float = ALPHA) -> str:
    """One test's :data:`AGREES`, :data:`DISAGREES` or :data:`NOT_SEPARABLE` (see the module docstring)."""
    if not p_holm < level:
        return NOT_SEPARABLE
    ours = "higher" if mean_difference > 0 else "lower"
    return AGREES if ours == paper else DISAGREES


def joint_verdict(by_t: str, by_sign_flip: str) -> str:
    """The row's verdict from both tests' (module docstring): theirs when they give the same, else the separating
    test's with the test named ("agrees (t-test only)", "disagrees (sign-flip test only)")."""
    if by_t == by_sign_flip:
        return by_t
    if by_sign_flip == NOT_SEPARABLE:
        return f"{by_t} (t-test only)"
    if by_t == NOT_SEPARABLE:
        return f"{by_sign_flip} (sign-flip test only)"
    raise ValueError(f"the two tests read opposite directions ({by_t!r}, {by_sign_flip!r}) from one mean difference")


# ---------------------------------------------------------------------------------------------
# Summary and report
# ---------------------------------------------------------------------------------------------


def _bleu(r: dict[str, Any]) -> float:
    return r["dev_bleu"]["sacrebleu"]


def summarise(runs: list[dict[str, Any]], rows: list[str]) -> list[dict[str, Any]]:
    """Per row: the seeds' results, means with 95% CIs, and (rows other than base) the paired tests against base."""
    by_row = {row: {r["seed"]: r for r in runs if r["row"] == row} for row in rows}
    out = []
    for row in rows:
        mine = [by_row[row][s] for s in sorted(by_row[row])]
        nll = [r["dev"]["nll"] for r in mine]
        bleu = [_bleu(r) for r in mine]
        mean_nll, lo, hi = mean_ci(nll) if len(nll) > 1 else (nll[0], math.nan, math.nan)
        out.append(
            {
                "row": row,
                "change": ROW_INFO[row][0],
                "paper_row": ROW_INFO[row][1],
                "parameters": mine[0]["parameters"],
                "seeds": [r["seed"] for r in mine],
                "nll": nll,
                "ppl": [r["dev"]["ppl"] for r in mine],
                "bleu": bleu,
                "chrf": [r["dev_bleu"]["chrf"] for r in mine],
                "ppl_mean": math.exp(mean_nll),
                "ppl_ci": [math.exp(lo), math.exp(hi)],
                "bleu_mean": statistics.fmean(bleu),
                "train_seconds": [r["train_seconds"] for r in mine],
                "steps": [r["steps"] for r in mine],
            }
        )
    base = by_row["base"]
    compared = [s for s in out if s["row"] != "base"]
    for metric, value in (("nll", lambda r: r["dev"]["nll"]), ("bleu", _bleu)):
        for s in compared:
            seeds = sorted(set(by_row[s["row"]]) & set(base))
            differences = [value(by_row[s["row"]][k]) - value(base[k]) for k in seeds]
            s[f"{metric}_paired_seeds"] = seeds
            s[f"{metric}_test"] = paired_t_test(differences)
            s[f"{metric}_sign_flip"] = sign_flip_test(differences)
        for test in ("test", "sign_flip"):
            for s, p in zip(compared, holm([s[f"{metric}_{test}"]["p"] for s in compared])):
                s[f"{metric}_{test}"]["p_holm"] = p
        for s in compared:
            paper = paper_direction(s["row"], "PPL" if metric == "nll" else "BLEU")
            mean = s[f"{metric}_test"]["mean"]
            s[f"{metric}_paper_direction"] = paper
            s[f"{metric}_verdict_t"] = verdict(s[f"{metric}_test"]["p_holm"], mean, paper)
            s[f"{metric}_verdict_sign_flip"] = verdict(s[f"{metric}_sign_flip"]["p_holm"], mean, paper)
            s[f"{metric}_verdict"] = joint_verdict(s[f"{metric}_verdict_t"], s[f"{metric}_verdict_sign_flip"])
    return out


def seeds_per_row(summary: list[dict[str, Any]]) -> int:
    """The paired seeds each compared row has (the fewest, should rows differ): the n of both tests."""
    return min(len(s["nll_paired_seeds"]) for s in summary if s["row"] != "base")


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def _test_cells(s: dict[str, Any], metric: str, fmt: str) -> list[str]:
    t, f = s[f"{metric}_test"], s[f"{metric}_sign_flip"]
    ci = f"[{t['ci'][0]:{fmt}}, {t['ci'][1]:{fmt}}]"
    return [
        f"{t['mean']:+{fmt}} {ci}",
        f"{t['d_z']:+.2f}",
        f"t({t['df']}) = {t['t']:+.2f}, p = {_p(t['p'])}, Holm {_p(t['p_holm'])}",
        f"{f['at_least_as_extreme']}/{f['patterns']}: p = {_p(f['p'])}, Holm {_p(f['p_holm'])}",
    ]


def _tally(compared: list[dict[str, Any]], metric: str) -> str:
    """ "agrees A; disagrees (t-test only) B, C; ...": the rows under each verdict, in a fixed order."""
    order = sorted({x[f"{metric}_verdict"] for x in compared}, key=lambda v: (v.split(" (")[0] == NOT_SEPARABLE, v))
    return "; ".join(f"{v} {', '.join(x['row'] for x in compared if x[f'{metric}_verdict'] == v)}" for v in order)


def _seeds_section(rep: Report, summary: list[dict[str, Any]], runs: list[dict[str, Any]], setup: dict) -> dict:
    """How many seeds each row has, what the exact test can reach with them, and what :func:`seeds_needed` allows."""
    compared = [x for x in summary if x["row"] != "base"]
    n, m = seeds_per_row(summary), len(compared)
    needed = seeds_needed(m)
    rows = len(summary)
    span = setup.get("wall_span_seconds") or sum(r["train_seconds"] for r in runs) / max(1, setup.get("jobs", 1))
    minutes = span / 60 * rows * needed / len(runs)
    new_runs = rows * max(0, needed - n)
    t_only = [x["row"] for x in compared for m_ in ("nll", "bleu") if x[f"{m_}_verdict"].endswith("(t-test only)")]
    reachable = m * min_p(n) < ALPHA
    rep.section(
        "Seeds per row, and what the sign-flip test can show with them",
        f"Seeds per row here: n = {n} (`seeds_per_row`). The paired t-test assumes the {n} differences per row are "
        "independent draws from a normal distribution, which so few cannot check; the exact sign-flip test drops that "
        f"assumption but cannot give a two-sided p below {_min_p_text(n)}, whatever the data. Under Holm over the {m} "
        f"rows compared it can separate a row only if {m} × 2/2^n < {ALPHA} (Holm's first step; then every row whose "
        f"differences all share one sign is separable): with n = {n} that is {_p(m * min_p(n))}, so "
        + (
            "it can separate rows here."
            if reachable
            else "it separates no row, whatever the data, and "
            + (
                f"the verdicts of {', '.join(dict.fromkeys(t_only))} rest on the t-test's normality alone."
                if t_only
                else "no verdict here rests on the t-test alone."
            )
        )
        + f" The fewest seeds per row with which it can is {needed} (`seeds_needed`: {m} × 2/2^{needed} = "
        f"{_p(m * min_p(needed))} < {ALPHA})"
        + (
            f": {rows} rows × {needed} seeds = {rows * needed} runs at this token budget, about {minutes:.0f} min on "
            f"the machine that ran these (this run's {len(runs)} runs in {span / 60:.1f} min, scaled linearly); the "
            f"ablation skips finished runs, so with this run's folder kept, adding seeds up to {needed} trains "
            f"{new_runs} new runs (about {minutes * new_runs / (rows * needed):.0f} min)."
            if n < needed
            else "; this run has them."
        ),
    )
    return {"seeds_per_row": n, "min_p": min_p(n), "rows_compared": m, "seeds_needed": needed}


def make_report(runs: list[dict[str, Any]], setup: dict[str, Any]) -> Report:
    """``bleu-ablation.{md,json}`` from the runs' results and the run settings (both stored in its JSON)."""
    from aiayn.reproductions.paper import printed
    from aiayn.reproductions.registry import BY_NAME, staleness_line

    runs, setup = rounded(runs), rounded(setup)
    rows = [r for r in ROW_INFO if any(x["row"] == r for x in runs)]
    summary = summarise(runs, rows)
    seeds = sorted({r["seed"] for r in runs})
    rep = Report(
        STEM,
        "Table 3 at CPU scale: model variations, several seeds each, on a fixed token budget",
        precision="float32",
        seed=",".join(map(str, seeds)),
        packages=("torch", "sacrebleu", "sentencepiece", "mpmath"),
    )
    rep.generator = (__name__,)
    codes = sorted({r.get("measurement", {}).get("code", "unknown") for r in runs})
    commits = sorted({r.get("measurement", {}).get("commit", "unknown") for r in runs})
    rep.fields = {"results_commit": ",".join(commits), "results_code": ",".join(codes)}
    base = next(x for x in summary if x["row"] == "base")
    compared = [x for x in summary if x["row"] != "base"]
    n = seeds_per_row(summary)
    needed = seeds_needed(len(compared))
    enough = (
        f"enough for it to separate rows under Holm (it needs {needed})"
        if n >= needed
        else f"{needed} seeds per row would let it separate rows under Holm"
    )
    rep.verdict = (
        f"{len(summary)} rows x {len(seeds)} seeds (paired), {setup['tokens']:,} target tokens each "
        f"({setup['tokens'] / setup['train_target_tokens']:.2f} passes over the data); dev perplexity base "
        f"{base['ppl_mean']:.1f} (geometric mean); against the paper's direction (dev NLL, paired t-test and exact "
        f"sign-flip test, each Holm-adjusted, level {ALPHA}): {_tally(compared, 'nll')}; the sign-flip test's "
        f"smallest p with {n} seeds is {_min_p_text(n)}, {enough}; dev sacreBLEU at most "
        f"{max(max(x['bleu']) for x in summary):.2f}; not comparable to Table 3's WMT14 figures"
    )
    rep.add(
        "",
        f"What: {setup['corpus']}; train {setup['pairs']['train']:,} verse pairs, dev {setup['pairs']['dev']:,} (books "
        f"{setup['dev_books']}, scored here; the test books are not used). Joint BPE vocabulary {setup['vocab']:,}. "
        f"Every run: {setup['tokens']:,} target tokens in batches of {setup['max_tokens']:,} padded tokens, Adam (0.9, "
        f"0.98, 1e-9), Eq. (3) with warmup {setup['warmup']}, label smoothing 0.1, residual dropout 0.1; the last "
        f"weights, no checkpoint averaging (as §6.2 does for Table 3); beam {setup['beam']}, α = {setup['alpha']}. "
        "Perplexity: exp of the mean plain NLL per target BPE piece (EOS included).",
        "",
        staleness_line(BY_NAME[STEM], {"codes": codes, "commits": commits}),
        "",
        "Design: every row is trained with the same seeds "
        + ", ".join(map(str, seeds))
        + "; a seed fixes the batch order (the same "
        "batches for every row), the initial weights and the dropout masks, so each row is compared with base seed by "
        "seed (paired). Two tests of each row against base, both two-sided and Holm-adjusted over the rows compared: "
        "the paired t-test (which assumes normally distributed differences) and the exact sign-flip permutation test "
        "(which does not); a row agrees or disagrees with the paper only when both tests say so, and otherwise its "
        "verdict names the one test it rests on. Statistics: `reproductions/translation/ablation_report.py` (its "
        "docstring states every formula).",
        "",
        f"Device: {setup['device']}, "
        + "/".join(str(j) for j in sorted({r.get("jobs", setup["jobs"]) for r in runs}))
        + " run(s) at a time, "
        + ", ".join(sorted({"1 thread" if r["threads"] == 1 else f"{r['threads']} threads" for r in runs}))
        + " each; "
        f"training time summed over the runs {sum(r['train_seconds'] for r in runs) / 60:.1f} min"
        + (
            f", first start to last finish {setup['wall_span_seconds'] / 60:.1f} min"
            if setup.get("wall_span_seconds")
            else ""
        )
        + ".",
    )
    rep.section("Dev perplexity: each row against base, paired by seed")
    body = []
    for s in summary:
        ppl = " / ".join(f"{x:.1f}" for x in s["ppl"])
        pr = s["paper_row"]
        paper = f"{printed(f'table3.{pr}.PPL').text} ({pr})"
        if s["row"] == "base":
            body.append(
                [
                    s["row"],
                    s["change"],
                    f"{s['parameters']:,}",
                    ppl,
                    f"{s['ppl_mean']:.1f} [{s['ppl_ci'][0]:.1f}, {s['ppl_ci'][1]:.1f}]",
                    "",
                    "",
                    "",
                    "",
                    "",
                    paper,
                    "",
                ]
            )
            continue
        t = s["nll_test"]
        body.append(
            [
                s["row"],
                s["change"],
                f"{s['parameters']:,}",
                ppl,
                f"{s['ppl_mean']:.1f} [{s['ppl_ci'][0]:.1f}, {s['ppl_ci'][1]:.1f}]",
                *_test_cells(s, "nll", ".3f"),
                f"{math.exp(t['mean']):.3f}",
                f"{paper}: {s['nll_paper_direction']}",
                f"**{s['nll_verdict']}**",
            ]
        )
    rep.table(
        [
            "row",
            "change against base",
            "parameters",
            "dev PPL per seed",
            "geometric mean PPL = exp(mean NLL) [95% CI]",
            "Δ dev NLL vs base, mean [95% CI, unadjusted]",
            "d_z",
            "paired t-test",
            "sign-flip test",
            "PPL ratio",
            f"paper: PPL (row), vs base {printed('table3.base.PPL').text}",
            "verdict",
        ],
        body,
        "llrrrrrllrll",
    )
    rep.add(
        "",
        "Geometric mean PPL: exp of the mean dev NLL over the seeds, the geometric mean of the seeds' "
        "perplexities (not their arithmetic mean); its interval is the t interval of the mean NLL, exponentiated."
        " Δ dev NLL: row minus base, per seed, in nats per BPE piece (negative: the row predicts the dev books "
        "better); its interval is the per-row 95% t interval, not adjusted for the rows compared (the verdicts "
        "use Holm-adjusted p-values, so an interval that excludes 0 can stand beside **not separable**). PPL "
        'ratio = exp(mean Δ). d_z = mean Δ / sd of Δ. "paired t-test": t statistic with its degrees of freedom, '
        'two-sided p, and p Holm-adjusted over the rows compared. "sign-flip test": how many of the 2^n sign '
        "patterns of the n differences give a sum at least as far from 0 as the observed one, out of 2^n, the "
        "exact two-sided p, and p Holm-adjusted likewise. Verdict: **agrees** / **disagrees** with the direction "
        f"of the paper's change when both tests' Holm-adjusted p < {ALPHA}; **not separable** when neither's is; "
        "otherwise the verdict of the one test that separates, named (which is not evidence of no difference for "
        "the other). The paper's direction: higher or lower when the printed row and base differ by more than one"
        " unit of their last printed digit, equal otherwise (the same rule for perplexity and BLEU).",
    )
    rep.section("Dev sacreBLEU: the same tests")
    body = []
    for s in compared:
        pr = s["paper_row"]
        body.append(
            [
                s["row"],
                " / ".join(f"{x:.2f}" for x in s["bleu"]),
                f"{s['bleu_mean']:.2f}",
                *_test_cells(s, "bleu", ".2f"),
                f"{printed(f'table3.{pr}.BLEU').text} ({pr}): {s['bleu_paper_direction']}",
                s["bleu_verdict"],
            ]
        )
    rep.add("", f"Base: {' / '.join(f'{x:.2f}' for x in base['bleu'])} (mean {base['bleu_mean']:.2f}).", "")
    rep.table(
        [
            "row",
            "dev sacreBLEU per seed",
            "mean",
            "Δ vs base, mean [95% CI, unadjusted]",
            "d_z",
            "paired t-test",
            "sign-flip test",
            f"paper: BLEU (row), vs base {printed('table3.base.BLEU').text}",
            "verdict",
        ],
        body,
        "lrrrrllll",
    )
    seeds_data = _seeds_section(rep, summary, runs, setup)
    passes = setup["tokens"] / setup["train_target_tokens"]
    order = sorted(summary, key=lambda x: x["ppl_mean"])
    rep.section(
        "Reading it against the paper",
        *[
            f"- {x}"
            for x in (
                f"Scale: every run saw {setup['tokens']:,} target tokens, {passes:.2f} passes over the "
                f"{setup['train_target_tokens']:,} of the training side, so the models are early in training "
                f"(geometric mean dev perplexity {order[0]['ppl_mean']:.0f} to {order[-1]['ppl_mean']:.0f}): this "
                "table measures how fast each variant learns on one budget, not what it can reach. BLEU this low is "
                "mostly noise, hence perplexity first.",
                "Ordered by geometric mean dev perplexity, best first: "
                + ", ".join(f"{x['row']} {x['ppl_mean']:.1f}" for x in order)
                + ".",
                "The printed Table 3 figures (newstest2013 perplexity per wordpiece and BLEU after 100K steps of the "
                "65M-parameter base model on WMT14 EN-DE) measure converged models, so only the direction of each "
                "change is compared: a small model early in training can rank variants differently (fewer layers or "
                "learned positions may learn faster and reach less).",
                f"Row E: the paper prints the same perplexity as base ({printed('table3.E.PPL').text}) and a BLEU one "
                f"unit of its last digit away ({printed('table3.E.BLEU').text} against "
                f'{printed("table3.base.BLEU").text}), and calls the results "nearly identical" (§6.2); both read '
                "as equal, so any separable difference here disagrees, and not separable is consistent with it.",
            )
        ],
    )
    rep.section("Per run")
    rep.table(
        ["row", "seed", "steps", "target tokens", "training s", "dev NLL", "dev PPL", "dev sacreBLEU", "dev chrF"],
        [
            [
                r["row"],
                str(r["seed"]),
                f"{r['steps']:,}",
                f"{r['tokens']:,}",
                f"{r['train_seconds']:.0f}",
                f"{r['dev']['nll']:.4f}",
                f"{r['dev']['ppl']:.2f}",
                f"{_bleu(r):.2f}",
                f"{r['dev_bleu']['chrf']:.2f}",
            ]
            for r in sorted(runs, key=lambda r: (rows.index(r["row"]), r["seed"]))
        ],
        "lrrrrrrrr",
    )
    sig = runs[0]["dev_bleu"]
    rep.add(
        "",
        f"Signatures: BLEU `{sig['sacrebleu_signature']}`; chrF `{sig['chrf_signature']}`. Results computed at commit "
        f"{', '.join(commits)} by code {', '.join(codes)} (`aiayn.kit.code_hash` of "
        "`aiayn.reproductions.translation.ablation`).",
    )
    rep.data.update(
        setup=setup, rows=summary, seeds=seeds_data, runs=runs, measurement={"codes": codes, "commits": commits}
    )
    return rep


def rerender(data: dict[str, Any], out_dir: Path) -> str:
    """bleu-ablation.{md,json} again from the runs and settings stored in its JSON."""
    report = make_report(data["runs"], data["setup"])
    write_report(Path(out_dir), report)
    return report.verdict
