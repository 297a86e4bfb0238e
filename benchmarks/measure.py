"""How things are measured: threads, the GEMM ceiling, peak memory per call, the run's environment.

The GEMM ceiling is the best throughput of a large square matrix product ``C = A B``
(``2 m^3`` flops) through the same library and dtype the implementation computes with
(NumPy's BLAS for NumPy arrays, ``torch.matmul`` for tensors), measured in the same process and
thread setting as the attention cases. An attention result divided by it is a fraction: how much
of what this machine's matrix engine can do the implementation turns into Eq. (1). It is compared
between runs of one host only: between hosts (even VMs of one kind) the GEMM ceiling and the
memory-bound parts of a case scale differently, and the fraction moves by tens of percent.

Peak memory per call is the most memory the call held at once beyond what existed before it
(its inputs): NumPy and other host libraries through :mod:`tracemalloc` (NumPy reports every
array buffer to it); PyTorch on the CPU through the profiler's allocator events
(``profile_memory=True``: every allocation and free of the CPU allocator, summed in time order);
PyTorch on CUDA through ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "BLAS_ENV_VARS",
    "ONE_THREAD_ENV",
    "available_memory",
    "blas_env",
    "device_of",
    "best_time",
    "apply_session_ceiling",
    "gemm_ceiling",
    "library_of",
    "limit_threads",
    "peak_memory",
    "sync",
    "threadpool_report",
]

#: Environment variables that change what the BLAS does; recorded with every run. On these VMs
#: ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` may be set and slow a current NumPy's OpenBLAS, so
#: ``make bench`` unsets them for the benchmark command alone.
BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: The environment of a measuring process: every thread pool on one thread (two threads on small shared VMs swing
#: by 2-4x).
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_LIMITS: list[Any] = []  # the live threadpoolctl limiter (kept so the limits stay in force)


def limit_threads(threads: int) -> bool:
    """Run every BLAS/OpenMP pool (NumPy's OpenBLAS, PyTorch's) on ``threads`` threads.

    Through threadpoolctl (which only sees libraries already loaded, so call again after importing
    one) and ``torch.set_num_threads`` when torch is loaded. Returns False when threadpoolctl is not
    installed: then only the environment (``OMP_NUM_THREADS`` ...) sets NumPy's pool.
    """
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    _LIMITS[:] = [threadpool_limits(limits=threads)]
    return True


def threadpool_report() -> list[dict[str, Any]]:
    """What threadpoolctl sees: per thread pool its library, version, kernel (``architecture``), threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"error": "threadpoolctl is not installed; BLAS kernel and pool size unknown"}]
    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "threading_layer", "num_threads")
    return [{k: info[k] for k in keys if k in info} for info in threadpool_info()]


def blas_env() -> dict[str, str | None]:
    """The values of :data:`BLAS_ENV_VARS` in this process (None = unset)."""
    return {name: os.environ.get(name) for name in BLAS_ENV_VARS}


def library_of(native: Any) -> str:
    """The array library of a native array: ``"numpy"``, ``"torch"``, or its top-level module name."""
    if isinstance(native, np.ndarray):
        return "numpy"
    return type(native).__module__.split(".")[0]


def device_of(native: Any) -> str:
    """The device type of a native array: ``"cpu"`` for NumPy arrays, ``"cuda"``/``"cpu"``/... for tensors."""
    device = getattr(native, "device", "cpu")
    return str(getattr(device, "type", device))


def sync(native: Any) -> Any:
    """Wait for ``native``'s device to finish (CUDA launches are asynchronous); return ``native``."""
    if device_of(native) == "cuda":
        sys.modules["torch"].cuda.synchronize()
    return native


def best_time(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (after one untimed warm-up call if ``warmup``)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def gemm_ceiling(
    library: str, dtype: str, n: int, repeats: int, device: str = "cpu", warmup: bool = True
) -> dict[str, Any]:
    """Best GFLOP/s of an (n x n) @ (n x n) product in ``library``/``dtype`` (2 n^3 flops).

    ``library`` is ``"numpy"`` (``np.matmul`` into a preallocated output) or ``"torch"``
    (``torch.matmul(out=...)`` on ``device``, synchronised on CUDA; any torch dtype, bfloat16
    included). The best of ``repeats`` timed calls is the ceiling (the least disturbed one on a
    shared machine); every time is kept.
    """
    rng = np.random.default_rng(1)
    a64, b64 = rng.random((n, n)), rng.random((n, n))
    if library == "numpy":
        a, b = a64.astype(dtype), b64.astype(dtype)
        c = np.empty((n, n), dtype=dtype)

        def product() -> Any:
            return np.matmul(a, b, out=c)

    elif library == "torch":
        import torch

        ta, tb = (
            torch.from_numpy(x).to(device=device, dtype=getattr(torch, dtype)) for x in (a64, b64)
        )  # bfloat16 too
        tc = torch.empty((n, n), dtype=ta.dtype, device=device)

        def product() -> Any:
            return sync(torch.matmul(ta, tb, out=tc))

    else:
        raise ValueError(f"library: expected 'numpy' or 'torch', got {library!r}")
    times = best_time(product, repeats, warmup)
    flops = 2 * n**3
    return {
        "library": library,
        "dtype": dtype,
        "device": device,
        "n": n,
        "flops": flops,
        "times_s": times,
        "gflops": flops / min(times) / 1e9,
        "gflops_median": flops / float(np.median(times)) / 1e9,
    }


def peak_memory(call: Callable[[], Any], library: str, device: str = "cpu") -> tuple[int | None, str]:
    """Peak bytes held during one ``call()`` beyond what was held before it, and how it was measured.

    The result of the call counts (it is alive at the end). Returns (None, reason) when the
    library's allocations cannot be seen.
    """
    if library == "torch" and device.startswith("cuda"):
        return _peak_cuda(call), "torch.cuda.max_memory_allocated"
    if library == "torch":
        return _peak_torch_cpu(call)
    return _peak_tracemalloc(call), "tracemalloc"


def _peak_tracemalloc(call: Callable[[], Any]) -> int:
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        if started_here:
            tracemalloc.stop()
    return peak - base


def _peak_torch_cpu(call: Callable[[], Any], tries: int = 3) -> tuple[int | None, str]:
    """Cumulative maximum of the CPU allocator's signed allocation events during the call.

    A call measured here allocates (its result is alive at the end), so a profile holding no allocation event has
    missed them (the profiler drops a session's memory events now and then on a loaded machine): the call is profiled
    again, up to ``tries`` times, and reported as unmeasured (None, why) if every profile came back empty.
    """
    from torch.profiler import ProfilerActivity, profile

    for _ in range(tries):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = call()
        del result
        try:
            events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
            events.sort(key=lambda e: e.start_ns())
            sizes = [int(e.nbytes()) for e in events]
        except AttributeError as exc:  # the profiler's result API moved: say so rather than guess
            return None, f"torch profiler memory events unavailable ({exc})"
        if any(size > 0 for size in sizes):
            held = peak = 0
            for size in sizes:
                held += size
                peak = max(peak, held)
            return peak, "torch.profiler allocator events"
    return None, f"torch profiler recorded no allocation event in {tries} profiles of the call"


def _peak_cuda(call: Callable[[], Any]) -> int:
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = sync(call())
    peak = torch.cuda.max_memory_allocated()
    del result
    return peak - base


def _ceiling_key(info: dict[str, Any]) -> tuple[str, str, str]:
    library = info.get("library", "numpy")
    return (library, info["dtype"], info.get("device", "cpu"))


def available_memory() -> tuple[int, str] | None:
    """Bytes of memory a new allocation can have now, and where the figure comes from: ``MemAvailable`` of
    /proc/meminfo (Linux: free memory plus what the kernel can reclaim), else the available physical pages of
    :func:`os.sysconf`; None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return (pages * size, "available physical pages from os.sysconf") if pages > 0 and size > 0 else None


def apply_session_ceiling(
    benchmarks: list[dict[str, Any]], best: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], float]:
    """Divide every case by its library's session ceiling: the best GEMM seen anywhere in the run.

    Each case measured a GEMM ceiling right before and right after its rounds. Those short
    measurements scatter (three calls each; on a quiet 2-core VM they ranged 72.6-87.6 GFLOP/s
    in one run), so that two identical kernels timed equally fast could read 0.555 and 0.646
    of "the" ceiling. The machine has one ceiling per library and dtype: the fastest GEMM it ran
    in this session (start, end, and every adjacent measurement). Noise only slows a GEMM down,
    so the maximum is the least disturbed estimate, as the best round is for the case itself.
    Each case keeps its adjacent figures as ``ceiling_adjacent_gflops`` / ``ratio_*_adjacent``.
    Returns the session ceilings (``best`` raised by the adjacent measurements).
    """
    best = dict(best)
    for b in benchmarks:
        info = b.get("extra_info", {})
        if "ceiling_gflops" not in info:
            continue
        key = _ceiling_key(info)
        seen = [info["ceiling_gflops"], info.get("ceiling_before_gflops", 0.0), info.get("ceiling_after_gflops", 0.0)]
        best[key] = max(best.get(key, 0.0), *seen)
    for b in benchmarks:
        info = b.get("extra_info", {})
        if "ceiling_gflops" not in info or "ceiling_adjacent_gflops" in info:
            continue
        ceiling = best[_ceiling_key(info)]
        info["ceiling_adjacent_gflops"] = info["ceiling_gflops"]
        info["ceiling_gflops"] = ceiling
        for name, gflops in (("ratio_full", "gflops_full"), ("ratio_useful", "gflops_useful"), ("ratio", "gflops")):
            if name in info and gflops in info:
                info[f"{name}_adjacent"] = info[name]
                info[name] = info[gflops] / ceiling
    return best
