"""The oracle's backward of LayerNorm (§3.1) and Eq. (2) (``reference/layers.py``): the exact tier against central
finite differences of the oracle's own forward in mpmath, the fast tier against the exact one, and the exact
identities (sum_i dx_i = 0 per LayerNorm row; d_model = 1 gives dx = dgain = 0; ReLU's choice at z = 0).

Finite differences test the oracle only: the directional derivative of f(t) = <dY, F(X + t E)> (every input moved
along a random direction E at once) against <grad, E>, within the bound ``tests/_finite_differences.py`` derives.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from _finite_differences import assert_directional_derivative, moved, paired, ulp

from aiayn.reference import layers as L

RNG = np.random.default_rng(20171205)


def _check_directional(forward_mp, inputs, grads, dy) -> None:
    """<grads, E> against the difference quotient of f(t) = <dy, forward(inputs + t E)>."""
    directions = [RNG.normal(size=np.shape(a)) for a in inputs]
    assert_directional_derivative(lambda t: paired(forward_mp(*moved(inputs, directions, t)), dy), grads, directions)


@pytest.mark.parametrize("level", [0.0, 30.0], ids=["centred", "offset rows"])
def test_the_exact_backward_of_layer_norm_is_the_derivative(level: float) -> None:
    x = RNG.normal(size=(2, 3, 6)) + level  # offset rows: |mean| >> sigma, where a raw-x backward cancels
    gain, bias, dy = RNG.normal(size=6) + 1, RNG.normal(size=6), RNG.normal(size=x.shape) + 0.4
    grads = L.layer_norm_vjp_exact(x, gain, bias, dy, 1e-5)
    _check_directional(lambda a, g, b: L._layer_norm_mp(a, g, b, mpmath.mpf(1e-5)), (x, gain, bias), grads, dy)


def test_the_exact_backward_of_eq2_is_the_derivative() -> None:
    x = RNG.normal(size=(2, 3, 4)) + 0.5
    w1, b1, w2, b2 = RNG.normal(size=(4, 6)), RNG.normal(size=6), RNG.normal(size=(6, 4)), RNG.normal(size=4)
    dy = RNG.normal(size=x.shape) - 0.3
    grads = L.feed_forward_vjp_exact(x, w1, b1, w2, b2, dy)

    def forward(a, u1, c1, u2, c2):
        hidden = np.vectorize(L._relu_mp, otypes=[object])(L._affine_mp(a, u1, c1))
        return L._affine_mp(hidden, u2, c2)

    _check_directional(forward, (x, w1, b1, w2, b2), grads, dy)


@pytest.mark.parametrize("level", [0.0, 1e3])
def test_the_fast_backward_of_layer_norm_is_within_its_bound_of_the_exact_one(level: float) -> None:
    x = RNG.normal(size=(4, 8)) + level
    gain, bias, dy = RNG.normal(size=8) + 1, RNG.normal(size=8), RNG.normal(size=x.shape)
    fast = L.layer_norm_vjp(x, gain, bias, dy)
    exact = L.layer_norm_vjp_exact(x, gain, bias, dy)
    # longdouble, u = 2^-64: the corrected two-pass deviations are accurate to a few u of themselves plus
    # O(d^2 u^2) |x| (Chan, Golub & LeVeque); every later step is a short sum of terms bounded by |g| |x_hat| / sigma:
    # 2^-56 of that scale (256 u) covers d = 8 with a wide margin, plus one ulp for the two float64 roundings
    scale = np.abs(dy * gain).sum(-1, keepdims=True) * (1 + 1e-3 * level) / np.std(x, -1, keepdims=True)
    for name, f, e, m in zip(("dx", "dgain", "dbias"), fast, exact, (scale, np.abs(dy).sum(0) * 4, np.abs(dy).sum(0))):
        bound = ulp(e) + 2.0**-56 * m
        assert np.all(np.abs(f - e) <= bound), f"{name}: {np.max(np.abs(f - e) / bound)} x bound"


def test_the_fast_backward_of_eq2_is_within_its_bound_of_the_exact_one() -> None:
    x = RNG.normal(size=(3, 5))
    w1, b1, w2, b2 = RNG.normal(size=(5, 7)), RNG.normal(size=7), RNG.normal(size=(7, 5)), RNG.normal(size=5)
    dy = RNG.normal(size=x.shape)
    fast = L.feed_forward_vjp(x, w1, b1, w2, b2, dy)
    exact = L.feed_forward_vjp_exact(x, w1, b1, w2, b2, dy)
    # sums of at most 7 products in longdouble: gamma_7(2^-64) <= 2^-60 times the sum of |terms|, bounded here by
    # 2^-56 (|dy| |w2| |w1|, |x|, |h| of order 10 and below) on top of one ulp
    for name, f, e in zip(("dx", "dw1", "db1", "dw2", "db2"), fast, exact):
        bound = ulp(e) + 2.0**-56 * 100
        assert np.all(np.abs(f - e) <= bound), name


def test_layer_norm_gradients_sum_to_zero_per_row_and_vanish_for_one_feature() -> None:
    x, gain, bias, dy = RNG.normal(size=(3, 7)) + 5, RNG.normal(size=7), RNG.normal(size=7), RNG.normal(size=(3, 7))
    dx, _, _ = L.layer_norm_vjp_exact(x, gain, bias, dy)
    assert np.all(np.abs(dx.sum(-1)) <= ulp(dx).sum(-1))  # each element within half an ulp of a zero-sum row
    dx1, dgain1, dbias1 = L.layer_norm_vjp_exact(RNG.normal(size=(4, 1)), np.ones(1), np.zeros(1), np.ones((4, 1)))
    assert np.all(dx1 == 0) and np.all(dgain1 == 0) and np.all(dbias1 == 4)
    fast1 = L.layer_norm_vjp(RNG.normal(size=(4, 1)), np.ones(1), np.zeros(1), np.ones((4, 1)))
    assert np.all(fast1[0] == 0) and np.all(fast1[1] == 0)


@pytest.mark.parametrize(("relu_at_zero", "gets"), [(0.0, 0.0), (1.0, 1.0)])
def test_relus_choice_at_zero_is_the_gradient_there(relu_at_zero: float, gets: float) -> None:
    """z = x W1 + b1 = 0 exactly (x = 0, b1 = 0): the gradient through the gate is the named choice."""
    x, w1, b1 = np.zeros((1, 2)), np.ones((2, 3)), np.zeros(3)
    w2, b2, dy = np.ones((3, 2)), np.zeros(2), np.ones((1, 2))
    for vjp in (L.feed_forward_vjp, L.feed_forward_vjp_exact):
        _, _, db1, _, _ = vjp(x, w1, b1, w2, b2, dy, relu_at_zero=relu_at_zero)
        assert np.all(db1 == 2.0 * gets), (vjp.__name__, db1)
    with pytest.raises(ValueError, match="relu_at_zero"):
        L.feed_forward_vjp(x, w1, b1, w2, b2, dy, relu_at_zero=0.5)
