"""Example implementations outside the registry, meant to be copied.

:mod:`aiayn.implementations.examples.my_attention` shows the smallest useful third-party
implementation; load it with ``aiayn.implementations.load("aiayn.implementations.examples.my_attention:MyAttention")``.
"""
