"""Every worked number in ../shared/seeds/000_3d3e892804d678ae.txt, one test per number.

Each test computes the number with the reference (both tiers where the equation has both),
rounds it the way the seed rounds it, compares with the printed value, and also checks the
unrounded value against an independent closed form (mpmath at 60 digits or exact fractions),
so a result that merely rounds right cannot pass by luck.

Tolerances (derived once, used throughout):
- Exact tier: API.md promises each result is the float64 nearest the real value (one
  correct rounding). The closed form below is evaluated at 60 digits (error < 10^-55 relative)
  and rounded to nearest by ``fractions.Fraction -> float`` (correct rounding in CPython), so the
  two must be *equal*.
- Fast tier: API.md promises an x87-extended evaluation (unit roundoff 2^-64) rounded once to
  float64 (unit roundoff u = 2^-53). Each seed computation is a handful of elementary operations
  (at most 4 exp/pow/sin/cos calls of <= 1 extended ulp = 2^-63 relative, and a few +,-,*,/ of
  2^-64), with condition numbers below 3 for these inputs (e.g. theta*cot(theta) <= 1 for the sine
  of an angle in (0, pi/2)); 64 * 2^-64 = 2^-58 bounds the extended-precision part with room for
  pow implemented as exp(y log x) (which amplifies log's error by |y log x| <= 2.4 here). To first
  order (second-order terms are below 2^-100) the relative error is therefore at most
  FAST_REL = u + 2^-58.
Imports of the reference's section modules are local to each test, so a module that is not
there fails only its own tests.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import mpmath
import numpy as np

U = 2.0**-53  # binary64 unit roundoff
FAST_REL = U + 2.0**-58  # fast-tier relative error bound (module docstring)
EXACT_REL = U  # a correctly rounded result is within u (relative) of the real value


def _nearest_float(x: mpmath.mpf) -> float:
    """The binary64 number nearest a (much more precise) mpmath value: exact Fraction, then float()."""
    man, exp = abs(x).man_exp
    value = Fraction(man) * Fraction(2) ** exp
    return float(-value if x < 0 else value)


def _closed_form(fn) -> mpmath.mpf:
    """Evaluate ``fn()`` with mpmath at 60 significant digits (a local precision change)."""
    with mpmath.workdps(60):
        return +fn()


def _quoted_matches(exact: mpmath.mpf, quoted: str, digits: int = 24) -> None:
    """Check a value quoted in this file against its closed form, to ``digits`` decimals."""
    with mpmath.workdps(60):
        miss = abs(exact - mpmath.mpf(quoted))
        assert miss < mpmath.mpf(10) ** -digits, f"quoted {quoted} disagrees with the closed form {exact}"


def _relative_miss(got: float, exact: mpmath.mpf) -> float:
    with mpmath.workdps(60):
        return float(abs((mpmath.mpf(got) - exact) / exact))


def _check_tiers(fast: float, exact_tier: float, exact: mpmath.mpf, what: str) -> None:
    """Fast within FAST_REL of the real value; exact tier equal to the nearest float64."""
    nearest = _nearest_float(exact)
    assert exact_tier == nearest, (
        f"{what}: exact tier gave {exact_tier!r}, the nearest float64 to {mpmath.nstr(exact, 20)} is {nearest!r}"
    )
    miss = _relative_miss(fast, exact)
    assert miss <= FAST_REL, (
        f"{what}: fast tier gave {fast!r}, real value {mpmath.nstr(exact, 20)}: relative miss {miss:.3g} "
        f"> bound {FAST_REL:.3g}"
    )


# ---------------------------------------------------------------------------------------------
# §1 Introduction
# ---------------------------------------------------------------------------------------------


def test_recurrent_path_three_hand_offs() -> None:
    """§1: 'Take "The cat sat down". ... Information about "The" reaches "down" only after
    surviving three hand-offs.' (4 positions: a recurrent path of n - 1 = 3 steps)."""
    from aiayn.reference.counts import layer_operations

    ops = layer_operations("recurrent", 4, 512)
    assert ops.maximum_path_length == 3, f"recurrent path over 4 words: {ops.maximum_path_length}, seed says 3"
    steps = ops.sequential_operations
    assert steps == 4, f"the RNN 'computes four steps in a strict chain', got {steps}"


def test_self_attention_path_single_step() -> None:
    """§1: 'The Transformer computes all four words' new representations at once, and "down" can
    look at "The" in a single step.'"""
    from aiayn.reference.counts import layer_operations

    ops = layer_operations("self_attention", 4, 512)
    assert (ops.maximum_path_length, ops.sequential_operations) == (1, 1), f"self-attention over 4 words: {ops}"


# ---------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder stacks: LayerNorm((2, 0) + (1, 1)) = (1, -1)
# ---------------------------------------------------------------------------------------------

_ONES2, _ZEROS2 = np.ones(2), np.zeros(2)


def test_residual_sum_3_1() -> None:
    """§3.1: 'Say a word's vector is x = (2, 0) and the attention step proposes the change
    Sublayer(x) = (1, 1). The residual adds them: (3, 1).' Checked with the labelled pre-norm
    form x + Sublayer(LayerNorm(x)) and a constant sub-layer, whose output is exactly that sum."""
    from aiayn.reference.layers import sublayer_connection

    x = np.array([2.0, 0.0])
    got = sublayer_connection(x, lambda t: np.ones_like(t), _ONES2, _ZEROS2, 0.0, norm="pre")
    assert np.array_equal(got, [3.0, 1.0]), f"x + Sublayer = {got}, seed says (3, 1)"


def test_layer_norm_mean_2() -> None:
    """§3.1: 'the mean is 2 and the standard deviation is 1' for (3, 1). Recovered from the
    reference's LayerNorm y = (s - mean)/std (eps = 0): mean = s_0 - std * y_0."""
    from aiayn.reference.layers import layer_norm, layer_norm_exact

    s = np.array([3.0, 1.0])
    for tier in (layer_norm, layer_norm_exact):
        y = tier(s, _ONES2, _ZEROS2, 0.0)
        std = (s[0] - s[1]) / (y[0] - y[1])  # exact: 2 / 2
        mean = s[0] - std * y[0]
        assert mean == 2.0, f"{tier.__name__}: mean recovered from y={y} is {mean}, seed says 2"


def test_layer_norm_std_1() -> None:
    """§3.1: 'the mean is 2 and the standard deviation is 1' for (3, 1) (population std, eps = 0):
    std = (s_0 - s_1) / (y_0 - y_1) from the reference's LayerNorm output y."""
    from aiayn.reference.layers import layer_norm, layer_norm_exact

    s = np.array([3.0, 1.0])
    for tier in (layer_norm, layer_norm_exact):
        y = tier(s, _ONES2, _ZEROS2, 0.0)
        std = (s[0] - s[1]) / (y[0] - y[1])
        assert std == 1.0, f"{tier.__name__}: std recovered from y={y} is {std}, seed says 1"


def test_layer_norm_3_1_is_1_minus_1() -> None:
    """§3.1: 'With the numbers: LayerNorm((2, 0) + (1, 1)) = LayerNorm((3, 1)) = (1, −1).'
    Every step is exact in binary (mean 2, variance 1, sqrt 1), so both tiers give (1, -1) exactly."""
    from aiayn.reference.layers import layer_norm, layer_norm_exact

    for tier in (layer_norm, layer_norm_exact):
        got = tier(np.array([3.0, 1.0]), _ONES2, _ZEROS2, 0.0)
        assert np.array_equal(got, [1.0, -1.0]), f"{tier.__name__}((3, 1), eps=0) = {got}, seed says (1, -1)"


def test_post_norm_sublayer_connection_gives_1_minus_1() -> None:
    """§3.1: 'LayerNorm((2, 0) + (1, 1)) = LayerNorm((3, 1)) = (1, −1)', as the paper's post-norm
    connection LayerNorm(x + Sublayer(x)) with Sublayer(x) = (1, 1)."""
    from aiayn.reference.layers import sublayer_connection

    got = sublayer_connection(np.array([2.0, 0.0]), lambda t: np.ones_like(t), _ONES2, _ZEROS2, 0.0)
    assert np.array_equal(got, [1.0, -1.0]), f"LayerNorm(x + Sublayer(x)) = {got}, seed says (1, -1)"


# ---------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention: softmax(2.0, 1.0, 0.5)
# ---------------------------------------------------------------------------------------------

SCORES = np.array([2.0, 1.0, 0.5])
# Closed forms, quoted to 25 digits (checked against mpmath in _share_check):
SHARE_ANIMAL = "0.6285317192117624482519807"  # e^2 / (e^2 + e + e^0.5)
SHARE_TIRED = "0.2312238976221490672258205"  # e^1 / (...)
SHARE_STREET = "0.1402443831660884845221988"  # e^0.5 / (...)


def _share_exact(index: int) -> mpmath.mpf:
    """e^(z_index) / sum_j e^(z_j) for the seed's scores, at 60 digits."""
    return _closed_form(lambda: mpmath.exp(SCORES[index]) / mpmath.fsum(mpmath.exp(z) for z in SCORES))


def _share_check(index: int, quoted: str, printed: float) -> None:
    from aiayn.reference.attention import softmax, softmax_exact

    exact = _share_exact(index)
    _quoted_matches(exact, quoted)
    fast, exact_tier = softmax(SCORES)[index], softmax_exact(SCORES)[index]
    _check_tiers(fast, exact_tier, exact, f"softmax(2.0, 1.0, 0.5)[{index}]")
    for tier, value in (("fast", fast), ("exact", exact_tier)):
        assert round(value, 2) == printed, f"{tier} share {value!r} rounds to {round(value, 2)}, seed prints {printed}"


def test_softmax_share_animal_0_63() -> None:
    """§3.2.1: 'So “animal” gets 7.39 / 11.76 = 0.63'."""
    _share_check(0, SHARE_ANIMAL, 0.63)


def test_softmax_share_tired_0_23() -> None:
    """§3.2.1: '“tired” gets 0.23'."""
    _share_check(1, SHARE_TIRED, 0.23)


def test_softmax_share_street_0_14() -> None:
    """§3.2.1: '“street” gets 0.14'."""
    _share_check(2, SHARE_STREET, 0.14)


def _exp_from_softmax(z: float, quoted: str, printed: float) -> None:
    """e^z recovered from the reference as a ratio of shares: softmax(z, 0) = (e^z, 1) / (e^z + 1).

    The ratio is formed exactly (Fractions), so its error comes only from the two shares: with
    relative errors <= r each, the ratio is within (1 + r)/(1 - r) - 1 <= 2r / (1 - r) of e^z.
    """
    from aiayn.reference.attention import softmax, softmax_exact

    exact = _closed_form(lambda: mpmath.exp(z))
    _quoted_matches(exact, quoted)
    for tier, r in ((softmax, FAST_REL), (softmax_exact, EXACT_REL)):
        p = tier(np.array([z, 0.0]))
        ratio = Fraction(float(p[0])) / Fraction(float(p[1]))
        with mpmath.workdps(60):
            miss = abs(mpmath.mpf(ratio.numerator) / ratio.denominator / exact - 1)
        assert miss <= 2 * r / (1 - r), f"{tier.__name__}: share ratio {float(ratio)!r} misses e^{z} by {miss:.3g}"
        assert round(float(ratio), 2) == printed, f"{tier.__name__}: e^{z} = {float(ratio)!r}, seed prints {printed}"


def test_exp_2_0_is_7_39() -> None:
    """§3.2.1: 'Softmax turns them into shares: e^2.0 = 7.39'."""
    _exp_from_softmax(2.0, "7.389056098930650227230427", 7.39)


def test_exp_1_0_is_2_72() -> None:
    """§3.2.1: 'e^1.0 = 2.72'."""
    _exp_from_softmax(1.0, "2.718281828459045235360287", 2.72)


def test_exp_0_5_is_1_65() -> None:
    """§3.2.1: 'e^0.5 = 1.65'."""
    _exp_from_softmax(0.5, "1.648721270700128146848651", 1.65)


def test_exp_total_11_76() -> None:
    """§3.2.1: '... and e^0.5 = 1.65, which total 11.76.'

    From the reference: appending a score 0 gives it the share p = 1 / (S + 1), S = e^2 + e + e^0.5,
    so S = 1/p - 1 (formed exactly). With p's relative error <= r, S's is <= (S + 1)/S * r/(1 - r).
    """
    from aiayn.reference.attention import softmax, softmax_exact

    exact = _closed_form(lambda: mpmath.exp(2) + mpmath.exp(1) + mpmath.exp(mpmath.mpf(1) / 2))
    _quoted_matches(exact, "11.75605919808982360943937", 23)
    for tier, r in ((softmax, FAST_REL), (softmax_exact, EXACT_REL)):
        p = tier(np.array([2.0, 1.0, 0.5, 0.0]))[3]
        total = 1 / Fraction(float(p)) - 1
        with mpmath.workdps(60):
            miss = abs((mpmath.mpf(total.numerator) / total.denominator - exact) / exact)
            bound = (exact + 1) / exact * r / (1 - r)
        assert miss <= bound, f"{tier.__name__}: total {float(total)!r} misses {exact} by {float(miss):.3g} relative"
        assert round(float(total), 2) == 11.76, f"{tier.__name__}: total {float(total)!r}, seed prints 11.76"


def test_attention_output_with_one_hot_values_0_63_0_23_0_14() -> None:
    """§3.2.1: 'multiplying by V gives 0.63·V(animal) + 0.23·V(tired) + 0.14·V(street)'; with the
    seed's one-hot stand-in values the output row is [0.63, 0.23, 0.14]. Eq. (1) with d_k = 1
    (so the scale is 1): q = (1), keys (2.0), (1.0), (0.5), V = I_3. Each output entry is one
    share times 1 plus zeros, so its error is the share's."""
    from aiayn.reference.attention import scaled_dot_product_attention, scaled_dot_product_attention_exact

    q, k, v = np.array([[1.0]]), SCORES[:, None], np.eye(3)
    fast = scaled_dot_product_attention(q, k, v)
    exact_tier = scaled_dot_product_attention_exact(q, k, v)
    assert fast.shape == exact_tier.shape == (1, 3), f"output shapes {fast.shape}, {exact_tier.shape}, expected (1, 3)"
    for j in range(3):
        _check_tiers(fast[0, j], exact_tier[0, j], _share_exact(j), f"attention output [{j}]")
    for tier, out in (("fast", fast), ("exact", exact_tier)):
        rounded = [round(float(x), 2) for x in out[0]]
        assert rounded == [0.63, 0.23, 0.14], f"{tier}: {out[0]} rounds to {rounded}, seed prints [0.63, 0.23, 0.14]"


# The √d_k argument. Raw scores q·k of independent standard-normal q, k in R^64 have mean 0 and
# variance E[(q·k)^2] = d_k = 64; Var((q·k)^2) = E[(q·k)^4] - d_k^2 = (3 d_k^2 + 6 d_k) - d_k^2 =
# 2 d_k^2 + 6 d_k (E[(q·k)^4 | k] = 3 |k|^4 and E|k|^4 = d_k^2 + 2 d_k). The mean of M independent
# squares therefore estimates d_k with standard deviation sigma = sqrt((2 d_k^2 + 6 d_k) / M), and
# by the central limit theorem it lies within 5 sigma with probability 1 - 6e-7. The seed is fixed,
# so the test is deterministic; a reference that forgot the 1/√d_k scale (or used d_k or d_model)
# lands hundreds of sigma away.
D_K, PAIRS, Z = 64, 20_000, 5.0


def _qk_pairs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20170612)  # arXiv submission date of the paper
    return rng.standard_normal((PAIRS, D_K)), rng.standard_normal((PAIRS, D_K))


def test_raw_score_spread_sqrt_64_is_8_0() -> None:
    """§3.2.1: 'the paper's d_k = 64, so raw scores typically swing by √64 = 8.'; Python:
    'math.sqrt(variance)  # → 8.0'. Raw q·k from the reference's softmax-free dot product
    (the tied projection x·Eᵀ of §3.4, in blocks, keeping each block's diagonal)."""
    from aiayn.reference.layers import output_logits

    assert math.sqrt(D_K) == 8.0  # the seed's exact arithmetic
    q, k = _qk_pairs()
    block = 20  # small blocks: the work is PAIRS x block dot products
    dots = np.concatenate(
        [np.diagonal(output_logits(q[i : i + block], k[i : i + block])) for i in range(0, PAIRS, block)]
    )  # (PAIRS,): q_i · k_i
    variance = float(np.mean(dots**2))  # mean known to be 0
    sigma = math.sqrt((2 * D_K**2 + 6 * D_K) / PAIRS)
    assert abs(variance - D_K) <= Z * sigma, (
        f"mean (q·k)^2 over {PAIRS} pairs = {variance:.3f}, expected {D_K} within {Z} sigma = {Z * sigma:.3f}"
    )
    assert round(math.sqrt(variance)) == 8, f"spread {math.sqrt(variance):.3f}, seed says 8"


def test_scaled_score_spread_1_0() -> None:
    """§3.2.1: 'After dividing by 8 they typically swing by about 1'; Python:
    'math.sqrt(variance) / math.sqrt(d_k)  # → 1.0'. The scaled score s = q·k/√d_k is read back
    from Eq. (1) itself: with keys (k, 0) and values (1, 0) the output is the first share
    sigmoid(s), so s = log(p / (1 - p)). Var(s^2) = (2 d_k^2 + 6 d_k) / d_k^2, hence sigma below.
    (The logit's rounding error, <= 1e-13 for |s| < 20, is negligible against 5 sigma = 0.05.)"""
    from aiayn.reference.attention import scaled_dot_product_attention

    assert math.sqrt(D_K) / math.sqrt(D_K) == 1.0  # the seed's exact arithmetic
    q, k = _qk_pairs()
    keys = np.stack([k, np.zeros_like(k)], axis=1)  # (PAIRS, 2, d_k)
    values = np.broadcast_to(np.array([[1.0], [0.0]]), (PAIRS, 2, 1))  # (PAIRS, 2, 1)
    p = scaled_dot_product_attention(q[:, None, :], keys, values)[:, 0, 0]  # (PAIRS,)
    scaled = np.log(p) - np.log1p(-p)
    variance = float(np.mean(scaled**2))
    sigma = math.sqrt((2 * D_K**2 + 6 * D_K) / D_K**2 / PAIRS)
    assert abs(variance - 1.0) <= Z * sigma, (
        f"mean s^2 over {PAIRS} pairs = {variance:.4f}, expected 1 within {Z} sigma = {Z * sigma:.4f}"
    )
    assert round(math.sqrt(variance), 1) == 1.0, f"scaled spread {math.sqrt(variance):.4f}, seed says 1.0"


def test_scaling_divides_by_exactly_8_for_d_k_64() -> None:
    """§3.2.1: 'After dividing by 8 ...': Eq. (1) at d_k = 64 on a few pairs, exact tier, equals the
    nearest float64 to sigmoid(q·k / 8) computed from the exact dot product (Fractions)."""
    from aiayn.reference.attention import scaled_dot_product_attention_exact

    q, k = _qk_pairs()
    q, k = q[:3], k[:3]
    keys = np.stack([k, np.zeros_like(k)], axis=1)
    values = np.broadcast_to(np.array([[1.0], [0.0]]), (3, 2, 1))
    got = scaled_dot_product_attention_exact(q[:, None, :], keys, values)[:, 0, 0]
    for i in range(3):
        dot = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(q[i], k[i], strict=True))
        expected = _closed_form(lambda dot=dot: 1 / (1 + mpmath.exp(-mpmath.mpf(dot.numerator) / dot.denominator / 8)))
        assert got[i] == _nearest_float(expected), f"pair {i}: share {got[i]!r}, expected sigmoid(q·k/8) = {expected}"


# ---------------------------------------------------------------------------------------------
# §3.2.2 Multi-head attention
# ---------------------------------------------------------------------------------------------


def _mha_params(rng: np.random.Generator, d_model: int) -> dict[str, np.ndarray]:
    return {name: rng.standard_normal((d_model, d_model)) / math.sqrt(d_model) for name in ("w_q", "w_k", "w_v", "w_o")}


def test_head_shape_10_by_64() -> None:
    """§3.2.2: 'a 10-word sentence gives Q, K, V of shape 10 × 512. Each W_i^Q is 512 × 64, so each
    head sees 10 × 64.'; Python: '(n, d_k)  # → (10, 64)'. Head 0 of the canonical layout (columns
    0:64 of w_q, w_k, w_v) run through Eq. (1)."""
    from aiayn.reference.attention import scaled_dot_product_attention

    n, d_model, h = 10, 512, 8
    d_k = d_model // h
    assert d_k == 64
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((n, d_model)), _mha_params(rng, d_model)
    head = scaled_dot_product_attention(x @ w["w_q"][:, :d_k], x @ w["w_k"][:, :d_k], x @ w["w_v"][:, :d_k])
    assert head.shape == (10, 64), f"one head's output shape {head.shape}, seed says (10, 64)"


def test_concat_shape_10_by_512() -> None:
    """§3.2.2: 'Eight heads concatenated give 10 × 512, and W^O (512 × 512) keeps it at 10 × 512.';
    Python: '(n, h * d_k)  # → (10, 512)'. multi_head_attention with W^O = I returns the
    concatenation itself; with a random W^O the shape is kept."""
    from aiayn.reference.attention import multi_head_attention

    n, d_model, h = 10, 512, 8
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((n, d_model)), _mha_params(rng, d_model)
    concat = multi_head_attention(x, x, x, {**w, "w_o": np.eye(d_model)}, h)
    assert concat.shape == (10, 512), f"Concat(head_1..head_8) shape {concat.shape}, seed says (10, 512)"
    mixed = multi_head_attention(x, x, x, w, h)
    assert mixed.shape == (10, 512), f"after W^O shape {mixed.shape}, seed says (10, 512)"


def test_attention_projection_weights_1_048_576() -> None:
    """§3.2.2: 'The layer's projection weights total 4 × 512 × 512 = 1,048,576 numbers.'"""
    from aiayn.reference.counts import BASE, multi_head_attention_parameters

    got = multi_head_attention_parameters(BASE, biases=False)
    assert got == 4 * 512 * 512, f"projection weights {got}, expected 4 * 512 * 512"
    assert f"{got:,}" == "1,048,576", f"{got:,} != seed's 1,048,576"


# ---------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward: x = (1, -1), W1 = [[1, 0, -1], [0, 1, 1]], W2 = [[2, 0], [0, 1], [1, 1]]
# ---------------------------------------------------------------------------------------------

X_FFN = np.array([1.0, -1.0])
W1 = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
W2 = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
B1, B2 = np.zeros(3), np.zeros(2)
# Read the 3 hidden units through 2-wide outputs: SELECT_01 passes units 0 and 1, SELECT_2 unit 2.
SELECT_01 = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
SELECT_2 = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])


def _hidden_after_relu(tier, x: np.ndarray) -> np.ndarray:
    """max(0, x W1) through Eq. (2) itself, using W2 that select hidden units (all values exact)."""
    first, last = tier(x, W1, B1, SELECT_01, B2), tier(x, W1, B1, SELECT_2, B2)
    return np.array([first[0], first[1], last[0]])


def test_ffn_widened_1_minus1_minus2() -> None:
    """§3.3: 'multiply by W₁ = [[1, 0, −1], [0, 1, 1]] to widen it to 3 numbers: ... = (1, −1, −2)'.
    The pre-activation a = x W1 read from Eq. (2) as max(0, a) - max(0, -a) = a, i.e. the hidden
    units of FFN(x) minus those of FFN(-x). Integer arithmetic: exact in both tiers."""
    from aiayn.reference.layers import feed_forward, feed_forward_exact

    for tier in (feed_forward, feed_forward_exact):
        widened = _hidden_after_relu(tier, X_FFN) - _hidden_after_relu(tier, -X_FFN)
        assert np.array_equal(widened, [1.0, -1.0, -2.0]), f"{tier.__name__}: x W1 = {widened}, seed says (1, -1, -2)"


def test_ffn_relu_1_0_0() -> None:
    """§3.3: 'Next, apply ReLU, max(0, ·), which keeps positives and zeroes negatives: (1, 0, 0).'"""
    from aiayn.reference.layers import feed_forward, feed_forward_exact

    for tier in (feed_forward, feed_forward_exact):
        hidden = _hidden_after_relu(tier, X_FFN)
        assert np.array_equal(hidden, [1.0, 0.0, 0.0]), f"{tier.__name__}: ReLU(x W1) = {hidden}, seed says (1, 0, 0)"


def test_ffn_output_2_0() -> None:
    """§3.3: 'Finally, multiply by W₂ = [[2, 0], [0, 1], [1, 1]] to come back to 2 numbers: (2, 0).
    The biases are zero here'. Exact integer arithmetic in both tiers."""
    from aiayn.reference.layers import feed_forward, feed_forward_exact

    for tier in (feed_forward, feed_forward_exact):
        got = tier(X_FFN, W1, B1, W2, B2)
        assert np.array_equal(got, [2.0, 0.0]), f"{tier.__name__}: FFN(1, -1) = {got}, seed says (2, 0)"


def test_ffn_parameters_2_099_712() -> None:
    """§3.3: 'That is 2 × 512 × 2048 + 2048 + 512 = 2,099,712 parameters per layer'."""
    from aiayn.reference.counts import BASE, feed_forward_parameters

    got = feed_forward_parameters(BASE)
    assert got == 2 * 512 * 2048 + 2048 + 512, f"FFN parameters {got}, expected 2*512*2048 + 2048 + 512"
    assert f"{got:,}" == "2,099,712", f"{got:,} != seed's 2,099,712"


def test_ffn_about_twice_attention_projections() -> None:
    """§3.3: '2,099,712 parameters per layer, about twice the attention layer's projections.'
    2,099,712 / 1,048,576 = 2.0024..."""
    from aiayn.reference.counts import BASE, feed_forward_parameters, multi_head_attention_parameters

    ratio = Fraction(feed_forward_parameters(BASE), multi_head_attention_parameters(BASE, biases=False))
    assert ratio == Fraction(2_099_712, 1_048_576), f"FFN / attention = {ratio}"
    assert round(float(ratio)) == 2, f"ratio {float(ratio):.4f} is not 'about twice'"


# ---------------------------------------------------------------------------------------------
# §3.4 Embeddings and softmax
# ---------------------------------------------------------------------------------------------


def test_sqrt_512_is_22_6() -> None:
    """§3.4: 'If “cat” is token 17, its embedding is simply row 17 of the table, multiplied by
    √d_model = √512 ≈ 22.6.' A table whose row 17 is the unit vector e_0 returns √512 in entry 0."""
    from aiayn.reference.layers import embedding_lookup, embedding_lookup_exact

    table = np.zeros((18, 512))
    table[17, 0] = 1.0
    exact = _closed_form(lambda: mpmath.sqrt(512))
    _quoted_matches(exact, "22.62741699796952078082702", 23)
    fast, exact_tier = embedding_lookup(np.array([17]), table), embedding_lookup_exact(np.array([17]), table)
    for tier, out in (("fast", fast), ("exact", exact_tier)):
        assert out.shape == (1, 512) and not np.any(out[0, 1:]), f"{tier}: row 17 scaled should be (√512, 0, ...)"
    _check_tiers(fast[0, 0], exact_tier[0, 0], exact, "embedding_lookup scale")
    assert round(fast[0, 0], 1) == round(exact_tier[0, 0], 1) == 22.6, f"scale {fast[0, 0]!r}, seed says 22.6"


def test_embedding_numbers_18_944_000() -> None:
    """§3.4: 'with a vocabulary of about 37,000 tokens, E is 37,000 × 512 = 18,944,000 numbers.'"""
    from aiayn.reference.counts import BASE, parameter_breakdown

    got = parameter_breakdown(BASE, vocab_size=37_000)["embedding"]
    assert got == 37_000 * 512, f"embedding numbers {got}, expected 37000 * 512"
    assert f"{got:,}" == "18,944,000", f"{got:,} != seed's 18,944,000"


def test_sharing_saves_two_copies_37_888_000() -> None:
    """§3.4: 'Sharing it between the input, the output and the final linear layer saves two more
    copies of that.' Three separate matrices minus one shared: 2 × 18,944,000 = 37,888,000."""
    from aiayn.reference.counts import BASE, parameter_count

    saved = parameter_count(BASE, embeddings="separate_all") - parameter_count(BASE, embeddings="shared")
    assert saved == 2 * 37_000 * 512 == 37_888_000, f"sharing saves {saved}, expected two copies of 18,944,000"


# ---------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# ---------------------------------------------------------------------------------------------


@functools.cache
def _pe_tables(length: int) -> tuple[np.ndarray, np.ndarray]:
    """Both tiers of PE for d_model = 512 (cached: several tests read the same table)."""
    from aiayn.reference.positional import positional_encoding, positional_encoding_exact

    fast, exact = positional_encoding(length, 512), positional_encoding_exact(length, 512)
    assert fast.shape == exact.shape == (length, 512), f"PE shapes {fast.shape}, {exact.shape}"
    return fast, exact


def _pe_check(pos: int, dim: int, closed, quoted: str, printed: str) -> None:
    fast, exact_tier = _pe_tables(max(2, pos + 1))
    exact = _closed_form(closed)
    _quoted_matches(exact, quoted, 23)
    _check_tiers(fast[pos, dim], exact_tier[pos, dim], exact, f"PE({pos}, {dim})")
    for tier, value in (("fast", fast[pos, dim]), ("exact", exact_tier[pos, dim])):
        assert f"{value:.3f}" == printed, f"{tier}: PE({pos}, {dim}) = {value!r} prints {value:.3f}, seed {printed}"


def test_pe_1_0_is_0_841() -> None:
    """§3.5: 'For position 1, the fastest pair of dimensions (i = 0) gets sin(1) = 0.841';
    'PE(1, 0) = sin(1/1) = 0.841'."""
    _pe_check(1, 0, lambda: mpmath.sin(1), "0.8414709848078965066525023", "0.841")


def test_pe_1_1_is_0_540() -> None:
    """§3.5: '... and cos(1) = 0.540'; 'PE(1, 1) = cos(1/1) = 0.540'."""
    _pe_check(1, 1, lambda: mpmath.cos(1), "0.5403023058681397174009366", "0.540")


def test_pe_1_2_is_0_822() -> None:
    """§3.5: 'The next pair (i = 1) turns slightly slower: sin(1 / 1.0366) = 0.822'."""
    angle = lambda: mpmath.power(10000, -mpmath.mpf(2) / 512)  # noqa: E731  (1 / 1.0366...)
    _pe_check(1, 2, lambda: mpmath.sin(angle()), "0.8218561900175317087756148", "0.822")


def test_pe_1_3_is_0_570() -> None:
    """§3.5: '... and cos = 0.570.'"""
    angle = lambda: mpmath.power(10000, -mpmath.mpf(2) / 512)  # noqa: E731  (1 / 1.0366...)
    _pe_check(1, 3, lambda: mpmath.cos(angle()), "0.5696950086931311821870739", "0.570")


def test_pe_10_128_is_0_841() -> None:
    """§3.5: 'At position 10, dimension pair i = 64 divides by exactly 10, so it shows sin(1) =
    0.841 again.'; 'PE(10, 128) = sin(10/10) = 0.841'. The real value is exactly sin(1)."""
    _pe_check(10, 128, lambda: mpmath.sin(1), "0.8414709848078965066525023", "0.841")


def _divisor(pos: int, dim: int, quoted: str) -> list[tuple[str, float, float]]:
    """The pair's divisor base^(2i/d_model) = pos / angle, angle = atan2(PE(pos, 2i), PE(pos, 2i+1))
    from the reference's table (atan2 at 60 digits on the float64 entries, so only their errors
    count). Entries with absolute errors e_s, e_c move the angle by at most (|c| e_s + |s| e_c) /
    (s^2 + c^2) <= e_s + e_c; each entry's error is at most r times its size, so the angle's relative
    error is at most r (|s| + |c|) / angle and the divisor's the same to first order.
    Returns (tier, divisor, relative bound) for both tiers."""
    results = []
    for name, table, r in zip(("fast", "exact"), _pe_tables(max(2, pos + 1)), (FAST_REL, EXACT_REL), strict=True):
        s, c = float(table[pos, dim]), float(table[pos, dim + 1])
        with mpmath.workdps(60):
            angle = mpmath.atan2(s, c)
            divisor = pos / angle
            bound = r * (abs(s) + abs(c)) / angle
        results.append((name, divisor, float(bound)))
    for name, divisor, bound in results:
        with mpmath.workdps(60):
            miss = float(abs(divisor - mpmath.mpf(quoted)) / mpmath.mpf(quoted))
        assert miss <= bound * (1 + 1e-9), f"{name}: divisor {divisor} misses {quoted} by {miss:.3g} > {bound:.3g}"
    return [(name, float(divisor), bound) for name, divisor, bound in results]


def test_pe_divisor_pair_1_is_1_0366() -> None:
    """§3.5: 'sin(1 / 1.0366) = 0.822' (the i = 1 divisor 10000^(2/512) = 1.0366...)."""
    exact = _closed_form(lambda: mpmath.power(10000, mpmath.mpf(2) / 512))
    _quoted_matches(exact, "1.036632928437697997291652", 23)
    for name, divisor, _ in _divisor(1, 2, "1.036632928437697997291652"):
        assert round(divisor, 4) == 1.0366, f"{name}: divisor {divisor!r}, seed prints 1.0366"


def test_pe_divisor_pair_64_is_10() -> None:
    """§3.5: 'pair i = 64 has 10000^128/512 = 10'; Python: '10000 ** (128 / 512)  # → 10.0'."""
    assert 10000 ** (128 / 512) == 10.0  # the seed's own line (exact here: pow of 10^4 to 0.25)
    for name, divisor, _ in _divisor(10, 128, "10"):
        assert round(divisor, 1) == 10.0, f"{name}: divisor {divisor!r}, seed prints 10.0"


# ---------------------------------------------------------------------------------------------
# §4 Why self-attention
# ---------------------------------------------------------------------------------------------


def test_attention_vs_recurrence_flips_at_n_512() -> None:
    """§4: 'While sentences are shorter than the vector width (n < d = 512), self-attention is
    cheaper ... Past n = 512 the balance flips.' (n²·d vs n·d², equal at n = d)."""
    from aiayn.reference.counts import layer_operations

    def cost(t: str, n: int) -> int:
        return layer_operations(t, n, 512).complexity

    assert cost("self_attention", 511) < cost("recurrent", 511)
    assert cost("self_attention", 512) == cost("recurrent", 512)
    assert cost("self_attention", 513) > cost("recurrent", 513)


# ---------------------------------------------------------------------------------------------
# §5 Training: lrate (Eq. 3) and label smoothing
# ---------------------------------------------------------------------------------------------


def _lrate_check(args: tuple, closed, quoted: str, rounded: float, scale: float, digits: int) -> None:
    from aiayn.reference.training import lrate, lrate_exact

    exact = _closed_form(closed)
    _quoted_matches(exact, quoted, 25)
    fast, exact_tier = float(lrate(*args)), float(lrate_exact(*args))
    _check_tiers(fast, exact_tier, exact, f"lrate{args}")
    for tier, value in (("fast", fast), ("exact", exact_tier)):
        assert round(value * scale, digits) == rounded, f"{tier}: lrate{args} = {value!r}, seed prints {rounded}"


def test_lrate_d_model_factor_0_0442() -> None:
    """§5: 'round(d_model ** -0.5, 4)  # → 0.0442' (Eq. 3's first factor, 512^-0.5). Read from
    Eq. (3) at step 1 with warmup 1, where min(1^-0.5, 1 * 1^-1.5) = 1."""
    _lrate_check((1, 512, 1), lambda: 1 / mpmath.sqrt(512), "0.04419417382415922027505277", 0.0442, 1, 4)


def test_lrate_warmup_factor_0_0158() -> None:
    """§5: 'round(4000 ** -0.5, 4)  # → 0.0158'. Read from Eq. (3) with d_model = 1 at step 4000,
    where step^-0.5 = step * warmup^-1.5 = 4000^-0.5."""
    _lrate_check((4000, 1, 4000), lambda: 1 / mpmath.sqrt(4000), "0.01581138830084189665999447", 0.0158, 1, 4)


def test_lrate_peak_7_0e_minus_4_at_4000() -> None:
    """§5: '# the peak, in units of 10^-4 / round(lrate(4000) * 1e4, 1)  # → 7.0'.
    512^-0.5 * 4000^-0.5 = 1/sqrt(2,048,000) = 6.9877e-4; and it is the peak (steps 3999, 4001 lower)."""
    from aiayn.reference.training import lrate, lrate_exact

    _lrate_check((4000, 512), lambda: 1 / mpmath.sqrt(2_048_000), "0.0006987712429686842801278668", 7.0, 1e4, 1)
    for tier in (lrate, lrate_exact):
        before, peak, after = (float(tier(s, 512)) for s in (3999, 4000, 4001))
        assert before < peak > after, f"{tier.__name__}: steps 3999/4000/4001 give {before}, {peak}, {after}"


def test_lrate_at_100000_is_1_4e_minus_4() -> None:
    """§5: '# decayed by step 100,000 / round(lrate(100_000) * 1e4, 1)  # → 1.4'.
    (512 * 100,000)^-0.5 = 1/sqrt(51,200,000) = 1.3975e-4."""
    _lrate_check((100_000, 512), lambda: 1 / mpmath.sqrt(51_200_000), "0.0001397542485937368560255734", 1.4, 1e4, 1)


K_VOCAB, EPS_LS = 37_000, 0.1
EPS_FLOAT = Fraction(EPS_LS)  # the binary64 value the reference receives: 0.1000000000000000055...


@functools.cache
def _smoothed_rows() -> tuple[np.ndarray, np.ndarray]:
    from aiayn.reference.training import label_smoothing, label_smoothing_exact

    targets = np.array([0])
    fast, exact = label_smoothing(targets, K_VOCAB, EPS_LS), label_smoothing_exact(targets, K_VOCAB, EPS_LS)
    assert fast.shape == exact.shape == (1, K_VOCAB), f"smoothed shapes {fast.shape}, {exact.shape}"
    return fast[0], exact[0]


def test_smoothed_correct_token_0_900003() -> None:
    """§5: 'y'_k = (1 − ε_ls) y_k + ε_ls / K ... # the correct token, y_k = 1 /
    round(smooth(1), 6)  # → 0.900003' with ε_ls = 0.1, K = 37,000.
    Real value for ε = 1/10: 0.9 + 1/370,000 = 333,001/370,000 = 0.9000027027...; the reference
    receives the binary64 ε, so the exact tier must equal the nearest float to (1 - ε) + ε/K for
    that ε (the two real values differ by ~5e-18, below half an ulp of 0.9, 5.6e-17)."""
    fast, exact_tier = _smoothed_rows()
    value = (1 - EPS_FLOAT) + EPS_FLOAT / K_VOCAB
    exact = _closed_form(lambda: mpmath.mpf(value.numerator) / value.denominator)
    _check_tiers(float(fast[0]), float(exact_tier[0]), exact, "smoothed target, y_k = 1")
    assert abs(float(exact_tier[0]) - 333_001 / 370_000) < 1e-15
    for tier, v in (("fast", fast[0]), ("exact", exact_tier[0])):
        assert round(float(v), 6) == 0.900003, f"{tier}: {v!r} rounds to {round(float(v), 6)}, seed prints 0.900003"


def test_smoothed_other_token_0_0000027() -> None:
    """§5: '# every other token, y_k = 0 / print(f"{smooth(0):.7f}")  # → 0.0000027'
    (ε_ls / K = 0.1 / 37,000 = 2.7027e-6), the same for all 36,999 other tokens."""
    fast, exact_tier = _smoothed_rows()
    value = EPS_FLOAT / K_VOCAB
    exact = _closed_form(lambda: mpmath.mpf(value.numerator) / value.denominator)
    _check_tiers(float(fast[1]), float(exact_tier[1]), exact, "smoothed target, y_k = 0")
    for tier, row in (("fast", fast), ("exact", exact_tier)):
        assert np.all(row[1:] == row[1]), f"{tier}: the 36,999 non-target entries differ"
        assert f"{row[1]:.7f}" == "0.0000027", f"{tier}: {row[1]!r} prints {row[1]:.7f}, seed prints 0.0000027"


# ---------------------------------------------------------------------------------------------
# Abstract and §6: training time and cost
# ---------------------------------------------------------------------------------------------


def test_big_model_3_5_days_on_8_gpus() -> None:
    """Abstract: 'the big model trained in 3.5 days on 8 GPUs.' (§5.2: 8 P100 GPUs, 3.5 days)."""
    from aiayn.reference.counts import PAPER_TRAINING

    big = PAPER_TRAINING["big"]
    assert (big.num_gpus, big.gpu, big.hours) == (8, "P100", 3.5 * 24), f"big run recorded as {big}"


def test_base_cost_3_3e18_flops() -> None:
    """§6: 'The base Transformer ... (3.3 × 10¹⁸ FLOPs, ...)'. §6.1: 12 h x 8 P100 x 9.5 TFLOPS =
    43,200 s x 8 x 9.5e12 = 3.2832e18 (a product of four numbers: relative error <= gamma_4)."""
    from aiayn.reference.counts import training_flops

    got = training_flops(12, 8, "P100")
    gamma_4 = 4 * U / (1 - 4 * U)
    assert abs(got - 3.2832e18) <= gamma_4 * 3.2832e18, f"base cost {got!r}, expected 3.2832e18"
    assert f"{got:.1e}" == "3.3e+18", f"base cost {got:.1e}, seed prints 3.3 × 10¹⁸"
