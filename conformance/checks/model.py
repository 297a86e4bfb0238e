"""Checks for the composites of §3.1: the encoder layer, the decoder layer and the full forward pass (Figure 1).

The oracle is ``aiayn.reference.model`` with the implementation's declared LayerNorm eps; the weights are
canonical (``aiayn.reference.model.init_params``), rounded to the dtype like every other input. The
budgets are first order: each stage's local bound times the condition of the rest of the network
(``conformance/propagation.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.conformance import propagation as PR
from aiayn.conformance.checks._common import policy, prepare
from aiayn.conformance.harness import Case, Diagnosis, check, compare, floored
from aiayn.conformance.numerics import precision


def _eps(case: Case) -> float:
    return float(policy(case, "layer_norm_eps"))


def _encoder(
    case: Case, x: np.ndarray, params: dict[str, Any], num_heads: int, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.model import encoder_layer as oracle

    eps = _eps(case)
    nat, seen = prepare(case, x=x, params=params)
    native_mask = None if mask is None else case.native(mask)
    got = case.run("encoder_layer", [nat["x"], nat["params"], num_heads, native_mask])
    expected = oracle(seen["x"], seen["params"], num_heads, mask, eps=eps)

    def budget_at(dtype: str) -> np.ndarray:
        return floored(
            PR.encoder_layer(seen["x"], seen["params"], num_heads, mask, eps, [precision(dtype), precision("float64")]),
            dtype,
            expected,
        )

    budget = budget_at(case.arithmetic)
    case.diagnosis = Diagnosis(
        "encoder_layer",
        {
            "x": seen["x"],
            "params": seen["params"],
            "num_heads": num_heads,
            "mask": mask,
            "eps": eps,
            "fully_masked": policy(case, "fully_masked"),
        },
        budget_at,
    )
    return got, expected, budget


@check("encoder_layer", "encoder_layer")
def encoder_layer_agreement(
    case: Case, x: np.ndarray, params: dict[str, Any], num_heads: int, mask: np.ndarray | None
) -> None:
    """LayerNorm(z + FFN(z)), z = LayerNorm(x + MultiHead(x, x, x)) agrees with the oracle."""
    got, expected, budget = _encoder(case, x, params, num_heads, mask)
    compare(case, got, expected, budget, budget_name="first-order bound, propagation.encoder_layer")


def _decoder(
    case: Case,
    y: np.ndarray,
    memory: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.model import decoder_layer as oracle

    eps = _eps(case)
    nat, seen = prepare(case, y=y, memory=memory, params=params)
    masks = [None if m is None else case.native(m) for m in (self_mask, memory_mask)]
    got = case.run("decoder_layer", [nat["y"], nat["memory"], nat["params"], num_heads, *masks])
    expected = oracle(seen["y"], seen["memory"], seen["params"], num_heads, self_mask, memory_mask, eps=eps)

    def budget_at(dtype: str) -> np.ndarray:
        bound = PR.decoder_layer(
            seen["y"],
            seen["memory"],
            seen["params"],
            num_heads,
            self_mask,
            memory_mask,
            eps,
            [precision(dtype), precision("float64")],
        )
        return floored(bound, dtype, expected)

    budget = budget_at(case.arithmetic)
    case.diagnosis = Diagnosis(
        "decoder_layer",
        {
            "y": seen["y"],
            "memory": seen["memory"],
            "params": seen["params"],
            "num_heads": num_heads,
            "self_mask": self_mask,
            "memory_mask": memory_mask,
            "eps": eps,
            "fully_masked": policy(case, "fully_masked"),
        },
        budget_at,
    )
    return got, expected, budget


@check("decoder_layer", "decoder_layer")
def decoder_layer_agreement(
    case: Case,
    y: np.ndarray,
    memory: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
) -> None:
    """Masked self-attention, encoder-decoder attention and FFN, each post-norm, agree with the oracle."""
    got, expected, budget = _decoder(case, y, memory, params, num_heads, self_mask, memory_mask)
    compare(case, got, expected, budget, budget_name="first-order bound, propagation.decoder_layer")


@check(
    "decoder_layer_causal",
    "decoder_layer",
    kind="property",
    violates="the decoder's self-attention at position i sees only positions j <= i (§3.2.3)",
)
def decoder_layer_causal(
    case: Case, y: np.ndarray, memory: np.ndarray, params: dict[str, Any], num_heads: int, upto: int, y2: np.ndarray
) -> None:
    """With the default self-mask (causal, §3.2.3), the output at i ignores decoder inputs at j > i.

    y2 equals y at positions <= ``upto`` and differs after it; outputs <= upto must agree within
    the two calls' budgets.
    """
    got, _, budget = _decoder(case, y, memory, params, num_heads, None, None)
    got2, _, budget2 = _decoder(case, y2, memory, params, num_heads, None, None)
    rows = slice(0, upto + 1)
    compare(
        case,
        got2[..., rows, :],
        got[..., rows, :],
        budget[..., rows, :] + budget2[..., rows, :],
        what=f"decoder self-attention sees the future: changing positions > {upto} changed outputs <= {upto}",
        expected_name="the call before the change",
    )


def _forward(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aiayn.reference.model import transformer_forward as oracle

    eps = _eps(case)
    nat, seen = prepare(case, src=src, tgt=tgt, params=params)
    lengths = [None if n is None else case.native(n) for n in (src_lengths, tgt_lengths)]
    got = case.run("transformer_forward", [nat["src"], nat["tgt"], nat["params"], num_heads, *lengths])
    expected = oracle(src, tgt, seen["params"], num_heads, src_lengths=src_lengths, tgt_lengths=tgt_lengths, eps=eps)

    def budget_at(dtype: str) -> np.ndarray:
        bound = PR.transformer_forward(
            src, tgt, seen["params"], num_heads, src_lengths, tgt_lengths, eps, [precision(dtype), precision("float64")]
        )
        return floored(bound, dtype, expected)

    budget = budget_at(case.arithmetic)
    case.diagnosis = Diagnosis(
        "transformer_forward",
        {
            "src": src,
            "tgt": tgt,
            "params": seen["params"],
            "num_heads": num_heads,
            "src_lengths": src_lengths,
            "tgt_lengths": tgt_lengths,
            "eps": eps,
            "fully_masked": policy(case, "fully_masked"),
        },
        budget_at,
    )
    return got, expected, budget


@check("transformer_forward", "transformer_forward")
def forward_agreement(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
) -> None:
    """Token ids to logits (shared embedding x sqrt(d_model) + PE, N post-norm layers each side, E^T) agree with the oracle."""
    got, expected, budget = _forward(case, src, tgt, params, num_heads, src_lengths, tgt_lengths)
    compare(case, got, expected, budget, budget_name="first-order bound, propagation.transformer_forward")


@check(
    "transformer_forward_causal",
    "transformer_forward",
    kind="property",
    violates="the model's logits at position i depend only on target positions j <= i (§3.2.3)",
)
def forward_causal(
    case: Case, src: np.ndarray, tgt: np.ndarray, params: dict[str, Any], num_heads: int, upto: int, tgt2: np.ndarray
) -> None:
    """The logits at target position i ignore the target tokens at j > i (the decoder is causal, §3.1)."""
    got, _, budget = _forward(case, src, tgt, params, num_heads, None, None)
    got2, _, budget2 = _forward(case, src, tgt2, params, num_heads, None, None)
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
    "transformer_forward_batch_independent",
    "transformer_forward",
    kind="property",
    violates="batch elements are computed independently",
)
def forward_batch_independent(
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
    got, _, budget = _forward(case, src, tgt, params, num_heads, src_lengths, tgt_lengths)
    one = slice(index, index + 1)
    got1, _, budget1 = _forward(
        case,
        src[one],
        tgt[one],
        params,
        num_heads,
        None if src_lengths is None else src_lengths[one],
        None if tgt_lengths is None else tgt_lengths[one],
    )
    compare(
        case,
        got1,
        got[one],
        budget1 + budget[one],
        what=f"batch element {index} run alone differs from the same element in the batch",
        expected_name="the batched call",
    )
