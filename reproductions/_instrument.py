"""Table 1's three columns measured on real PyTorch layers: operations, sequential depth, path length.

Paper: Table 1 and §4. The four layer types (and §4's contiguous, dilated and separable
convolutions) are built from real layers, each computing one layer's sequence-mixing step on a
sequence x of n positions of width d:

- self-attention: Eq. (1) with Q = K = V = x through the ``torch-sdpa`` built-in
  (``TorchSDPAImplementation.scaled_dot_product_attention``, the equation the conformance suite
  checks and the training model uses); the Q/K/V/O projections are left out, as Table 1's O(n²·d);
- recurrent: ``nn.RNNCell`` (h_t = tanh(W_ih x_t + b_ih + W_hh h_(t−1) + b_hh)) applied n times;
- convolutional: ``nn.Conv1d`` with d in and d out channels and kernel width k, causal (each output
  sees the k positions ending at it); dilated for Table 1's O(log_k(n)) row (dilation k^l in
  layer l), undilated (contiguous) for §4's O(n/k);
- separable (§4): a depthwise ``nn.Conv1d`` (groups = d) then a pointwise one (width 1);
- restricted self-attention (§4): each position attends to the r positions of a window centred on
  it, one call of the same built-in's Eq. (1) with the n windows as a batch (keys outside the
  sequence masked).

Measured, not evaluated from a formula:

- :func:`flops`: ``torch.utils.flop_counter.FlopCounterMode`` over one call on ``meta`` tensors (no
  arithmetic is done; on ``meta`` SDPA decomposes into its two batched products, which the
  counter sees; on the CPU its fused kernel is not counted). Two operations per multiply-add.
- :func:`sequential_depth`: the longest chain of dependent operations in the computation as it
  runs, recorded by a ``TorchDispatchMode`` that gives every produced tensor the depth
  1 + the largest depth of its inputs (views and other aliasing operations add nothing).
- :func:`path_length`: the fewest sequential units a signal crosses from the first position to the
  last, read off the Jacobian's sparsity: layers are stacked until ∂y_(n−1)/∂x_0 is non-zero; for
  the recurrent layer the unit is one application of the cell, and the recurrence is cut
  (the state detached, as in truncated back-propagation) T cells before the end until the
  gradient reaches x_0. Evaluated in float64 with weights that keep every derivative well away
  from zero (tanh near its linear range), so a zero gradient means no dependence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from aiayn.implementations.torch_impl import TorchSDPAImplementation

LAYER_TYPES = (
    "self_attention",
    "recurrent",
    "convolutional",
    "restricted_self_attention",
    "convolutional_contiguous",
    "separable_convolutional",
)
SEED = 0
#: What each layer type is, in one line (for the report).
DESCRIPTIONS = {
    "self_attention": "Eq. (1), Q = K = V = x, torch-sdpa built-in",
    "recurrent": "nn.RNNCell (tanh), n steps",
    "convolutional": "nn.Conv1d, causal, dilation k^l",
    "restricted_self_attention": "Eq. (1) over centred windows of r, torch-sdpa built-in",
    "convolutional_contiguous": "nn.Conv1d, causal, undilated",
    "separable_convolutional": "nn.Conv1d depthwise (groups = d) + pointwise",
}
_IMPL: list[TorchSDPAImplementation] = []


def _impl() -> TorchSDPAImplementation:
    if not _IMPL:
        _IMPL.append(TorchSDPAImplementation(device="cpu"))
    return _IMPL[0]


# ---------------------------------------------------------------------------------------------
# The layers: x (n, d) -> (n, d)
# ---------------------------------------------------------------------------------------------


def self_attention(x: torch.Tensor) -> torch.Tensor:
    """softmax(x xᵀ / √d) x through the torch-sdpa built-in. x (n, d) -> (n, d)."""
    return _impl().scaled_dot_product_attention(x[None], x[None], x[None])[0]


def restricted_self_attention(x: torch.Tensor, r: int) -> torch.Tensor:
    """Each position attends to the r positions centred on it (§4), as one batched Eq. (1). x (n, d) -> (n, d)."""
    n, d = x.shape
    before = (r - 1) // 2
    padded = F.pad(x, (0, 0, before, r - 1 - before))  # (n + r - 1, d)
    windows = padded.unfold(0, r, 1).transpose(
        1, 2
    )  # (n, r, d): window of position i = positions i-before .. i-before+r-1
    key = torch.arange(n, device=x.device)[:, None] - before + torch.arange(r, device=x.device)[None, :]  # (n, r)
    mask = ((key >= 0) & (key < n))[:, None, :]  # (n, 1, r): padding is not a key
    return _impl().scaled_dot_product_attention(x[:, None, :], windows, windows, mask)[:, 0, :]


class Recurrent(nn.Module):
    """An Elman layer: ``nn.RNNCell`` applied position by position; ``cut`` detaches the state that many cells before
    the end."""

    def __init__(self, d: int, **factory: Any) -> None:
        super().__init__()
        self.cell = nn.RNNCell(d, d, nonlinearity="tanh", **factory)

    def forward(self, x: torch.Tensor, cut: int | None = None) -> torch.Tensor:
        n = x.shape[0]
        h = torch.zeros(1, self.cell.hidden_size, dtype=x.dtype, device=x.device)
        out = []
        for t in range(n):
            if cut is not None and t == n - cut:
                h = h.detach()  # truncated back-propagation: only the last `cut` cells carry a gradient
            h = self.cell(x[t : t + 1], h)  # (1, d)
            out.append(h)
        return torch.cat(out, 0)


class CausalConv(nn.Module):
    """``nn.Conv1d`` (d -> d, width k, dilation δ) on the k positions ending at each output (left padding)."""

    def __init__(self, d: int, k: int, dilation: int = 1, groups: int = 1, **factory: Any) -> None:
        super().__init__()
        self.pad = (k - 1) * dilation
        self.conv = nn.Conv1d(d, d, k, dilation=dilation, groups=groups, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n, d) -> (n, d)
        return self.conv(F.pad(x.T[None], (self.pad, 0)))[0].T


class Separable(nn.Module):
    """§4's separable convolution: depthwise (groups = d, width k), then pointwise (width 1)."""

    def __init__(self, d: int, k: int, dilation: int = 1, **factory: Any) -> None:
        super().__init__()
        self.depthwise = CausalConv(d, k, dilation, groups=d, **factory)
        self.pointwise = CausalConv(d, 1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


def layer(
    layer_type: str,
    d: int,
    k: int = 3,
    r: int = 8,
    index: int = 0,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Layer number ``index`` of a stack of ``layer_type`` (dilated convolutions: dilation k^index)."""
    factory = {"device": device, "dtype": dtype}
    if layer_type == "self_attention":
        return self_attention
    if layer_type == "restricted_self_attention":
        return lambda x: restricted_self_attention(x, r)
    if layer_type == "recurrent":
        return Recurrent(d, **factory)
    if layer_type == "convolutional":
        return CausalConv(d, k, dilation=k**index, **factory)
    if layer_type == "convolutional_contiguous":
        return CausalConv(d, k, **factory)
    if layer_type == "separable_convolutional":
        return Separable(d, k, dilation=k**index, **factory)
    raise ValueError(f"layer_type: expected one of {LAYER_TYPES}, got {layer_type!r}")


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def flops(layer_type: str, n: int, d: int, k: int = 3, r: int = 8) -> int:
    """Operations of one layer on n positions of width d, counted by FlopCounterMode on meta tensors."""
    torch.manual_seed(SEED)
    f = layer(layer_type, d, k, r, device="meta")
    x = torch.empty(n, d, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        f(x)
    return int(counter.get_total_flops())


class _Depth(TorchDispatchMode):
    """Record, for every tensor produced, the length of the longest chain of operations leading to it."""

    def __init__(self) -> None:
        super().__init__()
        self.depth: dict[int, int] = {}
        self.alive: list[torch.Tensor] = []  # keeps ids unique while recording
        self.deepest = 0
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (the dispatch protocol)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        aliasing = any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns)
        depth = max((self.depth.get(id(t), 0) for t in inputs), default=0) + (0 if aliasing else 1)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.depth[id(t)] = depth
                self.alive.append(t)
        self.deepest = max(self.deepest, depth)
        self.operations += 0 if aliasing else 1
        return out


def sequential_depth(layer_type: str, n: int, d: int = 8, k: int = 3, r: int = 8) -> dict[str, int]:
    """The longest chain of dependent operations of one layer's call (and the number of operations in it)."""
    torch.manual_seed(SEED)
    f = layer(layer_type, d, k, r)
    x = torch.randn(n, d)
    with torch.no_grad(), _Depth() as recorder:
        f(x)
    return {"depth": recorder.deepest, "operations": recorder.operations}


def _reaches(stack: Callable[[torch.Tensor], torch.Tensor], n: int, d: int) -> bool:
    """Does output position n−1 of ``stack`` depend on input position 0 (a non-zero Jacobian block)?"""
    x = (torch.randn(n, d, dtype=torch.float64) * 0.5).requires_grad_(True)
    stack(x)[n - 1].sum().backward()
    return bool(x.grad[0].abs().max() > 0)


def _stack(layer_type: str, layers: int, d: int, k: int, r: int) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(SEED)
    fs = [layer(layer_type, d, k, r, index=i, dtype=torch.float64) for i in range(layers)]

    def run(x: torch.Tensor) -> torch.Tensor:
        for f in fs:
            x = f(x)
        return x

    return run


def _least(ok: Callable[[int], bool], limit: int) -> int:
    """The least m in 1..limit with ok(m) (ok monotone: false then true), by doubling then bisection."""
    hi = 1
    while not ok(hi):
        if hi >= limit:
            raise RuntimeError(f"no dependence within {limit} units")
        hi = min(2 * hi, limit)
    lo = hi // 2  # ok(lo) is false (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def path_length(layer_type: str, n: int, d: int = 4, k: int = 3, r: int = 8) -> int:
    """Fewest sequential units from input position 0 to output position n−1 (see the module docstring)."""
    if layer_type == "recurrent":
        torch.manual_seed(SEED)
        rnn = Recurrent(d, dtype=torch.float64)
        with torch.no_grad():  # an orthogonal recurrence and small inputs keep tanh' near 1: no vanishing to 0
            rnn.cell.weight_hh.copy_(torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0])
        return _least(lambda t: _reaches(lambda x: rnn(x, cut=t), n, d), n)
    return _least(lambda layers: _reaches(_stack(layer_type, layers, d, k, r), n, d), 4 * n)


def fit_power(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x (the growth exponent)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def fit_linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y against x (a growth linear in log_k n is a slope in log_k n)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    return slope, my - slope * mx
