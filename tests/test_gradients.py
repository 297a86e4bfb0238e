"""How the suite gets and judges an implementation's gradients (``conformance/run/gradients.py``,
``conformance/checks/_common.gradient_agreement``, ``conformance/budgets/backward.py``).

- PyTorch autograd: one array passed as q, k and v is one leaf, its gradient the sum over the three uses, compared
  with the sum of the oracle's; a method run under ``torch.no_grad()`` is "not provided", never a failure.
- The NumPy built-in's hand-written backward (direct, and tile by tile from a saved log-sum-exp) equals the oracle's
  VJP to float64 accuracy on every fully-masked policy.
- The backward budgets are bounds that apply (finite, below the vacuous level) on ordinary inputs, are zero where
  the gradient is exactly zero (masked keys under "zeros"), and are not relative to a cancelling result.
- A gradient element that depends on a NaN output is not checked, and counted.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.conformance.budgets import backward as BB
from aiayn.conformance.checks import attention as A
from aiayn.conformance.checks import layers as A_layers
from aiayn.conformance.checks import load_all
from aiayn.conformance.checks._common import UNDEFINED_GRADIENT
from aiayn.conformance.numerics import precision
from aiayn.conformance.run import comparison, harness
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.implementations import numpy_backward
from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.reference import attention as ref

load_all()
RNG = np.random.default_rng(7)


def _attention_case(n_q: int = 3, n_k: int = 5, d: int = 4) -> dict[str, np.ndarray]:
    q, k, v = (RNG.normal(size=(2, n, d)) for n in (n_q, n_k, n_k))
    mask = RNG.random((2, n_q, n_k)) < 0.7
    mask[0, 1, :] = False  # a fully masked row
    return {"q": q, "k": k, "v": v, "mask": mask, "d_out": RNG.normal(size=(2, n_q, d)) + 2.0}


@pytest.mark.parametrize("given_out", [False, True], ids=["D from P and dP", "D from the forward's O"])
@pytest.mark.parametrize("policy", ["nan", "zeros", "uniform"])
@pytest.mark.parametrize("block", [None, 2, 1])
def test_numpy_backward_equals_the_oracle_vjp(policy: str, block: int | None, given_out: bool) -> None:
    c = _attention_case()
    impl = NumpyImplementation(policies={"fully_masked": policy})
    out = impl.scaled_dot_product_attention(c["q"], c["k"], c["v"], c["mask"]) if given_out else None
    got = numpy_backward.attention_vjp(c["q"], c["k"], c["v"], c["mask"], out, c["d_out"], policy, block)
    want = ref.scaled_dot_product_attention_vjp(c["q"], c["k"], c["v"], c["d_out"], c["mask"], fully_masked=policy)
    for name, expected in zip("qkv", want):
        finite = np.isfinite(expected)
        assert np.array_equal(np.isnan(got[name]), np.isnan(expected)), name
        np.testing.assert_allclose(got[name][finite], expected[finite], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("block", [None, 2])
def test_numpy_backward_makes_a_row_with_an_overflowing_score_nan_not_a_value(block: int | None) -> None:
    """A score that overflows to +inf makes its row's forward output NaN; the backward must not turn that row into
    finite weights (a tile whose maximum is not finite is weighted 0 in the merge, so its inf must reach l): the
    row's dQ and every dV its weights reach are NaN, the other rows' gradients finite."""
    q, k, v = (RNG.normal(size=(1, 4, 3)) for _ in range(3))
    k[0, 1] = [1.7e308, 0.0, 0.0]
    q[0] = np.abs(q[0]) + 2.0  # every query's score with key 1 overflows (q_0 / sqrt(3) x 1.7e308 > 1.8e308)
    q[0, 2, 0] = 0.0  # but query 2's (0 x 1e308 = 0)
    with np.errstate(all="ignore"):
        got = numpy_backward.attention_vjp(q, k, v, None, None, RNG.normal(size=(1, 4, 3)), "nan", block)
    assert np.isnan(got["q"][0, [0, 1, 3]]).all() and np.isfinite(got["q"][0, 2]).all(), got["q"]
    assert np.isnan(got["v"]).all(), got["v"]


def test_torch_autograd_sums_one_array_over_its_uses() -> None:
    torch_impl = pytest.importorskip("aiayn.implementations.torch_impl")
    impl = torch_impl.TorchImplementation(device="cpu")
    x = RNG.normal(size=(1, 4, 3))
    stats = harness.Stats()
    token = harness.current_stats().set(stats)
    try:  # the same array as q, k and v: one leaf; passes against the sum of the oracle's three gradients
        A.scaled_dot_product_attention_gradients(
            impl, "float64", q=x, k=x, v=x, mask=None, d_out=RNG.normal(size=x.shape)
        )
    finally:
        harness.current_stats().reset(token)
    assert stats.checked == x.size and stats.worst is not None and stats.worst <= 1


def test_a_method_without_an_autograd_graph_is_not_provided() -> None:
    torch_impl = pytest.importorskip("aiayn.implementations.torch_impl")
    import torch

    class Detached(torch_impl.TorchImplementation):
        name = "detached"

        def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
            with torch.no_grad():
                return super().softmax(x, axis)

    with pytest.raises(pytest.skip.Exception, match="not provided: .*no autograd graph"):
        A.softmax_gradients(
            Detached(device="cpu"), "float32", x=RNG.normal(size=(2, 3)), axis=-1, d_out=np.ones((2, 3))
        )


def test_a_wrong_gradient_fails_naming_the_gradient() -> None:
    class Doubled(NumpyImplementation):
        name = "doubled"

        def _softmax_vjp(self, x, axis, *, d_out):  # type: ignore[no-untyped-def]
            return {"x": 2 * super()._softmax_vjp(x, axis, d_out=d_out)["x"]}

    with pytest.raises(
        ConformanceFailure, match=r"softmax .*backward: the gradient dx disagrees with the oracle's VJP"
    ):
        A.softmax_gradients(Doubled(), "float64", x=RNG.normal(size=(2, 4)), axis=-1, d_out=RNG.normal(size=(2, 4)))


def test_undefined_gradients_are_not_checked_and_counted() -> None:
    c = _attention_case()
    stats = harness.Stats()
    token = harness.current_stats().set(stats)
    try:  # policy "nan": the fully masked row's output is NaN, so dQ's row and every dK, dV of its batch undefined
        A.scaled_dot_product_attention_gradients(NumpyImplementation(), "float64", **c)
    finally:
        harness.current_stats().reset(token)
    undefined = stats.unchecked.get(UNDEFINED_GRADIENT, 0)
    assert undefined == 4 + 2 * 5 * 4, stats.unchecked  # one dQ row of 4, dK and dV of batch 0 (5 x 4 each)
    assert stats.checked > 0


def test_backward_budgets_apply_and_are_zero_where_the_gradient_is() -> None:
    c = _attention_case()
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        b = BB.scaled_dot_product_attention(c["q"], c["k"], c["v"], c["mask"], c["d_out"], precision(dtype), "zeros")
        for name, bound in b.items():
            assert np.all(comparison.applicable(bound)), (dtype, name)
    # a masked key receives nothing from a query that cannot see it: its dK and dV bounds are the underflow terms
    mask = np.ones((1, 2, 3), dtype=bool)
    mask[..., 2] = False
    q, k, v = RNG.normal(size=(1, 2, 4)), RNG.normal(size=(1, 3, 4)), RNG.normal(size=(1, 3, 4))
    b = BB.scaled_dot_product_attention(q, k, v, mask, RNG.normal(size=(1, 2, 4)), precision("float32"), "zeros")
    assert np.all(b["v"][0, 2] < 1e-40) and np.all(b["k"][0, 2] < 1e-40)


def test_softmax_backward_budget_is_not_relative_to_a_cancelling_result() -> None:
    # dy constant: dx = y (dy - sum y dy) = 0 exactly, yet every computed dx carries rounding errors of |y||dy|
    x, dy = RNG.normal(size=(1, 6)), np.full((1, 6), 3.0)
    bound = BB.softmax(x, dy, -1, precision("float32"))["x"]
    y = np.exp(x) / np.exp(x).sum()
    assert np.all(bound > 1e-8 * y * 3.0)


def test_pytorch_tolerance_comparison_runs_and_our_rule_never_fails_the_kernel(tmp_path) -> None:
    pytest.importorskip("torch")
    from aiayn.conformance.studies import tolerances

    assert tolerances.main([str(tmp_path)]) == 0
    data = tolerances.measure()
    assert len(data["rows"]) == len(tolerances.cases()) * 3 * 3
    checked = [r for r in data["rows"] if r["checked"]]
    assert checked and all(r["ours_worst"] <= 1 for r in checked)
    assert (tmp_path / "gradient-tolerances.md").exists()


def test_a_float32_backward_inside_a_float64_claim_is_named_so() -> None:
    class Float32Backward(NumpyImplementation):
        name = "float32-backward"

        def _layer_norm_vjp(self, x, gain, bias, eps, *, d_out):  # type: ignore[no-untyped-def]
            low = super()._layer_norm_vjp(
                x.astype(np.float32),
                gain.astype(np.float32),
                bias.astype(np.float32),
                eps,
                d_out=d_out.astype(np.float32),
            )
            return {name: g.astype(np.float64) for name, g in low.items()}

    x = 3.0 + RNG.normal(size=(3, 8))
    with pytest.raises(ConformanceFailure, match="float32 inside a float64 claim"):
        A_layers.layer_norm_gradients(
            Float32Backward(),
            "float64",
            x=x,
            gain=1.0 + 0.1 * RNG.normal(size=8),
            bias=RNG.normal(size=8),
            eps=1e-5,
            d_out=RNG.normal(size=(3, 8)),
        )


def test_jax_gradients_in_float64_are_computed_in_x64_mode() -> None:
    """An adapter enables JAX's x64 mode around its own call only; the pullback runs after it returned, so the suite
    runs it in x64 too: a float64 gradient is computed (and JAX's float32 softmax then fails it by name), never a
    dtype clash inside JAX's backward."""
    pytest.importorskip("jax")
    from aiayn.implementations.zoo.jax_nn import JaxAttention

    q, k, v = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 5, 4)), RNG.normal(size=(2, 5, 4))
    with pytest.raises(ConformanceFailure) as failure:
        A.scaled_dot_product_attention_gradients(
            JaxAttention(), "float64", q=q, k=k, v=v, mask=None, d_out=RNG.normal(size=(2, 3, 4))
        )
    assert "float32 inside a float64 claim" in str(failure.value) and "TypeError" not in str(failure.value)


def test_the_eq1_backward_budget_holds_where_a_scaled_operand_underflows() -> None:
    """SDPA scales q (and k) by 1/sqrt(d_k) before its products: with q of subnormal float32 values that rounding
    errs by up to eta an element, which dK carries times |dS|. The exact gradient at the rounded operand (q sigma
    rounded to float32, divided back) stays within the float32 budget of the exact one."""
    rng = np.random.default_rng(5)
    q = np.full((2, 1, 5, 3), float(np.float32(1.401298464324817e-45)))
    k, v = rng.uniform(-1, 1, (2, 1, 5, 3)), rng.uniform(-10, 10, (2, 1, 5, 2))
    d_out = rng.uniform(30, 47, (2, 1, 5, 2))
    sigma = 1.0 / np.sqrt(3.0)
    prescaled = np.float32(q * sigma).astype(np.float64) / sigma  # the operand SDPA multiplies by, scaled back
    exact = ref.scaled_dot_product_attention_vjp(q, k, v, d_out)[1]  # dK
    rounded = ref.scaled_dot_product_attention_vjp(prescaled, k, v, d_out)[1]
    budget = BB.scaled_dot_product_attention(q, k, v, None, d_out, precision("float32"))["k"]
    assert np.max(np.abs(rounded - exact)) > 0  # the underflow is there to bound
    assert np.all(np.abs(rounded - exact) <= budget)
