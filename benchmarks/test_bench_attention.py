"""Benchmarks of Eq. (1), Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1, §3.2.3).

Each case times one pass of an implementation's ``scaled_dot_product_attention`` on its own
native arrays (the contract's boundary: no conversion is timed): the forward call, its backward
(``aiayn.benchmarks.backward``), or both; and records in
pytest-benchmark's ``extra_info``: GFLOP/s (full and useful counts, see :mod:`aiayn.benchmarks.cases`),
the fraction of the GEMM ceiling (``ratio_full``, ``ratio_useful``; every round's time, whose ratios
:mod:`aiayn.benchmarks.compare` tests against a baseline's; first against the ceiling measured right
before and right after the case's rounds, then, when the run writes its JSON, against the session
ceiling, see ``conftest.apply_session_ceiling``), and the peak memory of one call.
The stage cases time the pieces of a NumPy Eq. (1) (see :mod:`aiayn.benchmarks.stages`).

Nothing here asserts on time: only that the call computed an output of the right shape with no
NaN (every causal query sees at least itself), so a benchmark cannot silently time a failure.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from aiayn.benchmarks import measure as M
from aiayn.benchmarks.backward import NoBackward, passes_of
from aiayn.benchmarks.cases import Case, make_cotangent, make_inputs
from aiayn.benchmarks.stages import StageCase, make_stage


def _timed(call: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def _throughput(benchmark: Any, flops: int) -> dict[str, float]:
    """GFLOP/s from the best and the median round (empty when pytest-benchmark is disabled)."""
    if not benchmark.stats:
        return {}
    stats = benchmark.stats.stats
    return {
        "time_min_s": stats.min,
        "time_median_s": stats.median,
        "gflops_min_time": flops / stats.min / 1e9,
        "gflops_median_time": flops / stats.median / 1e9,
    }


def _run_rounds(
    benchmark: Any, bench: Any, fn: Any, first_s: float, ceiling_key: tuple[str, str, str], setup: Any = None
) -> float | None:
    """Time ``fn`` in rounds between two adjacent GEMM-ceiling measurements; return the better ceiling.

    The GEMM calls right before and right after the rounds see the load the rounds saw, so the
    ratio of the two is steadier on a shared machine than one ceiling measured at the run's start.
    ``setup`` (untimed) runs before each round and returns the one argument ``fn`` takes. Every
    round's time is kept (``round_times_s``): the sample the regression verdict tests
    (``aiayn.benchmarks.verdict``). Returns None when pytest-benchmark is disabled (nothing is timed then).
    """
    before = bench.adjacent_ceiling(*ceiling_key) if benchmark.enabled else None
    rounds = bench.rounds(first_s)
    if setup is None:
        benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)
    else:
        benchmark.pedantic(fn, setup=lambda: ((setup(),), {}), rounds=rounds, iterations=1, warmup_rounds=0)
    if before is None:
        return None
    after = bench.adjacent_ceiling(*ceiling_key)
    benchmark.extra_info.update(
        ceiling_before_gflops=before, ceiling_after_gflops=after, round_times_s=list(benchmark.stats.stats.data)
    )
    return max(before, after)


def test_attention(benchmark: Any, bench: Any, case: Case) -> None:
    """One pass of Eq. (1) per round; throughput, ceiling ratios, round times and peak memory in ``extra_info``."""
    impl = bench.implementation(case.impl)
    if case.dtype not in impl.dtypes:
        pytest.skip(f"{case.impl} declares dtypes {impl.dtypes}, not {case.dtype}")
    q, k, v, mask = make_inputs(impl, case)
    library, device = M.library_of(q), M.device_of(q)
    bench.apply_threads()

    def forward() -> Any:
        return M.sync(impl.scaled_dot_product_attention(q, k, v, mask))

    out, first_s = _timed(forward)  # also the warm-up
    got = impl.to_numpy(out)
    expected_shape = (case.batch, case.heads, case.n, case.head_dim)
    assert got.shape == expected_shape, f"{case.id}: output shape {got.shape}, expected {expected_shape}"
    assert not np.isnan(got).any(), (
        f"{case.id}: {int(np.isnan(got).sum())} NaN entries in the output (no row is fully masked)"
    )
    del out, got
    call, setup, source = forward, None, None
    if case.pass_ != "forward":
        try:
            passes = passes_of(impl, q, k, v, mask, make_cotangent(impl, case))
        except NoBackward as exc:
            # a benchmark measures speed, never correctness: an implementation without gradients has no backward
            # to time (the conformance suite reports its gradients "not provided"); the skip names why
            pytest.skip(f"{case.id}: no backward to time: {exc}")
        source = passes.source
        if case.pass_ == "backward":
            setup = passes.setup
            call = passes.backward
            _, first_s = _timed(lambda: passes.backward(passes.setup()))  # the warm-up (timing includes the setup)
        else:
            call = passes.forward_backward
            _, first_s = _timed(call)
    if setup is None:
        peak, peak_method = M.peak_memory(call, library, device)
    else:  # the backward's own peak, beyond the inputs and the forward's saved state it starts from
        state = setup()
        peak, peak_method = M.peak_memory(lambda: call(state), library, device)
        del state

    benchmark.group = case.group
    info = benchmark.extra_info
    info.update(
        case=case.id,
        impl=case.impl,
        impl_version=impl.version,
        library=library,
        device=device,
        dtype=case.dtype,
        n=case.n,
        causal=case.causal,
        pass_=case.pass_,
        gradient_source=source,
        batch=case.batch,
        heads=case.heads,
        head_dim=case.head_dim,
        threads=bench.threads,
        flops_full=case.flops_full,
        flops_useful=case.flops_useful,
        score_bytes=case.score_bytes,
        peak_bytes=peak,
        peak_method=peak_method,
        first_call_s=first_s,
    )
    ceiling = _run_rounds(benchmark, bench, call, first_s, (library, case.dtype, device), setup)
    measured = _throughput(benchmark, case.flops_full)
    if measured and ceiling:
        full = measured["gflops_min_time"]
        useful = full * case.flops_useful / case.flops_full
        info.update(
            time_min_s=measured["time_min_s"],
            time_median_s=measured["time_median_s"],
            gflops_full=full,
            gflops_useful=useful,
            gflops_full_median=measured["gflops_median_time"],
            ceiling_gflops=ceiling,
            ratio_full=full / ceiling,
            ratio_useful=useful / ceiling,
        )


def test_numpy_stage(benchmark: Any, bench: Any, stage: StageCase) -> None:
    """One attention call's worth of one NumPy stage (GEMM, exp, max, subtract, sum)."""
    kernel = make_stage(stage)
    bench.apply_threads()
    _, first_s = _timed(kernel)
    benchmark.group = stage.group
    info = benchmark.extra_info
    info.update(
        stage=stage.id,
        layout=stage.layout,
        name=stage.name,
        library="numpy",
        device="cpu",
        dtype=stage.dtype,
        n=stage.n,
        elements=stage.elements,
        flops=stage.flops,
        bytes_moved=stage.bytes_moved,
        threads=bench.threads,
    )
    ceiling = _run_rounds(benchmark, bench, kernel, first_s, ("numpy", stage.dtype, "cpu"))
    if benchmark.stats and ceiling:
        best = benchmark.stats.stats.min
        info.update(
            time_min_s=best,
            ceiling_gflops=ceiling,
            gelem_per_s=stage.elements / best / 1e9,
            gbytes_per_s=stage.bytes_moved / best / 1e9,
        )
        if stage.flops:
            info.update(gflops=stage.flops / best / 1e9, ratio=stage.flops / best / 1e9 / ceiling)
