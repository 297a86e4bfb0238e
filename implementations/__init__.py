"""Implementations of the paper's equations, and the contract aiayn checks them against.

- :mod:`aiayn.implementations.protocol`: the plug-in contract (:class:`Implementation`, the dtype and
  equation names, declared policies, :class:`ImplementationBase`).
- :mod:`aiayn.implementations.registry`: :func:`load` an implementation by built-in name
  (``"numpy"``, ``"numpy-blocked"``, ``"torch"``, ``"torch-sdpa"``, ``"torch-nn"``), by entry
  point (group ``"aiayn.implementations"``) or as ``"module:attr"``; :func:`known_names`.
- Built-ins: :mod:`aiayn.implementations.numpy_impl`, :mod:`aiayn.implementations.torch_impl`,
  :mod:`aiayn.implementations.torch_nn`, each imported only when chosen (importing this package never
  imports torch).
- :mod:`aiayn.implementations.examples.my_attention`: a short third-party implementation to copy.

Example::

    from aiayn.implementations import load
    impl = load("numpy")
    q = impl.from_numpy(np.ones((4, 8)), "float32")
    out = impl.to_numpy(impl.scaled_dot_product_attention(q, q, q))
"""

from aiayn.implementations.protocol import (
    ARRAY_DTYPES,
    DEFAULT_POLICIES,
    DTYPES,
    EQUATIONS,
    INDEX_DTYPE,
    MASK_DTYPE,
    POLICY_CHOICES,
    CompleteImplementation,
    Implementation,
    ImplementationBase,
    contract_problems,
    provided_equations,
)
from aiayn.implementations.registry import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    ImplementationNotFound,
    InvalidImplementation,
    known_names,
    load,
)

__all__ = [
    "ARRAY_DTYPES",
    "BUILTINS",
    "DEFAULT_POLICIES",
    "DTYPES",
    "ENTRY_POINT_GROUP",
    "EQUATIONS",
    "INDEX_DTYPE",
    "MASK_DTYPE",
    "POLICY_CHOICES",
    "CompleteImplementation",
    "Implementation",
    "ImplementationBase",
    "ImplementationNotFound",
    "InvalidImplementation",
    "contract_problems",
    "known_names",
    "load",
    "provided_equations",
]
