"""How the suite gets an implementation's gradients: its VJP of an equation for a cotangent.

Three sources, tried in this order (``implementations/protocol.py`` documents them for authors):

1. The implementation's own ``vjp(equation, args, d_out)``: ``args`` the equation's native arguments in the method's
   order, ``d_out`` a native cotangent of the result's shape and dtype; it returns a mapping from argument name
   (the equation's argument names, ``conformance/equations.py``; for multi-head attention also the parameter names,
   for a composite each parameter's dotted path in the canonical layout: "self_attn.w_q", "encoder.0.ffn.w1")
   to a native gradient of that argument's shape and dtype. An equation it does not differentiate raises
   ``NotImplementedError``: "not provided".
2. PyTorch: where the native arrays are ``torch.Tensor``, autograd through the equation's method, with no code of
   the implementation's own (every torch built-in and ``torch_kit.TorchAdapter``).
3. JAX: where they are ``jax.Array``, ``jax.vjp`` of the method.

Behind the process boundary (``run/boundary.py``) autograd runs in the implementation's process, where its autodiff
state lives, and the gradients come back as handles. Anything else, a result that carries no autograd graph (a
method run under ``torch.no_grad()`` or detached), and a method JAX cannot trace are "not provided", with the
reason: counted in the report, never a failure. An argument
autograd does not reach (a parameter an adapter copies into a module under ``no_grad``) has its gradient "not
provided" alone, noted in the row. Once the gradients are computed, everything they contain is judged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.conformance.run.boundary import Native, Remote, autograd
from aiayn.reference.model import flatten_params

__all__ = ["NotProvided", "SHARED", "own_vjp", "vjp"]

#: Joins the names of arguments that were one array (self-attention's query, key and value): autograd gives that
#: array one gradient, the sum over its uses, and the suite compares it with the sum of the oracle's.
SHARED = "+"


class NotProvided(Exception):
    """The implementation gives no gradient of this equation (the message says why)."""


def _library(natives: Sequence[Any]) -> str | None:
    for value in natives:
        root = value.library if isinstance(value, Native) else type(value).__module__.split(".", 1)[0]
        if root in ("torch", "jax", "jaxlib"):
            return "jax" if root == "jaxlib" else root
    return None


def own_vjp(impl: Any) -> Any:
    """The implementation's own ``vjp`` method, or None where it has none (its gradients then come from autograd)."""
    own = getattr(impl, "vjp", None)
    return own if callable(own) else None


def vjp(case: Any, names: Sequence[str], natives: Sequence[Any], d_out: Any) -> dict[str, Any]:
    """The implementation's gradients of equation ``case.equation`` at ``natives`` (named ``names``) for the
    cotangent ``d_out``, by argument name (a mapping argument by its keys, a composite's nested layout by dotted
    path: "self_attn.w_q", "encoder.0.ffn.w1"; the names of one array passed under several, joined by
    :data:`SHARED`); raises :class:`NotProvided` where it gives none."""
    __tracebackhide__ = True
    own = own_vjp(case.impl)
    if own is not None:
        what = f"{case.impl.name}.vjp({case.equation!r}, ...)"

        def call() -> Any:
            try:
                return own(case.equation, list(natives), d_out)
            except NotImplementedError as exc:
                return NotProvided(f"{what} raised NotImplementedError{': ' + str(exc) if str(exc) else ''}")

        grads = case.guard(what, call)
        if isinstance(grads, NotProvided):
            raise grads
        if not isinstance(grads, Mapping):
            case.fail(f"{what} returned {type(grads).__name__}, expected a mapping from argument name to gradient")
        return dict(grads)
    library = _library(list(natives) + [d_out])
    if library is not None and isinstance(case.impl, Remote):  # autograd runs where the autodiff state lives
        what = f"{'torch.autograd.grad' if library == 'torch' else 'jax.vjp'} of {case.impl.name}.{case.equation}"
        outcome, got = case.guard(what, autograd, case.impl, library, case.equation, list(names), list(natives), d_out)
        if outcome == "not provided":
            raise NotProvided(str(got))
        if outcome != "gradients" or not isinstance(got, dict):
            case.fail(str(got))
        return got
    if library == "torch":
        return _torch(case, names, natives, d_out)
    if library == "jax":
        return _jax(case, names, natives, d_out)
    raise NotProvided("no vjp method, and its arrays are neither torch tensors nor JAX arrays (no autograd to use)")


def _torch(case: Any, names: Sequence[str], natives: Sequence[Any], d_out: Any) -> dict[str, Any]:
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


def _jax(case: Any, names: Sequence[str], natives: Sequence[Any], d_out: Any) -> dict[str, Any]:
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
