"""The directions a check of an equation runs in, named once (a report has one row per equation, dtype and
direction).

A :class:`Direction` is a ``str`` (its value), so that results cross between processes and into the reports' JSON
as the plain names they always had, and compare equal to them.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["BACKWARD", "DECODE", "DIRECTIONS", "Direction", "FORWARD"]


class Direction(str, Enum):
    """Which pass of an equation a check reads."""

    FORWARD = "forward"  # the equation's value, against the oracle
    BACKWARD = "backward"  # its gradients, against the oracle's VJP
    DECODE = "decode"  # decoding with the whole model: cached steps, a reordered cache, beam search (§3.2.3, §6.1)

    __str__ = str.__str__
    __format__ = str.__format__


FORWARD, BACKWARD, DECODE = Direction.FORWARD, Direction.BACKWARD, Direction.DECODE

#: Every direction, in the order of a report's rows.
DIRECTIONS: tuple[Direction, ...] = tuple(Direction)
