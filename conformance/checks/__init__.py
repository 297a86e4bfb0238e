"""The checks of the conformance suite, one module per paper section, registered by name.

Each check is ``check(impl, dtype, **args)`` (see :func:`aiayn.conformance.run.harness.check`): the test
modules draw the arguments with Hypothesis, and ``aiayn replay`` calls the same
function with the arguments saved from a failure. :func:`load_all` imports every section so that
:data:`aiayn.conformance.run.harness.CHECKS` is complete.
"""

from __future__ import annotations

import importlib

MODULES = (
    "attention",
    "positional",
    "layers",
    "training",
    "model",
    "decoding",
    "invariance",
    "split",
    "canaries",
    "contract",
)


def load_all() -> None:
    """Import every check module (registering its checks)."""
    for name in MODULES:
        importlib.import_module(f"aiayn.conformance.checks.{name}")
