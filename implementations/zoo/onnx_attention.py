"""The ONNX ``Attention`` (opset 23) and ``Softmax`` (opset 13) operators, run by onnxruntime or by ONNX's own
reference.

Each equation is a small ONNX graph (``onnx.helper``; sizes left unknown, so one model per rank,
dtype and optional input) run on NumPy arrays by ``onnxruntime.InferenceSession`` on the CPU
(``onnxruntime-attention``) or by ``onnx.reference.ReferenceEvaluator``, the spec's Python reference.

Mapping:
    - ``softmax(x, axis)``: one ``Softmax`` node with that ``axis``.
    - ``scaled_dot_product_attention``: one ``Attention`` node on 4-D (B, heads, n, d) inputs; the
      broadcast batch dims are folded into B, heads = 1, and the boolean mask is laid out as
      (B, 1, n_q, n_k). The spec's boolean ``attn_mask`` is the contract's: True = takes part.
    - ``multi_head_attention``: MatMul (+ Add when a bias is given) projections x @ W, one 3-D
      ``Attention`` node with ``q_num_heads = kv_num_heads = h`` (the spec splits the hidden axis
      as (h, d): head i is columns i*d:(i+1)*d, the canonical layout), then MatMul W^O (+ Add b_o).
    - ``scale`` keeps its default 1/sqrt(head_size) = 1/sqrt(d_k): the attribute is a 32-bit
      float, so setting it would round a float64 scale. The spec multiplies Q and K each by
      sqrt(scale). ``is_causal``, ``softcap``, ``qk_matmul_output_mode``: defaults (0).

Dtypes: float64, float32, float16 run on both backends (bfloat16: NumPy has none to hand over).
onnxruntime's CPU ``Attention`` kernel covers float32/float16; for float64 it inlines the op's
ONNX function body (~60 primitive nodes), whose default scale is computed in float32 (Cast of
the head size to FLOAT, Sqrt, Div, Sqrt, then Cast to double): not declared, left to the suite.

Policies: fully masked rows give ``"zeros"``: the spec (onnx 1.23.2, opset 23: "A fully-masked
query row ... produces a zero output row ..., not NaN"); measured with an all-False mask row in
every dtype on both backends. The spec adds the mask as a bias ("its disallowed positions
contribute -inf to the bias"; "at_mask---Add"), so inf or NaN at a masked score gives NaN:
declared. onnxruntime's float32/float16 kernel adds a finite value instead (a masked score of the
dtype's largest finite value gets weight 1/2): undocumented, not declared. Scope: the full
domain. Nothing here is computed with ``reference/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from aiayn.implementations.protocol import DEFAULT_POLICIES, ImplementationBase

__all__ = ["OnnxRuntimeAttention", "OnnxReferenceAttention"]

OPSET = 23
_ADDS = (
    "the spec adds the mask as a bias ('disallowed positions contribute -inf to the bias') instead of replacing masked "
    "scores (§3.2.3), so "
)
_HUGE, _NAN_KEYS = (
    _ADDS + "a masked score that overflows to inf gives inf + (-inf) = NaN",
    _ADDS + "NaN in a masked key gives NaN + (-inf) = NaN",
)
_POISON = "attention_poison_at_masked_positions_changes_nothing"
_ELEM = {
    "float64": TensorProto.DOUBLE,
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bool": TensorProto.BOOL,
}


def _value(name: str, dtype: str, rank: int) -> onnx.ValueInfoProto:
    """A graph input/output of ``dtype`` with ``rank`` dimensions of unknown size."""
    return helper.make_tensor_value_info(name, _ELEM[dtype], [None] * rank)


def _model(nodes: list, inputs: list, output: onnx.ValueInfoProto) -> onnx.ModelProto:
    """A checked one-graph model of the default domain at :data:`OPSET`."""
    opsets = [helper.make_opsetid("", OPSET)]
    graph = helper.make_graph(nodes, "aiayn", inputs, [output])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model)
    return model


class _OnnxAttention(ImplementationBase):
    """The graphs and the array boundary; subclasses say what runs a model (:meth:`_compile`)."""

    device = "cpu"
    dtypes = ("float64", "float32", "float16")
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "fully_masked": "zeros"})

    def __init__(self) -> None:
        self._runs: dict[tuple, Callable[[dict[str, np.ndarray]], np.ndarray]] = {}

    def _compile(self, model: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
        raise NotImplementedError  # a model -> a function of its feeds, giving output Y

    def _run(self, key: tuple, build: Callable[[], onnx.ModelProto], feeds: dict[str, np.ndarray]) -> np.ndarray:
        if key not in self._runs:
            self._runs[key] = self._compile(build())
        return self._runs[key](feeds)

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        return np.array(array, dtype=self.check_dtype(dtype, allow_index=True), copy=True)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, dtype=np.float64 if x.dtype.kind == "f" else x.dtype, copy=True)

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        dt, rank = x.dtype.name, x.ndim
        build = lambda: _model(  # noqa: E731
            [helper.make_node("Softmax", ["X"], ["Y"], axis=axis)], [_value("X", dt, rank)], _value("Y", dt, rank)
        )
        return self._run(("softmax", dt, rank, axis), build, {"X": x})

    def _attention_model(self, dt: str, masked: bool, heads: int | None = None, biases: tuple = ()) -> onnx.ModelProto:
        """Attention on 4-D Q, K, V (``heads`` None), or on 3-D projections of query, key and value with ``heads``
        heads."""
        nodes, inputs = [], []

        def linear(x: str, w: str, b: str, out: str) -> None:  # out = x @ w (+ b)
            nodes.append(helper.make_node("MatMul", [x, w], [out + "_xw" if b in biases else out]))
            inputs.append(_value(w, dt, 2))
            if b in biases:
                nodes.append(helper.make_node("Add", [out + "_xw", b], [out]))
                inputs.append(_value(b, dt, 1))

        if heads is None:
            inputs += [_value(n, dt, 4) for n in "QKV"]  # (B, 1, n, d)
        else:  # (B, n, d_model) @ w_q (+ b_q) -> Q (B, n_q, h * d_k); K, V likewise
            for x, w, b, out in zip(("query", "key", "value"), ("w_q", "w_k", "w_v"), ("b_q", "b_k", "b_v"), "QKV"):
                inputs.append(_value(x, dt, 3))
                linear(x, w, b, out)
        if masked:
            inputs.append(_value("mask", "bool", 4))  # (B, 1, n_q, n_k)
        attrs = {} if heads is None else {"q_num_heads": heads, "kv_num_heads": heads}
        nodes.append(
            helper.make_node(
                "Attention", ["Q", "K", "V"] + ["mask"] * masked, ["Y" if heads is None else "heads"], **attrs
            )
        )
        if heads is not None:  # (B, n_q, h * d_v) @ w_o (+ b_o) -> (B, n_q, d_model)
            linear("heads", "w_o", "b_o", "Y")
        return _model(nodes, inputs, _value("Y", dt, 4 if heads is None else 3))

    @staticmethod
    def _flatten(
        batch: tuple, arrays: dict[str, np.ndarray], mask: np.ndarray | None, n_q: int, n_k: int
    ) -> dict[str, np.ndarray]:
        """Broadcast every array over ``batch`` and fold it into one leading axis B; the mask becomes
        (B, 1, n_q, n_k)."""
        size = math.prod(batch)
        feeds = {k: np.broadcast_to(a, batch + a.shape[-2:]).reshape(size, *a.shape[-2:]) for k, a in arrays.items()}
        if mask is not None:
            feeds["mask"] = np.broadcast_to(mask, batch + (n_q, n_k)).reshape(size, 1, n_q, n_k)
        return feeds

    def scaled_dot_product_attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
    ) -> np.ndarray:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], () if mask is None else mask.shape[:-2])
        n_q, n_k = q.shape[-2], k.shape[-2]
        feeds = self._flatten(batch, {"Q": q, "K": k, "V": v}, mask, n_q, n_k)
        feeds.update({n: feeds[n][:, None] for n in "QKV"})  # (B, n, d) -> (B, heads = 1, n, d)
        dt = q.dtype.name
        y = self._run(("sdpa", dt, mask is not None), lambda: self._attention_model(dt, mask is not None), feeds)
        return y.reshape(*batch, n_q, v.shape[-1])  # (B, 1, n_q, d_v) -> (..., n_q, d_v)

    def multi_head_attention(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        params: Mapping[str, Any],
        num_heads: int,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        batch = np.broadcast_shapes(
            query.shape[:-2], key.shape[:-2], value.shape[:-2], () if mask is None else mask.shape[:-2]
        )
        n_q, n_k = query.shape[-2], key.shape[-2]
        feeds = self._flatten(batch, {"query": query, "key": key, "value": value}, mask, n_q, n_k)
        biases = tuple(b for b in ("b_q", "b_k", "b_v", "b_o") if params.get(b) is not None)
        feeds.update({w: params[w] for w in ("w_q", "w_k", "w_v", "w_o") + biases})
        dt = query.dtype.name
        build = lambda: self._attention_model(dt, mask is not None, num_heads, biases)  # noqa: E731
        y = self._run(("mha", dt, mask is not None, num_heads, biases), build, feeds)
        return y.reshape(*batch, n_q, y.shape[-1])  # (B, n_q, d_model) -> (..., n_q, d_model)


class OnnxRuntimeAttention(_OnnxAttention):
    """The graphs run by ``onnxruntime.InferenceSession`` on the CPU execution provider."""

    name = "onnxruntime-attention"
    # float32/float16 "huge" is not declared: the kernel's finite mask value fails it, not the spec's -inf.
    known_deviations: Mapping[str, str] = MappingProxyType(
        {f"{_POISON}[nan_keys]": _NAN_KEYS, f"{_POISON}[huge]@float64": _HUGE}
    )

    def __init__(self) -> None:
        super().__init__()
        import onnxruntime  # imported here: the reference backend needs only onnx

        self._ort = onnxruntime
        self.version = f"onnxruntime {onnxruntime.__version__} (onnx {onnx.__version__}, opset {OPSET})"

    def _compile(self, model: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
        session = self._ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(["Y"], feeds)[0]


class OnnxReferenceAttention(_OnnxAttention):
    """The graphs run by ``onnx.reference.ReferenceEvaluator``, the spec's Python reference."""

    name = "onnx-reference-attention"
    known_deviations: Mapping[str, str] = MappingProxyType(
        {f"{_POISON}[nan_keys]": _NAN_KEYS, f"{_POISON}[huge]": _HUGE}
    )
    version = f"onnx.reference {onnx.__version__} (opset {OPSET})"

    def _compile(self, model: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return lambda feeds: evaluator.run(["Y"], feeds)[0]
