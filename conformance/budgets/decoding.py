"""Budgets of decoding (§6.1): how far a beam search's log-probabilities and scores may be from the oracle's.

A cached decode step is checked against the whole model's forward budget at the same positions
(``budgets.composites.forward.transformer_forward``): a step computes the same function of the same prefix, only with
other shapes of products, and that bound holds for any order of the sums. What a beam search adds is log-softmax, a
running sum over steps, and a division by the length penalty. With the logits z of a step within beta (elementwise, the
forward budget, both the implementation's and the oracle's share) and log-softmax computed in precision u as
d_v = z_v - max z, lp_v = d_v - log sum_j exp(d_j):

- the exact log-softmax moves by at most |delta z_v| + max_j |delta z_j| <= 2 max beta (its gradient's rows are
  e_v - softmax, of 1-norm at most 2);
- rounding: d_v errs by u |d_v|; each exp by t (``Precision.t``, a few ulps) plus the error of its argument,
  u |d_j| relative; their sum (each term in (0, 1], the largest exactly 1) by gamma_{V-1} relative; log of a sum
  S in [1, V] errs by the sum's relative error plus t log V; the last subtraction by u |lp_v|. In all
  u (|d_v| + max_j |d_j| + |lp_v|) + gamma_{V-1} + t (1 + log V), first order.

The per-step bound :func:`step_error` is the largest over the step's rows and tokens. A hypothesis of t steps sums t
such log-probabilities, each within its step's bound, and the running sum (t additions of non-positive terms) errs
by gamma_t |log P|; its score log P / lp(|Y|) adds u |score| for the division (lp itself is a power of a small
rational, computed to within t relative, which moves the score by t |score|). :func:`accumulated` forms that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aiayn.conformance.numerics import Precision, gamma


def step_error(logits: np.ndarray, beta: np.ndarray, p: Precision | Sequence[Precision]) -> float:
    """The most any log-probability of a step may differ from the oracle's: logits (n, V) the oracle's for the step's
    rows, beta (n, V) their budget (both shares), ``p`` the implementation's precision (or [its, float64's]: the
    rounding terms of each, the oracle's own log-softmax being float64's). Formulas in the module docstring."""
    z = np.asarray(logits, dtype=np.float64)
    vocab = z.shape[-1]
    d = z - z.max(axis=-1, keepdims=True)  # (n, V), <= 0
    lp = d - np.log(np.sum(np.exp(d), axis=-1, keepdims=True))
    moved = 2.0 * float(np.max(beta))
    rounding = 0.0
    for q in [p] if isinstance(p, Precision) else p:
        rounding += float(
            np.max(q.op * (np.abs(d) + np.max(np.abs(d), axis=-1, keepdims=True) + np.abs(lp)))
            + gamma(vocab - 1, q.op)
            + q.t * (1.0 + np.log(vocab))
        )
    return moved + rounding


def accumulated(steps: Sequence[float], log_prob: float, p: Precision | Sequence[Precision]) -> float:
    """The bound on an accumulated log-probability of len(``steps``) steps (``steps`` each step's :func:`step_error`),
    with |log P| = ``|log_prob|`` summed in precision ``p``, plus what the division by lp adds to a score: the
    result bounds |score - score'| times lp, so a :class:`~aiayn.reference.decoding.Decision` divides it by lp."""
    t = len(steps)
    total = float(np.sum(steps))
    for q in [p] if isinstance(p, Precision) else p:
        total += (gamma(t, q.op) + q.op + q.t) * abs(log_prob)
    return total
