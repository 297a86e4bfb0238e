"""The oracle for §3.2 (softmax, Eq. (1), masks, multi-head attention) is right.

Three kinds of evidence:
1. the fast tier agrees with the exact tier within a derived bound (property-based);
2. the exact tier does not change when recomputed at a much higher precision;
3. independent checks: closed forms (equal scores -> mean of values, computed with Fractions),
   masked keys == removed keys, h = 1 MHA with identity projections == Eq. (1), scipy's softmax.

Error analysis used below (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
§3.1 for gamma_n, §3.5 for dot products):
- u = 2^-64 is the unit roundoff of the fast tier's longdouble; U = 2^-53 that of float64;
  gamma_n(u) = n u / (1 - n u).
- Both tiers round their final result to float64 once, each within U|y| (+ 2^-1075 absolute in the
  subnormal range) of what they rounded. So |fast - exact| <= 2 U |y| + 2^-1074 + E, where E bounds
  the fast tier's longdouble error before that rounding. E is derived per equation below.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.reference._exact import HIGH_DPS
from aiayn.reference.attention import (
    causal_mask,
    multi_head_attention,
    multi_head_attention_exact,
    padding_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_exact,
    softmax,
    softmax_exact,
)

u = 2.0**-64  # longdouble unit roundoff (x87 extended, 64-bit significand)
U = 2.0**-53  # float64 unit roundoff
TINY = 2.0**-1074  # float64 subnormal spacing


def gamma(n: int, unit: float = u) -> float:
    return n * unit / (1 - n * unit)


def _check_within(got: np.ndarray, expected: np.ndarray, bound: np.ndarray, what: str, inputs: str) -> None:
    """Assert |got - expected| <= bound elementwise (NaN must match NaN), with a replayable message."""
    nan_got, nan_exp = np.isnan(got), np.isnan(expected)
    assert np.array_equal(nan_got, nan_exp), (
        f"{what}: NaN pattern differs; got NaN at {np.argwhere(nan_got).tolist()}, expected at "
        f"{np.argwhere(nan_exp).tolist()}; {inputs}"
    )
    err = np.where(nan_exp, 0.0, np.abs(got - expected))
    ratio = np.where(nan_exp, 0.0, err / bound)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape) if ratio.size else ()
    assert not ratio.size or ratio[worst] <= 1.0, (
        f"{what}: |fast - exact| = {err[worst]:.3e} at {tuple(int(i) for i in worst)} is {ratio[worst]:.2f}x the "
        f"derived bound {bound[worst]:.3e} (fast {got[worst]!r}, exact {expected[worst]!r}); {inputs}"
    )


# --------------------------------------------------------------------------------------------
# strategies: small shapes (the exact tier is mpmath), magnitudes that matter


def _floats(scale: float):
    return st.floats(min_value=-scale, max_value=scale, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@st.composite
def logits(draw, max_n: int = 7):
    """A logit row family: random, near-constant (tiny spread), or huge (|x| up to 1e4)."""
    n = draw(st.integers(1, max_n))
    rows = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["random", "near_constant", "large"]))
    if kind == "near_constant":
        base = draw(_floats(100.0))
        x = base + draw(hnp.arrays(np.float64, (rows, n), elements=_floats(1e-12)))
    else:
        x = draw(hnp.arrays(np.float64, (rows, n), elements=_floats(1e4 if kind == "large" else 10.0)))
    return x


# --------------------------------------------------------------------------------------------
# softmax


def softmax_fast_error(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """E for the fast softmax (longdouble), per element, relative to p.

    In longdouble: z_j - m is rounded (absolute error u|z_j - m|, which exp turns into relative
    error u|z_j - m|); exp adds <= 2u; the sum of n terms gamma_n; the division u. So
    |p_hat_j - p_j| <= p_j ((|z_j - m| + 4) u + gamma_n) + gamma_n-weighted error of the sum; the
    sum's relative error is sum_l p_l (|z_l - m| + 2) u <= (n/e + 2n) u, because p_l <= e^-(m - z_l)
    and x e^-x <= 1/e.
    """
    n = x.shape[-1]
    gap = np.max(x, axis=-1, keepdims=True) - x
    return p * ((gap + 4) * u + gamma(n) + (n / math.e + 2 * n) * u)


@given(logits())
def test_softmax_fast_tier_matches_exact_tier(x):
    exact = softmax_exact(x)
    bound = 2 * U * np.abs(exact) + TINY + softmax_fast_error(x, exact)
    _check_within(softmax(x), exact, bound, "softmax (§3.2.1)", f"x={x.tolist()!r}")


@settings(max_examples=15)
@given(logits(max_n=5))
def test_softmax_exact_tier_is_stable_at_higher_precision(x):
    assert np.array_equal(softmax_exact(x), softmax_exact(x, dps=HIGH_DPS)), f"x={x.tolist()!r}"


def test_softmax_agrees_with_scipy():
    """scipy.special.softmax (float64) as an independent implementation.

    scipy computes exp(x - max) / sum in float64: by the analysis of softmax_fast_error with
    unit roundoff U, |p_scipy - p| <= p ((gap + 4) U + gamma_n(U) + (n/e + 2n) U); add ours (2U p).
    """
    special = pytest.importorskip("scipy.special")
    rng = np.random.default_rng(20170612)
    for n in (1, 2, 7, 64, 512):
        x = rng.normal(scale=5.0, size=(3, n))
        ours = softmax(x)
        gap = x.max(axis=-1, keepdims=True) - x
        bound = ours * ((gap + 4) * U + gamma(n, U) + (n / math.e + 2 * n) * U + 2 * U) + TINY
        _check_within(special.softmax(x, axis=-1), ours, bound, "softmax vs scipy", f"n={n}")


def test_softmax_axis_and_masked_scores():
    x = np.array([[0.0, 1.0], [2.0, 3.0]])
    # along axis 0 each column is softmax((0, 2)) or softmax((1, 3)): both (1/(1+e^2), e^2/(1+e^2))
    col = np.array([1 / (1 + math.e**2), math.e**2 / (1 + math.e**2)])
    np.testing.assert_allclose(softmax(x, axis=0), np.stack([col, col], axis=1), rtol=4 * U)
    np.testing.assert_array_equal(softmax_exact(x, axis=0), softmax_exact(x.T).T)
    # -inf is a masked score: weight exactly 0; an all -inf row is undefined (NaN)
    p = softmax_exact([[0.0, -np.inf], [-np.inf, -np.inf]])
    assert p[0].tolist() == [1.0, 0.0] and np.all(np.isnan(p[1]))
    assert np.array_equal(softmax([[0.0, -np.inf]]), [[1.0, 0.0]])


def test_softmax_rows_sum_to_one_exactly_in_the_exact_tier_for_two_entries():
    # p and 1 - p for two entries: e.g. (ln 3, 0) gives (3/4, 1/4) exactly.
    assert softmax_exact([math.log(3), 0.0]).tolist() == pytest.approx([0.75, 0.25], abs=2 * U)


def test_softmax_over_an_empty_axis_is_rejected_and_empty_batches_are_kept():
    """Choice: a softmax over no entries is no distribution (it cannot sum to 1), so both tiers raise
    a one-line ValueError naming x, the axis and the shape; an empty batch dimension is fine."""
    for fn in (softmax, softmax_exact):
        with pytest.raises(
            ValueError, match=r"^x: softmax needs at least one element along axis -1, got shape \(3, 0\)"
        ):
            fn(np.zeros((3, 0)))
        with pytest.raises(ValueError, match=r"along axis 0, got shape \(0, 2\)") as info:
            fn(np.zeros((0, 2)), axis=0)
        assert "\n" not in str(info.value), f"{fn.__name__}: {info.value}"
        out = fn(np.zeros((0, 2)))
        assert out.shape == (0, 2) and out.dtype == np.float64, f"{fn.__name__}: {out!r}"


# --------------------------------------------------------------------------------------------
# scaled dot-product attention, Eq. (1)


@st.composite
def attention_inputs(draw, max_n: int = 5, max_d: int = 5):
    batch = draw(st.sampled_from([(), (2,), (2, 1)]))
    n_q, n_k = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    d_k, d_v = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    scale = draw(st.sampled_from([1.0, 4.0, 30.0]))  # 30: scores up to ~ 900 sqrt(d_k): saturated rows
    el = _floats(scale)
    q = draw(hnp.arrays(np.float64, (*batch, n_q, d_k), elements=el))
    k = draw(hnp.arrays(np.float64, (*batch, n_k, d_k), elements=el))
    v = draw(hnp.arrays(np.float64, (*batch, n_k, d_v), elements=_floats(10.0)))
    mask_kind = draw(st.sampled_from(["none", "causal", "random"]))
    mask = None
    if mask_kind == "causal" and n_k >= n_q:
        mask = causal_mask(n_q, n_k)
    elif mask_kind == "random":
        mask = draw(hnp.arrays(np.bool_, (*batch, n_q, n_k)))
    return q, k, v, mask


def attention_fast_error(q, k, v, mask, exact):
    """E for the fast Eq. (1), per output element.

    Scores: a longdouble dot product of length d_k, then a division by the rounded sqrt(d_k):
    |s_hat - s| <= delta = gamma_{d_k + 2} (|q||k|^T) / sqrt(d_k).
    Softmax of perturbed scores: softmax(s + e)_j / softmax(s)_j lies in [e^-2D, e^2D] with
    D = max_l delta_l over the row's visible keys, so the weights move by <= (e^{2D} - 1) P.
    The longdouble softmax itself: see softmax_fast_error (its gap term, weighted by p_j, is
    bounded by p_j gap_j <= 1/e per element, so it adds <= (n_k/e) u max|v| to the output).
    The product P V: gamma_{n_k} P|V|.
    Total: E = (e^{2D} - 1 + gamma_{n_k} + gamma(n_k) ... ) P|V| + u (n_k/e) max|v|.
    """
    d_k, n_k = q.shape[-1], k.shape[-2]
    qk_abs = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)  # (..., n_q, n_k)
    delta = gamma(d_k + 2) * qk_abs / math.sqrt(d_k) * (1 + 1e-12)
    if mask is not None:
        delta = np.where(mask, delta, 0.0)
    big_d = np.max(delta, axis=-1, keepdims=True)  # (..., n_q, 1)
    # P|V| <= max_j |v_j| per column (P is a convex combination); use that upper bound.
    v_max = np.max(np.abs(v), axis=-2, keepdims=True)  # (..., 1, d_v)
    rel = np.expm1(2 * big_d) + gamma(n_k) + gamma(n_k) + (n_k / math.e + 2 * n_k + 4) * u
    return rel * v_max + u * (n_k / math.e) * v_max


@given(attention_inputs())
def test_attention_fast_tier_matches_exact_tier(inputs):
    q, k, v, mask = inputs
    for policy in ("nan", "zeros", "uniform"):
        exact = scaled_dot_product_attention_exact(q, k, v, mask, fully_masked=policy)
        fast = scaled_dot_product_attention(q, k, v, mask, fully_masked=policy)
        bound = 2 * U * np.abs(np.nan_to_num(exact)) + TINY + attention_fast_error(q, k, v, mask, exact)
        _check_within(
            fast,
            exact,
            bound,
            "scaled_dot_product_attention (§3.2.1, Eq. 1)",
            f"shapes q{q.shape} k{k.shape} v{v.shape}, mask={None if mask is None else mask.tolist()}, policy={policy}",
        )


@settings(max_examples=10)
@given(attention_inputs(max_n=3, max_d=3))
def test_attention_exact_tier_is_stable_at_higher_precision(inputs):
    q, k, v, mask = inputs
    a = scaled_dot_product_attention_exact(q, k, v, mask)
    b = scaled_dot_product_attention_exact(q, k, v, mask, dps=HIGH_DPS)
    assert np.array_equal(a, b, equal_nan=True), f"changed at {np.argwhere(a != b).tolist()}"


@settings(max_examples=20)
@given(
    n_k=st.sampled_from([1, 2, 4, 8]),
    d_v=st.integers(1, 4),
    data=st.data(),
)
def test_equal_scores_give_the_mean_of_the_values(n_k, d_v, data):
    """Identical keys give equal scores, so Eq. (1) returns the plain mean of the values.

    The mean is computed independently with exact Fractions and rounded once by CPython;
    n_k is a power of two, so the exact tier's 1/n_k weights are exact and the two agree bit for bit.
    """
    q = data.draw(hnp.arrays(np.float64, (2, 3), elements=_floats(5.0)))
    key_row = data.draw(hnp.arrays(np.float64, (3,), elements=_floats(5.0)))
    k = np.tile(key_row, (n_k, 1))
    v = data.draw(hnp.arrays(np.float64, (n_k, d_v), elements=_floats(100.0)))
    expected = np.array([[float(sum(Fraction(x) for x in v[:, c]) / n_k) for c in range(d_v)]] * 2)
    got = scaled_dot_product_attention_exact(q, k, v)
    assert np.array_equal(got, expected), f"got {got.tolist()}, mean of values {expected.tolist()}, v={v.tolist()}"


@settings(max_examples=20)
@given(attention_inputs(max_n=4, max_d=3))
def test_masked_keys_are_the_same_as_removed_keys(inputs):
    """Masking key j out equals deleting key j and value j (exact tier: bit for bit)."""
    q, k, v, _ = inputs
    n_k = k.shape[-2]
    keep = np.arange(n_k) % 2 == 0  # drop every odd key; key 0 always stays
    masked = scaled_dot_product_attention_exact(q, k, v, keep[None, :])
    removed = scaled_dot_product_attention_exact(q, k[..., keep, :], v[..., keep, :])
    assert np.array_equal(masked, removed), (
        f"shapes q{q.shape} k{k.shape}: masked {masked.tolist()} vs removed {removed.tolist()}"
    )


def test_fully_masked_rows_follow_the_policy():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    mask = np.array([[True, False, True, False], [False, False, False, False]])
    for fn in (scaled_dot_product_attention, scaled_dot_product_attention_exact):
        nan_out = fn(q, k, v, mask)
        zero_out = fn(q, k, v, mask, fully_masked="zeros")
        uniform_out = fn(q, k, v, mask, fully_masked="uniform")
        assert np.all(np.isnan(nan_out[1])) and np.all(np.isfinite(nan_out[0])), fn.__name__
        assert zero_out[1].tolist() == [0.0, 0.0], fn.__name__
        assert np.array_equal(zero_out[0], nan_out[0]) and np.array_equal(uniform_out[0], nan_out[0]), fn.__name__
        # "uniform": each of the 4 keys weighs 1/4, so the row is the mean of the values (one rounding off at most)
        assert np.allclose(uniform_out[1], v.mean(axis=0), rtol=4 * 2.0**-53, atol=0), fn.__name__
    # the default is "nan": what -inf masking gives
    assert np.all(np.isnan(scaled_dot_product_attention(q, k, v, mask)[1]))


def test_huge_values_at_masked_positions_change_nothing():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    mask = np.array([True, True, False, True, False])
    k2, v2 = k.copy(), v.copy()
    k2[~mask] = 1e300
    v2[~mask] = -1e300
    for fn in (scaled_dot_product_attention, scaled_dot_product_attention_exact):
        assert np.array_equal(fn(q, k, v, mask), fn(q, k2, v2, mask)), fn.__name__


# --------------------------------------------------------------------------------------------
# masks, §3.2.3


def test_causal_mask_blocks_future_positions():
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # end-aligned when queries are the last n_q positions (incremental decoding)
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    assert causal_mask(2, 3).tolist() == [[True, True, False], [True, True, True]]


def test_causal_output_at_i_ignores_inputs_after_i():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 3))
    k2, v2 = k.copy(), v.copy()
    k2[3:], v2[3:] = rng.normal(size=(2, 4)), rng.normal(size=(2, 3))
    a = scaled_dot_product_attention_exact(q, k, v, causal_mask(5, 5))
    b = scaled_dot_product_attention_exact(q, k2, v2, causal_mask(5, 5))
    assert np.array_equal(a[:3], b[:3]) and not np.array_equal(a[3:], b[3:])


def test_padding_mask_hides_keys_at_and_beyond_each_length():
    m = padding_mask(np.array([2, 0, 3]), 3)
    assert m.shape == (3, 1, 3)
    assert m[:, 0].tolist() == [[True, True, False], [False, False, False], [True, True, True]]


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2


@st.composite
def mha_inputs(draw):
    h = draw(st.integers(1, 3))
    d_k, d_v = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    d_model = draw(st.integers(1, 4))
    n_q, n_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch = draw(st.sampled_from([(), (2,)]))
    el = _floats(3.0)
    arr = lambda shape: draw(hnp.arrays(np.float64, shape, elements=el))  # noqa: E731
    params = {
        "w_q": arr((d_model, h * d_k)),
        "w_k": arr((d_model, h * d_k)),
        "w_v": arr((d_model, h * d_v)),
        "w_o": arr((h * d_v, d_model)),
    }
    if draw(st.booleans()):
        params.update(b_q=arr((h * d_k,)), b_k=arr((h * d_k,)), b_v=arr((h * d_v,)), b_o=arr((d_model,)))
    query, key, value = arr((*batch, n_q, d_model)), arr((*batch, n_k, d_model)), arr((*batch, n_k, d_model))
    mask = draw(st.none() | hnp.arrays(np.bool_, (n_q, n_k)))
    return query, key, value, params, h, mask


def mha_fast_error(query, key, value, params, h, mask):
    """E for the fast MHA (longdouble end to end), per output element.

    Projections x W + b of width m: |err| <= gamma_{m+1} (|x||W| + |b|) =: e_X, and |X| <= |x||W| + |b|
    =: A_X. Per head, scores s = q k^T / sqrt(d_k) then move by
    delta <= (e_Q A_K^T + A_Q e_K^T + e_Q e_K^T + gamma_{d_k+2} A_Q A_K^T) / sqrt(d_k);
    the head output H = P V moves by (e^{2D} - 1 + 2 gamma_{n_k} + (n_k/e + 2 n_k + 4) u) max|V|
    + max e_V + u (n_k/e) max|V| (as in attention_fast_error, plus the error already in V).
    The output projection adds |dH||W_o| + gamma_{h d_v + 1} (|H||W_o| + |b_o|), with |H| <= max|V|.
    """
    zero = lambda n: np.zeros(n)  # noqa: E731

    def proj(x, w, b):
        a = np.abs(x) @ np.abs(w) + np.abs(b)
        return a, gamma(w.shape[0] + 1) * a

    wq, wk, wv, wo = (params[n] for n in ("w_q", "w_k", "w_v", "w_o"))
    a_q, e_q = proj(query, wq, params.get("b_q", zero(wq.shape[1])))
    a_k, e_k = proj(key, wk, params.get("b_k", zero(wk.shape[1])))
    a_v, e_v = proj(value, wv, params.get("b_v", zero(wv.shape[1])))
    d_k, d_v, n_k = wq.shape[1] // h, wv.shape[1] // h, key.shape[-2]
    d_h = np.zeros((*np.broadcast_shapes(query.shape[:-2], key.shape[:-2]), query.shape[-2], h * d_v))
    h_max = np.zeros_like(d_h)
    for i in range(h):
        cq = ck = slice(i * d_k, (i + 1) * d_k)
        cv = slice(i * d_v, (i + 1) * d_v)
        t = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
        delta = (
            e_q[..., cq] @ t(a_k[..., ck])
            + a_q[..., cq] @ t(e_k[..., ck])
            + e_q[..., cq] @ t(e_k[..., ck])
            + gamma(d_k + 2) * a_q[..., cq] @ t(a_k[..., ck])
        ) / math.sqrt(d_k)
        if mask is not None:
            delta = np.where(mask, delta, 0.0)
        big_d = np.max(delta, axis=-1, keepdims=True)
        v_max = np.max(a_v[..., cv], axis=-2, keepdims=True)
        ev_max = np.max(e_v[..., cv], axis=-2, keepdims=True)
        rel = np.expm1(2 * big_d) + 2 * gamma(n_k) + (n_k / math.e + 2 * n_k + 4) * u
        d_h[..., cv] = rel * v_max + ev_max + u * (n_k / math.e) * v_max
        h_max[..., cv] = v_max + ev_max
    b_o = np.abs(params.get("b_o", zero(wo.shape[1])))
    return (d_h @ np.abs(wo) + gamma(h * d_v + 1) * (h_max @ np.abs(wo) + b_o)) * (1 + 1e-9)


@settings(max_examples=30)
@given(mha_inputs())
def test_mha_fast_tier_matches_exact_tier(inputs):
    query, key, value, params, h, mask = inputs
    exact = multi_head_attention_exact(query, key, value, params, h, mask)
    fast = multi_head_attention(query, key, value, params, h, mask)
    bound = 2 * U * np.abs(exact) + TINY + mha_fast_error(query, key, value, params, h, mask)
    _check_within(
        fast,
        exact,
        bound,
        "multi_head_attention (§3.2.2)",
        f"h={h}, shapes query{query.shape} key{key.shape}, params { {n: p.shape for n, p in params.items()} }",
    )


@settings(max_examples=8)
@given(mha_inputs())
def test_mha_exact_tier_is_stable_at_higher_precision(inputs):
    query, key, value, params, h, mask = inputs
    a = multi_head_attention_exact(query, key, value, params, h, mask)
    b = multi_head_attention_exact(query, key, value, params, h, mask, dps=HIGH_DPS)
    assert np.array_equal(a, b, equal_nan=True)


def test_one_head_with_identity_projections_is_equation_1():
    rng = np.random.default_rng(4)
    d = 3
    x, mem = rng.normal(size=(4, d)), rng.normal(size=(5, d))
    eye = np.eye(d)
    params = {"w_q": eye, "w_k": eye, "w_v": eye, "w_o": eye}
    mask = rng.random((4, 5)) < 0.7
    mask[:, 0] = True
    assert np.array_equal(
        multi_head_attention_exact(x, mem, mem, params, 1, mask), scaled_dot_product_attention_exact(x, mem, mem, mask)
    )
    assert np.array_equal(
        multi_head_attention(x, mem, mem, params, 1, mask), scaled_dot_product_attention(x, mem, mem, mask)
    )


def test_heads_use_their_own_column_blocks():
    """Zeroing head 1's block of w_v and w_o leaves head 0's contribution: the output equals a one-head MHA."""
    rng = np.random.default_rng(5)
    d_model, d_k = 4, 2
    p = {n: rng.normal(size=(d_model, 2 * d_k)) for n in ("w_q", "w_k", "w_v")}
    p["w_o"] = rng.normal(size=(2 * d_k, d_model))
    p["w_o"][d_k:] = 0.0  # head 1 contributes nothing
    x = rng.normal(size=(3, d_model))
    head0 = {"w_q": p["w_q"][:, :d_k], "w_k": p["w_k"][:, :d_k], "w_v": p["w_v"][:, :d_k], "w_o": p["w_o"][:d_k]}
    assert np.array_equal(multi_head_attention_exact(x, x, x, p, 2), multi_head_attention_exact(x, x, x, head0, 1))


def test_mha_output_shapes_follow_the_paper():
    """§3.2.2 with the base model: n=10, d_model=512, h=8 -> each head 10x64, output 10x512."""
    rng = np.random.default_rng(6)
    d_model, h = 512, 8
    p = {n: rng.normal(size=(d_model, d_model)) / 23 for n in ("w_q", "w_k", "w_v", "w_o")}
    x = rng.normal(size=(10, d_model))
    assert multi_head_attention(x, x, x, p, h).shape == (10, 512)


# --------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: scaled_dot_product_attention(np.ones((2, 3)), np.ones((4, 2)), np.ones((4, 1))), ValueError, "d_k"),
        (
            lambda: scaled_dot_product_attention(np.ones((2, 0)), np.ones((4, 0)), np.ones((4, 1))),
            ValueError,
            "d_k must be >= 1",
        ),
        (lambda: scaled_dot_product_attention(np.ones((2, 3)), np.ones((4, 3)), np.ones((5, 1))), ValueError, "n_k"),
        (
            lambda: scaled_dot_product_attention(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)), np.ones((2, 4))),
            TypeError,
            "boolean",
        ),
        (
            lambda: scaled_dot_product_attention(
                np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)), np.ones((3, 4), bool)
            ),
            ValueError,
            "broadcast",
        ),
        (
            lambda: scaled_dot_product_attention(np.array([[np.nan]]), np.ones((1, 1)), np.ones((1, 1))),
            ValueError,
            "q: expected finite",
        ),
        (
            lambda: scaled_dot_product_attention(
                np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), fully_masked="zero"
            ),
            ValueError,
            "fully_masked",
        ),
        (
            lambda: scaled_dot_product_attention(np.ones((2, 2, 3)), np.ones((3, 4, 3)), np.ones((3, 4, 1))),
            ValueError,
            "batch dimensions",
        ),
        (lambda: softmax(np.array([1.0, np.inf])), ValueError, "x: expected finite"),
        (lambda: softmax(3.0), ValueError, "at least 1"),
        (lambda: causal_mask(3, 2), ValueError, "n_k >= n_q"),
        (lambda: causal_mask(0, 2), ValueError, "n_q"),
        (lambda: padding_mask(np.array([4]), 3), ValueError, "lengths"),
        (lambda: padding_mask(np.array([1.5]), 3), TypeError, "integer"),
        (
            lambda: multi_head_attention(
                np.ones((2, 4)),
                np.ones((2, 4)),
                np.ones((2, 4)),
                {n: np.ones((4, 4)) for n in ("w_q", "w_k", "w_v", "w_o")},
                3,
            ),
            ValueError,
            "num_heads",
        ),
        (
            lambda: multi_head_attention(
                np.ones((2, 4)),
                np.ones((2, 4)),
                np.ones((2, 4)),
                {n: np.ones((4, 4)) for n in ("w_q", "w_k", "w_v")},
                2,
            ),
            ValueError,
            "w_o",
        ),
        (
            lambda: multi_head_attention(
                np.ones((2, 5)),
                np.ones((2, 4)),
                np.ones((2, 4)),
                {n: np.ones((4, 4)) for n in ("w_q", "w_k", "w_v", "w_o")},
                2,
            ),
            ValueError,
            "d_model",
        ),
        (
            lambda: multi_head_attention(
                np.ones((2, 4)),
                np.ones((2, 4)),
                np.ones((2, 4)),
                {**{n: np.ones((4, 4)) for n in ("w_q", "w_k", "w_v", "w_o")}, "b_q": np.ones(3)},
                2,
            ),
            ValueError,
            "b_q",
        ),
        (
            lambda: multi_head_attention(
                np.ones((2, 4)),
                np.ones((2, 4)),
                np.ones((2, 4)),
                {n: np.ones((4, 4)) for n in ("w_q", "w_k", "w_v", "w_o")},
                0,
            ),
            ValueError,
            "num_heads",
        ),
    ],
)
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error, match=words):
        call()
