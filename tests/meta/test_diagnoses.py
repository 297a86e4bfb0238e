"""Named diagnoses (conformance/diagnoses/forward.py): the catalogue's paper is the oracle, its departures are real, and
failures name them.

- the catalogue's model with the paper's operations equals the oracle (``aiayn.reference``) on every
  equation, so a variant is the oracle with exactly one thing changed;
- every departure differs from the paper somewhere (no entry that could match a correct output);
- failing implementations are diagnosed by name in the failure message: a tutorial's LayerNorm
  ("unbiased variance, eps added to the std", on the NaN at d = 1 and on the miss at d = 4), GELU,
  a -1e9 masked_fill, float32 arithmetic behind a float64 claim;
- a correct output is never diagnosed (the diagnosis runs only when the check fails).

(Every project mutant diagnosed as itself: tests/meta/test_conformance_mutants.py.)
"""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aiayn import reference as R
from aiayn.conformance.checks import attention as A
from aiayn.conformance.checks import layers as L
from aiayn.conformance.checks import model as M
from aiayn.conformance.checks import positional as P
from aiayn.conformance.diagnoses import forward as D
from aiayn.conformance.equations import record
from aiayn.conformance.run.harness import ConformanceFailure, Stats, current_stats
from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.implementations.torch_impl import TorchImplementation
from aiayn.reference import model as RM
from aiayn.reference import training as RT

RNG = np.random.default_rng(20170612)


def _params(n_layers: int = 1, d: int = 4, h: int = 2, vocab: int = 7) -> dict[str, Any]:
    cfg = types.SimpleNamespace(n_layers=n_layers, d_model=d, d_ff=2 * d, num_heads=h, d_k=d // h, d_v=d // h)
    return RM.init_params(cfg, vocab, np.random.default_rng(3), biases=True)


def _paper_cases() -> list[tuple[str, dict[str, Any], Any]]:
    x = RNG.normal(size=(2, 3, 4))
    q, k, v = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 5, 4)), RNG.normal(size=(2, 5, 3))
    mask = RNG.random((2, 3, 5)) < 0.6
    mask[1, 1] = False
    p = _params(2)
    mha = {n: RNG.normal(size=(4, 4)) for n in ("w_q", "w_k", "w_v", "w_o")} | {
        n: RNG.normal(size=4) for n in ("b_q", "b_k", "b_v", "b_o")
    }
    g, b = RNG.normal(size=4), RNG.normal(size=4)
    w1, b1, w2, b2 = RNG.normal(size=(4, 8)), RNG.normal(size=8), RNG.normal(size=(8, 4)), RNG.normal(size=4)
    targets, logits = np.array([[0, 3, 6], [2, 2, 5]]), RNG.normal(size=(2, 3, 7))
    src, tgt = np.array([[1, 2, 3], [4, 5, 6]]), np.array([[0, 1], [2, 3]])
    lone = np.array([[0.5], [-np.inf]])  # length-1 rows: only a masked (-inf) one tells a shortcut
    # checkpoints in a directory's order: by step the last two are 1000 and 300, by name ("1000" < "20" < "300" < "5")
    # 300 and 5, the first two given 20 and 1000
    checkpoints = {s: {"w": RNG.normal(size=(2, 2)), "b": RNG.normal(size=2)} for s in (20, 1000, 5, 300)}
    # Adam at step 3 with a gradient whose sqrt(v_hat) is near eps (1e-8): every constant and placement shows
    adam = {
        "param": RNG.normal(size=3),
        "grad": np.array([0.3, -2e-8, 1e-3]),
        "m": np.array([0.1, 1e-8, -1e-3]),
        "v": np.array([0.04, 1e-16, 1e-6]),
        "step": 3,
        "lr": 1e-3,
        "betas": [0.9, 0.98],
        "eps": 1e-9,
    }
    # the masks of a layer in training mode, by sub-layer: about a third dropped
    enc_keep = {name: RNG.random(x.shape) >= 0.3 for name in RM.ENCODER_SUBLAYERS}
    dec_keep = {name: RNG.random((2, 2, 4)) >= 0.3 for name in RM.DECODER_SUBLAYERS}
    model_keep = {
        place: RNG.random((2, 3 if place.startswith(("src", "encoder")) else 2, 4)) >= 0.3
        for place in RM.dropout_places(2, 2)
    }
    # 70 queries: past the last whole tile of 16, 32 and 64 rows (a kernel that leaves its last partial tile unwritten)
    long_q, long_k, long_v = RNG.normal(size=(70, 4)), RNG.normal(size=(9, 4)), RNG.normal(size=(9, 3))
    return [
        ("softmax", {"x": x, "axis": 1}, lambda: R.softmax(x, 1)),
        ("softmax", {"x": lone, "axis": -1}, lambda: R.softmax(lone, -1)),
        *[
            (
                "scaled_dot_product_attention",
                {"q": q, "k": k, "v": v, "mask": mask, "fully_masked": fm},
                lambda fm=fm: R.scaled_dot_product_attention(q, k, v, mask, fully_masked=fm),
            )
            for fm in ("nan", "zeros", "uniform")
        ],
        (
            "scaled_dot_product_attention",
            {"q": long_q, "k": long_k, "v": long_v, "mask": None, "fully_masked": "nan"},
            lambda: R.scaled_dot_product_attention(long_q, long_k, long_v),
        ),
        (
            "multi_head_attention",
            {"query": x, "key": x, "value": x, "params": mha, "num_heads": 2, "mask": None, "fully_masked": "nan"},
            lambda: R.multi_head_attention(x, x, x, mha, 2),
        ),
        ("positional_encoding", {"length": 30, "d_model": 12}, lambda: R.positional_encoding(30, 12)),
        ("layer_norm", {"x": x, "gain": g, "bias": b, "eps": 1e-6}, lambda: R.layer_norm(x, g, b, 1e-6)),
        ("feed_forward", {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}, lambda: R.feed_forward(x, w1, b1, w2, b2)),
        (
            "lrate",
            {"steps": [1, 10, 4000, 9000], "d_model": 512, "warmup_steps": 4000, "step_zero": "zero"},
            lambda: RT.lrate(np.array([1, 10, 4000, 9000]), 512, 4000),
        ),
        (
            "adam_step",
            {**adam, "bias_correction": True, "eps_placement": "outside"},
            lambda: np.stack(RT.adam_step(**adam)),
        ),
        (
            "dropout",
            {"x": x, "keep": x > 0, "p": 0.1, "seed": 0},
            lambda: R.dropout(x, x > 0, 0.1),
        ),
        (
            "average_checkpoints",
            {"checkpoints": checkpoints, "n": 2},
            lambda: np.concatenate([v.reshape(-1) for v in RT.average_checkpoints(checkpoints, 2).values()]),
        ),
        (
            "label_smoothing",
            {"targets": targets, "vocab_size": 7, "eps": 0.1, "declared": "K-2", "padding_id": 0},
            lambda: RT.label_smoothing(targets, 7, 0.1, variant="K-1", padding_id=0),
        ),
        (
            "smoothed_cross_entropy",
            {"logits": logits, "targets": targets, "eps": 0.1, "declared": "K", "padding_id": 0},
            lambda: RT.smoothed_cross_entropy(logits, targets, 0.1),
        ),
        (
            "encoder_layer",
            {"x": x, "params": p["encoder"][0], "num_heads": 2, "mask": None, "eps": 1e-6, "fully_masked": "nan"},
            lambda: RM.encoder_layer(x, p["encoder"][0], 2, None, eps=1e-6),
        ),
        (
            "decoder_layer",
            {
                "y": x[:, :2],
                "memory": x,
                "params": p["decoder"][0],
                "num_heads": 2,
                "self_mask": None,
                "memory_mask": None,
                "eps": 1e-6,
                "fully_masked": "nan",
            },
            lambda: RM.decoder_layer(x[:, :2], x, p["decoder"][0], 2, None, None, eps=1e-6),
        ),
        (
            "encoder_layer_training",
            {
                "x": x,
                "params": p["encoder"][0],
                "num_heads": 2,
                "p": 0.3,
                "seed": 0,
                "mask": None,
                "keep": enc_keep,
                "eps": 1e-6,
                "fully_masked": "nan",
            },
            lambda: RM.encoder_layer(x, p["encoder"][0], 2, None, eps=1e-6, keep=enc_keep, p_drop=0.3),
        ),
        (
            "decoder_layer_training",
            {
                "y": x[:, :2],
                "memory": x,
                "params": p["decoder"][0],
                "num_heads": 2,
                "p": 0.3,
                "seed": 0,
                "self_mask": None,
                "memory_mask": None,
                "keep": dec_keep,
                "eps": 1e-6,
                "fully_masked": "nan",
            },
            lambda: RM.decoder_layer(x[:, :2], x, p["decoder"][0], 2, None, None, eps=1e-6, keep=dec_keep, p_drop=0.3),
        ),
        (
            "transformer_forward",
            {
                "src": src,
                "tgt": tgt,
                "params": p,
                "num_heads": 2,
                "src_lengths": np.array([3, 2]),
                "tgt_lengths": np.array([2, 1]),
                "eps": 1e-6,
                "fully_masked": "nan",
            },
            lambda: RM.transformer_forward(
                src, tgt, p, 2, src_lengths=np.array([3, 2]), tgt_lengths=np.array([2, 1]), eps=1e-6
            ),
        ),
        (
            "transformer_forward_training",
            {
                "src": src,
                "tgt": tgt,
                "params": p,
                "num_heads": 2,
                "p": 0.3,
                "seed": 0,
                "src_lengths": np.array([3, 2]),
                "tgt_lengths": np.array([2, 1]),
                "keep": model_keep,
                "eps": 1e-6,
                "fully_masked": "nan",
            },
            lambda: RM.transformer_forward(
                src,
                tgt,
                p,
                2,
                src_lengths=np.array([3, 2]),
                tgt_lengths=np.array([2, 1]),
                eps=1e-6,
                keep=model_keep,
                p_drop=0.3,
            ),
        ),
    ]


PAPER_CASES = _paper_cases()


@pytest.mark.parametrize(("equation", "args", "oracle"), PAPER_CASES, ids=[c[0] for c in PAPER_CASES])
def test_the_catalogues_paper_is_the_oracle(equation: str, args: dict[str, Any], oracle: Any) -> None:
    ours, theirs = D.evaluate(record(equation).model, args), np.asarray(oracle(), dtype=np.float64)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    # both compute in longdouble (64-bit significand) and round to float64; their orders of operations
    # differ, so they agree to a few units of longdouble's roundoff times the magnitudes involved
    scale = float(np.nanmax(np.abs(theirs))) if theirs.size else 0.0
    assert np.allclose(np.nan_to_num(ours), np.nan_to_num(theirs), rtol=2.0**-48, atol=2.0**-48 * scale), (
        f"{equation}: {np.nanmax(np.abs(ours - theirs))}"
    )


@pytest.mark.parametrize("departure", [d for d in D.CATALOGUE if d.precision is None], ids=lambda d: d.name)
def test_every_departure_changes_some_output(departure: D.Departure) -> None:
    """On these inputs (chosen to exercise every operation: masks with a fully masked row, large logits) each
    departure differs from the paper."""
    for equation, args, _ in PAPER_CASES:
        if departure.family not in record(equation).departures:
            continue
        args = dict(args)
        if equation == "softmax" and args["x"].ndim == 3:  # the first case; the second keeps its length-1 rows
            args["x"] = np.concatenate(
                [args["x"], 1e4 * np.ones((2, 3, 1))], axis=-1
            )  # overflow for the unshifted form
        if equation == "lrate":
            args["step_zero"] = "zero"
        if equation == "adam_step":  # a placement or correction departs only from another declared one
            args["eps_placement"] = "hat" if departure.ops.adam_eps == "outside" else "outside"
            args["bias_correction"] = departure.ops.adam_bias_correction is not True
        if equation == "label_smoothing" or equation == "smoothed_cross_entropy":
            args["declared"] = "K-1" if departure.ops.smoothing == "K" else "K"
        for fm in ("nan", "zeros"):
            if "fully_masked" in args:
                args["fully_masked"] = fm
            model = record(equation).model
            paper, variant = D.evaluate(model, args), departure.output(model, args, "float32")
            if (
                paper.shape != variant.shape
                or not np.array_equal(np.isnan(paper), np.isnan(variant))
                or not np.allclose(np.nan_to_num(paper), np.nan_to_num(variant), rtol=1e-9, atol=1e-12)
            ):
                return
    pytest.fail(
        f"{departure.name!r} gives the paper's output on every test input: it could match a correct implementation"
    )


# --------------------------------------------------------------------------------------------
# failures name their departure


@pytest.fixture
def stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AIAYN_FAILURES", str(tmp_path / "failures"))
    s = Stats()
    token = current_stats().set(s)
    yield s
    current_stats().reset(token)


class TutorialLayerNorm(NumpyImplementation):
    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        with np.errstate(invalid="ignore", divide="ignore"):
            return (gain * (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True, ddof=1) + eps) + bias).astype(
                x.dtype
            )


class GeluFFN(NumpyImplementation):
    def feed_forward(self, x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
        import math

        h = x @ w1 + b1
        return ((h * 0.5 * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))) @ w2 + b2).astype(x.dtype)


class MaskedFill(NumpyImplementation):
    def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        if mask is not None:
            s = np.where(mask, s, -1e9)
        e = np.exp(s - s.max(-1, keepdims=True))
        return ((e / e.sum(-1, keepdims=True)) @ v).astype(q.dtype)


class Float32Inside(NumpyImplementation):
    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        return (
            super()
            .layer_norm(x.astype(np.float32), gain.astype(np.float32), bias.astype(np.float32), eps)
            .astype(x.dtype)
        )


def _message(check: Any, impl: Any, dtype: str, **args: Any) -> str:
    with pytest.raises(ConformanceFailure) as failure:
        check(impl, dtype, **args)
    return str(failure.value)


def test_a_tutorial_layer_norm_is_named_on_the_nan_and_on_the_miss(stats: Stats) -> None:
    gain, bias = np.ones(1), np.zeros(1)
    nan = _message(L.layer_norm, TutorialLayerNorm(), "float64", x=np.array([[3.0]]), gain=gain, bias=bias, eps=1e-6)
    assert "NaN at index" in nan and "'unbiased variance, eps added to the std'" in nan, nan
    x = np.array([[1.0, 2.0, 4.0, 8.0]])
    miss = _message(L.layer_norm, TutorialLayerNorm(), "float64", x=x, gain=np.ones(4), bias=np.zeros(4), eps=1e-6)
    assert "'unbiased variance, eps added to the std'" in miss and "x budget" in miss, miss
    assert "unbiased variance, eps added to the std" in stats.departures


def test_gelu_masked_fill_and_float32_inside_are_named(stats: Stats) -> None:
    x = RNG.normal(size=(2, 3))
    ffn = {
        "w1": RNG.normal(size=(3, 5)),
        "b1": RNG.normal(size=5),
        "w2": RNG.normal(size=(5, 3)),
        "b2": RNG.normal(size=3),
    }
    assert "'GELU instead of ReLU'" in _message(L.feed_forward, GeluFFN(), "float64", x=x, **ffn)
    q, k, v = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4)), RNG.normal(size=(3, 2))
    mask = np.array([[True, False, True], [False, False, False], [True, True, False]])
    filled = _message(A.scaled_dot_product_attention, MaskedFill(), "float64", q=q, k=k, v=v, mask=mask)
    assert (
        "'masked scores set to -1e9 (masked_fill)'" in filled
        and "'fully masked rows give the mean of the values'" in filled
    ), filled
    rows = RNG.normal(size=(3, 16)) + 1.0
    inside = _message(L.layer_norm, Float32Inside(), "float64", x=rows, gain=np.ones(16), bias=np.zeros(16), eps=1e-6)
    assert "'float32 inside a float64 claim'" in inside, inside


def test_a_pre_norm_encoder_is_named(stats: Stats) -> None:
    from aiayn.conformance.studies.mutants import PreNormEncoder

    p = _params(1)["encoder"][0]
    message = _message(
        M.encoder_layer,
        PreNormEncoder(),
        "float64",
        x=RNG.normal(size=(1, 3, 4)),
        params=p,
        num_heads=2,
        mask=None,
    )
    assert "'pre-norm sub-layers x + Sublayer(LayerNorm(x))'" in message, message


class SoftmaxShortcut(NumpyImplementation):
    def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
        return np.ones_like(x) if x.shape[axis] == 1 else super().softmax(x, axis)


class PreNormFFN(NumpyImplementation):
    """A feed-forward module that is the whole pre-norm sub-layer: x + FFN(LayerNorm(x)), PyTorch's eps 1e-5."""

    def feed_forward(self, x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
        d = x.shape[-1]
        normed = super().layer_norm(x, np.ones(d, x.dtype), np.zeros(d, x.dtype), 1e-5)
        return (x + super().feed_forward(normed, w1, b1, w2, b2)).astype(x.dtype)


def test_a_softmax_shortcut_over_length_one_axes_is_named(stats: Stats) -> None:
    """A row of one masked score: exp(-inf - max) / sum is 0/0 in the paper's softmax, the shortcut gives 1."""
    x = np.array([[0.5, -np.inf, 3.0]])
    message = _message(A.softmax, SoftmaxShortcut(), "float64", x=x, axis=0)
    assert "'softmax returns 1 over a length-1 axis whatever the input'" in message, message


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_feed_forward_module_that_is_the_pre_norm_sub_layer_is_named(stats: Stats, dtype: str) -> None:
    x = 3.0 * RNG.normal(size=(2, 3, 4))
    ffn = {
        "w1": RNG.normal(size=(4, 6)),
        "b1": RNG.normal(size=6),
        "w2": RNG.normal(size=(6, 4)),
        "b2": RNG.normal(size=4),
    }
    message = _message(L.feed_forward, PreNormFFN(), dtype, x=x, **ffn)
    name = "'feed-forward module with its own pre-norm and residual x + FFN(LayerNorm(x)), eps 1e-5'"
    assert name in message, message


def _in_float32(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _in_float32(v) for k, v in tree.items()}
    return tree.astype(np.float32) if isinstance(tree, np.ndarray) and tree.dtype == np.float64 else tree


class PreNormInFloat32(NumpyImplementation):
    """A pre-norm encoder layer computed in float32 while float64 is declared: two departures at once."""

    def encoder_layer(self, x, params, num_heads, mask=None):  # type: ignore[no-untyped-def]
        from aiayn.conformance.studies.mutants import PreNormEncoder

        return (
            PreNormEncoder().encoder_layer(x.astype(np.float32), _in_float32(params), num_heads, mask).astype(x.dtype)
        )


class PositionsInFloat32(NumpyImplementation):
    """The sinusoid table built in float32 (the right layout) under a float64 claim."""

    def positional_encoding(self, length, d_model, dtype):  # type: ignore[no-untyped-def]
        return super().positional_encoding(length, d_model, "float32").astype(np.dtype(dtype))


def test_a_pre_norm_layer_computed_in_float32_is_named_as_the_pair(stats: Stats) -> None:
    p = _params(1)["encoder"][0]
    x = RNG.normal(size=(2, 3, 4))
    message = _message(M.encoder_layer, PreNormInFloat32(), "float64", x=x, params=p, num_heads=2, mask=None)
    pair = "'pre-norm sub-layers x + Sublayer(LayerNorm(x)) + float32 inside a float64 claim'"
    assert pair in message, message


def test_a_property_failure_explained_by_float32_arithmetic_says_so(stats: Stats) -> None:
    """The float32 table agrees with the paper within float32's budget ("float32 inside a float64 claim"), and §3.5's
    own shift M_k holds at float32's arithmetic: the property failure names the arithmetic, not the layout."""
    from aiayn.conformance.checks import positional as P

    named = _message(P.positional_encoding, PositionsInFloat32(), "float64", length=40, d_model=16)
    assert "'float32 inside a float64 claim'" in named, named
    shift = _message(
        P.positional_encoding_pairs_rotate_by_k, PositionsInFloat32(), "float64", length=40, d_model=16, offset=7
    )
    assert "the output matches 'float32 inside a float64 claim'" in shift, shift
    assert "this breaks what the paper states" not in shift, shift
    assert not stats.violations and "float32 inside a float64 claim" in stats.departures


def test_candidates_an_example_cannot_tell_apart_are_narrowed_on_drawn_inputs(stats: Stats) -> None:
    """q = k = 0 and equal value rows: a masked_fill of -1e9, an added -1e4 and an ignored mask all give the failing
    output (the mean, on the fully masked row). Values redrawn at the same shapes and mask separate the ignored mask
    (the partly masked row) and the added -1e4 (a fully masked row of unequal scores); the two left agree wherever
    scores stay far below 1e9, and the message lists them as candidates not told apart, never as a match."""
    q, k, v = np.zeros((2, 2)), np.zeros((3, 2)), np.ones((3, 2))
    mask = np.array([[True, False, True], [False, False, False]])
    message = _message(A.scaled_dot_product_attention, MaskedFill(), "float64", q=q, k=k, v=v, mask=mask)
    head = message.splitlines()[0]
    assert "'masked scores set to -1e9 (masked_fill)'" in head and "candidates, not told apart" in head, head
    assert "matches" not in head, head
    assert "'mask ignored'" not in head and "'finite mask value -1e4 added to the scores'" not in head, head
    assert stats.departures == {
        "masked scores set to -1e9 (masked_fill)",
        "fully masked rows give the mean of the values",
    }


class UnbiasedLayerNorm(TorchImplementation):
    """LayerNorm with the unbiased variance (eps inside the root), in float32 for the narrow dtypes."""

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        xs = x if x.dtype == torch.float64 else x.float()
        z = (xs - xs.mean(-1, keepdim=True)) / torch.sqrt(xs.var(-1, keepdim=True, unbiased=True) + eps)
        return (z * gain.to(xs.dtype) + bias.to(xs.dtype)).to(x.dtype)


class UnbiasedLayerNormHalfOnly(UnbiasedLayerNorm):
    def __init__(self) -> None:
        super().__init__("cpu")
        self.dtypes = ("float16",)


def test_candidates_a_wide_budget_fits_are_told_apart_in_a_tighter_dtype(stats: Stats) -> None:
    """In float16 the unbiased variance with eps inside or added to the std differ by eps / std, far inside the
    budget, on every input drawn in float16: candidates. One input drawn in float64, which the implementation also
    declares, separates them; declaring float16 alone, they stay candidates."""
    rng = np.random.default_rng(1)
    args = {"x": rng.normal(size=(3, 4)), "gain": 1 + 0.1 * rng.normal(size=4), "bias": 0.1 * rng.normal(size=4)}
    message = _message(L.layer_norm, UnbiasedLayerNormHalfOnly(), "float16", **args, eps=1e-6).splitlines()[0]
    assert "candidates, not told apart" in message and "'unbiased variance, eps added to the std'" in message, message
    message = _message(L.layer_norm, UnbiasedLayerNorm("cpu"), "float16", **args, eps=1e-6).splitlines()[0]
    assert "the output matches 'unbiased variance' (not" in message and "(the last in float64)" in message, message


def test_the_largest_discrepancy_example_narrows_the_candidates(stats: Stats) -> None:
    """The test's largest discrepancy (another input) named one of the candidates: only it is named."""
    stats.largest = {"ratio": 9.0, "where": "-", "inputs": "-", "replay": "/x.npz", "departures": ["mask ignored"]}
    q, k, v = np.zeros((2, 2)), np.zeros((3, 2)), np.ones((3, 2))
    mask = np.array([[True, True, True], [False, False, False]])
    message = _message(A.scaled_dot_product_attention, MaskedFill(), "float64", q=q, k=k, v=v, mask=mask)
    assert "the output matches 'mask ignored' (not " in message, message.splitlines()[0]


def test_no_known_departure_says_so(stats: Stats) -> None:
    class Doubled(NumpyImplementation):
        def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
            return 2 * super().softmax(x, axis)

    message = _message(A.softmax, Doubled(), "float64", x=np.array([[1.0, 2.0]]), axis=-1)
    assert "no known departure matches" in message


def test_a_failing_property_names_what_the_paper_states(stats: Stats) -> None:
    """A property check has no oracle value to match departures against: its failure names the statement of the
    paper it breaks."""
    q, k, v = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4)), RNG.normal(size=(3, 2))
    keep = np.array([True, False, True])

    class AddedMask(NumpyImplementation):  # an additive -1e9 mask: a masked score of 1e300 outweighs it
        def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
            with np.errstate(over="ignore", invalid="ignore"):
                s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + np.where(mask, 0.0, -1e9)
                e = np.exp(s - s.max(-1, keepdims=True))
                return (e / e.sum(-1, keepdims=True)) @ v

    message = _message(
        A.attention_poison_at_masked_positions_changes_nothing,
        AddedMask(),
        "float64",
        q=q,
        k=k,
        v=v,
        keep=keep,
        poison="huge",
    )
    statement = "masked scores are set to -inf: what a masked key or value holds cannot matter (§3.2.3)"
    assert f"this breaks what the paper states: '{statement}'" in message, message
    assert stats.violations == {statement} and not stats.departures


def test_a_crash_in_a_property_check_names_no_statement(stats: Stats) -> None:
    class Raises(NumpyImplementation):
        def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
            raise RuntimeError("kernel not available")

    q = RNG.normal(size=(2, 4))
    message = _message(
        A.attention_poison_at_masked_positions_changes_nothing,
        Raises(),
        "float64",
        q=q,
        k=q,
        v=q,
        keep=np.array([True, False]),
        poison="nan_keys",
    )
    assert "raised RuntimeError" in message and "breaks what the paper states" not in message and not stats.violations


def test_every_property_check_states_what_it_protects() -> None:
    from aiayn.conformance.run.harness import check

    def a_property(case: object) -> None: ...

    with pytest.raises(ValueError, match="'a_property'.*violates="):
        check("softmax", kind="property")(a_property)


class FlushToZero(NumpyImplementation):
    """Softmax with subnormal results flushed to zero (FTZ), as XLA's CPU backend does."""

    def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
        out = super().softmax(x, axis)
        return np.where(np.abs(out) < np.finfo(out.dtype).tiny, 0, out).astype(out.dtype)


class FlushToZeroAttention(NumpyImplementation):
    """Eq. (1) with subnormal results flushed to zero, as XLA's CPU backend computes jax.nn.dot_product_attention."""

    def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
        out = super().scaled_dot_product_attention(q, k, v, mask)
        return np.where(np.abs(out) < np.finfo(out.dtype).tiny, 0, out).astype(out.dtype)


class ScaleShiftLayerNorm(NumpyImplementation):
    """LayerNorm as x r + (beta - mean r), r = gain / sqrt(var + eps), every step in the dtype (Keras'
    LayerNormalization)."""

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        mean = x.mean(-1, keepdims=True)
        r = (x.dtype.type(1) / np.sqrt(np.square(x - mean).mean(-1, keepdims=True) + x.dtype.type(eps))) * gain
        return x * r + (bias - mean * r)


def test_flush_to_zero_is_named(stats: Stats) -> None:
    x = np.array([[0.0, -95.0, -1.0]])  # exp(-95) = 5.5e-42: a float32 subnormal, flushed to 0
    message = _message(A.softmax, FlushToZero(), "float32", x=x, axis=-1)
    assert "'subnormal results flushed to zero'" in message, message


def test_declared_flush_to_zero_is_checked_within_its_own_budget(stats: Stats) -> None:
    """Declared FTZ arithmetic (policy ``flush_subnormals``) is checked against the budget whose underflow unit is
    2^emin (``harness.Case.arithmetic``): the same code that fails undeclared passes, only in the declared
    (equation, dtype)."""
    from aiayn.implementations.protocol import contract_problems, flushes_subnormals

    declared = FlushToZero(policies={"flush_subnormals": {"float32": ("softmax",)}})
    A.softmax(declared, "float32", x=np.array([[0.0, -95.0, -1.0]]), axis=-1)
    message = _message(
        A.softmax, declared, "float64", x=np.array([[0.0, -720.0, -1.0]]), axis=-1
    )  # exp(-720): a float64 subnormal
    assert "'subnormal results flushed to zero'" in message, message
    assert not contract_problems(declared)
    elsewhere = FlushToZero(
        policies={"flush_subnormals": {"float32": ("layer_norm",)}}
    )  # declared, but not for softmax
    message = _message(A.softmax, elsewhere, "float32", x=np.array([[0.0, -95.0, -1.0]]), axis=-1)
    assert "'subnormal results flushed to zero'" in message, message
    assert flushes_subnormals(declared.policies, "softmax", "float32")
    assert not flushes_subnormals(declared.policies, "softmax", "bfloat16")
    assert not flushes_subnormals(declared.policies, "layer_norm", "float32")
    for bad in ("float32", ("float32",), {"float32": "softmax"}, {"float8": ("softmax",)}, {"float32": ("soft_max",)}):
        with pytest.raises(ValueError, match="flush_subnormals"):
            FlushToZero(policies={"flush_subnormals": bad})


def test_an_arithmetic_departure_is_named_before_an_equation_departure_the_input_cannot_tell_apart(
    stats: Stats,
) -> None:
    """Scores so large that softmax is one-hot either way: the paper's output is one subnormal term,
    w = exp(-90) = 8.2e-40 (score gap a^2 / sqrt(2) = 90), which FTZ arithmetic flushes to 0; without the
    1/sqrt(d_k) scale the term is exp(-127) = 6.5e-56, also 0 within the budget. Both departures agree
    with the output; the flush (the paper's equation in other arithmetic) is named, the missing scale is not
    (the zoo report named both for jax-sdpa)."""
    a = float(np.float32(np.sqrt(90.0 * np.sqrt(2.0))))  # a^2 / sqrt(d_k) = 90, d_k = 2
    q, k, v = np.array([[a, 0.0]]), np.array([[a, 0.0], [0.0, 0.0]]), np.array([[0.0], [1.0]])
    message = _message(A.scaled_dot_product_attention, FlushToZeroAttention(), "float32", q=q, k=k, v=v, mask=None)
    assert "'subnormal results flushed to zero'" in message, message
    assert "no 1/sqrt(d_k) scaling" not in message, message
    assert stats.departures == {"subnormal results flushed to zero"}, stats.departures
    args = {
        "q": q,
        "k": k,
        "v": v,
        "mask": None,
        "fully_masked": "nan",
    }  # the same input, the paper's output, no scale: apart by the flushed term only
    assert abs(float(D.evaluate(D.scaled_dot_product_attention, args)[0, 0]) - np.exp(-90.0)) < 1e-3 * np.exp(-90.0)


def test_torch_sdpa_declares_flush_to_zero_only_where_its_flash_kernel_runs() -> None:
    """PyTorch's CPU flash-attention kernel flushes in bfloat16; LayerNorm, the FFN and the rest do not use it,
    so their rows keep the IEEE budgets (and their report rows do not say "flushed")."""
    pytest.importorskip("torch")
    from aiayn.implementations.protocol import EQUATIONS, flushes_subnormals
    from aiayn.implementations.torch_impl import TorchSDPAImplementation

    policies = TorchSDPAImplementation().policies
    flushed = {e for e in EQUATIONS if flushes_subnormals(policies, e, "bfloat16")}
    assert flushed == {
        "scaled_dot_product_attention",
        "multi_head_attention",
        "encoder_layer",
        "decoder_layer",
        "transformer_forward",
    }
    assert not any(flushes_subnormals(policies, e, d) for e in EQUATIONS for d in ("float64", "float32", "float16"))


def test_a_cancelling_scale_shift_layer_norm_is_named(stats: Stats) -> None:
    x, gain, bias = np.array([[10.0]]), np.array([0.7]), np.array([0.92567])  # d = 1: the paper's output is the bias
    message = _message(L.layer_norm, ScaleShiftLayerNorm(), "float32", x=x, gain=gain, bias=bias, eps=1e-6)
    assert "'LayerNorm as x r + (beta - mean r), r = gain / sqrt(var + eps)'" in message, message


def test_a_scale_shift_layer_norm_upcast_to_float32_is_named_in_float16(stats: Stats) -> None:
    """Keras under JAX on float16: x r + (beta - mean r) in float32, rounded at the end. d = 1 and
    x = -181: x r = -181000 overflows float16 but not float32, where beta - mean r loses beta's low bits."""

    class Upcast(NumpyImplementation):
        dtypes = ("float64", "float32", "float16")

        def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
            x32, g32, b32 = (np.asarray(a, dtype=np.float32) for a in (x, gain, bias))
            mean = x32.mean(-1, keepdims=True)
            var = np.square(x32 - mean).mean(-1, keepdims=True) + np.float32(eps)
            r = (1 / np.sqrt(var.astype(np.float64))).astype(np.float32) * g32  # rsqrt, one rounding
            return (x32 * r + (b32 - mean * r)).astype(x.dtype)

    x, gain, bias = np.array([[-181.0]]), np.array([1.0]), np.array([0.0390625])
    message = _message(L.layer_norm, Upcast(), "float16", x=x, gain=gain, bias=bias, eps=1e-6)
    assert "'LayerNorm as x r + (beta - mean r), computed in float32'" in message, message


def test_departures_are_credited_only_from_the_examples_a_failure_message_shows() -> None:
    """The report credits a departure from Hypothesis's final replay of a failure (the example its message shows,
    with its replay file), a fixed input or a replay; not from the examples met while searching and shrinking."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from aiayn.conformance.run.comparison import _shown_example

    seen: list[bool] = []

    @settings(database=None, max_examples=30, derandomize=True)
    @given(st.integers(0, 100))
    def failing(n: int) -> None:
        seen.append(_shown_example())
        assert n < 50

    with pytest.raises(AssertionError):
        failing()
    assert seen[-1] is True and seen.count(True) == 1 and len(seen) > 1, seen
    assert _shown_example()  # outside Hypothesis: a fixed input or a replay


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_additive_mask_is_named_on_a_fully_masked_row(stats: Stats, dtype: str) -> None:
    """A fully masked row shifted by -1e4 loses about 12 digits in float64 (4 in float32) to the rounding of s + M;
    the variant is compared within 4 u (|M| + max|s|) max|v| there (diagnoses.forward._added_mask_rounding), so the
    mutant that does exactly that is named on the input that shows it best."""
    from aiayn.conformance.studies.mutants import AdditiveMask

    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(4, 8)), rng.normal(size=(6, 8)), rng.normal(size=(6, 5))
    mask = rng.random((4, 6)) < 0.7
    mask[2] = False  # a fully masked row: the paper's output is NaN there (declared policy "nan")
    message = _message(A.scaled_dot_product_attention, AdditiveMask(), dtype, q=q, k=k, v=v, mask=mask)
    assert "'finite mask value -1e4 added to the scores'" in message, message


# --------------------------------------------------------------------------------------------
# tables and stacks as shipped libraries build them


def _timing_signal(length: int, d_model: int, start: int = 0, halves: bool = True, guard: bool = True) -> np.ndarray:
    """tensor2tensor's get_timing_signal_1d, written from its definition: d/2 timescales 1 .. 10^4 spaced
    geometrically over max(d/2 - 1, 1) steps (without ``guard``: d/2 - 1, NaN at d_model = 2, as an inference
    engine computes it), angle pos / timescale_i, [sin | cos] (or interleaved)."""
    n = d_model // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.exp(np.arange(n) * -(np.log(1e4) / (max(n - 1, 1) if guard else np.float64(n - 1))))  # (d/2,)
    angle = (np.arange(length)[:, None] + start) * inv[None, :]  # (length, d/2)
    if halves:
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    table = np.empty((length, d_model))
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    return table


class TimingSignal(NumpyImplementation):
    """tensor2tensor's table (start 0), its spacing in the paper's interleaved layout, or its table from position 1
    (an engine that counts positions from 1; with ``guard=False`` NaN at d_model = 2, as that engine's)."""

    def __init__(self, start: int = 0, halves: bool = True, guard: bool = True) -> None:
        super().__init__()
        self.start, self.halves, self.guard = start, halves, guard

    def positional_encoding(self, length, d_model, dtype):  # type: ignore[no-untyped-def]
        return _timing_signal(length, d_model, self.start, self.halves, self.guard).astype(np.dtype(dtype))


class Shipped(TorchImplementation):
    """A whole model as shipped libraries build it, in plain PyTorch (its gradients PyTorch's autograd, none of the
    suite's code): a LayerNorm (gain 1, bias 0, eps 1e-6) after each stack in ``stacks`` (PyTorch's
    nn.Transformer builds both), ``table``'s positional encoding (a TimingSignal), the embedding scaled "before_pe"
    (§3.4), "after_pe" or "none", and the decoder's output times d_model^-1/2 before the tied projection with
    ``output_scale`` (T5)."""

    def __init__(
        self,
        stacks: tuple[str, ...] = ("encoder", "decoder"),
        table: Any = None,
        embed: str = "before_pe",
        output_scale: bool = False,
    ) -> None:
        super().__init__("cpu")
        self.stacks, self.table, self.embed, self.output_scale = stacks, table, embed, output_scale

    def positional_encoding(self, length, d_model, dtype):  # type: ignore[no-untyped-def]
        if self.table is None:
            return super().positional_encoding(length, d_model, dtype)
        return self.from_numpy(self.table.positional_encoding(length, d_model, "float64"), dtype)

    def _embed(self, tokens, params, name):  # type: ignore[no-untyped-def]
        emb = params["embedding"]
        d = emb.shape[1]
        pe = self.positional_encoding(tokens.shape[1], d, str(emb.dtype).removeprefix("torch."))
        root = math.sqrt(d)
        if self.embed == "after_pe":
            return (emb[tokens] + pe) * root
        return emb[tokens] * (1.0 if self.embed == "none" else root) + pe

    def _final(self, x, stack):  # type: ignore[no-untyped-def]
        if stack not in self.stacks:
            return x
        d = x.shape[-1]
        return self.layer_norm(x, torch.ones(d, dtype=x.dtype), torch.zeros(d, dtype=x.dtype), 1e-6)

    def transformer_forward(self, src_tokens, tgt_tokens, params, num_heads, src_lengths=None, tgt_lengths=None):  # type: ignore[no-untyped-def]
        src_mask, n_tgt = self._key_mask(src_lengths, src_tokens.shape[1]), tgt_tokens.shape[1]
        tgt_mask = self._causal(n_tgt)
        if tgt_lengths is not None:
            tgt_mask = tgt_mask & self._key_mask(tgt_lengths, n_tgt)
        x = self._embed(src_tokens, params, "src_tokens")
        for layer in params["encoder"]:
            x = self.encoder_layer(x, layer, num_heads, src_mask)
        x = self._final(x, "encoder")
        y = self._embed(tgt_tokens, params, "tgt_tokens")
        for layer in params["decoder"]:
            y = self.decoder_layer(y, x, layer, num_heads, tgt_mask, src_mask)
        y = self._final(y, "decoder") / (math.sqrt(y.shape[-1]) if self.output_scale else 1.0)
        return y @ params["embedding"].transpose(0, 1)


def _whole_model_args(d: int = 8, h: int = 2) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    return {
        "src": rng.integers(0, 11, size=(2, 5)),
        "tgt": rng.integers(0, 11, size=(2, 4)),
        "params": _params(1, d=d, h=h, vocab=11),
        "num_heads": h,
        "src_lengths": np.array([5, 3]),
        "tgt_lengths": None,
    }


def _whole_model_message(impl: Any, dtype: str, gradients: bool = False, d: int = 8, h: int = 2) -> str:
    args = _whole_model_args(d, h)
    if not gradients:
        return _message(M.transformer_forward, impl, dtype, **args)
    d_out = np.random.default_rng(6).normal(size=(2, 4, 11))
    return _message(M.transformer_forward_gradients, impl, dtype, d_out=d_out, **args)


@pytest.mark.parametrize(
    ("impl", "name"),
    [
        (TimingSignal(halves=False), "frequencies 10000^(-i/(d/2-1)) (tensor2tensor's spacing)"),
        (TimingSignal(), "tensor2tensor's timing signal (get_timing_signal_1d)"),
        (TimingSignal(start=1), "tensor2tensor's timing signal (get_timing_signal_1d) + positions counted from 1"),
        (
            TimingSignal(start=2),
            "tensor2tensor's timing signal (get_timing_signal_1d) + positions counted from 2 (padding_idx + 1)",
        ),
    ],
    ids=["spacing", "timing signal", "timing signal from 1", "fairseq's table"],
)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tensor2tensors_tables_are_named(stats: Stats, impl: Any, name: str, dtype: str) -> None:
    """Each table on the positional-encoding row (the last two as pairs of structural departures), and each inside
    a whole model."""
    message = _message(P.positional_encoding, impl, dtype, length=12, d_model=16)
    assert f"'{name}'" in message or f'"{name}"' in message, message
    message = _whole_model_message(Shipped(stacks=(), table=impl), dtype)
    assert f"'{name}'" in message or f'"{name}"' in message, message


#: Each whole-model family on a stand-in built with exactly that departure, and its name.
SHIPPED = [
    (Shipped(("encoder",)), "a final LayerNorm after the encoder stack"),
    (Shipped(("decoder",)), "a final LayerNorm after the decoder stack"),
    (Shipped(), "a final LayerNorm after each stack"),
    (Shipped((), TimingSignal()), "tensor2tensor's timing signal (get_timing_signal_1d)"),
    (Shipped((), embed="none"), "embeddings not scaled by sqrt(d_model)"),
    (Shipped((), embed="after_pe"), "embeddings scaled by sqrt(d_model) after the PE is added"),
    (Shipped((), output_scale=True), "decoder output scaled by d_model^-1/2 before the tied projection"),
    (
        Shipped((), embed="none", output_scale=True),
        "embeddings not scaled by sqrt(d_model) + decoder output scaled by d_model^-1/2 before the tied projection",
    ),
    (
        Shipped((), TimingSignal(start=2)),
        "tensor2tensor's timing signal (get_timing_signal_1d) + positions counted from 2 (padding_idx + 1)",
    ),
]
SHIPPED_IDS = [
    "encoder norm",
    "decoder norm",
    "both norms",
    "t2t table",
    "unscaled",
    "after PE",
    "T5 output",
    "T5",
    "fairseq",
]


@pytest.mark.parametrize(("impl", "name"), SHIPPED, ids=SHIPPED_IDS)
@pytest.mark.parametrize("gradients", [False, True], ids=["forward", "gradients"])
def test_each_whole_model_family_is_named(stats: Stats, impl: Any, name: str, gradients: bool) -> None:
    """In float32, forward and gradients (the gradients' names from ``diagnoses/backward.py``'s VJP of the same
    departure, checked against the stand-in's autograd)."""
    message = _whole_model_message(impl, "float32", gradients)
    assert f"'{name}'" in message or f'"{name}"' in message, message


@pytest.mark.parametrize("gradients", [False, True], ids=["forward", "gradients"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_final_norms_and_tensor2tensors_table_are_named_together(stats: Stats, dtype: str, gradients: bool) -> None:
    """Two structural departures at once: neither alone agrees, the pair does, forward and gradients."""
    message = _whole_model_message(Shipped(table=TimingSignal()), dtype, gradients)
    pair = "tensor2tensor's timing signal (get_timing_signal_1d) + a final LayerNorm after each stack"
    assert f'"{pair}"' in message or f"'{pair}'" in message, message


class PreNorm(Shipped):
    """Pre-norm layers x + Sublayer(LayerNorm(x)) closed by a final LayerNorm on each stack (the Annotated
    Transformer, fairseq's normalize_before), and with ``tutorial_norm`` the Annotated Transformer's own LayerNorm:
    gain (x - mean) / (std + eps) + bias with torch's unbiased std."""

    def __init__(self, tutorial_norm: bool = False) -> None:
        super().__init__()
        self.tutorial_norm = tutorial_norm

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        if not self.tutorial_norm:
            return super().layer_norm(x, gain, bias, eps)
        return gain * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + bias

    def encoder_layer(self, x, params, num_heads, mask=None):  # type: ignore[no-untyped-def]
        z = self._norm(x, params, "norm1")
        x = x + self.multi_head_attention(z, z, z, params["self_attn"], num_heads, mask)
        return x + self._ffn(self._norm(x, params, "norm2"), params)

    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):  # type: ignore[no-untyped-def]
        z = self._norm(y, params, "norm1")
        y = y + self.multi_head_attention(z, z, z, params["self_attn"], num_heads, self_mask)
        z = self._norm(y, params, "norm2")
        y = y + self.multi_head_attention(z, memory, memory, params["cross_attn"], num_heads, memory_mask)
        return y + self._ffn(self._norm(y, params, "norm3"), params)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_sub_layers_departure_is_carried_up_to_the_whole_model(stats: Stats, dtype: str) -> None:
    """Pre-norm with final norms named at the whole model, forward and gradients; with the Annotated Transformer's
    LayerNorm too, that LayerNorm is named on its own row and, paired with the pre-norm structure, at the whole
    model."""
    prenorm = "pre-norm sub-layers with a final LayerNorm after each stack"
    for gradients in (False, True):  # the gradients' name from the oracle's pullback of pre-norm layers
        message = _whole_model_message(PreNorm(), dtype, gradients)
        assert f"'{prenorm}'" in message or f'"{prenorm}"' in message, message
    tutorial = "unbiased variance, eps added to the std"
    x = np.random.default_rng(7).normal(size=(3, 8))
    message = _message(L.layer_norm, PreNorm(True), dtype, x=x, gain=np.ones(8), bias=np.zeros(8), eps=1e-6)
    assert f"'{tutorial}'" in message, message
    message = _whole_model_message(PreNorm(True), dtype)
    assert f"'{tutorial} + {prenorm}'" in message, message


def test_the_paper_is_named_by_no_new_family(stats: Stats) -> None:
    """The paper's whole model and table pass the checks these names come from: nothing to name."""
    M.transformer_forward(NumpyImplementation(), "float64", **_whole_model_args())
    d_out = np.random.default_rng(6).normal(size=(2, 4, 11))
    M.transformer_forward_gradients(Shipped(()), "float64", d_out=d_out, **_whole_model_args())
    P.positional_encoding(NumpyImplementation(), "float64", length=12, d_model=16)
    assert not stats.departures, stats.departures


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_engines_table_is_named_at_every_width(stats: Stats, dtype: str) -> None:
    """tensor2tensor's timing signal from position 1 without its guard (NaN at d_model = 2): named on the
    positional row at d_model 2 and 16 and in the whole model at d_model 2; the shift property holds (a linear map
    exists), the layout check names the table."""
    engine = TimingSignal(start=1, guard=False)
    unguarded = "'tensor2tensor's timing signal without its guard (NaN at d_model = 2)'"
    assert unguarded in _message(P.positional_encoding, engine, dtype, length=12, d_model=2)
    assert unguarded in _whole_model_message(Shipped((), engine), dtype, d=2, h=1)
    pair = "tensor2tensor's timing signal (get_timing_signal_1d) + positions counted from 1"
    message = _message(P.positional_encoding, engine, dtype, length=12, d_model=16)
    assert f"'{pair}'" in message, message
    P.positional_encoding_shift_is_a_linear_map(engine, dtype, length=40, d_model=16, offset=3)
    message = _message(P.positional_encoding_pairs_rotate_by_k, engine, dtype, length=40, d_model=16, offset=3)
    assert "§3.5's layout" in message and f'the table matches "{pair}"' in message, message


class Float32Flushed(NumpyImplementation):
    """A float64 softmax computed in float32 code on a machine that flushes subnormal results to zero."""

    def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
        y = super().softmax(x.astype(np.float32), axis)
        return np.where(np.abs(y) < np.finfo(np.float32).tiny, np.float32(0), y).astype(x.dtype)


def test_float32_and_flushed_subnormals_together_are_named(stats: Stats) -> None:
    """Weights of e^-95 (subnormal in float32) flushed, the others rounded to float32: neither arithmetic alone
    explains the row, both together do."""
    x = np.array([[0.0, -95.0, 0.3, 1.7], [2.0, 0.5, -96.0, 0.1]])
    message = _message(A.softmax, Float32Flushed(), "float64", x=x, axis=-1)
    assert "'float32 inside a float64 claim, subnormal results flushed to zero'" in message, message


class BentTable(NumpyImplementation):
    """§3.5's table with one column replaced by (pos / length)^2: no linear map shifts it."""

    def positional_encoding(self, length, d_model, dtype):  # type: ignore[no-untyped-def]
        table = super().positional_encoding(length, d_model, dtype).copy()
        table[:, 1] = (np.arange(length) / max(length, 1)) ** 2
        return table


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_shift_property_is_the_papers_and_the_layout_is_checked_apart(stats: Stats, dtype: str) -> None:
    """tensor2tensor's table (another layout and spacing) has a linear shift map: the shift property holds and
    the layout check names what it breaks; a table with a non-sinusoid column has none: the shift property fails."""
    args = {"length": 40, "d_model": 8, "offset": 3}
    P.positional_encoding_shift_is_a_linear_map(TimingSignal(start=1), dtype, **args)
    assert stats.checked >= 1, stats
    message = _message(P.positional_encoding_pairs_rotate_by_k, TimingSignal(start=1), dtype, **args)
    assert "§3.5's layout" in message, message
    message = _message(P.positional_encoding_shift_is_a_linear_map, BentTable(), dtype, **args)
    assert "no linear map takes PE(pos) to PE(pos + 3)" in message, message


def test_a_departure_is_named_with_padded_targets(stats: Stats) -> None:
    """The logits at padded target positions are compared by nothing, and judged by no departure: nn.Transformer's
    final norms are named with target padding too."""
    args = {**_whole_model_args(), "tgt_lengths": np.array([4, 2])}
    message = _message(M.transformer_forward, Shipped(), "float64", **args)
    assert "'a final LayerNorm after each stack'" in message, message
