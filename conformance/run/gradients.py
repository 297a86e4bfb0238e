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

from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.conformance.run.autodiff import SHARED, NotProvided, jax_vjp, torch_vjp
from aiayn.conformance.run.boundary import Native, Remote, autograd

__all__ = ["NotProvided", "SHARED", "own_vjp", "vjp"]


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
        return torch_vjp(case, names, natives, d_out)
    if library == "jax":
        return jax_vjp(case, names, natives, d_out)
    raise NotProvided("no vjp method, and its arrays are neither torch tensors nor JAX arrays (no autograd to use)")
