"""The PyTorch built-ins (``torch``, ``torch-sdpa``, ``torch-nn``, ``torch-nn-fastpath``) beyond the conformance suite.

The suite itself (``conformance/``, run by ``make test`` for every built-in) checks every equation
on drawn and on fixed inputs (``conformance/inputs/fixed.py``). Here:

- the float16 and bfloat16 composites of ``torch`` (encoder layer, decoder layer, the whole
  model; computed in float32 inside, as the implementation declares) on the fixed inputs: every
  element checked against its budget, none left unchecked, and within budget;
- that the checks *can* fail on this backend: the PyTorch mutants (``conformance/studies/mutants.py``) are
  caught and diagnosed as their departure, and wrong mappings of the canonical weights and
  arguments onto PyTorch's modules are caught, each through the same registered checks on the
  fixed inputs;
- the correctly rounded conversions, the declared fully-masked policies against what PyTorch
  returns, and the ``torch-nn`` fast-path switch.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch built-ins need torch (pip install 'aiayn[torch]')")

from aiayn.conformance.checks import load_all  # noqa: E402
from aiayn.conformance.equations import unjudged  # noqa: E402
from aiayn.conformance.inputs import fixed as F  # noqa: E402
from aiayn.conformance.run.harness import CHECKS, ConformanceFailure, Stats, current_stats  # noqa: E402
from aiayn.conformance.studies import mutants  # noqa: E402
from aiayn.implementations.torch_impl import TorchImplementation, TorchSDPAImplementation, round_from_float64  # noqa: E402
from aiayn.implementations.torch_nn import TorchNNFastPath, TorchNNImplementation  # noqa: E402

load_all()


def _run_fixed(impl: Any, case: F.Fixed, dtype: str) -> Stats:
    """Run one fixed case through its registered check; return what it checked."""
    stats = Stats()
    token = current_stats().set(stats)
    try:
        CHECKS[case.check](impl, dtype, **case.args)
    finally:
        current_stats().reset(token)
    return stats


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "case", [c for c in F.FIXED if c.equation in ("encoder_layer", "decoder_layer", "transformer_forward")], ids=str
)
def test_low_precision_composites_are_checked_not_skipped(case: F.Fixed, dtype: str) -> None:
    stats = _run_fixed(TorchImplementation("cpu"), case, dtype)
    assert stats.checked > 0 and not unjudged(stats.unchecked), (
        f"{case.equation} [{case}] in {dtype}: not checked {stats.unchecked}"
    )
    assert stats.worst is not None and stats.worst <= 1.0


def test_the_fast_path_deviation_is_declared_and_still_there() -> None:
    case = next(c for c in F.cases("multi_head_attention") if c.label == "self-attention with a fully masked row")
    impl = TorchNNFastPath("cpu")
    key = f"multi_head_attention_on_fixed_inputs[{case.label}]"
    assert key in impl.known_deviations, f"torch-nn-fastpath no longer declares {key!r}"
    for dtype in impl.dtypes:
        with pytest.raises(ConformanceFailure, match="NaN"):
            _run_fixed(impl, case, dtype)
        _run_fixed(TorchNNImplementation("cpu"), case, dtype)  # the documented forward agrees


# ---------------------------------------------------------------------------------------------
# the checks can fail on this backend


@pytest.fixture
def _failures_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))  # the inputs each caught failure saves


def _caught(impl: Any, equation: str, dtype: str) -> tuple[list[str], set[str]]:
    """(labels of the fixed cases of ``equation`` that fail in ``dtype``, the departures their outputs matched)."""
    caught, named = [], set()
    for case in F.cases(equation):
        stats = Stats()
        token = current_stats().set(stats)
        try:
            CHECKS[case.check](impl, dtype, **case.args)
        except ConformanceFailure:
            caught.append(case.label)
        finally:
            current_stats().reset(token)
        named |= stats.departures
    return caught, named


@pytest.mark.usefixtures("_failures_in_tmp")
@pytest.mark.parametrize("name", mutants.TORCH_MUTANTS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_torch_mutants_are_caught_and_diagnosed_as_themselves(name: str, dtype: str) -> None:
    impl = getattr(mutants, name)("cpu")
    for equation in sorted(impl.targets):
        caught, named = _caught(impl, equation, dtype)
        assert caught, f"{name} ({impl.bug()}): {equation} in {dtype} passed every fixed case"
        assert impl.departure in named, (
            f"{name}: {equation} in {dtype} diagnosed as {sorted(named)}, not {impl.departure!r}"
        )


# Wrong mappings onto PyTorch's modules and arguments. No departure of the catalogue
# (``conformance/diagnoses/forward.py``) names them, so they are not mutants: what they show is that the
# fixed cases are sensitive to the mistakes an adapter over PyTorch is likely to make.


class _PyTorchDefaultEps(TorchNNImplementation):
    """The layers with PyTorch's default LayerNorm eps 1e-5 while declaring 1e-6."""

    def _layer_kwargs(self, params, num_heads):  # type: ignore[no-untyped-def]
        return {**super()._layer_kwargs(params, num_heads), "layer_norm_eps": 1e-5}


class _FixedEps(TorchImplementation):
    """LayerNorm with PyTorch's default eps 1e-5 whatever eps it is given."""

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        return super().layer_norm(x, gain, bias, 1e-5)


class _UntransposedWeights(TorchNNImplementation):
    """Canonical w_q, w_k, w_v as in_proj_weight without the transpose (x @ W vs x @ W^T)."""

    def _mha_tensors(self, params, d_model):  # type: ignore[no-untyped-def]
        untransposed = torch.cat([params[n] for n in ("w_q", "w_k", "w_v")], dim=0)
        return {**super()._mha_tensors(params, d_model), "in_proj_weight": untransposed}


@pytest.mark.usefixtures("_failures_in_tmp")
@pytest.mark.parametrize(
    ("impl", "equation", "dtype"),
    [
        (_PyTorchDefaultEps("cpu"), "encoder_layer", "float64"),
        (_FixedEps("cpu"), "layer_norm", "float32"),
        (_UntransposedWeights("cpu"), "multi_head_attention", "float32"),
    ],
    ids=["layers-eps-1e-5-float64", "layer_norm-eps-1e-5-float32", "untransposed-in_proj"],
)
def test_checks_catch_a_wrong_mapping_onto_pytorch(impl: Any, equation: str, dtype: str) -> None:
    # eps 1e-5 instead of 1e-6 moves LayerNorm's output by about 4.5e-6 / var relative: far above
    # the float64 budgets and the float32 LayerNorm budget on the fixed 0.01-scale rows (var 1e-4).
    caught, _ = _caught(impl, equation, dtype)
    assert caught, f"{type(impl).__name__}.{equation} in {dtype} passed every fixed case"


# ---------------------------------------------------------------------------------------------
# conversions: correctly rounded, unlike PyTorch's own float64 -> float16 cast


def _round_exact(v: float, p: int, emin: int) -> float:
    """Round v to p significant bits (min normal exponent emin), ties to even, by exact rational arithmetic."""
    if not math.isfinite(v) or v == 0:
        return v
    _, e = math.frexp(abs(v))  # |v| = m 2^e, 1/2 <= m < 1
    quantum = Fraction(2) ** max(e - p, emin - p + 1)
    scaled = Fraction(abs(v)) / quantum
    n = math.floor(scaled)
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** (-emin + 1)
    return math.copysign(math.inf if n * quantum > largest else float(n * quantum), v)


_TRICKY = [
    1 + 2**-11 + 2**-30,
    1 + 2**-8 + 2**-40,
    1 + 2**-11,
    1 + 3 * 2**-11,
    1 + 2**-8,
    1 + 3 * 2**-8,
    65504.0,
    65520.0,
    65519.99,
    3.3895e38,
    3.4e38,
    2**-24,
    2**-25,
    2**-25 + 2**-60,
    2**-134,
    2**-134 + 2**-170,
    3 * 2**-134,
    -0.0,
    0.0,
    -1e-300,
]


@pytest.mark.parametrize(("dtype", "p", "emin"), [("float16", 11, -14), ("bfloat16", 8, -126)])
def test_from_numpy_rounds_to_nearest_even(dtype: str, p: int, emin: int) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([_TRICKY, rng.normal(size=2000) * np.exp(rng.uniform(-95, 95, 2000))])
    impl = TorchImplementation("cpu")
    got = impl.to_numpy(impl.from_numpy(x, dtype))
    want = np.array([_round_exact(float(v), p, emin) for v in x])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"from_numpy(..., {dtype!r}) misrounds {bad.size} values, first {x[bad[0]]!r}: "
        f"got {got[bad[0]]!r}, correctly rounded {want[bad[0]]!r}"
    )


def test_pytorch_cast_double_rounds_which_is_why_we_round_ourselves() -> None:
    # 1 + 2^-11 + 2^-30 is just above the midpoint between the float16 neighbours 1 and 1 + 2^-10;
    # through float32 the 2^-30 is lost, the tie goes to even (1), off by one unit in the last place.
    x = torch.tensor([1 + 2**-11 + 2**-30], dtype=torch.float64)
    assert x.to(torch.float16).item() == 1.0, (
        "PyTorch's float64->float16 cast no longer double-rounds; round_from_float64 could use it"
    )
    assert round_from_float64(x, torch.float16).item() == 1 + 2**-10


def test_to_numpy_returns_a_float64_copy() -> None:
    impl = TorchImplementation("cpu")
    native = impl.from_numpy(np.array([1.5, -2.0]), "float64")
    back = impl.to_numpy(native)
    back[0] = 99.0
    assert impl.to_numpy(native)[0] == 1.5, "to_numpy returned a view of the tensor's memory"
    assert impl.to_numpy(impl.from_numpy(np.array([0.1]), "bfloat16")).dtype == np.float64


# ---------------------------------------------------------------------------------------------
# declared policies rest on what PyTorch returns


def test_sdpa_returns_zeros_on_a_fully_masked_row_as_declared() -> None:
    q = torch.randn(1, 3, 4, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True]] * 2 + [[False] * 4], dtype=torch.bool)[None].expand(1, 3, 4)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, q[:, :1].expand(1, 4, 4).contiguous(), q[:, :1].expand(1, 4, 4).contiguous(), attn_mask=mask
    )
    assert torch.equal(out[0, 2], torch.zeros(4, dtype=torch.float64)), (
        f"SDPA on a fully masked row gave {out[0, 2].tolist()}, expected zeros"
    )
    assert TorchSDPAImplementation("cpu").policies["fully_masked"] == "zeros"
    assert TorchNNImplementation("cpu").policies["fully_masked"] == "zeros"
    assert TorchImplementation("cpu").policies["fully_masked"] == "nan"


def test_torch_nn_layers_use_the_declared_eps_not_pytorchs_default() -> None:
    impl = TorchNNImplementation("cpu")
    kwargs = impl._layer_kwargs({"ffn": {"w1": torch.zeros(8, 16, dtype=torch.float64)}}, 2)
    assert kwargs["layer_norm_eps"] == impl.policies["layer_norm_eps"] == 1e-6
    assert torch.nn.LayerNorm(8).eps == 1e-5, "PyTorch's default LayerNorm eps changed; update the torch_nn docstring"
    assert (kwargs["norm_first"], kwargs["dropout"], kwargs["activation"], kwargs["batch_first"]) == (
        False,
        0.0,
        "relu",
        True,
    )


@pytest.mark.parametrize("fastpath", [False, True])
def test_torch_nn_fastpath_switch_selects_the_fused_kernels(fastpath: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for fn in ("_native_multi_head_attention", "_transformer_encoder_layer_fwd"):
        original = getattr(torch, fn)
        monkeypatch.setattr(torch, fn, lambda *a, _o=original, _n=fn, **k: calls.append(_n) or _o(*a, **k))
    impl = TorchNNImplementation("cpu", fastpath=fastpath)
    rng = np.random.default_rng(0)
    d = 8
    mha = {n: impl.from_numpy(rng.normal(size=(d, d)), "float32") for n in ("w_q", "w_k", "w_v", "w_o")}
    norm = {"gain": impl.from_numpy(np.ones(d), "float32"), "bias": impl.from_numpy(np.zeros(d), "float32")}
    ffn = {
        "w1": impl.from_numpy(rng.normal(size=(d, 16)), "float32"),
        "b1": impl.from_numpy(np.zeros(16), "float32"),
        "w2": impl.from_numpy(rng.normal(size=(16, d)), "float32"),
        "b2": impl.from_numpy(np.zeros(d), "float32"),
    }
    x = impl.from_numpy(rng.normal(size=(2, 4, d)), "float32")
    impl.multi_head_attention(x, x, x, mha, 2)
    impl.encoder_layer(x, {"self_attn": mha, "norm1": norm, "ffn": ffn, "norm2": norm}, 2)
    expected = ["_native_multi_head_attention", "_transformer_encoder_layer_fwd"] if fastpath else []
    assert calls == expected, f"fastpath={fastpath}: fused kernels called {calls}, expected {expected}"
