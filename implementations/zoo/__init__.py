"""The zoo: thin adapters over popular third-party implementations of the paper's equations, installed from PyPI.

Each adapter maps the contract's canonical weights and arguments onto a library's own function or
module and calls it; it never repairs the library's behaviour. What the library documents and
does differently from the paper is declared (``known_deviations``, ``policies``, ``scope``)
with its documentation as the reason; what it does differently without saying so is left for the
suite to find and name (``conformance/diagnoses/forward.py``). Models are built from configurations with
random weights: nothing is downloaded.

:data:`ZOO` lists them, third-party code only (aiayn's own built-ins, the PyTorch ones included,
are in ``implementations/registry.py``; the zoo report shows those that call PyTorch's own modules
from their own reports). ``aiayn zoo`` checks every adapter whose library is installed and writes
``reports/zoo.{md,json,png}``; ``aiayn check NAME`` checks one. The libraries come with the
``zoo`` extra (``pip install 'aiayn[zoo]'``). Importing this package imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["ZOO", "ZooEntry"]


@dataclass(frozen=True)
class ZooEntry:
    """One adapter: the object it names (``module:attr``), the PyPI distribution it wraps, and what of it is checked."""

    target: str
    library: str
    what: str


ZOO: Mapping[str, ZooEntry] = MappingProxyType(
    {
        "marian": ZooEntry(
            "aiayn.implementations.zoo.hf_marian:Marian",
            "transformers",
            "transformers' MarianMTModel: attention, sinusoidal positions, encoder and decoder layers, the whole model",
        ),
        "bert": ZooEntry(
            "aiayn.implementations.zoo.hf_bert:Bert",
            "transformers",
            "transformers' BertModel: self-attention, LayerNorm, encoder layer",
        ),
        "x-transformers": ZooEntry(
            "aiayn.implementations.zoo.x_transformers:XTransformers",
            "x-transformers",
            "x-transformers' Attention, Encoder and Decoder (post-norm, ReLU, as configured for the paper)",
        ),
        "keras-mha": ZooEntry(
            "aiayn.implementations.zoo.keras_mha:KerasMHA", "keras", "keras.layers.MultiHeadAttention (Keras 3)"
        ),
        "jax-sdpa": ZooEntry(
            "aiayn.implementations.zoo.jax_nn:JaxAttention", "jax", "jax.nn.dot_product_attention and jax.nn.softmax"
        ),
        "flax-nnx-mha": ZooEntry("aiayn.implementations.zoo.flax_nnx:FlaxMHA", "flax", "flax.nnx.MultiHeadAttention"),
        "onnxruntime-attention": ZooEntry(
            "aiayn.implementations.zoo.onnx_attention:OnnxRuntimeAttention",
            "onnxruntime",
            "the ONNX Attention operator (opset 23) run by onnxruntime",
        ),
        "torch-nn-transformer": ZooEntry(
            "aiayn.implementations.zoo.torch_transformer:NNTransformer",
            "torch",
            "PyTorch's nn.Transformer: the whole model (post-norm layers, and the LayerNorm it adds after each stack)",
        ),
        "onnx-reference-attention": ZooEntry(
            "aiayn.implementations.zoo.onnx_attention:OnnxReferenceAttention",
            "onnx",
            "the ONNX Attention operator (opset 23) run by onnx.reference",
        ),
        "optax-adam": ZooEntry(
            "aiayn.implementations.zoo.optax_adam:OptaxAdam", "optax", "optax.adam: one step of Adam (§5.3)"
        ),
        "flax-nnx-dropout": ZooEntry(
            "aiayn.implementations.zoo.flax_nnx:FlaxDropout", "flax", "flax.nnx.Dropout in training mode (§5.4)"
        ),
        "keras-adam": ZooEntry(
            "aiayn.implementations.zoo.keras_training:KerasAdam",
            "keras",
            "keras.optimizers.Adam (one step, §5.3) and keras.layers.Dropout in training mode (§5.4), Keras 3",
        ),
    }
)
