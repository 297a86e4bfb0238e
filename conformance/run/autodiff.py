"""Autograd of an equation's method: PyTorch's ``torch.autograd.grad`` and JAX's ``jax.vjp``, for an implementation
without a ``vjp`` of its own (``run/gradients.py`` says which source the suite uses). These run where the autodiff
state lives: in the implementation's process behind the process boundary (``run/boundary.py``, its child), else in
the suite's. ``case`` is what they need of a check: ``impl``, ``equation``, ``call``, ``guard`` and ``fail``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.reference.model import flatten_params

__all__ = ["NotProvided", "SHARED", "jax_vjp", "torch_vjp"]

#: Joins the names of arguments that were one array (self-attention's query, key and value): autograd gives that
#: array one gradient, the sum over its uses, and the suite compares it with the sum of the oracle's.
SHARED = "+"


class NotProvided(Exception):
    """The implementation gives no gradient of this equation (the message says why)."""


def torch_vjp(case: Any, names: Sequence[str], natives: Sequence[Any], d_out: Any) -> dict[str, Any]:
    """Autograd through the method: every floating-point argument (a mapping's entries too) becomes a leaf; an
    argument passed under several names is one leaf, so its gradient is the sum over its uses."""
    __tracebackhide__ = True
    import torch

    leaves: dict[int, Any] = {}

    def lift(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: lift(v) for k, v in value.items()}
        if isinstance(value, list):  # a composite's layers
            return [lift(v) for v in value]
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if id(value) not in leaves:
                leaves[id(value)] = value.detach().clone().requires_grad_(True)
            return leaves[id(value)]
        return value

    lifted = [lift(v) for v in natives]
    with torch.enable_grad():
        out = case.call(case.equation, *lifted)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise NotProvided(
            f"{case.impl.name}.{case.equation} returns a result with no autograd graph "
            "(computed under torch.no_grad() or detached): no gradient to check"
        )
    order = list(leaves.values())
    grads = case.guard(
        f"torch.autograd.grad of {case.impl.name}.{case.equation}",
        lambda: torch.autograd.grad(out, order, grad_outputs=d_out, allow_unused=True),
    )
    # None: autograd does not reach that leaf (a parameter copied into a module under no_grad): not provided
    by_leaf = {id(leaf): g for leaf, g in zip(order, grads) if g is not None}
    uses: dict[int, list[str]] = {}
    for name, value in zip(names, lifted):
        for key, leaf in flatten_params(value).items() if isinstance(value, Mapping) else [(name, value)]:
            if id(leaf) in by_leaf:
                uses.setdefault(id(leaf), []).append(key)
    return {SHARED.join(keys): by_leaf[i] for i, keys in uses.items()}


def jax_vjp(case: Any, names: Sequence[str], natives: Sequence[Any], d_out: Any) -> dict[str, Any]:
    """``jax.vjp`` of the method in its floating-point arguments (masks, ids and sizes held fixed)."""
    __tracebackhide__ = True
    import jax
    import jax.numpy as jnp

    def differentiable(value: Any) -> bool:
        return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.floating)

    positions = [i for i, v in enumerate(natives) if differentiable(v) or isinstance(v, Mapping)]

    def f(*xs: Any) -> Any:
        args = list(natives)
        for i, x in zip(positions, xs):
            args[i] = x
        return getattr(case.impl, case.equation)(*args)

    primals = []
    for i in positions:
        v = natives[i]
        primals.append({k: a for k, a in v.items()} if isinstance(v, Mapping) else v)
    # 64-bit arrays exist only inside JAX's x64 mode, which an adapter may enable around its own call only: the
    # pullback, run after that call returned, needs it too (else its constants are float32: a dtype clash)
    wide = any(str(getattr(a, "dtype", "")) in ("float64", "int64") for a in jax.tree_util.tree_leaves(primals))
    with jax.enable_x64(True) if wide else contextlib.nullcontext():
        try:
            out, pullback = jax.vjp(f, *primals)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as exc:
            raise NotProvided(f"jax.vjp cannot trace {case.impl.name}.{case.equation}: {type(exc).__name__}") from None
        except Exception as exc:
            case.fail(f"jax.vjp of {case.impl.name}.{case.equation} raised {type(exc).__name__}: {exc}")
        cots = case.guard(f"the VJP of {case.impl.name}.{case.equation}", pullback, d_out)
    result: dict[str, Any] = {}
    for i, g in zip(positions, cots):
        if isinstance(g, Mapping):
            result.update(flatten_params(g))
        else:
            result[names[i]] = g
    return result
