"""Every built-in implementation honours the plug-in contract (implementations/protocol.py).

A test per built-in that it honours the contract — names, dtypes, devices,
declared equations and policies, the from/to NumPy round trip, inputs not mutated, and results
of the declared shape and dtype. Agreement with the oracle is tested elsewhere
(tests/test_numpy_impl.py here, the conformance suite for everything).

The dtype of a result is checked without knowing the native array type: a result "in float32"
must hold only float32 values, i.e. rounding it to float32 again (through the implementation's
own ``from_numpy``) changes nothing. A float64 computation rounded nowhere would fail this for
practically every input.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from aiayn.conformance.run.declarations import declaration_problems
from aiayn.conformance.run.plugin import deviation_names
from aiayn.implementations import protocol, registry
from aiayn.implementations.protocol import DTYPES, EQUATIONS, POLICY_CHOICES

TORCH_MISSING = importlib.util.find_spec("torch") is None


@pytest.fixture(scope="module", params=list(registry.BUILTINS))
def impl(request: pytest.FixtureRequest) -> Any:
    name = request.param
    if name.startswith("torch") and TORCH_MISSING:
        pytest.skip(f"built-in {name!r} needs torch, which is not installed (pip install '.[torch]')")
    return registry.load(name)


# --------------------------------------------------------------------------------------------
# declarations


def test_declarations_are_valid(impl: Any) -> None:
    """Every declaration holds, ``known_deviations`` included: each names a test of the suite."""
    problems = protocol.contract_problems(impl) + declaration_problems(impl, deviation_names())
    assert problems == [], f"{impl.name}: {problems}"
    assert isinstance(impl, protocol.Implementation)
    assert impl.name in registry.BUILTINS
    assert impl.version.strip(), f"{impl.name}: empty version"
    assert re.fullmatch(r"cpu|cuda(:\d+)?", impl.device), (
        f"{impl.name}: device {impl.device!r} is not 'cpu' or 'cuda[:N]'"
    )
    assert impl.dtypes and set(impl.dtypes) <= set(DTYPES), (
        f"{impl.name}: dtypes {impl.dtypes} not a subset of {DTYPES}"
    )


def test_provided_equations_are_known_and_callable(impl: Any) -> None:
    declared = impl.provides()
    assert isinstance(declared, frozenset), (
        f"{impl.name}.provides() returned {type(declared).__name__}, expected frozenset"
    )
    assert declared <= set(EQUATIONS), f"{impl.name} declares unknown equations {sorted(declared - set(EQUATIONS))}"
    missing = sorted(n for n in declared if not callable(getattr(impl, n, None)))
    assert not missing, f"{impl.name} declares {missing} but has no such methods"
    assert protocol.provided_equations(impl) == declared
    assert declared, f"{impl.name} provides no equation at all"


def test_policies_are_declared_with_allowed_values(impl: Any) -> None:
    policies = impl.policies
    assert set(policies) >= set(protocol.DEFAULT_POLICIES), (
        f"{impl.name}: policy keys {sorted(policies)} miss some of {sorted(protocol.DEFAULT_POLICIES)}"
    )
    for key, allowed in POLICY_CHOICES.items():
        if key not in protocol.DEFAULT_POLICIES and key not in policies:
            continue  # an optional policy (Adam's eps placement) left at its default
        assert policies[key] in allowed, f"{impl.name}: policies[{key!r}] = {policies[key]!r}, allowed {allowed}"
    eps = policies["layer_norm_eps"]
    assert isinstance(eps, float) and eps > 0, f"{impl.name}: layer_norm_eps = {eps!r}, expected a positive float"


# --------------------------------------------------------------------------------------------
# the boundary: from_numpy / to_numpy

# Values that round differently in each precision, plus exactly representable ones, and two
# double-rounding traps. 1 + 2**-8 + 2**-30, rounded straight from float64 to bfloat16 (8-bit
# significand, halfway point 1 + 2**-8), lies just above halfway and goes up to 1 + 2**-7;
# rounded first to float32 it becomes exactly 1 + 2**-8, a tie that goes to the even 1.0.
# 1 + 2**-11 + 2**-40 is the same trap for float16 (11-bit significand). The contract asks for
# one rounding, from float64 (see aiayn.implementations.protocol.DTYPES).
ROUND_TRIP_VALUES = np.array(
    [
        [0.0, -0.0, 1.0, -2.5, 1.0 / 3.0, -2.0 / 3.0, 1e-3, 123.456],
        [0.1, 3.14159265358979, -1e4, 65000.0, 1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, 2**-10, -7.0],
    ]
)


def _round_to_nearest_even(x: np.ndarray, significand_bits: int) -> np.ndarray:
    """Round float64 ``x`` to ``significand_bits`` bits (normal range), ties to even, exactly.

    frexp gives x = m * 2^e with 0.5 <= |m| < 1; m * 2^p is exact in float64 (p < 53) and rint
    rounds half to even, so this is the correctly rounded value (bfloat16: p = 8).
    """
    mantissa, exponent = np.frexp(x)
    return np.ldexp(np.rint(np.ldexp(mantissa, significand_bits)), exponent - significand_bits)


def _expected_round_trip(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return _round_to_nearest_even(x, 8)
    return x.astype(dtype).astype(np.float64)  # NumPy's own correctly rounded cast


def test_float_round_trip_rounds_like_numpy(impl: Any) -> None:
    for dtype in impl.dtypes:
        back = impl.to_numpy(impl.from_numpy(ROUND_TRIP_VALUES, dtype))
        expected = _expected_round_trip(ROUND_TRIP_VALUES, dtype)
        assert isinstance(back, np.ndarray) and back.dtype == np.float64, (
            f"{impl.name}/{dtype}: to_numpy gave {type(back)} {getattr(back, 'dtype', '')}, expected float64 ndarray"
        )
        assert back.shape == ROUND_TRIP_VALUES.shape
        bad = np.flatnonzero(back != expected)
        assert bad.size == 0, (
            f"{impl.name}/{dtype}: round trip of {ROUND_TRIP_VALUES.ravel()[bad]} gave {back.ravel()[bad]}, "
            f"expected the round-to-nearest-even values {expected.ravel()[bad]}"
        )
        assert np.array_equal(np.signbit(back), np.signbit(expected)), f"{impl.name}/{dtype}: the sign of -0.0 was lost"


def test_float64_round_trip_is_exact(impl: Any) -> None:
    if "float64" not in impl.dtypes:
        pytest.skip(f"{impl.name} does not declare float64")
    x = np.random.default_rng(3).standard_normal((3, 5))
    assert np.array_equal(impl.to_numpy(impl.from_numpy(x, "float64")), x)


def test_index_and_mask_round_trips_are_exact(impl: Any) -> None:
    ids = np.array([[0, 5, 2**40], [-1, 7, 36999]], dtype=np.int64)
    back = impl.to_numpy(impl.from_numpy(ids, "int64"))
    assert back.dtype == np.int64 and np.array_equal(back, ids), f"{impl.name}: int64 round trip gave {back!r}"
    mask = np.array([[True, False, True], [False, False, True]])
    back = impl.to_numpy(impl.from_numpy(mask, "bool"))
    assert back.dtype == np.bool_ and np.array_equal(back, mask), f"{impl.name}: bool round trip gave {back!r}"


def test_from_numpy_copies_and_to_numpy_returns_a_copy(impl: Any) -> None:
    source = np.arange(6.0).reshape(2, 3)
    native = impl.from_numpy(source, impl.dtypes[0])
    source[0, 0] = 99.0  # must not reach the native array
    first = impl.to_numpy(native)
    first[0, 1] = -99.0  # must not reach the native array either
    second = impl.to_numpy(native)
    assert np.array_equal(second, np.arange(6.0).reshape(2, 3)), (
        f"{impl.name}: native array changed through a shared buffer: {second}"
    )


def test_from_numpy_rejects_an_undeclared_dtype(impl: Any) -> None:
    for dtype in ("float8", "complex64") + tuple(d for d in DTYPES if d not in impl.dtypes):
        with pytest.raises(ValueError, match=re.escape(dtype)):
            impl.from_numpy(np.ones(2), dtype)


# --------------------------------------------------------------------------------------------
# every provided equation: output shape and dtype, inputs untouched

D_MODEL, HEADS, D_FF, VOCAB = 8, 2, 16, 11


def _layer_params(rng: np.random.Generator, decoder: bool) -> dict[str, Any]:
    """Canonical-layout weights of one layer (values only need to be generic here)."""

    def mha() -> dict[str, np.ndarray]:
        w = {f"w_{n}": rng.standard_normal((D_MODEL, D_MODEL)) / np.sqrt(D_MODEL) for n in "qkvo"}
        return w | {f"b_{n}": 0.1 * rng.standard_normal(D_MODEL) for n in "qkvo"}

    def norm() -> dict[str, np.ndarray]:
        return {"gain": 1 + 0.1 * rng.standard_normal(D_MODEL), "bias": 0.1 * rng.standard_normal(D_MODEL)}

    ffn = {
        "w1": rng.standard_normal((D_MODEL, D_FF)) / np.sqrt(D_MODEL),
        "b1": 0.1 * rng.standard_normal(D_FF),
        "w2": rng.standard_normal((D_FF, D_MODEL)) / np.sqrt(D_FF),
        "b2": 0.1 * rng.standard_normal(D_MODEL),
    }
    if decoder:
        return {"self_attn": mha(), "norm1": norm(), "cross_attn": mha(), "norm2": norm(), "ffn": ffn, "norm3": norm()}
    return {"self_attn": mha(), "norm1": norm(), "ffn": ffn, "norm2": norm()}


def _equation_cases(rng: np.random.Generator) -> dict[str, tuple[tuple, Any]]:
    """equation -> (NumPy arguments, expected result shape); None shape = a Python float result, a list of shapes a
    tuple of arrays (Adam's param, m and v).

    Float arrays become the dtype under test, int arrays "int64", bool arrays "bool"; other
    values (ints, floats, strings) pass through unchanged.
    """
    normal = rng.standard_normal
    ids = lambda *shape: rng.integers(0, VOCAB, size=shape)  # noqa: E731
    q, k, v = normal((2, 3, 4)), normal((2, 5, 4)), normal((2, 5, 6))
    causal_ish = np.tri(3, 5, k=2, dtype=bool)  # every query sees at least 3 keys
    return {
        "softmax": ((normal((2, 3, 5)), -1), (2, 3, 5)),
        "scaled_dot_product_attention": ((q, k, v, causal_ish), (2, 3, 6)),
        "multi_head_attention": (
            (
                normal((2, 3, D_MODEL)),
                normal((2, 5, D_MODEL)),
                normal((2, 5, D_MODEL)),
                _layer_params(rng, False)["self_attn"],
                HEADS,
                causal_ish,
            ),
            (2, 3, D_MODEL),
        ),
        "positional_encoding": ((7, D_MODEL, "<dtype>"), (7, D_MODEL)),
        "layer_norm": (
            (normal((2, 3, D_MODEL)), 1 + 0.1 * normal(D_MODEL), 0.1 * normal(D_MODEL), 1e-6),
            (2, 3, D_MODEL),
        ),
        "feed_forward": ((normal((2, 3, D_MODEL)), *_layer_params(rng, False)["ffn"].values()), (2, 3, D_MODEL)),
        "lrate": ((100, 512, 4000), None),
        "adam_step": (
            (normal((2, 3)), normal((2, 3)), normal((2, 3)), normal((2, 3)) ** 2, 7, 1e-3, [0.9, 0.98], 1e-9),
            [(2, 3)] * 3,
        ),
        "label_smoothing": ((ids(2, 5), VOCAB, 0.1), (2, 5, VOCAB)),
        "smoothed_cross_entropy": ((normal((2, 5, VOCAB)), ids(2, 5), 0.1), (2, 5)),
        "dropout": ((normal((2, 3)), 0.1, 7), [(2, 3), (2, 3)]),
        "average_checkpoints": (({s: {"w": normal((2, 3)), "b": normal(3)} for s in (300, 20, 1000)}, 2), {}),
        "encoder_layer": (
            (normal((2, 5, D_MODEL)), _layer_params(rng, False), HEADS, np.arange(5) < np.array([[[5]], [[3]]])),
            (2, 5, D_MODEL),
        ),
        "decoder_layer": (
            (
                normal((2, 4, D_MODEL)),
                normal((2, 5, D_MODEL)),
                _layer_params(rng, True),
                HEADS,
                None,
                np.arange(5) < np.array([[[5]], [[3]]]),
            ),
            (2, 4, D_MODEL),
        ),
        "encoder_layer_training": (
            (
                normal((2, 5, D_MODEL)),
                _layer_params(rng, False),
                HEADS,
                0.1,
                7,
                np.arange(5) < np.array([[[5]], [[3]]]),
            ),
            [(2, 5, D_MODEL)] * 3,
        ),
        "decoder_layer_training": (
            (
                normal((2, 4, D_MODEL)),
                normal((2, 5, D_MODEL)),
                _layer_params(rng, True),
                HEADS,
                0.1,
                7,
                None,
                np.arange(5) < np.array([[[5]], [[3]]]),
            ),
            [(2, 4, D_MODEL)] * 4,
        ),
        "transformer_forward": (
            (
                ids(2, 5),
                ids(2, 4),
                {
                    "embedding": normal((VOCAB, D_MODEL)) / np.sqrt(D_MODEL),
                    "encoder": [_layer_params(rng, False)],
                    "decoder": [_layer_params(rng, True)],
                },
                HEADS,
                np.array([5, 3]),
                np.array([4, 2]),
            ),
            (2, 4, VOCAB),
        ),
        "transformer_forward_training": (
            (
                ids(2, 5),
                ids(2, 4),
                {
                    "embedding": normal((VOCAB, D_MODEL)) / np.sqrt(D_MODEL),
                    "encoder": [_layer_params(rng, False)],
                    "decoder": [_layer_params(rng, True)],
                },
                HEADS,
                0.1,
                7,
                np.array([5, 3]),
                np.array([4, 2]),
            ),
            {"logits": (2, 4, VOCAB)}
            | {p: (2, 5, D_MODEL) for p in ("src_embedding", "encoder.0.self_attn", "encoder.0.ffn")}
            | {
                p: (2, 4, D_MODEL)
                for p in ("tgt_embedding", "decoder.0.self_attn", "decoder.0.cross_attn", "decoder.0.ffn")
            },
        ),
    }


def _to_native(impl: Any, value: Any, dtype: str) -> Any:
    if isinstance(value, np.ndarray):
        kind = {"f": dtype, "i": "int64", "b": "bool"}[value.dtype.kind]
        return impl.from_numpy(value, kind)
    if isinstance(value, Mapping):
        return {key: _to_native(impl, item, dtype) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_native(impl, item, dtype) for item in value]
    return dtype if value == "<dtype>" else value


def _snapshot(impl: Any, native: Any, original: Any) -> Any:
    """NumPy copies of every native array in ``native`` (same nesting as ``original``)."""
    if isinstance(original, np.ndarray):
        return impl.to_numpy(native)
    if isinstance(original, Mapping):
        return {key: _snapshot(impl, native[key], original[key]) for key in original}
    if isinstance(original, list):
        return [_snapshot(impl, n, o) for n, o in zip(native, original)]
    return None


def _changed_leaves(before: Any, after: Any, path: str = "") -> list[str]:
    if isinstance(before, np.ndarray):
        return [] if np.array_equal(before, after, equal_nan=before.dtype.kind == "f") else [path or "<arg>"]
    if isinstance(before, dict):
        return [p for key in before for p in _changed_leaves(before[key], after[key], f"{path}[{key!r}]")]
    if isinstance(before, list):
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in _changed_leaves(b, a, f"{path}[{i}]")]
    return []


def _on_dtype_grid(impl: Any, result: np.ndarray, dtype: str) -> bool:
    """True if every value of ``result`` is representable in ``dtype`` (NaN counts as representable)."""
    again = impl.to_numpy(impl.from_numpy(result, dtype))
    return bool(np.array_equal(again, result, equal_nan=True))


def _result_dtype(equation: str, impl: Any, dtype: str) -> str:
    return impl.dtypes[0] if equation == "label_smoothing" else dtype


@pytest.mark.parametrize("equation", EQUATIONS)
def test_equation_keeps_inputs_and_returns_the_declared_shape_and_dtype(impl: Any, equation: str) -> None:
    if equation not in protocol.provided_equations(impl):
        pytest.skip(f"{impl.name} does not provide {equation}")
    method: Callable[..., Any] = getattr(impl, equation)
    for dtype in impl.dtypes:
        args, shape = _equation_cases(np.random.default_rng(11))[equation]
        native = [_to_native(impl, a, dtype) for a in args]
        before = [_snapshot(impl, n, a) for n, a in zip(native, args)]
        out = method(*native)
        after = [_snapshot(impl, n, a) for n, a in zip(native, args)]
        changed = [p for i, (b, a) in enumerate(zip(before, after)) for p in _changed_leaves(b, a, f"arg{i}")]
        assert not changed, f"{impl.name}.{equation} ({dtype}) modified its input(s) {changed}"
        if shape is None:
            assert isinstance(out, float), (
                f"{impl.name}.{equation} returned {type(out).__name__}, expected a Python float"
            )
            continue
        if isinstance(shape, dict) and shape:  # the whole model in training mode: its logits and masks by place
            assert isinstance(out, Mapping) and set(out) == set(shape), (
                f"{impl.name}.{equation} returned {type(out).__name__}, expected a mapping of {sorted(shape)}"
            )
            for name, part in out.items():
                result = impl.to_numpy(part)
                on_grid = result.dtype == np.bool_ if name != "logits" else _on_dtype_grid(impl, result, dtype)
                assert result.shape == shape[name] and on_grid, (
                    f"{impl.name}.{equation} ({dtype}) returned {name} of shape {result.shape} or not a "
                    f"{'bool' if name != 'logits' else dtype} array"
                )
            continue
        if isinstance(shape, dict):  # averaged checkpoints: the parameters' names and shapes
            names = set(args[0][next(iter(args[0]))])
            assert isinstance(out, Mapping) and set(out) == names, (
                f"{impl.name}.{equation} returned {type(out).__name__}, expected a mapping of {sorted(names)}"
            )
            for name, part in out.items():
                result = impl.to_numpy(part)
                assert result.shape == np.shape(args[0][300][name]) and _on_dtype_grid(impl, result, dtype), (
                    f"{impl.name}.{equation} ({dtype}) returned {name} of shape {result.shape} or not in {dtype}"
                )
            continue
        if isinstance(shape, list):
            assert isinstance(out, tuple) and len(out) == len(shape), (
                f"{impl.name}.{equation} returned {type(out).__name__}, expected a tuple of {len(shape)} arrays"
            )
            for part, part_shape in zip(out, shape):
                result = impl.to_numpy(part)
                on_grid = result.dtype == np.bool_ or _on_dtype_grid(impl, result, dtype)  # dropout's mask: bool
                assert result.shape == part_shape and on_grid, (
                    f"{impl.name}.{equation} ({dtype}) returned shape {result.shape} or values not in {dtype}"
                )
            continue
        result = impl.to_numpy(out)
        assert result.shape == shape, (
            f"{impl.name}.{equation} ({dtype}) returned shape {result.shape}, expected {shape}"
        )
        assert np.all(np.isfinite(result)), (
            f"{impl.name}.{equation} ({dtype}) returned non-finite values on finite, unmasked-row inputs"
        )
        expected_dtype = _result_dtype(equation, impl, dtype)
        assert _on_dtype_grid(impl, result, expected_dtype), (
            f"{impl.name}.{equation} ({dtype}) returned values not representable in {expected_dtype}: "
            "the result was not computed (or not returned) in the declared dtype"
        )


def test_the_equation_cases_cover_every_equation() -> None:
    assert set(_equation_cases(np.random.default_rng(0))) == set(EQUATIONS)


def test_implementation_base_provides_what_a_subclass_defines() -> None:
    class Partial(protocol.ImplementationBase):
        name, version, dtypes = "partial", "0", ("float32",)

        def softmax(self, x: Any, axis: int = -1) -> Any:
            return x

    impl = Partial()
    assert impl.provides() == {"softmax"}
    assert impl.policies == protocol.DEFAULT_POLICIES
    assert protocol.contract_problems(impl) == []
    assert impl.check_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="supports \\('float32',\\), got 'float64'"):
        impl.check_dtype("float64")
    assert impl.check_dtype("int64", allow_index=True) == "int64"
