"""The oracle of split keys (§3.2.1, Eq. (1) over blocks of keys merged by their log-sum-exp) is right.

Evidence: the fast tier agrees with the exact tier within a derived bound; the exact tier's block output is Eq. (1)
with the policy "zeros", bit for bit; merging the blocks of any partition gives the whole attention and its
log-sum-exp within the error of rounding the blocks' states once (the identity in ``reference/attention.py``,
"split keys"); an empty block changes nothing; bad input is named.

Error analysis (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §3.1 for gamma_n):
u = 2^-64 (the fast tier's longdouble), U = 2^-53 (float64); both tiers round each result once (U |y| + 2^-1075).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.reference.attention import (
    attention_with_lse,
    attention_with_lse_exact,
    merge_attention_states,
    merge_attention_states_exact,
    paged_attention,
    paged_attention_exact,
    paged_keys,
    scaled_dot_product_attention_exact,
)
from tests.test_attention import TINY, U, _check_within, attention_fast_error, attention_inputs, gamma, u


def lse_fast_error(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None, lse: np.ndarray) -> np.ndarray:
    """E for the fast tier's log-sum-exp, per query, before its float64 rounding.

    The scores carry delta = gamma_{d_k + 2} |q||k|^T / sqrt(d_k) (a longdouble dot product and a division by the
    rounded sqrt(d_k)); the log-sum-exp is 1-Lipschitz in the max norm, so that moves it by D = max visible delta.
    In longdouble the shifted sum carries the relative error (n/e + 2n + 4) u + gamma_n (``softmax_fast_error``'s
    analysis), which the log turns into the same absolute error; the log's own rounding and the final addition
    m + log(sum) add u (|lse| + log n + 1) at most.
    """
    d_k, n_k = q.shape[-1], k.shape[-2]
    delta = gamma(d_k + 2) * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)) / math.sqrt(d_k) * (1 + 1e-12)
    if mask is not None:
        delta = np.where(mask, delta, 0.0)
    big_d = np.max(delta, axis=-1)
    sum_err = (n_k / math.e + 2 * n_k + 4) * u + gamma(n_k)
    return big_d + 2 * sum_err + u * (np.abs(np.nan_to_num(lse, neginf=0.0)) + math.log(n_k) + 1)


@given(attention_inputs())
def test_block_attention_fast_tier_matches_exact_tier(inputs):
    q, k, v, mask = inputs
    out, lse = attention_with_lse(q, k, v, mask)
    out_x, lse_x = attention_with_lse_exact(q, k, v, mask)
    where = f"shapes q{q.shape} k{k.shape} v{v.shape}, mask={None if mask is None else mask.tolist()}"
    bound = 2 * U * np.abs(out_x) + TINY + attention_fast_error(q, k, v, mask, out_x)
    _check_within(out, out_x, bound, "attention_with_lse's output", where)
    assert np.array_equal(lse == -np.inf, lse_x == -np.inf), f"-inf log-sum-exps differ: {lse} vs {lse_x}; {where}"
    finite = np.isfinite(lse_x)
    bound = 2 * U * np.abs(np.where(finite, lse_x, 0.0)) + TINY + lse_fast_error(q, k, mask, lse_x)
    _check_within(np.where(finite, lse, 0.0), np.where(finite, lse_x, 0.0), bound, "attention_with_lse's lse", where)


@settings(max_examples=20)
@given(attention_inputs(max_n=4, max_d=3))
def test_block_output_is_equation_1_with_fully_masked_rows_zero(inputs):
    """The exact tier's block output is Eq. (1) under "zeros", bit for bit (the same exact value, rounded once)."""
    q, k, v, mask = inputs
    out, _ = attention_with_lse_exact(q, k, v, mask)
    whole = scaled_dot_product_attention_exact(q, k, v, mask, fully_masked="zeros")
    assert np.array_equal(out, whole), f"block output {out.tolist()} vs Eq. (1) {whole.tolist()}"


@settings(max_examples=25)
@given(attention_inputs(max_n=5, max_d=3), st.data())
def test_merging_the_blocks_of_any_partition_gives_the_whole_attention(inputs, data):
    """merge(attention_with_lse of each block) = Eq. (1) over all keys (and its log-sum-exp), exact tiers.

    The blocks' states are each rounded once to float64: |dO_p| <= U |O_p|, |dL_p| <= U |L_p|. The merge weights are
    softmax_p(L_p), which moves by a factor within e^{+-2D}, D = U max |L_p|; the merged output is a convex
    combination of the O_p, each within max |v| of 0, so |merged - whole| <= (U + 2 expm1(2D)) max |v| plus the
    merge's own rounding U |out| and 2^-1074 twice. The merged log-sum-exp is 1-Lipschitz in the L_p: D + U |L|.
    """
    q, k, v, mask = inputs
    n_k = k.shape[-2]
    cuts = sorted(data.draw(st.lists(st.integers(0, n_k), min_size=0, max_size=3)))  # blocks may be empty
    edges = [0, *cuts, n_k]
    visible = np.ones((*q.shape[:-1], n_k), dtype=bool) if mask is None else np.broadcast_to(mask, (*q.shape[:-1], n_k))
    states = [
        attention_with_lse_exact(q, k[..., a:b, :], v[..., a:b, :], visible[..., a:b])
        for a, b in zip(edges[:-1], edges[1:])
    ]
    outs, lses = np.stack([o for o, _ in states]), np.stack([lse for _, lse in states])
    out, lse = merge_attention_states_exact(outs, lses)
    whole, whole_lse = attention_with_lse_exact(q, k, v, mask)
    big_d = U * np.max(np.abs(np.where(np.isfinite(lses), lses, 0.0)))
    v_max = float(np.max(np.abs(v)))
    where = f"blocks {edges}, shapes q{q.shape} k{k.shape}"
    bound = (U + 2 * math.expm1(2 * big_d)) * v_max + U * np.abs(whole) + 2 * TINY
    _check_within(out, whole, np.broadcast_to(bound, whole.shape), "the merged output", where)
    assert np.array_equal(lse == -np.inf, whole_lse == -np.inf), f"-inf differs: {lse} vs {whole_lse}; {where}"
    finite = np.isfinite(whole_lse)
    lse_bound = big_d + U * np.abs(np.where(finite, whole_lse, 0.0)) + 2 * TINY
    _check_within(np.where(finite, lse, 0.0), np.where(finite, whole_lse, 0.0), lse_bound, "the merged lse", where)


@settings(max_examples=25)
@given(attention_inputs(max_n=5, max_d=3))
def test_merge_fast_tier_matches_exact_tier_and_an_empty_block_changes_nothing(inputs):
    """The fast merge is within the shifted-softmax error at u of the exact one (then one rounding each); adding a
    block with no visible key (output 0, lse -inf) leaves the fast merge's bits as they are."""
    q, k, v, mask = inputs
    half = max(k.shape[-2] // 2, 1)
    visible = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))
    first = attention_with_lse(q, k[..., :half, :], v[..., :half, :], None if visible is None else visible[..., :half])
    second = attention_with_lse(q, k[..., half:, :], v[..., half:, :], None if visible is None else visible[..., half:])
    outs, lses = np.stack([first[0], second[0]]), np.stack([first[1], second[1]])
    out, lse = merge_attention_states(outs, lses)
    out_x, lse_x = merge_attention_states_exact(outs, lses)
    gaps = np.max(np.abs(np.where(np.isfinite(lses), lses, 0.0)))  # |L_p - max L| <= 2 max |L_p|
    rel = (2 * gaps + 8) * u + gamma(4)
    bound = 2 * U * np.abs(out_x) + TINY + 2 * rel * np.max(np.abs(outs))
    _check_within(out, out_x, bound, "merge_attention_states's output", f"lses {lses.tolist()}")
    finite = np.isfinite(lse_x)
    lse_bound = 2 * U * np.abs(np.where(finite, lse_x, 0.0)) + TINY + rel + u * (gaps + 2)
    _check_within(np.where(finite, lse, 0.0), np.where(finite, lse_x, 0.0), lse_bound, "the merged lse", "")
    empty = (np.zeros_like(first[0]), np.full_like(first[1], -np.inf))
    again = merge_attention_states(np.stack([outs[0], empty[0], outs[1]]), np.stack([lses[0], empty[1], lses[1]]))
    assert np.array_equal(again[0], out) and np.array_equal(again[1], lse), "an empty block changed the merge"


def test_no_visible_key_anywhere_gives_zero_and_minus_infinity():
    outs, lses = np.ones((2, 1, 3)), np.full((2, 1), -np.inf)
    for merge in (merge_attention_states, merge_attention_states_exact):
        out, lse = merge(outs, lses)
        assert np.array_equal(out, np.zeros((1, 3))) and np.array_equal(lse, [-np.inf]), merge.__name__
    for block in (attention_with_lse, attention_with_lse_exact):
        out, lse = block(np.ones((2, 3)), np.ones((0, 3)), np.ones((0, 4)))  # n_k = 0: an empty block
        assert np.array_equal(out, np.zeros((2, 4))) and np.array_equal(lse, [-np.inf] * 2), block.__name__


@pytest.mark.parametrize(
    "outs, lses, words",
    [
        (np.zeros((2, 3, 4)), np.zeros((2, 4)), "lses: expected the shape of outs without its last axis"),
        (np.zeros((2, 3, 4)), np.array([[0.0, np.nan, 0.0], [0.0] * 3]), "lses: expected finite values or -inf"),
        (np.zeros((2, 3, 4)), np.array([[0.0, np.inf, 0.0], [0.0] * 3]), "lses: expected finite values or -inf"),
        (np.zeros((0, 3, 4)), np.zeros((0, 3)), "outs: expected at least one block"),
    ],
)
def test_bad_merge_input_is_named(outs, lses, words):
    for merge in (merge_attention_states, merge_attention_states_exact):
        with pytest.raises(ValueError, match=words):
            merge(outs, lses)


@settings(max_examples=20)
@given(st.data())
def test_a_paged_cache_read_through_its_table_is_the_contiguous_cache(data):
    """Pages in a drawn physical order, read through the block table, give each sentence its own keys and values:
    paged_attention equals Eq. (1) over the contiguous cache, bit for bit in the exact tier and within the fast tier's
    bound in the fast one (its masked slots lengthen the sums), whatever the slots past a sentence's length and the
    pages in no table hold (NaN, +-1e300)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    b, m, page = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 2, 4]))
    d_k, d_v, n_q = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    lengths = rng.integers(1, m * page + 1, size=b)
    spare = data.draw(st.integers(0, 2))
    order = rng.permutation(b * m + spare)
    table = order[: b * m].reshape(b, m)
    k, v = rng.standard_normal((b, m * page, d_k)), rng.standard_normal((b, m * page, d_v))
    q = rng.standard_normal((b, n_q, d_k))
    poison = data.draw(st.sampled_from([np.nan, 1e300, -1e300]))
    k_pages, v_pages = np.full((b * m + spare, page, d_k), poison), np.full((b * m + spare, page, d_v), poison)
    for s in range(b):
        for t in range(lengths[s]):
            k_pages[table[s, t // page], t % page] = k[s, t]
            v_pages[table[s, t // page], t % page] = v[s, t]
    for s in range(b):
        n = int(lengths[s])
        want = scaled_dot_product_attention_exact(q[s], k[s, :n], v[s, :n])
        assert np.array_equal(paged_attention_exact(q, k_pages, v_pages, table, lengths)[s], want), f"sentence {s}"
        fast = paged_attention(q, k_pages, v_pages, table, lengths)[s]  # more (masked) keys: another summation
        bound = 2 * U * np.abs(want) + TINY + attention_fast_error(q[s], k[s, :n], v[s, :n], None, want)
        _check_within(fast, want, bound, "paged_attention (fast tier)", f"sentence {s}, table {table.tolist()}")


@pytest.mark.parametrize(
    "table, lengths, words",
    [
        (np.array([[0, 5]]), np.array([3]), "block_table: entries must index the 2 pages"),
        (np.array([0, 1]), np.array([3]), "block_table: expected a 2-d integer array"),
        (np.array([[0, 1]]), np.array([5]), r"lengths: expected 1 integers in \[0, 4\]"),
    ],
)
def test_bad_paged_input_is_named(table, lengths, words):
    with pytest.raises(ValueError, match=words):
        paged_keys(np.zeros((2, 2, 3)), table, lengths)
