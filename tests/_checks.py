"""Run one registered conformance check outside pytest's suite (``CHECKS[name](impl, dtype, **args)``), with the
statistics a test would collect: what the tests of a built-in's paths and of the suite's own checks share."""

from __future__ import annotations

from typing import Any

from aiayn.conformance.checks import load_all
from aiayn.conformance.run.harness import CHECKS, Stats, current_stats

load_all()


def run_check(impl: Any, check: str, dtype: str, **args: Any) -> Stats:
    """Run one registered check (it raises ``ConformanceFailure`` on a disagreement); return what it checked."""
    stats = Stats()
    token = current_stats().set(stats)
    try:
        CHECKS[check](impl, dtype, **args)
    finally:
        current_stats().reset(token)
    return stats
