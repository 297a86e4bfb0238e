"""Benchmarks: attention throughput as a fraction of the machine's own matrix-multiply ceiling.

A pytest-benchmark suite. Each case times one call of Eq. (1),
softmax(Q K^T / sqrt(d_k)) V (§3.2.1), through an implementation's own
``scaled_dot_product_attention`` (any implementation the registry can load: the built-ins
``numpy``, ``numpy-blocked``, ``torch``, ``torch-sdpa``, an entry point, or ``module:attr``), at
B = 1, h = 8, d = 64, n in {128, 512, 2048} (and 8192 on the O(n)-memory paths), float32 and
float64, with and without the causal mask (§3.2.3). In the same run it measures the GEMM
ceiling of each library and dtype, so every result is also a fraction of what this machine's
matrix engine can do: steadier than a time, compared between runs of one host only (it moves by tens
of percent between hosts, even VMs of one kind).

Modules:

- :mod:`aiayn.benchmarks.cases`: the case matrix, inputs and operation counts (4 n_q n_k d per head;
  causal also as the useful n (n + 1) / 2 pairs);
- :mod:`aiayn.benchmarks.measure`: threads (threadpoolctl, ``torch.set_num_threads``), GEMM ceilings,
  peak memory per call (tracemalloc; the torch profiler's allocator events);
- :mod:`aiayn.benchmarks.stages`: the pieces of a NumPy attention timed alone (what bounds it);
- ``conftest.py`` (the ``--bench-*`` options) and ``test_bench_attention.py`` (the benchmarks);
- :mod:`aiayn.benchmarks.report`: ``aiayn bench`` (``--from-run RUN.json`` without measuring) writes
  ``reports/benchmarks.{md,json,png}``;
- :mod:`aiayn.benchmarks.compare`: compares
  ceiling ratios (pytest-benchmark itself compares only times); the stored baseline is
  ``benchmarks/baseline/benchmarks-baseline.json``.

Run it::

    aiayn bench                                       # the full set, minutes, then the report
    aiayn bench --smoke                               # CI's subset, seconds
    aiayn bench -- --bench-threads 2 --bench-impls numpy,mypkg.attn:Mine --bench-sizes 512,4096
"""
