"""The oracle's backward of the smoothed cross-entropy (§5.4, ``reference/training.py``): the exact tier against
central finite differences of the oracle's own forward in mpmath (60 digits, step 1e-25: the quotient is the
derivative to within 1e-30, as in ``tests/test_layers_backward.py``), the fast tier against the exact one, and what
padding rows and the variants receive.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from aiayn.reference import training as T
from aiayn.reference._exact import to_mp

RNG = np.random.default_rng(20171206)
FD_DPS, FD_STEP, FD_ERROR = 60, mpmath.mpf("1e-25"), 1e-30
VARIANTS = [("K", None), ("K-1", None), ("K-1", 0), ("K", 0)]


def _ulp(x: np.ndarray) -> np.ndarray:
    return np.spacing(np.abs(np.asarray(x, dtype=np.float64)))


def _case(k: int = 7):
    logits = RNG.normal(size=(2, 3, k)) * 4 + 1.0
    targets = RNG.integers(1, k, size=(2, 3))
    targets[0, 1] = 0  # a padding row where padding_id = 0
    return logits, targets, RNG.normal(size=(2, 3)) + 0.2


@pytest.mark.parametrize(("variant", "padding_id"), VARIANTS)
def test_the_exact_backward_of_the_smoothed_cross_entropy_is_the_derivative(variant: str, padding_id) -> None:
    z, t, dl = _case()
    dz = T.smoothed_cross_entropy_vjp_exact(z, t, 0.1, dl, variant=variant, padding_id=padding_id)
    e = RNG.normal(size=z.shape)
    k = z.shape[-1]
    with mpmath.workdps(FD_DPS):
        on, off = T._smoothing_values(k, mpmath.mpf(0.1), variant, padding_id is not None, mpmath.mpf(1))
        q = T._fill(t, k, on, off, padding_id, object, mpmath.mpf(0))

        def f(s):
            losses = T._cross_entropy_mp(to_mp(z) + to_mp(e) * s, q)
            return mpmath.fsum((losses * to_mp(dl)).reshape(-1).tolist())

        fd = (f(FD_STEP) - f(-FD_STEP)) / (2 * FD_STEP)
        dot = mpmath.fsum([mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in zip(dz.ravel(), e.ravel())])
    bound = float(np.sum(_ulp(dz) * np.abs(e))) / 2 + FD_ERROR
    assert abs(float(dot - fd)) <= bound, (float(dot), float(fd), bound)


@pytest.mark.parametrize(("variant", "padding_id"), VARIANTS)
def test_the_fast_backward_is_within_its_bound_of_the_exact_one(variant: str, padding_id) -> None:
    z, t, dl = _case()
    fast = T.smoothed_cross_entropy_vjp(z, t, 0.1, dl, variant=variant, padding_id=padding_id)
    exact = T.smoothed_cross_entropy_vjp_exact(z, t, 0.1, dl, variant=variant, padding_id=padding_id)
    # each element is |dL| ((sum q) p_j - q_j): a softmax (relative error a few u of longdouble, 2^-64) and one
    # subtraction; 2^-56 |dL| (p_j + q_j) <= 2^-56 |dL| 2 covers it, plus one ulp for the two float64 roundings
    bound = _ulp(exact) + 2.0**-55 * np.abs(dl)[..., None]
    assert np.all(np.abs(fast - exact) <= bound)


def test_padding_rows_get_nothing_and_each_row_sums_to_zero() -> None:
    """sum_j dz_j = dL ((sum q)(sum p) - sum q) = 0: a shift of the logits changes no loss."""
    z, t, dl = _case()
    dz = T.smoothed_cross_entropy_vjp_exact(z, t, 0.1, dl, variant="K-1", padding_id=0)
    assert np.all(dz[0, 1] == 0.0), "a padding row (q = 0) gets exactly 0"
    assert np.all(np.abs(dz.sum(-1)) <= _ulp(dz).sum(-1))
    with pytest.raises(ValueError, match="d_loss: expected the losses' shape"):
        T.smoothed_cross_entropy_vjp(z, t, 0.1, dl[:, :2])
