"""``bleu-ablation.{md,json}``: Table 3's variations at CPU scale, with statistics, from the runs' results.

Rendering only: :func:`make_report` turns the per-run results of ``aiayn ablation``
(``ablation.py``) into the report, so the report can be re-rendered from its own JSON (the drift
test does) without training anything again.

Statistics (the paired design): every row is trained with the same seeds, and a seed fixes the
batch order (the same batches for every row) as well as the row's initial weights and dropout
masks, so row and base are compared seed by seed.

- Per row: the mean dev perplexity and a 95% confidence interval, exp of the mean dev NLL ± the
  t-quantile times its standard error (perplexity is exp(NLL), so the interval is taken on the
  NLL scale, where seeds vary additively).
- Against base: the **paired t-test** (two-sided) on the per-seed differences of dev NLL
  (row − base), with the mean difference, its 95% confidence interval, the perplexity ratio
  exp(mean difference) and the effect size Cohen's d_z = mean / sd of the differences; the same
  for dev sacreBLEU. p-values are Holm-adjusted over the rows compared (Holm 1979), per metric.
- Verdict per row against the paper's direction (its printed Table 3 perplexity of the analogous
  row against base's 4.92): **agrees** (Holm-adjusted p < 0.05 and the difference has the
  paper's sign), **disagrees** (p < 0.05 and the opposite sign, or any separable difference
  where the paper prints none), **not separable** (p >= 0.05: the seeds do not tell the row from
  base; not evidence of equality).

The t distribution is evaluated with mpmath (the regularized incomplete beta function), so the
report needs no SciPy; ``tests/test_translation.py`` checks it against ``scipy.stats``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
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


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean of ``values`` (n >= 2)."""
    n = len(values)
    mean, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(n)
    half = t_quantile((1 + level) / 2, n - 1) * se
    return mean, mean - half, mean + half


def paper_direction(row: str, metric: str) -> str:
    """The sign of the printed row's metric minus base's (Table 3): "higher", "lower" or "equal"."""
    from aiayn.reproductions.paper import printed

    ours, base = printed(f"table3.{ROW_INFO[row][1]}.{metric}").value, printed(f"table3.base.{metric}").value
    return "higher" if ours > base else "lower" if ours < base else "equal"


def verdict(p_holm: float, mean_difference: float, paper: str, level: float = ALPHA) -> str:
    """:data:`AGREES`, :data:`DISAGREES` or :data:`NOT_SEPARABLE` (see the module docstring)."""
    if not p_holm < level:
        return NOT_SEPARABLE
    ours = "higher" if mean_difference > 0 else "lower"
    return AGREES if ours == paper else DISAGREES


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
            s[f"{metric}_paired_seeds"] = seeds
            s[f"{metric}_test"] = paired_t_test([value(by_row[s["row"]][k]) - value(base[k]) for k in seeds])
        for s, p in zip(compared, holm([s[f"{metric}_test"]["p"] for s in compared])):
            s[f"{metric}_test"]["p_holm"] = p
            paper = paper_direction(s["row"], "PPL" if metric == "nll" else "BLEU")
            s[f"{metric}_paper_direction"] = paper
            s[f"{metric}_verdict"] = verdict(p, s[f"{metric}_test"]["mean"], paper)
    return out


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def _test_cells(s: dict[str, Any], metric: str, fmt: str) -> list[str]:
    t = s[f"{metric}_test"]
    ci = f"[{t['ci'][0]:{fmt}}, {t['ci'][1]:{fmt}}]"
    return [
        f"{t['mean']:+{fmt}} {ci}",
        f"{t['d_z']:+.2f}",
        f"t({t['df']}) = {t['t']:+.2f}, p = {_p(t['p'])}, Holm {_p(t['p_holm'])}",
    ]


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
    tally = {v: [x["row"] for x in compared if x["nll_verdict"] == v] for v in (AGREES, DISAGREES, NOT_SEPARABLE)}
    rep.verdict = (
        f"{len(summary)} rows x {len(seeds)} seeds (paired), {setup['tokens']:,} target tokens each "
        f"({setup['tokens'] / setup['train_target_tokens']:.2f} passes over the data); dev perplexity base "
        f"{base['ppl_mean']:.1f}; against the paper's direction (paired t-test on dev NLL, Holm-adjusted, level "
        f"{ALPHA}): "
        + "; ".join(
            f"{v} {', '.join(f'{r}' for r in tally[v])}" for v in (AGREES, DISAGREES, NOT_SEPARABLE) if tally[v]
        )
        + f"; dev sacreBLEU at most {max(max(x['bleu']) for x in summary):.2f}; not comparable to Table 3's WMT14 "
        "figures"
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
        "seed (paired). Statistics: `reproductions/translation/ablation_report.py` (its docstring states every "
        "formula).",
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
            "mean PPL [95% CI]",
            "Δ dev NLL vs base, mean [95% CI]",
            "d_z",
            "paired t-test",
            "PPL ratio",
            "paper: PPL (row), vs base 4.92",
            "verdict",
        ],
        body,
        "llrrrrrlrll",
    )
    rep.add(
        "",
        "Δ dev NLL: row minus base, per seed, in nats per BPE piece (negative: the row predicts the dev books better). "
        'PPL ratio = exp(mean Δ). d_z = mean Δ / sd of Δ. "paired t-test": t statistic with its degrees of freedom, '
        "two-sided p, and p Holm-adjusted over the rows compared. Verdict: **agrees** / **disagrees** with the sign of "
        "the paper's change when the Holm-adjusted p < 0.05, **not separable** otherwise (which is not evidence of no "
        "difference).",
    )
    rep.section("Dev sacreBLEU: the same test")
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
            "Δ vs base, mean [95% CI]",
            "d_z",
            "paired t-test",
            "paper: BLEU (row), vs base 25.8",
            "verdict",
        ],
        body,
        "lrrrrlll",
    )
    passes = setup["tokens"] / setup["train_target_tokens"]
    order = sorted(summary, key=lambda x: x["ppl_mean"])
    rep.section(
        "Reading it against the paper",
        *[
            f"- {x}"
            for x in (
                f"Scale: every run saw {setup['tokens']:,} target tokens, {passes:.2f} passes over the "
                f"{setup['train_target_tokens']:,} of the training side, so the models are early in training (mean dev "
                f"perplexity {order[0]['ppl_mean']:.0f} to {order[-1]['ppl_mean']:.0f}): this table measures how fast "
                "each variant learns on one budget, not what it can reach. BLEU this low is mostly noise, hence "
                "perplexity first.",
                "Ordered by mean dev perplexity, best first: "
                + ", ".join(f"{x['row']} {x['ppl_mean']:.1f}" for x in order)
                + ".",
                "The printed Table 3 figures (newstest2013 perplexity per wordpiece and BLEU after 100K steps of the "
                "65M-parameter base model on WMT14 EN-DE) measure converged models, so only the direction of each "
                "change is compared: a small model early in training can rank variants differently (fewer layers or "
                "learned positions may learn faster and reach less).",
                f"Row E: the paper prints the same perplexity as base ({printed('table3.E.PPL').text}) and calls the "
                'results "nearly identical" (§6.2); any separable difference here therefore disagrees, and not '
                "separable is consistent with it.",
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
    rep.data.update(setup=setup, rows=summary, runs=runs, measurement={"codes": codes, "commits": commits})
    return rep


def rerender(data: dict[str, Any], out_dir: Path) -> str:
    """bleu-ablation.{md,json} again from the runs and settings stored in its JSON."""
    report = make_report(data["runs"], data["setup"])
    write_report(Path(out_dir), report)
    return report.verdict
