"""The conformance suite: does an implementation compute "Attention Is All You Need", equation by equation?

Run it::

    aiayn check numpy                                     # a built-in (aiayn list shows them)
    aiayn check mypkg.attention:Mine --dtype float32      # your own (aiayn.implementations.protocol)
    aiayn check mypkg.attention:Mine --report out/        # + conformance-<name>.md/.json
    aiayn replay ~/.cache/aiayn/failures/<file>.npz       # rerun one failed check
    pytest --pyargs aiayn.conformance --impl mypkg.attention:Mine   # the same suite under plain pytest

or pull it into your own test run (as ONNX's backend tests are included by a backend)::

    # tests/test_aiayn_conformance.py
    from aiayn.conformance import suite
    globals().update(suite("mypkg.attention:Mine"))

For every equation an implementation provides, in every dtype it declares, Hypothesis draws
float64 inputs, the implementation's own ``from_numpy`` rounds them to the dtype, and the oracle
(``aiayn.reference``) runs on exactly those rounded values. The difference must stay within a
budget derived by forward error analysis for that equation from the actual magnitudes
(``budgets/forward.py`` for single equations, ``budgets/composites/forward.py`` for the composites); there is no global
tolerance. Metamorphic relations (shift invariance, permutations, masked = removed keys, poison
at masked positions, causality, independence of batch elements and heads, PE's shift matrix, the
shape of the learning-rate schedule, the minimum of the smoothed loss) and hygiene (inputs
untouched, declared shape/dtype/device, determinism, no stray NaN) are checked alongside.

Layout, by the kind of knowledge each folder holds (one file a pass where a pass has its own):
``test_*.py`` one module per paper section (thin: draw inputs, call a check); ``checks/`` the checks, registered by
name so that a saved failure can be replayed; ``equations.py`` one record per equation (its oracle, budget, checks
and departures); ``budgets/`` how far a computed value may be (forward, backward, decoding; ``composites/`` the
layers' and the model's); ``diagnoses/`` the known departures a failure is matched against; ``inputs/`` strategies,
fixed inputs and the Hypothesis profiles; ``run/`` calling an implementation (harness, process boundary, time
limits, gradients, declarations) and the pytest plugin; ``report/`` results, report rows and coverage;
``studies/`` the suite on implementations with known answers (mutants, an honest low-precision implementation,
false alarms, PyTorch's tolerances, the zoo); ``numerics.py`` unit roundoffs and rounding; ``replay.py`` rerunning
a saved failure.

Importing this package imports nothing else (the pytest plugin loads it in every pytest run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["TEST_MODULES", "suite"]

#: The suite's test modules, one per paper section.
TEST_MODULES = (
    "test_contract",
    "test_attention",
    "test_positional",
    "test_layers",
    "test_training",
    "test_model",
    "test_decoding",
    "test_fixed",
)


def suite(impl: str | Sequence[str], *, dtypes: Sequence[str] | None = None) -> dict[str, Any]:
    """The suite's tests for ``impl``, to put into a test module of your own: ``globals().update(suite(SPEC))``.

    ``impl`` is what ``--impl`` takes (a built-in or entry-point name, or ``module:attr``), or a
    list of them; ``dtypes`` limits the dtypes checked (default: every dtype the implementation
    declares). The tests run with aiayn's own Hypothesis settings (``--aiayn-profile`` or
    ``$AIAYN_PROFILE``); the Hypothesis profile of your other tests is not touched. An
    implementation that cannot be loaded fails the contract test with the reason.
    """
    import importlib

    tests: dict[str, Any] = {}
    for name in TEST_MODULES:
        module = importlib.import_module(f"aiayn.conformance.{name}")
        tests.update(
            {
                key: value
                for key, value in vars(module).items()
                if key.startswith("test_") and isinstance(value, Callable)
            }
        )
    tests["AIAYN_IMPL"] = [impl] if isinstance(impl, str) else list(impl)
    if dtypes is not None:
        tests["AIAYN_DTYPES"] = list(dtypes)
    return tests
