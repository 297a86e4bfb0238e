"""The directions a check of an equation runs in, named once (a report has one row per equation, dtype and
direction), and the checks of decoding, named once (a fixed case, a departure and the record say which they concern).

A :class:`Direction` is a ``str`` (its value), so that results cross between processes and into the reports' JSON
as the plain names they always had, and compare equal to them.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "BACKWARD",
    "BEAM_SEARCH",
    "CACHED_STEPS",
    "DECODE",
    "DIRECTIONS",
    "Direction",
    "FORWARD",
    "REORDERED_CACHE",
    "SPLIT",
]


class Direction(str, Enum):
    """Which pass of an equation a check reads."""

    FORWARD = "forward"  # the equation's value, against the oracle
    BACKWARD = "backward"  # its gradients, against the oracle's VJP
    DECODE = "decode"  # decoding with the whole model: cached steps, a reordered cache, beam search (§3.2.3, §6.1)
    SPLIT = "split keys"  # Eq. (1) over blocks of keys merged by their log-sum-exp (§3.2.1): split-KV

    __str__ = str.__str__
    __format__ = str.__format__


FORWARD, BACKWARD, DECODE, SPLIT = Direction.FORWARD, Direction.BACKWARD, Direction.DECODE, Direction.SPLIT

#: Every direction, in the order of a report's rows.
DIRECTIONS: tuple[Direction, ...] = tuple(Direction)

#: The decoding checks (``checks/decoding.py``; the test of each is ``test_<name>``, ``test_decoding.py``): the cached
#: decoder fed in chunks against the full forward pass, a reordered cache against the reordered prefixes, and beam
#: search against §6.1's.
CACHED_STEPS = "cached_decoding_equals_the_full_forward"
REORDERED_CACHE = "reordered_cache_equals_the_reordered_prefixes"
BEAM_SEARCH = "beam_search_finds_the_oracles_hypothesis"
