"""Copies of a built-in slowed by a known amount of real work: how the regression gate is measured, not a sleep.

``aiayn.benchmarks.slowed:numpy`` (likewise ``:torch``, ``:torch_sdpa``, ``:numpy_blocked``) is the built-in of that
name doing, after each call, ``AIAYN_BENCH_EXTRA_WORK`` (a fraction, default 0) more of the same call's work: the
same Eq. (1) again on that fraction of the query rows (all the keys and values), whose cost is proportional to the
rows for every implementation here (each query row costs one row of Q K^T, of the softmax and of P V). A built-in
with its own ``vjp`` (the NumPy ones) does the same in its backward with the cotangent's rows; the torch ones get
their gradients from autograd, which the extra forward work does not reach (their backward is not slowed). With the
variable unset or 0 it is the built-in exactly (same code path, one branch more), so the unchanged runs and the
slowed ones share one case name and one spec:

    AIAYN_BENCH_EXTRA_WORK=0   aiayn bench aiayn.benchmarks.slowed:numpy --save base.json
    AIAYN_BENCH_EXTRA_WORK=0.2 aiayn bench aiayn.benchmarks.slowed:numpy --baseline base.json   # 20% more work

The extra work scales with the call, so "20% more work" is 20% of each call at every n, plus the call's fixed
overhead once more (the second call pays it too), which matters only at small n. Measured detection rates are in
``reports/benchmarks-noise.md``.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["EXTRA_WORK_VAR", "Slowed", "SlowedVjp", "extra_work", "numpy", "numpy_blocked", "torch", "torch_sdpa"]

EXTRA_WORK_VAR = "AIAYN_BENCH_EXTRA_WORK"


def extra_work() -> float:
    """The fraction of extra work in ``AIAYN_BENCH_EXTRA_WORK`` (0 when unset); else ValueError naming it."""
    text = os.environ.get(EXTRA_WORK_VAR, "0")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{EXTRA_WORK_VAR}: expected a fraction between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{EXTRA_WORK_VAR}: expected a fraction between 0 and 1, got {value}")
    return value


class Slowed:
    """``inner`` with ``fraction`` more work per Eq. (1) call and per backward; everything else is ``inner``'s."""

    def __init__(self, inner: Any, fraction: float) -> None:
        self._inner = inner
        self.fraction = fraction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _rows(self, n_q: int) -> int:
        return math.ceil(self.fraction * n_q) if self.fraction > 0 else 0

    def scaled_dot_product_attention(self, q: Any, k: Any, v: Any, mask: Any | None = None) -> Any:
        out = self._inner.scaled_dot_product_attention(q, k, v, mask)
        rows = self._rows(q.shape[-2])
        if rows:
            part = None if mask is None else mask[..., :rows, :]
            self._inner.scaled_dot_product_attention(q[..., :rows, :], k, v, part)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r}, extra work {self.fraction:g})"


class SlowedVjp(Slowed):
    """:class:`Slowed` of an implementation with its own ``vjp``: the backward does the extra work too."""

    def vjp(self, equation: str, args: list[Any], d_out: Any) -> Any:
        """The inner implementation's gradients, then its backward of the same equation on ``fraction`` of the rows."""
        own = self._inner.vjp
        grads = own(equation, args, d_out)
        rows = self._rows(args[0].shape[-2]) if equation == "scaled_dot_product_attention" else 0
        if rows:
            q, k, v, mask = args
            part = None if mask is None else mask[..., :rows, :]
            own(equation, [q[..., :rows, :], k, v, part], d_out[..., :rows, :])
        return grads


def _slowed(name: str) -> Slowed:
    from aiayn.implementations.registry import load

    inner = load(name)
    return (SlowedVjp if callable(getattr(inner, "vjp", None)) else Slowed)(inner, extra_work())


def numpy() -> Slowed:
    """The ``numpy`` built-in with ``AIAYN_BENCH_EXTRA_WORK`` more work per call."""
    return _slowed("numpy")


def numpy_blocked() -> Slowed:
    """The ``numpy-blocked`` built-in with ``AIAYN_BENCH_EXTRA_WORK`` more work per call."""
    return _slowed("numpy-blocked")


def torch() -> Slowed:
    """The ``torch`` built-in with ``AIAYN_BENCH_EXTRA_WORK`` more work per call."""
    return _slowed("torch")


def torch_sdpa() -> Slowed:
    """The ``torch-sdpa`` built-in with ``AIAYN_BENCH_EXTRA_WORK`` more work per call."""
    return _slowed("torch-sdpa")
