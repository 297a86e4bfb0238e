"""Counting the Transformer: configurations, parameters, per-layer operations, training cost.

Paper: Table 1 (per-layer complexity, sequential operations, maximum path length) and §4 (why
self-attention); Table 3 (the base and big models and every variation, with printed parameter
counts); Table 2 and §6.1 with footnote 5 (training cost = time x GPUs x sustained rate).

Everything here is integer or closed-form arithmetic: there is no fast/exact split because
nothing is rounded (parameter and multiply-add counts are Python ints; ``training_flops`` is one
product of given numbers).

Choices (each pinned by a test in ``tests/test_counts.py``):
- Parameters counted: every weight matrix; biases of the Q/K/V/O projections and of both FFN
  linear maps (switch ``biases``); LayerNorm gain and bias after every sub-layer, post-norm, so
  2 per encoder layer and 3 per decoder layer and no final LayerNorm (switch ``layer_norm``).
  The tied pre-softmax projection has no bias (the paper shares the matrix, §3.4).
- Embeddings (§3.4): "shared" = one (vocab, d_model) matrix for source input, target input and
  pre-softmax (the paper's); "separate_output" = shared inputs, own pre-softmax matrix;
  "separate_all" = three matrices.
- Learned positional embeddings (Table 3 row E): one (max_positions, d_model) table for the
  encoder and one for the decoder. The paper gives no length, so ``max_positions`` is required
  for such a config; it is ignored for sinusoids (which have no parameters).
- Operation counts use the conventions in :func:`layer_operations`.

Printed Table 3 parameter counts vs ours (vocab 37000, shared, biases, LayerNorm): base
63,082,496 (printed 65M), big 214,245,376 (printed 213M). No switch combination gives 65M at
37000 tokens: base rounds to 65M only with a shared vocabulary of 39,769-41,721 tokens. Every
printed count except big's agrees (to the printed million) with this structure and one shared
vocabulary of 40,932-41,160 tokens; big's needs 35,296-36,272, so no single vocabulary
reproduces all of them. ``tests/test_counts.py`` pins these facts.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from aiayn.reference._checks import choice, positive_int

# ---------------------------------------------------------------------------------------------
# Configurations (Table 3)
# ---------------------------------------------------------------------------------------------

_POSITIONAL = ("sinusoid", "learned")
_EMBEDDINGS = ("shared", "separate_output", "separate_all")


def _check_probability(name: str, value: Any) -> float:
    """Return ``value`` as a float in [0, 1), or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name}: expected a real number in [0, 1), got {value}")
    return float(value)


def _default_head_width(name: str, d_model: int, num_heads: int) -> int:
    """d_model / h, the paper's default for d_k and d_v (§3.2.2); raise if h does not divide it."""
    if d_model % num_heads:
        raise ValueError(
            f"{name}: omitted, so it defaults to d_model / num_heads, but num_heads={num_heads} "
            f"does not divide d_model={d_model}; give {name} explicitly"
        )
    return d_model // num_heads


@dataclass(frozen=True)
class TransformerConfig:
    """One Transformer configuration: a column set of Table 3.

    Paper: Table 3 columns N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, train steps, and row (E).
    ``d_k`` and ``d_v`` default to d_model / h (§3.2.2: "d_k = d_v = d_model/h = 64"); giving them
    explicitly is how Table 3 row (B) changes d_k alone.
    """

    n_layers: int = 6  # N: identical layers per stack (§3.1; Table 3 column N)
    d_model: int = 512  # model width (§3.1; Table 3 column d_model)
    d_ff: int = 2048  # inner FFN width (§3.3; Table 3 column d_ff)
    num_heads: int = 8  # h, parallel attention heads (§3.2.2; Table 3 column h)
    d_k: int | None = None  # query/key width per head (§3.2.2; Table 3 column d_k); None -> d_model/h
    d_v: int | None = None  # value width per head (§3.2.2; Table 3 column d_v); None -> d_model/h
    p_drop: float = 0.1  # residual dropout rate (§5.4 "Residual Dropout"; Table 3 column P_drop)
    eps_ls: float = 0.1  # label smoothing epsilon (§5.4 "Label Smoothing"; Table 3 column eps_ls)
    train_steps: int = 100_000  # training steps (§5.2; Table 3 column "train steps")
    positional: str = "sinusoid"  # "sinusoid" (§3.5) or "learned" (§3.5 and Table 3 row (E))

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "d_ff", "num_heads", "train_steps"):
            positive_int(name, getattr(self, name))
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, _default_head_width(name, self.d_model, self.num_heads))
            else:
                positive_int(name, value)
        object.__setattr__(self, "p_drop", _check_probability("p_drop", self.p_drop))
        object.__setattr__(self, "eps_ls", _check_probability("eps_ls", self.eps_ls))
        choice("positional", self.positional, _POSITIONAL)


# The base model: Table 3 row "base" (also §3.1: N = 6, d_model = 512; §3.3: d_ff = 2048;
# §3.2.2: h = 8, d_k = d_v = 64; §5.4: P_drop = 0.1, eps_ls = 0.1; §5.2: 100,000 steps).
BASE = TransformerConfig()

# The big model: Table 3 row "big" (N 6, d_model 1024, d_ff 4096, h 16, P_drop 0.3, 300K steps;
# d_k, d_v blank in the table, so d_model/h = 64). §5.4: big EN-FR used P_drop 0.1 instead.
BIG = TransformerConfig(d_model=1024, d_ff=4096, num_heads=16, p_drop=0.3, train_steps=300_000)

# Every row of Table 3 (arXiv:1706.03762 v7), in printed order, blank cells = base values.
TABLE3: Mapping[str, TransformerConfig] = MappingProxyType(
    {
        "base": BASE,
        # (A): heads vs head width at constant computation.
        "A1": replace(BASE, num_heads=1, d_k=512, d_v=512),
        "A2": replace(BASE, num_heads=4, d_k=128, d_v=128),
        "A3": replace(BASE, num_heads=16, d_k=32, d_v=32),
        "A4": replace(BASE, num_heads=32, d_k=16, d_v=16),
        # (B): smaller attention key size; only d_k changes (d_v stays 64).
        "B1": replace(BASE, d_k=16),
        "B2": replace(BASE, d_k=32),
        # (C): model size.
        "C1": replace(BASE, n_layers=2),
        "C2": replace(BASE, n_layers=4),
        "C3": replace(BASE, n_layers=8),
        "C4": replace(BASE, d_model=256, d_k=32, d_v=32),
        "C5": replace(BASE, d_model=1024, d_k=128, d_v=128),
        "C6": replace(BASE, d_ff=1024),
        "C7": replace(BASE, d_ff=4096),
        # (D): dropout and label smoothing.
        "D1": replace(BASE, p_drop=0.0),
        "D2": replace(BASE, p_drop=0.2),
        "D3": replace(BASE, eps_ls=0.0),
        "D4": replace(BASE, eps_ls=0.2),
        # (E): "positional embedding instead of sinusoids".
        "E": replace(BASE, positional="learned"),
        "big": BIG,
    }
)

# Table 3, column "params x10^6", as printed (v7). None where the cell is blank (rows A, D, E).
TABLE3_PRINTED_PARAMS_MILLIONS: Mapping[str, int | None] = MappingProxyType(
    {
        "base": 65,
        "A1": None,
        "A2": None,
        "A3": None,
        "A4": None,
        "B1": 58,
        "B2": 60,
        "C1": 36,
        "C2": 50,
        "C3": 80,
        "C4": 28,
        "C5": 168,
        "C6": 53,
        "C7": 90,
        "D1": None,
        "D2": None,
        "D3": None,
        "D4": None,
        "E": None,
        "big": 213,
    }
)

# ---------------------------------------------------------------------------------------------
# Parameter counts (§3.1-§3.5, Table 3 last column)
# ---------------------------------------------------------------------------------------------


def multi_head_attention_parameters(config: TransformerConfig, *, biases: bool = True) -> int:
    """Parameters of one multi-head attention sub-layer.

    Paper: §3.2.2: W_i^Q, W_i^K in R^{d_model x d_k}, W_i^V in R^{d_model x d_v} for h heads,
    W^O in R^{h d_v x d_model}: 2 h d_model d_k + 2 h d_v d_model weights (base: 4 * 512 * 512).
    Choices: with ``biases``, b_q, b_k (h d_k each), b_v (h d_v) and b_o (d_model) are added.
    """
    h, d, d_k, d_v = config.num_heads, config.d_model, config.d_k, config.d_v
    weights = 2 * d * h * d_k + 2 * h * d_v * d  # w_q, w_k: (d, h d_k); w_v: (d, h d_v); w_o: (h d_v, d)
    return weights + (2 * h * d_k + h * d_v + d if biases else 0)


def feed_forward_parameters(config: TransformerConfig, *, biases: bool = True) -> int:
    """Parameters of one position-wise feed-forward sub-layer.

    Paper: §3.3, Eq. (2): FFN(x) = max(0, x W1 + b1) W2 + b2, W1 (d_model, d_ff), W2 (d_ff, d_model).
    Choices: ``biases`` adds b1 (d_ff) and b2 (d_model).
    """
    d, d_ff = config.d_model, config.d_ff
    return 2 * d * d_ff + (d_ff + d if biases else 0)


def layer_norm_parameters(config: TransformerConfig) -> int:
    """Parameters of one LayerNorm (§3.1): a gain and a bias of width d_model."""
    return 2 * config.d_model


def _embedding_components(config: TransformerConfig, vocab_size: int, embeddings: str) -> dict[str, int]:
    """The token-embedding matrices of §3.4, one entry per distinct matrix."""
    table = vocab_size * config.d_model
    if embeddings == "shared":
        return {"embedding": table}
    if embeddings == "separate_output":
        return {"input_embedding": table, "output_projection": table}
    return {"source_embedding": table, "target_embedding": table, "output_projection": table}


def _positional_components(config: TransformerConfig, max_positions: int | None) -> dict[str, int]:
    """Learned positional tables (row E); sinusoids (§3.5) have none."""
    if config.positional == "sinusoid":
        return {}
    if max_positions is None:
        raise ValueError(
            "max_positions: required when config.positional is 'learned' (Table 3 row E); "
            "the paper gives no table length, so pass the longest sequence the model must embed"
        )
    table = positive_int("max_positions", max_positions) * config.d_model
    return {"encoder_positional_embedding": table, "decoder_positional_embedding": table}


def parameter_breakdown(
    config: TransformerConfig,
    *,
    vocab_size: int = 37000,
    biases: bool = True,
    layer_norm: bool = True,
    embeddings: str = "shared",
    max_positions: int | None = None,
) -> dict[str, int]:
    """Trainable parameters by component; the values sum to :func:`parameter_count`.

    Paper: §3.1 (N encoder layers: self-attention + FFN; N decoder layers: masked self-attention
    + encoder-decoder attention + FFN; LayerNorm after each sub-layer), §3.2.2, §3.3, §3.4, §3.5.
    Choices: see the module docstring (biases, LayerNorm, embeddings, learned positions). The
    layer entries are totals over the N layers of a stack; "*.layer_norm" entries are 0 when
    ``layer_norm`` is False. vocab_size: "about 37000" shared BPE tokens for EN-DE (§5.1).
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config: expected a TransformerConfig, got {type(config).__name__}")
    positive_int("vocab_size", vocab_size, minimum=2)
    choice("embeddings", embeddings, _EMBEDDINGS)
    n = config.n_layers
    attention = multi_head_attention_parameters(config, biases=biases)
    ffn = feed_forward_parameters(config, biases=biases)
    norm = layer_norm_parameters(config) if layer_norm else 0
    parts = _embedding_components(config, vocab_size, embeddings)
    parts.update(_positional_components(config, max_positions))
    parts.update(
        {
            "encoder.self_attention": n * attention,
            "encoder.feed_forward": n * ffn,
            "encoder.layer_norm": n * 2 * norm,
            "decoder.self_attention": n * attention,
            "decoder.cross_attention": n * attention,
            "decoder.feed_forward": n * ffn,
            "decoder.layer_norm": n * 3 * norm,
        }
    )
    return parts


def parameter_count(
    config: TransformerConfig,
    *,
    vocab_size: int = 37000,
    biases: bool = True,
    layer_norm: bool = True,
    embeddings: str = "shared",
    max_positions: int | None = None,
) -> int:
    """Total trainable parameters of an encoder-decoder Transformer (Table 3, "params x10^6").

    Paper: §3.1-§3.5 and Table 3. Choices and switches: as :func:`parameter_breakdown`.
    """
    parts = parameter_breakdown(
        config,
        vocab_size=vocab_size,
        biases=biases,
        layer_norm=layer_norm,
        embeddings=embeddings,
        max_positions=max_positions,
    )
    return sum(parts.values())


# ---------------------------------------------------------------------------------------------
# Per-layer operations (Table 1, §4)
# ---------------------------------------------------------------------------------------------

# What Table 1 (and §4's text, for the two extra rows) prints: (complexity, sequential, path).
# The separable convolution's path length is not printed (None).
PRINTED_TABLE1: Mapping[str, tuple[str, str, str | None]] = MappingProxyType(
    {
        "self_attention": ("O(n²·d)", "O(1)", "O(1)"),
        "recurrent": ("O(n·d²)", "O(n)", "O(n)"),
        "convolutional": ("O(k·n·d²)", "O(1)", "O(log_k(n))"),
        "restricted_self_attention": ("O(r·n·d)", "O(1)", "O(n/r)"),
        "convolutional_contiguous": ("O(k·n·d²)", "O(1)", "O(n/k)"),  # §4, contiguous kernels
        "separable_convolutional": ("O(k·n·d + n·d²)", "O(1)", None),  # §4, separable convolutions
    }
)

_CONVENTIONS: Mapping[str, str] = MappingProxyType(
    {
        "self_attention": "Q·Kᵀ n·n·d + weights·V n·n·d = 2n²d; projections 4nd² reported apart",
        "recurrent": "Elman cell h_t = f(W_h h_(t-1) + W_x x_t): 2d² per step, 2nd²",
        "convolutional": "kernel width k, d in and d out channels: k·d² per position, k·n·d²",
        "restricted_self_attention": "each query scores r keys and blends r values: 2r·n·d; projections 4nd²",
        "convolutional_contiguous": "as convolutional (k·n·d²); undilated kernels",
        "separable_convolutional": "depthwise k·n·d + pointwise n·d²",
    }
)


@dataclass(frozen=True)
class LayerOperations:
    """Cost of one layer over a sequence of n positions of width d (one row of Table 1).

    ``complexity``: multiply-adds of the layer's sequence-mixing step (convention in
    ``convention``); ``projection_complexity``: the Q/K/V/output projections of the attention
    types (4·n·d², excluded from Table 1's O(n²·d)), 0 for the others.
    ``sequential_operations``: steps that must run one after another.
    ``maximum_path_length``: fewest layers (or recurrent steps) a signal crosses between the two
    farthest positions; 0 when n = 1. ``printed_*``: Table 1's O(.) strings.
    """

    layer_type: str
    complexity: int
    projection_complexity: int
    sequential_operations: int
    maximum_path_length: int
    printed_complexity: str
    printed_sequential: str
    printed_path: str | None
    convention: str = field(repr=False)


def _windowed_path(n: int, width: int) -> int:
    """Layers of width-``width`` windows needed so that position 0 reaches position n-1.

    A window of ``width`` consecutive positions moves information at most width - 1 positions per
    layer (a centred window reaches (width - 1)/2 each way: twice the layers, the same O(n/width)).
    """
    return -(-(n - 1) // (width - 1))  # ceil((n - 1) / (width - 1))


def _dilated_path(n: int, k: int) -> int:
    """Layers of dilated convolutions (dilations 1, k, k^2, ...) until the receptive field k^L >= n."""
    layers, field_width = 0, 1
    while field_width < n:
        layers, field_width = layers + 1, field_width * k
    return layers


def _operation_counts(layer_type: str, n: int, d: int, k: int, r: int | None) -> tuple[int, int, int, int]:
    """(complexity, projection_complexity, sequential_operations, maximum_path_length)."""
    if layer_type == "self_attention":
        return 2 * n * n * d, 4 * n * d * d, 1, min(1, n - 1)
    if layer_type == "recurrent":
        return 2 * n * d * d, 0, n, n - 1
    if layer_type == "convolutional":
        return k * n * d * d, 0, 1, _dilated_path(n, k)
    if layer_type == "convolutional_contiguous":
        return k * n * d * d, 0, 1, _windowed_path(n, k)
    if layer_type == "separable_convolutional":
        return k * n * d + n * d * d, 0, 1, _dilated_path(n, k)
    assert r is not None  # checked by the caller
    return 2 * r * n * d, 4 * n * d * d, 1, _windowed_path(n, r)


def layer_operations(layer_type: str, n: int, d: int, *, k: int = 3, r: int | None = None) -> LayerOperations:
    """Per-layer multiply-adds, sequential operations and maximum path length (Table 1, §4).

    Paper: Table 1; §4: "a stack of O(n/k) convolutional layers in the case of contiguous
    kernels, or O(log_k(n)) in the case of dilated convolutions"; separable convolutions cost
    O(k·n·d + n·d²); restricted self-attention uses a neighbourhood of size r.
    Choices: counting conventions per type in ``LayerOperations.convention`` (self-attention:
    2n²d, excluding the 4nd² projections, reported as ``projection_complexity``; recurrent:
    Elman cell 2nd²; convolution: k·n·d², zero padding counted); "convolutional" is Table 1's row
    and uses dilated kernels (path ceil(log_k n)), "convolutional_contiguous" the undilated stack
    (path ceil((n-1)/(k-1))); restricted attention's path is ceil((n-1)/(r-1)) with 2 <= r <= n.
    The separable convolution's path (not printed) is taken to be the dilated one.
    Shapes: n positions, d channels (d = d_model).
    """
    choice("layer_type", layer_type, tuple(PRINTED_TABLE1))
    positive_int("n", n)
    positive_int("d", d)
    positive_int("k", k, minimum=2)
    if layer_type == "restricted_self_attention":
        if r is None:
            raise ValueError("r: required for 'restricted_self_attention' (the neighbourhood size)")
        positive_int("r", r, minimum=2)
        if r > n:
            raise ValueError(f"r: the neighbourhood size must not exceed n={n}, got {r}")
    elif r is not None:
        raise ValueError(f"r: applies only to 'restricted_self_attention', got r={r!r} for {layer_type!r}")
    complexity, projections, sequential, path = _operation_counts(layer_type, n, d, k, r)
    printed = PRINTED_TABLE1[layer_type]
    return LayerOperations(
        layer_type=layer_type,
        complexity=complexity,
        projection_complexity=projections,
        sequential_operations=sequential,
        maximum_path_length=path,
        printed_complexity=printed[0],
        printed_sequential=printed[1],
        printed_path=printed[2],
        convention=_CONVENTIONS[layer_type],
    )


# ---------------------------------------------------------------------------------------------
# Training cost (§6.1, footnote 5, Table 2)
# ---------------------------------------------------------------------------------------------

# Footnote 5 (§6.1): "We used values of 2.8, 3.7, 6.0 and 9.5 TFLOPS for K80, K40, M40 and P100".
GPU_TFLOPS: Mapping[str, float] = MappingProxyType({"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5})


@dataclass(frozen=True)
class TrainingRun:
    """How long a model trained, as the paper states it (§5.2) and the cost it prints (Table 2)."""

    gpu: str  # §5.2: "one machine with 8 NVIDIA P100 GPUs"
    num_gpus: int  # §5.2
    hours: float  # §5.2: base "12 hours", big "3.5 days" (= 84 hours)
    steps: int  # §5.2: base 100,000 steps, big 300,000 steps
    seconds_per_step: float  # §5.2: base "about 0.4 seconds", big "1.0 seconds"
    printed_cost_flops: float  # Table 2, "Training Cost (FLOPs)", one cell for EN-DE and EN-FR


PAPER_TRAINING: Mapping[str, TrainingRun] = MappingProxyType(
    {
        # §5.2 "Hardware and Schedule"; Table 2 row "Transformer (base model)": 3.3·10^18.
        "base": TrainingRun("P100", 8, 12.0, 100_000, 0.4, 3.3e18),
        # §5.2; Table 2 row "Transformer (big)": 2.3·10^19.
        "big": TrainingRun("P100", 8, 3.5 * 24.0, 300_000, 1.0, 2.3e19),
    }
)


def training_flops(hours: float, num_gpus: int, gpu: str) -> float:
    """Estimated floating-point operations of a training run.

    Paper: §6.1: "multiplying the training time, the number of GPUs used, and an estimate of the
    sustained single-precision floating-point capacity of each GPU" (rates: footnote 5).
    Returns hours * 3600 * num_gpus * GPU_TFLOPS[gpu] * 1e12.
    """
    if isinstance(hours, bool) or not isinstance(hours, numbers.Real):
        raise TypeError(f"hours: expected a positive real number, got {hours!r}")
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours: expected a positive finite number, got {hours}")
    positive_int("num_gpus", num_gpus)
    choice("gpu", gpu, tuple(GPU_TFLOPS))
    return float(hours) * 3600.0 * num_gpus * GPU_TFLOPS[gpu] * 1e12


# ---------------------------------------------------------------------------------------------
# Floating-point operations of a training step (for model FLOP utilisation)
# ---------------------------------------------------------------------------------------------


def forward_flops(config: TransformerConfig, vocab_size: int, batch: int, n_src: int, n_tgt: int) -> int:
    """Floating-point operations of the matrix products of one teacher-forced forward pass.

    Paper: §3.1-§3.4 (Figure 1): per encoder layer, multi-head self-attention (§3.2.2: Q, K, V
    and output projections; Eq. (1): Q·Kᵀ and weights·V per head) and the FFN (Eq. (2)); per
    decoder layer, masked self-attention, encoder-decoder attention (queries from the decoder,
    keys and values projected from the encoder's n_src outputs) and the FFN; then the
    pre-softmax projection onto the vocabulary (§3.4).
    Choices: 2 operations per multiply-add; only matrix products are counted (softmax, LayerNorm,
    dropout, residual sums and biases are O(n·d) and left out, as in Table 1); the batch is padded
    to (batch, n_src) and (batch, n_tgt) and every padded position counted, as the kernels compute
    them; causal self-attention counts all n_tgt² scores (what an attention with an explicit mask
    computes). Shapes: batch sentences of n_src source and n_tgt target positions.
    """
    positive_int("vocab_size", vocab_size, minimum=2)
    for name, value in (("batch", batch), ("n_src", n_src), ("n_tgt", n_tgt)):
        positive_int(name, value)
    d, d_ff, h, d_k, d_v = config.d_model, config.d_ff, config.num_heads, config.d_k, config.d_v

    def attention(n_q: int, n_k: int) -> int:  # multiply-adds of one attention sub-layer, one sentence
        projections = n_q * d * h * d_k + n_k * d * (h * d_k + h * d_v) + n_q * h * d_v * d
        return projections + h * n_q * n_k * (d_k + d_v)

    def ffn(n: int) -> int:
        return 2 * n * d * d_ff

    encoder = attention(n_src, n_src) + ffn(n_src)
    decoder = attention(n_tgt, n_tgt) + attention(n_tgt, n_src) + ffn(n_tgt)
    return 2 * batch * (config.n_layers * (encoder + decoder) + n_tgt * d * vocab_size)


def training_step_flops(config: TransformerConfig, vocab_size: int, batch: int, n_src: int, n_tgt: int) -> int:
    """Operations of one training step: 3 × :func:`forward_flops`.

    Choices: the backward pass of a matrix product costs two products of the same size (the
    gradients with respect to each operand), so a step is three forward passes' worth (the
    convention of Kaplan et al. 2020 and Hoffmann et al. 2022); the gradient into the input
    embeddings' lookup, which is not a product, is not counted, nor is the optimizer's O(N) update.
    """
    return 3 * forward_flops(config, vocab_size, batch, n_src, n_tgt)


# --------------------------------------------------------------------------------------------
# where §5.4 drops: the model's places by name (what a training-mode implementation reports its masks under)

#: The sub-layers of each layer whose outputs §5.4 drops, by their params' names, in the order they run (§3.1).
ENCODER_SUBLAYERS = ("self_attn", "ffn")
DECODER_SUBLAYERS = ("self_attn", "cross_attn", "ffn")


def dropout_places(n_encoder: int, n_decoder: int) -> tuple[str, ...]:
    """Where §5.4 drops in the whole model, in the order applied: the source's embedding sum, each encoder layer's
    sub-layers ("encoder.<i>.self_attn", "encoder.<i>.ffn"), the target's, each decoder layer's
    ("decoder.<i>.self_attn", "decoder.<i>.cross_attn", "decoder.<i>.ffn")."""
    return (
        "src_embedding",
        *(f"encoder.{i}.{s}" for i in range(n_encoder) for s in ENCODER_SUBLAYERS),
        "tgt_embedding",
        *(f"decoder.{i}.{s}" for i in range(n_decoder) for s in DECODER_SUBLAYERS),
    )
