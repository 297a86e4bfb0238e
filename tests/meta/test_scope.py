"""Declared scope: an implementation is checked inside the sub-domain it declares, and says so.

- an implementation restricted to self-attention, the causal mask and eps = 1e-5 (what a GPT
  block supports), which raises on anything else, passes within its declared scope: no drawn input
  falls outside it, the tests that need more are "out of scope", and its report rows say
  "pass within scope" with the scope;
- ``Unsupported`` raised by an implementation is counted, never a failure; a row whose examples
  were mostly unsupported is inconclusive;
- code without bias terms and with one memory tensor for key and value (``Scope.no_bias``,
  ``shared_key_value``) passes within that scope, its fixed cases with biases out of scope;
- an invalid scope is a contract problem.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.implementations.protocol import Scope, Unsupported, contract_problems

TESTS = Path(__file__).resolve().parent
GPT_SCOPE = Scope(self_attention_only=True, masks=("causal",), layer_norm_eps=1e-5, batch_dims=(1,))


class GPTLike(NumpyImplementation):
    """Causal self-attention and LayerNorm with eps fixed at 1e-5, as a GPT block: anything else raises ValueError."""

    name = "gpt-like"
    scope = {"scaled_dot_product_attention": GPT_SCOPE, "multi_head_attention": GPT_SCOPE, "layer_norm": GPT_SCOPE}

    def provides(self) -> frozenset[str]:
        return frozenset({"scaled_dot_product_attention", "multi_head_attention", "layer_norm"})

    @staticmethod
    def _causal_only(n_q: int, n_k: int, mask) -> None:  # type: ignore[no-untyped-def]
        causal = np.tril(np.ones((n_q, n_k), dtype=bool))
        if (
            n_q != n_k
            or mask is None
            or not np.array_equal(
                np.broadcast_to(mask, (*np.shape(mask)[:-2], n_q, n_k)),
                np.broadcast_to(causal, (*np.shape(mask)[:-2], n_q, n_k)),
            )
        ):
            raise ValueError("this attention is causal self-attention only")

    def scaled_dot_product_attention(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
        if q.ndim != 3:
            raise ValueError(f"expected (B, n, d), got {q.shape}")
        self._causal_only(q.shape[-2], k.shape[-2], mask)
        return super().scaled_dot_product_attention(q, k, v, mask)

    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):  # type: ignore[no-untyped-def]
        if not (query is key is value) or query.ndim != 3:
            raise ValueError("self-attention on (B, n, d) only")
        self._causal_only(query.shape[-2], key.shape[-2], mask)
        return NumpyImplementation().multi_head_attention(query, key, value, params, num_heads, mask)

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        if eps != 1e-5:
            raise ValueError(f"eps is fixed at 1e-5, got {eps}")
        return super().layer_norm(x, gain, bias, eps)


class MostlyUnsupported(NumpyImplementation):
    """Softmax that refuses every input of more than one element: ``Unsupported`` (the drawn inputs are single
    elements rarely, whatever the seed)."""

    name = "mostly-unsupported"

    def provides(self) -> frozenset[str]:
        return frozenset({"softmax"})

    def softmax(self, x, axis=-1):  # type: ignore[no-untyped-def]
        if x.size > 1:
            raise Unsupported("one element at a time")
        return super().softmax(x, axis)


BIASLESS_SCOPE = Scope(no_bias=("attention", "layer_norm", "ffn"), shared_key_value=True)


class Biasless(NumpyImplementation):
    """Attention projections, LayerNorm and FFN without bias terms, and one memory tensor for key and value
    (x-transformers, Hugging Face cross-attention): anything else raises ValueError."""

    name = "biasless"
    scope = {
        equation: BIASLESS_SCOPE
        for equation in ("multi_head_attention", "layer_norm", "feed_forward", "encoder_layer", "decoder_layer")
    }

    def provides(self) -> frozenset[str]:
        return frozenset(self.scope)

    @staticmethod
    def _no_bias(*biases) -> None:  # type: ignore[no-untyped-def]
        if any(b is not None and np.any(b != 0) for b in biases):
            raise ValueError("this code has no bias terms")

    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):  # type: ignore[no-untyped-def]
        self._no_bias(*(params.get(n) for n in ("b_q", "b_k", "b_v", "b_o")))
        if key is not value:
            raise ValueError("one memory tensor for key and value")
        return super().multi_head_attention(query, key, value, params, num_heads, mask)

    def layer_norm(self, x, gain, bias, eps):  # type: ignore[no-untyped-def]
        self._no_bias(bias)
        return super().layer_norm(x, gain, bias, eps)

    def feed_forward(self, x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
        self._no_bias(b1, b2)
        return super().feed_forward(x, w1, b1, w2, b2)

    def encoder_layer(self, x, params, num_heads, mask=None):  # type: ignore[no-untyped-def]
        self._no_bias(*(g.get(n) for g in params.values() for n in ("b_q", "b_k", "b_v", "b_o", "bias", "b1", "b2")))
        return super().encoder_layer(x, params, num_heads, mask)

    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):  # type: ignore[no-untyped-def]
        self._no_bias(*(g.get(n) for g in params.values() for n in ("b_q", "b_k", "b_v", "b_o", "bias", "b1", "b2")))
        return super().decoder_layer(y, memory, params, num_heads, self_mask, memory_mask)


def _suite(tmp_path: Path, spec: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        "AIAYN_FAILURES": str(tmp_path / "failures"),
        "AIAYN_PROFILE": "ci",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "aiayn.conformance",
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=short",
            f"--impl={spec}",
            f"--aiayn-report={tmp_path / 'r'}",
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    reports = list((tmp_path / "r").glob("*.json"))
    return proc, json.loads(reports[0].read_text()) if reports else {}


def test_a_scoped_implementation_passes_within_its_scope_and_says_so(tmp_path: Path) -> None:
    proc, data = _suite(tmp_path, "test_scope:GPTLike")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-4000:]}"
    rows = {(r["equation"], r["dtype"]): r for r in data["rows"] if r["direction"] == "forward"}
    for equation in ("scaled_dot_product_attention", "multi_head_attention", "layer_norm"):
        for dtype in ("float64", "float32"):
            row = rows[(equation, dtype)]
            assert row["status"] == "pass within scope", row
            assert row["scope"] == GPT_SCOPE.describe() and "self-attention only" in row["scope"]
            assert row["checked"] > 0
    assert rows[("scaled_dot_product_attention", "float64")]["out_of_scope_tests"], (
        "tests needing padding or random masks must be out of scope"
    )
    assert data["verdict"] == "PASS WITHIN DECLARED SCOPE"
    md = (tmp_path / "r" / "conformance-gpt-like.md").read_text()
    assert "pass within scope" in md and "self-attention only; masks causal only; eps = 1e-05" in md


def test_unsupported_is_counted_and_mostly_unsupported_is_inconclusive(tmp_path: Path) -> None:
    proc, data = _suite(tmp_path, "test_scope:MostlyUnsupported", "-k", "test_softmax and not fixed")
    row = next(r for r in data["rows"] if r["equation"] == "softmax" and r["dtype"] == "float64")
    assert row["unsupported"] > row["examples"] / 2 and row["status"] == "inconclusive", row
    assert not row["failed_tests"] and "one element at a time" in row["unsupported_why"]
    assert proc.returncode == 1 and "INCONCLUSIVE" in proc.stdout


def test_an_invalid_scope_is_a_contract_problem() -> None:
    class Bad(NumpyImplementation):
        scope = {"softmax": Scope(masks=("sideways",)), "nonsense": Scope(), "layer_norm": Scope(dtypes=("float16",))}

    problems = " ".join(contract_problems(Bad()))
    assert (
        "sideways" in problems
        and "'nonsense' is not one of EQUATIONS" in problems
        and "not all among the declared dtypes" in problems
    )


def test_code_without_biases_and_with_one_memory_tensor_passes_within_its_scope(tmp_path: Path) -> None:
    proc, data = _suite(tmp_path, "test_scope:Biasless")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-4000:]}"
    for row in (r for r in data["rows"] if r["equation"] in Biasless.scope):
        assert row["status"] == "pass within scope" and row["checked"] > 0 and not row["unsupported"], row
        assert row["scope"] == "no attention, layer norm, ffn biases; key = value"
    fixed = {t for r in data["rows"] if r["equation"] == "layer_norm" for t in r["out_of_scope_tests"]}
    assert any("fixed" in t for t in fixed), "the fixed LayerNorm cases carry biases: out of this scope"


def test_a_rows_scope_names_only_the_notes_that_concern_it() -> None:
    """A note on target padding (forward and gradients) is not printed in the decode row, which never meets it."""
    scope = Scope(note="target padding unsupported", note_directions=("forward", "backward"))
    assert scope.describe("forward") == scope.describe("backward") == scope.describe() == "target padding unsupported"
    assert scope.describe("decode") == "full domain"
    assert Scope(note="x").describe("decode") == "x"  # a note concerns every row unless said otherwise
    assert any("note_directions" in p for p in Scope(note_directions=("beam",)).problems())
