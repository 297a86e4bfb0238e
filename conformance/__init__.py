"""The conformance suite: ``pytest conformance --impl NAME`` checks an implementation against the oracle.

The property-based suite is being built (see the conformance issue). What exists today:
``conformance/gpu_check.py``, the prepared script for a CUDA machine.
"""
