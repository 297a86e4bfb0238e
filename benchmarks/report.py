"""pytest-benchmark JSON -> ``benchmarks.{md,json,png}`` (``aiayn bench`` runs the benchmarks, then this).

Reads one run of the suite (``pytest benchmarks --benchmark-json=RUN.json``; ``aiayn bench`` leaves
it in ``<reports>/tmp/benchmarks-run.json``) and writes:

- ``benchmarks.md``: the verdict on the targets, the run's setup (CPU, threads, BLAS
  kernel, environment, load), the GEMM ceilings at the start and end of the run, every case in
  GFLOP/s and as a fraction of the ceiling with its peak memory, what bounds the NumPy attention
  (its stages timed alone), and the ratios against the stored baseline;
- ``benchmarks.json``: the same numbers, machine-readable;
- ``benchmarks.png``: GFLOP/s against n per implementation (float32, float64) and peak memory
  against n.

The same RUN.json always gives the same three files (bytes), apart from the signature line.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.benchmarks.cases import HEAD_DIM, HEADS, PASSES, attention_flops
from aiayn.benchmarks.compare import RunComparison, format_comparison, load_run, summary
from aiayn.benchmarks.runfile import run_scope
from aiayn.environment import UsageError, reports_dir
from aiayn.kit import Report, figure_style, md_table, pyplot, save_png, write_report

__all__ = ["DEFAULT_BASELINE", "TARGETS", "build_report", "default_run", "keyed_stem", "spec_stem", "write"]

#: The stored baseline travels with the package (``aiayn/benchmarks/baseline/``).
DEFAULT_BASELINE = Path(__file__).resolve().parent / "baseline" / "benchmarks-baseline.json"


def default_run() -> Path:
    """Where ``aiayn bench`` leaves the run's pytest-benchmark JSON: ``<reports>/tmp/benchmarks-run.json``."""
    return reports_dir() / "tmp" / "benchmarks-run.json"


#: The attention target (float32, n = 2048, one thread, no mask): the NumPy built-in's time against its own floor,
#: the least time its unavoidable operations (two GEMMs and one exp over the scores) took in the same run. A fraction
#: of the GEMM ceiling is no target for it: with a faster GEMM the call is bound by the exp, so that fraction falls.
TARGETS = {"fraction_of_floor": 0.9, "backward_fraction_of_floor": 0.7, "target_case": ("float32", 2048)}
#: The training targets: at least the nn.Transformer peer's throughput, at least half the GEMM ceiling.
TRAINING_TARGETS = {"ratio_of_peer": 1.0, "mfu": 0.5}
MIB = 2**20


# ---------------------------------------------------------------------------------------------
# the report's name


#: The longest stem of a report of chosen implementations (its files add at most ``-history.json``, ``-run.json``).
STEM_MAX = 120


def spec_stem(specs: Sequence[str]) -> str:
    """The report stem of a run of the implementations ``specs``: ``bench-`` and the specs joined by ``_``, each
    character other than letters, digits, ``-`` and ``.`` made ``-`` (``mypkg.attn:Mine`` -> ``bench-mypkg.attn-Mine``),
    cut at :data:`STEM_MAX` characters. Two spec lists can share a stem (``a:b`` and ``a-b``, or two long lists with
    one beginning); :func:`keyed_stem` keeps their reports apart."""
    safe = "_".join("".join(c if c.isalnum() or c in "-." else "-" for c in spec) for spec in specs)
    return f"bench-{safe}"[:STEM_MAX]


def _report_impls(path: Path) -> set[str]:
    """The implementations the stored report at ``path`` timed (its cases' ``impl``); none when there is no report or
    it cannot be read (the writer's own scope rule keeps such a report: :func:`aiayn.kit.write_report`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return set()
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list):
        return set()
    return {c["impl"] for c in cases if isinstance(c, dict) and isinstance(c.get("impl"), str)}


def keyed_stem(out: Path, stem: str, specs: Iterable[str]) -> str:
    """``stem``, unless the report at ``out/<stem>.json`` timed an implementation not among ``specs`` (another spec
    list with the same stem): then ``<stem>-<8 hex digits of the specs' SHA-1>``, and a line says so. Two spec lists
    never write one report; UsageError, naming both, when the keyed name is another list's too."""
    specs = sorted(set(specs))
    digest = hashlib.sha1("\n".join(specs).encode("utf-8")).hexdigest()[:8]
    keyed = f"{stem[: STEM_MAX - 9]}-{digest}"
    out = Path(out)
    others = _report_impls(out / f"{stem}.json") - set(specs)
    if not others:
        return stem
    taken = _report_impls(out / f"{keyed}.json") - set(specs)
    if taken:
        raise UsageError(
            f"SPEC: {', '.join(specs)}: {out / stem}.md and {keyed}.md are the reports of {', '.join(sorted(others))} "
            f"and of {', '.join(sorted(taken))}; give another --out"
        )
    print(f"{out / stem}.md is the report of {', '.join(sorted(others))}: writing {keyed}.md", flush=True)
    return keyed


# ---------------------------------------------------------------------------------------------
# reading the run


def attention_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per attention case that was timed (``extra_info`` plus its pytest-benchmark name)."""
    rows = [dict(b["extra_info"], name=b["name"]) for b in run["benchmarks"] if "case" in b.get("extra_info", {})]
    rows = [dict(r, pass_=r.get("pass_", "forward")) for r in rows if "ratio_full" in r]  # older runs: forward only
    order = {name: i for i, name in enumerate(PASSES)}
    return sorted(rows, key=lambda r: (r["impl"], order.get(r["pass_"], 9), r["dtype"], r["n"], r["causal"]))


def stage_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per timed NumPy stage."""
    return [
        dict(b["extra_info"])
        for b in run["benchmarks"]
        if "stage" in b.get("extra_info", {}) and "time_min_s" in b["extra_info"]
    ]


def training_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The timed training-step cases (ours and the peer per configuration)."""
    return [
        dict(b["extra_info"])
        for b in run["benchmarks"]
        if "training" in b.get("extra_info", {}) and "mfu" in b["extra_info"]
    ]


def memory_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The training-step memory cases."""
    return [dict(b["extra_info"]) for b in run["benchmarks"] if "memory_model" in b.get("extra_info", {})]


def training_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: ours against the peer (throughput ratio), MFU, and what bounds ours (from its profiled step).

    ``mfu_bound_gemm_at_ceiling``: the utilisation ours would reach if its matrix products ran at the ceiling and
    everything else took the time it took: flops / (flops / ceiling + non-GEMM seconds) / ceiling, the non-GEMM seconds
    being the best step's time times the non-GEMM share of the profiled step (the profiler's own overhead cancels in the
    share).
    """
    out = []
    for name in sorted({r["training"] for r in rows}):
        ours = next((r for r in rows if r["training"] == name and r["model"] == "ours"), None)
        peer = next((r for r in rows if r["training"] == name and r["model"] == "peer"), None)
        entry: dict[str, Any] = {"training": name, "ours": ours, "peer": peer}
        if ours and peer:
            entry["ratio_of_peer"] = ours["tokens_per_s"] / peer["tokens_per_s"]
            entry["ratio_met"] = entry["ratio_of_peer"] >= TRAINING_TARGETS["ratio_of_peer"]
        if ours:
            entry["mfu_met"] = ours["mfu"] >= TRAINING_TARGETS["mfu"]
            prof = ours.get("profile")
            if prof:
                entry["gemm_share"] = prof["gemm_s"] / prof["total_s"]
                other = ours["time_min_s"] * (1 - entry["gemm_share"])
                ideal = ours["flops"] / (ours["ceiling_gflops"] * 1e9)
                gemm_s = ours["time_min_s"] * entry["gemm_share"]
                entry["gemm_gflops"] = ours["flops"] / gemm_s / 1e9 if gemm_s else None
                entry["mfu_bound_gemm_at_ceiling"] = ideal / (ideal + other)
                entry["top_other"] = prof["top_other"]
        out.append(entry)
    return out


def _find(rows: list[dict[str, Any]], **keys: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in keys.items()):
            return row
    return None


def _ceiling_of(run: dict[str, Any], library: str, dtype: str, when: str = "best") -> dict[str, Any] | None:
    """The ``when`` (``start``, ``end`` or ``best``) GEMM ceiling of ``library``/``dtype`` recorded by the run."""
    for c in run.get("aiayn", {}).get(f"ceilings_{when}", []):
        if c["library"] == library and c["dtype"] == dtype:
            return c
    return None


# ---------------------------------------------------------------------------------------------
# the targets and the NumPy bounds


def memory_exponent(rows: list[dict[str, Any]], impl: str, dtype: str) -> dict[str, Any] | None:
    """Growth exponent of peak memory between the two largest n of ``impl`` (no mask): 1 linear, 2 quadratic."""
    pts = sorted(
        (r["n"], r["peak_bytes"])
        for r in rows
        if (r["impl"], r["dtype"], r["causal"], r.get("pass_", "forward")) == (impl, dtype, False, "forward")
        and r.get("peak_bytes")
    )
    if len(pts) < 2:
        return None
    (n1, p1), (n2, p2) = pts[-2], pts[-1]
    return {
        "impl": impl,
        "dtype": dtype,
        "n": [n1, n2],
        "peak_bytes": [p1, p2],
        "exponent": math.log(p2 / p1) / math.log(n2 / n1),
    }


def evaluate_targets(rows: list[dict[str, Any]], bounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets, each with its measured value and met / short (None: not measured), and torch-sdpa's figure.

    ``numpy_fraction_of_floor``: the floor's time (QK^T + PV + exp on cache-resident tiles, ``numpy_bounds``) over
    the ``numpy`` case's best time, both from this run; 1 would be the floor itself.
    """
    dtype, n = TARGETS["target_case"]
    ours = _find(rows, impl="numpy", dtype=dtype, n=n, causal=False, pass_="forward")
    sdpa = _find(rows, impl="torch-sdpa", dtype=dtype, n=n, causal=False, pass_="forward")
    tile = next((b for b in bounds if b["layout"] == "tile" and (b["dtype"], b["n"]) == (dtype, n)), None)
    out: dict[str, Any] = {"case": f"{dtype} n={n} no mask, one call of Eq. (1) over B=1, h=8, d=64"}
    fraction = tile["floor_s"] / ours["time_min_s"] if ours and tile else None
    out["numpy_fraction_of_floor"] = {
        "value": fraction,
        "floor_s": tile["floor_s"] if tile else None,
        "time_s": ours["time_min_s"] if ours else None,
        "target": TARGETS["fraction_of_floor"],
        "met": None if fraction is None else fraction >= TARGETS["fraction_of_floor"],
    }
    backward = (tile or {}).get("fractions_of_floor", {}).get("numpy backward")
    out["numpy_backward_fraction_of_floor"] = {
        "value": backward,
        "target": TARGETS["backward_fraction_of_floor"],
        "met": None if backward is None else backward >= TARGETS["backward_fraction_of_floor"],
    }
    out["numpy_ratio_of_ceiling"] = {"value": ours["ratio_full"] if ours else None}
    out["sdpa_ratio_of_ceiling"] = {"value": sdpa["ratio_full"] if sdpa else None}
    growth = memory_exponent(rows, "numpy-blocked", dtype)
    out["blocked_memory_growth"] = dict(
        growth or {},
        target="exponent ~1 (linear in n; < 1.5 counts)",
        met=None if growth is None else growth["exponent"] < 1.5,
    )
    return out


def _fractions_of_floor(
    rows: list[dict[str, Any]], dtype: str, n: int, forward_s: float, backward_s: float | None
) -> dict[str, float]:
    """Each NumPy built-in's unmasked cases at (dtype, n) as fractions of their floors: the floor's time over the
    case's best time, for the forward, the backward and forward+backward (the two floors summed); 1 would be the
    floor itself. A run with no backward-alone case (``make bench``) gets the backward's time as its
    forward+backward case's best time less its forward case's, under the key ``"<impl> backward"`` too: both
    times are the best of at least 10 rounds of this run, so the difference is the backward's share of one call."""
    floors = {"forward": forward_s, "backward": backward_s}
    floors["forward+backward"] = None if backward_s is None else forward_s + backward_s
    out = {}
    for impl in ("numpy", "numpy-blocked"):
        times = {}
        for pass_, floor in floors.items():
            case = _find(rows, impl=impl, dtype=dtype, n=n, causal=False, pass_=pass_)
            if case:
                times[pass_] = case["time_min_s"]
            if case and floor is not None:
                out[f"{impl} {pass_}"] = floor / case["time_min_s"]
        if "backward" in times or backward_s is None or not {"forward", "forward+backward"} <= times.keys():
            continue
        backward_alone = times["forward+backward"] - times["forward"]
        # not positive only when noise put the forward+backward case's best time at or below the forward's: then no
        # backward time can be read from the two, the key is left out, and the target reads "not measured"
        if backward_alone > 0:
            out[f"{impl} backward"] = backward_s / backward_alone
    return out


def numpy_bounds(rows: list[dict[str, Any]], stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dtype, n, layout) of the stage breakdown: the best ratio a NumPy Eq. (1) could reach.

    ``floor_s`` = qk_gemm + pv_gemm + exp (no NumPy attention does less); ``backward_floor_s`` = 2 qk_gemm + pv_gemm
    + 2 pvt_gemm + exp (no NumPy backward that recomputes the scores does less; :mod:`aiayn.benchmarks.stages`);
    ``fractions_of_floor``: each NumPy built-in's unmasked cases against them; ``all_stages_s`` adds the
    max, subtract and sum passes; ``gemm_at_ceiling_s`` = the 4 n^2 d flops at the ceiling + exp.
    Each is turned into a fraction of the ceiling of the measured ``numpy`` case (the same ceiling
    for all, so that they compare with it) and set beside that case's ratio.
    """
    out = []
    keys = sorted({(s["dtype"], s["n"], s["layout"]) for s in stages})
    for dtype, n, layout in keys:
        t = {s["name"]: s["time_min_s"] for s in stages if (s["dtype"], s["n"], s["layout"]) == (dtype, n, layout)}
        if not {"qk_gemm", "pv_gemm", "exp"} <= t.keys():
            continue
        measured = _find(rows, impl="numpy", dtype=dtype, n=n, causal=False, pass_="forward")
        group = [s["ceiling_gflops"] for s in stages if (s["dtype"], s["n"], s["layout"]) == (dtype, n, layout)]
        ceiling = measured["ceiling_gflops"] if measured else max(group)  # one ceiling for the bounds and the case
        flops = attention_flops(HEADS, n, n, HEAD_DIM, causal=False)
        floor_s = t["qk_gemm"] + t["pv_gemm"] + t["exp"]
        back_s = 2 * t["qk_gemm"] + t["pv_gemm"] + 2 * t["pvt_gemm"] + t["exp"] if "pvt_gemm" in t else None
        all_s = sum(v for name, v in t.items() if name != "pvt_gemm")
        at_ceiling_s = flops / (ceiling * 1e9) + t["exp"]
        out.append(
            {
                "dtype": dtype,
                "n": n,
                "layout": layout,
                "stage_times_s": t,
                "floor_s": floor_s,
                "ceiling_gflops": ceiling,
                "exp_gelem_per_s": HEADS * n * n / t["exp"] / 1e9,
                "exp_share_of_floor": t["exp"] / floor_s,
                "ratio_bound_gemm_at_ceiling": flops / at_ceiling_s / 1e9 / ceiling,
                "ratio_bound_floor": flops / floor_s / 1e9 / ceiling,
                "ratio_bound_all_stages": flops / all_s / 1e9 / ceiling,
                "numpy_measured_ratio": measured["ratio_full"] if measured else None,
                "numpy_measured_time_s": measured["time_min_s"] if measured else None,
                "backward_floor_s": back_s,
                "fractions_of_floor": _fractions_of_floor(rows, dtype, n, floor_s, back_s),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# formatting


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / MIB:,.1f}"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _met(m: bool | None) -> str:
    return {True: "met", False: "short", None: "not measured"}[m]


def _case_table(rows: list[dict[str, Any]]) -> list[str]:
    headers = [
        "implementation",
        "pass",
        "dtype",
        "n",
        "mask",
        "rounds",
        "best ms",
        "GFLOP/s full",
        "GFLOP/s useful",
        "of ceiling (full)",
        "of ceiling (useful)",
        "peak MiB",
        "peak / scores",
    ]
    body = [
        [
            r["impl"],
            r["pass_"],
            r["dtype"],
            r["n"],
            "causal" if r["causal"] else "none",
            len(r.get("round_times_s") or []) or "n/a",
            f"{r['time_min_s'] * 1e3:,.2f}",
            f"{r['gflops_full']:.1f}",
            f"{r['gflops_useful']:.1f}",
            _ratio(r["ratio_full"]),
            _ratio(r["ratio_useful"]),
            _mib(r.get("peak_bytes")),
            "n/a" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / r['score_bytes']:.3f}",
        ]
        for r in rows
    ]
    return md_table(headers, body, "llllrrrrrrrrr")


def _ceiling_table(run: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    body = []
    for start in run.get("aiayn", {}).get("ceilings_start", []):
        end = _ceiling_of(run, start["library"], start["dtype"], "end")
        drift = "n/a" if end is None else f"{end['gflops'] / start['gflops'] - 1:+.1%}"
        adjacent = [
            r.get("ceiling_adjacent_gflops", r["ceiling_gflops"])
            for r in rows
            if (r["library"], r["dtype"]) == (start["library"], start["dtype"])
        ]
        session = _ceiling_of(run, start["library"], start["dtype"], "best")
        spread = f"{min(adjacent):.1f} - {max(adjacent):.1f}" if adjacent else "n/a"
        body.append(
            [
                start["library"],
                start["dtype"],
                f"{start['n']}^3",
                f"{start['gflops']:.1f}",
                f"{start['gflops_median']:.1f}",
                "n/a" if end is None else f"{end['gflops']:.1f}",
                drift,
                spread,
                "n/a" if session is None else f"**{session['gflops']:.1f}**",
            ]
        )
    headers = [
        "library",
        "dtype",
        "GEMM",
        "start GFLOP/s (best)",
        "start (median)",
        "end GFLOP/s (best)",
        "end vs start",
    ]
    return md_table([*headers, "per-case adjacent ceilings (min - max)", "session ceiling"], body, "lllrrrrrr") + [
        "",
        "Every ratio in this report divides by the session ceiling (last column): the fastest GEMM of that library and "
        "dtype seen anywhere in the run (start, end, and the short measurements right before and after each case). "
        "Noise only slows a GEMM, so the maximum is the least disturbed estimate, as the best round is for each case; "
        "a per-case ceiling scattered too much (see its range) to compare cases with each other.",
    ]


def _pool(p: dict[str, Any]) -> str:
    """One thread pool as threadpoolctl reports it: library, version, kernel, threads."""
    version = f" {p['version']}" if p.get("version") else ""
    return (
        f"{p.get('internal_api')}{version} ({p.get('prefix')}) kernel {p.get('architecture', 'n/a')}, "
        f"{p.get('num_threads')} thread(s)"
    )


def _load(xs: list[float] | None) -> str:
    return "/".join(f"{x:.2f}" for x in xs) if xs else "n/a"


def _setup_lines(run: dict[str, Any]) -> list[str]:
    a = run.get("aiayn", {})
    pools = "; ".join(_pool(p) for p in a.get("threadpools", []))
    env = ", ".join(f"{k}={'unset' if v is None else v}" for k, v in a.get("blas_env", {}).items())
    impls = ", ".join(f"{k} ({v['version']}, {v['device']})" for k, v in a.get("implementations", {}).items())
    commit = run.get("commit_info", {})
    commit_id = str(commit.get("id") or commit.get("error") or "n/a")
    commit_id = (commit_id[:7] if len(commit_id) == 40 else commit_id) + (" (dirty)" if commit.get("dirty") else "")
    pools_how = "applied" if a.get("threadpoolctl") else "NOT available: pools set by environment only"
    return [
        f"- Run: {run.get('datetime', 'n/a')}, commit {commit_id}, pytest-benchmark {run.get('version', 'n/a')}.",
        f"- CPU: {a.get('cpu_model', 'n/a')}, {a.get('cpu_count', 'n/a')} logical CPUs; "
        f"threads used: {a.get('threads', 'n/a')} (threadpoolctl {pools_how}).",
        f"- GPU: {', '.join(a.get('cuda_devices') or []) or 'none seen by torch'}.",
        f"- Thread pools (threadpoolctl): {pools or 'n/a'}.",
        f"- BLAS environment during the run: {env or 'n/a'}.",
        f"- Load average (1/5/15 min) at start {_load(a.get('loadavg_start'))}, at end {_load(a.get('loadavg_end'))}: "
        "other work on the machine slows the timed calls and the ceilings alike.",
        f"- Implementations: {impls or 'n/a'}.",
        "- Timing: best of the timed rounds (one call each, after an untimed warm-up call and an untimed "
        f"memory-measuring call), rounds filling about {a.get('budget_s', 'n/a')} s per case, between "
        f"{a.get('min_rounds', 'n/a')} and {a.get('max_rounds', 'n/a')}. GEMM ceiling of a case: the best of "
        f"{a.get('adjacent_repeats', 'n/a')} calls of a {a.get('gemm_n', 'n/a')}^2 product right before its rounds and "
        f"{a.get('adjacent_repeats', 'n/a')} right after; the session's ceilings (best of "
        f"{a.get('gemm_repeats', 'n/a')} after a warm-up, at the start and again at the end) show the drift. Ratios "
        "divide by the session ceiling, the best of all of these (see the ceiling table).",
    ]


def noise_warning(run: dict[str, Any]) -> str | None:
    """A sentence when the run was visibly disturbed: ceilings moved > 10% or more runnable work than CPUs."""
    a = run.get("aiayn", {})
    drifts = []
    for start in a.get("ceilings_start", []):
        end = _ceiling_of(run, start["library"], start["dtype"], "end")
        if end is not None:
            drifts.append(abs(end["gflops"] / start["gflops"] - 1))
    load = max([*a.get("loadavg_start", [0])[:1], *a.get("loadavg_end", [0])[:1]])
    cpus = a.get("cpu_count") or 1
    reasons = []
    if drifts and max(drifts) > 0.10:
        reasons.append(f"the GEMM ceilings moved by up to {max(drifts):.0%} between the start and the end of the run")
    if load > cpus:
        reasons.append(f"the 1-minute load average reached {load:.1f} on {cpus} CPUs")
    if not reasons:
        return None
    return "Noisy run: " + " and ".join(reasons) + "; treat these numbers as indicative and rerun on a quiet machine."


def _target_lines(t: dict[str, Any]) -> list[str]:
    f, g = t["numpy_fraction_of_floor"], t["blocked_memory_growth"]
    growth = (
        "not measured"
        if g.get("exponent") is None
        else f"{g['exponent']:.2f} between n = {g['n'][0]} and {g['n'][1]} "
        f"({_mib(g['peak_bytes'][0])} -> {_mib(g['peak_bytes'][1])} MiB)"
    )
    floor = (
        _ratio(f["value"])
        if f["value"] is None
        else f"{f['value']:.3f} (floor {f['floor_s'] * 1e3:.2f} ms / call {f['time_s'] * 1e3:.2f} ms)"
    )
    return md_table(
        ["target (" + t["case"] + ")", "measured", "target", "status"],
        [
            [
                "numpy attention: its floor's time (QK^T + PV + exp, measured alone) / its own time",
                floor,
                f">= {f['target']}",
                _met(f["met"]),
            ],
            [
                "numpy backward: its floor's time (2 QK^T + PV + 2 P^T products + exp, measured alone) / its own time "
                "(with no backward-alone case: forward+backward's less forward's)",
                _ratio(t["numpy_backward_fraction_of_floor"]["value"]),
                f">= {t['numpy_backward_fraction_of_floor']['target']}",
                _met(t["numpy_backward_fraction_of_floor"]["met"]),
            ],
            ["numpy-blocked peak memory growth exponent (float32, no mask)", growth, "~1 (linear)", _met(g["met"])],
            [
                "numpy attention, fraction of the NumPy GEMM ceiling",
                _ratio(t["numpy_ratio_of_ceiling"]["value"]),
                "none (bound by exp, see below)",
                "reported",
            ],
            [
                "torch-sdpa attention, fraction of the torch GEMM ceiling",
                _ratio(t["sdpa_ratio_of_ceiling"]["value"]),
                "none",
                "reported",
            ],
        ],
        "lrrl",
    )


def _bound_lines(bounds: list[dict[str, Any]]) -> list[str]:
    rows = []
    for b in bounds:
        t = b["stage_times_s"]
        rows.append(
            [
                f"{b['dtype']} n={b['n']} {b['layout']}",
                *(
                    f"{t.get(k, float('nan')) * 1e3:.2f}"
                    for k in ("qk_gemm", "pv_gemm", "exp", "max", "subtract", "sum")
                ),
                f"{b['exp_gelem_per_s']:.2f}",
                _ratio(b["ratio_bound_gemm_at_ceiling"]),
                _ratio(b["ratio_bound_floor"]),
                _ratio(b["ratio_bound_all_stages"]),
                _ratio(b["numpy_measured_ratio"]),
            ]
        )
    headers = [
        "stages (one call's worth)",
        "QK^T ms",
        "PV ms",
        "exp ms",
        "max ms",
        "subtract ms",
        "sum ms",
        "exp Gelem/s",
        "bound: GEMM at ceiling + exp",
        "bound: QK + PV + exp",
        "bound: all six",
        "numpy measured",
    ]
    return md_table(headers, rows, "l" + "r" * 11)


def _floor_lines(bounds: list[dict[str, Any]]) -> list[str]:
    """Each NumPy built-in's unmasked cases as fractions of their floors (cache-resident tiles), per (dtype, n)."""
    tiles = [b for b in bounds if b["layout"] == "tile" and b.get("fractions_of_floor")]
    if not tiles:
        return []
    lines = [
        "",
        "Each NumPy built-in against its floors (tiles): the floor's time over the case's best time. Forward: QK^T + "
        "PV + exp; backward: 2 QK^T-shaped + PV-shaped + 2 P^T-shaped products + exp (the scores recomputed, dP, dQ, "
        "dV, dK); forward+backward: the two summed. A run with no backward-alone case times the backward as its "
        "forward+backward case's best time less its forward case's.",
        "",
    ]
    rows = [
        [f"{b['dtype']} n={b['n']}", case, f"{fraction:.3f}"]
        for b in tiles
        for case, fraction in sorted(b["fractions_of_floor"].items())
    ]
    return lines + md_table(["stages", "case", "fraction of its floor"], rows, "llr")


def _diagnosis(bounds: list[dict[str, Any]], targets: dict[str, Any]) -> list[str]:
    """Plain sentences on what bounds the NumPy attention, from the tile layout's numbers."""
    tile = next((b for b in bounds if b["layout"] == "tile" and (b["dtype"], b["n"]) == TARGETS["target_case"]), None)
    full = next((b for b in bounds if b["layout"] == "full" and (b["dtype"], b["n"]) == TARGETS["target_case"]), None)
    if tile is None:
        return ["The stage breakdown was not run (`--bench-stages float32:2048`), so no bound is computed."]
    lines = [
        f"- Exponential: `np.exp` runs at {tile['exp_gelem_per_s']:.2f} Gelem/s on cache-resident 1 MiB tiles; one "
        f"call needs 8 x 2048^2 = {8 * 2048**2 / 1e6:.1f} M of them, {tile['stage_times_s']['exp'] * 1e3:.1f} ms, "
        f"which is {tile['exp_share_of_floor']:.0%} of the least time (QK^T + PV + exp) any NumPy attention built "
        "from these calls can take.",
        f"- Even with both products at the full GEMM ceiling, that exp time caps a NumPy attention at "
        f"{tile['ratio_bound_gemm_at_ceiling']:.3f} of the ceiling; with the products at the speed NumPy actually gets "
        f"for these shapes (n x 64 x n and n x n x 64), at {tile['ratio_bound_floor']:.3f}; adding the max, subtract "
        f"and sum passes, at {tile['ratio_bound_all_stages']:.3f}.",
    ]
    if full is not None:
        lines.append(
            "- Memory traffic: on the whole (8, 2048, 2048) score array (128 MiB, main memory) instead of 1 MiB tiles, "
            f"the exp pass runs at {full['exp_gelem_per_s']:.2f} Gelem/s and the six stages bound the ratio at "
            f"{full['ratio_bound_all_stages']:.3f} (tiles: {tile['ratio_bound_all_stages']:.3f})."
        )
    measured = tile["numpy_measured_ratio"]
    if measured is not None:
        lines.append(
            f"- The `numpy` implementation measured {measured:.3f} of the ceiling: "
            f"{measured / tile['ratio_bound_all_stages']:.0%} of the all-stages bound on tiles."
        )
    return lines


# ---------------------------------------------------------------------------------------------
# the figure


# The passes drawn, each as a throughput row and a memory row; the backward alone is in the table only
# (forward+backward contains it, counted as FlashAttention counts it).
PLOTTED_PASSES = ("forward", "forward+backward")


def _plot(rows: list[dict[str, Any]], run: dict[str, Any], path: Path, bounds: list[dict[str, Any]]) -> Path:
    """GFLOP/s and peak memory against n for each plotted pass present (one row each), one column per dtype,
    one colour per implementation; then, where the stages were timed, each NumPy built-in's fraction of its floors
    (forward and backward, no mask) against n."""
    plt = pyplot()
    present = {r["pass_"] for r in rows}
    passes = [p for p in PLOTTED_PASSES if p in present] or sorted(present)  # a backward-only run: its own rows
    rows = [r for r in rows if r["pass_"] in passes]
    dtypes = sorted({r["dtype"] for r in rows})
    impls = sorted({r["impl"] for r in rows})
    sizes = sorted({r["n"] for r in rows})
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}
    threads = run.get("aiayn", {}).get("threads", "?")
    floors = [b for b in bounds if b["layout"] == "tile" and b["fractions_of_floor"]]
    n_rows = 2 * len(passes) + (1 if floors else 0)
    with figure_style():
        fig, axes = plt.subplots(n_rows, len(dtypes), figsize=(6 * len(dtypes), 4.5 * n_rows + 0.5), squeeze=False)
        for k, pass_ in enumerate(passes):
            for col, dtype in enumerate(dtypes):
                top, bottom = axes[2 * k][col], axes[2 * k + 1][col]
                for impl in impls:
                    for causal, style in ((False, "-"), (True, "--")):
                        pts = sorted(
                            (r["n"], r["gflops_useful"], r.get("peak_bytes"))
                            for r in rows
                            if r["impl"] == impl
                            and r["dtype"] == dtype
                            and r["causal"] == causal
                            and r["pass_"] == pass_
                        )
                        label = f"{impl}, {'causal (useful flops)' if causal else 'no mask'}"
                        top.plot(
                            [p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=colors[impl], label=label
                        )
                        mem = [(p[0], p[2] / MIB) for p in pts if p[2]]
                        bottom.plot([m[0] for m in mem], [m[1] for m in mem], style, marker="o", color=colors[impl])
                for library, ls in (("numpy", ":"), ("torch", "-.")):
                    c = _ceiling_of(run, library, dtype)
                    if c:
                        top.axhline(
                            c["gflops"], linestyle=ls, color="black", linewidth=1, label=f"{library} GEMM ceiling"
                        )
                        top.annotate(
                            f"{library} GEMM {c['gflops']:.0f}",
                            (sizes[0], c["gflops"]),
                            textcoords="offset points",
                            xytext=(0, 3) if library == "numpy" else (0, -10),
                            fontsize=8,
                        )
                counted = ("" if PASSES[pass_] == 1 else f"{PASSES[pass_]:g} x ") + "4 n^2 d per head"
                top.set(
                    xscale="log",
                    title=f"Eq. (1) {pass_}, {dtype}, B=1 h=8 d=64, {threads} thread(s)",
                    xlabel="n",
                    ylabel=f"GFLOP/s ({counted}; causal: useful pairs)",
                )
                bottom.set(
                    xscale="log",
                    yscale="log",
                    title=f"{pass_}: peak memory per call beyond the inputs, {dtype}",
                    xlabel="n",
                    ylabel="MiB",
                )
                for ax in (top, bottom):
                    ax.set_xticks(sizes, labels=[str(n) for n in sizes])
                    ax.minorticks_off()
                top.set_ylim(bottom=0)
        if floors:
            for col, dtype in enumerate(dtypes):
                _plot_floors(axes[-1][col], [b for b in floors if b["dtype"] == dtype], dtype, colors, threads)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.9 / (4.5 * n_rows + 0.5), 1, 1))
        return save_png(fig, path)


def _plot_floors(ax: Any, bounds: list[dict[str, Any]], dtype: str, colors: dict[str, str], threads: Any) -> None:
    """Each NumPy built-in's fraction of its floors against n (``numpy_bounds``' ``fractions_of_floor``, the tile
    layout): solid the forward, dashed the backward, dotted forward+backward; the targets as grey lines."""
    if not bounds:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"NumPy stages not timed in {dtype}: no floors", ha="center", va="center")
        return
    styles = {"forward": "-", "backward": "--", "forward+backward": ":"}
    for impl in ("numpy", "numpy-blocked"):
        for pass_, style in styles.items():
            pts = sorted(
                (b["n"], b["fractions_of_floor"][f"{impl} {pass_}"])
                for b in bounds
                if f"{impl} {pass_}" in b["fractions_of_floor"]
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    color=colors.get(impl, "black"),
                    label=f"{impl} {pass_}",
                )
    for name, pass_ in (("fraction_of_floor", "forward"), ("backward_fraction_of_floor", "backward")):
        ax.axhline(TARGETS[name], color="grey", linewidth=0.8, linestyle=styles[pass_])
    lengths = sorted({b["n"] for b in bounds})
    ax.set(
        xscale="log",
        title=f"NumPy built-ins: fraction of their floors, {dtype}, {threads} thread(s)",
        xlabel="n",
        ylabel="floor time / call time (1 = the floor)",
    )
    if lengths:
        ax.set_xticks(lengths, labels=[str(n) for n in lengths])
        ax.minorticks_off()
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7, frameon=False)


def _training_lines(summary: list[dict[str, Any]], memory: list[dict[str, Any]]) -> list[str]:
    """The training-throughput section: ours against the peer, MFU, what bounds it, memory at long n."""
    if not summary:
        return ["Not run (`--bench-training` empty)."]
    lines = [
        "One training step (forward, §5.4's label-smoothed loss, backward, Adam) of our model (the model `aiayn train` "
        "trains, named by `--bench-training-step`) and of PyTorch's `nn.Transformer` built with the same configuration "
        "(`benchmarks/training.py` says how), on the same synthetic batch of full-length sentences, one thread, in one "
        "run. Operations per step: `aiayn.reference.counts.training_step_flops` (three forward passes' matrix "
        "products). MFU: those operations per second over the session's torch float32 GEMM ceiling. GEMM share: the "
        "step's self time in matrix products (one profiled step).",
        "",
    ]
    body = []
    for e in summary:
        for model in ("ours", "peer"):
            r = e.get(model)
            if not r:
                continue
            prof = r.get("profile") or {}
            share = f"{prof['gemm_s'] / prof['total_s']:.0%}" if prof.get("total_s") else "n/a"
            body.append(
                [
                    e["training"],
                    "ours" if model == "ours" else "nn.Transformer",
                    f"d={r['d_model']}, N={r['n_layers']}, V={r['vocab']:,}",
                    f"{r['batch']} × {r['n']}",
                    f"{r['time_min_s'] * 1e3:,.0f}",
                    f"{r['tokens_per_s']:,.0f}",
                    f"{r['gflops']:.1f}",
                    f"{r['mfu']:.3f}",
                    share,
                ]
            )
    lines += md_table(
        [
            "configuration",
            "model",
            "sizes",
            "batch (sentences × positions)",
            "best step ms",
            "target tokens/s",
            "GFLOP/s",
            "MFU",
            "GEMM share",
        ],
        body,
        "lllrrrrrr",
    )
    lines.append("")
    for e in summary:
        if "ratio_of_peer" not in e:
            continue
        t = TRAINING_TARGETS
        text = (
            f"- {e['training']}: ours at {e['ratio_of_peer']:.2f}× the peer's throughput (target >= "
            f"{t['ratio_of_peer']:g}: {_met(e['ratio_met'])}) and {e['ours']['mfu']:.3f} of the GEMM ceiling (target "
            f">= {t['mfu']}: {_met(e['mfu_met'])})"
        )
        if "mfu_bound_gemm_at_ceiling" in e:
            text += (
                f"; its matrix products take {e['gemm_share']:.0%} of the step at {e['gemm_gflops']:.1f} GFLOP/s "
                f"({e['gemm_gflops'] / e['ours']['ceiling_gflops']:.2f} of the ceiling), and the rest of the step "
                f"alone bounds the MFU at {e['mfu_bound_gemm_at_ceiling']:.3f} even with every product at the ceiling; "
                "largest other work: "
                + ", ".join(f"{k} ({v / e['ours']['profile']['total_s']:.0%})" for k, v in e["top_other"][:4])
            )
        lines.append(text + ".")
    if memory:
        ns = sorted({m["n"] for m in memory})
        models = [m for m in ("ours", "ours-untiled", "peer") if any(r["memory_model"] == m for r in memory)]
        peak = {(r["memory_model"], r["n"]): r["peak_bytes"] for r in memory}
        lines += [
            "",
            "Peak memory of one training step beyond its inputs (B = 1, the CPU preset's model without dropout; "
            "PyTorch's allocator events), MiB, and the growth exponent between the two longest lengths (1: linear, 2: "
            "quadratic):",
            "",
        ]
        rows = []
        for m in models:
            a, b = (peak.get((m, ns[-2])), peak.get((m, ns[-1]))) if len(ns) > 1 else (None, None)
            exponent = math.log(b / a) / math.log(ns[-1] / ns[-2]) if a and b else None
            rows.append(
                [
                    {"ours": "ours (tiled attention)", "ours-untiled": "ours, untiled", "peer": "nn.Transformer"}[m],
                    *(_mib(peak.get((m, n))) for n in ns),
                    "n/a" if exponent is None else f"{exponent:.2f}",
                ]
            )
        lines += md_table(["model", *(f"n={n}" for n in ns), "exponent"], rows, "l" + "r" * (len(ns) + 1))
    return lines


# ---------------------------------------------------------------------------------------------
# assembling the report


def build_report(
    run: dict[str, Any],
    comparison: RunComparison | None = None,
    baseline_note: str | None = None,
    reference: list[str] | None = None,
) -> tuple[Report, list[dict[str, Any]]]:
    """The Markdown/JSON report of ``run`` (and its ``comparison`` with a baseline), and its case rows.

    ``baseline_note``: one line on the baseline (where it came from, when it ran), or why none was compared.
    ``reference``: the lines of a stored run shown beside this one with no verdict (``compare.format_reference``).
    """
    rows, stages = attention_rows(run), stage_rows(run)
    if not rows:
        raise UsageError("the run has no timed attention case (was it run with --benchmark-disable?)")
    bounds = numpy_bounds(rows, stages)
    targets = evaluate_targets(rows, bounds)
    dtypes = sorted({r["dtype"] for r in rows})
    packages = ("numpy", "torch", "pytest-benchmark", "threadpoolctl")
    report = Report(
        name="benchmarks",
        title="Attention benchmarks: throughput as a fraction of this machine's GEMM ceiling",
        precision=",".join(dtypes),
        seed="0",
        packages=packages,
    )
    f, g = targets["numpy_fraction_of_floor"], targets["blocked_memory_growth"]
    sdpa = targets["sdpa_ratio_of_ceiling"]["value"]
    builtins = {r["impl"] for r in rows} & {"numpy", "torch-sdpa", "numpy-blocked"}
    if builtins:
        report.verdict = (
            f"numpy attention (float32, n=2048) at {_ratio(f['value'])} of its own floor's speed (target "
            f"{f['target']}: {_met(f['met'])}); torch-sdpa at {_ratio(sdpa)} of the torch GEMM ceiling; blocked-path "
            f"memory exponent {'n/a' if g.get('exponent') is None else format(g['exponent'], '.2f')} "
            f"({_met(g['met'])})."
        )
    else:
        ratios = [r["ratio_full"] for r in rows]
        report.verdict = (
            f"{len(rows)} cases of {', '.join(sorted({r['impl'] for r in rows}))} timed, at {min(ratios):.3f} to "
            f"{max(ratios):.3f} of the GEMM ceiling (best round of each)."
        )
    if comparison is not None:
        report.verdict += f" Against the baseline: {summary(comparison)}."
    training = training_summary(training_rows(run))
    for e in training:
        if "ratio_of_peer" in e:
            report.verdict += (
                f" Training step ({e['training']}): {e['ratio_of_peer']:.2f}× nn.Transformer's throughput "
                f"({_met(e['ratio_met'])}), MFU {e['ours']['mfu']:.3f} ({_met(e['mfu_met'])})."
            )
    warning = noise_warning(run)
    if warning:
        report.verdict += " " + warning
    report.add(
        "",
        "Each case times one pass of Eq. (1), softmax(Q K^T / sqrt(d_k)) V (§3.2.1), through the implementation's own "
        "`scaled_dot_product_attention` on its own arrays (B = 1, h = 8, d = 64, n_q = n_k = n; causal = the §3.2.3 "
        "mask as an (n, n) boolean argument): the forward call, the backward (dQ, dK, dV from a cotangent dO, from "
        "the implementation's own `vjp`, torch autograd or jax.vjp, after an untimed forward), or both. Throughput "
        "counts 4 n^2 d flops per head for the forward, 2.5 times that for the backward and 3.5 times for both "
        "(FlashAttention's accounting); a causal case is also counted by its n (n + 1) / 2 visible pairs (useful). "
        "Every figure is also given as a fraction of the GEMM "
        "ceiling of the same library and dtype measured in the same run (the session ceiling: the best GEMM seen in "
        "the run): that fraction is what is compared between runs of one host (between hosts, even VMs of one "
        "kind, it moves by tens of percent case by case).",
    )
    if builtins:
        report.section("Targets", *_target_lines(targets))
    report.section("Setup", *_setup_lines(run))
    report.section("GEMM ceilings", *_ceiling_table(run, rows))
    report.section(
        "Results",
        "Best time of the timed rounds (every round's time is kept in the JSON: the sample a baseline comparison "
        "tests). Peak memory: the most held at once during one call beyond its inputs (NumPy: tracemalloc; PyTorch: "
        "the profiler's CPU-allocator events; a backward: beyond the forward's saved state too), and that over one "
        "(B, h, n, n) score matrix in the dtype.",
        "",
        *_case_table(rows),
    )
    if builtins or stages:
        report.section(
            "What bounds the NumPy attention",
            *_diagnosis(bounds, targets),
            "",
            *(_bound_lines(bounds) if bounds else []),
            *_floor_lines(bounds),
        )
    if builtins or training:
        report.section(
            "Training throughput: our model against nn.Transformer", *_training_lines(training, memory_rows(run))
        )
    how = (
        "Compared figure: the fraction of the ceiling of every timed round (`ratio_full`), by "
        "`aiayn.benchmarks.compare`: a case regressed only if its median fell beyond the factor and a one-sided "
        "Mann-Whitney U test on the two runs' rounds agrees (`aiayn.benchmarks.verdict`, asv's rule). "
        "pytest-benchmark's own `--benchmark-compare` compares absolute times only, with no test."
    )
    if comparison is not None and comparison.baseline_runs > 1:
        how = (
            f"Compared figure: the fraction of the ceiling of every timed round (`ratio_full`), by "
            f"`aiayn.benchmarks.compare` against {comparison.baseline_runs} baseline runs, the run as the unit: a "
            "case regressed only if its median fell below the one-sided normal prediction bound from the baseline "
            "runs' medians (Bonferroni over the cases) and beyond the factor (`aiayn.benchmarks.verdict."
            "compare_case_runs`)."
        )
    if comparison is not None:
        report.section(
            "Against the baseline", how, baseline_note or "", "", "```", *format_comparison(comparison), "```"
        )
    elif baseline_note:
        report.section("Against the baseline", baseline_note)
    if reference:
        report.verdict += " Beside a stored run: reference only, no verdict (see its section)."
        report.section("Beside a stored run (reference only, no verdict)", *reference)
    report.data.update(
        targets=targets,
        noise_warning=warning,
        setup={k: v for k, v in run.get("aiayn", {}).items() if k not in ("ceilings_start", "ceilings_end")},
        ceilings={
            "start": run.get("aiayn", {}).get("ceilings_start", []),
            "end": run.get("aiayn", {}).get("ceilings_end", []),
        },
        cases=[{k: v for k, v in row.items() if k != "name"} for row in rows],
        numpy_bounds=bounds,
        stages=stages,
        training=training,
        training_memory=memory_rows(run),
        comparison=None
        if comparison is None
        else {
            "figure": comparison.figure,
            "factor": comparison.factor,
            "alpha": comparison.alpha,
            "baseline_runs": comparison.baseline_runs,
            "rule": comparison.rule,
            "incompatible": comparison.incompatible,
            "exit_status": comparison.exit_status,
            "verdicts": [asdict(v) for v in comparison.cases.verdicts],
            "only_baseline": list(comparison.cases.only_baseline),
            "only_current": list(comparison.cases.only_current),
            "in_some_baselines": list(comparison.cases.in_some_baselines),
            "regressions": [v.case for v in comparison.cases.regressions],
        },
        run={
            "datetime": run.get("datetime"),
            "commit": run.get("commit_info", {}).get("id"),
            "pytest_benchmark": run.get("version"),
        },
    )
    return report, rows


def write(
    run_path: Path,
    out: Path,
    *,
    comparison: RunComparison | None = None,
    baseline_note: str | None = None,
    reference: list[str] | None = None,
    stem: str = "benchmarks",
    smoke: bool = False,
    force: bool = False,
) -> list[Path]:
    """Read one run's pytest-benchmark JSON and write ``<stem>.md``, ``.json`` and ``.png`` into ``out``.

    ``comparison``: the run's comparison with a baseline (``compare.compare_runs``), shown in its own section.
    The report's scope is the run's (:func:`aiayn.benchmarks.runfile.run_scope`: its timed attention cases; the smoke
    subset when ``smoke`` or when the run recorded it), the rule ``aiayn bench --save`` keeps a stored run by too.
    """
    run = load_run(Path(run_path))
    report, rows = build_report(run, comparison, baseline_note, reference)
    report.scope = run_scope(run, smoke)
    paths = write_report(Path(out), report, stem, force=force)
    paths.append(_plot(rows, run, paths[0].with_suffix(".png"), numpy_bounds(rows, stage_rows(run))))
    print(report.verdict)
    return paths


def duet_report(runs: Sequence[dict[str, Any]], margin: float) -> tuple[Report, list[Any]]:
    """The report of duets (``aiayn.benchmarks.duet.run``, one per spec): every case's paired ratio, its confidence
    bound and verdict (``verdict.duet_compare``, the level shared among every case of every duet), the ceilings
    each side measured before and after; and the verdicts."""
    from aiayn.benchmarks import verdict as V

    samples = {f"{r['new']['spec']} {c['case']}": c["ratios"] for r in runs for c in r["cases"]}
    verdicts = V.duet_compare(samples, margin)
    by_key = dict(zip(samples, verdicts, strict=True))
    report = Report(
        name="duet",
        title="A duet: new against old, round by round in one run",
        precision=",".join(sorted({c["dtype"] for r in runs for c in r["cases"]})),
        seed="0",
        packages=("numpy", "torch"),
    )
    regressed = [v for v in verdicts if v.regressed]
    rule = (
        f"regressed when the lower confidence bound of the median new/old time exceeds {1 + margin:.3f} (level "
        f"{V.DUET_ALPHA:g} shared among {len(verdicts)} cases; blocks of two rounds, the order alternating)"
    )
    report.verdict = (
        f"{len(regressed)} of {len(verdicts)} cases regressed: {', '.join(v.case for v in regressed)} ({rule})."
        if regressed
        else f"no case regressed of {len(verdicts)} ({rule})."
    )
    report.lines += [
        "",
        "Each side runs in its own process (one thread); for each case both make the same inputs, then the two "
        "are timed one call each per round, new first in even rounds and old first in odd ones. A block is two "
        "rounds, its ratio the geometric mean of theirs (the advantage of going first cancels). The bound is the "
        "order statistic of the blocks that lies below their median with the stated confidence (a sign test: no "
        "assumption on the spread), so a case regresses only if most of its blocks are slow beyond the margin.",
    ]
    for run in runs:
        old = run["old"]["spec"] + (f" from {run['old']['path']}" if run["old"]["path"] else "")
        report.section(
            f"{run['new']['spec']} (new) against {old} ({run['old']['label']})",
            f"Loaded from: new `{run['new'].get('file', 'n/a')}`, old `{run['old'].get('file', 'n/a')}`.",
            "",
        )
        rows = []
        for c in run["cases"]:
            v = by_key[f"{run['new']['spec']} {c['case']}"]
            new_t, old_t = float(np.median(c["new_times_s"])), float(np.median(c["old_times_s"]))
            rows.append(
                [
                    c["case"],
                    f"{old_t * 1e3:.2f}",
                    f"{new_t * 1e3:.2f}",
                    f"{v.ratio:.3f}",
                    "n/a" if v.lower is None else f"{v.lower:.3f}",
                    "REGRESSED" if v.regressed else "undecided" if v.undecided else "ok",
                ]
            )
        report.table(
            ["case", "old ms (median)", "new ms (median)", "new/old (median block)", "lower bound", "verdict"], rows
        )
        ceilings = [
            f"{c['library']} {c['dtype']}: new {c['before_gflops'][0]:.1f} -> {c['after_gflops'][0]:.1f}, old "
            f"{c['before_gflops'][1]:.1f} -> {c['after_gflops'][1]:.1f} GFLOP/s"
            for c in run["ceilings"]
        ]
        report.lines += ["", "GEMM ceilings before -> after the cases: " + "; ".join(ceilings) + "."]
    report.data.update(
        margin=margin,
        alpha=V.DUET_ALPHA,
        runs=list(runs),
        verdicts=[{**asdict(v), "undecided": v.undecided} for v in verdicts],
    )
    return report, verdicts
