"""The decoding part of the contract (``implementations/protocol.py``, "Decoding"): the choices of §6.1's beam search
that an implementation declares in ``policies["beam_search"]``, and their check.

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6 [38] ... maximum output length ... input
length + 50, but terminate early when possible." What it leaves open is below; the oracle
(``aiayn.reference.decoding``) takes each choice as a parameter of the same name and names the toolkits that make
each (``TOOLKITS``, read in their sources).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

#: The choices of §6.1's beam search that the paper leaves open (``policies["beam_search"]``; the oracle,
#: ``aiayn.reference.decoding``, takes each as a parameter of the same name, and names the toolkits that make each):
#:
#: - ``"eos_rank"`` — a candidate ending in EOS finishes when it ranks among the best ``"2k"`` candidates of its step
#:   (tensor2tensor) or among the best ``"k"`` (fairseq, Hugging Face); the best k that do not end in EOS stay alive;
#: - ``"early_stop"`` — ``"bound"`` (stop when the k-th best finished score beats the best alive log-probability over
#:   lp(maximum length): no alive hypothesis can still win; tensor2tensor), ``"full"`` (stop once k hypotheses have
#:   finished; fairseq, Hugging Face ``early_stopping=True``) or ``"none"`` (run to the maximum length);
#: - ``"at_max_length"`` — hypotheses alive at the maximum length are ``"dropped"`` when any finished (tensor2tensor)
#:   or ``"finished"`` as they stand (Hugging Face, OpenNMT-py);
#: - ``"length_counts"`` — |Y| counts the generated tokens with the final EOS (``"eos"``) or also the start symbol
#:   (``"bos_eos"``, OpenNMT-py).
BEAM_POLICY_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "eos_rank": ("2k", "k"),
        "early_stop": ("bound", "full", "none"),
        "at_max_length": ("dropped", "finished"),
        "length_counts": ("eos", "bos_eos"),
    }
)

#: tensor2tensor's choices, the code the paper's authors released.
DEFAULT_BEAM_POLICIES: Mapping[str, str] = MappingProxyType(
    {"eos_rank": "2k", "early_stop": "bound", "at_max_length": "dropped", "length_counts": "eos"}
)


def beam_policies(policies: Any) -> dict[str, str]:
    """The beam-search choices an implementation's ``policies`` declare, the defaults filled in; ValueError naming what
    is wrong with a declaration."""
    declared = policies.get("beam_search", {}) if isinstance(policies, Mapping) else {}
    if not isinstance(declared, Mapping):
        raise ValueError(
            f"policies['beam_search']: expected a mapping of {dict(BEAM_POLICY_CHOICES)}, got {declared!r}"
        )
    for key, value in declared.items():
        if key not in BEAM_POLICY_CHOICES:
            raise ValueError(f"policies['beam_search']: {key!r} is not one of {tuple(BEAM_POLICY_CHOICES)}")
        if value not in BEAM_POLICY_CHOICES[key]:
            raise ValueError(
                f"policies['beam_search'][{key!r}]: expected one of {BEAM_POLICY_CHOICES[key]}, got {value!r}"
            )
    return {**DEFAULT_BEAM_POLICIES, **declared}
