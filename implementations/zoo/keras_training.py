"""Keras 3's Adam (§5.3) and dropout (§5.4) as the paper's training equations: the ``keras-adam`` zoo adapter.

Backend: as ``keras_mha`` (``KERAS_BACKEND`` set to ``"jax"`` only where the user has not chosen one, before keras
is imported; the version string names the backend in use), and the same array boundary, whose float64 work runs
inside the jax backend's scoped ``jax.enable_x64``.

What is mapped onto what:

- Adam's step (§5.3; Kingma & Ba) -> ``keras.optimizers.Adam(learning_rate=lr, beta_1=beta1, beta_2=beta2,
  epsilon=eps)`` over a ``keras.Variable`` named ``param`` holding the parameter, in its dtype. ``build([variable])``
  makes the optimizer's variables (``optimizer.variables``: the iteration count, the learning rate and, named after
  the parameter, ``param_momentum`` and ``param_velocity``, Adam's m and v); m and v are assigned there and t - 1
  to ``optimizer.iterations`` (the updates done so far), then ``apply_gradients([(grad, variable)])`` makes the
  t-th update. The parameter and the moments are read back from the variables.
- dropout (§5.4) -> ``keras.layers.Dropout(rate=p, seed=seed)`` in x's dtype, called with ``training=True``. Keras
  returns the dropped array only, so the mask is read from a second, fresh layer of the same seed on ones of x's
  shape and dtype: 1 / (1 - p) where it keeps, 0 where it drops. Read from y itself, a kept element would look
  dropped where x is 0 or where x / (1 - p) comes out 0 (the jax backend's XLA flushes subnormal results on the
  CPU). A mask that depended on anything but the seed and the shape would disagree with y, and the suite's
  comparison of y with the oracle given this mask would fail.

Dtypes: as ``keras-mha``: float64, float32, float16, bfloat16 on the jax backend (CPU); float64, float32 otherwise.

Declared policy: ``adam_eps`` "hat". Keras documents ``epsilon`` as '"epsilon hat" in the Kingma and Ba paper (in
the formula just before Section 2.1), not the epsilon in Algorithm 1 of the paper'
(https://keras.io/api/optimizers/adam/): the step is lr sqrt(1 - beta2^t) / (1 - beta1^t) m_t / (sqrt(v_t) + eps),
eps added to the uncorrected sqrt(v_t). Not declared (undocumented, left for the suite): Keras keeps the learning
rate in a variable of ``keras.config.floatx()`` (float32) whatever the parameter's dtype, so a float64 step moves
by a float32 lr; on the jax backend XLA's CPU backend flushes subnormal results to zero (a kept subnormal element of
x comes out 0 in float64, float32 and bfloat16).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Mapping  # noqa: E402
from types import MappingProxyType  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402

from aiayn.implementations.protocol import DEFAULT_POLICIES, ImplementationBase  # noqa: E402
from aiayn.implementations.zoo.keras_mha import KerasMHA, _scoped  # noqa: E402

__all__ = ["KerasAdam"]


class KerasAdam(ImplementationBase):
    """``keras.optimizers.Adam`` and ``keras.layers.Dropout`` (registry name ``"keras-adam"``)."""

    name = "keras-adam"
    version = KerasMHA.version
    device = "cpu"
    dtypes = KerasMHA.dtypes
    policies: Mapping[str, object] = MappingProxyType({**DEFAULT_POLICIES, "adam_eps": "hat"})
    compiles_per_shape = True  # the jax backend compiles its operations for each new input shape
    from_numpy = KerasMHA.from_numpy
    to_numpy = KerasMHA.to_numpy

    def adam_step(
        self, param: Any, grad: Any, m: Any, v: Any, step: int, lr: float, betas: tuple[float, float], eps: float
    ) -> tuple[Any, Any, Any]:
        """One Adam update t = ``step`` of ``param`` from the moments of the t - 1 updates before it."""
        dtype = keras.backend.standardize_dtype(param.dtype)
        with _scoped(dtype):
            variable = keras.Variable(param, dtype=dtype, name="param")
            optimizer = keras.optimizers.Adam(learning_rate=lr, beta_1=betas[0], beta_2=betas[1], epsilon=eps)
            optimizer.build([variable])
            slots = {slot.name: slot for slot in optimizer.variables}
            slots["param_momentum"].assign(m)
            slots["param_velocity"].assign(v)
            optimizer.iterations.assign(step - 1)
            optimizer.apply_gradients([(grad, variable)])
            return variable.value, slots["param_momentum"].value, slots["param_velocity"].value

    def dropout(self, x: Any, p: float, seed: int) -> tuple[Any, Any]:
        """§5.4's dropout of x (any shape) with P_drop = ``p``; returns (y, keep), keep drawn again on ones."""
        dtype = keras.backend.standardize_dtype(x.dtype)
        with _scoped(dtype):
            y, ones = (
                keras.layers.Dropout(rate=p, seed=seed, dtype=dtype)(a, training=True)
                for a in (x, keras.ops.ones_like(x))
            )
            return y, keras.ops.not_equal(ones, 0)
