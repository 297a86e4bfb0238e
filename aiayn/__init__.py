"""aiayn: the verification and reproduction suite for "Attention Is All You Need" (Vaswani et al., 2017).

One import package; the repository's top-level folders are its subpackages:

- :mod:`aiayn.reference`: the oracle, every equation of §3-§5 exactly (mpmath) and fast (NumPy);
- :mod:`aiayn.implementations`: the plug-in contract, the registry and the built-in implementations;
- :mod:`aiayn.conformance`: the property-based suite (a pytest plugin) that checks an
  implementation against the oracle, equation by equation;
- :mod:`aiayn.reproductions`: the paper's tables and worked numbers, regenerated into reports;
- :mod:`aiayn.benchmarks`: attention throughput as a fraction of the machine's GEMM ceiling;
- on the ground floor, used by every room: :mod:`aiayn.kit` (the report kit) and
  :mod:`aiayn.environment` (where files go, optional extras);
- on top: :mod:`aiayn.cli`, the ``aiayn`` command.

Importing ``aiayn`` imports none of them.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("aiayn")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
