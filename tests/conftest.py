"""Test configuration for aiayn's own tests (the oracle, the registry, the reports).

Hypothesis profiles (select with HYPOTHESIS_PROFILE=<name>; default ``dev``):
- ``dev``: the default, random, a modest number of examples;
- ``ci``: derandomized (the same examples every run), used by ``.ci/run``;
- ``thorough``: many examples, for a long local run.
Deadlines stay off in every profile: these machines are shared and noisy.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=40, **_COMMON)
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
