"""Small NumPy implementations of Table 1's four layer types, and a one-thread timing sweep.

Paper: Table 1 and §4. Each function computes one layer's sequence-mixing step on x (n, d), with
the counting conventions of ``aiayn.reference.counts.layer_operations`` (so measured time can be set
against counted multiply-adds):

- self-attention: softmax(x xᵀ / √d) x (queries = keys = values = x: the Q/K/V/O projections,
  4·n·d² multiply-adds, are excluded as in Table 1's O(n²·d)); 2·n²·d multiply-adds;
- recurrent: an Elman cell h_t = tanh(x_t W_x + h_(t-1) W_h), one step after another; 2·n·d²;
- convolutional: kernel width k, d input and d output channels, zero padding; k·n·d²;
- restricted self-attention: each query attends to the r positions of a window around it; 2·r·n·d.

``python -m aiayn.reproductions._layers`` runs the sweep and prints JSON; the parent
(``aiayn.reproductions.table1``) starts it in a fresh interpreter with OMP_NUM_THREADS=1 (and its
OpenBLAS/MKL equivalents) set *before* NumPy loads, because BLAS reads them only at import.
Timings are not deterministic: they go to table1-measured.*, which the drift test skips.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SWEEP_N: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096)
D, K, R = 512, 3, 32
SEED = 0
MIN_SECONDS, MAX_REPEATS = 0.2, 7  # repeat a call until this much time is spent (at least 3 calls)


def self_attention(x: np.ndarray) -> np.ndarray:
    """softmax(x xᵀ / √d) x, Eq. (1) with Q = K = V = x.  x: (n, d) -> (n, d)."""
    scores = x @ x.T / np.sqrt(x.shape[1])  # (n, n): n²·d multiply-adds
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ x  # (n, d): n²·d multiply-adds


def recurrent(x: np.ndarray, w_x: np.ndarray, w_h: np.ndarray) -> np.ndarray:
    """Elman cell, h_t = tanh(x_t W_x + h_(t-1) W_h): n sequential steps.  x: (n, d) -> (n, d)."""
    inputs = x @ w_x  # (n, d): n·d² multiply-adds, all positions at once
    h = np.zeros(x.shape[1])
    out = np.empty_like(x)
    for t in range(x.shape[0]):  # the O(n) sequential operations
        h = np.tanh(inputs[t] + h @ w_h)  # (d,): d² multiply-adds
        out[t] = h
    return out


def convolutional(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Width-k convolution with zero padding, d -> d channels.  x: (n, d), w: (k, d, d) -> (n, d)."""
    k, n = w.shape[0], x.shape[0]
    padded = np.pad(x, ((k // 2, k - 1 - k // 2), (0, 0)))  # (n + k - 1, d)
    out = padded[0:n] @ w[0]
    for j in range(1, k):  # k·n·d² multiply-adds in all
        out += padded[j : j + n] @ w[j]
    return out


def restricted_self_attention(x: np.ndarray, r: int) -> np.ndarray:
    """Each position attends to the r positions of a window around it (§4).  x: (n, d) -> (n, d)."""
    n, d = x.shape
    before = r // 2
    padded = np.pad(x, ((before, r - 1 - before), (0, 0)))  # (n + r - 1, d)
    windows = np.lib.stride_tricks.sliding_window_view(padded, r, axis=0)  # (n, d, r), a view
    scores = np.einsum("nd,ndr->nr", x, windows) / np.sqrt(d)  # r·n·d multiply-adds
    position = np.arange(n)[:, None] - before + np.arange(r)[None, :]  # (n, r) key index
    scores[(position < 0) | (position >= n)] = -np.inf  # padding is not a key
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return np.einsum("nr,ndr->nd", weights, windows)  # r·n·d multiply-adds


def layer_calls(n: int, d: int = D, k: int = K, r: int = R, seed: int = SEED) -> dict[str, Callable[[], np.ndarray]]:
    """One ready-to-time call per layer type on the same random input (fixed seed)."""
    rng = np.random.default_rng([seed, n, d])
    x = rng.standard_normal((n, d))
    w_x, w_h = rng.standard_normal((2, d, d)) / np.sqrt(d)
    w_conv = rng.standard_normal((k, d, d)) / np.sqrt(k * d)
    return {
        "self_attention": lambda: self_attention(x),
        "recurrent": lambda: recurrent(x, w_x, w_h),
        "convolutional": lambda: convolutional(x, w_conv),
        "restricted_self_attention": lambda: restricted_self_attention(x, min(r, n)),
    }


def time_call(call: Callable[[], object]) -> float:
    """Fastest of several calls (seconds): one warm-up, then at least 3 and until MIN_SECONDS spent."""
    call()
    times: list[float] = []
    while len(times) < 3 or (sum(times) < MIN_SECONDS and len(times) < MAX_REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def _threads() -> dict[str, object]:
    info: dict[str, object] = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    try:
        from threadpoolctl import threadpool_info

        info["threadpoolctl"] = [
            {"api": p.get("internal_api"), "threads": p.get("num_threads")} for p in threadpool_info()
        ]
    except ImportError:
        info["threadpoolctl"] = "not installed"
    return info


def sweep(ns: tuple[int, ...] = SWEEP_N) -> dict[str, object]:
    """Time every layer type at every n (d, k, r fixed); progress on stderr, results returned."""
    results: dict[str, dict[str, float]] = {}
    for n in ns:
        for name, call in layer_calls(n).items():
            results.setdefault(name, {})[str(n)] = time_call(call)
        print(f"  table1: measured n = {n}", file=sys.stderr, flush=True)
    return {"d": D, "k": K, "r": R, "seed": SEED, "n": list(ns), "seconds": results, "threads": _threads()}


if __name__ == "__main__":
    missing = [v for v in THREAD_VARIABLES if os.environ.get(v) != "1"]
    if missing:
        sys.exit(f"aiayn.reproductions._layers: set {', '.join(missing)}=1 before starting (BLAS reads them at import)")
    json.dump(sweep(), sys.stdout)
