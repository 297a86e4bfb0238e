"""Checks for the composites of §3.1: the encoder layer, the decoder layer and the full forward pass (Figure 1).

The oracle is ``aiayn.reference.model`` with the implementation's declared LayerNorm eps; the weights are
canonical (``aiayn.reference.model.init_params``), rounded to the dtype like every other input. The
budgets are first order: each stage's local bound times the condition of the rest of the network
(``conformance/budgets/composites/forward.py``; for the gradients, the forward and backward stages together,
``conformance/budgets/composites/backward.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.conformance.checks._common import agreement, agreement_check, gradient_check
from aiayn.conformance.equations import record
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check

encoder_layer = agreement_check("encoder_layer")
decoder_layer = agreement_check("decoder_layer")
encoder_layer_gradients = gradient_check("encoder_layer")
decoder_layer_gradients = gradient_check("decoder_layer")
transformer_forward_gradients = gradient_check("transformer_forward")


@check(
    "decoder_layer",
    kind="property",
    violates="the decoder's self-attention at position i sees only positions j <= i (§3.2.3)",
)
def decoder_output_at_i_ignores_decoder_inputs_after_i(
    case: Case, y: np.ndarray, memory: np.ndarray, params: dict[str, Any], num_heads: int, upto: int, y2: np.ndarray
) -> None:
    """With the default self-mask (causal, §3.2.3), the output at i ignores decoder inputs at j > i.

    y2 equals y at positions <= ``upto`` and differs after it; outputs <= upto must agree within
    the two calls' budgets.
    """
    got, _, budget = agreement(
        case, y=y, memory=memory, params=params, num_heads=num_heads, self_mask=None, memory_mask=None
    )
    got2, _, budget2 = agreement(
        case, y=y2, memory=memory, params=params, num_heads=num_heads, self_mask=None, memory_mask=None
    )
    rows = slice(0, upto + 1)
    compare(
        case,
        got2[..., rows, :],
        got[..., rows, :],
        budget[..., rows, :] + budget2[..., rows, :],
        what=f"decoder self-attention sees the future: changing positions > {upto} changed outputs <= {upto}",
        expected_name="the call before the change",
    )


transformer_forward = agreement_check("transformer_forward")


@check(
    "transformer_forward",
    kind="property",
    violates="the model's logits at position i depend only on target positions j <= i (§3.2.3)",
)
def transformer_logits_at_i_ignore_target_tokens_after_i(
    case: Case, src: np.ndarray, tgt: np.ndarray, params: dict[str, Any], num_heads: int, upto: int, tgt2: np.ndarray
) -> None:
    """The logits at target position i ignore the target tokens at j > i (the decoder is causal, §3.1)."""
    got, _, budget = agreement(
        case, src=src, tgt=tgt, params=params, num_heads=num_heads, src_lengths=None, tgt_lengths=None
    )
    got2, _, budget2 = agreement(
        case, src=src, tgt=tgt2, params=params, num_heads=num_heads, src_lengths=None, tgt_lengths=None
    )
    rows = slice(0, upto + 1)
    compare(
        case,
        got2[:, rows],
        got[:, rows],
        budget[:, rows] + budget2[:, rows],
        what=f"changing target tokens after position {upto} changed the logits at positions <= {upto}",
        expected_name="the call before the change",
    )


@check(
    "transformer_forward",
    kind="property",
    violates="batch elements are computed independently",
)
def transformer_batch_elements_are_independent(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
    index: int,
) -> None:
    """Batch element ``index`` run alone gives the same logits as inside the batch."""
    got, _, budget = agreement(
        case, src=src, tgt=tgt, params=params, num_heads=num_heads, src_lengths=src_lengths, tgt_lengths=tgt_lengths
    )
    one = slice(index, index + 1)
    got1, _, budget1 = agreement(
        case,
        src=src[one],
        tgt=tgt[one],
        params=params,
        num_heads=num_heads,
        src_lengths=None if src_lengths is None else src_lengths[one],
        tgt_lengths=None if tgt_lengths is None else tgt_lengths[one],
    )
    padded = record("transformer_forward").undefined
    compare(
        case,
        got1,
        got[one],
        budget1 + budget[one],
        what=f"batch element {index} run alone differs from the same element in the batch",
        expected_name="the batched call",
        undefined=padded({"tgt": tgt[one], "tgt_lengths": None if tgt_lengths is None else tgt_lengths[one]}),
    )
