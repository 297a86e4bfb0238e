"""aiayn's oracle: every equation of "Attention Is All You Need" (§3-§5), exact and fast.

Each equation has a fast tier ``<name>`` (NumPy in extended precision, any size, float64 out) and
an exact tier ``<name>_exact`` (mpmath, each result correctly rounded to float64), in the module
of its paper section:

- ``attention``  §3.2.1-3.2.3: softmax, Eq. (1), causal and padding masks, multi-head attention; the backward
  (vector-Jacobian products) of softmax, Eq. (1) and multi-head attention
- ``layers``     §3.1, §3.3, §3.4: LayerNorm and the sub-layer connection, Eq. (2), embeddings; the backward of
  LayerNorm and Eq. (2)
- ``positional`` §3.5: sinusoidal positional encoding and the shift matrix M_k
- ``training``   §5.3, §5.4: Eq. (3)'s learning rate, label smoothing, smoothed cross-entropy
- ``model``      §3.1: encoder layer, decoder layer, the full forward pass (fast tier); their backward (both tiers:
  every input and parameter, the shared embedding receiving the sum of its three uses)
- ``counts``     Tables 1-3, §6.1: configurations, parameter and operation counts, training cost

``reference`` imports nothing else of aiayn.
"""

from aiayn.reference._exact import DEFAULT_DPS, HIGH_DPS
from aiayn.reference.attention import (
    attention_with_lse,
    attention_with_lse_exact,
    causal_mask,
    merge_attention_states,
    merge_attention_states_exact,
    multi_head_attention,
    multi_head_attention_exact,
    multi_head_attention_vjp,
    multi_head_attention_vjp_exact,
    padding_mask,
    paged_attention,
    paged_attention_exact,
    paged_keys,
    scaled_dot_product_attention,
    scaled_dot_product_attention_exact,
    scaled_dot_product_attention_vjp,
    scaled_dot_product_attention_vjp_exact,
    softmax,
    softmax_exact,
    softmax_vjp,
    softmax_vjp_exact,
)
from aiayn.reference.counts import (
    BASE,
    BIG,
    GPU_TFLOPS,
    TABLE3,
    TransformerConfig,
    layer_operations,
    parameter_breakdown,
    parameter_count,
    training_flops,
)
from aiayn.reference.layers import (
    embedding_lookup,
    embedding_lookup_exact,
    feed_forward,
    feed_forward_exact,
    feed_forward_vjp,
    feed_forward_vjp_exact,
    layer_norm,
    layer_norm_exact,
    layer_norm_vjp,
    layer_norm_vjp_exact,
    output_logits,
    output_logits_exact,
    sublayer_connection,
    sublayer_connection_exact,
)
from aiayn.reference.model import (
    decoder_layer,
    decoder_layer_vjp,
    decoder_layer_vjp_exact,
    encoder_layer,
    encoder_layer_vjp,
    encoder_layer_vjp_exact,
    flatten_params,
    init_params,
    transformer_forward,
    transformer_forward_vjp,
    transformer_forward_vjp_exact,
)
from aiayn.reference.positional import (
    pe_shift_matrix,
    pe_shift_matrix_exact,
    positional_encoding,
    positional_encoding_exact,
)
from aiayn.reference.training import (
    cross_entropy,
    cross_entropy_exact,
    label_smoothing,
    label_smoothing_exact,
    lrate,
    lrate_exact,
    smoothed_cross_entropy,
    smoothed_cross_entropy_exact,
    smoothed_cross_entropy_vjp,
    smoothed_cross_entropy_vjp_exact,
    smoothed_target_entropy,
    smoothed_target_entropy_exact,
)

__all__ = [
    "BASE",
    "BIG",
    "DEFAULT_DPS",
    "GPU_TFLOPS",
    "HIGH_DPS",
    "TABLE3",
    "TransformerConfig",
    "attention_with_lse",
    "attention_with_lse_exact",
    "causal_mask",
    "cross_entropy",
    "cross_entropy_exact",
    "decoder_layer",
    "decoder_layer_vjp",
    "decoder_layer_vjp_exact",
    "embedding_lookup",
    "embedding_lookup_exact",
    "encoder_layer",
    "encoder_layer_vjp",
    "encoder_layer_vjp_exact",
    "feed_forward",
    "feed_forward_exact",
    "feed_forward_vjp",
    "feed_forward_vjp_exact",
    "flatten_params",
    "init_params",
    "label_smoothing",
    "label_smoothing_exact",
    "layer_norm",
    "layer_norm_exact",
    "layer_norm_vjp",
    "layer_norm_vjp_exact",
    "layer_operations",
    "lrate",
    "lrate_exact",
    "merge_attention_states",
    "merge_attention_states_exact",
    "multi_head_attention",
    "multi_head_attention_exact",
    "multi_head_attention_vjp",
    "multi_head_attention_vjp_exact",
    "output_logits",
    "output_logits_exact",
    "padding_mask",
    "paged_attention",
    "paged_attention_exact",
    "paged_keys",
    "parameter_breakdown",
    "parameter_count",
    "pe_shift_matrix",
    "pe_shift_matrix_exact",
    "positional_encoding",
    "positional_encoding_exact",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_exact",
    "scaled_dot_product_attention_vjp",
    "scaled_dot_product_attention_vjp_exact",
    "smoothed_cross_entropy",
    "smoothed_cross_entropy_exact",
    "smoothed_cross_entropy_vjp",
    "smoothed_cross_entropy_vjp_exact",
    "smoothed_target_entropy",
    "smoothed_target_entropy_exact",
    "softmax",
    "softmax_exact",
    "softmax_vjp",
    "softmax_vjp_exact",
    "sublayer_connection",
    "sublayer_connection_exact",
    "training_flops",
    "transformer_forward",
    "transformer_forward_vjp",
    "transformer_forward_vjp_exact",
]
