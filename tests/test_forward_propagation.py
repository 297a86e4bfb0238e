"""The composites' forward budgets (``conformance/budgets/composites/forward.py``) in reverse mode: each stage's
transpose is the transpose of its tangent map (the dot-product test <J t, c> = <t, J^T c>), and the bound read in
reverse mode (one row per output element) equals the bound carried in forward mode (one column per element of
every stage), on the whole model and on both layers, with and without padding masks.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.conformance.budgets.composites import forward as F
from aiayn.conformance.numerics import precision

RNG = np.random.default_rng(20170612)
PRECISIONS = [precision("float32"), precision("float64")]
# The two modes sum the same products |J_k[i, j]| L_k[j] in other orders: rounding apart, 1e-16 each; 1e-12
# relative leaves room for thousands of terms and no room for a missing or doubled path (factors of 2 or more).
AGREE = 1e-12


def _mha_params(d: int) -> dict[str, np.ndarray]:
    return {f"w_{x}": RNG.normal(size=(d, d)) / np.sqrt(d) for x in "qkvo"} | {
        f"b_{x}": 0.1 * RNG.normal(size=d) for x in "qkvo"
    }


def _layer(d: int, d_ff: int, cross: bool) -> dict:
    norms = {f"norm{i}": {"gain": 1 + 0.1 * RNG.normal(size=d), "bias": 0.1 * RNG.normal(size=d)} for i in (1, 2, 3)}
    ffn = {
        "w1": RNG.normal(size=(d, d_ff)) / np.sqrt(d),
        "b1": 0.1 * RNG.normal(size=d_ff),
        "w2": RNG.normal(size=(d_ff, d)) / np.sqrt(d_ff),
        "b2": 0.1 * RNG.normal(size=d),
    }
    return {"self_attn": _mha_params(d), "ffn": ffn, **norms} | ({"cross_attn": _mha_params(d)} if cross else {})


def _dot_product_test(tangent, transpose, inputs, out_shape) -> None:
    """<J t, c> = <t, J^T c> for random tangents t (one per input) and a random cotangent c, with a leading axis."""
    t = [RNG.normal(size=(1, *np.shape(x))) for x in inputs]
    c = RNG.normal(size=(1, *out_shape))
    lhs = float(np.sum(tangent(*t) * c))
    rhs = sum(float(np.sum(ti * ci)) for ti, ci in zip(t, transpose(c)))
    assert abs(lhs - rhs) <= 1e-12 * max(abs(lhs), 1.0), (lhs, rhs)


@pytest.mark.parametrize("masked", [False, True])
def test_each_stages_transpose_is_its_tangent_maps_transpose(masked: bool) -> None:
    b, n, m, d, h = 2, 4, 5, 6, 2
    q, k, v = RNG.normal(size=(b, n, d)), RNG.normal(size=(b, m, d)), RNG.normal(size=(b, m, d))
    mask = None
    if masked:
        mask = RNG.random((b, n, m)) < 0.6
        mask[..., 0] = True
    out, tangent, transpose = F._mha(q, k, v, _mha_params(d), h, mask)
    _dot_product_test(tangent, transpose, (q, k, v), out.shape)
    x = RNG.normal(size=(b, n, d)) + 0.5
    out, tangent, transpose = F._layer_norm(x, 1 + RNG.normal(size=d), RNG.normal(size=d), 1e-6)
    _dot_product_test(tangent, transpose, (x,), out.shape)
    out, tangent, transpose = F._ffn(x, _layer(d, 3 * d, False)["ffn"])
    _dot_product_test(tangent, transpose, (x,), out.shape)


def _both_modes(g: F._Graph, output: str) -> tuple[np.ndarray, np.ndarray]:
    reverse = g.bound(output, PRECISIONS)
    for op in g.ops:
        op.vjp = None  # a stage without its transpose: the graph is bounded in forward mode
    return reverse, g.bound(output, PRECISIONS)


def _agree(reverse: np.ndarray, forward: np.ndarray) -> None:
    assert reverse.shape == forward.shape
    assert np.all(np.isfinite(forward)) and np.all(forward > 0)
    worst = float(np.max(np.abs(reverse - forward) / forward))
    assert worst <= AGREE, f"reverse and forward mode differ by {worst:.3g} relative (at most {AGREE:g})"


@pytest.mark.parametrize("padded", [False, True])
def test_reverse_mode_equals_forward_mode_on_the_whole_model(padded: bool) -> None:
    vocab, d, b, n_src, n_tgt = 9, 8, 3, 5, 4
    params = {
        "embedding": RNG.normal(size=(vocab, d)) / np.sqrt(d),
        "encoder": [_layer(d, 16, False) for _ in range(2)],
        "decoder": [_layer(d, 16, True) for _ in range(2)],
    }
    src, tgt = RNG.integers(0, vocab, size=(b, n_src)), RNG.integers(0, vocab, size=(b, n_tgt))
    src_lengths = np.array([5, 2, 4]) if padded else None
    tgt_lengths = np.array([4, 3, 1]) if padded else None
    g = F._forward_graph(src, tgt, params, 2, src_lengths, tgt_lengths, 1e-6)
    _agree(*_both_modes(g, "logits"))


@pytest.mark.parametrize("padded", [False, True])
def test_reverse_mode_equals_forward_mode_on_each_layer(padded: bool) -> None:
    b, n, m, d = 2, 4, 3, 8
    mask = (np.arange(m)[None, :] < np.array([3, 1])[:, None])[:, None, :] if padded else None
    g = F._Graph()
    F._input(g, "x", RNG.normal(size=(b, m, d)))
    _agree(*_both_modes(g, F._encoder(g, "x", _layer(d, 16, False), 2, mask, 1e-6, "enc")))
    g = F._Graph()
    F._input(g, "y", RNG.normal(size=(b, n, d)))
    F._input(g, "memory", RNG.normal(size=(b, m, d)))
    out = F._decoder(g, "y", "memory", _layer(d, 16, True), 2, F.causal(n), mask, 1e-6, "dec")
    _agree(*_both_modes(g, out))
