"""The batch-invariance check (``conformance/checks/invariance.py``) and its arrangements (``inputs/batches.py``):
the example keeps its values and its part of the result in every arrangement, fillers differ from it, padding is
hidden, the bitwise tier fails a declared ``batch_invariant`` that does not hold, and the ulps apart are measured."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
from _checks import run_check

from aiayn.conformance.checks import load_all
from aiayn.conformance.checks.invariance import NO_BATCH, ulps_apart
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import batches
from aiayn.conformance.run.harness import ConformanceFailure
from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.implementations.protocol import FULL_SCOPE, Scope, contract_problems
from aiayn.reference import attention as ref_attention
from aiayn.reference import model as ref_model

load_all()

RNG = np.random.default_rng(20171206)


def _attention_args(batch: tuple[int, ...], mask: np.ndarray | None) -> dict[str, Any]:
    return {
        "q": RNG.standard_normal((*batch, 3, 4)),
        "k": RNG.standard_normal((*batch, 5, 4)),
        "v": RNG.standard_normal((*batch, 5, 2)),
        "mask": mask,
    }


@pytest.mark.parametrize("batch", [(), (2,), (2, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_example_keeps_its_result_in_a_batch_and_padded(batch: tuple[int, ...], masked: bool) -> None:
    """The oracle on each arrangement, read at ``keep``, is the oracle on the example: the arrangements change
    nothing the paper's Eq. (1) computes for the example (fillers of other lengths; padding hidden)."""
    mask = np.array([[True, True, False, True, True]]) if masked else None
    args = _attention_args(batch, mask)
    b = record("scaled_dot_product_attention").batch
    alone = batches.alone(args, b, FULL_SCOPE)
    want = ref_attention.scaled_dot_product_attention(args["q"], args["k"], args["v"], mask)
    got = ref_attention.scaled_dot_product_attention(**alone.args)[alone.keep]
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    placed = batches.in_batch(alone, b, FULL_SCOPE, 3, 1, np.random.default_rng(1))
    block = alone.args["q"].shape[0]
    assert placed.args["q"].shape[0] == 3 * block and placed.args["mask"].shape[0] == 3 * block
    fillers = np.delete(placed.args["mask"], np.s_[block : 2 * block], axis=0)
    assert fillers.any(axis=-1).all(), "a filler has a fully masked row"
    np.testing.assert_array_equal(ref_attention.scaled_dot_product_attention(**placed.args)[placed.keep], got)
    assert not np.array_equal(placed.args["k"][:block], alone.args["k"]) or block != 1, "a filler equals the example"
    padded = batches.padded(alone, b, FULL_SCOPE, 2, np.random.default_rng(2))
    assert padded.args["k"].shape[-2] == 7 and not padded.args["mask"][..., :3, 5:].any(), "padding not hidden"
    np.testing.assert_allclose(ref_attention.scaled_dot_product_attention(**padded.args)[padded.keep], got, 1e-15)


def test_self_attention_stays_self_attention_and_the_decoder_stays_causal() -> None:
    """One array passed as query, key and value stays one array in every arrangement; the decoder's self-attention
    mask, None (causal) in the example, is the causal mask in the batch, with fillers causal too."""
    x = RNG.standard_normal((2, 4, 6))
    args = {"query": x, "key": x, "value": x, "params": {}, "num_heads": 2, "mask": None}
    b = record("multi_head_attention").batch
    alone = batches.alone(args, b, FULL_SCOPE)
    for placed in (
        batches.in_batch(alone, b, FULL_SCOPE, 2, 0, np.random.default_rng(3)),
        batches.padded(alone, b, FULL_SCOPE, 1, np.random.default_rng(3)),
    ):
        assert placed.args["query"] is placed.args["key"] is placed.args["value"]
    y, memory = RNG.standard_normal((1, 3, 4)), RNG.standard_normal((1, 2, 4))
    args = {"y": y, "memory": memory, "params": {}, "num_heads": 1, "self_mask": None, "memory_mask": None}
    b = record("decoder_layer").batch
    placed = batches.in_batch(batches.alone(args, b, FULL_SCOPE), b, FULL_SCOPE, 4, 2, np.random.default_rng(4))
    causal = np.tril(np.ones((3, 3), dtype=bool))
    assert placed.args["self_mask"].shape == (4, 3, 3)
    assert not (placed.args["self_mask"] & ~causal).any(), "a self-attention mask that is not causal"
    np.testing.assert_array_equal(placed.args["self_mask"][2], causal)


def test_the_whole_model_is_padded_past_its_lengths() -> None:
    """Tokens appended past each sentence's length (the lengths made explicit) leave the model's logits at the real
    positions unchanged (the oracle's), as §3.2.3 requires."""
    config = types.SimpleNamespace(n_layers=1, d_model=4, d_ff=8, num_heads=2, d_k=2, d_v=2)
    params = ref_model.init_params(config, 7, np.random.default_rng(5))
    args = {"src": np.array([[1, 2, 3]]), "tgt": np.array([[4, 5]]), "params": params, "num_heads": 2}
    args |= {"src_lengths": None, "tgt_lengths": None}
    b = record("transformer_forward").batch
    alone = batches.alone(args, b, FULL_SCOPE)
    padded = batches.padded(alone, b, FULL_SCOPE, 3, np.random.default_rng(6))
    assert padded.args["src"].shape == (1, 6) and list(padded.args["src_lengths"]) == [3]

    def model(a: dict[str, Any]) -> np.ndarray:
        return ref_model.transformer_forward(
            a["src"], a["tgt"], params, 2, src_lengths=a["src_lengths"], tgt_lengths=a["tgt_lengths"]
        )

    np.testing.assert_allclose(model(padded.args)[padded.keep], model(args), rtol=1e-12)


def test_no_arrangement_outside_the_scope() -> None:
    """No batch dimension is added where the scope accepts none, and no padding where it accepts no padding mask
    or no longer sequence."""
    args = _attention_args((), None)
    b = record("scaled_dot_product_attention").batch
    assert batches.alone(args, b, Scope(batch_dims=(0,))) is None
    alone = batches.alone(args, b, FULL_SCOPE)
    assert batches.padded(alone, b, Scope(masks=("none", "causal")), 1, RNG) is None
    assert batches.padded(alone, b, Scope(max_length=5), 1, RNG) is None


def test_ulps_apart() -> None:
    assert ulps_apart(np.array([1.0, np.nan]), np.array([1.0, np.nan]), "float64") == 0.0
    assert ulps_apart(np.array([1.0]), np.array([1.0 + 2**-52]), "float64") == 1.0
    assert ulps_apart(np.array([1.0]), np.array([1.0 + 2**-20]), "float32") == 8.0
    # an infinity against a number is infinitely far, never 0 (the NaN of inf - inf / inf made inf, not dropped)
    assert ulps_apart(np.array([np.inf]), np.array([1.0]), "float64") == np.inf


class _Declared(NumpyImplementation):
    """The NumPy built-in declaring batch invariance, with an FFN that holds it: each position computed alone (a BLAS
    product's blocking, and so its rounding, may change with the number of rows)."""

    name = "numpy-declared-batch-invariant"

    def __init__(self) -> None:
        super().__init__(policies={"batch_invariant": True})

    def feed_forward(self, x, w1, b1, w2, b2):
        rows = x.reshape(-1, x.shape[-1])
        out = [super(_Declared, self).feed_forward(rows[i : i + 1], w1, b1, w2, b2) for i in range(rows.shape[0])]
        return np.concatenate(out, axis=0).reshape(*x.shape[:-1], w2.shape[-1])


class _RowDependent(_Declared):
    """Declares batch invariance; its FFN's last bit depends on the row's index in the batch."""

    def feed_forward(self, x, w1, b1, w2, b2):
        out = super().feed_forward(x, w1, b1, w2, b2)
        rows = out.reshape(-1, out.shape[-1])
        # the planted bug the test must catch: one ulp up on every row but the first, within the FFN's budget
        rows[1:] = np.nextafter(rows[1:], np.inf)
        return rows.reshape(out.shape)


def _ffn_args() -> dict[str, Any]:
    return {
        "x": RNG.standard_normal((1, 3)),
        "w1": RNG.standard_normal((3, 5)),
        "b1": RNG.standard_normal(5),
        "w2": RNG.standard_normal((5, 3)),
        "b2": RNG.standard_normal(3),
    }


def test_a_declared_batch_invariance_is_checked_bit_for_bit() -> None:
    """One ulp of difference in the batch, far within the budget, fails a declared ``batch_invariant`` (and passes
    where it is not declared, with the ulps reported); a correct declaration passes with 0 ulps apart."""
    assert not contract_problems(_Declared())
    place = {"size": 3, "index": 2, "hidden": 1, "seed": 0}
    with pytest.raises(ConformanceFailure, match="batch_invariant.*declared.*differs from the example computed alone"):
        run_check(_RowDependent(), "feed_forward_is_batch_invariant", "float64", **_ffn_args(), **place)
    loose = type("Loose", (_RowDependent,), {"__init__": NumpyImplementation.__init__})()
    stats = run_check(loose, "feed_forward_is_batch_invariant", "float64", **_ffn_args(), **place)
    assert stats.apart["in a batch"] >= 1.0
    assert run_check(_Declared(), "feed_forward_is_batch_invariant", "float64", **_ffn_args(), **place).apart == {
        "in a batch": 0.0
    }


def test_an_invalid_declaration_is_a_contract_problem() -> None:
    """A declared property that is not a bool is named by the contract check (never read as truthy)."""
    impl = NumpyImplementation()
    impl.policies = {**impl.policies, "batch_invariant": "yes"}
    assert any("batch_invariant" in p for p in contract_problems(impl))


class _SignOfZero(_Declared):
    """Declares batch invariance; its FFN returns -0 where the row's result is +0, on every row but the first."""

    def feed_forward(self, x, w1, b1, w2, b2):
        out = super().feed_forward(x, w1, b1, w2, b2)
        rows = out.reshape(-1, out.shape[-1])
        rows[1:] = -rows[1:]  # the planted bug: +0 becomes -0 (every result is 0 on these inputs)
        return rows.reshape(out.shape)


def test_the_bitwise_tier_tells_minus_zero_from_zero() -> None:
    """A zero weight gives a result of +0 everywhere: -0 in the batch is a different bit pattern, so a declared
    ``batch_invariant`` fails, while the value comparison of the first tier finds them 0 ulps apart."""
    args = {**_ffn_args(), "w2": np.zeros((5, 3)), "b2": np.zeros(3)}
    place = {"size": 3, "index": 2, "hidden": 1, "seed": 0}
    with pytest.raises(ConformanceFailure, match="batch_invariant.*declared.*differs from the example computed alone"):
        run_check(_SignOfZero(), "feed_forward_is_batch_invariant", "float64", **args, **place)
    assert run_check(_Declared(), "feed_forward_is_batch_invariant", "float64", **args, **place).apart == {
        "in a batch": 0.0
    }


def test_an_example_that_cannot_be_batched_is_counted_not_checked() -> None:
    """Where the scope accepts no batch dimension to add, the example counts as one not checked, never as a pass."""
    impl = NumpyImplementation()
    impl.scope = {"feed_forward": Scope(batch_dims=(0,))}
    args = {**_ffn_args(), "x": RNG.standard_normal(3)}
    stats = run_check(impl, "feed_forward_is_batch_invariant", "float64", **args, size=2, index=0, hidden=1, seed=0)
    assert stats.unchecked == {NO_BATCH: 1} and stats.checked == 0


class _BeamNudged(NumpyImplementation):
    """Declares batch invariance; its beam search's scores move one ulp when it searches more than two sentences."""

    name = "numpy-beam-nudged"

    def __init__(self) -> None:
        super().__init__(policies={"batch_invariant": True})

    def beam_search(self, *args, **kwargs):
        out = super().beam_search(*args, **kwargs)
        if len(out) <= 2:
            return out
        # the planted bug the test must catch: each score one ulp up, within any budget, so only the bitwise tier fails
        return [(tokens, float(np.nextafter(score, np.inf))) for tokens, score in out]


def _beam_args() -> dict[str, Any]:
    from aiayn.conformance.inputs.fixed import beam_model

    params, src, h = beam_model(0, 1.0)
    return {
        "src": src[:1],
        "params": params,
        "num_heads": h,
        "src_lengths": None,
        "beam": 2,
        "alpha": 0.6,
        "extra": 2,
        "bos": 0,
        "eos": 4,
        "size": 3,
        "index": 1,
        "hidden": 1,
        "seed": 0,
    }


def test_a_declared_batch_invariance_of_beam_search_is_checked_bit_for_bit() -> None:
    """A sentence's score one ulp off in a batch of other sentences fails a declared ``batch_invariant`` (the
    hypothesis and its score must keep their bits); undeclared, it passes with the ulps reported; the NumPy built-in
    searches each sentence alone, so its hypotheses and scores keep their bits (0 ulps)."""
    with pytest.raises(ConformanceFailure, match="batch_invariant.*declared.*beam search returned"):
        run_check(_BeamNudged(), "beam_search_is_batch_invariant", "float64", **_beam_args())
    loose = type("Loose", (_BeamNudged,), {"__init__": NumpyImplementation.__init__})()
    stats = run_check(loose, "beam_search_is_batch_invariant", "float64", **_beam_args())
    assert stats.apart["in a batch"] >= 1.0 and stats.checked >= 3
    stats = run_check(NumpyImplementation(), "beam_search_is_batch_invariant", "float64", **_beam_args())
    assert stats.apart == {"in a batch": 0.0, "padded": 0.0}


def test_cached_decoding_in_a_batch_and_padded() -> None:
    """The NumPy built-in's cached decoder, the sentence alone, in a batch of other sentences of other lengths and
    with hidden source padding: every call within the forward budget (the check passes), the distances reported."""
    a = _beam_args()
    args = {k: a[k] for k in ("src", "params", "num_heads", "src_lengths", "size", "index", "hidden", "seed")}
    tgt = np.array([[1, 2, 3, 5]])
    stats = run_check(
        NumpyImplementation(), "cached_decoding_is_batch_invariant", "float64", **args, tgt=tgt, chunks=[2, 1, 1]
    )
    assert set(stats.apart) == {"in a batch", "padded"} and stats.checked > 0


class _NudgedGradients(NumpyImplementation):
    """The NumPy built-in with the FFN's backward computed one position at a time (a BLAS product's blocking, and so
    its rounding, may change with the number of rows: the built-in's own dx moves by an ulp in a batch), whose
    gradients move one ulp on every second backward call (``nudge`` "rerun", as a kernel with atomic accumulation
    might) or in every batch element but the first (``nudge`` "batch"; None: no bug); it declares ``declares``."""

    name = "numpy-nudged-gradients"

    def __init__(self, nudge: str | None, declares: str | None) -> None:
        super().__init__(policies={declares: True} if declares else None)
        self.nudge, self.calls = nudge, 0

    def vjp(self, equation, args, d_out):
        x, *weights = args
        rows = [
            super(_NudgedGradients, self).vjp(equation, [x[i : i + 1], *weights], d_out[i : i + 1])
            for i in range(x.shape[0])
        ]
        grads = {"x": np.concatenate([r["x"] for r in rows])}
        for name in ("w1", "b1", "w2", "b2"):
            grads[name] = rows[0][name].copy()
            for r in rows[1:]:
                grads[name] += r[name]
        self.calls += 1
        if self.nudge == "rerun" and self.calls % 2 == 0:
            # the planted bug the test must catch: every second run one ulp up, within the budget, so only the
            # declared determinism fails
            return {k: np.nextafter(g, np.inf) for k, g in grads.items()}
        if self.nudge == "batch":
            # the planted bug the test must catch: dx one ulp up past the first batch row, only the bitwise tier sees it
            grads["x"][1:] = np.nextafter(grads["x"][1:], np.inf)
        return grads


def test_declared_determinism_of_gradients_is_checked_bit_for_bit() -> None:
    """Gradients one ulp apart between two runs of the same call fail a declared ``deterministic`` (and pass where it
    is not declared, the spread reported); the NumPy built-in's runs keep their bits."""
    args = {**_ffn_args(), "seed": 0}
    with pytest.raises(ConformanceFailure, match="deterministic.*declared.*run 2 .against run 1"):
        run_check(
            _NudgedGradients("rerun", "deterministic"), "feed_forward_gradients_are_deterministic", "float64", **args
        )
    stats = run_check(_NudgedGradients("rerun", None), "feed_forward_gradients_are_deterministic", "float64", **args)
    assert stats.apart["rerun"] >= 1.0
    declared = NumpyImplementation(policies={"deterministic": True})
    assert run_check(declared, "feed_forward_gradients_are_deterministic", "float64", **args).apart == {"rerun": 0.0}


def test_declared_batch_invariance_of_gradients_is_checked_bit_for_bit() -> None:
    """An input gradient one ulp off in a batch fails a declared ``batch_invariant`` (undeclared: reported); the
    gradients of the weights the batch shares sum over it and are held to the budget only."""
    args = {**_ffn_args(), "size": 3, "index": 1, "hidden": 1, "seed": 0}
    declared = _NudgedGradients(None, "batch_invariant")
    assert run_check(declared, "feed_forward_gradients_are_batch_invariant", "float64", **args).apart == {
        "in a batch": 0.0
    }
    impl = _NudgedGradients("batch", "batch_invariant")
    with pytest.raises(ConformanceFailure, match="batch_invariant.*declared.*the gradient dx"):
        run_check(impl, "feed_forward_gradients_are_batch_invariant", "float64", **args)
    stats = run_check(_NudgedGradients("batch", None), "feed_forward_gradients_are_batch_invariant", "float64", **args)
    assert stats.apart["in a batch"] >= 1.0 and stats.checked > 0
