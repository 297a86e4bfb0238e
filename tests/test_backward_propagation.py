"""The composites' gradient budgets (``conformance/budgets/composites/backward.py``): the derivatives of the backward
formulas the first-order analysis carries errors through equal central differences of the same formulas; the
budgets apply (finite) on ordinary draws, bound the gradients PyTorch's autograd computes in float32, float16 and
bfloat16, and in float32 are far below the error of a gradient that drops the lookups' uses of the tied embedding
(in float16 and bfloat16 the whole model's worst-case budget is wider than that error: not a test there).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from aiayn.conformance.budgets.composites import backward as BP
from aiayn.conformance.numerics import precision
from aiayn.reference import model as M
from aiayn.reference.counts import TransformerConfig

RNG = np.random.default_rng(20171207)
STEP = 1e-6  # central differences in float64: truncation ~STEP^2, rounding ~1e-16 / STEP, both below 1e-9


def _directional(f, values, tangents, step: float = STEP):
    """(f(v + step t) - f(v - step t)) / 2 step for f returning a tuple or a dict of arrays."""
    plus = f(*[v + step * t for v, t in zip(values, tangents)])
    minus = f(*[v - step * t for v, t in zip(values, tangents)])
    keys = plus.keys() if isinstance(plus, dict) else range(len(plus))
    return {k: (plus[k] - minus[k]) / (2 * step) for k in keys}


def _assert_tangents(analytic, numeric, skip=()) -> None:
    for k, fd in numeric.items():
        if k in skip:
            continue
        scale = max(float(np.max(np.abs(fd))), 1.0)
        assert np.max(np.abs(analytic[k][0] - fd)) <= 1e-7 * scale, k


def test_the_derivatives_of_the_backward_formulas_are_their_central_differences() -> None:
    """Each sub-layer's VJP differentiated with respect to its forward input and its cotangent at once."""
    b, n, m, d, h = 2, 4, 5, 6, 2
    q, k, v, dy = (
        RNG.normal(size=(b, n, d)),
        RNG.normal(size=(b, m, d)),
        RNG.normal(size=(b, m, d)),
        RNG.normal(size=(b, n, d)),
    )
    params = {f"w_{x}": RNG.normal(size=(d, d)) / 3 for x in "qkvo"} | {
        f"b_{x}": 0.1 * RNG.normal(size=d) for x in "qkvo"
    }
    mask = RNG.random((b, n, m)) < 0.7
    mask[..., 0] = True
    t = [RNG.normal(size=(1, *a.shape)) for a in (q, k, v, dy)]
    _, analytic = BP._mha_back(q, k, v, params, h, mask, dy, *t)
    numeric = _directional(
        lambda a, c, e, g: BP._mha_back(a, c, e, params, h, mask, g)[0], (q, k, v, dy), [x[0] for x in t]
    )
    _assert_tangents(analytic, numeric, skip=("b_k",))  # b_k's gradient is 0 whatever the inputs (sum_j dK_j = 0)
    r, gain = RNG.normal(size=(b, n, d)) + 2.0, RNG.normal(size=d) + 1.0
    _, analytic = BP._layer_norm_back(r, gain, 1e-6, dy, t[0], t[3])
    numeric = _directional(lambda a, g: BP._layer_norm_back(a, gain, 1e-6, g)[0], (r, dy), (t[0][0], t[3][0]))
    _assert_tangents(dict(enumerate(analytic)), numeric)
    w = {
        "w1": RNG.normal(size=(d, 9)),
        "b1": RNG.normal(size=9),
        "w2": RNG.normal(size=(9, d)),
        "b2": RNG.normal(size=d),
    }
    _, analytic = BP._ffn_back(r, w, dy, t[0], t[3])
    numeric = _directional(lambda a, g: BP._ffn_back(a, w, g)[0], (r, dy), (t[0][0], t[3][0]))
    _assert_tangents(dict(enumerate(analytic)), numeric)


def _model(n_layers: int = 1):
    config = TransformerConfig(n_layers=n_layers, d_model=8, d_ff=16, num_heads=2)
    params = M.init_params(config, 11, RNG)
    src, tgt = RNG.integers(0, 11, size=(2, 5)), RNG.integers(0, 11, size=(2, 4))
    return src, tgt, params, RNG.normal(size=(2, 4, 11)) + 0.3


def test_the_budgets_apply_on_ordinary_draws() -> None:
    src, tgt, params, d_logits = _model(2)
    for dtype in ("float32", "float16"):
        bounds = BP.transformer_forward(
            src, tgt, params, 2, [5, 3], [4, 2], 1e-6, d_logits, [precision(dtype), precision("float64")]
        )
        assert sorted(bounds) == sorted(M.flatten_params(params))
        assert all(np.all(np.isfinite(b) & (b > 0)) for b in bounds.values()), dtype


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_budgets_bound_pytorch_autograd_and_not_a_gradient_missing_one_use(dtype: str) -> None:
    """PyTorch's built-in (autograd through our torch implementation) in ``dtype`` is within every checked element's
    budget; in float32 the tied matrix's gradient without the two lookups' shares is far outside it."""
    torch = pytest.importorskip("torch")
    from aiayn.implementations.torch_impl import TorchImplementation

    tdtype = getattr(torch, dtype)
    src, tgt, params, d_logits = _model()
    params = M._map_tree(lambda a: torch.tensor(a).to(tdtype).double().numpy(), params)
    d_logits = torch.tensor(d_logits).to(tdtype).double().numpy()
    leaves: dict[str, object] = {}

    def lift(tree, path=""):
        if isinstance(tree, dict):
            return {k: lift(v, f"{path}.{k}" if path else k) for k, v in tree.items()}
        if isinstance(tree, list):
            return [lift(v, f"{path}.{i}") for i, v in enumerate(tree)]
        leaves[path] = torch.tensor(tree, dtype=tdtype, requires_grad=True)
        return leaves[path]

    lengths = (np.array([5, 3]), np.array([4, 2]))
    out = TorchImplementation().transformer_forward(
        torch.tensor(src), torch.tensor(tgt), lift(params), 2, *(torch.tensor(x) for x in lengths)
    )
    out.backward(torch.tensor(d_logits, dtype=tdtype))
    exact = M.transformer_forward_vjp(src, tgt, params, 2, d_logits, src_lengths=lengths[0], tgt_lengths=lengths[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bfloat16's vacuous softmax bounds overflow: not checked
        bounds = BP.transformer_forward(
            src, tgt, params, 2, *lengths, 1e-6, d_logits, [precision(dtype), precision("float64")]
        )
    checked = 0
    for name, bound in bounds.items():
        applies = np.isfinite(bound) & (bound < 1e200)
        got = leaves[name].grad.double().numpy()
        assert np.all(np.abs(got - exact[name])[applies] <= bound[applies]), name
        checked += int(applies.sum())
    assert checked >= 0.5 * sum(b.size for b in bounds.values())
    if dtype == "float32":  # in float16 and bfloat16 the whole model's budget is too wide for this (measured)
        one_use = d_logits.reshape(-1, 11).T @ _decoder_output(src, tgt, params, lengths).reshape(-1, 8)
        assert np.max(np.abs(one_use - exact["embedding"]) / bounds["embedding"]) > 10


def _decoder_output(src, tgt, params, lengths) -> np.ndarray:
    """y of logits = y E^T: the decoder's output, from the logits' oracle (E has full column rank 8 here)."""
    logits = M.transformer_forward(src, tgt, params, 2, src_lengths=lengths[0], tgt_lengths=lengths[1])
    return np.linalg.lstsq(params["embedding"], logits.reshape(-1, 11).T, rcond=None)[0].T
