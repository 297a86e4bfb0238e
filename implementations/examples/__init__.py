"""Example implementations outside the registry, meant to be copied.

:mod:`implementations.examples.my_attention` shows the smallest useful third-party
implementation; load it with ``implementations.load("implementations.examples.my_attention:MyAttention")``.
"""
