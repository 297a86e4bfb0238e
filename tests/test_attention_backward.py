"""The oracle's backward of softmax, Eq. (1) and multi-head attention (``reference/attention.py``): the exact tier
against central finite differences of the oracle's own forward in mpmath (``tests/_finite_differences.py``), the fast
tier against the exact one and against differences in longdouble, and the exact identities of the backward (masked
entries get exactly nothing, sum_j dS_ij = 0 so sum_j dK_j = 0, broadcast inputs get summed gradients).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from _finite_differences import assert_directional_derivative, moved, paired, ulp

from aiayn.reference import attention as A

LD = np.longdouble
RNG = np.random.default_rng(20171204)
POLICIES = ("zeros", "uniform")  # "nan": the row's gradients are NaN, checked on their own below


def _case(batch: tuple[int, ...] = (2,), n_q: int = 3, n_k: int = 5, d_k: int = 4, d_v: int = 3, mask: bool = True):
    q, k, v = (RNG.normal(size=(*batch, n, d)) for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    q, k, v = q + 0.7, k - 0.4, v + 1.3  # non-zero means: a common component of the keys cancels in dQ's value only
    d_out = RNG.normal(size=(*batch, n_q, d_v)) + 0.5
    m = None
    if mask:
        m = RNG.random((*batch, n_q, n_k)) < 0.6
        m[..., 0, :] = False  # a fully masked row
        m[..., 1, 0] = True  # a live row
    return q, k, v, d_out, m


# --------------------------------------------------------------------------------------------
# the exact tier against finite differences in mpmath


@pytest.mark.parametrize("fully_masked", POLICIES)
@pytest.mark.parametrize("mask", [True, False], ids=["masked", "unmasked"])
def test_the_exact_backward_of_eq1_is_the_derivative(fully_masked: str, mask: bool) -> None:
    """Along random directions of q, k and v at once, within the bound of ``tests/_finite_differences.py``."""
    q, k, v, d_out, m = _case(mask=mask)
    grads = A.scaled_dot_product_attention_vjp_exact(q, k, v, d_out, m, fully_masked=fully_masked)
    directions = [RNG.normal(size=a.shape) for a in (q, k, v)]
    visible = None if m is None else np.broadcast_to(m, (*q.shape[:-2], q.shape[-2], k.shape[-2]))

    def f(t):
        return paired(A._attention_mp(*moved((q, k, v), directions, t), visible, fully_masked), d_out)

    assert_directional_derivative(f, grads, directions)


def test_the_exact_backward_of_softmax_is_the_derivative() -> None:
    x = RNG.normal(size=(3, 5)) * 3
    x[1, 2] = -np.inf  # a masked entry
    dy, e = RNG.normal(size=x.shape) + 0.3, RNG.normal(size=x.shape)
    e[np.isinf(x)] = 0.0  # -inf stays -inf: no direction there
    dx = A.softmax_vjp_exact(x, dy, axis=-1)
    finite = np.where(np.isinf(x), 0.0, x)

    def f(t):
        z = np.where(np.isinf(x), mpmath.ninf, moved([finite], [e], t)[0])
        return paired(A._softmax_rows_mp(z, None, "nan"), dy)

    assert_directional_derivative(f, [dx], [e])
    assert dx[1, 2] == 0.0, "a masked entry gets exactly nothing"


# --------------------------------------------------------------------------------------------
# the fast tier: against the exact one, and against finite differences in longdouble


def _magnitudes(q, k, v, d_out, m, fully_masked):
    """M: the gradients' formulas with every term made non-negative (|dO|, |V|, |K|, |Q|, and D's terms): the scale
    of the rounding errors of any evaluation order (Higham, Accuracy and Stability, §3.1: |fl(sum) - sum| <=
    gamma_n sum |terms|)."""
    p = np.nan_to_num(
        A._softmax_ld(
            np.where(
                np.broadcast_to(m, (*q.shape[:-1], k.shape[-2])) if m is not None else True,
                (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]),
                -np.inf,
            ),
            -1,
        ).astype(np.float64)
    )
    dp = np.abs(d_out) @ np.abs(np.swapaxes(v, -1, -2))
    ds = p * (dp + np.sum(p * dp, -1, keepdims=True))
    root = np.sqrt(q.shape[-1])
    return (
        A._unbroadcast(ds @ np.abs(k) / root, q.shape),
        A._unbroadcast(np.swapaxes(ds, -1, -2) @ np.abs(q) / root, k.shape),
        A._unbroadcast(
            np.swapaxes(p, -1, -2) @ np.abs(d_out)
            + (1 if fully_masked == "uniform" else 0) * np.abs(d_out).sum(-2, keepdims=True),
            v.shape,
        ),
    )


@pytest.mark.parametrize("fully_masked", POLICIES)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=["unbatched", "B", "B,h"])
def test_the_fast_backward_of_eq1_is_within_its_bound_of_the_exact_one(fully_masked: str, batch: tuple) -> None:
    q, k, v, d_out, m = _case(batch=batch)
    fast = A.scaled_dot_product_attention_vjp(q, k, v, d_out, m, fully_masked=fully_masked)
    exact = A.scaled_dot_product_attention_vjp_exact(q, k, v, d_out, m, fully_masked=fully_masked)
    # longdouble (u = 2^-64) with at most n_k + d + 2 terms per sum and 4 stages: 64 (n + 4) u M <= 2^-53 M here,
    # plus the two float64 roundings (the fast tier's and the exact tier's: one ulp)
    for name, f, e, mag in zip(("dq", "dk", "dv"), fast, exact, _magnitudes(q, k, v, d_out, m, fully_masked)):
        bound = ulp(e) + 2.0**-53 * mag
        assert np.all(np.abs(f - e) <= bound), f"{name}: {np.max(np.abs(f - e) / bound)} x bound"


def test_the_fast_backward_of_eq1_is_the_derivative_in_longdouble() -> None:
    """Richardson's estimate of the truncation error: D(h) - f' ~ c h^2, so |D(h/2) - f'| ~ |D(h) - D(h/2)| / 3
    (Nocedal & Wright, Numerical Optimization, §8.1); the bound takes twice that plus the rounding of f in longdouble
    (2^-60 sum |terms| / h, sum |terms| = <|dO|, |O|> + 1)."""
    q, k, v, d_out, m = _case()
    grads = A.scaled_dot_product_attention_vjp(q, k, v, d_out, m, fully_masked="zeros")
    directions = [RNG.normal(size=a.shape) for a in (q, k, v)]
    visible = np.broadcast_to(m, (*q.shape[:-2], q.shape[-2], k.shape[-2]))

    def f(t: LD) -> LD:
        moved = [a.astype(LD) + e.astype(LD) * t for a, e in zip((q, k, v), directions)]
        return np.sum(A._attention_ld(*moved, visible, "zeros") * d_out.astype(LD))

    h = LD(2.0) ** -16
    d_h, d_half = ((f(s) - f(-s)) / (2 * s) for s in (h, h / 2))
    dot = sum(float(np.sum(g * e)) for g, e in zip(grads, directions))
    scale = float(np.sum(np.abs(d_out) * np.abs(A.scaled_dot_product_attention(q, k, v, m, fully_masked="zeros")))) + 1
    bound = 2 * abs(float(d_h - d_half)) + 2.0**-60 * scale / float(h / 2) + 2.0**-50 * abs(dot)
    assert abs(float(d_half) - dot) <= bound, (float(d_half), dot, bound)


# --------------------------------------------------------------------------------------------
# exact identities of the backward


@pytest.mark.parametrize("fully_masked", POLICIES)
def test_masked_scores_and_fully_masked_rows_receive_exactly_nothing(fully_masked: str) -> None:
    q, k, v, d_out, m = _case()
    dq, dk, dv = A.scaled_dot_product_attention_vjp_exact(q, k, v, d_out, m, fully_masked=fully_masked)
    assert np.all(dq[..., 0, :] == 0.0), "a fully masked query row gets no gradient (its weights are constants)"
    poisoned_k, poisoned_v = k.copy(), v.copy()
    hidden = ~np.any(m, axis=-2)  # (B, n_k): keys no query sees
    poisoned_k[hidden] += 1e3
    poisoned_v[hidden] -= 1e3
    again = A.scaled_dot_product_attention_vjp_exact(q, poisoned_k, poisoned_v, d_out, m, fully_masked=fully_masked)
    if fully_masked == "zeros":  # under "uniform" a fully masked row averages every value: hidden keys are seen
        assert np.array_equal(again[0], dq), "what a key no query sees holds cannot change dQ"
        assert np.all(dk[hidden] == 0.0) and np.all(dv[hidden] == 0.0)
    assert np.array_equal(again[1][~hidden], dk[~hidden]) or fully_masked == "uniform"


def test_the_keys_gradient_sums_to_zero_per_batch() -> None:
    """sum_j dS_ij = sum_j P_ij (dP_ij - D_i) = D_i - D_i = 0, so sum_j dK_j = dS^T Q summed over j = 0."""
    q, k, v, d_out, m = _case()
    _, dk, _ = A.scaled_dot_product_attention_vjp_exact(q, k, v, d_out, m, fully_masked="zeros")
    _, dk_fast, _ = A.scaled_dot_product_attention_vjp(q, k, v, d_out, m, fully_masked="zeros")
    # each element is within half an ulp of the exact value, whose sum over keys is 0
    assert np.all(np.abs(dk.sum(-2)) <= ulp(dk).sum(-2) * 2)
    assert np.all(np.abs(dk_fast.sum(-2)) <= ulp(dk).sum(-2) * 4)


def test_a_fully_masked_row_under_nan_makes_every_gradient_it_reaches_nan() -> None:
    q, k, v, d_out, m = _case()
    dq, dk, dv = A.scaled_dot_product_attention_vjp(q, k, v, d_out, m, fully_masked="nan")
    assert np.all(np.isnan(dq[..., 0, :])) and np.all(np.isnan(dk)) and np.all(np.isnan(dv))
    assert not np.any(np.isnan(dq[..., 1:, :]))


def test_a_broadcast_input_gets_the_sum_of_its_gradients() -> None:
    q, k, v, d_out, _ = _case(batch=(2, 3), mask=False)
    shared_k, shared_v = k[:1, :1], v[:1, :1]  # (1, 1, n_k, d): broadcast over both batch dims
    dq, dk, dv = A.scaled_dot_product_attention_vjp(q, shared_k, shared_v, d_out)
    full = A.scaled_dot_product_attention_vjp(
        q, np.broadcast_to(shared_k, k.shape), np.broadcast_to(shared_v, v.shape), d_out
    )
    assert dk.shape == shared_k.shape and dv.shape == shared_v.shape
    assert np.allclose(dk, full[1].sum(axis=(0, 1), keepdims=True), rtol=1e-14, atol=1e-14)
    assert np.array_equal(dq, full[0])


def test_bad_cotangents_are_refused_with_their_name() -> None:
    q, k, v, d_out, m = _case()
    with pytest.raises(ValueError, match="d_out: expected the output's shape"):
        A.scaled_dot_product_attention_vjp(q, k, v, d_out[..., :2], m)
    with pytest.raises(ValueError, match="dy: expected finite values"):
        A.softmax_vjp(np.zeros(3), np.array([0.0, np.nan, 1.0]))


# --------------------------------------------------------------------------------------------
# multi-head attention, §3.2.2


def _mha_case(self_attention: bool):
    x = RNG.normal(size=(2, 3, 4)) + 0.3
    memory = x if self_attention else RNG.normal(size=(2, 5, 4)) - 0.2
    params = {n: RNG.normal(size=(4, 4)) / 2 for n in ("w_q", "w_k", "w_v", "w_o")}
    params |= {n: RNG.normal(size=4) for n in ("b_q", "b_k", "b_v", "b_o")}
    mask = RNG.random((2, 3, memory.shape[-2])) < 0.7
    mask[0, 0] = False  # a fully masked row
    return x, memory, params, mask, RNG.normal(size=(2, 3, 4)) + 0.1


def _mha_mp(query, key, value, params, h, visible, fully_masked):
    def affine(x, w, b):
        return A.mp_matmul(x, params[w]) + params[b]

    q, k, v = affine(query, "w_q", "b_q"), affine(key, "w_k", "b_k"), affine(value, "w_v", "b_v")
    heads = A._attention_mp(A._split_heads(q, h), A._split_heads(k, h), A._split_heads(v, h), visible, fully_masked)
    return A.mp_matmul(A._merge_heads(heads), params["w_o"]) + params["b_o"]


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_the_exact_backward_of_multi_head_attention_is_the_derivative(self_attention: bool) -> None:
    """Every input and parameter moved along its own random direction; query, key and value separately (their
    gradients are separate even when the caller passes one array)."""
    x, memory, params, mask, d_out = _mha_case(self_attention)
    grads = A.multi_head_attention_vjp_exact(x, memory, memory, params, 2, d_out, mask, fully_masked="zeros")
    names = list(A.MHA_GRADIENTS)
    base = {"query": x, "key": memory, "value": memory, **params}
    directions = [RNG.normal(size=np.shape(base[n])) for n in names]
    visible = np.broadcast_to(mask, (2, 3, memory.shape[-2]))[..., None, :, :]

    def f(t):
        now = dict(zip(names, moved([base[n] for n in names], directions, t)))
        return paired(_mha_mp(now["query"], now["key"], now["value"], now, 2, visible, "zeros"), d_out)

    assert_directional_derivative(f, [grads[n] for n in names], directions)


def test_the_fast_backward_of_multi_head_attention_is_within_its_bound_of_the_exact_one() -> None:
    x, memory, params, mask, d_out = _mha_case(False)
    fast = A.multi_head_attention_vjp(x, memory, memory, params, 2, d_out, mask, fully_masked="uniform")
    exact = A.multi_head_attention_vjp_exact(x, memory, memory, params, 2, d_out, mask, fully_masked="uniform")
    # longdouble throughout (u = 2^-64), a few stages of sums of at most 16 terms of magnitude below 10 here:
    # 2^-56 times 100 bounds their accumulated error; plus one ulp for the two float64 roundings
    for name in A.MHA_GRADIENTS:
        bound = ulp(exact[name]) + 2.0**-56 * 100
        assert np.all(np.abs(fast[name] - exact[name]) <= bound), name


def test_an_absent_bias_gets_the_gradient_of_a_zero_one() -> None:
    x, memory, params, mask, d_out = _mha_case(False)
    absent = {n: a for n, a in params.items() if n not in ("b_k", "b_v")}
    zero = absent | {"b_k": np.zeros(4), "b_v": np.zeros(4)}
    with_absent = A.multi_head_attention_vjp(x, memory, memory, absent, 2, d_out, mask, fully_masked="zeros")
    with_zero = A.multi_head_attention_vjp(x, memory, memory, zero, 2, d_out, mask, fully_masked="zeros")
    for name in A.MHA_GRADIENTS:
        assert np.array_equal(with_absent[name], with_zero[name]), name
