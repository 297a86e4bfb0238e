"""Central finite differences of the oracle's own forward, in mpmath: the independent check of the oracle's backward
(``tests/test_*_backward.py``). They test the oracle only, never an implementation.

A VJP is checked along a direction: with f(t) = <dY, F(X + t E)> (every input moved along its own random direction
E at once), f'(0) = <grad, E>. At ``DPS`` = 60 digits with step ``STEP`` = 1e-25, the central difference's truncation
error h^2/6 |f'''| is below 1e-40 for the suite's sizes and magnitudes (|f'''| far below 1e5), and its rounding error
10^-60 |f| / h below 1e-33: the quotient is f'(0) to within ``ERROR`` = 1e-30. Each float64 gradient element is
correctly rounded (half an ulp), and the dot product with E is formed exactly, so
|<grad, E> - quotient| <= sum_i ulp(grad_i) |E_i| / 2 + ERROR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._exact import to_mp

DPS, STEP, ERROR = 60, mpmath.mpf("1e-25"), 1e-30


def ulp(x: Any) -> np.ndarray:
    return np.spacing(np.abs(np.asarray(x, dtype=np.float64)))


def assert_directional_derivative(
    f: Callable[[Any], Any], grads: Sequence[np.ndarray], directions: Sequence[np.ndarray]
) -> None:
    """<grads, directions> against (f(h) - f(-h)) / 2h, ``f`` an mpmath function of t (evaluated at ``DPS``)."""
    with mpmath.workdps(DPS):
        quotient = (f(STEP) - f(-STEP)) / (2 * STEP)
        dot = mpmath.fsum(
            [
                mpmath.mpf(float(g)) * mpmath.mpf(float(e))
                for grad, direction in zip(grads, directions)
                for g, e in zip(np.ravel(grad), np.ravel(direction))
            ]
        )
    bound = sum(float(np.sum(ulp(g) * np.abs(e))) for g, e in zip(grads, directions)) / 2 + ERROR
    assert abs(float(dot - quotient)) <= bound, f"<grad, E> = {float(dot)!r}, difference quotient {float(quotient)!r}"


def moved(inputs: Sequence[np.ndarray], directions: Sequence[np.ndarray], t: Any) -> list[np.ndarray]:
    """The inputs moved by t along their directions, as object arrays of mpf."""
    return [to_mp(np.asarray(a)) + to_mp(np.asarray(e)) * t for a, e in zip(inputs, directions)]


def paired(out: np.ndarray, cotangent: np.ndarray) -> Any:
    """<cotangent, out> summed exactly (mpmath.fsum)."""
    return mpmath.fsum((np.asarray(out, dtype=object) * to_mp(cotangent)).reshape(-1).tolist())
