"""The oracle for §3.5 (sinusoidal positional encoding and the shift matrix M_k) is right.

Evidence:
1. the fast tier agrees with the exact tier within a derived bound that grows with the angle,
   including positions up to 10^5 (property-based);
2. the exact tier does not change when recomputed at a much higher precision;
3. independent checks: the seeds' closed forms (PE(1,0) = sin 1, PE(1,1) = cos 1,
   PE(10,128) = sin 1 at d_model = 512), column 0 is sin(pos), the frequencies recovered by atan2
   form the geometric progression 10000^(-2i/d), |PE| <= 1 and sin^2 + cos^2 = 1;
4. the paper's reason for sinusoids: PE(pos + k) = M_k PE(pos) for many pos and k, in both tiers;
5. every Choice pinned; bad input gets an error naming the argument.

Comparison of the fast tier ("sandwich", as in tests/test_layers.py): the fast tier's longdouble
value is within E of the truth y and is rounded once, so its float64 result must lie in
[fl64(y - E), fl64(y + E)]; y is the exact tier's unrounded evaluation at HIGH_DPS (+ guard digits).

The fast tier's error, per pair i with q = 2i/d_model and angle theta = pos / base^q
(u = 2^-64; glibc's x86_64 libm-test-ulps lists at most 2 ulps for the long double sin, cos and
pow, and one ulp of a longdouble y is at most 2u|y|, so each libm call adds <= 4u relative):
- q_hat = fl(2i / d) has |q_hat - q| <= u q, which multiplies base^q by exp(+-u q ln base):
  relative error <= 1.001 u q |ln base| (|exp(x) - 1| <= 1.001|x| for |x| <= 10^-3);
- pow adds 4u, the division pos / den adds u: |theta_hat - theta| <= rho |theta| with
  rho := 1.001 (1.001 q |ln base| + 5) u (the outer 1.001 covers the products of the three factors);
- sin and cos are 1-Lipschitz, and the libm call adds 4u of its result:
  E = rho |theta| (1 + 4u) + 4u |PE|.
The angle term dominates for large positions: at pos = 10^5, E ~ 6e-14 (hundreds of float64 ulps),
still ~2^-11 of the |theta| 2^-53 that a float64 implementation's own angle carries.
"""

from __future__ import annotations

import functools
import inspect
import math

import mpmath
import numpy as np
import pytest
from _sandwich import TINY, U, assert_exact_equal, assert_sandwiched, u
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.reference._exact import HIGH_DPS, correctly_rounded
from aiayn.reference.positional import (
    _angles_mp,
    _guard_digits,
    _pe_rows_mp,
    pe_shift_matrix,
    pe_shift_matrix_exact,
    positional_encoding,
    positional_encoding_exact,
)

LIBM = 4 * u  # one glibc long double sin/cos/pow call: <= 2 ulps <= 4u relative
TRUTH_SLACK = mpmath.mpf(10) ** (2 - HIGH_DPS)  # the truth's own error (absolute, values <= 1)


def gamma(n: int, unit: mpmath.mpf = U) -> mpmath.mpf:
    return n * unit / (1 - n * unit)


def truth_and_bound(offsets: list[int], d_model: int, base: float, kind: str = "pe") -> tuple[np.ndarray, np.ndarray]:
    """The true PE rows (kind "pe", shape (n, d)) or sin/cos of the M_k angles (kind "angles",
    shape (n, d/2, 2)) at HIGH_DPS, and the fast tier's bound E (module docstring)."""
    with mpmath.workdps(HIGH_DPS + _guard_digits(max(map(abs, offsets), default=0), base)):
        values = _pe_rows_mp(offsets, d_model, mpmath.mpf(base))  # (n, d)
    with mpmath.workdps(30):
        thetas = _angles_mp(offsets, d_model, mpmath.mpf(base))  # (n, d/2)
        log_base = abs(mpmath.log(base))
        bound = np.empty(values.shape, dtype=object)
        for i in range(d_model // 2):
            rho = mpmath.mpf("1.001") * (mpmath.mpf("1.001") * mpmath.mpf(2 * i) / d_model * log_base + 5) * u
            for r in range(len(offsets)):
                for c in (2 * i, 2 * i + 1):
                    bound[r, c] = rho * abs(thetas[r, i]) * (1 + LIBM) + LIBM * abs(values[r, c]) + TRUTH_SLACK
    return values, bound


BASES = st.sampled_from([10000.0, 10000.0, 100.0, 2.5, 1e6, 0.5])
WIDTHS = st.sampled_from([2, 4, 6, 8, 12])


# --------------------------------------------------------------------------------------------
# positional_encoding: fast vs exact, stability, closed forms


@given(length=st.integers(0, 40), d_model=WIDTHS, base=BASES)
def test_positional_encoding_fast_tier_matches_exact_tier(length, d_model, base):
    values, bound = truth_and_bound(list(range(length)), d_model, base)
    got = positional_encoding(length, d_model, base=base)
    assert got.shape == (length, d_model)
    assert_sandwiched(
        got,
        values.reshape(length, d_model),
        bound.reshape(length, d_model),
        "positional_encoding (§3.5)",
        f"length={length}, d_model={d_model}, base={base}",
    )


@functools.cache
def long_table() -> np.ndarray:
    """Fast-tier PE for positions 0 .. 10^5 - 1 at d_model = 16 (computed once)."""
    return positional_encoding(100_000, 16)


@settings(max_examples=20)
@given(st.lists(st.integers(0, 99_999), min_size=1, max_size=4))
def test_positional_encoding_fast_tier_at_long_positions(positions):
    """Rows far out (pos up to 10^5): the angle term rho |theta| of the bound dominates."""
    values, bound = truth_and_bound(positions, 16, 10000.0)
    assert_sandwiched(
        long_table()[positions], values, bound, "positional_encoding at long positions", f"positions={positions}"
    )


@settings(max_examples=10)
@given(length=st.integers(0, 12), d_model=WIDTHS, base=BASES)
def test_positional_encoding_exact_tier_is_stable_at_higher_precision(length, d_model, base):
    assert_exact_equal(
        positional_encoding_exact(length, d_model, base=base),
        positional_encoding_exact(length, d_model, base=base, dps=HIGH_DPS),
        "positional_encoding_exact at DEFAULT_DPS vs HIGH_DPS",
        f"length={length}, d_model={d_model}, base={base}",
    )


def _rounded(fn) -> float:
    return float(correctly_rounded(lambda: np.array([fn()], dtype=object), HIGH_DPS)[0])


def test_positional_encoding_seed_values():
    """Seeds §3.5 at d_model = 512: PE(1,0) = sin(1) = 0.841, PE(1,1) = cos(1) = 0.540, pair i = 1
    gives sin(1/10000^(2/512)) = 0.822 and cos = 0.570, PE(10,128) = sin(10/10000^(128/512)) =
    sin(10/10) = 0.841. The exact tier equals these values computed directly (correctly rounded)."""
    pe = positional_encoding_exact(11, 512)
    expected = {
        (1, 0): _rounded(lambda: mpmath.sin(1)),
        (1, 1): _rounded(lambda: mpmath.cos(1)),
        (1, 2): _rounded(lambda: mpmath.sin(1 / mpmath.power(10000, mpmath.mpf(2) / 512))),
        (1, 3): _rounded(lambda: mpmath.cos(1 / mpmath.power(10000, mpmath.mpf(2) / 512))),
        (10, 128): _rounded(lambda: mpmath.sin(1)),
        (10, 129): _rounded(lambda: mpmath.cos(1)),
    }
    for (pos, dim), value in expected.items():
        assert pe[pos, dim] == value, f"PE({pos},{dim}) = {pe[pos, dim]!r}, expected {value!r}"
    assert (round(pe[1, 0], 3), round(pe[1, 1], 3), round(pe[1, 2], 3), round(pe[1, 3], 3), round(pe[10, 128], 3)) == (
        0.841,
        0.540,
        0.822,
        0.570,
        0.841,
    )
    values, bound = truth_and_bound([1, 10], 512, 10000.0)
    assert_sandwiched(
        positional_encoding(11, 512)[[1, 10]], values, bound, "positional_encoding seed rows", "d_model=512"
    )


def test_positional_encoding_column_0_is_sin_pos_and_position_0_is_0_1():
    """Pair i = 0 has denominator base^0 = 1: PE(pos, 0) = sin(pos), PE(pos, 1) = cos(pos) (checked
    against mpmath's sin/cos directly); position 0 is (0, 1, 0, 1, ...) exactly in both tiers."""
    pe = positional_encoding_exact(300, 4)
    for pos in (0, 1, 2, 17, 299):
        assert pe[pos, 0] == _rounded(lambda pos=pos: mpmath.sin(pos)), f"PE({pos}, 0)"
        assert pe[pos, 1] == _rounded(lambda pos=pos: mpmath.cos(pos)), f"PE({pos}, 1)"
    for fn in (positional_encoding, positional_encoding_exact):
        assert_exact_equal(fn(1, 8)[0], np.tile([0.0, 1.0], 4), fn.__name__, "position 0")


def test_positional_encoding_frequencies_form_the_geometric_progression():
    """At pos = 1 every angle 10000^(-2i/512) lies in (0, 1], so atan2(PE(1,2i), PE(1,2i+1))
    recovers it. The exact tier's entries are within U of (sin, cos), a perturbation of length
    <= U of a point on the unit circle, which moves its angle by <= U / (1 - U) < 1.01 U."""
    pe = positional_encoding_exact(2, 512)
    with mpmath.workdps(40):
        for i in range(256):
            got = mpmath.atan2(mpmath.mpf(float(pe[1, 2 * i])), mpmath.mpf(float(pe[1, 2 * i + 1])))
            expected = mpmath.power(10000, -mpmath.mpf(2 * i) / 512)
            assert abs(got - expected) <= mpmath.mpf("1.01") * U, (
                f"pair {i}: angle {got}, expected 10000^(-{2 * i}/512) = {expected}"
            )
    assert mpmath.power(10000, mpmath.mpf(128) / 512) == 10  # the seeds' 10000^(128/512) = 10


def test_positional_encoding_is_bounded_and_pairs_lie_on_the_unit_circle():
    """|PE| <= 1, and each (sin, cos) pair of the fast tier comes from ONE longdouble angle, so
    s_hat = sin(t)(1 + e1), c_hat = cos(t)(1 + e2) with |e| <= e_max := 4u + U (1 + 4u) (libm, then
    the float64 rounding): |s_hat^2 + c_hat^2 - 1| <= 2 e_max + e_max^2; forming the sum of squares
    in longdouble adds gamma_2(u) (1 + that)."""
    pe = positional_encoding(2000, 512).astype(np.longdouble)
    assert np.all(np.abs(pe) <= 1)
    e_max = LIBM + U * (1 + LIBM)
    bound = float(2 * e_max + e_max**2 + gamma(2, u) * (1 + 2 * e_max + e_max**2))
    radius = pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2
    worst = np.unravel_index(np.argmax(np.abs(radius - 1)), radius.shape)
    assert abs(float(radius[worst] - 1)) <= bound, (
        f"sin^2 + cos^2 - 1 = {float(radius[worst] - 1)} at (pos, pair) {worst}, bound {bound}"
    )


def test_positional_encoding_empty_and_base_choice():
    """length 0 -> (0, d_model); base defaults to the paper's 10000 and is honoured."""
    for fn in (positional_encoding, positional_encoding_exact):
        assert fn(0, 6).shape == (0, 6)
        assert inspect.signature(fn).parameters["base"].default == 10000.0
    # base 2^8, d_model 4: pair 1 has denominator 256^(1/2) = 16, so PE(16, 2) = sin(1)
    assert positional_encoding_exact(17, 4, base=256.0)[16, 2] == _rounded(lambda: mpmath.sin(1))
    values, bound = truth_and_bound([16], 4, 256.0)
    assert_sandwiched(positional_encoding(17, 4, base=256.0)[[16]], values, bound, "base=256", "")


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        (dict(length=4, d_model=5), ValueError, "d_model: expected an even"),
        (dict(length=4, d_model=0), ValueError, "d_model"),
        (dict(length=4, d_model=6.0), TypeError, "d_model"),
        (dict(length=-1, d_model=4), ValueError, "length"),
        (dict(length=3.0, d_model=4), TypeError, "length"),
        (dict(length=4, d_model=4, base=0.0), ValueError, "base"),
        (dict(length=4, d_model=4, base=-10.0), ValueError, "base"),
        (dict(length=4, d_model=4, base=float("nan")), ValueError, "base"),
    ],
)
def test_positional_encoding_rejects_bad_input(kwargs, error, needle):
    for fn in (positional_encoding, positional_encoding_exact):
        with pytest.raises(error, match=needle):
            fn(**kwargs)


# --------------------------------------------------------------------------------------------
# M_k: PE(pos + k) = M_k PE(pos)


def _m_truth_and_bound(k: int, d_model: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """True M_k (HIGH_DPS) and the fast bound per entry: the PE bound with theta = k / base^q
    (zeros off the blocks are exact)."""
    values, bound = truth_and_bound([k], d_model, base)  # (1, d): sin, cos of k w_i at 2i, 2i+1
    m = np.full((d_model, d_model), mpmath.mpf(0), dtype=object)
    e = np.full((d_model, d_model), mpmath.mpf(0), dtype=object)
    for i in range(d_model // 2):
        s, c, es, ec = values[0, 2 * i], values[0, 2 * i + 1], bound[0, 2 * i], bound[0, 2 * i + 1]
        a, b = 2 * i, 2 * i + 1
        with mpmath.workprec(s.context.prec + 10):  # negation rounds to the ambient precision
            m[a, a], m[a, b], m[b, a], m[b, b] = c, s, -s, c
        e[a, a], e[a, b], e[b, a], e[b, b] = ec, es, es, ec
    return m, e


@given(k=st.integers(-(10**6), 10**6), d_model=WIDTHS, base=BASES)
def test_pe_shift_matrix_fast_tier_matches_exact_tier(k, d_model, base):
    m, e = _m_truth_and_bound(k, d_model, base)
    assert_sandwiched(
        pe_shift_matrix(k, d_model, base=base), m, e, "pe_shift_matrix (§3.5)", f"k={k}, d_model={d_model}, base={base}"
    )


@settings(max_examples=15)
@given(k=st.integers(-(10**6), 10**6), d_model=WIDTHS, base=BASES)
def test_pe_shift_matrix_exact_tier_is_stable_at_higher_precision(k, d_model, base):
    assert_exact_equal(
        pe_shift_matrix_exact(k, d_model, base=base),
        pe_shift_matrix_exact(k, d_model, base=base, dps=HIGH_DPS),
        "pe_shift_matrix_exact at DEFAULT_DPS vs HIGH_DPS",
        f"k={k}, d_model={d_model}, base={base}",
    )


@functools.cache
def exact_table(d_model: int, base: float) -> np.ndarray:
    return positional_encoding_exact(48, d_model, base=base)


def _product_mp(m: np.ndarray, p: np.ndarray) -> list:
    """M @ p on the exact values of float64 entries (products and sums exact at 400 bits: each
    term needs 106 bits, and all entries lie in [2^-60, 1])."""
    with mpmath.workprec(400):
        return [
            mpmath.fsum(mpmath.mpf(float(m[a, b])) * mpmath.mpf(float(p[b])) for b in range(len(p)))
            for a in range(len(p))
        ]


@given(d_model=WIDTHS, base=BASES, data=st.data())
def test_shift_property_holds_in_the_exact_tier(d_model, base, data):
    """M_k PE(pos) = PE(pos + k) for the exact tier's float64 outputs, pos and pos + k in [0, 48).
    Each output is correctly rounded (|x_hat - x| <= U |x|), so with the product formed exactly:
    |M_hat P_hat - M P|_a <= sum_b (|dM||P_hat| + |M||dP|) <= gamma_3(U) (|M_hat| |P_hat|)_a, and
    M P = PE(pos + k) exactly, itself within U |PE_hat(pos + k)| of its float64 value."""
    pos = data.draw(st.integers(0, 47))
    k = data.draw(st.integers(-pos, 47 - pos))
    table, m = exact_table(d_model, base), pe_shift_matrix_exact(k, d_model, base=base)
    got, mag = _product_mp(m, table[pos]), _abs_product_mp(m, table[pos][:, None])
    for a in range(d_model):
        with mpmath.workprec(400):
            bound = gamma(3) * mag[a, 0] + gamma(1) * abs(table[pos + k, a]) + 2 * TINY
            miss = abs(got[a] - mpmath.mpf(float(table[pos + k, a])))
        assert miss <= bound, (
            f"(M_k PE(pos))[{a}] = {got[a]}, PE(pos+k) = {table[pos + k, a]!r}, miss {miss} > {bound}; pos={pos}, "
            f"k={k}, d={d_model}, base={base}"
        )


@settings(max_examples=25)
@given(st.integers(0, 99_999), st.integers(-99_999, 99_999))
def test_shift_property_holds_in_the_fast_tier_at_long_positions(pos, k):
    """Fast tier, d_model = 16, positions up to 10^5. Each float64 output x_hat is within
    D := E + U (|x| + E) + 2^-1075 of the truth x (fast bound E, then one rounding), so
    |M_hat P_hat - P_hat'|_a <= sum_b (D_M |P| + (|M| + D_M) D_P)_ab + D_P'_a; the product is formed
    exactly here."""
    k = max(-pos, min(k, 99_999 - pos))
    d = 16
    m_true, m_e = _m_truth_and_bound(k, d, 10000.0)
    p_true, p_e = truth_and_bound([pos, pos + k], d, 10000.0)
    table, m_hat = long_table(), pe_shift_matrix(k, d)
    got = _product_mp(m_hat, table[pos])
    with mpmath.workdps(30):
        dist = np.vectorize(lambda e, x: e + U * (abs(x) + e) + TINY, otypes=[object])
        dm, dp = dist(m_e, m_true), dist(p_e, p_true)
        for a in range(d):
            bound = (
                mpmath.fsum(dm[a, b] * abs(p_true[0, b]) + (abs(m_true[a, b]) + dm[a, b]) * dp[0, b] for b in range(d))
                + dp[1, a]
            )
            miss = abs(got[a] - mpmath.mpf(float(table[pos + k, a])))
            assert miss <= bound, f"(M_k PE(pos))[{a}] misses PE(pos+k) by {miss} > bound {bound}; pos={pos}, k={k}"


def test_shift_matrix_structure():
    """M_0 = I; M_{-k} = M_k^T (sin is odd, cos even: exact in both tiers); off-block entries are
    exactly 0; each block is a rotation [[cos, sin], [-sin, cos]] of angle k / base^(2i/d)."""
    for fn in (pe_shift_matrix, pe_shift_matrix_exact):
        assert_exact_equal(fn(0, 8), np.eye(8), f"{fn.__name__}(0)", "")
        for k in (1, 7, 12345):
            m = fn(k, 8)
            assert_exact_equal(fn(-k, 8), m.T, f"{fn.__name__}(-k) vs M_k^T", f"k={k}")
            off_block = np.kron(np.eye(4), np.ones((2, 2))) == 0
            assert np.all(m[off_block] == 0), f"{fn.__name__}({k}) has entries off the 2x2 blocks"
            assert m[0, 0] == m[1, 1] and m[0, 1] == -m[1, 0]
    assert pe_shift_matrix_exact(3, 2)[0, 1] == _rounded(lambda: mpmath.sin(3))
    assert pe_shift_matrix_exact(3, 2)[0, 0] == _rounded(lambda: mpmath.cos(3))


def test_shift_matrix_composes_and_is_orthogonal():
    """M_j M_k = M_{j+k} and M_k M_k^T = I for the exact tier's outputs, to within the rounding of
    its entries: per entry |(M_hat_j M_hat_k - M_{j+k})| <= gamma_3(U) (|M_hat_j| |M_hat_k|) + U |M_hat_{j+k}|
    (as in the shift-property test; here every row has two nonzero entries)."""
    for j, k in ((1, 2), (-5, 300), (4000, 96000)):
        a, b, c = (pe_shift_matrix_exact(n, 6) for n in (j, k, j + k))
        with mpmath.workprec(400):
            prod = np.array(
                [
                    [
                        mpmath.fsum(mpmath.mpf(float(a[r, t])) * mpmath.mpf(float(b[t, s])) for t in range(6))
                        for s in range(6)
                    ]
                    for r in range(6)
                ]
            )
        mag = _abs_product_mp(a, b)
        gram, gmag = _gram(b), _abs_product_mp(b, b.T)
        for r in range(6):
            for s in range(6):
                with mpmath.workprec(400):
                    bound = gamma(3) * mag[r, s] + U * abs(c[r, s]) + 2 * TINY
                    miss = abs(prod[r, s] - mpmath.mpf(float(c[r, s])))
                    gram_miss, gram_bound = abs(gram[r][s] - (r == s)), gamma(3) * gmag[r, s]
                assert miss <= bound, f"M_{j} M_{k} vs M_{j + k} at {(r, s)}: miss {miss} > {bound}"
                assert gram_miss <= gram_bound, f"(M_{k} M_{k}^T - I)[{r},{s}] = {gram[r][s] - (r == s)}"


def _abs_product_mp(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a| @ |b| for float64 matrices, exact (400 bits; the bounds use it as a magnitude)."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=object)
    with mpmath.workprec(400):
        for r in range(a.shape[0]):
            for s in range(b.shape[1]):
                out[r, s] = mpmath.fsum(
                    abs(mpmath.mpf(float(a[r, t]))) * abs(mpmath.mpf(float(b[t, s]))) for t in range(a.shape[1])
                )
    return out


def _gram(m: np.ndarray) -> list:
    with mpmath.workprec(400):
        return [
            [
                mpmath.fsum(mpmath.mpf(float(m[r, t])) * mpmath.mpf(float(m[s, t])) for t in range(m.shape[1]))
                for s in range(m.shape[0])
            ]
            for r in range(m.shape[0])
        ]


@pytest.mark.parametrize(
    ("k", "d_model", "error", "needle"),
    [
        (1.5, 4, TypeError, "k"),
        (True, 4, TypeError, "k"),
        ("3", 4, TypeError, "k"),
        (1, 3, ValueError, "d_model"),
        (1, -2, ValueError, "d_model"),
    ],
)
def test_pe_shift_matrix_rejects_bad_input(k, d_model, error, needle):
    for fn in (pe_shift_matrix, pe_shift_matrix_exact):
        with pytest.raises(error, match=needle):
            fn(k, d_model)
    for fn in (pe_shift_matrix, pe_shift_matrix_exact):
        with pytest.raises(ValueError, match="base"):
            fn(1, 4, base=math.inf)
