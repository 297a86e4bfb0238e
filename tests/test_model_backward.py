"""The oracle's backward of the composites (``reference/model.py``): an encoder layer, a decoder layer and the whole
model, every input and parameter. The exact tier against central finite differences of the oracle's own forward in
mpmath (``tests/_finite_differences.py``), the fast tier against the exact one within a stated bound, and what the
chain rule must give: the shared embedding matrix receives the sum of its three uses, a learned positional table the
sum over both sequences, the causal mask keeps a target position's gradient off the positions after it.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
import pytest
from _finite_differences import assert_directional_derivative, paired, ulp

from aiayn.reference import model as M
from aiayn.reference._exact import to_mp
from aiayn.reference.counts import TransformerConfig

RNG = np.random.default_rng(20171206)
H, VOCAB, EPS = 2, 7, 1e-6
CONFIG = TransformerConfig(n_layers=1, d_model=4, d_ff=6, num_heads=H)
EXACT = M._Arithmetic(exact=True)


def _params(biases: bool = True, max_positions: int | None = None, n_layers: int = 1) -> dict[str, Any]:
    config = TransformerConfig(n_layers=n_layers, d_model=4, d_ff=6, num_heads=H)
    return M.init_params(config, VOCAB, RNG, biases=biases, max_positions=max_positions)


def _moved(tree: Any, directions: dict[str, np.ndarray], t: Any, prefix: str = "") -> Any:
    """The nested layout in mpmath with every array moved by t along its direction (by dotted path)."""
    if isinstance(tree, dict):
        return {k: _moved(v, directions, t, f"{prefix}.{k}" if prefix else k) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_moved(v, directions, t, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(tree)]
    return to_mp(tree) + to_mp(directions[prefix]) * t


def _check_directional(forward_mp, inputs: dict[str, Any], grads: dict[str, np.ndarray], d_out: np.ndarray) -> None:
    """<grads, E> against the difference quotient of f(t) = <d_out, forward(inputs + t E)>, every array of
    ``inputs`` (a nested layout) moved along its own random direction E at once."""
    flat = M.flatten_params(inputs)
    directions = {name: RNG.normal(size=np.shape(a)) for name, a in flat.items()}
    names = sorted(flat)
    assert_directional_derivative(
        lambda t: paired(forward_mp(_moved(inputs, directions, t)), d_out),
        [grads[n] for n in names],
        [directions[n] for n in names],
    )


def _encoder_case(mask: bool = True):
    x = RNG.normal(size=(2, 3, 4)) + 0.6  # non-zero mean: LayerNorm's dx and the keys' common component
    d_out = RNG.normal(size=x.shape) - 0.3
    m = M.padding_mask([3, 2], 3) if mask else None  # (2, 1, 3)
    return x, _params()["encoder"][0], m, d_out


def _decoder_case():
    y, memory = RNG.normal(size=(2, 3, 4)) + 0.4, RNG.normal(size=(2, 5, 4)) - 0.5
    d_out = RNG.normal(size=y.shape) + 0.2
    return y, memory, _params()["decoder"][0], M.padding_mask([5, 3], 5), d_out


def _model_case(biases: bool = True, positional: bool = False, n_layers: int = 1):
    src, tgt = RNG.integers(0, VOCAB, size=(2, 4)), RNG.integers(0, VOCAB, size=(2, 3))
    src[0, :2] = tgt[0, 0]  # a token in both sequences, twice in the source: its embedding row sums every use
    params = _params(biases, max_positions=6 if positional else None, n_layers=n_layers)
    return src, tgt, params, RNG.normal(size=(2, 3, VOCAB)) + 0.1


# --------------------------------------------------------------------------------------------
# the exact tier against finite differences in mpmath


def test_the_exact_backward_of_an_encoder_layer_is_the_derivative() -> None:
    x, params, mask, d_out = _encoder_case()
    grads = M.encoder_layer_vjp_exact(x, params, H, d_out, mask, eps=EPS)
    visible = M._visible(mask, (2,), 3, 3)

    def forward(inputs: dict[str, Any]) -> np.ndarray:
        return M._encoder_layer_pullback(EXACT, inputs["x"], inputs["p"], H, visible, EPS, 0.0)[0]

    _check_directional(forward, {"x": x, "p": params}, {"x": grads["x"], **_under("p", grads)}, d_out)


def test_the_exact_backward_of_a_decoder_layer_is_the_derivative() -> None:
    y, memory, params, memory_mask, d_out = _decoder_case()
    grads = M.decoder_layer_vjp_exact(y, memory, params, H, d_out, None, memory_mask, eps=EPS)
    self_visible, memory_visible = M._visible(M.causal_mask(3, 3), (2,), 3, 3), M._visible(memory_mask, (2,), 3, 5)

    def forward(inputs: dict[str, Any]) -> np.ndarray:
        return M._decoder_layer_pullback(
            EXACT, inputs["y"], inputs["memory"], inputs["p"], H, self_visible, memory_visible, EPS, 0.0
        )[0]

    inputs = {"y": y, "memory": memory, "p": params}
    _check_directional(forward, inputs, {"y": grads["y"], "memory": grads["memory"], **_under("p", grads)}, d_out)


@pytest.mark.parametrize("positional", [False, True], ids=["sinusoids", "learned positions"])
def test_the_exact_backward_of_the_whole_model_is_the_derivative(positional: bool) -> None:
    """Every parameter at once, the shared embedding matrix included (its three uses move together)."""
    src, tgt, params, d_logits = _model_case(positional=positional)
    lengths = {"src_lengths": [4, 3], "tgt_lengths": [3, 2]}
    grads = M.transformer_forward_vjp_exact(src, tgt, params, H, d_logits, eps=EPS, **lengths)
    src_mask, tgt_mask = M._masks(4, 3, lengths["src_lengths"], lengths["tgt_lengths"])

    def forward(p: dict[str, Any]) -> np.ndarray:
        return M._transformer_pullback(EXACT, src, tgt, p, H, src_mask, tgt_mask, EPS, 0.0)[0]

    with mpmath.workdps(60):  # the sinusoids at the differences' precision
        _check_directional(forward, params, grads, d_logits)


def _under(prefix: str, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A layer's parameter gradients under the path ``prefix`` (the test's nesting of the inputs)."""
    return {f"{prefix}.{k}": v for k, v in grads.items() if k not in ("x", "y", "memory")}


# --------------------------------------------------------------------------------------------
# the fast tier against the exact one

# The fast tier computes every stage in longdouble (u = 2^-64) and rounds once to float64 (half an ulp). To first order
# its error is sum_k |J_k| l_k over the stages (budgets/composites/forward.py's analysis): some 40 stages per layer,
# each with a local error of a few u times the magnitudes it combines (at most 16 terms here), carried by a downstream
# condition of order 10 for these O(1) draws. 2^-52 = 4096 u of the largest gradient of the call covers that with a
# margin of 10 or more (measured: about 15 u); a wrong formula misses by O(1). The scale is the call's largest gradient,
# not each element's: a gradient that is exactly 0 (b_k's, sum_j dK_j = 0) is rounding noise in both.
FAST_BOUND = 2.0**-52


def _assert_within_fast_bound(fast: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> None:
    assert sorted(fast) == sorted(exact)
    scale = max(float(np.max(np.abs(g))) for g in exact.values())
    for name in exact:
        bound = ulp(exact[name]) + FAST_BOUND * scale
        miss = np.abs(fast[name] - exact[name])
        assert np.all(miss <= bound), f"{name}: {float(np.max(miss / bound)):.3g} x the bound"


@pytest.mark.parametrize("mask", [True, False], ids=["padding mask", "no mask"])
def test_the_fast_backward_of_an_encoder_layer_is_within_its_bound(mask: bool) -> None:
    x, params, m, d_out = _encoder_case(mask)
    fast, exact = (f(x, params, H, d_out, m) for f in (M.encoder_layer_vjp, M.encoder_layer_vjp_exact))
    _assert_within_fast_bound(fast, exact)


def test_the_fast_backward_of_a_decoder_layer_is_within_its_bound() -> None:
    y, memory, params, memory_mask, d_out = _decoder_case()
    fast = M.decoder_layer_vjp(y, memory, params, H, d_out, None, memory_mask)
    _assert_within_fast_bound(fast, M.decoder_layer_vjp_exact(y, memory, params, H, d_out, None, memory_mask))


@pytest.mark.parametrize(
    "biases, positional, n_layers", [(True, False, 1), (False, True, 2)], ids=["N=1", "N=2, no biases, learned"]
)
def test_the_fast_backward_of_the_whole_model_is_within_its_bound(biases: bool, positional: bool, n_layers: int):
    src, tgt, params, d_logits = _model_case(biases, positional, n_layers)
    lengths = {"src_lengths": [4, 2], "tgt_lengths": [3, 3]}
    fast = M.transformer_forward_vjp(src, tgt, params, H, d_logits, **lengths)
    _assert_within_fast_bound(fast, M.transformer_forward_vjp_exact(src, tgt, params, H, d_logits, **lengths))


# --------------------------------------------------------------------------------------------
# what the chain rule must give


def test_the_shared_embedding_receives_the_sum_of_its_three_uses() -> None:
    """The whole model's embedding gradient equals the sum of the output projection's (dlogits^T y) and the two
    lookups' (sqrt(d_model) dX at each id), each computed from the layers' own VJPs: tied weights are one parameter."""
    src, tgt, params, d_logits = _model_case()
    grads = M.transformer_forward_vjp(src, tgt, params, H, d_logits)
    e, root = params["embedding"], np.sqrt(4.0)
    x = e[src] * root + M.positional_encoding(4, 4)
    memory = M.encoder_layer(x, params["encoder"][0], H)
    y0 = e[tgt] * root + M.positional_encoding(3, 4)
    y = M.decoder_layer(y0, memory, params["decoder"][0], H)
    dec = M.decoder_layer_vjp(y0, memory, params["decoder"][0], H, d_logits @ e)
    enc = M.encoder_layer_vjp(x, params["encoder"][0], H, dec["memory"])
    output_use = d_logits.reshape(-1, VOCAB).T @ y.reshape(-1, 4)
    lookups = np.zeros_like(e)
    np.add.at(lookups, src.reshape(-1), enc["x"].reshape(-1, 4) * root)
    np.add.at(lookups, tgt.reshape(-1), dec["y"].reshape(-1, 4) * root)
    # the composition rounds to float64 between the layers: the bound above on each, composed (a few float64 ulps)
    assert np.allclose(grads["embedding"], output_use + lookups, rtol=0, atol=1e-13 * np.abs(output_use).max())
    assert not np.allclose(grads["embedding"], output_use, rtol=0, atol=1e-3)  # the lookups' share is not small


def test_no_gradient_reaches_a_later_target_position() -> None:
    """Causality (§3.2.3) in the backward: a cotangent on the first target position only gives the decoder layer's
    later input positions exactly 0, and the whole model's gradients (every parameter) are the same, bit for bit,
    whatever the later target tokens are (a masked weight is exactly 0, so are its products and their sums)."""
    y, memory, params, memory_mask, _ = _decoder_case()
    d_out = np.zeros(y.shape)
    d_out[:, 0] = RNG.normal(size=(2, 4))
    grads = M.decoder_layer_vjp(y, memory, params, H, d_out, None, memory_mask)
    assert np.all(grads["y"][:, 1:] == 0) and np.all(grads["y"][:, 0] != 0)
    src, tgt, params, _ = _model_case()
    d_logits = np.zeros((2, 3, VOCAB))
    d_logits[:, 0] = RNG.normal(size=(2, VOCAB))
    before = M.transformer_forward_vjp(src, tgt, params, H, d_logits)
    tgt[:, 1:] = (tgt[:, 1:] + 1) % VOCAB
    after = M.transformer_forward_vjp(src, tgt, params, H, d_logits)
    assert all(np.array_equal(before[name], after[name]) for name in before)
    assert np.any(before["encoder.0.ffn.w1"] != 0)  # the encoder receives the first position's gradient


def test_a_bad_cotangent_or_choice_is_named() -> None:
    x, params, mask, d_out = _encoder_case()
    with pytest.raises(ValueError, match="d_out: expected the output's shape"):
        M.encoder_layer_vjp(x, params, H, d_out[:, :2], mask)
    with pytest.raises(ValueError, match="relu_at_zero"):
        M.encoder_layer_vjp(x, params, H, d_out, mask, relu_at_zero=0.5)
    src, tgt, p, d_logits = _model_case()
    with pytest.raises(ValueError, match="d_logits: expected the output's shape"):
        M.transformer_forward_vjp(src, tgt, p, H, d_logits[..., :3])
