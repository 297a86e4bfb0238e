"""The conformance suite: does an implementation compute "Attention Is All You Need", equation by equation?

Run it::

    pytest conformance                                   # every available built-in
    pytest conformance --impl numpy --dtype float32      # one implementation, one dtype
    pytest conformance --impl my_package.mod:MyImpl      # your own (implementations/protocol.py)
    pytest conformance --impl numpy --aiayn-report reports/   # + conformance-<impl>.md/.json
    python -m conformance.replay .aiayn-cache/failures/<file>.npz   # rerun one failed check

For every equation an implementation provides, in every dtype it declares, Hypothesis draws
float64 inputs, the implementation's own ``from_numpy`` rounds them to the dtype, and the oracle
(``reference/``) runs on exactly those rounded values. The difference must stay within a budget
derived by forward error analysis for that equation from the actual magnitudes (``budgets.py``
for single equations, ``propagation.py`` for the composites); there is no global tolerance.
Metamorphic relations (shift invariance, permutations, masked = removed keys, poison at masked
positions, causality, independence of batch elements and heads, PE's shift matrix, the shape of
the learning-rate schedule, the minimum of the smoothed loss) and hygiene (inputs untouched,
declared shape/dtype/device, determinism, no stray NaN) are checked alongside.

Layout: ``test_*.py`` one module per paper section (thin: draw inputs, call a check);
``checks/`` the checks, registered by name so that a saved failure can be replayed;
``strategies.py`` the input strategies; ``harness.py`` calling an implementation safely, comparing
and failing with a replayable message; ``numerics.py`` unit roundoffs and rounding;
``plugin.py``/``conftest.py`` options, parametrization, header and report; ``report.py`` the
Markdown/JSON report; ``mutants.py`` deliberately broken implementations the suite must catch;
``gpu_check.py`` the prepared script for a CUDA machine.
"""
