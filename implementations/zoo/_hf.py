"""What the Hugging Face adapters share: the contract's mask as transformers prepares it."""

from __future__ import annotations

from typing import Any

import torch
from transformers.masking_utils import create_bidirectional_mask

from aiayn.implementations.torch_kit import attention_mask

__all__ = ["hf_mask"]


def hf_mask(
    config: Any, mask: torch.Tensor | None, batch: tuple[int, ...], q: torch.Tensor, kv: torch.Tensor | None = None
) -> Any:
    """The contract's mask (broadcastable to batch + (n_q, n_k)) as transformers prepares it for ``config``'s
    attention."""
    if mask is None:
        return None
    full = attention_mask(mask, batch, q.shape[-2], (q if kv is None else kv).shape[-2], kind="allow")  # (B, n_q, n_k)
    return create_bidirectional_mask(
        config=config,
        inputs_embeds=q,
        attention_mask=None,
        encoder_hidden_states=kv,
        and_mask_function=lambda b, h, i, j: full[b, i, j],
    )
