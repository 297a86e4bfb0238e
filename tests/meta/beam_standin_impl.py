"""A stand-in beam search with two departures at once, for the meta-tests: fairseq's length penalty |Y|^alpha and
fairseq's choice of which EOS candidates finish (among the best k, not 2k) while declaring tensor2tensor's."""

from __future__ import annotations

from typing import Any

from aiayn.implementations.numpy_impl import NumpyImplementation


class PowerPenaltyEosRankK(NumpyImplementation):
    """The NumPy built-in's search with |Y|^alpha and an undeclared ``eos_rank='k'`` (it declares the default, 2k)."""

    name = "beam-power-penalty-eos-rank-k"

    def _length_penalty(self, length: int, alpha: float) -> float:
        return float(length) ** alpha

    def beam_search(self, *args: Any, **kwargs: Any) -> Any:
        declared = self.policies
        self.policies = {**declared, "beam_search": {**declared.get("beam_search", {}), "eos_rank": "k"}}
        try:
            return super().beam_search(*args, **kwargs)
        finally:
            self.policies = declared
