"""The oracle for the rest of training is right: §5.3's Adam step, §5.4's residual dropout given its mask, §6.1's
checkpoint averaging.

Evidence:
1. the fast tier is a float64 rounding of a value within a derived bound E of the truth ("sandwich",
   ``tests/_sandwich.py``), the truth being the formula written out here in mpmath at HIGH_DPS;
2. the exact tier equals the correctly rounded truth: Fractions where the formula is rational (dropout, averaging,
   Adam's first step from a zero state), the mpmath formula otherwise;
3. closed forms: Adam's first step from zero moments is lr g / (|g| + eps) (bias correction undoes the moments'
   start at zero), a zero gradient with a zero first moment leaves the parameter unchanged, dropout at p = 0 is the
   identity, the average of equal checkpoints is the checkpoint;
4. every Choice pinned (bias correction, the three places of epsilon, which checkpoints are the last), and bad input
   rejected with an error naming the argument.

Fast-tier bounds, with u = 2^-64 (longdouble), gamma_n = n u / (1 - n u) (Higham, 2nd ed., §3.1) and LIBM = 4u the
relative error of longdouble's pow (glibc's x86_64 libm-test-ulps: at most 2 ulps; one ulp is at most 2u relative):

- Adam (Kingma & Ba, Algorithm 1), per element, first order in the relative errors, each below 2^-45 for the drawn
  constants (beta <= 0.9999 keeps 1 - beta^t >= 10^-4), so the first-order sum is multiplied by 1 + 2^-30 for their
  products:
  m_t = beta1 m + (1 - beta1) g: three roundings on the longer path (1 - beta1, the product, the sum):
  |e_m| <= gamma_3 (beta1 |m| + (1 - beta1) |g|); v_t: four (1 - beta2, g^2, the product, the sum), and every term is
  non-negative: |e_v| <= gamma_4 v_t. 1 - beta^t: pow's LIBM on beta^t, then a rounding:
  relative d = beta^t LIBM / (1 - beta^t) + u (0 without bias correction).
  "outside": m_hat = m_t / c1 errs by (e_m + |m_t| d1) / c1 + u |m_hat|; v_hat relative gamma_4 + d2 + u; the
  denominator sqrt(v_hat) + eps relative half that plus 2u (the sqrt, the sum of two non-negatives);
  "inside": sqrt(v_hat + eps), relative (rel(v_hat) + u) / 2 + u; "hat": lr sqrt(c2) / c1 relative
  d2 / 2 + d1 + 3u, sqrt(v_t) + eps relative gamma_4 / 2 + 2u.
  The update lr m_hat / den errs by lr e(m_hat) / den + |update| (rel(den) + 2u); the parameter by that plus
  u |theta_t|.
- Dropout: 1 - p and the quotient, two roundings: E = gamma_2 |y|.
- Averaging n checkpoints: a sum of n terms (gamma_{n-1} sum |theta_i|), then the division:
  E <= gamma_n sum |theta_i| / n.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from _sandwich import assert_exact_equal, assert_sandwiched, gamma, rounded, u
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.reference._exact import HIGH_DPS
from aiayn.reference.training import (
    ADAM_BETAS,
    ADAM_EPS,
    CHECKPOINTS_AVERAGED,
    EPS_PLACEMENTS,
    P_DROP,
    adam_step,
    adam_step_exact,
    average_checkpoints,
    average_checkpoints_exact,
    dropout,
    dropout_exact,
    last_checkpoints,
)

LIBM = 4 * u
TRUTH_SLACK = mpmath.mpf(10) ** (2 - HIGH_DPS)  # relative error of a truth evaluated at HIGH_DPS
SECOND_ORDER = 1 + mpmath.mpf(2) ** -30  # products of two relative errors, each below 2^-45 here


# --------------------------------------------------------------------------------------------
# Adam, §5.3


def adam_truth(p, g, m, v, t, lr, b1, b2, eps, corrected, where):
    """Kingma & Ba's Algorithm 1 (and its two other placements of eps) written out for one element, mpf in and out:
    (theta_t, m_t, v_t) and the bounds (E_theta, E_m, E_v) of the fast tier's error (module docstring)."""
    p, g, m, v, lr, b1, b2, eps = (mpmath.mpf(x) for x in (p, g, m, v, lr, b1, b2, eps))
    m1 = b1 * m + (1 - b1) * g
    v1 = b2 * v + (1 - b2) * g**2
    e_m = gamma(3) * (b1 * abs(m) + (1 - b1) * abs(g))
    e_v = gamma(4) * v1
    if corrected:
        x1, x2 = b1**t, b2**t
        c1, c2 = 1 - x1, 1 - x2
        d1, d2 = x1 * LIBM / c1 + u, x2 * LIBM / c2 + u
    else:
        c1 = c2 = mpmath.mpf(1)
        d1 = d2 = mpmath.mpf(0)
    if where == "hat":
        a = lr * mpmath.sqrt(c2) / c1
        den = mpmath.sqrt(v1) + eps
        update = a * m1 / den
        e_update = a * e_m / den + abs(update) * (d2 / 2 + d1 + 3 * u + gamma(4) / 2 + 2 * u + 2 * u)
    else:
        m_hat, v_hat = m1 / c1, v1 / c2
        e_m_hat = (e_m + abs(m1) * d1) / c1 + u * abs(m_hat)
        rel_v_hat = gamma(4) + d2 + u
        if where == "inside":
            den, rel_den = mpmath.sqrt(v_hat + eps), (rel_v_hat + u) / 2 + u
        else:
            den, rel_den = mpmath.sqrt(v_hat) + eps, rel_v_hat / 2 + 2 * u
        update = lr * m_hat / den
        e_update = lr * e_m_hat / den + abs(update) * (rel_den + 2 * u)
    p1 = p - update
    e_p = (e_update + u * abs(p1)) * SECOND_ORDER + TRUTH_SLACK * (abs(p) + abs(update))
    return (p1, m1, v1), (e_p, e_m * SECOND_ORDER + TRUTH_SLACK * abs(m1), e_v * SECOND_ORDER + TRUTH_SLACK * v1)


def _magnitudes(n: int, *, signed: bool = True):
    exponents = hnp.arrays(np.float64, n, elements=st.floats(-12, 6))
    signs = hnp.arrays(np.float64, n, elements=st.sampled_from([-1.0, 1.0] if signed else [1.0]))
    mantissa = hnp.arrays(np.float64, n, elements=st.floats(1, 10))
    zeros = hnp.arrays(np.bool_, n)
    return st.tuples(exponents, signs, mantissa, zeros).map(lambda a: np.where(a[3], 0.0, a[1] * a[2] * 10.0 ** a[0]))


@st.composite
def adam_inputs(draw):
    n = draw(st.integers(1, 5))
    p = draw(_magnitudes(n))
    g, m = draw(_magnitudes(n)), draw(_magnitudes(n))
    v = draw(_magnitudes(n, signed=False)) ** 2
    step = draw(st.sampled_from([1, 2, 3, 4000, 100_000]) | st.integers(1, 10**6))
    lr = draw(st.sampled_from([7e-4, 1e-3, 0.0]) | st.floats(0, 1))
    pair = st.floats(0, 0.9999)
    betas = draw(st.sampled_from([ADAM_BETAS, (0.9, 0.999), (0.0, 0.0), (0.5, 0.5)]) | st.tuples(pair, pair))
    eps = draw(st.sampled_from([ADAM_EPS, 1e-8, 1e-7, 1.0]) | st.floats(1e-12, 1))
    return dict(param=p, grad=g, m=m, v=v, step=step, lr=lr, betas=betas, eps=eps)


def _truths(args, corrected, where):
    b1, b2 = args["betas"]
    cols = [
        adam_truth(*xs, args["step"], args["lr"], b1, b2, args["eps"], corrected, where)
        for xs in zip(args["param"], args["grad"], args["m"], args["v"])
    ]
    values = [[c[0][i] for c in cols] for i in range(3)]
    bounds = [[c[1][i] for c in cols] for i in range(3)]
    return values, bounds


@given(adam_inputs(), st.booleans(), st.sampled_from(EPS_PLACEMENTS))
def test_adam_step_fast_tier_within_its_bound_and_exact_tier_correctly_rounded(args, corrected, where):
    kw = dict(bias_correction=corrected, eps_placement=where)
    with mpmath.workdps(HIGH_DPS):
        values, bounds = _truths(args, corrected, where)
    inputs = f"{ {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in args.items()} }, {kw}"
    fast, exact = adam_step(**args, **kw), adam_step_exact(**args, **kw)
    for i, name in enumerate(("param", "m", "v")):
        truth = np.array(values[i], dtype=object)
        assert_sandwiched(fast[i], truth, np.array(bounds[i], dtype=object), f"adam_step {name} (§5.3)", inputs)
        with mpmath.workdps(HIGH_DPS):
            assert_exact_equal(exact[i], rounded(values[i]), f"adam_step_exact {name} vs formula", inputs)


@given(_magnitudes(4), _magnitudes(4), st.floats(0, 1), st.sampled_from([ADAM_BETAS, (0.9, 0.999), (0.3, 0.7)]))
def test_adam_first_step_from_zero_moments_is_lr_g_over_abs_g_plus_eps(p, g, lr, betas):
    """At t = 1 from m = v = 0 with bias correction, m_hat = g and v_hat = g^2 exactly, so
    theta_1 = theta - lr g / (|g| + eps): rational, rounded once by Fraction (Kingma & Ba, §3: the correction undoes
    the moments' initialisation at zero)."""
    zeros = np.zeros_like(p)
    got = adam_step_exact(p, g, zeros, zeros, 1, lr, betas, ADAM_EPS)[0]
    e = Fraction(ADAM_EPS)
    expected = [float(Fraction(a) - Fraction(lr) * Fraction(b) / (abs(Fraction(b)) + e)) for a, b in zip(p, g)]
    assert_exact_equal(got, np.array(expected), "theta_1 from zero moments", f"p={p.tolist()}, g={g.tolist()}, lr={lr}")


@pytest.mark.parametrize("tier", [adam_step, adam_step_exact])
@pytest.mark.parametrize("where", EPS_PLACEMENTS)
def test_adam_zero_gradient_and_first_moment_leave_the_parameter_unchanged(tier, where):
    p, v = np.array([1.5, -3e-7, 0.0]), np.array([4.0, 1e-20, 0.0])
    theta, m1, v1 = tier(p, np.zeros(3), np.zeros(3), v, 7, 1e-3, eps_placement=where)
    assert_exact_equal(theta, p, "theta after a zero step", where)
    assert_exact_equal(m1, np.zeros(3), "m after a zero gradient", where)
    assert_exact_equal(v1, np.array([0.98 * 4.0, 0.98 * 1e-20, 0.0]), "v decays by beta2", where)


def test_adam_choices_are_pinned():
    """At t = 1 from zero moments, g = 1e-4, lr = 1, the paper's betas and eps: Algorithm 1 gives g / (|g| + eps);
    eps inside the root g / sqrt(g^2 + eps); Keras's order g / (|g| + eps / sqrt(1 - beta2)); no bias correction
    (1 - beta1) g / (sqrt(1 - beta2) |g| + eps). The four differ, so each choice is pinned by its value."""
    g, b1, b2, e = 1e-4, *ADAM_BETAS, ADAM_EPS
    with mpmath.workdps(HIGH_DPS):
        G, B1, B2, E = (mpmath.mpf(x) for x in (g, b1, b2, e))
        cases = {
            ("outside", True): G / (G + E),
            ("inside", True): G / mpmath.sqrt(G**2 + E),
            ("hat", True): G / (G + E / mpmath.sqrt(1 - B2)),
            ("outside", False): (1 - B1) * G / (mpmath.sqrt(1 - B2) * G + E),
            ("hat", False): (1 - B1) * G / (mpmath.sqrt(1 - B2) * G + E),
            ("inside", False): (1 - B1) * G / mpmath.sqrt((1 - B2) * G**2 + E),
        }
        expected = {k: float(rounded([-step])[0]) for k, step in cases.items()}
    assert len(set(expected.values())) == 5  # "hat" without correction is "outside" (the two factors are 1)
    for (where, corrected), want in expected.items():
        got = adam_step_exact([0.0], [g], [0.0], [0.0], 1, 1.0, bias_correction=corrected, eps_placement=where)[0]
        assert_exact_equal(got, np.array([want]), f"eps_placement={where!r}, bias_correction={corrected}", "")


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        (dict(grad=np.zeros(2)), ValueError, "grad: expected param's shape"),
        (dict(v=-np.ones(3)), ValueError, "v: expected a second moment >= 0"),
        (dict(step=0), ValueError, "step: expected an integer >= 1"),
        (dict(step=1.0), TypeError, "step: expected an integer"),
        (dict(lr=-1.0), ValueError, "lr: expected one number >= 0"),
        (dict(betas=(0.9, 0.98, 0.1)), TypeError, "betas: expected a pair"),
        (dict(betas=(0.9, 1.0)), ValueError, r"betas: expected each in \[0, 1\)"),
        (dict(eps=0.0), ValueError, "eps: expected one number > 0"),
        (dict(eps_placement="under"), ValueError, "eps_placement: expected one of"),
        (dict(param=np.array([np.nan, 0, 0])), ValueError, "param: expected finite values"),
    ],
)
@pytest.mark.parametrize("tier", [adam_step, adam_step_exact])
def test_adam_step_rejects_bad_input(tier, kwargs, error, needle):
    args = dict(param=np.zeros(3), grad=np.zeros(3), m=np.zeros(3), v=np.zeros(3), step=1, lr=1e-3)
    with pytest.raises(error, match=needle):
        tier(**{**args, **kwargs})


# --------------------------------------------------------------------------------------------
# residual dropout, §5.4


@st.composite
def dropout_inputs(draw):
    x = draw(_magnitudes(draw(st.integers(1, 8))))
    keep = draw(hnp.arrays(np.bool_, x.shape))
    p = draw(st.sampled_from([P_DROP, 0.3, 0.0, 0.5, 0.99]) | st.floats(0, 0.999))
    return x, keep, p


@given(dropout_inputs())
def test_dropout_tiers_given_the_mask(args):
    """Exact: y = keep x / (1 - p) is rational, rounded once by Fraction; fast within gamma_2 |y|."""
    x, keep, p = args
    inputs = f"x={x.tolist()}, keep={keep.tolist()}, p={p!r}"
    truth = [Fraction(a) / (1 - Fraction(p)) if k else Fraction(0) for a, k in zip(x, keep)]
    assert_exact_equal(dropout_exact(x, keep, p), np.array([float(t) for t in truth]), "dropout_exact", inputs)
    with mpmath.workdps(HIGH_DPS):
        values = np.array([mpmath.mpf(t.numerator) / t.denominator for t in truth], dtype=object)
        bound = np.array([gamma(2) * abs(y) for y in values], dtype=object)
    assert_sandwiched(dropout(x, keep, p), values, bound, "dropout (§5.4)", inputs)


@pytest.mark.parametrize("tier", [dropout, dropout_exact])
def test_dropout_choices_are_pinned(tier):
    x = np.array([-2.0, 3.0, -0.0, 1e-300])
    kept = tier(x, np.ones(4, dtype=bool), 0.0)
    assert_exact_equal(kept, np.array([-2.0, 3.0, 0.0, 1e-300]), "dropout at p = 0 is the identity", "")
    dropped = tier(x, np.zeros(4, dtype=bool), 0.1)
    assert not np.any(np.signbit(dropped)) and not np.any(dropped), "a dropped element is +0.0"
    assert_exact_equal(tier(np.array([0.9]), np.array([True]), 0.1), np.array([1.0]), "0.9 / (1 - 0.1)", "")


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        ((np.ones(2), np.ones(2), 0.1), TypeError, "keep: expected a boolean array"),
        ((np.ones(2), np.ones(3, dtype=bool), 0.1), ValueError, "keep: expected x's shape"),
        ((np.ones(2), np.ones(2, dtype=bool), 1.0), ValueError, r"p: expected one number in \[0, 1\)"),
        ((np.ones(2), np.ones(2, dtype=bool), -0.1), ValueError, "p: expected one number"),
        ((np.ones(2), np.ones(2, dtype=bool), [0.1, 0.2]), ValueError, "p: expected one number"),
        ((np.array([np.inf, 1]), np.ones(2, dtype=bool), 0.1), ValueError, "x: expected finite values"),
    ],
)
@pytest.mark.parametrize("tier", [dropout, dropout_exact])
def test_dropout_rejects_bad_input(tier, args, error, needle):
    with pytest.raises(error, match=needle):
        tier(*args)


# --------------------------------------------------------------------------------------------
# checkpoint averaging, §6.1


@st.composite
def checkpoint_inputs(draw):
    count = draw(st.integers(1, 22))
    steps = draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count, unique=True))
    n = draw(st.integers(1, count))
    shape = draw(st.sampled_from([(), (3,), (2, 2)]))
    size = int(np.prod(shape))
    checkpoints = {
        s: {"w": draw(_magnitudes(size)).reshape(shape), "b": draw(_magnitudes(2))} for s in steps
    }  # the given order is the drawn one, not the steps'
    return checkpoints, n


@given(checkpoint_inputs())
def test_average_checkpoints_tiers(args):
    """Exact: the mean is rational, rounded once by Fraction; fast within gamma_n sum |theta_i| / n."""
    checkpoints, n = args
    chosen = sorted(checkpoints)[-n:]
    inputs = f"steps {list(checkpoints)}, n={n}"
    fast, exact = average_checkpoints(checkpoints, n), average_checkpoints_exact(checkpoints, n)
    assert sorted(fast) == sorted(exact) == ["b", "w"]
    for name in ("w", "b"):
        stack = np.stack([checkpoints[s][name] for s in chosen]).reshape(n, -1)
        truth = [sum(Fraction(a) for a in col) / n for col in stack.T]
        shape = np.shape(checkpoints[chosen[0]][name])
        assert_exact_equal(exact[name], np.array([float(t) for t in truth]).reshape(shape), f"{name} exact", inputs)
        with mpmath.workdps(HIGH_DPS):
            values = np.array([mpmath.mpf(t.numerator) / t.denominator for t in truth], dtype=object)
            bound = np.array([gamma(n) * sum(abs(mpmath.mpf(a)) for a in col) / n for col in stack.T], dtype=object)
        assert_sandwiched(fast[name].reshape(-1), values, bound, f"average_checkpoints {name} (§6.1)", inputs)


def test_the_last_checkpoints_are_those_of_the_largest_steps():
    assert last_checkpoints([300, 20, 100, 5, 1000], 2) == [300, 1000]
    with pytest.raises(TypeError, match="steps: expected integers"):
        last_checkpoints(["checkpoint_100", "checkpoint_20"], 1)  # names sort checkpoint_100 first: steps, not names
    with pytest.raises(ValueError, match="steps: expected distinct steps"):
        last_checkpoints([5, 5], 1)
    checkpoints = {100: {"w": np.array([1.0])}, 20: {"w": np.array([5.0])}, 300: {"w": np.array([3.0])}}
    for tier in (average_checkpoints, average_checkpoints_exact):
        assert_exact_equal(tier(checkpoints, 2)["w"], np.array([2.0]), "the mean of steps 100 and 300", "")
    assert CHECKPOINTS_AVERAGED == {"base": 5, "big": 20}  # §6.1


@pytest.mark.parametrize("tier", [average_checkpoints, average_checkpoints_exact])
def test_the_average_of_equal_checkpoints_is_the_checkpoint(tier):
    w = np.array([0.1, -7.3e-5, 1e300, 5e-324])
    got = tier({s: {"w": w} for s in range(1, 21)}, 20)["w"]
    assert_exact_equal(got, w, "the mean of 20 equal checkpoints", "")


@pytest.mark.parametrize(
    ("checkpoints", "n", "error", "needle"),
    [
        ([{"w": 1.0}], 1, TypeError, "checkpoints: expected a mapping of step"),
        ({}, 1, ValueError, "checkpoints: expected at least one checkpoint"),
        ({"a": {"w": 1.0}}, 1, TypeError, "checkpoints: expected steps"),
        ({1: {"w": 1.0}}, 2, ValueError, "n: expected at most the 1 checkpoints"),
        ({1: {"w": 1.0}}, 0, ValueError, "n: expected an integer >= 1"),
        ({1: {"w": 1.0}, 2: {"v": 1.0}}, 2, ValueError, r"checkpoints\[2\]: its parameter names differ"),
        ({1: {"w": np.ones(2)}, 2: {"w": np.ones(3)}}, 2, ValueError, r"checkpoints\[2\]\['w'\]: shape"),
        ({1: [1.0]}, 1, TypeError, r"checkpoints\[1\]: expected a mapping name -> array"),
    ],
)
@pytest.mark.parametrize("tier", [average_checkpoints, average_checkpoints_exact])
def test_average_checkpoints_rejects_bad_input(tier, checkpoints, n, error, needle):
    with pytest.raises(error, match=needle):
        tier(checkpoints, n)
