"""Implementations that hang, for the tests of the time limit (``tests/meta/test_hang_once.py``).

Each is the NumPy built-in with one method that sleeps on inputs of more than 3 elements, so that the
suite's checks of that method (and of whatever calls it) hang while every other equation is correct.
"""

from __future__ import annotations

import time

import numpy as np

from aiayn.implementations.numpy_impl import NumpyImplementation


class HangingSoftmax(NumpyImplementation):
    """``softmax`` sleeps an hour on more than 3 elements; every other equation is the NumPy built-in's."""

    name = "hanging-numpy"
    sleep_s = 3600.0

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        if np.size(x) > 3:
            time.sleep(self.sleep_s)
        return super().softmax(x, axis)


class SlowSoftmax(HangingSoftmax):
    """``softmax`` sleeps 30 s on more than 3 elements: past a short limit, yet a test that fails to stop it ends."""

    name = "slow-numpy"
    sleep_s = 30.0
