"""The oracle for §5.3 (Eq. 3, the learning rate) and §5.4 (label smoothing, the smoothed
cross-entropy and its minimum) is right.

Evidence:
1. the fast tier agrees with the true value within a derived bound (property-based);
2. the exact tier does not change when recomputed at a much higher precision, and equals the
   correctly rounded value of an independent evaluation (Fractions for the rational label
   smoothing; the formula written out here in mpmath otherwise);
3. closed forms: the linear rise and step^-0.5 decay (exact power-of-two ratios), the peak at
   warmup_steps, rows summing to 1, log K for uniform logits, scipy's log_softmax, and the smoothed
   cross-entropy's minimum at the smoothed target equal to the target's entropy;
4. every Choice pinned; bad input gets an error naming the argument.

Comparison of the fast tier ("sandwich", as in tests/test_layers.py): the fast tier's longdouble
value is within E of the truth y and is rounded once, so its float64 result must lie in
[fl64(y - E), fl64(y + E)]. Notation: u = 2^-64 (longdouble), U = 2^-53 (float64),
gamma_n = n u / (1 - n u) (Higham, 2nd ed., §3.1). glibc's x86_64 libm-test-ulps lists at most 2
ulps for the long double exp, log and log1p; one ulp of a longdouble y is at most 2u|y|, so each
libm call adds at most LIBM = 4u relative.
"""

from __future__ import annotations

import inspect
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from _sandwich import U, assert_exact_equal, assert_sandwiched, gamma, rounded, u
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiayn.reference._exact import HIGH_DPS, round_to_float64, to_mp
from aiayn.reference.training import (
    _cross_entropy_mp,
    cross_entropy,
    cross_entropy_exact,
    label_smoothing,
    label_smoothing_exact,
    lrate,
    lrate_exact,
    smoothed_cross_entropy,
    smoothed_cross_entropy_exact,
    smoothed_target_entropy,
    smoothed_target_entropy_exact,
)

LIBM = 4 * u
TRUTH_SLACK = mpmath.mpf(10) ** (2 - HIGH_DPS)  # relative error of a truth evaluated at HIGH_DPS
# No extra input error: the default of the fast-tier bounds below that take one.
_MPF_ZERO = mpmath.mpf(0)


# --------------------------------------------------------------------------------------------
# the learning rate, §5.3, Eq. (3)


def lrate_truth(steps: np.ndarray, d_model: int, warmup: int) -> np.ndarray:
    """Eq. (3) written out independently: d^-0.5 min(s^-0.5, s w^-1.5), 0 at step 0 (the limit)."""

    def one(s: int):
        if s == 0:
            return mpmath.mpf(0)
        return mpmath.power(d_model, -0.5) * min(mpmath.power(s, -0.5), s * mpmath.power(warmup, -1.5))

    return np.array([one(int(s)) for s in steps.reshape(-1)], dtype=object).reshape(steps.shape)


@st.composite
def lrate_inputs(draw):
    d_model = draw(st.sampled_from([1, 4, 512, 1024]) | st.integers(1, 4096))
    warmup = draw(st.sampled_from([1, 2, 4000]) | st.integers(1, 100_000))
    near = st.integers(max(0, warmup - 3), warmup + 3)
    steps = draw(
        hnp.arrays(
            np.int64,
            draw(st.sampled_from([(), (3,), (2, 2)])),
            elements=near | st.integers(0, 10 * warmup) | st.integers(0, 10**12),
        )
    )
    return steps, d_model, warmup


@given(lrate_inputs())
def test_lrate_fast_tier_matches_exact_tier(args):
    """Fast: 1/sqrt(s) has relative error gamma_2; s (1 / (w sqrt(w))) gamma_4; the min of two
    values with relative errors <= gamma_4 is within gamma_4 of the true min; 1/sqrt(d) gamma_2
    and the product u: E = gamma_7 lrate. The exact tier equals the rounded independent formula."""
    steps, d_model, warmup = args
    with mpmath.workdps(HIGH_DPS):
        true_lr = lrate_truth(steps, d_model, warmup)
        bound = np.vectorize(lambda v: (gamma(7) + TRUTH_SLACK) * v, otypes=[object])(true_lr)
    inputs = f"step={steps.tolist()!r}, d_model={d_model}, warmup_steps={warmup}"
    fast = lrate(steps, d_model, warmup)
    assert np.shape(fast) == steps.shape
    assert_sandwiched(fast, true_lr, bound, "lrate (§5.3, Eq. 3)", inputs)
    exact = lrate_exact(steps, d_model, warmup)
    assert_exact_equal(
        exact,
        rounded(lambda: lrate_truth(steps, d_model, warmup)).reshape(steps.shape),
        "lrate_exact vs formula",
        inputs,
    )


@settings(max_examples=15)
@given(lrate_inputs())
def test_lrate_exact_tier_is_stable_at_higher_precision(args):
    steps, d_model, warmup = args
    assert_exact_equal(
        lrate_exact(steps, d_model, warmup),
        lrate_exact(steps, d_model, warmup, dps=HIGH_DPS),
        "lrate_exact at DEFAULT_DPS vs HIGH_DPS",
        f"{args!r}",
    )


@settings(max_examples=25)
@given(st.integers(1, 100_000), st.integers(1, 2048), st.data())
def test_lrate_rises_linearly_then_decays_as_inverse_sqrt(warmup, d_model, data):
    """For 2s <= warmup, lrate(2s) = 2 lrate(s); for s >= warmup, lrate(4s) = lrate(s) / 2. Scaling a
    value by a power of two commutes with rounding to float64 (normal range), so the exact tier's
    correctly rounded outputs obey both identities bit for bit."""
    if warmup >= 2:
        s = data.draw(st.integers(1, warmup // 2))
        lo, hi = lrate_exact([s, 2 * s], d_model, warmup)
        assert hi == 2 * lo, f"linear rise: lrate({2 * s}) = {hi!r}, 2 lrate({s}) = {2 * lo!r}; d={d_model}, w={warmup}"
    s = data.draw(st.integers(warmup, 10**9))
    lo, hi = lrate_exact([s, 4 * s], d_model, warmup)
    assert hi == lo / 2, f"decay: lrate({4 * s}) = {hi!r}, lrate({s})/2 = {lo / 2!r}; d={d_model}, w={warmup}"


@pytest.mark.parametrize("warmup", [1, 2, 37, 4000])
def test_lrate_peaks_at_warmup_steps(warmup):
    """Strictly increasing on [0, warmup], strictly decreasing after (the gaps, >= 1/(6 warmup)
    relative, dwarf the fast tier's rounding); the peak is (d_model warmup)^-0.5."""
    steps = np.arange(0, 3 * warmup + 1)
    lr = lrate(steps, 512, warmup)
    assert int(np.argmax(lr)) == warmup
    assert np.all(np.diff(lr[: warmup + 1]) > 0) and np.all(np.diff(lr[warmup:]) < 0)
    assert lrate_exact(warmup, 512, warmup) == rounded(lambda: [1 / mpmath.sqrt(512 * warmup)])[0]


def test_lrate_closed_forms():
    """d_model = warmup = 4: the peak (4 * 4)^-0.5 = 1/4 exactly; step 1 gives 4^-0.5 * 1 * 4^-1.5 = 1/16;
    step 16 gives 4^-0.5 * 16^-0.5 = 1/8. The seeds' numbers at d_model = 512: 512^-0.5 = 0.0442,
    4000^-0.5 = 0.0158, the peak 7.0e-4 at step 4000 and 1.4e-4 at step 100,000."""
    for fn in (lrate, lrate_exact):
        assert fn(4, 4, 4) == 0.25 and fn(1, 4, 4) == 1 / 16 and fn(16, 4, 4) == 1 / 8, fn.__name__
        assert round(float(fn(4000, 512)) * 1e4, 1) == 7.0 and round(float(fn(100_000, 512)) * 1e4, 1) == 1.4
    assert lrate_exact(4000, 512) == rounded(lambda: [1 / mpmath.sqrt(512 * 4000)])[0]
    assert inspect.signature(lrate).parameters["warmup_steps"].default == 4000


def test_lrate_step_zero_choice():
    """step_zero="zero" (default): min(inf, 0) = 0; "raise": an error naming step; "one": step 0 computed as step 1."""
    for fn in (lrate, lrate_exact):
        assert inspect.signature(fn).parameters["step_zero"].default == "zero"
        assert fn(0, 512) == 0.0 and fn(0, 512, step_zero="zero") == 0.0
        assert_exact_equal(fn(np.array([0, 1]), 512), np.array([0.0, fn(1, 512)]), fn.__name__, "step 0 in an array")
        with pytest.raises(ValueError, match="step: step 0"):
            fn(0, 512, step_zero="raise")
        with pytest.raises(ValueError, match="step: step 0"):
            fn([5, 0], 512, step_zero="raise")
        assert fn(3, 512, step_zero="raise") == fn(3, 512)
        assert isinstance(fn(3, 512), float) and np.ndim(fn(3, 512)) == 0
        # step_zero="one": step 0 is step 1 (the Annotated Transformer's rate()); other steps unchanged
        assert fn(0, 512, step_zero="one") == fn(1, 512) and fn(7, 512, step_zero="one") == fn(7, 512)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "needle"),
    [
        ((-1, 512), {}, ValueError, "step: expected step numbers >= 0, got -1"),
        (([3, -2], 512), {}, ValueError, "step"),
        ((1.0, 512), {}, TypeError, "step"),
        ((True, 512), {}, TypeError, "step"),
        ((1, 0), {}, ValueError, "d_model"),
        ((1, 512.0), {}, TypeError, "d_model"),
        ((1, 512, 0), {}, ValueError, "warmup_steps"),
        ((1, 512), {"step_zero": "two"}, ValueError, "step_zero"),
    ],
)
def test_lrate_rejects_bad_input(args, kwargs, error, needle):
    for fn in (lrate, lrate_exact):
        with pytest.raises(error, match=needle):
            fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# label smoothing, §5.4


def smoothing_fractions(k: int, eps: float, variant: str, padded: bool) -> tuple[Fraction, Fraction]:
    """(target value, other value) written out case by case as exact rationals."""
    e = Fraction(eps)
    if variant == "K" and not padded:
        return 1 - e + e / k, e / k
    if variant == "K":  # the padding class's e/k spread over the k - 1 others: e/k + e/(k(k-1)) = e/(k-1)
        return 1 - e + e / (k - 1), e / (k - 1)
    if not padded:
        return 1 - e, e / (k - 1)
    return 1 - e, e / (k - 2)


def expected_rows(targets: np.ndarray, k: int, on: float, off: float, pad: int | None) -> np.ndarray:
    out = np.full((*targets.shape, k), off)
    for idx in np.ndindex(targets.shape):
        out[idx][targets[idx]] = on
        if pad is not None:
            out[idx][pad] = 0.0
            if targets[idx] == pad:
                out[idx][:] = 0.0
    return out


EPS = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1 - 2.0**-53, 2.0**-60, 1e-300]) | st.floats(0, 1, exclude_max=True)


@st.composite
def smoothing_inputs(draw, paper_vocab: bool = True):
    """Any variant and padding; K small, or the paper's ~37,000 (when ``paper_vocab``)."""
    variant = draw(st.sampled_from(["K", "K-1"]))
    ks = st.integers(3 if variant == "K-1" else 2, 40)
    k = draw(ks | st.just(37_000) if paper_vocab else ks)
    pad = draw(st.none() | st.integers(0, k - 1))
    if variant == "K-1" and pad is not None and k < 3:
        pad = None
    targets = draw(hnp.arrays(np.int64, draw(st.sampled_from([(), (3,), (2, 2)])), elements=st.integers(0, k - 1)))
    return targets, k, draw(EPS), variant, pad


@given(smoothing_inputs())
def test_label_smoothing_matches_exact_rationals(args):
    """Independent check: the values as Fractions (CPython's float(Fraction) rounds correctly).
    Exact tier: bit for bit, also at HIGH_DPS. Fast tier: (1 - eps) + eps/m is two roundings of
    non-negative terms plus the sum (relative gamma_2), eps/m one: E = gamma_2 |value|."""
    targets, k, eps, variant, pad = args
    inputs = f"targets={targets.tolist()!r}, vocab_size={k}, eps={eps!r}, variant={variant!r}, padding_id={pad}"
    on_f, off_f = smoothing_fractions(k, eps, variant, pad is not None)
    exact = label_smoothing_exact(targets, k, eps, variant=variant, padding_id=pad)
    assert_exact_equal(
        exact, expected_rows(targets, k, float(on_f), float(off_f), pad), "label_smoothing_exact vs Fraction", inputs
    )
    assert_exact_equal(
        label_smoothing_exact(targets, k, eps, variant=variant, padding_id=pad, dps=HIGH_DPS), exact, "HIGH_DPS", inputs
    )
    # fast tier: every entry is 0 (exact), the target value or the other value; read the two
    # values where they occur, check the layout with them, then each value against its bound
    fast = label_smoothing(targets, k, eps, variant=variant, padding_id=pad)
    live = [idx for idx in np.ndindex(targets.shape) if pad is None or targets[idx] != pad]
    if not live:
        assert_exact_equal(fast, np.zeros(fast.shape), "label_smoothing, all rows padding", inputs)
        return
    row, t = live[0], targets[live[0]]
    other = next((c for c in range(k) if c not in (t, pad)), None)  # None: K = 2 with padding
    fast_on = float(fast[(*row, t)])
    fast_off = float(fast[(*row, other)]) if other is not None else 0.0
    assert_exact_equal(fast, expected_rows(targets, k, fast_on, fast_off, pad), "label_smoothing layout", inputs)
    checks = [(fast_on, on_f)] + ([(fast_off, off_f)] if other is not None else [])
    with mpmath.workdps(HIGH_DPS):
        for got, f in checks:
            value = mpmath.mpf(f.numerator) / f.denominator
            assert_sandwiched(got, value, gamma(2) * value, "label_smoothing (§5.4)", inputs)


@given(smoothing_inputs(paper_vocab=False))
def test_label_smoothing_rows_sum_to_one(args):
    """Non-padding rows sum to 1: exact tier |sum q_hat - 1| <= U sum q = U (each entry correctly
    rounded); fast tier <= sum_k (E_k + U (q_k + E_k)) = gamma_2 + U (1 + gamma_2). Sums formed
    exactly. Padding rows are all zero, and the padding column is zero."""
    targets, k, eps, variant, pad = args
    inputs = f"targets={targets.tolist()!r}, vocab_size={k}, eps={eps!r}, variant={variant!r}, padding_id={pad}"
    for fn, bound in ((label_smoothing_exact, U), (label_smoothing, gamma(2) + U * (1 + gamma(2)))):
        rows = fn(targets, k, eps, variant=variant, padding_id=pad)
        for idx in np.ndindex(targets.shape):
            with mpmath.workprec(2200):
                total = mpmath.fsum(mpmath.mpf(float(v)) for v in rows[idx])
            if pad is not None and targets[idx] == pad:
                assert total == 0, f"{fn.__name__}: padding row {idx} sums to {total}; {inputs}"
            else:
                assert abs(total - 1) <= bound, (
                    f"{fn.__name__}: row {idx} sums to 1 + {total - 1}, bound {bound}; {inputs}"
                )
                if variant == "K":  # 1 - eps + off > off; under "K-1", 1 - eps < eps/(K-1) once eps > (K-1)/K
                    assert rows[idx][targets[idx]] == rows[idx].max(), (
                        f"{fn.__name__}: target not the largest; {inputs}"
                    )
            if pad is not None:
                assert rows[idx][pad] == 0.0, (
                    f"{fn.__name__}: padding column of row {idx} is {rows[idx][pad]}; {inputs}"
                )


def test_label_smoothing_seed_values_and_variants():
    """Seeds: K = 37,000, eps = 0.1: target 0.9 + 0.1/37000 = 0.900003, others 0.0000027.
    K = 4, eps = 0.1 by hand: "K" 0.925 / 0.025; "K-1" 0.9 / 0.0333..; with padding_id = 0:
    "K" 0.9333.. / 0.0333.. (the pad's 0.025 spread over 3 classes), "K-1" 0.9 / 0.05."""
    row = label_smoothing_exact(1, 37_000, 0.1)
    assert round(row[1], 6) == 0.900003 and f"{row[0]:.7f}" == "0.0000027"
    e = Fraction(0.1)
    cases = {
        ("K", None): (1 - e + e / 4, e / 4),
        ("K-1", None): (1 - e, e / 3),
        ("K", 0): (1 - e + e / 3, e / 3),
        ("K-1", 0): (1 - e, e / 2),
    }
    for (variant, pad), (on, off) in cases.items():
        expected = [0.0 if c == pad else float(on) if c == 2 else float(off) for c in range(4)]
        for fn in (label_smoothing, label_smoothing_exact):
            got = fn(2, 4, 0.1, variant=variant, padding_id=pad)
            assert got.tolist() == expected, (
                f"{fn.__name__} variant={variant} padding_id={pad}: {got.tolist()}, expected {expected}"
            )
    for fn in (label_smoothing, label_smoothing_exact):
        params = inspect.signature(fn).parameters
        assert params["variant"].default == "K" and params["padding_id"].default is None
        assert fn([0, 2], 4, 0.1, padding_id=0)[0].tolist() == [0.0] * 4  # a padding row is excluded
        assert fn(1, 3, 0.0).tolist() == [0.0, 1.0, 0.0]  # eps = 0: one-hot


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "needle"),
    [
        (([0], 4, 1.0), {}, ValueError, "eps: expected one number in \\[0, 1\\)"),
        (([0], 4, -0.1), {}, ValueError, "eps"),
        (([0], 4, float("nan")), {}, ValueError, "eps"),
        (([0], 1, 0.1), {}, ValueError, "vocab_size"),
        (([0], 4.0, 0.1), {}, TypeError, "vocab_size"),
        (([4], 4, 0.1), {}, ValueError, "targets: class id 4"),
        (([-1], 4, 0.1), {}, ValueError, "targets: class id -1"),
        (([1.0], 4, 0.1), {}, TypeError, "targets"),
        (([0], 4, 0.1), {"variant": "K+1"}, ValueError, "variant"),
        (([0], 4, 0.1), {"padding_id": 4}, ValueError, "padding_id"),
        (([0], 4, 0.1), {"padding_id": 1.0}, TypeError, "padding_id"),
        (([0], 2, 0.1), {"variant": "K-1", "padding_id": 1}, ValueError, "vocab_size: variant 'K-1' with a padding_id"),
    ],
)
def test_label_smoothing_rejects_bad_input(args, kwargs, error, needle):
    for fn in (label_smoothing, label_smoothing_exact):
        with pytest.raises(error, match=needle):
            fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# cross-entropy


def cross_entropy_fast_bound(z: np.ndarray, p: np.ndarray, rho_p: mpmath.mpf = _MPF_ZERO) -> np.ndarray:
    """E for the fast cross-entropy sum_k p_k (L - w_k), w = z - max z, L = log1p(T),
    T = sum of exp(w_j) over all j but the first maximal index. ``p`` holds the true weights; the
    fast tier's are within rho_p relative of them (0 for float64 inputs). Per row:
    - w_hat_k = fl(z_k - m): |w_hat_k - w_k| <= u |w_k|;
    - e_hat_j = expl(w_hat_j): |e_hat_j - e_j| <= De_j := e_j (1.001 u |w_j| (1 + LIBM) + LIBM)
      (|exp(x) - 1| <= 1.001 |x| for |x| <= 10^-3; the logits here keep u|w| < 10^-13);
    - T_hat: |T_hat - T| <= D_T := sum De + gamma_{K-1} (T + sum De) (non-negative terms);
    - L_hat = log1pl(T_hat): log1p is 1-Lipschitz on [0, inf): |L_hat - L| <= D_L := D_T + LIBM (L + D_T);
    - a_k = fl(L_hat - w_hat_k): D_a = D_L + u |w_k| + u (L - w_k + D_L + u |w_k|)  (L - w_k >= 0);
    - b_k = fl(p_hat_k a_k): D_b = p_k (1 + rho_p) D_a + p_k rho_p (L - w_k) + u p_k (1 + rho_p)(L - w_k + D_a);
    - CE_hat = fl(sum b): E = sum D_b + gamma_{K-1} (CE + sum D_b).
    Every term of the sum is >= 0, so nothing cancels: E is a few u (times K and |w|) of CE."""
    k = z.shape[-1]
    zr, pr = z.reshape(-1, k), p.reshape(-1, k)
    out = np.empty(zr.shape[0], dtype=object)
    with mpmath.workdps(40):
        for r in range(zr.shape[0]):
            zs = [mpmath.mpf(float(v)) for v in zr[r]]
            top = int(np.argmax(zr[r]))
            w = [v - zs[top] for v in zs]
            e = [mpmath.exp(v) if j != top else mpmath.mpf(0) for j, v in enumerate(w)]
            de = [e[j] * (mpmath.mpf("1.001") * u * abs(w[j]) * (1 + LIBM) + LIBM) for j in range(k)]
            t = mpmath.fsum(e)
            d_t = mpmath.fsum(de) + gamma(k - 1) * (t + mpmath.fsum(de))
            big_l = mpmath.log1p(t)
            d_l = d_t + LIBM * (big_l + d_t)
            d_b, ce = [], mpmath.mpf(0)
            for j in range(k):
                pj, gap = pr[r, j], big_l - w[j]
                d_a = d_l + u * abs(w[j]) + u * (gap + d_l + u * abs(w[j]))
                d_b.append(pj * (1 + rho_p) * d_a + pj * rho_p * gap + u * pj * (1 + rho_p) * (gap + d_a))
                ce += pj * gap
            out[r] = mpmath.fsum(d_b) + gamma(k - 1) * (ce + mpmath.fsum(d_b)) + TRUTH_SLACK * ce
    return out.reshape(z.shape[:-1])


@st.composite
def logit_rows(draw, batch: tuple[int, ...], k: int) -> np.ndarray:
    """Logits that matter: moderate, large (|z| up to 1e6), near ties (spread ~1e-12), a dominant
    logit (gaps 50 to 10^4: exp(-gap) below longdouble's 2^-64 next to 1, or below float64's
    range), exact ties at the max."""
    kind = draw(st.sampled_from(["moderate", "large", "near_tie", "dominant", "ties"]))
    shape = (*batch, k)
    if kind == "moderate":
        return draw(hnp.arrays(np.float64, shape, elements=st.floats(-10, 10)))
    if kind == "large":
        return draw(hnp.arrays(np.float64, shape, elements=st.floats(-1e6, 1e6)))
    if kind == "near_tie":
        return draw(st.floats(-100, 100)) + draw(hnp.arrays(np.float64, shape, elements=st.floats(-1e-12, 1e-12)))
    if kind == "dominant":
        # gaps 50 and 700 leave exp(gap) between 2^-1074 and 2^-64: lost in log(1 + T), kept by log1p
        return draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, -50.0, -700.0, -800.0, -750.5, -1e4])))
    return draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([3.0, 3.0, -1.0])))


@st.composite
def ce_inputs(draw):
    batch, k = draw(st.sampled_from([(), (2,), (2, 2)])), draw(st.integers(1, 6))
    z = draw(logit_rows(batch, k))
    kind = draw(st.sampled_from(["onehot", "weights", "zeros"]))
    if kind == "onehot":
        p = np.eye(k)[draw(hnp.arrays(np.int64, batch, elements=st.integers(0, k - 1)))]
    elif kind == "weights":
        p = draw(hnp.arrays(np.float64, (*batch, k), elements=st.floats(0, 1)))
    else:
        p = np.zeros((*batch, k))
    return z, p


@given(ce_inputs())
def test_cross_entropy_fast_tier_matches_exact_tier(args):
    z, p = args
    inputs = f"logits={z.tolist()!r}, target_dist={p.tolist()!r}"
    with mpmath.workdps(HIGH_DPS):
        true_ce = np.asarray(_cross_entropy_mp(to_mp(z), to_mp(p)), dtype=object)
    assert_sandwiched(
        cross_entropy(z, p), true_ce, cross_entropy_fast_bound(z, to_mp(p)), "cross_entropy (§5.4)", inputs
    )


@settings(max_examples=20)
@given(ce_inputs())
def test_cross_entropy_exact_tier_is_stable_and_matches_the_textbook_formula(args):
    """Independent formula: -sum p_k (z_k - log sum_j exp z_j) in mpmath, evaluated with enough
    digits for the cancellation (the Ziv loop raises the precision where the rounding is unsure)."""
    z, p = args
    inputs = f"logits={z.tolist()!r}, target_dist={p.tolist()!r}"
    exact = cross_entropy_exact(z, p)
    assert_exact_equal(cross_entropy_exact(z, p, dps=HIGH_DPS), exact, "cross_entropy_exact at HIGH_DPS", inputs)

    def textbook():
        rows = to_mp(z).reshape(-1, z.shape[-1]), to_mp(p).reshape(-1, z.shape[-1])
        # z_k - log sum exp z cancels down to CE, which can be 1e-324 next to |z| ~ 1e6: 400 extra
        # digits resolve every CE that float64 can represent
        with mpmath.workdps(mpmath.mp.dps + 400):
            return [
                -mpmath.fsum(pk * (zk - mpmath.log(mpmath.fsum(mpmath.exp(v) for v in zr))) for zk, pk in zip(zr, pr))
                for zr, pr in zip(*rows)
            ]

    assert_exact_equal(exact, rounded(textbook).reshape(z.shape[:-1]), "cross_entropy_exact vs textbook", inputs)


def _onehot(t, k: int) -> np.ndarray:
    t = np.asarray(t)
    return (np.arange(k) == t[..., None]).astype(np.float64)


def test_cross_entropy_closed_forms():
    """Uniform logits, one-hot target: log K. Two classes, target 0: log(1 + e^(z1 - z0)) (the
    softplus), here with z1 - z0 = -745 whose e^-745 ~ 5e-324 would vanish in log(1 + .) evaluated
    naively; zero target row: 0."""
    for fn in (cross_entropy, cross_entropy_exact):
        for k in (1, 2, 7, 37_000 if fn is cross_entropy else 300):
            assert fn(np.full(k, 2.5), _onehot(0, k)) == rounded(lambda k=k: [mpmath.log(k)])[0], f"{fn.__name__} K={k}"
        got = fn([0.0, -745.0], [1.0, 0.0])
        assert got == rounded(lambda: [mpmath.log1p(mpmath.exp(-745))])[0] and got > 0, f"{fn.__name__}: {got!r}"
        assert fn([[1.0, 2.0]], [[0.0, 0.0]]).tolist() == [0.0]


def test_cross_entropy_agrees_with_scipy_log_softmax():
    """scipy.special.log_softmax (float64) as an independent implementation. It forms
    w = z - max (error U|w|), log(sum exp w) with sum >= 1 (relative gamma_{K+1}(U) from exp and
    the sum, hence absolute gamma_{K+1}(U) (1 + ...), plus U of the log) and the difference (U):
    |ls_scipy_t + CE_t| <= U |w_t| + gamma_{K+2}(U) (1 + L) + U (|w_t| + L) + U|w_t| (1 + ...);
    we allow 2U|w_t| + gamma_{K+3}(U) (1 + 2L) + 2U CE, the last for our own rounding."""
    special = pytest.importorskip("scipy.special")
    rng = np.random.default_rng(20170612)
    for k in (2, 7, 512, 37_000):
        z = rng.normal(scale=6.0, size=(2, k))
        t = rng.integers(0, k, size=2)
        ours = cross_entropy(z, _onehot(t, k))
        theirs = -special.log_softmax(z, axis=-1)[np.arange(2), t]
        w = np.abs(z[np.arange(2), t] - z.max(axis=-1))
        lse = ours - w  # L = CE_t - |w_t| >= 0
        bound = 2 * float(U) * w + float(gamma(k + 3, U)) * (1 + 2 * lse) + 2 * float(U) * ours
        assert np.all(np.abs(ours - theirs) <= bound), f"K={k}: ours {ours}, scipy {theirs}, bound {bound}"


@settings(max_examples=20)
@given(st.integers(2, 6), st.data())
def test_cross_entropy_is_invariant_to_shifting_the_logits(k, data):
    """CE(z + c) = CE(z): with integer logits and shift the sum is exact, so the exact tier agrees
    bit for bit."""
    z = data.draw(hnp.arrays(np.float64, (k,), elements=st.integers(-50, 50).map(float)))
    c = float(data.draw(st.integers(-(2**40), 2**40)))
    p = data.draw(hnp.arrays(np.float64, (k,), elements=st.floats(0, 1)))
    assert cross_entropy_exact(z + c, p) == cross_entropy_exact(z, p), f"z={z.tolist()}, c={c}, p={p.tolist()}"


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        (([1.0, 2.0], [1.0, 0.0, 0.0]), ValueError, "K"),
        (([1.0, 2.0], [1.5, -0.5]), ValueError, "target_dist: expected non-negative"),
        (([np.nan, 2.0], [1.0, 0.0]), ValueError, "logits"),
        (([1.0, 2.0], [np.inf, 0.0]), ValueError, "target_dist"),
        ((np.zeros((2, 2)), np.zeros((3, 2))), ValueError, "do not broadcast"),
        ((1.0, [1.0]), ValueError, "logits"),
        ((np.zeros((2, 0)), np.zeros((2, 0))), ValueError, "logits"),
    ],
)
def test_cross_entropy_rejects_bad_input(args, error, needle):
    for fn in (cross_entropy, cross_entropy_exact):
        with pytest.raises(error, match=needle):
            fn(*args)


# --------------------------------------------------------------------------------------------
# the smoothed cross-entropy and its minimum


@st.composite
def smoothed_ce_inputs(draw):
    variant = draw(st.sampled_from(["K", "K-1"]))
    batch, k = draw(st.sampled_from([(), (2,), (2, 2)])), draw(st.integers(3, 6))
    pad = draw(st.none() | st.integers(0, k - 1))
    targets = draw(hnp.arrays(np.int64, batch, elements=st.integers(0, k - 1)))
    return draw(logit_rows(batch, k)), targets, draw(EPS), variant, pad


def _smoothed_targets_mp(targets: np.ndarray, k: int, eps: float, variant: str, pad: int | None) -> np.ndarray:
    """The true smoothed rows from the exact rationals, at the ambient precision."""
    on_f, off_f = smoothing_fractions(k, eps, variant, pad is not None)
    on, off = (mpmath.mpf(f.numerator) / f.denominator for f in (on_f, off_f))
    rows = np.full((*targets.shape, k), off, dtype=object)
    for idx in np.ndindex(targets.shape):
        rows[idx][targets[idx]] = on
        if pad is not None:
            rows[idx][pad] = mpmath.mpf(0)
            if targets[idx] == pad:
                rows[idx][:] = mpmath.mpf(0)
    return rows


@given(smoothed_ce_inputs())
def test_smoothed_cross_entropy_fast_tier_matches_exact_tier(args):
    """The fast tier keeps the smoothed targets in longdouble: relative error rho_p = gamma_2
    (see test_label_smoothing_matches_exact_rationals); then the cross-entropy bound."""
    z, targets, eps, variant, pad = args
    k = z.shape[-1]
    inputs = f"logits={z.tolist()!r}, targets={targets.tolist()!r}, eps={eps!r}, variant={variant!r}, padding_id={pad}"
    with mpmath.workdps(HIGH_DPS):
        q = _smoothed_targets_mp(targets, k, eps, variant, pad)
        true_ce = np.asarray(_cross_entropy_mp(to_mp(z), q), dtype=object)
    assert_sandwiched(
        smoothed_cross_entropy(z, targets, eps, variant=variant, padding_id=pad),
        true_ce,
        cross_entropy_fast_bound(z, q, gamma(2)),
        "smoothed_cross_entropy (§5.4)",
        inputs,
    )
    exact = smoothed_cross_entropy_exact(z, targets, eps, variant=variant, padding_id=pad)
    assert_exact_equal(
        exact,
        rounded(lambda: _cross_entropy_mp(to_mp(z), _smoothed_targets_mp(targets, k, eps, variant, pad))),
        "smoothed_cross_entropy_exact vs truth",
        inputs,
    )
    if pad is not None:
        assert np.all(exact[targets == pad] == 0), "padding positions must have loss 0"


def entropy_truth(k: int, eps: float, variant: str):
    """-sum_k q_k log q_k over the smoothed row, written out: one target value a, K-1 values b.
    log a = log1p(a - 1) with a - 1 taken from the exact rational (a can be 1 - 1e-300)."""
    on_f, off_f = smoothing_fractions(k, eps, variant, False)
    a, b, a_minus_1 = (mpmath.mpf(f.numerator) / f.denominator for f in (on_f, off_f, on_f - 1))
    return -a * mpmath.log1p(a_minus_1) - (k - 1) * (b * mpmath.log(b) if b else 0)


def entropy_fast_bound(k: int, eps: float, variant: str) -> mpmath.mpf:
    """E for H = -(1 - r) log1p(-r) - r log b (r the off-target mass, b each other class's share).
    r_hat = r (1 + rho_r) (rho_r = gamma_2 for "K": fl(fl(eps (K-1)) / K); 0 for "K-1": r = eps),
    b_hat = b (1 + rho_b), rho_b = u. Then with dr = rho_r r, a = 1 - r:
    |a_hat - a| <= Da := dr + u (a + dr); log1p(-x) has slope 1/(1 - x):
    |la_hat - la| <= Dla := dr / (a - dr) + LIBM (|la| + dr / (a - dr));
    |lb_hat - lb| <= Dlb := rho_b / (1 - rho_b) + LIBM (|lb| + ...);
    t1 = -a la, t2 = -r lb (both >= 0): |dt1| <= Da |la| + a Dla + Da Dla (+ u of the product), likewise
    t2; the sum adds u (H + ...)."""
    e = mpmath.mpf(eps)
    r, b, rho_r = (e * (k - 1) / k, e / k, gamma(2)) if variant == "K" else (e, e / (k - 1), mpmath.mpf(0))
    a, la, lb = 1 - r, mpmath.log1p(-r), mpmath.log(b)
    dr = rho_r * r
    d_a = dr + u * (a + dr)
    dla0 = dr / (a - dr)
    d_la = dla0 + LIBM * (abs(la) + dla0)
    dlb0 = u / (1 - u)
    d_lb = dlb0 + LIBM * (abs(lb) + dlb0)
    t1, t2 = -a * la, -r * lb
    d_t1 = d_a * abs(la) + a * d_la + d_a * d_la
    d_t1 += u * (t1 + d_t1)
    d_t2 = dr * abs(lb) + r * d_lb + dr * d_lb
    d_t2 += u * (t2 + d_t2)
    h = t1 + t2
    return d_t1 + d_t2 + u * (h + d_t1 + d_t2) + TRUTH_SLACK * h


@given(st.integers(2, 60) | st.just(37_000), EPS, st.sampled_from(["K", "K-1"]))
def test_smoothed_target_entropy_matches_the_entropy_of_the_smoothed_row(k, eps, variant):
    """Independent: -sum q log q over the written-out row. Exact tier bit for bit (and at
    HIGH_DPS); fast tier within entropy_fast_bound."""
    inputs = f"vocab_size={k}, eps={eps!r}, variant={variant!r}"
    exact = smoothed_target_entropy_exact(k, eps, variant=variant)
    assert exact == rounded(lambda: [entropy_truth(k, eps, variant)])[0], inputs
    assert smoothed_target_entropy_exact(k, eps, variant=variant, dps=HIGH_DPS) == exact, inputs
    with mpmath.workdps(HIGH_DPS):
        h = entropy_truth(k, eps, variant)
        bound = entropy_fast_bound(k, eps, variant) if eps else mpmath.mpf(0)
    assert_sandwiched(
        smoothed_target_entropy(k, eps, variant=variant), h, bound, "smoothed_target_entropy (§5.4)", inputs
    )


def test_smoothed_target_entropy_closed_forms():
    """eps = 0: a one-hot target, entropy 0. "K-1" with eps = (K-1)/K makes the row uniform:
    log K (K = 4, eps = 0.75; K = 2, eps = 0.5). "K" with K = 2, eps = 0.5: (0.75, 0.25)."""
    for fn in (smoothed_target_entropy, smoothed_target_entropy_exact):
        assert fn(37_000, 0.0) == 0.0 and fn(2, 0.0, variant="K-1") == 0.0
        assert fn(4, 0.75, variant="K-1") == rounded(lambda: [mpmath.log(4)])[0]
        assert fn(2, 0.5, variant="K-1") == rounded(lambda: [mpmath.log(2)])[0]
        assert (
            fn(2, 0.5)
            == rounded(lambda: [-(mpmath.mpf(0.75) * mpmath.log(0.75) + mpmath.mpf(0.25) * mpmath.log(0.25))])[0]
        )
        assert inspect.signature(fn).parameters["variant"].default == "K"
        with pytest.raises(ValueError, match="vocab_size"):
            fn(1, 0.1)
        with pytest.raises(ValueError, match="eps"):
            fn(4, 1.0)
        with pytest.raises(ValueError, match="variant"):
            fn(4, 0.1, variant="uniform")


@settings(max_examples=25)
@given(
    st.integers(2, 8),
    st.integers(0, 7),
    st.floats(0.01, 0.9),
    st.sampled_from(["K", "K-1"]),
    st.sampled_from([-0.05, 0.05]),
    st.data(),
)
def test_smoothed_cross_entropy_is_minimised_at_the_smoothed_target(k, target, eps, variant, eta, data):
    """CE(z) = H(q) + KL(q || softmax(z)) >= H(q), equality at softmax(z) = q.
    At z* = fl64(log q): z* = log q + delta with |delta_k| <= U |log q_k| =: at most D, and by
    Hoeffding's lemma KL = log E_q[e^delta] - E_q[delta] <= (2D)^2 / 8, so the exact tier gives
    fl64(H) <= CE(z*) <= fl64(H + D^2/2), and H is smoothed_target_entropy_exact's value.
    Perturbing one logit by eta = ±0.05 moves KL to log(q_j e^eta + 1 - q_j) - q_j eta
    ~ eta^2 q_j (1 - q_j) / 2 >= 1e-6 here, far above the rounding: CE strictly increases (both tiers)."""
    target = target % k
    if variant == "K-1" and k == 2 and eps > 0.49:
        eps = 0.3  # keep the target the largest class (1 - eps > eps)
    on_f, off_f = smoothing_fractions(k, eps, variant, False)
    with mpmath.workdps(HIGH_DPS):
        logq = [mpmath.log(mpmath.mpf(f.numerator) / f.denominator) for f in (on_f, off_f)]
        z_star = np.array([round_to_float64(logq[0] if c == target else logq[1]) for c in range(k)])
        big_d = U * max(abs(v) for v in logq)
        h = entropy_truth(k, eps, variant)
    h_exact = smoothed_target_entropy_exact(k, eps, variant=variant)
    at_min = smoothed_cross_entropy_exact(z_star, target, eps, variant=variant)
    inputs = f"K={k}, target={target}, eps={eps!r}, variant={variant!r}, z*={z_star.tolist()!r}"
    with mpmath.workdps(HIGH_DPS):
        upper = round_to_float64(h + big_d**2 / 2)
    assert h_exact <= at_min <= upper, f"CE(z*) = {at_min!r} outside [{h_exact!r}, {upper!r}]; {inputs}"
    j = data.draw(st.integers(0, k - 1))
    moved = z_star.copy()
    moved[j] += eta
    for fn in (smoothed_cross_entropy_exact, smoothed_cross_entropy):
        assert fn(moved, target, eps, variant=variant) > fn(z_star, target, eps, variant=variant), (
            f"{fn.__name__}: perturbing logit {j} by {eta} did not increase CE; {inputs}"
        )


def test_smoothed_cross_entropy_rejects_bad_input():
    for fn in (smoothed_cross_entropy, smoothed_cross_entropy_exact):
        with pytest.raises(ValueError, match="logits: expected at least 2 classes"):
            fn([1.0], 0, 0.1)
        with pytest.raises(ValueError, match="targets"):
            fn([1.0, 2.0, 3.0], 3, 0.1)
        with pytest.raises(ValueError, match="eps"):
            fn([1.0, 2.0, 3.0], 0, 1.5)
        with pytest.raises(ValueError, match="do not broadcast"):
            fn(np.zeros((2, 3)), np.zeros(3, dtype=int), 0.1)
        with pytest.raises(TypeError, match="targets"):
            fn([1.0, 2.0, 3.0], 0.0, 0.1)
        with pytest.raises(ValueError, match="logits"):
            fn([1.0, np.nan, 3.0], 0, 0.1)
