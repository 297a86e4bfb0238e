"""The backward of Eq. (1) as a benchmark times it: dQ, dK, dV from a cotangent dO of the output.

An implementation's gradients come from where the conformance suite takes them (``conformance/run/gradients.py``,
documented for authors in ``implementations/protocol.py``), in the same order:

1. its own ``vjp("scaled_dot_product_attention", [q, k, v, mask], d_out)``: the backward is that call (it
   recomputes whatever it needs from its arguments, as a FlashAttention backward recomputes the scores);
2. ``torch.Tensor`` arrays: autograd. The forward runs untimed in each round's setup with q, k, v as leaves;
   the backward is ``torch.autograd.grad(out, (q, k, v), d_out)``;
3. ``jax.Array`` arrays: ``jax.vjp``. The setup runs the forward and keeps the pullback; the backward is the
   pullback applied to ``d_out``.

Anything else has no backward to time: :class:`NoBackward`, and the case is skipped with the reason.
``forward+backward`` times both in one call, as a training step runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiayn.benchmarks import measure as M

__all__ = ["NoBackward", "Passes", "passes_of"]

EQUATION = "scaled_dot_product_attention"


class NoBackward(Exception):
    """The implementation gives no gradient of Eq. (1) (the message says why)."""


@dataclass(frozen=True)
class Passes:
    """The calls a case times: ``setup()`` (untimed, before each round) returns the state ``backward(state)`` needs;
    ``forward_backward()`` runs both passes; ``source`` says where the gradients come from."""

    setup: Callable[[], Any]
    backward: Callable[[Any], Any]
    forward_backward: Callable[[], Any]
    source: str


def _ready(result: Any) -> Any:
    """Wait for asynchronous work in ``result`` (a tuple or mapping of gradients, or one array) to finish."""
    values = result.values() if isinstance(result, dict) else result if isinstance(result, (tuple, list)) else [result]
    for value in values:
        block = getattr(value, "block_until_ready", None)
        if callable(block):
            block()
        else:
            M.sync(value)
    return result


def passes_of(impl: Any, q: Any, k: Any, v: Any, mask: Any, d_out: Any) -> Passes:
    """The backward and forward+backward calls of ``impl`` on these native arrays; :class:`NoBackward` if none."""
    forward = getattr(impl, EQUATION)
    own = getattr(impl, "vjp", None)
    if callable(own):

        def vjp(_: Any = None) -> Any:
            return _ready(own(EQUATION, [q, k, v, mask], d_out))

        try:
            vjp()
        except NotImplementedError as exc:
            raise NoBackward(f"{impl.name}.vjp raises NotImplementedError for Eq. (1): {exc}") from None
        return Passes(
            setup=lambda: None,
            backward=vjp,
            forward_backward=lambda: (M.sync(forward(q, k, v, mask)), vjp()),
            source=f"{impl.name}.vjp",
        )
    library = M.library_of(q)
    if library == "torch":
        import torch

        def leaves() -> tuple[Any, Any, Any, Any]:
            q_, k_, v_ = (x.detach().requires_grad_(True) for x in (q, k, v))
            with torch.enable_grad():
                return forward(q_, k_, v_, mask), q_, k_, v_

        out, *_ = leaves()
        if not out.requires_grad:
            raise NoBackward(f"{impl.name}.{EQUATION} returns a result with no autograd graph (no_grad or detached)")

        def backward(state: Any) -> Any:
            out, *inputs = state
            return _ready(torch.autograd.grad(out, inputs, grad_outputs=d_out))

        return Passes(
            setup=leaves, backward=backward, forward_backward=lambda: backward(leaves()), source="torch.autograd"
        )
    if library in ("jax", "jaxlib"):
        import jax

        def pullback() -> Any:
            return jax.vjp(lambda a, b, c: forward(a, b, c, mask), q, k, v)[1]

        def backward(state: Any) -> Any:
            return _ready(state(d_out))

        return Passes(
            setup=pullback, backward=backward, forward_backward=lambda: backward(pullback()), source="jax.vjp"
        )
    raise NoBackward(
        f"{impl.name} has no vjp method and its arrays ({library}) have no autograd the benchmark can use "
        "(torch, jax): not provided"
    )
