"""pytest configuration of the conformance suite: options, Hypothesis profiles, the plugin's hooks.

Run ``pytest conformance`` (every available built-in), ``pytest conformance --impl numpy``,
``pytest conformance --impl my_package.module:MyImplementation --dtype float32``, and add
``--aiayn-report DIR`` for the Markdown/JSON report. See ``conformance/plugin.py``.

Hypothesis profiles (select with HYPOTHESIS_PROFILE=<name> or --hypothesis-profile=<name>;
default ``dev``), the same names and settings as tests/conftest.py:
- ``dev``: random, a modest number of examples;
- ``ci``: derandomized (the same examples every run);
- ``thorough``: many examples, for a long local run.
Deadlines stay off in every profile: these machines are shared and noisy.

``AIAYN_FIND_ONLY=1`` (set by the mutant meta-test, ``conformance/mutants.py``) keeps a profile's
example generation but skips shrinking and the example database: it only asks whether a failure
is found.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

from conformance.checks import load_all
from conformance.plugin import (  # noqa: F401  (pytest finds hooks by name in this module)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_report_header,
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("AIAYN_FIND_ONLY"):
    _COMMON.update(phases=(Phase.explicit, Phase.generate), database=None)
settings.register_profile("dev", max_examples=40, **_COMMON)
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

load_all()
