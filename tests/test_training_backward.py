"""The oracle's backward of the smoothed cross-entropy (§5.4, ``reference/training.py``): the exact tier against
central finite differences of the oracle's own forward in mpmath (the bound of ``tests/_finite_differences.py``), the
fast tier against the exact one, and what padding rows and the variants receive.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from _finite_differences import DPS, assert_directional_derivative, moved, paired, ulp

from aiayn.reference import training as T

RNG = np.random.default_rng(20171206)
VARIANTS = [("K", None), ("K-1", None), ("K-1", 0), ("K", 0)]


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
    with mpmath.workdps(DPS):
        on, off = T._smoothing_values(k, mpmath.mpf(0.1), variant, padding_id is not None, mpmath.mpf(1))
        q = T._fill(t, k, on, off, padding_id, object, mpmath.mpf(0))
    assert_directional_derivative(lambda s: paired(T._cross_entropy_mp(moved([z], [e], s)[0], q), dl), [dz], [e])


@pytest.mark.parametrize(("variant", "padding_id"), VARIANTS)
def test_the_fast_backward_is_within_its_bound_of_the_exact_one(variant: str, padding_id) -> None:
    z, t, dl = _case()
    fast = T.smoothed_cross_entropy_vjp(z, t, 0.1, dl, variant=variant, padding_id=padding_id)
    exact = T.smoothed_cross_entropy_vjp_exact(z, t, 0.1, dl, variant=variant, padding_id=padding_id)
    # each element is |dL| ((sum q) p_j - q_j): a softmax (relative error a few u of longdouble, 2^-64) and one
    # subtraction; 2^-56 |dL| (p_j + q_j) <= 2^-56 |dL| 2 covers it, plus one ulp for the two float64 roundings
    bound = ulp(exact) + 2.0**-55 * np.abs(dl)[..., None]
    assert np.all(np.abs(fast - exact) <= bound)


def test_padding_rows_get_nothing_and_each_row_sums_to_zero() -> None:
    """sum_j dz_j = dL ((sum q)(sum p) - sum q) = 0: a shift of the logits changes no loss."""
    z, t, dl = _case()
    dz = T.smoothed_cross_entropy_vjp_exact(z, t, 0.1, dl, variant="K-1", padding_id=0)
    assert np.all(dz[0, 1] == 0.0), "a padding row (q = 0) gets exactly 0"
    assert np.all(np.abs(dz.sum(-1)) <= ulp(dz).sum(-1))
    with pytest.raises(ValueError, match="d_loss: expected the losses' shape"):
        T.smoothed_cross_entropy_vjp(z, t, 0.1, dl[:, :2])
