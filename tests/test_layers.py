"""The oracle for §3.1, §3.3, §3.4 (LayerNorm, the sub-layer connection, Eq. (2), embeddings and the
tied projection) is right.

Evidence:
1. the fast tier agrees with the exact tier within a derived bound (property-based);
2. the exact tier does not change when recomputed at a much higher precision;
3. independent checks: closed forms (LayerNorm((3, 1)) = (1, -1), the seed FFN example -> (2, 0)),
   exact rational arithmetic with ``fractions.Fraction`` (Eq. (2) and x E^T are rational, and
   CPython's float(Fraction) rounds correctly), invariances (shift, power-of-two scale);
4. every Choice pinned; every bad input gets an error naming the argument.

How the fast tier is compared (the "sandwich"). The fast tier computes a longdouble value y_ld
with |y_ld - y| <= E (E derived per equation below) and rounds it once to float64. Rounding to
nearest is monotone, so the float64 result must lie in [fl64(y - E), fl64(y + E)]: that is the
check, with y the true value from the exact tier's unrounded mpmath evaluation at HIGH_DPS. It
allows a one-ulp difference only where a rounding boundary lies within E of y, so it is sharper
than |fast - exact| <= 1 ulp + E.

Notation: u = 2^-64 (longdouble unit roundoff), U = 2^-53 (float64), gamma_n = n u / (1 - n u)
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §3.1; dot products §3.5).
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from _sandwich import TINY, U, assert_exact_equal, assert_sandwiched, u
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.reference._exact import HIGH_DPS, correctly_rounded, round_to_float64, to_mp
from aiayn.reference.layers import (
    EXACT_PREC,
    _affine_mp,
    _layer_norm_mp,
    embedding_lookup,
    embedding_lookup_exact,
    feed_forward,
    feed_forward_exact,
    layer_norm,
    layer_norm_exact,
    output_logits,
    output_logits_exact,
    sublayer_connection,
    sublayer_connection_exact,
)

# The truth is evaluated at HIGH_DPS with at most ~10 roundings, each <= 10^-HIGH_DPS relative to
# the magnitudes involved; this slack covers them (it is ~1e-100 of any bound below).
TRUTH_SLACK = mpmath.mpf(10) ** (2 - HIGH_DPS)
# No extra input error: the default of the fast-tier bounds below that take one.
_MPF_ZERO = mpmath.mpf(0)


def gamma(n: int, unit: mpmath.mpf = u) -> mpmath.mpf:
    return n * unit / (1 - n * unit)


def truth(fn, *args):
    """Evaluate an unrounded exact-tier helper at HIGH_DPS."""
    with mpmath.workdps(HIGH_DPS):
        return np.asarray(fn(*args), dtype=object)


def rounded_truth(fn, *args) -> np.ndarray:
    """fl64 of the truth, made certain by _exact's Ziv loop (a value within 10^-HIGH_DPS of a
    rounding boundary is recomputed at higher precision)."""
    return correctly_rounded(lambda: fn(*args), HIGH_DPS)


# --------------------------------------------------------------------------------------------
# strategies: tiny sizes (the exact tier is mpmath), magnitudes that matter

BATCHES = st.sampled_from([(), (1,), (2,), (2, 2)])
SCALES = st.sampled_from([2.0**-1000, 2.0**-60, 1.0, 1.0, 2.0**40, 2.0**900])


def _floats(limit: float = 1e3):
    return st.floats(-limit, limit, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def layer_rows(draw, batch: tuple[int, ...], d: int) -> np.ndarray:
    """Rows that matter for LayerNorm: generic at any scale, near-constant (a few ulps of spread),
    a large common offset, mixed magnitudes (1e-300 next to 1e300), subnormals."""
    kind = draw(st.sampled_from(["generic", "near_constant", "offset", "mixed", "subnormal"]))
    shape = (*batch, d)
    if kind == "generic":
        return draw(hnp.arrays(np.float64, shape, elements=_floats())) * draw(SCALES)
    if kind == "near_constant":
        c = draw(_floats(1e6).filter(lambda v: v != 0))
        ks = draw(hnp.arrays(np.int64, shape, elements=st.integers(-3, 3)))
        return c + ks * np.spacing(c)
    if kind == "offset":
        offset = draw(st.sampled_from([1e8, -3e15, 2.0**60, 1e300]))
        return offset + draw(hnp.arrays(np.float64, shape, elements=_floats(1.0))) * offset * 2.0**-45
    if kind == "mixed":
        return draw(
            hnp.arrays(np.float64, shape, elements=st.sampled_from([1e-300, -1e-300, 0.0, 1.0, -3.5, 1e300, -7e299]))
        )
    return draw(hnp.arrays(np.float64, shape, elements=st.integers(-(2**20), 2**20))) * 2.0**-1074


EPSILONS = st.sampled_from([0.0, 1e-12, 1e-6, 1e-5, 0.5625, 1.0, 1e3]) | st.floats(0, 10)


def _make_nonconstant(x: np.ndarray) -> np.ndarray:
    """For eps = 0: give every constant row a second value one ulp up (eps = 0 with a constant row
    is an error, tested separately)."""
    x = x.copy()
    constant = np.all(x == x[..., :1], axis=-1)
    x[..., -1] = np.where(constant, np.nextafter(x[..., 0], np.inf), x[..., -1])
    return x


@st.composite
def layer_norm_inputs(draw, max_d: int = 6):
    batch = draw(BATCHES)
    d = draw(st.integers(1, max_d))
    x = draw(layer_rows(batch, d))
    eps = draw(EPSILONS)
    if eps == 0.0:
        if d == 1:
            eps = 1e-6
        else:
            x = _make_nonconstant(x)
    gain = draw(st.sampled_from([np.ones(d)]) | hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    bias = draw(st.sampled_from([np.zeros(d)]) | hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    return x, gain, bias, eps


# --------------------------------------------------------------------------------------------
# LayerNorm: the fast tier's error bound


def layer_norm_fast_bound(
    x_true: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float, u_in: mpmath.mpf = _MPF_ZERO
) -> np.ndarray:
    """E for the fast LayerNorm (corrected two-pass in longdouble), per element.

    The fast tier gets the row r_hat with |r_hat_j - x_j| <= u_in |x_j| (u_in = 0 for layer_norm:
    float64 inputs are exact in longdouble; u for the post-norm residual x + Sublayer(x)).
    With mu, t_j = x_j - mu, sigma^2 = mean t^2, s = sqrt(sigma^2 + eps), z = t / s of the TRUE row,
    m_t = mean |t|, ma = mean |x|, mx = max |x| (any summation order obeys |error| <= gamma_{n-1}
    sum |terms|):
    1. mu0 = fl(sum r_hat / d): |mu0 - mean(r_hat)| <= gamma_d ma (1 + u_in) =: e0.
    2. r_j = fl(r_hat_j - mu0) = (t_hat_j + eta)(1 + delta_j), eta = mean(r_hat) - mu0, |eta| <= e0.
    3. c = fl(sum r / d) = eta + xi: sum_j r_j = d eta + sum_j (t_hat_j + eta) delta_j (the t_hat sum
       to 0), so |xi| <= u e0 + (1 + u)(u + gamma_{d-1}(1 + u))(m_t_hat + e0) <= gamma_{d+3}(m_t_hat + e0).
    4. dev_j = fl(r_j - c) = (t_hat_j + (t_hat_j + eta) delta_j - xi)(1 + delta'), so
       |dev_j - t_hat_j| <= gamma_2 |t_hat_j| + gamma_{d+5} (m_t_hat + e0). With |t_hat_j - t_j| <=
       u_in (|x_j| + ma): |dev_j - t_j| <= gamma_2 |t_j| + a, a := gamma_{d+5} (m_t + e0) + 2 u_in (mx + ma).
       The mean's error enters only as gamma^2 d ma (through e0): this is the corrected two-pass
       algorithm's advantage (Chan, Golub & LeVeque 1983) on near-constant rows.
    5. rho = rms(dev) obeys |rho - sigma| <= gamma_2 sigma + a (Minkowski); var_hat = rho^2 (1 + theta_{d+1});
       fl(var_hat + eps) = (rho^2 + eps)(1 + theta_{d+2}) (both terms >= 0); sqrt (correctly rounded)
       halves theta and adds u. sqrt(rho^2 + eps) is 1-Lipschitz in rho, so
       |s_hat - s| <= phi s with phi := gamma_{d+6} + (1 + gamma_{d+3}) a / s.
    6. z_hat_j = fl(dev_j / s_hat): |z_hat_j - z_j| <= D_j + u (|z_j| + D_j),
       D_j := ((gamma_2 + phi) |z_j| + a / s) / (1 - phi).
    7. y_hat_j = fl(fl(z_hat_j g_j) + b_j): |y_hat_j - y_j| <= P_j (1 + u) + u (|z_j g_j| + |b_j|),
       P_j := |g_j| dz_j + u |g_j| (|z_j| + dz_j), dz_j the bound of step 6.
    8. A constant row (sigma = 0) with d <= 2^11: d v needs at most 53 + 11 bits, so every partial
       sum, mu0 = v, r = 0, c = 0 and dev = 0 are exact and y_hat = b exactly: E = 0 there (the
       general bound would charge gamma^2 ma / sqrt(eps), unbounded as eps -> 0).
    Every u-term is ~1e-19 relative, so E sits ~2^-11 below half an ulp of float64. For rows that
    are not constant, phi is ~d u: a float64 row's relative spread sigma / ma is at least ~2^-53 / d.
    """
    d = x_true.shape[-1]
    rows = x_true.reshape(-1, d)
    out = np.empty(rows.shape, dtype=object)
    with mpmath.workdps(40):
        g, b, ep = to_mp(gain), to_mp(bias), mpmath.mpf(eps)
        for r, row in enumerate(rows):
            row = [mpmath.mpf(v) for v in row]
            mu = mpmath.fsum(row) / d
            t = [v - mu for v in row]
            m_t = mpmath.fsum(abs(v) for v in t) / d
            ma = mpmath.fsum(abs(v) for v in row) / d
            mx = max(abs(v) for v in row)
            s = mpmath.sqrt(mpmath.fsum(v * v for v in t) / d + ep)
            if u_in == 0 and d <= 2**11 and all(v == row[0] for v in row):
                out[r] = [TRUTH_SLACK * abs(bj) for bj in b]
                continue
            e0 = gamma(d) * ma * (1 + u_in)
            a = gamma(d + 5) * (m_t + e0) + 2 * u_in * (mx + ma)
            phi = gamma(d + 6) + (1 + gamma(d + 3)) * a / s
            assert phi < 0.5, f"the LayerNorm bound needs phi < 1/2, got {phi} for row {row}"
            for j in range(d):
                z = abs(t[j]) / s
                big_d = ((gamma(2) + phi) * z + a / s) / (1 - phi)
                dz = big_d + u * (z + big_d)
                p = abs(g[j]) * dz + u * abs(g[j]) * (z + dz)
                mag = z * abs(g[j]) + abs(b[j])
                out[r, j] = p * (1 + u) + u * mag + TRUTH_SLACK * mag
    return out.reshape(x_true.shape)


def _ln_truth(x, gain, bias, eps):
    return truth(_layer_norm_mp, to_mp(x), to_mp(gain), to_mp(bias), mpmath.mpf(eps))


def _ln_inputs(x, gain, bias, eps) -> str:
    return f"x={x.tolist()!r}, gain={gain.tolist()!r}, bias={bias.tolist()!r}, eps={eps!r}"


@given(layer_norm_inputs())
def test_layer_norm_fast_tier_matches_exact_tier(args):
    x, gain, bias, eps = args
    assert_sandwiched(
        layer_norm(x, gain, bias, eps),
        _ln_truth(x, gain, bias, eps),
        layer_norm_fast_bound(x, gain, bias, eps),
        "layer_norm (§3.1)",
        _ln_inputs(x, gain, bias, eps),
    )


@settings(max_examples=15)
@given(layer_norm_inputs(max_d=4))
def test_layer_norm_exact_tier_is_stable_at_higher_precision(args):
    x, gain, bias, eps = args
    assert_exact_equal(
        layer_norm_exact(x, gain, bias, eps),
        layer_norm_exact(x, gain, bias, eps, dps=HIGH_DPS),
        "layer_norm_exact at DEFAULT_DPS vs HIGH_DPS",
        _ln_inputs(x, gain, bias, eps),
    )


def test_layer_norm_fast_tier_at_model_width():
    """d_model = 512 rows (generic and near-constant) against the truth, same bound."""
    rng = np.random.default_rng(31)
    x = np.stack([rng.normal(size=512), 1e4 + rng.integers(-4, 5, size=512) * np.spacing(1e4)])
    gain, bias = rng.normal(size=512), rng.normal(size=512)
    assert_sandwiched(
        layer_norm(x, gain, bias),
        _ln_truth(x, gain, bias, 1e-6),
        layer_norm_fast_bound(x, gain, bias, 1e-6),
        "layer_norm (§3.1), d=512",
        "seeded rows",
    )


def test_layer_norm_closed_form_3_1():
    """Seed text: LayerNorm((3, 1)) = (1, -1): mean 2, deviations (1, -1), biased variance 1."""
    ones, zeros = np.ones(2), np.zeros(2)
    for fn in (layer_norm, layer_norm_exact):
        assert_exact_equal(fn([3.0, 1.0], ones, zeros, eps=0.0), np.array([1.0, -1.0]), fn.__name__, "x=(3, 1), eps=0")


def test_layer_norm_uses_the_biased_variance():
    """x = (0, 0, 3): mean 1, deviations (-1, -1, 2); biased variance 6/3 = 2 gives (-1, -1, 2)/sqrt(2);
    the unbiased 6/2 = 3 would give (-1, -1, 2)/sqrt(3)."""
    with mpmath.workdps(60):
        r2 = 1 / mpmath.sqrt(2)
        expected = np.array([round_to_float64(-r2), round_to_float64(-r2), round_to_float64(2 * r2)])
    got = layer_norm_exact([0.0, 0.0, 3.0], np.ones(3), np.zeros(3), eps=0.0)
    assert_exact_equal(got, expected, "layer_norm_exact((0, 0, 3))", "eps=0")
    assert abs(got[2] - 2 / math.sqrt(3)) > 0.1


def test_layer_norm_eps_is_inside_the_square_root():
    """x = (3, 1), eps = 9/16: 1/sqrt(1 + 9/16) = 4/5 exactly in the rational sense (float64 0.8 is
    its correct rounding); eps outside the root would give 1/(1 + 9/16) = 0.64."""
    ones, zeros = np.ones(2), np.zeros(2)
    expected = float(Fraction(4, 5))
    assert_exact_equal(
        layer_norm_exact([3.0, 1.0], ones, zeros, eps=0.5625), np.array([expected, -expected]), "eps inside sqrt", ""
    )
    assert_exact_equal(
        layer_norm([3.0, 1.0], ones, zeros, eps=0.5625), np.array([expected, -expected]), "eps inside sqrt (fast)", ""
    )


def test_layer_norm_default_eps_is_1e_6():
    """The Choice: eps = 1e-6 (tensor2tensor). Signature and behaviour: x = (3, 1) gives 1/sqrt(1 + 1e-6)."""
    for fn in (layer_norm, layer_norm_exact):
        assert inspect.signature(fn).parameters["eps"].default == 1e-6, fn.__name__
    with mpmath.workdps(60):
        expected = round_to_float64(1 / mpmath.sqrt(1 + mpmath.mpf(1e-6)))
        pytorch = round_to_float64(1 / mpmath.sqrt(1 + mpmath.mpf(1e-5)))
    got = layer_norm_exact([3.0, 1.0], np.ones(2), np.zeros(2))
    assert got[0] == expected and got[1] == -expected, f"default eps: got {got.tolist()}, expected ±{expected!r}"
    assert got[0] != pytorch


@settings(max_examples=25)
@given(d=st.integers(2, 6), data=st.data())
def test_layer_norm_is_invariant_to_shifting_the_input(d, data):
    """LayerNorm(x + c) = LayerNorm(x) for a common shift c. Inputs are integers times 2^e with
    |x| < 2^20 and |c| < 2^32, so x + c is exact in float64 and the true outputs are identical:
    the exact tier must agree bit for bit, and the fast tier on x + c must sit within its own
    bound (which grows with mean|x + c|, the near-constant case) of the truth for x."""
    e = data.draw(st.integers(-30, 30))
    ints = data.draw(hnp.arrays(np.int64, (d,), elements=st.integers(-(2**20), 2**20)))
    if np.all(ints == ints[0]):
        ints[-1] += 1
    x = ints * 2.0**e
    shifted = x + data.draw(st.integers(-(2**32), 2**32)) * 2.0**e
    gain, bias = np.linspace(0.5, 2.0, d), np.linspace(-1.0, 1.0, d)
    for eps in (0.0, 1e-6):
        inputs = f"x={x.tolist()!r}, shifted={shifted.tolist()!r}, eps={eps}"
        assert_exact_equal(
            layer_norm_exact(shifted, gain, bias, eps),
            layer_norm_exact(x, gain, bias, eps),
            "shift invariance (exact)",
            inputs,
        )
        assert_sandwiched(
            layer_norm(shifted, gain, bias, eps),
            _ln_truth(x, gain, bias, eps),
            layer_norm_fast_bound(shifted, gain, bias, eps),
            "shift invariance (fast)",
            inputs,
        )


@settings(max_examples=25)
@given(st.integers(2, 6), st.data())
def test_layer_norm_is_invariant_to_power_of_two_scaling_with_eps_zero(d, data):
    """With eps = 0, LayerNorm(2^k x) = LayerNorm(x). Scaling by 2^k is exact in float64 (normal
    range) and in every longdouble step of the fast tier, so both tiers agree bit for bit."""
    rows = data.draw(hnp.arrays(np.float64, (2, d), elements=_floats().filter(lambda v: v == 0 or abs(v) > 1e-3)))
    x = np.where(np.all(rows == rows[:, :1], axis=-1, keepdims=True) & (np.arange(d) == d - 1), rows + 1.0, rows)
    x = x * 2.0 ** data.draw(st.integers(-400, 400))
    k = data.draw(st.integers(-400, 400))
    gain = data.draw(hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    bias = data.draw(hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    for fn in (layer_norm, layer_norm_exact):
        assert_exact_equal(
            fn(x * 2.0**k, gain, bias, 0.0),
            fn(x, gain, bias, 0.0),
            f"{fn.__name__} scale 2^{k}",
            _ln_inputs(x, gain, bias, 0.0),
        )


def test_layer_norm_output_rows_have_mean_0_and_variance_1():
    """With gain 1, bias 0, eps 0 the true outputs have mean 0 and biased variance 1. The exact
    tier's float64 outputs y_hat_j = z_j (1 + d_j), |d_j| <= U, so (sums formed exactly here):
    |mean y_hat| <= U mean |z| and |mean y_hat^2 - 1| <= (2U + U^2) mean z^2 = 2U + U^2."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(size=(3, 7)), 1e9 + rng.integers(-9, 9, size=(2, 7)) * np.spacing(1e9)])
    x = _make_nonconstant(x)
    y = layer_norm_exact(x, np.ones(7), np.zeros(7), eps=0.0)
    with mpmath.workdps(60):
        for r, row in enumerate(y):
            vals = [mpmath.mpf(float(v)) for v in row]
            mean = mpmath.fsum(vals) / 7
            var = mpmath.fsum(v * v for v in vals) / 7
            mean_abs = mpmath.fsum(abs(v) for v in vals) / 7
            assert abs(mean) <= U * mean_abs / (1 - U), (
                f"row {r}: mean {mean}, bound {U * mean_abs}; x={x[r].tolist()!r}"
            )
            assert abs(var - 1) <= (2 * U + U * U) / (1 - U) ** 2, f"row {r}: variance {var}; x={x[r].tolist()!r}"


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        (([1.0, 2.0], [1.0, 1.0, 1.0], [0.0, 0.0]), ValueError, "gain"),
        (([1.0, 2.0], [1.0, 1.0], [0.0]), ValueError, "bias"),
        (([1.0, 2.0], [[1.0, 1.0]], [0.0, 0.0]), ValueError, "gain"),
        ((1.0, [1.0], [0.0]), ValueError, "x"),
        ((np.zeros((2, 0)), [], []), ValueError, "x"),
        (([1.0, np.nan], [1.0, 1.0], [0.0, 0.0]), ValueError, "x"),
        (([1.0, np.inf], [1.0, 1.0], [0.0, 0.0]), ValueError, "x"),
        (([1.0, 2.0], [1.0, np.nan], [0.0, 0.0]), ValueError, "gain"),
        ((["a", "b"], [1.0, 1.0], [0.0, 0.0]), TypeError, "x"),
        (([True, False], [1.0, 1.0], [0.0, 0.0]), TypeError, "x"),
    ],
)
def test_layer_norm_rejects_bad_input(args, error, needle):
    for fn in (layer_norm, layer_norm_exact):
        with pytest.raises(error, match=needle):
            fn(*args)


@pytest.mark.parametrize("eps", [-1e-6, np.nan, np.inf, [1e-6, 1e-6]])
def test_layer_norm_rejects_bad_eps(eps):
    for fn in (layer_norm, layer_norm_exact):
        with pytest.raises(ValueError, match="eps"):
            fn([1.0, 2.0], [1.0, 1.0], [0.0, 0.0], eps)


def test_layer_norm_with_eps_zero_rejects_a_constant_row():
    """Choice: eps = 0 and zero variance is 0/0: an error naming x, eps and the row."""
    for fn in (layer_norm, layer_norm_exact):
        with pytest.raises(ValueError, match=r"x: row \(1,\) is constant.*eps"):
            fn([[1.0, 2.0], [5.0, 5.0]], [1.0, 1.0], [0.0, 0.0], 0.0)
    # with eps > 0 a constant row is fine: zero deviations, output = bias
    assert_exact_equal(
        layer_norm([5.0, 5.0], [1.0, 1.0], [0.25, -2.0]), np.array([0.25, -2.0]), "constant row", "eps=1e-6"
    )


# --------------------------------------------------------------------------------------------
# the sub-layer connection (§3.1): post-norm is the paper's


def _twice_reversed(t):
    return t[..., ::-1] * 2.0  # exact in float64 and in mpmath (no overflow in these tests)


def _twice_reversed_mp(t):
    return t[..., ::-1] * mpmath.mpf(2)


def test_post_norm_is_the_papers_and_differs_from_pre_norm():
    """x = (3, 1), Sublayer = identity, eps 0, gain 1, bias 0, by hand:
    post: LayerNorm(x + x) = LayerNorm((6, 2)) = (1, -1)   (the paper's, §3.1)
    pre:  x + LayerNorm(x) = (3, 1) + (1, -1) = (4, 0)     (not the paper's)."""
    ones, zeros = np.ones(2), np.zeros(2)
    cases = [(sublayer_connection, lambda t: t), (sublayer_connection_exact, lambda t: t)]
    for fn, identity in cases:
        assert_exact_equal(
            fn([3.0, 1.0], identity, ones, zeros, 0.0), np.array([1.0, -1.0]), f"{fn.__name__} default (post)", ""
        )
        assert_exact_equal(
            fn([3.0, 1.0], identity, ones, zeros, 0.0, norm="post"), np.array([1.0, -1.0]), f"{fn.__name__} post", ""
        )
        assert_exact_equal(
            fn([3.0, 1.0], identity, ones, zeros, 0.0, norm="pre"), np.array([4.0, 0.0]), f"{fn.__name__} pre", ""
        )
        assert inspect.signature(fn).parameters["norm"].default == "post"
        assert inspect.signature(fn).parameters["eps"].default == 1e-6


def test_sublayer_connection_composes_layer_norm_and_residual():
    """With integer inputs x + 2 rev(x) is exact in float64, so post-norm must equal
    layer_norm(x + Sublayer(x)) and pre-norm x + Sublayer(layer_norm(x)) bit for bit."""
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, size=(3, 5)).astype(np.float64)
    gain, bias = rng.normal(size=5), rng.normal(size=5)
    post = layer_norm(x + _twice_reversed(x), gain, bias)
    assert_exact_equal(sublayer_connection(x, _twice_reversed, gain, bias), post, "post = LN(x + f(x))", "")
    pre = x + _twice_reversed(layer_norm(x, gain, bias))
    assert_exact_equal(sublayer_connection(x, _twice_reversed, gain, bias, norm="pre"), pre, "pre = x + f(LN(x))", "")
    post_exact = layer_norm_exact(x + _twice_reversed(x), gain, bias)
    assert_exact_equal(sublayer_connection_exact(x, _twice_reversed_mp, gain, bias), post_exact, "exact post", "")


@st.composite
def sublayer_inputs(draw):
    batch = draw(BATCHES)
    d = draw(st.integers(2, 5))
    x = draw(hnp.arrays(np.float64, (*batch, d), elements=_floats())) * draw(st.sampled_from([1.0, 2.0**-30, 2.0**30]))
    x = _make_nonconstant(x)
    gain = draw(hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    bias = draw(hnp.arrays(np.float64, (d,), elements=_floats(10.0)))
    eps = draw(st.sampled_from([1e-6, 1e-3, 1.0]))
    return x, gain, bias, eps


@given(sublayer_inputs())
def test_sublayer_connection_fast_tier_matches_exact_tier(args):
    """Sublayer f(t) = 2 rev(t) (exact in both tiers).
    post: the residual x + f(x) is formed in longdouble, so the LayerNorm bound applies with
    u_in = u to the true residual.
    pre: the fast tier rounds n_hat = fl64(LN_ld(x)): |n_hat - n| <= D := E_LN + U(|n| + E_LN) + 2^-1075;
    then fl_ld(x + 2 rev(n_hat)) adds u(|x| + 2|n| + 2D): E_pre = 2D_rev + u(|x| + 2|n_rev| + 2D_rev)."""
    x, gain, bias, eps = args
    inputs = _ln_inputs(x, gain, bias, eps)
    with mpmath.workprec(EXACT_PREC):
        residual = to_mp(x) + _twice_reversed_mp(to_mp(x))  # exact
    post_truth = truth(_layer_norm_mp, residual, to_mp(gain), to_mp(bias), mpmath.mpf(eps))
    post_bound = layer_norm_fast_bound(residual, gain, bias, eps, u_in=u)
    assert_sandwiched(
        sublayer_connection(x, _twice_reversed, gain, bias, eps), post_truth, post_bound, "post-norm (fast)", inputs
    )
    post_exact = rounded_truth(lambda: _layer_norm_mp(residual, to_mp(gain), to_mp(bias), mpmath.mpf(eps)))
    assert_exact_equal(
        sublayer_connection_exact(x, _twice_reversed_mp, gain, bias, eps), post_exact, "post-norm (exact)", inputs
    )

    n = _ln_truth(x, gain, bias, eps)
    e_ln = layer_norm_fast_bound(x, gain, bias, eps)
    with mpmath.workdps(HIGH_DPS):
        pre_truth = to_mp(x) + _twice_reversed_mp(n)
        dist = np.vectorize(lambda e, v: e + U * (abs(v) + e) + TINY, otypes=[object])(e_ln, n)[..., ::-1]
        pre_bound = 2 * dist + u * (
            np.vectorize(abs, otypes=[object])(to_mp(x))
            + 2 * np.vectorize(abs, otypes=[object])(n[..., ::-1])
            + 2 * dist
        )
    assert_sandwiched(
        sublayer_connection(x, _twice_reversed, gain, bias, eps, norm="pre"),
        pre_truth,
        pre_bound,
        "pre-norm (fast)",
        inputs,
    )
    pre_exact = rounded_truth(
        lambda: to_mp(x) + _twice_reversed_mp(_layer_norm_mp(to_mp(x), to_mp(gain), to_mp(bias), mpmath.mpf(eps)))
    )
    assert_exact_equal(
        sublayer_connection_exact(x, _twice_reversed_mp, gain, bias, eps, norm="pre"),
        pre_exact,
        "pre-norm (exact)",
        inputs,
    )


def test_sublayer_connection_rejects_bad_input():
    ones, zeros = np.ones(2), np.zeros(2)
    for fn in (sublayer_connection, sublayer_connection_exact):
        with pytest.raises(ValueError, match="norm"):
            fn([3.0, 1.0], lambda t: t, ones, zeros, norm="sandwich")
        with pytest.raises(TypeError, match="sublayer"):
            fn([3.0, 1.0], "not callable", ones, zeros)
        with pytest.raises(ValueError, match="sublayer"):
            fn([3.0, 1.0], lambda t: t[..., :1], ones, zeros)
        with pytest.raises(ValueError, match="gain"):
            fn([3.0, 1.0], lambda t: t, np.ones(3), zeros)
        with pytest.raises(ValueError, match=r"x \+ sublayer\(x\)"):
            fn([3.0, 1.0], lambda t: -t + t[..., :1] + t[..., 1:], ones, zeros, 0.0)  # x + f(x) = (4, 4)
    with pytest.raises(ValueError, match="sublayer"):
        sublayer_connection([3.0, 1.0], lambda t: [np.nan, 0.0], ones, zeros)


# --------------------------------------------------------------------------------------------
# the feed-forward network (§3.3, Eq. 2)


def _fraction_affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> list:
    """x @ w + b on the exact rationals of float64 values (independent of mpmath)."""
    k, n = w.shape
    rows = x.reshape(-1, k)
    out = []
    for row in rows:
        out.append(
            [
                sum((Fraction(float(row[i])) * Fraction(float(w[i, c])) for i in range(k)), Fraction(0))
                + (Fraction(float(b[c])) if b is not None else 0)
                for c in range(n)
            ]
        )
    return out


def _ffn_fraction(x, w1, b1, w2, b2) -> np.ndarray:
    hidden = [[max(v, Fraction(0)) for v in row] for row in _fraction_affine(x, w1, b1)]
    d_ff, d_model = w2.shape
    out = []
    for row in hidden:
        out.append(
            [
                float(
                    sum((row[i] * Fraction(float(w2[i, c])) for i in range(d_ff)), Fraction(0)) + Fraction(float(b2[c]))
                )
                for c in range(d_model)
            ]
        )
    return np.array(out, dtype=np.float64).reshape(*x.shape[:-1], d_model)


SEED_X = np.array([1.0, -1.0])
SEED_W1 = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
SEED_W2 = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_feed_forward_seed_example():
    """Seed text §3.3: x W1 = (1, -1, -2), ReLU -> (1, 0, 0), times W2 -> (2, 0); biases zero."""
    for fn in (feed_forward, feed_forward_exact):
        got = fn(SEED_X, SEED_W1, np.zeros(3), SEED_W2, np.zeros(2))
        assert_exact_equal(got, np.array([2.0, 0.0]), fn.__name__, "seed example")


def test_feed_forward_relu_acts_before_w2_and_biases_enter_where_eq2_puts_them():
    """b1 = (0, 2, 0) lifts the hidden unit -1 to 1 (ReLU then keeps it): (1, 1, 0) W2 = (2, 1);
    b2 = (0.5, -0.5) is added after W2: (2.5, 0.5). Without the ReLU the answer would be (0, -2)."""
    for fn in (feed_forward, feed_forward_exact):
        got = fn(SEED_X, SEED_W1, np.array([0.0, 2.0, 0.0]), SEED_W2, np.array([0.5, -0.5]))
        assert_exact_equal(got, np.array([2.5, 0.5]), fn.__name__, "biases")


@st.composite
def ffn_inputs(draw):
    batch = draw(BATCHES)
    d_model, d_ff = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    # three factors multiply: scale^3 * 1e9 stays finite, and 2^-340 reaches the subnormal range
    scale = draw(st.sampled_from([2.0**-340, 2.0**-20, 1.0, 1.0, 2.0**20, 2.0**300]))

    def arr(shape):
        return draw(hnp.arrays(np.float64, shape, elements=_floats())) * scale

    return arr((*batch, d_model)), arr((d_model, d_ff)), arr((d_ff,)), arr((d_ff, d_model)), arr((d_model,))


def ffn_fast_bound(x, w1, b1, w2, b2) -> np.ndarray:
    """E for Eq. (2) in longdouble. First layer: a dot product of length d_model plus b1 has
    |h_hat_k - h_k| <= H_k := gamma_{d_model+1} (|x| |W1| + |b1|)_k; ReLU is 1-Lipschitz. Second:
    |y_hat_c - y_c| <= sum_k H_k |W2_kc| + gamma_{d_ff+1} (sum_k (relu(h)_k + H_k) |W2_kc| + |b2_c|)."""
    d_model, d_ff = w1.shape
    with mpmath.workdps(40):
        absx, aw1, ab1, aw2, ab2 = (np.vectorize(abs, otypes=[object])(to_mp(a)) for a in (x, w1, b1, w2, b2))
        hidden = np.vectorize(lambda v: max(v, 0), otypes=[object])(_affine_mp(to_mp(x), to_mp(w1), to_mp(b1)))
        big_h = gamma(d_model + 1) * _affine_mp(absx, aw1, ab1)
        return _affine_mp(big_h, aw2, None) + gamma(d_ff + 1) * _affine_mp(hidden + big_h, aw2, ab2)


@given(ffn_inputs())
def test_feed_forward_fast_tier_matches_exact_tier(args):
    x, w1, b1, w2, b2 = args
    with mpmath.workdps(HIGH_DPS):
        hidden = np.vectorize(lambda v: max(v, 0), otypes=[object])(_affine_mp(to_mp(x), to_mp(w1), to_mp(b1)))
        true_y = _affine_mp(hidden, to_mp(w2), to_mp(b2))  # exact (EXACT_PREC bits)
    assert_sandwiched(
        feed_forward(*args),
        true_y,
        ffn_fast_bound(*args),
        "feed_forward (§3.3, Eq. 2)",
        f"x={x.tolist()!r}, w1={w1.tolist()!r}, b1={b1.tolist()!r}, w2={w2.tolist()!r}, b2={b2.tolist()!r}",
    )


@settings(max_examples=20)
@given(ffn_inputs())
def test_feed_forward_exact_tier_is_exact_rational_arithmetic(args):
    """Eq. (2) on the exact rationals (fractions.Fraction), rounded by CPython's correctly rounded
    float(Fraction): the exact tier must agree bit for bit; and again at HIGH_DPS."""
    x = args[0]
    inputs = ", ".join(f"{n}={a.tolist()!r}" for n, a in zip(("x", "w1", "b1", "w2", "b2"), args))
    got = feed_forward_exact(*args)
    assert_exact_equal(
        got, _ffn_fraction(*args) if x.size else np.zeros(got.shape), "feed_forward_exact vs Fraction", inputs
    )
    assert_exact_equal(feed_forward_exact(*args, dps=HIGH_DPS), got, "feed_forward_exact at HIGH_DPS", inputs)


def test_feed_forward_fast_tier_at_model_width():
    rng = np.random.default_rng(11)
    x, w1, b1 = rng.normal(size=(2, 64)), rng.normal(size=(64, 256)) / 8, rng.normal(size=256)
    w2, b2 = rng.normal(size=(256, 64)) / 16, rng.normal(size=64)
    with mpmath.workdps(HIGH_DPS):
        hidden = np.vectorize(lambda v: max(v, 0), otypes=[object])(_affine_mp(to_mp(x), to_mp(w1), to_mp(b1)))
        true_y = _affine_mp(hidden, to_mp(w2), to_mp(b2))
    assert_sandwiched(
        feed_forward(x, w1, b1, w2, b2),
        true_y,
        ffn_fast_bound(x, w1, b1, w2, b2),
        "feed_forward d=64, d_ff=256",
        "seeded",
    )


@pytest.mark.parametrize(
    ("shapes", "needle"),
    [
        (((2,), (3, 4), (4,), (4, 2), (2,)), "w1"),  # x / w1 mismatch on d_model
        (((2,), (2, 4), (3,), (4, 2), (2,)), "b1"),
        (((2,), (2, 4), (4,), (4, 3), (2,)), "w2"),
        (((2,), (2, 4), (4,), (3, 2), (2,)), "w2"),
        (((2,), (2, 4), (4,), (4, 2), (3,)), "b2"),
        (((2,), (8,), (4,), (4, 2), (2,)), "w1"),
        (((), (2, 4), (4,), (4, 2), (2,)), "x"),
    ],
)
def test_feed_forward_rejects_shape_mismatch(shapes, needle):
    args = [np.ones(s) for s in shapes]
    for fn in (feed_forward, feed_forward_exact):
        with pytest.raises(ValueError, match=needle):
            fn(*args)


def test_feed_forward_rejects_non_finite_input():
    for fn in (feed_forward, feed_forward_exact):
        with pytest.raises(ValueError, match="w2"):
            fn(SEED_X, SEED_W1, np.zeros(3), np.where(SEED_W2 == 2, np.inf, SEED_W2), np.zeros(2))
        with pytest.raises(ValueError, match="x"):
            fn([np.nan, 1.0], SEED_W1, np.zeros(3), SEED_W2, np.zeros(2))


# --------------------------------------------------------------------------------------------
# embeddings (× sqrt(d_model)) and the tied pre-softmax projection (§3.4)


def test_embedding_lookup_returns_rows_times_sqrt_d_model():
    """d_model = 4: sqrt(4) = 2 exactly, so the output is exactly 2 E[tokens] (a gather check);
    d_model = 512 (the seeds' sqrt(512) ~ 22.6): E[t] * 16 sqrt(2), correctly rounded."""
    emb = np.arange(20.0).reshape(5, 4) - 7.5
    tokens = np.array([[4, 0, 2], [1, 1, 3]])
    for fn in (embedding_lookup, embedding_lookup_exact):
        assert_exact_equal(fn(tokens, emb), 2 * emb[tokens], fn.__name__, "d_model=4")
        assert_exact_equal(fn(3, emb), 2 * emb[3], f"{fn.__name__} scalar token", "d_model=4")
    emb512 = np.random.default_rng(3).normal(size=(6, 512))
    with mpmath.workdps(60):
        root = 16 * mpmath.sqrt(2)
        expected = np.array([[round_to_float64(mpmath.mpf(float(v)) * root) for v in emb512[t]] for t in (5, 0)])
    assert_exact_equal(embedding_lookup_exact([5, 0], emb512), expected, "embedding_lookup_exact d=512", "")
    assert round(math.sqrt(512), 1) == 22.6


@st.composite
def embedding_inputs(draw):
    vocab, d = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    emb = draw(hnp.arrays(np.float64, (vocab, d), elements=_floats())) * draw(SCALES)
    tokens = draw(hnp.arrays(np.int64, draw(BATCHES), elements=st.integers(0, vocab - 1)))
    return tokens, emb


@given(embedding_inputs())
def test_embedding_lookup_fast_tier_matches_exact_tier(args):
    """Fast: sqrt(d) in longdouble (correctly rounded) and one product: E = gamma_2 |y|."""
    tokens, emb = args
    d = emb.shape[1]
    with mpmath.workdps(HIGH_DPS):
        true_y = to_mp(emb[tokens]) * mpmath.sqrt(d)
        bound = np.vectorize(lambda v: (gamma(2) + TRUTH_SLACK) * abs(v), otypes=[object])(true_y)
    inputs = f"tokens={tokens.tolist()!r}, embedding={emb.tolist()!r}"
    assert_sandwiched(embedding_lookup(tokens, emb), true_y, bound, "embedding_lookup (§3.4)", inputs)
    exact = embedding_lookup_exact(tokens, emb)
    assert_exact_equal(exact, rounded_truth(lambda: to_mp(emb[tokens]) * mpmath.sqrt(d)), "exact tier vs truth", inputs)
    assert_exact_equal(
        embedding_lookup_exact(tokens, emb, dps=HIGH_DPS), exact, "embedding_lookup_exact at HIGH_DPS", inputs
    )


def test_output_logits_is_tied_and_has_no_sqrt_factor():
    """The Choice: logits = x E^T with the embedding matrix itself. With E = I (d = 4), the
    embedding of token t divided back by sqrt(4) = 2 projects to onehot(t) exactly; a sqrt(d_model)
    factor on the output side would give 2 onehot(t)."""
    emb = np.eye(4)
    for t in range(4):
        x = embedding_lookup(t, emb) / 2.0
        for fn in (output_logits, output_logits_exact):
            assert_exact_equal(fn(x, emb), np.eye(4)[t], fn.__name__, f"token {t}")


@st.composite
def logits_inputs(draw):
    vocab, d = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    scale = draw(SCALES)
    emb = draw(hnp.arrays(np.float64, (vocab, d), elements=_floats())) * scale
    x = draw(hnp.arrays(np.float64, (*draw(BATCHES), d), elements=_floats())) / scale
    return x, emb


@given(logits_inputs())
def test_output_logits_fast_tier_matches_exact_tier_and_fractions(args):
    """Fast: a longdouble dot product of length d_model: E = gamma_d (|x| |E|^T). Exact tier vs
    Fraction arithmetic bit for bit, and unchanged at HIGH_DPS."""
    x, emb = args
    d = emb.shape[1]
    inputs = f"x={x.tolist()!r}, embedding={emb.tolist()!r}"
    with mpmath.workdps(HIGH_DPS):
        true_y = _affine_mp(to_mp(x), to_mp(emb.T), None)
        bound = gamma(d) * _affine_mp(
            np.vectorize(abs, otypes=[object])(to_mp(x)), np.vectorize(abs, otypes=[object])(to_mp(emb.T)), None
        )
    assert_sandwiched(output_logits(x, emb), true_y, bound, "output_logits (§3.4)", inputs)
    exact = output_logits_exact(x, emb)
    fractions = np.array([[float(v) for v in row] for row in _fraction_affine(x, emb.T, None)]).reshape(exact.shape)
    assert_exact_equal(exact, fractions, "output_logits_exact vs Fraction", inputs)
    assert_exact_equal(output_logits_exact(x, emb, dps=HIGH_DPS), exact, "output_logits_exact at HIGH_DPS", inputs)


@pytest.mark.parametrize(
    ("tokens", "error", "needle"),
    [
        ([0, 5], ValueError, "tokens: id 5 .*vocab = 5"),
        ([-1], ValueError, "tokens: id -1"),
        ([0.0, 1.0], TypeError, "tokens: expected integer"),
        (np.array([True]), TypeError, "tokens"),
        ("a", TypeError, "tokens"),
    ],
)
def test_embedding_lookup_rejects_bad_tokens(tokens, error, needle):
    emb = np.ones((5, 4))
    for fn in (embedding_lookup, embedding_lookup_exact):
        with pytest.raises(error, match=needle):
            fn(tokens, emb)


def test_embedding_and_projection_reject_bad_matrices():
    for fn in (embedding_lookup, embedding_lookup_exact):
        with pytest.raises(ValueError, match="embedding"):
            fn([0], np.ones(4))
        with pytest.raises(ValueError, match="embedding"):
            fn([0], np.full((2, 2), np.nan))
    for fn in (output_logits, output_logits_exact):
        with pytest.raises(ValueError, match="d_model"):
            fn(np.ones(3), np.ones((5, 4)))
        with pytest.raises(ValueError, match="x"):
            fn([np.inf, 0.0], np.ones((5, 2)))
