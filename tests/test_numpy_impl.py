"""The NumPy built-ins (``numpy``, ``numpy-blocked``) beyond the conformance suite.

The suite itself (``conformance/``, run by ``make test`` for every built-in) checks every equation
on drawn and on fixed inputs (``conformance/inputs/fixed.py``), each against the budget derived for it
(``conformance/budgets/forward.py``, ``conformance/budgets/composites/forward.py``). Here, through the same registered
checks (``CHECKS[name](impl, dtype, **args)``) and so within the same budgets:

- every fixed case with every element checked (none left without a budget that applies), on both
  built-ins and on what the suite's own runs do not reach: the blocked path with tiles smaller
  than the inputs (``numpy-blocked`` tiles by 512, so each fixed input is a single tile), and each
  declared policy besides the defaults, on both attention paths;
- a long sequence over ten tiles on both paths, and a few inputs the fixed cases lack;
- the implementation's own behaviour, exactly: which path ``attention="auto"`` takes, what the
  fully masked policies return, and the blocked path's memory growing linearly in n.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _checks import run_check

from aiayn.conformance.checks import load_all
from aiayn.conformance.equations import record, unjudged
from aiayn.conformance.inputs import fixed as F
from aiayn.conformance.run.harness import Stats
from aiayn.implementations import numpy_backward, numpy_impl
from aiayn.implementations.numpy_impl import NumpyImplementation, blocked_numpy_implementation
from aiayn.implementations.protocol import DEFAULT_POLICIES, POLICY_CHOICES
from aiayn.implementations.registry import load

load_all()


def _unjudged(stats: Stats) -> dict[str, int]:
    """The elements not checked for a reason other than having no defined value (padded target positions)."""
    return unjudged(stats.unchecked)


def _blocked(tile: int, **policies: str) -> Callable[[], NumpyImplementation]:
    return lambda: NumpyImplementation(attention="blocked", block_size=tile, policies=policies)


def _direct(**policies: str) -> Callable[[], NumpyImplementation]:
    return lambda: NumpyImplementation(attention="direct", policies=policies)


def _besides_the_default(policy: str) -> list[str]:
    return [p for p in POLICY_CHOICES[policy] if p != DEFAULT_POLICIES[policy]]


def _configurations() -> dict[str, Callable[[], NumpyImplementation]]:
    """The built-ins as registered, and the NumPy implementation as the suite does not run it: tiles
    smaller than the fixed inputs (4 leaves a ragged last tile on their 5, 6 and 7 keys), and every
    declared policy besides the default (the fully masked ones on both attention paths)."""
    configs = {
        "numpy": lambda: load("numpy"),
        "numpy-blocked": lambda: load("numpy-blocked"),
        "blocked, tiles of 2": _blocked(2),
        "blocked, tiles of 4": _blocked(4),
    }
    for p in _besides_the_default("fully_masked"):
        configs[f"fully_masked={p}, direct"] = _direct(fully_masked=p)
        configs[f"fully_masked={p}, blocked, tiles of 2"] = _blocked(2, fully_masked=p)
    for v in _besides_the_default("label_smoothing"):
        configs[f"label_smoothing={v}"] = _direct(label_smoothing=v)
    return configs


CONFIGURATIONS = _configurations()


def _dtypes(impl: NumpyImplementation, case: F.Fixed) -> tuple[str, ...]:
    """The dtypes the suite checks the case's equation in: the first only where its record says so."""
    return impl.dtypes[:1] if record(case.equation).first_dtype_only else impl.dtypes


@pytest.mark.parametrize("case", F.FIXED, ids=str)
@pytest.mark.parametrize("config", CONFIGURATIONS)
def test_every_fixed_case_is_checked_in_full(config: str, case: F.Fixed) -> None:
    impl = CONFIGURATIONS[config]()
    for dtype in _dtypes(impl, case):
        stats = run_check(impl, case.check, dtype, **case.args)
        unjudged = _unjudged(stats)
        assert not unjudged, f"{case.equation} [{case}] in {dtype} ({config}): not checked {unjudged}"
        empty = case.args.get("length") == 0  # the empty positional table has no element to check
        assert stats.checked > 0 or empty, f"{case.equation} [{case}] in {dtype} ({config}): nothing checked"


def _two_layer_model(d: int = 16, d_ff: int = 32, vocab: int = 13) -> dict[str, Any]:
    """Two layers per stack (the fixed cases have one); weights N(0, 1/fan_in), biases near 0, gains near 1."""
    rng = np.random.default_rng(6)

    def mha() -> dict[str, np.ndarray]:
        w = {f"w_{n}": rng.standard_normal((d, d)) / np.sqrt(d) for n in "qkvo"}
        return w | {f"b_{n}": 0.1 * rng.standard_normal(d) for n in "qkvo"}

    def norm() -> dict[str, np.ndarray]:
        return {"gain": 1 + 0.1 * rng.standard_normal(d), "bias": 0.1 * rng.standard_normal(d)}

    def ffn() -> dict[str, np.ndarray]:
        w1, w2 = rng.standard_normal((d, d_ff)) / np.sqrt(d), rng.standard_normal((d_ff, d)) / np.sqrt(d_ff)
        return {"w1": w1, "b1": 0.1 * rng.standard_normal(d_ff), "w2": w2, "b2": 0.1 * rng.standard_normal(d)}

    return {
        "embedding": rng.standard_normal((vocab, d)) / np.sqrt(d),
        "encoder": [{"self_attn": mha(), "norm1": norm(), "ffn": ffn(), "norm2": norm()} for _ in range(2)],
        "decoder": [
            {"self_attn": mha(), "norm1": norm(), "cross_attn": mha(), "norm2": norm(), "ffn": ffn(), "norm3": norm()}
            for _ in range(2)
        ],
    }


#: Inputs of the former hand-derived tests of this module that the fixed cases lack, run through the same checks.
EXTRA: tuple[F.Fixed, ...] = (
    F.Fixed(
        "layer_norm",
        "rows N(0,1), 1000+N(0,1), 0.01 N(0,1); eps 1e-6",
        "layer_norm",
        {
            "x": np.random.default_rng(1).normal(size=(3, 16)) * [[1.0], [1.0], [1e-2]] + [[0.0], [1000.0], [0.0]],
            "gain": 1 + 0.1 * np.random.default_rng(2).normal(size=16),
            "bias": 0.1 * np.random.default_rng(3).normal(size=16),
            "eps": 1e-6,
        },
    ),
    F.Fixed(
        "smoothed_cross_entropy",
        "logits 3 N(0,1) (2,4,11), one row shifted by +30; eps 0.1",
        "smoothed_cross_entropy",
        {
            "logits": 3 * np.random.default_rng(4).normal(size=(2, 4, 11)) + 30.0 * (np.arange(4) == 2)[None, :, None],
            "targets": np.random.default_rng(5).integers(0, 11, size=(2, 4)),
            "eps": 0.1,
        },
    ),
    F.Fixed(
        "lrate",
        "d_model 1024, warmup 4000",
        "lrate",
        {"steps": [1, 3999, 4000, 100000], "d_model": 1024, "warmup_steps": 4000},
    ),
    F.Fixed("lrate", "d_model 64, warmup 1", "lrate", {"steps": [1, 2, 7], "d_model": 64, "warmup_steps": 1}),
    F.Fixed(
        "transformer_forward",
        "two layers per stack, d 16, h 4, vocab 13, padding: src [7, 4], tgt [5, 3]",
        "transformer_forward",
        {
            "src": np.random.default_rng(7).integers(0, 13, size=(2, 7)),
            "tgt": np.random.default_rng(8).integers(0, 13, size=(2, 5)),
            "params": _two_layer_model(),
            "num_heads": 4,
            "src_lengths": np.array([7, 4]),
            "tgt_lengths": np.array([5, 3]),
        },
    ),
)


@pytest.mark.parametrize("case", EXTRA, ids=str)
def test_extra_inputs_agree_with_the_oracle(case: F.Fixed) -> None:
    impl = NumpyImplementation()
    for dtype in _dtypes(impl, case):
        stats = run_check(impl, case.check, dtype, **case.args)
        assert stats.checked > 0 and not _unjudged(stats), (
            f"{case} in {dtype}: {stats.checked} checked, {stats.unchecked}"
        )


@pytest.mark.parametrize("step_zero", POLICY_CHOICES["step_zero"])
def test_lrate_step_zero_follows_each_declared_policy(step_zero: str) -> None:
    """Step 0 as declared ("zero": 0.0, "raise": ValueError, "one": lrate(1)), and a negative step raises ValueError."""
    stats = run_check(
        NumpyImplementation(policies={"step_zero": step_zero}),
        "lrate_at_step_zero_follows_the_declared_policy",
        "float64",
        d_model=512,
        warmup_steps=4000,
    )
    assert stats.exact >= 2, f"step_zero={step_zero!r}: {stats.exact} exact checks, expected step 0 and step -1"


@pytest.mark.parametrize("variant", POLICY_CHOICES["label_smoothing"])
def test_smoothed_targets_sum_to_one_under_each_declared_variant(variant: str) -> None:
    impl = NumpyImplementation(policies={"label_smoothing": variant})
    for case in F.cases("label_smoothing"):
        stats = run_check(impl, "smoothed_targets_sum_to_one", impl.dtypes[0], **case.args)
        assert stats.checked == case.args["targets"].size, f"{variant} [{case}]: {stats.checked} sums checked"


# --------------------------------------------------------------------------------------------
# the attention paths


def _fully_masked_case() -> F.Fixed:
    return next(c for c in F.cases("scaled_dot_product_attention") if c.label == "random mask with a fully masked row")


@pytest.mark.parametrize("path", ["direct", "blocked"])
def test_fully_masked_rows_follow_the_declared_policy(path: str) -> None:
    """Exactly: "nan" gives a NaN row (what -inf masking gives), "zeros" exactly 0, "uniform" the mean of the values;
    the rows with a visible key are bit for bit the same under every policy."""
    args = _fully_masked_case().args
    q, k, v, mask = args["q"], args["k"], args["v"], args["mask"]
    dead = ~np.any(np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2])), axis=-1)  # (2, 3, 4)
    assert np.any(dead), "the fixed case lost its fully masked row"
    outs = {}
    for policy in POLICY_CHOICES["fully_masked"]:
        impl = NumpyImplementation(attention=path, block_size=2, policies={"fully_masked": policy})
        outs[policy] = impl.scaled_dot_product_attention(q, k, v, mask)
    assert np.all(np.isnan(outs["nan"][dead])), f"policy nan: {outs['nan'][dead]}"
    assert np.array_equal(outs["zeros"][dead], np.zeros_like(outs["zeros"][dead])), (
        f"policy zeros: {outs['zeros'][dead]}"
    )
    mean = np.broadcast_to(np.mean(v, axis=-2, keepdims=True), outs["uniform"].shape)
    assert np.array_equal(outs["uniform"][dead], mean[dead]), f"policy uniform: {outs['uniform'][dead]}"
    for policy in ("zeros", "uniform"):
        assert np.array_equal(outs["nan"][~dead], outs[policy][~dead]), (
            f"policy {policy} changed rows with visible keys"
        )
    assert not np.any(np.isnan(outs["zeros"]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "scale", [1.0, 128.0], ids=["moderate scores, exp unshifted", "large scores, online max-shifted softmax"]
)
def test_both_paths_agree_with_the_oracle_on_a_long_sequence(scale: float, dtype: str) -> None:
    """200 queries over 300 keys (ten key tiles of 32 on the blocked path) under a shifted causal mask.

    Both softmax forms of the implementation: scores of a few units, which it exponentiates without
    the max shift (``_unshifted_is_safe``), and q scaled by 128 (scores in the hundreds), where it
    takes the max-shifted online softmax, rescaling the earlier tiles whenever a row's maximum grows.
    """
    rng = np.random.default_rng(20170612)
    args = {
        "q": scale * rng.standard_normal((2, 200, 16)),
        "k": rng.standard_normal((2, 300, 16)),
        "v": rng.standard_normal((2, 300, 8)),
        "mask": np.tri(200, 300, k=100, dtype=bool),
    }
    direct, blocked = NumpyImplementation(attention="direct"), NumpyImplementation(attention="blocked", block_size=32)
    q, k, v = (direct.from_numpy(args[n], dtype) for n in ("q", "k", "v"))
    unshifted = numpy_impl._unshifted_is_safe(q * (1.0 / math.sqrt(16)), k, v)
    assert unshifted == (scale == 1.0), f"scale {scale}: the inputs no longer take the softmax they are meant for"
    for impl in (direct, blocked):
        stats = run_check(impl, "scaled_dot_product_attention", dtype, **args)
        assert stats.checked == 2 * 200 * 8 and not stats.unchecked, (
            f"{impl.attention}: {stats.checked} checked, not checked {stats.unchecked}"
        )
    same = np.array_equal(
        direct.scaled_dot_product_attention(q, k, v, args["mask"]),
        blocked.scaled_dot_product_attention(q, k, v, args["mask"]),
    )
    assert not same, "the paths agree bit for bit: is the blocked path running?"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("path", ["direct", "blocked"])
def test_the_backward_on_a_long_sequence_is_within_the_suites_budgets(path: str, dtype: str) -> None:
    """The backward's path for long inputs, which the suite's short draws do not reach: one (batch, head) slice at a
    time, 200 queries in blocks of 128 and a tail of 72, 300 keys (the blocked path: key tiles of 32 and a tail of
    12), a shifted causal mask with a fully masked first row ("zeros": no gradient there); judged by the suite's own
    gradient check, so within the derived budgets of every dQ, dK and dV element."""
    rng = np.random.default_rng(20171206)
    mask = np.tri(200, 300, k=100, dtype=bool)
    mask[0] = False
    args = {
        "q": rng.standard_normal((2, 200, 16)),
        "k": rng.standard_normal((2, 300, 16)),
        "v": rng.standard_normal((2, 300, 8)),
        "mask": mask,
        "d_out": rng.standard_normal((2, 200, 8)),
    }
    impl = NumpyImplementation(attention=path, block_size=32, policies={"fully_masked": "zeros"})
    assert 200 * 300 >= numpy_backward.PER_SLICE_MIN and 200 > numpy_backward.QUERY_ROWS, "no longer the long path"
    stats = run_check(impl, "scaled_dot_product_attention_gradients", dtype, **args)
    assert stats.checked == 2 * (200 * 16 + 300 * 16 + 300 * 8) and not stats.unchecked, (
        f"{path}: {stats.checked} checked, not checked {stats.unchecked}"
    )


def test_auto_takes_the_blocked_path_above_the_threshold_only() -> None:
    """Bitwise: auto == blocked above ``blocked_threshold`` (n_q n_k), auto == direct at or below it."""
    rng = np.random.default_rng(20170612)
    q, k, v = (
        rng.standard_normal((20, 8)).astype(np.float32),
        rng.standard_normal((30, 8)).astype(np.float32),
        rng.standard_normal((30, 4)).astype(np.float32),
    )
    blocked = NumpyImplementation(attention="blocked", block_size=8).scaled_dot_product_attention(q, k, v)
    direct = NumpyImplementation(attention="direct").scaled_dot_product_attention(q, k, v)
    assert not np.array_equal(blocked, direct), "the fixture must tell the two paths apart"
    above = NumpyImplementation(block_size=8, blocked_threshold=20 * 30 - 1).scaled_dot_product_attention(q, k, v)
    at = NumpyImplementation(block_size=8, blocked_threshold=20 * 30).scaled_dot_product_attention(q, k, v)
    assert np.array_equal(above, blocked), "auto above the threshold did not take the blocked path"
    assert np.array_equal(at, direct), "auto at the threshold did not take the direct path"
    assert blocked_numpy_implementation().attention == "blocked"


def _peak_bytes(impl: NumpyImplementation, n: int, masked: bool = False) -> int:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, 16)) for _ in range(3))
    mask = (np.arange(n) < n - 3)[None, :] if masked else None  # a padding mask (1, n): broadcast, not copied
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        impl.scaled_dot_product_attention(q, k, v, mask)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_blocked_path_peak_memory_grows_linearly_not_quadratically() -> None:
    """Peak traced bytes at n and 2n (d = 16, float64, tiles of 64), without and with a padding mask.

    Blocked: what it allocates is O(n d) (scaled q, output) plus O(block^2 + block d) per tile, so
    doubling n at most doubles the peak: ratio <= 2. Direct: the n x n score matrix dominates,
    ratio near 4 — asserted too, so this measurement can tell the two apart. (tracemalloc counts
    NumPy's allocations exactly, so the numbers are deterministic.)
    """
    n = 512
    blocked = NumpyImplementation(attention="blocked", block_size=64)
    direct = NumpyImplementation(attention="direct")
    for masked in (False, True):
        b1, b2 = _peak_bytes(blocked, n, masked), _peak_bytes(blocked, 2 * n, masked)
        assert b2 / b1 <= 2.0, (
            f"blocked peak (masked={masked}) grew {b2 / b1:.2f}x when n doubled ({b1} -> {b2} bytes); "
            "linear growth allows <= 2x"
        )
    d1, d2 = _peak_bytes(direct, n), _peak_bytes(direct, 2 * n)
    assert d2 / d1 > 3.5, (
        f"direct peak grew only {d2 / d1:.2f}x ({d1} -> {d2} bytes): the measurement misses the n^2 scores"
    )
    assert b2 < (2 * n) ** 2 * 8 / 4, (
        f"blocked peak {b2} bytes is not far below the {(2 * n) ** 2 * 8}-byte score matrix"
    )


def _decode_model() -> tuple[NumpyImplementation, dict[str, Any], np.ndarray]:
    from aiayn.reference.counts import TransformerConfig
    from aiayn.reference.model import init_params

    rng = np.random.default_rng(3)
    params = init_params(TransformerConfig(n_layers=2, d_model=8, d_ff=16, num_heads=2), 9, rng)
    return NumpyImplementation(), params, rng.integers(0, 9, (2, 5))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda i, p, s: i.decode_step(s[:, :2], i.encode(s, p, 2), p, 2, {"length": 0, "self": [None]}), "cache"),
        (lambda i, p, s: i.reorder_cache({"length": 1, "self": []}, np.array([0.5])), "index: expected a 1-D integer"),
        (lambda i, p, s: i.decode_step(s[0], i.encode(s, p, 2), p, 2), "tokens: expected a 2-D integer array"),
        (lambda i, p, s: i.beam_search(s, p, 2, 2, 0.6, np.array([4]), 1, 0), "max_lengths: expected 2 positive"),
        (lambda i, p, s: NumpyImplementation(policies={"beam_search": {"eos_rank": "3k"}}), "eos_rank"),
        (lambda i, p, s: NumpyImplementation(policies={"beam_search": {"stop": "soon"}}), "'stop' is not one of"),
    ],
)
def test_decoding_names_a_bad_argument(call: Callable[..., Any], message: str) -> None:
    impl, params, src = _decode_model()
    with pytest.raises(ValueError, match=message):
        call(impl, params, src)


def test_a_decode_step_leaves_the_cache_it_was_given_alone() -> None:
    """decode_step returns a new cache: the one given can be stepped again (two continuations of one prefix)."""
    impl, params, src = _decode_model()
    memory = impl.encode(src, params, 2)
    _, cache = impl.decode_step(src[:, :3], memory, params, 2)
    first, _ = impl.decode_step(src[:, 3:4], memory, params, 2, cache)
    again, _ = impl.decode_step(src[:, 3:4], memory, params, 2, cache)
    np.testing.assert_array_equal(first, again)
    assert cache["length"] == 3
