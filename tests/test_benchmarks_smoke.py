"""The benchmark suite keeps running: CI's smoke subset, and the report and comparison scripts.

``test_smoke_run`` runs ``pytest benchmarks --bench-smoke`` (every implementation and dtype at
n = 128, the O(n)-memory paths also at n = 1024, one round each, a 256^2 GEMM ceiling) in a
subprocess, checks what it recorded, turns its JSON into the three report files, and keeps the
JSON at ``reports/tmp/benchmarks-smoke.json`` (CI's record). Nothing asserts on time: a shared VM
makes every timing noisy. What is asserted is deterministic: which cases ran, that each recorded
a positive finite throughput and ratio, and memory facts that follow from what a path allocates
(a path that materialises the (B, h, n, n) scores holds at least their bytes; the blocked path at
n = 1024 holds less than them).

The other tests check the arithmetic of the counts and of the comparison on hand-made data.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.benchmarks import cases as C
from aiayn.benchmarks import compare
from aiayn.benchmarks.report import memory_exponent

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "benchmarks" / "baseline" / "benchmarks-baseline.json"
SMOKE_JSON = REPO / "reports" / "tmp" / "benchmarks-smoke.json"


def _loadable(name: str) -> bool:
    from aiayn.implementations.registry import ImplementationNotFound, load

    try:
        load(name)
    except ImplementationNotFound:
        return False
    return True


def _run_smoke(json_path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "benchmarks",
        "--bench-smoke",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--benchmark-json={json_path}",
        "--bench-training-step=aiayn.reproductions.translation.bench:training_step",
    ]
    if BASELINE.exists():
        cmd.append(
            f"--benchmark-compare={BASELINE}"
        )  # pytest-benchmark's own (time) comparison must accept our baseline
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)


def _by_case(run: dict) -> dict[str, dict]:
    return {b["extra_info"]["case"]: b["extra_info"] for b in run["benchmarks"] if "case" in b["extra_info"]}


def test_smoke_run(tmp_path: Path) -> None:
    """The CI subset runs, records every case with its ratio and memory, and makes the reports."""
    json_path = tmp_path / "smoke.json"
    proc = _run_smoke(json_path)
    assert proc.returncode == 0, (
        f"pytest benchmarks --bench-smoke exited {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    SMOKE_JSON.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(json_path, SMOKE_JSON)
    run = json.loads(json_path.read_text(encoding="utf-8"))

    impls = [name for name in C.BUILTIN_IMPLS if _loadable(name)]
    expected = {
        c.id
        for c in C.build_cases(
            impls, C.DTYPES, C.SMOKE.sizes, C.SMOKE.big_sizes, C.MEMORY_BOUNDED_IMPLS, passes=tuple(C.PASSES)
        )
    }
    got = _by_case(run)
    assert expected <= got.keys(), (
        f"smoke run is missing cases {sorted(expected - got.keys())}; it recorded {sorted(got)}"
    )
    for case_id in sorted(expected):
        info = got[case_id]
        for key in ("gflops_full", "ratio_full", "ratio_useful", "ceiling_gflops"):
            assert isinstance(info.get(key), float) and math.isfinite(info[key]) and info[key] > 0, (
                f"{case_id}: {key} = {info.get(key)!r}, expected a positive finite float"
            )
        rounds = info.get("round_times_s")
        assert isinstance(rounds, list) and rounds and min(rounds) == info["time_min_s"], (
            f"{case_id}: round_times_s = {rounds!r}, expected every timed round, the best being {info['time_min_s']}"
        )
        if info["pass_"] != "forward":  # numpy and numpy-blocked write their vjp; torch gets autograd
            want = "torch.autograd" if info["library"] == "torch" else f"{info['impl']}.vjp"
            assert info["gradient_source"] == want, f"{case_id}: gradients from {info['gradient_source']}, not {want}"
        assert isinstance(info.get("peak_bytes"), int) and info["peak_bytes"] > 0, (
            f"{case_id}: peak_bytes = {info.get('peak_bytes')!r} ({info.get('peak_method')}), expected a positive int"
        )

    # The memory measurements see the allocations: these two paths hold the whole 8 x 128 x 128 score matrix.
    for case_id in ("numpy-float32-n128-full", "torch-float32-n128-full"):
        if case_id in got:
            info = got[case_id]
            assert info["peak_bytes"] >= info["score_bytes"], (
                f"{case_id}: peak {info['peak_bytes']} B by {info['peak_method']} is below the {info['score_bytes']} B "
                "score matrix that this path materialises: the memory measurement misses allocations"
            )
    # The blocked path never holds the (1, 8, 1024, 1024) scores at once.
    blocked = got["numpy-blocked-float32-n1024-full"]
    assert blocked["peak_bytes"] < blocked["score_bytes"], (
        f"numpy-blocked at n=1024: peak {blocked['peak_bytes']} B, not below the {blocked['score_bytes']} B score "
        "matrix it must not materialise"
    )

    # The training-throughput cases: ours and the nn.Transformer peer, each with a positive MFU; the memory cases.
    training = {b["extra_info"]["case"]: b["extra_info"] for b in run["benchmarks"] if "training" in b["extra_info"]}
    assert set(training) == {"train-tiny-ours", "train-tiny-peer"}, f"training cases recorded: {sorted(training)}"
    for case_id, info in training.items():
        assert info["mfu"] > 0 and info["tokens_per_s"] > 0 and info["flops"] > 0, f"{case_id}: {info}"
        assert info["profile"]["total_s"] >= info["profile"]["gemm_s"] > 0, f"{case_id}: profile {info['profile']}"
    memory = {
        (b["extra_info"]["memory_model"], b["extra_info"]["n"]): (
            b["extra_info"]["peak_bytes"],
            b["extra_info"]["peak_method"],
        )
        for b in run["benchmarks"]
        if "memory_model" in b["extra_info"]
    }
    assert set(memory) == {(m, n) for m in ("ours", "ours-untiled", "peer") for n in (64, 128)}, sorted(memory)
    for key, (peak, method) in sorted(memory.items()):
        assert isinstance(peak, int) and peak > 0, f"training memory {key}: peak {peak!r} ({method}), expected positive"

    stages = {b["extra_info"]["stage"] for b in run["benchmarks"] if "stage" in b["extra_info"]}
    lengths = len({*C.SMOKE.sizes, *C.SMOKE.big_sizes})  # the floors at every n of the run
    assert len(stages) == 14 * lengths, (
        f"expected the {14 * lengths} NumPy stage benchmarks (2 layouts x 7 stages at each of {lengths} lengths), got "
        f"{sorted(stages)}"
    )
    record = run.get("aiayn", {})
    assert record.get("threads") == 1, f"the smoke run should use one thread, recorded {record.get('threads')!r}"
    assert {(c["library"], c["dtype"]) for c in record.get("ceilings_start", [])} >= {
        ("numpy", "float32"),
        ("numpy", "float64"),
    }, "no NumPy GEMM ceiling recorded"

    # Every case is divided by its library's session ceiling, the best GEMM the run saw.
    session = {(c["library"], c["dtype"], c["device"]): c["gflops"] for c in record.get("ceilings_best", [])}
    for case_id in sorted(expected):
        info = got[case_id]
        want = session.get((info["library"], info["dtype"], info["device"]))
        assert want is not None and info["ceiling_gflops"] == want, (
            f"{case_id}: divided by a ceiling of {info['ceiling_gflops']} GFLOP/s, expected the session ceiling {want} "
            f"of {info['library']}/{info['dtype']}/{info['device']} (ceilings_best: {session})"
        )
        assert want >= info["ceiling_adjacent_gflops"], (
            f"{case_id}: session ceiling {want} below its adjacent {info['ceiling_adjacent_gflops']}"
        )

    from aiayn.cli import main

    out = tmp_path / "reports"
    assert main(["bench", "--from-run", str(json_path), "--out", str(out)]) == 0
    data = json.loads((out / "benchmarks.json").read_text(encoding="utf-8"))
    assert {row["case"] for row in data["cases"]} >= expected, "the report's JSON lacks some smoke cases"
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    for heading in (
        "## Targets",
        "## GEMM ceilings",
        "## Results",
        "## What bounds the NumPy attention",
        "## Training throughput: our model against nn.Transformer",
    ):
        assert heading in md, f"benchmarks.md has no section {heading!r}"
    assert (out / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "benchmarks.png is not a PNG file"

    # The gate's exit statuses on stored runs (no timing): the smoke run's cases given ten rounds each (its best time
    # times 1.00, 1.01, ..., 1.09), against itself recorded earlier (0), against a baseline 30% faster in every round
    # (1), against one from another NumPy build (4); the smoke run's own single rounds are undecided (0).
    def variant(name: str, scale: float = 1.0, numpy_build: str | None = None, datetime: str = "2000-01-01") -> Path:
        other = json.loads(json_path.read_text(encoding="utf-8"))
        other["datetime"] = datetime
        for b in other["benchmarks"]:
            if "round_times_s" in b["extra_info"]:
                best = b["extra_info"]["time_min_s"]
                b["extra_info"]["round_times_s"] = [best * scale * (1 + 0.01 * i) for i in range(10)]
        if numpy_build:
            other["aiayn"]["libraries"]["numpy"] = numpy_build
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(other), encoding="utf-8")
        return path

    current = variant("current", datetime="2000-01-02")
    gate = ["bench", "--from-run", str(current), "--out", str(tmp_path / "gate")]
    assert main([*gate, "--baseline", str(variant("same"))]) == 0
    assert main([*gate, "--baseline", str(variant("faster", scale=1 / 1.3))]) == 1
    assert main([*gate, "--baseline", str(variant("other-build", numpy_build="0.0.0"))]) == 4
    # Against ten baseline runs (the run-level bound; their medians 0.2% apart, so that over the run's many cases
    # the bound is the factor's): runs like this one pass, ten 30% faster ones fail it, one from another build among
    # them is refused, and two runs are neither rule's.
    like = [str(variant(f"like-{i}", scale=1 + 0.002 * (i - 4.5))) for i in range(10)]
    faster = [str(variant(f"faster-{i}", scale=(1 + 0.002 * (i - 4.5)) / 1.3)) for i in range(10)]
    assert main([*gate, "--baseline", *like]) == 0
    assert main([*gate, "--baseline", *faster]) == 1
    data = json.loads((tmp_path / "gate" / "benchmarks.json").read_text(encoding="utf-8"))
    assert data["comparison"]["baseline_runs"] == 10 and data["comparison"]["regressions"]
    assert main([*gate, "--baseline", *like[:9], str(variant("other-build-10", numpy_build="0.0.0"))]) == 4
    assert main([*gate, "--baseline", *like[:2]]) == 4
    single = ["bench", "--from-run", str(json_path), "--out", str(tmp_path / "gate")]
    assert main([*single, "--baseline", str(variant("faster-single", scale=1 / 1.3))]) == 0  # undecided
    data = json.loads((tmp_path / "gate" / "benchmarks.json").read_text(encoding="utf-8"))
    assert data["comparison"]["verdicts"] and all(v["undecided"] for v in data["comparison"]["verdicts"])


def test_attention_flops_closed_forms() -> None:
    """4 * pairs * d per head: by hand for tiny shapes and for the target case, n = 2048."""
    assert C.attention_flops(1, 2, 2, 1, causal=False) == 16  # 4 pairs x 4
    assert C.attention_flops(1, 2, 2, 1, causal=True) == 12  # pairs (0,0), (1,0), (1,1)
    assert C.attention_flops(3, 2, 5, 7, causal=False) == 3 * 4 * 10 * 7
    case = C.Case("numpy", "float32", 2048, causal=True)
    assert case.flops_full == 8_589_934_592  # 4 * 8 heads * 2048^2 * 64
    assert case.flops_useful == 4 * 8 * 64 * (2048 * 2049 // 2) == 4_297_064_448  # 2048 x 2098176
    assert case.score_bytes == 8 * 2048 * 2048 * 4
    with pytest.raises(ValueError, match="square"):
        C.attention_flops(1, 2, 3, 1, causal=True)


def _run_with(rounds: dict[str, list[float]], threads: int = 1, libraries: dict | None = None) -> dict:
    """A hand-made run: each case's round times (s) for 1 GFLOP against a 10 GFLOP/s session ceiling, so a round of
    t seconds has the ratio 0.1 / t."""
    info = {"flops_full": 1e9, "flops_useful": 1e9, "ceiling_gflops": 10.0, "device": "cpu"}
    return {
        "benchmarks": [
            {"extra_info": dict(info, case=k, ratio_full=0.1 / min(v), round_times_s=v)} for k, v in rounds.items()
        ],
        "aiayn": {"threads": threads, "cpu_model": "cpu X", "libraries": libraries or {"numpy": "2.4.6"}},
    }


def test_case_samples_are_the_ratio_of_every_round() -> None:
    run = _run_with({"a": [0.2, 0.25, 0.4]})
    assert compare.case_samples(run)["a"] == pytest.approx([0.5, 0.4, 0.25], rel=1e-12)
    old = {"benchmarks": [{"extra_info": {"case": "a", "ratio_full": 0.5}}]}  # recorded before rounds were kept
    assert compare.case_samples(old) == {"a": [0.5]}
    with pytest.raises(ValueError, match="figure"):
        compare.case_samples(run, figure="time")


def test_compare_flags_a_slower_case_and_not_a_steady_one() -> None:
    """Ten rounds each: a case 30% slower in every round regresses (p = 1/184756), a steady one and a faster one do
    not, a 5% drop stays within the factor 1.1; the cases of one run only are listed."""
    steady = [0.100 + 0.001 * i for i in range(10)]
    base = _run_with({"slow": steady, "same": steady, "fast": steady, "small": steady, "gone": steady})
    cur = _run_with(
        {
            "slow": [t * 1.3 for t in steady],
            "same": steady[::-1],
            "fast": [t / 1.3 for t in steady],
            "small": [t * 1.05 for t in steady],
            "new": steady,
        }
    )
    result = compare.compare_runs([base], cur)
    assert [v.case for v in result.cases.regressions] == ["slow"]
    assert result.exit_status == 1 and result.incompatible is None
    assert (result.cases.only_baseline, result.cases.only_current) == (("gone",), ("new",))
    text = "\n".join(compare.format_comparison(result))
    assert "REGRESSED" in text and "1 of 4 cases regressed" in text and "slow" in text
    assert compare.compare_runs([base], base).exit_status == 0


def test_compare_refuses_another_thread_count_or_library_build() -> None:
    one = {"a": [0.1] * 10}
    threads = compare.compare_runs([_run_with(one, threads=1)], _run_with(one, threads=2))
    assert threads.exit_status == 4 and "thread count" in threads.incompatible
    build = compare.compare_runs([_run_with(one)], _run_with(one, libraries={"numpy": "2.5.0"}))
    assert build.exit_status == 4 and "numpy 2.4.6 vs numpy 2.5.0" in build.incompatible
    assert compare.format_comparison(build)[0].startswith("not compared: baseline from another library build")


def test_compare_with_several_baseline_runs_takes_the_run_as_the_unit() -> None:
    """Five baseline runs: case "a" steady from run to run (times x0.99 to x1.01), case "b" not (x0.92 to x1.08). A
    run with "a" 30% slower regresses on "a"; "b" 12% slower, within its run-to-run spread, does not, though against
    the middle baseline run alone the rank test flags it (all ten rounds below, p = 1/184756)."""
    from aiayn.environment import UsageError

    steady = [0.100 + 0.0001 * i for i in range(10)]

    def times(scale: float) -> list[float]:
        return [t * scale for t in steady]

    bases = [
        _run_with({"a": times(sa), "b": times(sb)})
        for sa, sb in zip((0.99, 0.995, 1.0, 1.005, 1.01), (0.92, 0.96, 1.0, 1.04, 1.08))
    ]
    result = compare.compare_runs(bases, _run_with({"a": times(1.3), "b": times(1.12)}))
    assert [v.case for v in result.cases.regressions] == ["a"]
    assert result.baseline_runs == 5 and "prediction bound of 5 baseline runs" in result.rule
    assert "geometric mean of 5 runs" in "\n".join(compare.format_comparison(result))
    partial = compare.compare_runs([*bases[:2], _run_with({"a": steady})], _run_with({"a": steady, "b": steady}))
    assert [v.case for v in partial.cases.verdicts] == ["a"]
    assert "not compared, missing from some of the baseline runs: b" in compare.format_comparison(partial)
    single = compare.compare_runs([bases[2]], _run_with({"a": times(1.0), "b": times(1.12)}))
    assert [v.case for v in single.cases.regressions] == ["b"]
    other = compare.compare_runs([*bases[:2], _run_with({"a": steady}, threads=2)], _run_with({"a": steady}))
    assert other.exit_status == 4 and other.incompatible.startswith("baseline run 3: baseline ran with another thread")
    with pytest.raises(UsageError, match="at least 3"):
        compare.compare_runs(bases[:2], _run_with({"a": steady}))


def test_memory_exponent_reads_linear_and_quadratic_growth() -> None:
    """Peaks proportional to n give exponent 1, to n^2 give 2 (from the two largest n, no mask)."""
    rows = [
        {"impl": "x", "dtype": "float32", "causal": False, "n": n, "peak_bytes": 1000 * n} for n in (128, 2048, 8192)
    ]
    rows += [{"impl": "y", "dtype": "float32", "causal": False, "n": n, "peak_bytes": 3 * n * n} for n in (512, 2048)]
    assert memory_exponent(rows, "x", "float32")["exponent"] == pytest.approx(1.0, abs=1e-12)
    assert memory_exponent(rows, "y", "float32")["exponent"] == pytest.approx(2.0, abs=1e-12)
    assert memory_exponent(rows, "z", "float32") is None


def test_session_ceiling_makes_equal_speeds_equal_ratios() -> None:
    """Two cases of equal GFLOP/s whose adjacent ceilings differed get the same ratio: speed / best ceiling seen."""
    from aiayn.benchmarks.measure import apply_session_ceiling

    def case(name: str, gflops: float, before: float, after: float) -> dict:
        ceiling = max(before, after)
        info = {
            "case": name,
            "library": "numpy",
            "dtype": "float32",
            "device": "cpu",
            "gflops_full": gflops,
            "gflops_useful": gflops / 2,
            "ceiling_before_gflops": before,
            "ceiling_after_gflops": after,
            "ceiling_gflops": ceiling,
            "ratio_full": gflops / ceiling,
            "ratio_useful": gflops / 2 / ceiling,
        }
        return {"extra_info": info}

    runs = [case("a", 48.0, 72.0, 74.0), case("b", 48.0, 86.0, 80.0), {"extra_info": {"stage": "s"}}]
    best = apply_session_ceiling(runs, {("numpy", "float32", "cpu"): 84.0, ("torch", "float32", "cpu"): 90.0})
    assert best == {("numpy", "float32", "cpu"): 86.0, ("torch", "float32", "cpu"): 90.0}
    a, b = runs[0]["extra_info"], runs[1]["extra_info"]
    assert a["ratio_full"] == b["ratio_full"] == 48.0 / 86.0, (a["ratio_full"], b["ratio_full"])
    assert a["ratio_useful"] == 24.0 / 86.0
    assert (a["ratio_full_adjacent"], a["ceiling_adjacent_gflops"]) == (48.0 / 74.0, 74.0)
    assert (b["ratio_full_adjacent"], b["ceiling_adjacent_gflops"]) == (48.0 / 86.0, 86.0)
    again = apply_session_ceiling(runs, best)  # applying twice changes nothing
    assert again == best and runs[0]["extra_info"]["ratio_full_adjacent"] == 48.0 / 74.0


def test_report_of_a_stored_run_keeps_the_stem_it_was_measured_under() -> None:
    """``aiayn bench --from-run``: a run named ``<stem>-run.json`` keeps ``<stem>``; a run stored under another
    name is the built-ins' (``benchmarks``) only when it timed more than ``test_attention``, else it is named after
    its implementations, so that the report of one's own code never overwrites the built-ins' report."""
    import argparse

    from aiayn.cli import _bench_stem

    def args(path: str, specs: tuple[str, ...] = (), cuda: bool = False) -> argparse.Namespace:
        return argparse.Namespace(from_run=Path(path), specs=list(specs), cuda=cuda)

    def run(*tests: str) -> dict:
        return {
            "benchmarks": [{"name": f"{t}[x]"} for t in tests],
            "aiayn": {"implementations": {"mypkg.attn:Impl": {}, "numpy": {}}},
        }

    spec_run, builtin_run = run("test_attention"), run("test_attention", "test_numpy_stage")
    assert _bench_stem(args("out/tmp/bench-mine-run.json"), spec_run) == "bench-mine"
    assert _bench_stem(args("out/tmp/benchmarks-cuda-run.json"), builtin_run) == "benchmarks-cuda"
    assert _bench_stem(args("baseline.json"), builtin_run) == "benchmarks"
    assert _bench_stem(args("baseline.json"), spec_run) == "bench-mypkg.attn-Impl_numpy"
    assert _bench_stem(args("baseline.json", specs=("torch",)), spec_run) == "bench-torch"  # SPEC given: its name
    assert _bench_stem(args("baseline.json"), {"benchmarks": [], "aiayn": {}}) == "benchmarks"


def test_plot_draws_each_pass_it_has(tmp_path: Path) -> None:
    """The figure has a throughput row and a memory row per drawn pass (forward, forward+backward) of the stored
    run, and a run of the backward alone still gets its own rows rather than an empty figure."""
    from matplotlib.image import imread

    from aiayn.benchmarks.report import _plot, build_report, numpy_bounds, stage_rows

    run = compare.load_run(BASELINE)
    _, rows = build_report(run)
    assert {r["pass_"] for r in rows} == set(C.PASSES), "the stored baseline should hold every pass"
    bounds = numpy_bounds(rows, stage_rows(run))
    assert any(b["fractions_of_floor"] for b in bounds), "the stored baseline should hold the NumPy stages"
    heights = {}
    for name, passes in (("all", set(C.PASSES)), ("forward", {"forward"}), ("backward", {"backward"})):
        path = _plot([r for r in rows if r["pass_"] in passes], run, tmp_path / f"{name}.png", [])
        heights[name] = imread(path).shape[0]
    heights["all, floors"] = imread(_plot(rows, run, tmp_path / "floors.png", bounds)).shape[0]
    # 4.5 inches per row plus 0.5 for the legend, saved at 100 dpi (kit.save_png, no tight bounding box): two drawn
    # passes (forward, forward+backward) make 4 rows, 1850 px; one pass 2 rows, 950 px, the backward alone too; the
    # fractions of the floors one more row.
    assert heights == {"all": 1850, "forward": 950, "backward": 950, "all, floors": 2300}, heights


class _EmptyProfile:
    """A profile that comes back holding no event, as a loaded machine's profiler now and then does."""

    class profiler:  # noqa: N801 - the attribute path of torch.profiler.profile's result
        class kineto_results:  # noqa: N801
            @staticmethod
            def events() -> list:
                return []

    def __enter__(self) -> _EmptyProfile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_torch_peak_memory_profiles_again_when_a_profile_holds_no_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile with no allocation event missed them: the call is profiled again; all empty -> unmeasured, why."""
    profiler = pytest.importorskip("torch.profiler")
    import torch

    from aiayn.benchmarks import measure as M

    real, opened = profiler.profile, []

    def first_empty(*args: object, **kwargs: object) -> object:
        opened.append(1)
        return _EmptyProfile() if len(opened) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(profiler, "profile", first_empty)
    peak, method = M.peak_memory(lambda: torch.ones(1000, 1000), "torch")
    assert len(opened) == 2 and isinstance(peak, int) and peak >= 4_000_000, (peak, method, len(opened))
    monkeypatch.setattr(profiler, "profile", lambda *a, **k: _EmptyProfile())
    peak, method = M.peak_memory(lambda: torch.ones(10), "torch")
    assert peak is None and "no allocation event in 3 profiles" in method, (peak, method)


def test_the_floors_are_sums_of_the_stages_and_each_case_a_fraction_of_its_own() -> None:
    """Hand-made stage times (ms): forward floor QK + PV + exp, backward floor 2 QK + PV + 2 P^T + exp; a case's
    fraction is its floor over its best time; the targets read the numpy backward's."""
    from aiayn.benchmarks.report import evaluate_targets, numpy_bounds

    ms = {"qk_gemm": 10.0, "pv_gemm": 12.0, "pvt_gemm": 15.0, "exp": 20.0, "max": 3.0, "subtract": 4.0, "sum": 2.0}
    stages = [
        {"dtype": "float32", "n": 2048, "layout": "tile", "name": k, "time_min_s": v / 1e3, "ceiling_gflops": 100.0}
        for k, v in ms.items()
    ]

    def case(impl: str, pass_: str, seconds: float) -> dict:
        return {"impl": impl, "dtype": "float32", "n": 2048, "causal": False, "pass_": pass_, "time_min_s": seconds}

    rows = [
        {**case("numpy", "forward", 0.05), "ratio_full": 0.4, "ceiling_gflops": 100.0},
        case("numpy", "backward", 0.2),
        case("numpy-blocked", "forward+backward", 0.3),
    ]
    (bound,) = numpy_bounds(rows, stages)
    assert math.isclose(bound["floor_s"], 0.042) and math.isclose(bound["backward_floor_s"], 0.082)
    fractions = bound["fractions_of_floor"]
    assert math.isclose(fractions["numpy forward"], 0.042 / 0.05)
    assert math.isclose(fractions["numpy backward"], 0.082 / 0.2)
    assert math.isclose(fractions["numpy-blocked forward+backward"], (0.042 + 0.082) / 0.3)
    assert set(fractions) == {"numpy forward", "numpy backward", "numpy-blocked forward+backward"}
    target = evaluate_targets(rows, [bound])["numpy_backward_fraction_of_floor"]
    assert math.isclose(target["value"], 0.41) and target["met"] is False and target["target"] == 0.7
    # no backward-alone case (make bench): the backward's time is forward+backward's less forward's
    rows = [rows[0], case("numpy", "forward+backward", 0.15)]
    (bound,) = numpy_bounds(rows, stages)
    expected = {
        "numpy forward": 0.042 / 0.05,
        "numpy forward+backward": (0.042 + 0.082) / 0.15,
        "numpy backward": 0.082 / (0.15 - 0.05),
    }
    got = bound["fractions_of_floor"]
    assert got.keys() == expected.keys() and all(math.isclose(got[k], v) for k, v in expected.items()), got
    target = evaluate_targets(rows, [bound])["numpy_backward_fraction_of_floor"]
    assert math.isclose(target["value"], 0.82) and target["met"] is True
    # noise put forward+backward at or below the forward: no backward time, and the target is not measured (not met)
    rows = [rows[0], case("numpy", "forward+backward", 0.05)]
    (bound,) = numpy_bounds(rows, stages)
    assert "numpy backward" not in bound["fractions_of_floor"], bound["fractions_of_floor"]
    target = evaluate_targets(rows, [bound])["numpy_backward_fraction_of_floor"]
    assert target["value"] is None and target["met"] is None, target
