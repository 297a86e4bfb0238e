"""Tests of reference/counts.py: Table 3 configurations and parameter counts, Table 1 operation
counts, and the §6.1 training-cost formula (footnote 5).

Every expected number below is hand arithmetic written out in the test (or a value printed in
the paper); none is produced by the code under test. Counts are exact integers, so integer
comparisons are exact; the one floating-point result (training_flops) has its bound derived
where it is checked.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.reference.counts import (
    BASE,
    BIG,
    GPU_TFLOPS,
    PAPER_TRAINING,
    TABLE3,
    TABLE3_PRINTED_PARAMS_MILLIONS,
    TransformerConfig,
    feed_forward_parameters,
    layer_operations,
    multi_head_attention_parameters,
    parameter_breakdown,
    parameter_count,
    training_flops,
)

U = 2.0**-53  # unit roundoff of binary64

# Table 3 "params x10^6" as printed in arXiv:1706.03762 v7 (see ../shared/PAPER.md).
PRINTED_MILLIONS = {
    "base": 65,
    "B1": 58,
    "B2": 60,
    "C1": 36,
    "C2": 50,
    "C3": 80,
    "C4": 28,
    "C5": 168,
    "C6": 53,
    "C7": 90,
    "big": 213,
}


def _hand_count(n_layers: int, d: int, d_ff: int, h: int, d_k: int, d_v: int, vocab: int) -> int:
    """An independent count, written from §3 for this test: shared embedding, biases, LayerNorm.

    attention: W_q, W_k (d x h d_k), W_v (d x h d_v), W_o (h d_v x d) + biases h d_k, h d_k, h d_v, d;
    FFN: W1 (d x d_ff), W2 (d_ff x d) + biases d_ff, d; LayerNorm: gain + bias, 2d.
    Encoder layer: attention + FFN + 2 LayerNorms; decoder layer: 2 attentions + FFN + 3 LayerNorms.
    """
    attention = (d * h * d_k) * 2 + d * h * d_v + h * d_v * d + (h * d_k) * 2 + h * d_v + d
    ffn = d * d_ff + d_ff * d + d_ff + d
    norm = d + d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return n_layers * (encoder_layer + decoder_layer) + vocab * d


def _millions(count: int) -> int:
    """Round a count to the nearest million (halves up), the way Table 3 prints it."""
    return (count + 500_000) // 1_000_000


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def test_base_config_is_table3_base_row() -> None:
    expected = (6, 512, 2048, 8, 64, 64, 0.1, 0.1, 100_000, "sinusoid")
    got = dataclasses.astuple(BASE)
    assert got == expected, f"BASE fields {got}, expected Table 3 base row {expected}"


def test_big_config_is_table3_big_row_with_default_head_width() -> None:
    expected = (6, 1024, 4096, 16, 64, 64, 0.3, 0.1, 300_000, "sinusoid")  # d_k = 1024/16 = 64
    got = dataclasses.astuple(BIG)
    assert got == expected, f"BIG fields {got}, expected Table 3 big row {expected}"


def test_table3_lists_every_row_in_printed_order() -> None:
    expected = [
        "base",
        "A1",
        "A2",
        "A3",
        "A4",
        "B1",
        "B2",
        "C1",
        "C2",
        "C3",
        "C4",
        "C5",
        "C6",
        "C7",
        "D1",
        "D2",
        "D3",
        "D4",
        "E",
        "big",
    ]
    assert list(TABLE3) == expected, f"TABLE3 labels {list(TABLE3)}, expected {expected}"


@pytest.mark.parametrize(
    ("label", "changes"),
    [
        ("A1", {"num_heads": 1, "d_k": 512, "d_v": 512}),
        ("A2", {"num_heads": 4, "d_k": 128, "d_v": 128}),
        ("A3", {"num_heads": 16, "d_k": 32, "d_v": 32}),
        ("A4", {"num_heads": 32, "d_k": 16, "d_v": 16}),
        ("B1", {"d_k": 16}),
        ("B2", {"d_k": 32}),
        ("C1", {"n_layers": 2}),
        ("C2", {"n_layers": 4}),
        ("C3", {"n_layers": 8}),
        ("C4", {"d_model": 256, "d_k": 32, "d_v": 32}),
        ("C5", {"d_model": 1024, "d_k": 128, "d_v": 128}),
        ("C6", {"d_ff": 1024}),
        ("C7", {"d_ff": 4096}),
        ("D1", {"p_drop": 0.0}),
        ("D2", {"p_drop": 0.2}),
        ("D3", {"eps_ls": 0.0}),
        ("D4", {"eps_ls": 0.2}),
        ("E", {"positional": "learned"}),
        ("big", {"d_model": 1024, "d_ff": 4096, "num_heads": 16, "p_drop": 0.3, "train_steps": 300_000}),
    ],
)
def test_table3_row_differs_from_base_only_in_printed_cells(label: str, changes: dict) -> None:
    row, base = dataclasses.asdict(TABLE3[label]), dataclasses.asdict(BASE)
    differing = {name: row[name] for name in row if row[name] != base[name]}
    assert differing == changes, f"row {label} differs from base in {differing}, expected {changes}"


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.d_model = 1024  # type: ignore[misc]


def test_omitted_head_width_needs_num_heads_to_divide_d_model() -> None:
    with pytest.raises(ValueError, match=r"d_k.*num_heads=7.*d_model=512"):
        TransformerConfig(num_heads=7)
    explicit = TransformerConfig(num_heads=7, d_k=64, d_v=64)  # allowed when given explicitly
    assert (explicit.d_k, explicit.d_v) == (64, 64), f"explicit head widths became {explicit.d_k, explicit.d_v}"


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"n_layers": 0}, ValueError, "n_layers"),
        ({"d_model": -512}, ValueError, "d_model"),
        ({"d_ff": 2048.0}, TypeError, "d_ff"),
        ({"d_k": 0}, ValueError, "d_k"),
        ({"p_drop": 1.0}, ValueError, "p_drop"),
        ({"eps_ls": -0.1}, ValueError, "eps_ls"),
        ({"positional": "rope"}, ValueError, "positional"),
        ({"train_steps": True}, TypeError, "train_steps"),
    ],
)
def test_bad_config_values_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        TransformerConfig(**kwargs)


# ---------------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------------


def test_base_attention_projection_weights() -> None:
    """§3.2.2: W^Q, W^K, W^V (8 heads of 512 x 64 each) and W^O (512 x 512): 4 * 512 * 512."""
    expected = 4 * 512 * 512  # = 1,048,576
    assert expected == 1_048_576
    got = multi_head_attention_parameters(BASE, biases=False)
    assert got == expected, f"base attention weights {got}, expected {expected} (missed by {got - expected})"


def test_base_attention_with_biases_adds_four_bias_vectors() -> None:
    expected = 1_048_576 + 4 * 512  # b_q, b_k, b_v (8 x 64 each) and b_o (512)
    got = multi_head_attention_parameters(BASE)
    assert got == expected, f"base attention with biases {got}, expected {expected}"


def test_base_feed_forward_parameters_per_layer() -> None:
    """§3.3: W1 512 x 2048, b1 2048, W2 2048 x 512, b2 512."""
    expected = 512 * 2048 + 2048 + 2048 * 512 + 512  # = 2,099,712
    assert expected == 2_099_712
    got = feed_forward_parameters(BASE)
    assert got == expected, f"base FFN parameters {got}, expected {expected}"
    no_bias = feed_forward_parameters(BASE, biases=False)
    assert no_bias == 2 * 512 * 2048, f"base FFN weights without biases {no_bias}, expected {2 * 512 * 2048}"


def test_base_shared_embedding_numbers() -> None:
    """§3.4: a 37000 x 512 matrix shared by both inputs and the pre-softmax projection."""
    expected = 37000 * 512  # = 18,944,000
    got = parameter_breakdown(BASE)["embedding"]
    assert got == expected == 18_944_000, f"base embedding {got}, expected {expected}"


# Hand arithmetic for BASE (shared embedding, biases, LayerNorm, vocab 37000):
#   attention 1,050,624; FFN 2,099,712; LayerNorm 1,024
#   encoder layer 1,050,624 + 2,099,712 + 2*1,024           = 3,152,384
#   decoder layer 2*1,050,624 + 2,099,712 + 3*1,024         = 4,204,032
#   6 * (3,152,384 + 4,204,032) = 6 * 7,356,416             = 44,138,496
#   + 18,944,000                                            = 63,082,496
BASE_COUNT = 63_082_496
# BIG: attention 4*1024^2 + 4*1024 = 4,198,400; FFN 2*1024*4096 + 4096 + 1024 = 8,393,728; LN 2,048
#   encoder layer 4,198,400 + 8,393,728 + 4,096             = 12,596,224
#   decoder layer 8,396,800 + 8,393,728 + 6,144             = 16,796,672
#   6 * 29,392,896 = 176,357,376; + 37000*1024 = 37,888,000 = 214,245,376
BIG_COUNT = 214_245_376


def test_base_total_under_natural_assumptions() -> None:
    """Table 3 prints 65 (x10^6); the natural assumptions give 63.08M (see the next tests)."""
    got = parameter_count(BASE)
    assert got == BASE_COUNT, f"base count {got}, expected {BASE_COUNT} (missed by {got - BASE_COUNT})"
    assert got == _hand_count(6, 512, 2048, 8, 64, 64, 37000)


def test_big_total_under_natural_assumptions() -> None:
    """Table 3 prints 213 (x10^6); the natural assumptions give 214.2M, 1.2M (0.6%) more."""
    got = parameter_count(BIG)
    assert got == BIG_COUNT, f"big count {got}, expected {BIG_COUNT} (missed by {got - BIG_COUNT})"
    assert _millions(got) == 214 and abs(got - 213_000_000) / 213_000_000 < 0.006


def test_no_switch_combination_gives_printed_65m_at_37000_tokens() -> None:
    """At the paper's "about 37000" tokens no counting switch lands base on the printed 65M.

    Hand arithmetic: biases in base are 18 attentions x 2,048 + 12 FFNs x 2,560 = 67,584;
    LayerNorms 30 x 1,024 = 30,720; a second/third embedding matrix adds 18,944,000 each.
    """
    expected = {}
    for embeddings, extra in (("shared", 0), ("separate_output", 18_944_000), ("separate_all", 37_888_000)):
        for biases in (True, False):
            for layer_norm in (True, False):
                expected[embeddings, biases, layer_norm] = (
                    BASE_COUNT + extra - (0 if biases else 67_584) - (0 if layer_norm else 30_720)
                )
    for (embeddings, biases, layer_norm), count in expected.items():
        got = parameter_count(BASE, embeddings=embeddings, biases=biases, layer_norm=layer_norm)
        assert got == count, f"base with {embeddings=}, {biases=}, {layer_norm=}: {got}, expected {count}"
    assert {_millions(c) for c in expected.values()} == {63, 82, 101}


@pytest.mark.parametrize(
    ("vocab", "expected_count", "expected_millions"),
    [
        (39_768, 44_138_496 + 39_768 * 512, 64),  # 64,499,712
        (39_769, 44_138_496 + 39_769 * 512, 65),  # 64,500,224: smallest vocabulary giving 65
        (41_721, 44_138_496 + 41_721 * 512, 65),  # 65,499,648: largest vocabulary giving 65
        (41_722, 44_138_496 + 41_722 * 512, 66),  # 65,500,160
    ],
)
def test_base_lands_printed_65m_only_with_vocabulary_39769_to_41721(
    vocab: int, expected_count: int, expected_millions: int
) -> None:
    """The assumption set that lands Table 3's 65: shared embedding, biases, LayerNorm, and a
    shared vocabulary of 39,769..41,721 tokens (not the "about 37000" of §5.1)."""
    got = parameter_count(BASE, vocab_size=vocab)
    assert got == expected_count, f"base count at vocab {vocab}: {got}, expected {expected_count}"
    assert _millions(got) == expected_millions, f"vocab {vocab}: {got} rounds to {_millions(got)}M"


def test_every_printed_count_but_big_fits_one_vocabulary_of_41000() -> None:
    """At 41,000 shared tokens (inside the 40,932..41,160 window every row allows) each printed
    Table 3 count is reproduced to the printed million except big's (218 vs 213)."""
    rows = {  # label: (N, d_model, d_ff, h, d_k, d_v) from Table 3
        "base": (6, 512, 2048, 8, 64, 64),
        "B1": (6, 512, 2048, 8, 16, 64),
        "B2": (6, 512, 2048, 8, 32, 64),
        "C1": (2, 512, 2048, 8, 64, 64),
        "C2": (4, 512, 2048, 8, 64, 64),
        "C3": (8, 512, 2048, 8, 64, 64),
        "C4": (6, 256, 2048, 8, 32, 32),
        "C5": (6, 1024, 2048, 8, 128, 128),
        "C6": (6, 512, 1024, 8, 64, 64),
        "C7": (6, 512, 4096, 8, 64, 64),
        "big": (6, 1024, 4096, 16, 64, 64),
    }
    misses = {}
    for label, sizes in rows.items():
        expected = _hand_count(*sizes, 41_000)
        got = parameter_count(TABLE3[label], vocab_size=41_000)
        assert got == expected, f"row {label} at vocab 41000: {got}, expected {expected}"
        if _millions(got) != PRINTED_MILLIONS[label]:
            misses[label] = (_millions(got), PRINTED_MILLIONS[label])
    assert misses == {"big": (218, 213)}, f"rows whose count misses the printed million: {misses}"


def test_big_lands_printed_213m_only_with_vocabulary_35296_to_36272() -> None:
    for vocab, millions in ((35_295, 212), (35_296, 213), (36_272, 213), (36_273, 214)):
        got = parameter_count(BIG, vocab_size=vocab)
        expected = 176_357_376 + vocab * 1024
        assert got == expected, f"big count at vocab {vocab}: {got}, expected {expected}"
        assert _millions(got) == millions, f"big at vocab {vocab}: {got} rounds to {_millions(got)}M"


def test_printed_params_data_matches_paper() -> None:
    stored = {k: v for k, v in TABLE3_PRINTED_PARAMS_MILLIONS.items() if v is not None}
    assert stored == PRINTED_MILLIONS, f"stored printed params {stored}, expected {PRINTED_MILLIONS}"
    assert list(TABLE3_PRINTED_PARAMS_MILLIONS) == list(TABLE3)


def test_row_a_keeps_the_base_count() -> None:
    """Rows (A) keep h * d_k = h * d_v = 512, so every projection keeps its size."""
    for label in ("A1", "A2", "A3", "A4"):
        got = parameter_count(TABLE3[label])
        assert got == BASE_COUNT, f"row {label}: {got}, expected the base count {BASE_COUNT}"


def test_row_b_shrinks_only_query_and_key_projections() -> None:
    """d_k 64 -> 16: W_q and W_k lose 512 x 8 x 48 weights each and b_q, b_k 8 x 48 entries each,
    in 18 attention sub-layers: 18 * (2 * 512 * 384 + 2 * 384) = 18 * 393,984 = 7,091,712."""
    got = parameter_count(TABLE3["B1"])
    expected = BASE_COUNT - 7_091_712
    assert got == expected, f"row B1: {got}, expected {expected} (missed by {got - expected})"


def test_learned_positions_need_max_positions() -> None:
    with pytest.raises(ValueError, match="max_positions"):
        parameter_count(TABLE3["E"])
    got = parameter_count(TABLE3["E"], max_positions=512)
    expected = BASE_COUNT + 2 * 512 * 512  # encoder and decoder tables
    assert got == expected, f"row E with 512 positions: {got}, expected {expected}"


def test_max_positions_is_ignored_for_sinusoids() -> None:
    got = parameter_count(BASE, max_positions=512)
    assert got == BASE_COUNT, f"sinusoidal base with max_positions: {got}, expected {BASE_COUNT}"


@pytest.mark.parametrize(
    ("embeddings", "keys", "extra"),
    [
        ("shared", {"embedding"}, 0),
        ("separate_output", {"input_embedding", "output_projection"}, 18_944_000),
        ("separate_all", {"source_embedding", "target_embedding", "output_projection"}, 37_888_000),
    ],
)
def test_embedding_modes(embeddings: str, keys: set, extra: int) -> None:
    parts = parameter_breakdown(BASE, embeddings=embeddings)
    got_keys = {k for k in parts if "embedding" in k or "projection" in k}
    assert got_keys == keys, f"{embeddings}: embedding components {got_keys}, expected {keys}"
    got = parameter_count(BASE, embeddings=embeddings)
    assert got == BASE_COUNT + extra, f"{embeddings}: {got}, expected {BASE_COUNT + extra}"


def test_breakdown_components_for_base() -> None:
    expected = {
        "embedding": 18_944_000,
        "encoder.self_attention": 6 * 1_050_624,
        "encoder.feed_forward": 6 * 2_099_712,
        "encoder.layer_norm": 6 * 2 * 1_024,
        "decoder.self_attention": 6 * 1_050_624,
        "decoder.cross_attention": 6 * 1_050_624,
        "decoder.feed_forward": 6 * 2_099_712,
        "decoder.layer_norm": 6 * 3 * 1_024,
    }
    got = parameter_breakdown(BASE)
    assert got == expected, f"base breakdown {got}, expected {expected}"
    no_norm = parameter_breakdown(BASE, layer_norm=False)
    assert no_norm["encoder.layer_norm"] == no_norm["decoder.layer_norm"] == 0


@pytest.mark.parametrize("label", list(TABLE3))
def test_breakdown_sums_to_count(label: str) -> None:
    for embeddings in ("shared", "separate_output", "separate_all"):
        for biases in (True, False):
            for layer_norm in (True, False):
                kwargs = dict(embeddings=embeddings, biases=biases, layer_norm=layer_norm)
                kwargs.update(vocab_size=1000, max_positions=64)
                parts = parameter_breakdown(TABLE3[label], **kwargs)
                total = parameter_count(TABLE3[label], **kwargs)
                assert sum(parts.values()) == total, f"row {label} {kwargs}: parts sum {sum(parts.values())} != {total}"
                assert all(v >= 0 for v in parts.values()), f"row {label} {kwargs}: negative component in {parts}"


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"vocab_size": 1}, ValueError, "vocab_size"),
        ({"vocab_size": 37000.0}, TypeError, "vocab_size"),
        ({"embeddings": "tied"}, ValueError, "embeddings.*shared"),
        ({"max_positions": 0}, None, None),  # ignored for sinusoids: no error
    ],
)
def test_bad_count_arguments_are_named(kwargs: dict, error: type | None, pattern: str | None) -> None:
    if error is None:
        assert parameter_count(BASE, **kwargs) == BASE_COUNT
        return
    with pytest.raises(error, match=pattern):
        parameter_count(BASE, **kwargs)


def test_learned_positions_reject_bad_max_positions() -> None:
    with pytest.raises(ValueError, match="max_positions"):
        parameter_count(TABLE3["E"], max_positions=0)


def test_count_rejects_a_non_config() -> None:
    with pytest.raises(TypeError, match="config"):
        parameter_count({"d_model": 512})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Table 1 and §4: operations per layer
# ---------------------------------------------------------------------------------------------


def test_self_attention_counts() -> None:
    ops = layer_operations("self_attention", 10, 512)
    assert ops.complexity == 2 * 10 * 10 * 512 == 102_400, f"self-attention n=10 d=512: {ops.complexity}"
    assert ops.projection_complexity == 4 * 10 * 512 * 512, f"projections: {ops.projection_complexity}"
    assert (ops.sequential_operations, ops.maximum_path_length) == (1, 1)
    assert (ops.printed_complexity, ops.printed_sequential, ops.printed_path) == ("O(n²·d)", "O(1)", "O(1)")


def test_recurrent_counts() -> None:
    ops = layer_operations("recurrent", 4, 512)
    assert ops.complexity == 2 * 4 * 512 * 512, f"recurrent n=4 d=512: {ops.complexity}"
    assert ops.projection_complexity == 0
    assert ops.sequential_operations == 4, f"recurrent sequential ops {ops.sequential_operations}, expected n=4"
    assert ops.maximum_path_length == 3, f"recurrent path {ops.maximum_path_length}, expected n-1=3"
    assert (ops.printed_complexity, ops.printed_sequential, ops.printed_path) == ("O(n·d²)", "O(n)", "O(n)")


@pytest.mark.parametrize(
    ("n", "k", "layers"),
    [
        (1, 3, 0),
        (2, 3, 1),
        (3, 3, 1),
        (4, 3, 2),
        (9, 3, 2),
        (10, 3, 3),
        (27, 3, 3),
        (28, 3, 4),
        (1024, 2, 10),
        (1025, 2, 11),
    ],
)
def test_dilated_convolution_path_is_ceil_log_k_n(n: int, k: int, layers: int) -> None:
    """Table 1: O(log_k(n)); receptive field k^L must cover n (hand values of ceil(log_k n))."""
    ops = layer_operations("convolutional", n, 8, k=k)
    assert ops.maximum_path_length == layers, f"dilated conv n={n} k={k}: {ops.maximum_path_length}, expected {layers}"
    assert ops.printed_path == "O(log_k(n))"


@pytest.mark.parametrize(("n", "k", "layers"), [(1, 3, 0), (3, 3, 1), (4, 3, 2), (9, 3, 4), (10, 3, 5), (100, 5, 25)])
def test_contiguous_convolution_path_is_ceil_n_minus_1_over_k_minus_1(n: int, k: int, layers: int) -> None:
    """§4: O(n/k) layers for contiguous kernels; each layer moves information k-1 positions."""
    ops = layer_operations("convolutional_contiguous", n, 8, k=k)
    got = ops.maximum_path_length
    assert got == layers, f"contiguous conv n={n} k={k}: {got}, expected {layers}"
    assert ops.printed_path == "O(n/k)"


def test_convolution_counts() -> None:
    ops = layer_operations("convolutional", 10, 512, k=3)
    assert ops.complexity == 3 * 10 * 512 * 512, f"conv k=3 n=10 d=512: {ops.complexity}"
    assert ops.sequential_operations == 1 and ops.printed_complexity == "O(k·n·d²)"


def test_separable_convolution_counts() -> None:
    """§4: O(k·n·d + n·d²): depthwise 3*10*512 = 15,360 plus pointwise 10*512^2 = 2,621,440."""
    ops = layer_operations("separable_convolutional", 10, 512, k=3)
    assert ops.complexity == 15_360 + 2_621_440 == 2_636_800, f"separable conv: {ops.complexity}"
    assert ops.printed_complexity == "O(k·n·d + n·d²)" and ops.printed_path is None


def test_restricted_self_attention_counts() -> None:
    ops = layer_operations("restricted_self_attention", 100, 64, r=10)
    assert ops.complexity == 2 * 10 * 100 * 64, f"restricted n=100 r=10 d=64: {ops.complexity}"
    assert ops.maximum_path_length == 11, f"restricted path {ops.maximum_path_length}, expected ceil(99/9)=11"
    assert (ops.printed_complexity, ops.printed_path) == ("O(r·n·d)", "O(n/r)")


def test_every_path_is_zero_for_one_position() -> None:
    for layer_type, r in (
        ("self_attention", None),
        ("recurrent", None),
        ("convolutional", None),
        ("convolutional_contiguous", None),
        ("separable_convolutional", None),
    ):
        assert layer_operations(layer_type, 1, 8, r=r).maximum_path_length == 0, layer_type


def test_self_attention_is_cheaper_than_recurrence_exactly_when_n_below_d() -> None:
    """§4: self-attention is faster than recurrent layers when n < d (2n²d vs 2nd²)."""
    d = 512
    for n, relation in ((511, -1), (512, 0), (513, 1)):
        attention = layer_operations("self_attention", n, d).complexity
        recurrent = layer_operations("recurrent", n, d).complexity
        got = (attention > recurrent) - (attention < recurrent)
        assert got == relation, f"n={n} d={d}: attention {attention} vs recurrent {recurrent}"


@settings(deadline=None, max_examples=30)
@given(n=st.integers(2, 300), d=st.integers(1, 300), k=st.integers(2, 9))
def test_table1_counts_scale_as_their_order(n: int, d: int, k: int) -> None:
    """Doubling n or d multiplies each count by the factor its O(.) predicts (exact for our counts)."""
    r = max(2, n // 2)

    def ops(t: str, nn: int, dd: int, kk: int = k, rr: int | None = None) -> int:
        return layer_operations(t, nn, dd, k=kk, r=rr).complexity

    assert ops("self_attention", 2 * n, d) == 4 * ops("self_attention", n, d)  # n² d
    assert ops("self_attention", n, 2 * d) == 2 * ops("self_attention", n, d)
    assert ops("recurrent", 2 * n, d) == 2 * ops("recurrent", n, d)  # n d²
    assert ops("recurrent", n, 2 * d) == 4 * ops("recurrent", n, d)
    assert ops("convolutional", n, 2 * d) == 4 * ops("convolutional", n, d)  # k n d²
    assert ops("convolutional", 2 * n, d) == 2 * ops("convolutional", n, d)
    assert ops("convolutional", n, d, kk=2 * k) == 2 * ops("convolutional", n, d)
    restricted = ops("restricted_self_attention", n, d, rr=r)  # r n d
    assert ops("restricted_self_attention", 2 * n, d, rr=r) == 2 * restricted
    assert ops("restricted_self_attention", n, 2 * d, rr=r) == 2 * restricted
    assert ops("restricted_self_attention", 2 * n, d, rr=2 * r) == 4 * restricted
    assert layer_operations("recurrent", 2 * n, d).sequential_operations == 2 * n
    assert layer_operations("self_attention", 2 * n, d).sequential_operations == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "pattern"),
    [
        (("transformer", 10, 8), {}, ValueError, "layer_type.*self_attention"),
        (("self_attention", -1, 8), {}, ValueError, "n: expected an integer >= 1, got -1"),
        (("self_attention", 0, 8), {}, ValueError, "n:"),
        (("self_attention", 2.5, 8), {}, TypeError, "n:"),
        (("recurrent", 10, 0), {}, ValueError, "d:"),
        (("convolutional", 10, 8), {"k": 1}, ValueError, "k:"),
        (("restricted_self_attention", 10, 8), {}, ValueError, "r: required"),
        (("restricted_self_attention", 10, 8), {"r": 11}, ValueError, "r: .*n=10"),
        (("restricted_self_attention", 10, 8), {"r": 1}, ValueError, "r:"),
        (("self_attention", 10, 8), {"r": 3}, ValueError, "r: applies only"),
    ],
)
def test_bad_layer_operation_arguments_are_named(args: tuple, kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        layer_operations(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# §6.1 training cost, footnote 5
# ---------------------------------------------------------------------------------------------


def test_gpu_rates_are_footnote_5() -> None:
    expected = {"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5}
    assert dict(GPU_TFLOPS) == expected, f"GPU_TFLOPS {dict(GPU_TFLOPS)}, expected {expected}"


# training_flops multiplies four given numbers: at most 4 roundings, so its relative error is at
# most gamma_4 = 4u / (1 - 4u) (Higham, Lemma 3.1) against the real product.
GAMMA_4 = 4 * U / (1 - 4 * U)


@pytest.mark.parametrize(
    ("label", "hours", "exact", "printed"),
    [
        ("base", 12, 12 * 3600 * 8 * 9.5e12, "3.3e+18"),  # 43,200 s * 8 * 9.5e12 = 3.2832e18
        ("big", 3.5 * 24, 84 * 3600 * 8 * 9.5e12, "2.3e+19"),  # 302,400 s * 8 * 9.5e12 = 2.29824e19
    ],
)
def test_training_cost_reproduces_table2(label: str, hours: float, exact: float, printed: str) -> None:
    expected = {"base": 3.2832e18, "big": 2.29824e19}[label]
    assert exact == expected  # the hand product above is exact in binary64 (odd parts < 2^53)
    got = training_flops(hours, 8, "P100")
    assert abs(got - expected) <= GAMMA_4 * expected, f"{label}: {got!r} FLOPs, expected {expected!r}"
    assert f"{got:.1e}" == printed, f"{label}: {got:.1e} does not print as Table 2's {printed}"


def test_paper_training_facts() -> None:
    """§5.2: base 100,000 steps at about 0.4 s = 11.1 h (printed 12 h); big 300,000 steps at 1.0 s
    = 83.3 h (printed 3.5 days = 84 h). "About 0.4" carries +-0.05 s: 9.7..12.5 h contains 12;
    "1.0" carries +-0.05 s: 79.2..87.5 h contains 84."""
    base, big = PAPER_TRAINING["base"], PAPER_TRAINING["big"]
    assert (base.gpu, base.num_gpus, base.hours, base.steps) == ("P100", 8, 12.0, 100_000)
    assert (big.gpu, big.num_gpus, big.hours, big.steps) == ("P100", 8, 84.0, 300_000)
    assert (base.printed_cost_flops, big.printed_cost_flops) == (3.3e18, 2.3e19)
    for run in (base, big):
        low, high = run.steps * (run.seconds_per_step - 0.05) / 3600, run.steps * (run.seconds_per_step + 0.05) / 3600
        assert low <= run.hours <= high, f"{run}: {run.hours} h outside steps x s/step = {low:.1f}..{high:.1f} h"


@pytest.mark.parametrize(
    ("args", "error", "pattern"),
    [
        ((12, 8, "V100"), ValueError, "gpu.*P100"),
        ((0, 8, "P100"), ValueError, "hours"),
        ((-1.0, 8, "P100"), ValueError, "hours"),
        ((math.nan, 8, "P100"), ValueError, "hours"),
        (("12", 8, "P100"), TypeError, "hours"),
        ((12, 0, "P100"), ValueError, "num_gpus"),
        ((12, 8.0, "P100"), TypeError, "num_gpus"),
    ],
)
def test_bad_training_cost_arguments_are_named(args: tuple, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        training_flops(*args)


# ---------------------------------------------------------------------------------------------
# Training FLOPs: the closed form against PyTorch's flop counter on the real model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        dict(n_layers=2, d_model=32, d_ff=64, num_heads=4),
        dict(n_layers=1, d_model=24, d_ff=40, num_heads=2, d_k=8, d_v=16),
    ],
)
def test_forward_flops_equal_the_flop_counter_on_the_trained_model(cfg: dict) -> None:
    """forward_flops (closed form, reference/counts.py) equals torch.utils.flop_counter's count of the training
    model's forward pass run on meta tensors (where SDPA decomposes into its two batched products): an
    independent count of the same matrix products, exactly. training_step_flops is three of them."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from aiayn.reference.counts import forward_flops, training_step_flops
    from aiayn.reproductions.translation.model import Transformer

    config = TransformerConfig(**cfg, p_drop=0.0)
    model = Transformer(config, 50, max_positions=64).eval().to("meta")
    b, n_src, n_tgt = 3, 7, 5
    src, tgt = (torch.zeros(b, n, dtype=torch.long, device="meta") for n in (n_src, n_tgt))
    with FlopCounterMode(display=False) as counter:
        model(src, torch.full((b,), n_src, device="meta"), tgt)
    assert forward_flops(config, 50, b, n_src, n_tgt) == counter.get_total_flops()
    assert training_step_flops(config, 50, b, n_src, n_tgt) == 3 * counter.get_total_flops()
    with pytest.raises(ValueError, match="n_src"):
        forward_flops(config, 50, b, 0, n_tgt)
