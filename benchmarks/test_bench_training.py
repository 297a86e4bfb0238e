"""Training-throughput benchmarks: our model's training step beside PyTorch's nn.Transformer (``training.py``).

``test_training_step`` times one training step per round (after two untimed ones) of ours and of the
peer on the same configuration and batch, one thread, and records in ``extra_info``: target tokens
per step and per second, the training-step operations of ``aiayn.reference.counts`` and the
resulting GFLOP/s, the session's torch float32 GEMM ceiling measured right before and right after
the rounds, the model FLOP utilisation (MFU), and, from one profiled step, the share of the step
spent in matrix products (what bounds the utilisation). ``test_training_memory`` records the peak
bytes one step holds at long sequence lengths (B = 1). Nothing asserts on time: only that the
step returned a finite loss, so a benchmark cannot silently time a failure.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from aiayn.benchmarks import measure as M


def _factory(bench: Any) -> Any:
    from aiayn.benchmarks.training import load_factory

    if bench.training_step is None:
        pytest.skip("our training step needs --bench-training-step MODULE:ATTR (aiayn bench passes it)")
    return load_factory(bench.training_step)


def test_training_step(benchmark: Any, bench: Any, training_case: Any) -> None:
    """One training step per round; tokens/s, GFLOP/s, MFU against the session ceiling, the GEMM share of the step."""
    from aiayn.benchmarks.training import profile_step, step_of, synthetic_batch

    c = training_case
    factory = _factory(bench) if c.model == "ours" else None
    bench.apply_threads()
    batch = synthetic_batch(c.batch, c.n, c.vocab)
    step = step_of(c.model, factory, c.config, c.vocab, batch)
    losses = [step(), step()]  # warm-up: allocator and Adam state
    assert all(math.isfinite(x) for x in losses), f"{c.id}: non-finite loss {losses}"
    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    benchmark.group = c.group
    info = benchmark.extra_info
    info.update(
        case=c.id,
        training=c.name,
        model=c.model,
        library="torch",
        device="cpu",
        dtype="float32",
        threads=bench.threads,
        batch=c.batch,
        n=c.n,
        vocab=c.vocab,
        d_model=c.config.d_model,
        n_layers=c.config.n_layers,
        target_tokens=c.target_tokens,
        flops=c.flops,
        first_call_s=first_s,
    )
    if benchmark.enabled:
        before = bench.adjacent_ceiling("torch", "float32", "cpu")
    benchmark.pedantic(step, rounds=bench.rounds(first_s), iterations=1, warmup_rounds=0)
    if benchmark.enabled and benchmark.stats:
        after = bench.adjacent_ceiling("torch", "float32", "cpu")
        best = benchmark.stats.stats.min
        ceiling = max(before, after)
        info.update(
            time_min_s=best,
            time_median_s=benchmark.stats.stats.median,
            tokens_per_s=c.target_tokens / best,
            gflops=c.flops / best / 1e9,
            ceiling_before_gflops=before,
            ceiling_after_gflops=after,
            ceiling_gflops=ceiling,
            mfu=c.flops / best / 1e9 / ceiling,
            ratio=c.flops / best / 1e9 / ceiling,
        )
        info["profile"] = profile_step(step)


def test_training_memory(benchmark: Any, bench: Any, memory_case: Any) -> None:
    """Peak bytes one training step holds beyond its inputs (B = 1, long n): ours tiled, ours untiled, the peer."""
    from aiayn.benchmarks.training import step_of, synthetic_batch

    c = memory_case
    factory = _factory(bench) if c.model.startswith("ours") else None
    bench.apply_threads()
    step = step_of(
        c.model,
        factory,
        c.config,
        c.vocab,
        synthetic_batch(1, c.n, c.vocab),
        **({"attention_tile": c.tile} if c.model == "ours" else {}),
    )
    assert math.isfinite(step()), f"{c.id}: non-finite loss"
    peak, method = M.peak_memory(step, "torch")
    benchmark.group = c.group
    benchmark.extra_info.update(
        case=c.id,
        memory_model=c.model,
        n=c.n,
        library="torch",
        device="cpu",
        dtype="float32",
        peak_bytes=peak,
        peak_method=method,
        threads=bench.threads,
    )
    benchmark.pedantic(step, rounds=1, iterations=1, warmup_rounds=0)
