"""Optax's Adam (§5.3) as the paper's optimizer step: the ``optax-adam`` zoo adapter.

What is mapped onto what:

- Adam's step (§5.3; Kingma & Ba, Algorithm 1) -> ``optax.adam(learning_rate=lr, b1=beta1, b2=beta2, eps=eps)``
  (``eps_root`` left at its default 0, ``nesterov`` at False). Its ``init(param)`` gives the state optax documents,
  ``ScaleByAdamState(count, mu, nu)`` (``count`` the updates done so far, ``mu`` and ``nu`` the first and second
  moments m_{t-1} and v_{t-1}); ``optax.tree_utils.tree_set`` puts the contract's m and v there and t - 1 in
  ``count``, ``update(grad, state, param)`` makes the t-th update and ``optax.apply_updates(param, updates)`` applies
  it. The new m and v are read back from the new state with ``optax.tree_utils.tree_get``.

Dtypes: float64 (scoped ``jax.enable_x64``, see ``jax_nn``), float32, float16, bfloat16, on the CPU: optax keeps
its moments in the parameters' dtype (``mu_dtype=None``) and computes the step in it.

Declared policy: ``adam_eps`` "outside", Algorithm 1's m_hat / (sqrt(v_hat) + eps): optax documents ``eps`` as "a
small constant applied to denominator outside of the square root (as in the Adam paper)" and its update as
-lr m_hat / (sqrt(v_hat + eps_root) + eps) (https://optax.readthedocs.io/en/latest/api/optimizers.html#optax.adam).
The moments are bias-corrected, as that documentation writes them (the default).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import jax
import jax.numpy as jnp
import optax

from aiayn.implementations.protocol import DEFAULT_POLICIES
from aiayn.implementations.zoo.jax_nn import JaxAdapter, x64_for

__all__ = ["OptaxAdam"]


class OptaxAdam(JaxAdapter):
    """``optax.adam`` (registry name ``"optax-adam"``); see the module docstring."""

    name = "optax-adam"
    version = f"optax {optax.__version__} (jax {jax.__version__})"
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "adam_eps": "outside"})

    def adam_step(
        self,
        param: jax.Array,
        grad: jax.Array,
        m: jax.Array,
        v: jax.Array,
        step: int,
        lr: float,
        betas: tuple[float, float],
        eps: float,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One Adam update t = ``step`` of ``param`` from the moments of the t - 1 updates before it."""
        with x64_for(param):
            optimizer = optax.adam(learning_rate=lr, b1=betas[0], b2=betas[1], eps=eps)
            state = optimizer.init(param)
            count = optax.tree_utils.tree_get(state, "count")  # int32, as optax makes it
            state = optax.tree_utils.tree_set(state, mu=m, nu=v, count=jnp.asarray(step - 1, dtype=count.dtype))
            updates, state = optimizer.update(grad, state, param)
            moments = (optax.tree_utils.tree_get(state, "mu"), optax.tree_utils.tree_get(state, "nu"))
            return optax.apply_updates(param, updates), *moments
