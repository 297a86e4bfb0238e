"""Training, §5.3, §5.4 and §6.1: the learning-rate schedule (Eq. 3), Adam's step, label smoothing, the (smoothed)
cross-entropy and its minimum, residual dropout given its mask, checkpoint averaging.

Each function is encoded twice:

- the fast tier computes in ``np.longdouble`` (unit roundoff 2^-64) and rounds once to float64;
- the exact tier evaluates the same formula in mpmath through
  ``aiayn.reference._exact.correctly_rounded`` (correctly rounded float64).

K is the number of classes (the vocabulary size); ``...`` is any number of batch dimensions.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import as_float_array, choice, positive_int, same_size
from aiayn.reference._exact import DEFAULT_DPS, correctly_rounded, to_mp

LD = np.longdouble
STEP_ZERO_POLICIES = ("zero", "raise", "one")
SMOOTHING_VARIANTS = ("K", "K-1")
# Any difference of two float64 values is exact in this many bits (2^1024 down to 2^-1074).
DIFF_PREC = 2200


def _integer_array(name: str, value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: expected {what} (an integer or integer array), got dtype {arr.dtype}")
    return arr


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


# --------------------------------------------------------------------------------------------
# the learning rate, §5.3, Eq. (3)


def _validate_lrate(step: Any, d_model: Any, warmup_steps: Any, step_zero: str) -> tuple[np.ndarray, int, int]:
    choice("step_zero", step_zero, STEP_ZERO_POLICIES)
    steps = _integer_array("step", step, "training step numbers")
    if np.any(steps < 0):
        where = _first(steps < 0)
        raise ValueError(f"step: expected step numbers >= 0, got {int(steps[where])} at index {where}")
    if step_zero == "raise" and np.any(steps == 0):
        raise ValueError(
            "step: step 0 has no learning rate under step_zero='raise' (step^-0.5 is infinite); "
            "use step_zero='zero' for the formula's limit min(inf, 0) = 0"
        )
    return steps, positive_int("d_model", d_model), positive_int("warmup_steps", warmup_steps)


def lrate(step: Any, d_model: int, warmup_steps: int = 4000, *, step_zero: str = "zero") -> Any:
    """The learning-rate schedule; fast tier (longdouble inside, float64 out).

    Paper: §5.3, Eq. (3): lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5),
    warmup_steps = 4000: a linear rise for the first warmup_steps steps, then decay as step^-0.5.

    Choices:
        Step 0 (the paper counts from 1): step_zero="zero" (default) returns 0, the formula's own
        value min(inf, 0) = 0; step_zero="raise" rejects it; step_zero="one" computes it as step
        1 (the Annotated Transformer's rate()). Negative steps are an error.

    Shapes: step an integer or an integer array (...) -> float64 of the same shape (a scalar
    for a scalar step).
    """
    steps, d, w = _validate_lrate(step, d_model, warmup_steps, step_zero)
    if step_zero == "one":
        steps = np.maximum(steps, 1)
    s = steps.astype(LD)
    with np.errstate(divide="ignore"):
        decay = 1 / np.sqrt(s)  # inf at step 0
    warm = s * (1 / (LD(w) * np.sqrt(LD(w))))
    return ((1 / np.sqrt(LD(d))) * np.minimum(decay, warm)).astype(np.float64)[()]


def lrate_exact(
    step: Any, d_model: int, warmup_steps: int = 4000, *, step_zero: str = "zero", dps: int = DEFAULT_DPS
) -> Any:
    """The learning-rate schedule; exact tier (mpmath, correctly rounded float64).

    Paper: §5.3, Eq. (3): lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5).

    Choices: as ``lrate`` (step 0 gives 0 or raises, per ``step_zero``).

    Shapes: as ``lrate``.
    """
    steps, d, w = _validate_lrate(step, d_model, warmup_steps, step_zero)
    flat = [max(int(s), 1) if step_zero == "one" else int(s) for s in steps.reshape(-1)]

    def compute() -> np.ndarray:
        scale, warm = 1 / mpmath.sqrt(d), 1 / (w * mpmath.sqrt(w))
        return np.array([scale * min(1 / mpmath.sqrt(s), s * warm) if s else mpmath.mpf(0) for s in flat], dtype=object)

    return correctly_rounded(compute, dps).reshape(steps.shape)[()]


# --------------------------------------------------------------------------------------------
# label smoothing, §5.4


def _validate_eps(eps: Any) -> float:
    arr = as_float_array("eps", eps)
    if arr.ndim != 0 or not 0 <= arr < 1:
        raise ValueError(f"eps: expected one number in [0, 1) (the smoothing mass; the paper uses 0.1), got {eps!r}")
    return float(arr)


def _validate_padding_id(padding_id: Any, k: int, variant: str) -> int | None:
    if padding_id is None:
        return None
    if isinstance(padding_id, (bool, np.bool_)) or not isinstance(padding_id, numbers.Integral):
        raise TypeError(f"padding_id: expected None or an integer class id, got {padding_id!r}")
    if not 0 <= padding_id < k:
        raise ValueError(f"padding_id: expected 0 <= padding_id < vocab_size = {k}, got {padding_id}")
    if variant == "K-1" and k < 3:
        raise ValueError(
            f"vocab_size: variant 'K-1' with a padding_id needs vocab_size >= 3 (the target and the "
            f"padding class leave no class for the smoothing mass), got {k}"
        )
    return int(padding_id)


def _validate_targets(targets: Any, k: int) -> np.ndarray:
    t = _integer_array("targets", targets, "class ids")
    bad = (t < 0) | (t >= k)
    if np.any(bad):
        where = _first(bad)
        raise ValueError(
            f"targets: class id {int(t[where])} at index {where} is out of range; expected 0 <= id < vocab_size = {k}"
        )
    return t


def _validate_smoothing(
    targets: Any, vocab_size: Any, eps: Any, variant: str, padding_id: Any
) -> tuple[np.ndarray, int, float, int | None]:
    k = positive_int("vocab_size", vocab_size, minimum=2)
    e = _validate_eps(eps)
    choice("variant", variant, SMOOTHING_VARIANTS)
    pad = _validate_padding_id(padding_id, k, variant)
    return _validate_targets(targets, k), k, e, pad


def _smoothing_values(k: int, eps: Any, variant: str, padded: bool, one: Any) -> tuple[Any, Any]:
    """(target value, every other class's value) of a smoothed row; ``one`` fixes the arithmetic."""
    m = k - 1 if padded else k  # classes that may receive smoothing mass
    if variant == "K":
        off = eps / m
        return (one - eps) + off, off
    return one - eps, eps / (m - 1)


def _fill(targets: np.ndarray, k: int, on: Any, off: Any, pad: int | None, dtype: Any, zero: Any) -> np.ndarray:
    """Smoothed rows (..., K): ``on`` at each target, ``off`` elsewhere; padding column and rows zero."""
    out = np.full((*targets.shape, k), off, dtype=dtype)  # (..., K)
    np.put_along_axis(out, targets[..., None], on, axis=-1)
    if pad is not None:
        out[..., pad] = zero
        out[targets == pad] = zero
    return out


def label_smoothing(
    targets: Any, vocab_size: int, eps: float, *, variant: str = "K", padding_id: int | None = None
) -> np.ndarray:
    """Label-smoothed target distributions; fast tier (longdouble inside, float64 out).

    Paper: §5.4: "we employed label smoothing of value eps_ls = 0.1" (citing Szegedy et al.),
    q' = (1 - eps) * onehot(target) + eps / K.

    Choices:
        variant="K" (default, Szegedy's and the seeds' form): target gets 1 - eps + eps/K, every
        other class eps/K. variant="K-1": target gets exactly 1 - eps, every other class
        eps/(K-1) (tensor2tensor's and the Annotated Transformer's form).
        padding_id (default None): rows whose target is the padding id are all zero (excluded
        from the loss), and the padding class gets no smoothing mass; its share is spread over
        the remaining classes, so K becomes K-1 in either variant ("K-1" then needs K >= 3).
        eps in [0, 1), vocab_size >= 2, targets integers in [0, K).

    Shapes: targets (...) integer -> (..., vocab_size) float64.
    """
    t, k, e, pad = _validate_smoothing(targets, vocab_size, eps, variant, padding_id)
    on, off = _smoothing_values(k, LD(e), variant, pad is not None, LD(1))
    return _fill(t, k, float(on), float(off), pad, np.float64, 0.0)  # float(longdouble): one rounding


def label_smoothing_exact(
    targets: Any,
    vocab_size: int,
    eps: float,
    *,
    variant: str = "K",
    padding_id: int | None = None,
    dps: int = DEFAULT_DPS,
) -> np.ndarray:
    """Label-smoothed target distributions; exact tier (correctly rounded float64).

    Paper: §5.4: q' = (1 - eps) * onehot(target) + eps / K.

    Choices: as ``label_smoothing``.

    Shapes: targets (...) integer -> (..., vocab_size) float64.
    """
    t, k, e, pad = _validate_smoothing(targets, vocab_size, eps, variant, padding_id)
    em = to_mp(e)[()]
    on, off = correctly_rounded(
        lambda: np.array(_smoothing_values(k, em, variant, pad is not None, mpmath.mpf(1)), dtype=object), dps
    )
    return _fill(t, k, on, off, pad, np.float64, 0.0)


# --------------------------------------------------------------------------------------------
# cross-entropy


def _validate_cross_entropy(logits: Any, target_dist: Any) -> tuple[np.ndarray, np.ndarray]:
    z = as_float_array("logits", logits, min_ndim=1)
    p = as_float_array("target_dist", target_dist, min_ndim=1)
    if z.shape[-1] == 0:
        raise ValueError(f"logits: expected at least one class on the last axis, got shape {z.shape}")
    same_size("logits", z.shape[-1], "target_dist", p.shape[-1], "the number of classes K (last axis)")
    try:
        shape = np.broadcast_shapes(z.shape, p.shape)
    except ValueError:
        raise ValueError(
            f"logits and target_dist: batch shapes {z.shape[:-1]} and {p.shape[:-1]} do not broadcast"
        ) from None
    if np.any(p < 0):
        where = _first(p < 0)
        raise ValueError(f"target_dist: expected non-negative class weights, found {p[where]} at index {where}")
    return np.broadcast_to(z, shape), np.broadcast_to(p, shape)


def _cross_entropy_ld(z: np.ndarray, p: np.ndarray) -> np.ndarray:
    """-sum p log_softmax(z) in longdouble as sum_k p_k (L - w_k): w = z - max z <= 0 and
    L = log sum_j exp(w_j) = log1p(sum over all j but one maximal index), so every term is >= 0."""
    w = z - np.max(z, axis=-1, keepdims=True)  # (..., K), <= 0
    e = np.exp(w)
    np.put_along_axis(e, np.argmax(w, axis=-1)[..., None], 0, axis=-1)  # drop one exp(0) = 1
    lse = np.log1p(np.sum(e, axis=-1, keepdims=True))  # (..., 1), >= 0
    return np.sum(p * (lse - w), axis=-1)  # (...)


def _cross_entropy_mp(z: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The same sum for object arrays of the same shape, in the ambient mpmath context
    (w = z - max z formed exactly)."""
    k = z.shape[-1]
    zr, pr = z.reshape(-1, k), p.reshape(-1, k)
    out = np.empty(zr.shape[0], dtype=object)
    for r in range(zr.shape[0]):
        row = zr[r].tolist()
        top = max(range(k), key=lambda j: row[j])
        with mpmath.workprec(max(DIFF_PREC, mpmath.mp.prec)):
            w = [v - row[top] for v in row]
        lse = mpmath.log1p(mpmath.fsum(mpmath.exp(w[j]) for j in range(k) if j != top))
        out[r] = mpmath.fsum(pr[r, j] * (lse - w[j]) for j in range(k))
    return out.reshape(z.shape[:-1])


def cross_entropy(logits: Any, target_dist: Any) -> Any:
    """Cross-entropy of a target distribution against softmax(logits); fast tier (float64 out).

    Paper: §5.4 (the training loss the label smoothing enters; perplexity in Table 3 is its
    exponential): CE = -sum_k q_k log softmax(z)_k over the last axis.

    Choices:
        target_dist need not sum to 1 (a zero row, e.g. padding, gives 0) but must be >= 0.
        No reduction over positions (the caller chooses sum or mean).

    Shapes: logits (..., K), target_dist (..., K), batch shapes broadcast -> (...) float64.
    """
    z, p = _validate_cross_entropy(logits, target_dist)
    return _cross_entropy_ld(z.astype(LD), p.astype(LD)).astype(np.float64)[()]


def cross_entropy_exact(logits: Any, target_dist: Any, *, dps: int = DEFAULT_DPS) -> Any:
    """Cross-entropy of a target distribution against softmax(logits); exact tier.

    Paper: §5.4: CE = -sum_k q_k log softmax(z)_k.

    Choices: as ``cross_entropy``.

    Shapes: logits (..., K), target_dist (..., K) -> (...) float64.
    """
    z, p = _validate_cross_entropy(logits, target_dist)
    zm, pm = to_mp(z), to_mp(p)
    return correctly_rounded(lambda: _cross_entropy_mp(zm, pm), dps)[()]


def _validate_smoothed_ce(
    logits: Any, targets: Any, eps: Any, variant: str, padding_id: Any
) -> tuple[np.ndarray, np.ndarray, int, float, int | None]:
    z = as_float_array("logits", logits, min_ndim=1)
    if z.shape[-1] < 2:
        raise ValueError(
            f"logits: expected at least 2 classes on the last axis (label smoothing needs K >= 2), got shape {z.shape}"
        )
    t, k, e, pad = _validate_smoothing(targets, z.shape[-1], eps, variant, padding_id)
    try:
        batch = np.broadcast_shapes(z.shape[:-1], t.shape)
    except ValueError:
        raise ValueError(f"logits and targets: batch shapes {z.shape[:-1]} and {t.shape} do not broadcast") from None
    return np.broadcast_to(z, (*batch, k)), np.broadcast_to(t, batch), k, e, pad


def smoothed_cross_entropy(
    logits: Any, targets: Any, eps: float, *, variant: str = "K", padding_id: int | None = None
) -> Any:
    """Cross-entropy against label-smoothed targets; fast tier (longdouble inside, float64 out).

    Paper: §5.4: the training loss with label smoothing eps_ls = 0.1:
    -sum_k q'_k log softmax(z)_k with q' = label_smoothing(target).

    Choices: as ``label_smoothing`` (variant, padding rows give loss 0) and ``cross_entropy``
    (no reduction). The smoothed targets stay in longdouble (no intermediate rounding).

    Shapes: logits (..., K), targets (...) integer -> (...) float64.
    """
    z, t, k, e, pad = _validate_smoothed_ce(logits, targets, eps, variant, padding_id)
    on, off = _smoothing_values(k, LD(e), variant, pad is not None, LD(1))
    q = _fill(t, k, on, off, pad, LD, LD(0))
    return _cross_entropy_ld(z.astype(LD), q).astype(np.float64)[()]


def smoothed_cross_entropy_exact(
    logits: Any, targets: Any, eps: float, *, variant: str = "K", padding_id: int | None = None, dps: int = DEFAULT_DPS
) -> Any:
    """Cross-entropy against label-smoothed targets; exact tier (correctly rounded float64).

    Paper: §5.4: -sum_k q'_k log softmax(z)_k.

    Choices: as ``smoothed_cross_entropy``.

    Shapes: logits (..., K), targets (...) integer -> (...) float64.
    """
    z, t, k, e, pad = _validate_smoothed_ce(logits, targets, eps, variant, padding_id)
    zm, em = to_mp(z), to_mp(e)[()]

    def compute() -> np.ndarray:
        on, off = _smoothing_values(k, em, variant, pad is not None, mpmath.mpf(1))
        return _cross_entropy_mp(zm, _fill(t, k, on, off, pad, object, mpmath.mpf(0)))

    return correctly_rounded(compute, dps)[()]


# --------------------------------------------------------------------------------------------
# the backward of the smoothed cross-entropy: its vector-Jacobian product
#
# loss = -sum_k q_k log softmax(z)_k = -sum_k q_k z_k + (sum_k q_k) log sum_j exp(z_j), so
# d loss / d z_j = (sum_k q_k) softmax(z)_j - q_j, and for a cotangent dL of the per-position losses
# dz = dL (sum_k q_k) softmax(z) - dL q. A padding row (q = 0 under "K-2") gets exactly 0. Derived from the
# definition, not from an implementation's backward.


def smoothed_cross_entropy_vjp(
    logits: Any, targets: Any, eps: float, d_loss: Any, *, variant: str = "K", padding_id: int | None = None
) -> np.ndarray:
    """The VJP of the smoothed cross-entropy with respect to the logits; fast tier (longdouble inside, float64 out).

    Paper: §5.4. Choices: as :func:`smoothed_cross_entropy`. Shapes: logits (..., K), targets (...) integer,
    d_loss (...) the losses' shape -> d logits (..., K) float64.
    """
    z, t, k, e, pad = _validate_smoothed_ce(logits, targets, eps, variant, padding_id)
    g = _loss_cotangent(d_loss, z.shape[:-1])
    on, off = _smoothing_values(k, LD(e), variant, pad is not None, LD(1))
    q = _fill(t, k, on, off, pad, LD, LD(0))  # (..., K)
    zl = z.astype(LD)
    w = np.exp(zl - np.max(zl, axis=-1, keepdims=True))
    p = w / np.sum(w, axis=-1, keepdims=True)  # (..., K)
    gl = g.astype(LD)[..., None]
    return (gl * (np.sum(q, axis=-1, keepdims=True) * p - q)).astype(np.float64)


def smoothed_cross_entropy_vjp_exact(
    logits: Any,
    targets: Any,
    eps: float,
    d_loss: Any,
    *,
    variant: str = "K",
    padding_id: int | None = None,
    dps: int = DEFAULT_DPS,
) -> np.ndarray:
    """The VJP of the smoothed cross-entropy; exact tier (mpmath at ``dps`` digits, each result rounded once).

    Paper: §5.4. Same definition, choices and shapes as :func:`smoothed_cross_entropy_vjp`.
    """
    z, t, k, e, pad = _validate_smoothed_ce(logits, targets, eps, variant, padding_id)
    g = _loss_cotangent(d_loss, z.shape[:-1])
    zm, em, gm = to_mp(z), to_mp(e)[()], to_mp(g)

    def compute() -> np.ndarray:
        on, off = _smoothing_values(k, em, variant, pad is not None, mpmath.mpf(1))
        q = _fill(t, k, on, off, pad, object, mpmath.mpf(0)).reshape(-1, k)
        rows, cots = zm.reshape(-1, k), gm.reshape(-1)
        out = np.empty(rows.shape, dtype=object)
        for r in range(rows.shape[0]):
            top = max(rows[r].tolist())
            ex = [mpmath.exp(v - top) for v in rows[r]]
            total, mass = mpmath.fsum(ex), mpmath.fsum(q[r].tolist())
            out[r] = [cots[r] * (mass * ex[j] / total - q[r, j]) for j in range(k)]
        return out.reshape(z.shape)

    return correctly_rounded(compute, dps)


def _loss_cotangent(d_loss: Any, shape: tuple[int, ...]) -> np.ndarray:
    g = as_float_array("d_loss", d_loss)
    if g.shape != shape:
        raise ValueError(f"d_loss: expected the losses' shape {shape}, got {g.shape}")
    return g


# --------------------------------------------------------------------------------------------
# the minimum of the smoothed cross-entropy: the entropy of the smoothed target


def _off_target_mass(k: int, eps: Any, variant: str) -> tuple[Any, Any]:
    """(r, b): the total mass off the target and each other class's share, for variant K or K-1."""
    if variant == "K":
        return eps * (k - 1) / k, eps / k
    return eps, eps / (k - 1)


def _validate_entropy(vocab_size: Any, eps: Any, variant: str) -> tuple[int, float]:
    k = positive_int("vocab_size", vocab_size, minimum=2)
    e = _validate_eps(eps)
    choice("variant", variant, SMOOTHING_VARIANTS)
    return k, e


def smoothed_target_entropy(vocab_size: int, eps: float, *, variant: str = "K") -> float:
    """The entropy of a smoothed target row: the minimum of the smoothed cross-entropy; fast tier.

    Paper: §5.4 (label smoothing "hurts perplexity, as the model learns to be more unsure"): the
    cross-entropy against q' is H(q') + KL(q' || softmax(z)) >= H(q'), reached at softmax(z) = q'.
    With r the mass off the target and b each other class's share:
    H = -(1 - r) log(1 - r) - r log b.

    Choices: variant as ``label_smoothing`` ("K": r = eps (K-1)/K, b = eps/K; "K-1": r = eps,
    b = eps/(K-1)); eps = 0 gives 0 (0 log 0 = 0). No padding (a padded row has no loss).

    Shapes: scalars -> float64 scalar.
    """
    k, e = _validate_entropy(vocab_size, eps, variant)
    if e == 0:
        return np.float64(0.0)
    r, b = _off_target_mass(k, LD(e), variant)
    return np.float64(-(1 - r) * np.log1p(-r) - r * np.log(b))


def smoothed_target_entropy_exact(vocab_size: int, eps: float, *, variant: str = "K", dps: int = DEFAULT_DPS) -> float:
    """The entropy of a smoothed target row (the smoothed cross-entropy's minimum); exact tier.

    Paper: §5.4: H(q') = -(1 - r) log(1 - r) - r log b.

    Choices: as ``smoothed_target_entropy``.

    Shapes: scalars -> float64 scalar.
    """
    k, e = _validate_entropy(vocab_size, eps, variant)
    if e == 0:
        return np.float64(0.0)
    em = to_mp(e)[()]

    def compute() -> np.ndarray:
        r, b = _off_target_mass(k, em, variant)
        return np.array([-(1 - r) * mpmath.log1p(-r) - r * mpmath.log(b)], dtype=object)

    return np.float64(correctly_rounded(compute, dps)[0])


# --------------------------------------------------------------------------------------------
# Adam, §5.3: "We used the Adam optimizer [Kingma & Ba, 2015] with beta1 = 0.9, beta2 = 0.98 and epsilon = 10^-9"

#: §5.3's hyperparameters of Adam.
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9
#: Where epsilon enters the step. "outside": Kingma & Ba's Algorithm 1, m_hat / (sqrt(v_hat) + eps) (PyTorch's
#: torch.optim.Adam, optax.adam); "inside": m_hat / sqrt(v_hat + eps); "hat": Kingma & Ba's "more efficient" order
#: (§2, after Algorithm 1), lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps), epsilon added to the
#: uncorrected sqrt(v) (Keras, TensorFlow): with bias correction it is "outside" with eps / sqrt(1 - beta2^t).
EPS_PLACEMENTS = ("outside", "inside", "hat")


def _validate_adam(
    param: Any, grad: Any, m: Any, v: Any, step: Any, lr: Any, betas: Any, eps: Any, eps_placement: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, float, tuple[float, float], float]:
    p = as_float_array("param", param)
    arrays = [p]
    for name, value in (("grad", grad), ("m", m), ("v", v)):
        arr = as_float_array(name, value)
        if arr.shape != p.shape:
            raise ValueError(f"{name}: expected param's shape {p.shape}, got {arr.shape}")
        arrays.append(arr)
    if np.any(arrays[3] < 0):
        where = _first(arrays[3] < 0)
        raise ValueError(f"v: expected a second moment >= 0, got {arrays[3][where]!r} at index {where}")
    t = positive_int("step", step)
    rate = as_float_array("lr", lr)
    if rate.ndim != 0 or rate < 0:
        raise ValueError(f"lr: expected one number >= 0 (the step's learning rate), got {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas: expected a pair (beta1, beta2), got {betas!r}")
    pair = tuple(float(as_float_array(f"betas[{i}]", b)) for i, b in enumerate(betas))
    if not all(0 <= b < 1 for b in pair):
        raise ValueError(f"betas: expected each in [0, 1) (the paper: {ADAM_BETAS}), got {betas!r}")
    e = as_float_array("eps", eps)
    if e.ndim != 0 or not e > 0:
        raise ValueError(f"eps: expected one number > 0 (the paper: {ADAM_EPS}), got {eps!r}")
    choice("eps_placement", eps_placement, EPS_PLACEMENTS)
    return (*arrays, t, float(rate), pair, float(e))  # type: ignore[return-value]


def _adam(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    t: int,
    lr: Any,
    b1: Any,
    b2: Any,
    eps: Any,
    corrected: bool,
    where: str,
    sqrt: Callable[[Any], Any],
    one: Any,
) -> tuple[Any, Any, Any]:
    """One Adam step in the arithmetic of ``one`` (longdouble arrays or mpf scalars): (param, m, v) after it."""
    m1 = b1 * m + (one - b1) * g
    v1 = b2 * v + (one - b2) * (g * g)
    c1, c2 = (one - b1**t, one - b2**t) if corrected else (one, one)
    if where == "hat":
        update = (lr * sqrt(c2) / c1) * m1 / (sqrt(v1) + eps)
    elif where == "inside":
        update = lr * (m1 / c1) / sqrt(v1 / c2 + eps)
    else:
        update = lr * (m1 / c1) / (sqrt(v1 / c2) + eps)
    return p - update, m1, v1


def adam_step(
    param: Any,
    grad: Any,
    m: Any,
    v: Any,
    step: int,
    lr: float,
    betas: tuple[float, float] = ADAM_BETAS,
    eps: float = ADAM_EPS,
    *,
    bias_correction: bool = True,
    eps_placement: str = "outside",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of Adam for one parameter; fast tier (longdouble inside, float64 out).

    Paper: §5.3 ("Adam [20] with beta1 = 0.9, beta2 = 0.98 and epsilon = 10^-9"), Kingma & Ba (2015), Algorithm 1:
    m_t = beta1 m_{t-1} + (1 - beta1) g;  v_t = beta2 v_{t-1} + (1 - beta2) g^2;
    m_hat = m_t / (1 - beta1^t);  v_hat = v_t / (1 - beta2^t);  theta_t = theta_{t-1} - lr m_hat / (sqrt(v_hat) + eps).
    lr is the step's rate (Eq. (3)'s lrate at this step).

    Choices:
        bias_correction: True (Algorithm 1) divides by 1 - beta^t; False uses m_t and v_t as they are.
        eps_placement: "outside" (Algorithm 1), "inside" (sqrt(v_hat + eps)), "hat" (Kingma & Ba's efficient order:
        eps added to sqrt(v_t) before the correction, as Keras does); see :data:`EPS_PLACEMENTS`.
        The step counts from 1 (t = 1 is the first update); no weight decay (the paper names none).

    Shapes: param, grad, m, v (...) the same shape; step an int >= 1; lr, eps scalars; betas a pair
    -> (param, m, v) after the step, float64 arrays of that shape.
    """
    p, g, m0, v0, t, rate, (b1, b2), e = _validate_adam(param, grad, m, v, step, lr, betas, eps, eps_placement)
    out = _adam(
        *(a.astype(LD) for a in (p, g, m0, v0)),
        t,
        LD(rate),
        LD(b1),
        LD(b2),
        LD(e),
        bias_correction,
        eps_placement,
        np.sqrt,
        LD(1),
    )
    return tuple(np.asarray(a, dtype=np.float64) for a in out)  # type: ignore[return-value]


def adam_step_exact(
    param: Any,
    grad: Any,
    m: Any,
    v: Any,
    step: int,
    lr: float,
    betas: tuple[float, float] = ADAM_BETAS,
    eps: float = ADAM_EPS,
    *,
    bias_correction: bool = True,
    eps_placement: str = "outside",
    dps: int = DEFAULT_DPS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of Adam; exact tier (mpmath at ``dps`` digits, each result rounded once to float64).

    Paper: §5.3, Kingma & Ba (2015) Algorithm 1. Choices and shapes: as :func:`adam_step`.
    """
    p, g, m0, v0, t, rate, (b1, b2), e = _validate_adam(param, grad, m, v, step, lr, betas, eps, eps_placement)
    flat = [to_mp(a).reshape(-1) for a in (p, g, m0, v0)]
    consts = to_mp(np.array([rate, b1, b2, e]))

    def compute() -> np.ndarray:
        lr_, b1_, b2_, e_ = consts.tolist()
        out = np.empty((3, p.size), dtype=object)
        for i in range(p.size):
            out[:, i] = _adam(
                *(a[i] for a in flat),
                t,
                lr_,
                b1_,
                b2_,
                e_,
                bias_correction,
                eps_placement,
                mpmath.sqrt,
                mpmath.mpf(1),
            )
        return out

    rounded = correctly_rounded(compute, dps)
    return tuple(rounded[i].reshape(p.shape) for i in range(3))  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# residual dropout, §5.4: "We apply dropout [Srivastava et al., 2014] to the output of each sub-layer, before it is
# added to the sub-layer input and normalized ... to the sums of the embeddings and the positional encodings"

#: §5.4's rate for the base model (Table 3; big EN-DE 0.3, big EN-FR 0.1).
P_DROP = 0.1


def _validate_dropout(x: Any, keep: Any, p: Any) -> tuple[np.ndarray, np.ndarray, float]:
    arr = as_float_array("x", x)
    mask = np.asarray(keep)
    if mask.dtype != bool:
        raise TypeError(f"keep: expected a boolean array (True = kept), got dtype {mask.dtype}")
    if mask.shape != arr.shape:
        raise ValueError(f"keep: expected x's shape {arr.shape}, got {mask.shape}")
    rate = as_float_array("p", p)
    if rate.ndim != 0 or not 0 <= rate < 1:
        raise ValueError(f"p: expected one number in [0, 1) (the dropout rate; the paper: {P_DROP}), got {p!r}")
    return arr, mask, float(rate)


def dropout(x: Any, keep: Any, p: float) -> np.ndarray:
    """Dropout given its mask; fast tier (longdouble inside, float64 out).

    Paper: §5.4, P_drop = 0.1; Srivastava et al. (2014) with the scaling at training time ("inverted" dropout):
    y = keep * x / (1 - p), keep in {0, 1} drawn with P(keep = 1) = 1 - p, so that E[y] = x and evaluation uses x.

    Choices: the mask is an argument (the oracle draws nothing; an implementation's own draws are judged
    statistically by the conformance checks). A dropped element is +0.0 whatever x holds there (0 * x would
    keep x's sign and a NaN: finite inputs only).

    Shapes: x (...) float, keep (...) bool of the same shape, p a scalar in [0, 1) -> (...) float64.
    """
    arr, mask, rate = _validate_dropout(x, keep, p)
    return np.where(mask, (arr.astype(LD) / (1 - LD(rate))).astype(np.float64), 0.0)


def dropout_exact(x: Any, keep: Any, p: float, *, dps: int = DEFAULT_DPS) -> np.ndarray:
    """Dropout given its mask; exact tier (mpmath, correctly rounded). Paper, choices and shapes: as :func:`dropout`."""
    arr, mask, rate = _validate_dropout(x, keep, p)
    xm, pm = to_mp(arr), to_mp(rate)[()]

    def compute() -> np.ndarray:
        scale = 1 / (1 - pm)
        return np.where(mask, np.vectorize(lambda a: a * scale, otypes=[object])(xm), mpmath.mpf(0))

    return correctly_rounded(compute, dps).reshape(arr.shape)


# --------------------------------------------------------------------------------------------
# checkpoint averaging, §6.1: "a single model obtained by averaging the last 5 checkpoints, which were written at
# 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

#: §6.1: how many of the last checkpoints are averaged, per model, and the interval they were written at.
CHECKPOINTS_AVERAGED = {"base": 5, "big": 20}
CHECKPOINT_INTERVAL_MINUTES = 10


def _validate_checkpoints(checkpoints: Any, n: Any) -> tuple[list[int], int, list[str]]:
    if not isinstance(checkpoints, Mapping):
        raise TypeError(
            f"checkpoints: expected a mapping of step -> parameters (name -> array), got {type(checkpoints).__name__}"
        )
    if not checkpoints:
        raise ValueError("checkpoints: expected at least one checkpoint, got an empty mapping")
    steps = list(checkpoints)
    for s in steps:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s < 0:
            raise TypeError(f"checkpoints: expected steps (integers >= 0) as keys, got {s!r}")
    count = positive_int("n", n)
    if count > len(steps):
        raise ValueError(f"n: expected at most the {len(steps)} checkpoints given, got {count}")
    names: list[str] | None = None
    for s in steps:
        state = checkpoints[s]
        if not isinstance(state, Mapping):
            raise TypeError(f"checkpoints[{s}]: expected a mapping name -> array, got {type(state).__name__}")
        if names is None:
            names = list(state)
        elif set(state) != set(names):
            raise ValueError(
                f"checkpoints[{s}]: its parameter names differ from checkpoints[{steps[0]}]'s: "
                f"{sorted(set(state) ^ set(names))}"
            )
    return steps, count, names or []


def last_checkpoints(steps: Any, n: int) -> list[int]:
    """The steps of the checkpoints §6.1 averages: the ``n`` written last, i.e. at the largest steps, in order.

    Paper: §6.1 ("the last 5 checkpoints"; 20 for big). Choices: "last" is by training step, not by the order the
    steps are given in (a directory listing sorts checkpoint_100 before checkpoint_20). Shapes: a sequence of
    distinct integer steps, n >= 1 -> a list of n steps, ascending.
    """
    given = list(steps)
    for s in given:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s < 0:
            raise TypeError(f"steps: expected integers >= 0, got {s!r}")
    if len(set(given)) != len(given):
        raise ValueError(f"steps: expected distinct steps, got {sorted(given)}")
    count = positive_int("n", n)
    if count > len(given):
        raise ValueError(f"n: expected at most the {len(given)} checkpoints given, got {count}")
    return sorted(int(s) for s in given)[-count:]


def average_checkpoints(checkpoints: Mapping[int, Mapping[str, Any]], n: int) -> dict[str, np.ndarray]:
    """The model §6.1 evaluates: the element-wise mean of the last ``n`` checkpoints' parameters; fast tier
    (longdouble sum, float64 out).

    Paper: §6.1: theta_bar = (1 / n) sum_{i = 1..n} theta_i over the last n checkpoints (5 base, 20 big).

    Choices: the checkpoints are those of :func:`last_checkpoints`; parameters only (an optimizer's moments are no
    part of the evaluated model).

    Shapes: checkpoints step -> {name: array (...)}, every checkpoint with the same names and shapes -> {name: float64
    array}.
    """
    steps, count, names = _validate_checkpoints(checkpoints, n)
    chosen = last_checkpoints(steps, count)
    out = {}
    for name in names:
        stack = _stack(name, [checkpoints[s][name] for s in chosen], chosen)  # (n, ...)
        out[name] = (np.sum(stack.astype(LD), axis=0) / count).astype(np.float64)
    return out


def average_checkpoints_exact(
    checkpoints: Mapping[int, Mapping[str, Any]], n: int, *, dps: int = DEFAULT_DPS
) -> dict[str, np.ndarray]:
    """The mean of the last ``n`` checkpoints; exact tier (mpmath fsum, correctly rounded). Paper, choices and
    shapes: as :func:`average_checkpoints`."""
    steps, count, names = _validate_checkpoints(checkpoints, n)
    chosen = last_checkpoints(steps, count)
    out = {}
    for name in names:
        stack = to_mp(_stack(name, [checkpoints[s][name] for s in chosen], chosen)).reshape(count, -1)

        def compute(stack: np.ndarray = stack) -> np.ndarray:
            return np.array([mpmath.fsum(stack[:, j].tolist()) / count for j in range(stack.shape[1])], dtype=object)

        out[name] = correctly_rounded(compute, dps).reshape(np.shape(checkpoints[chosen[0]][name]))
    return out


def _stack(name: str, arrays: list[Any], steps: list[int]) -> np.ndarray:
    values = [as_float_array(f"checkpoints[{s}][{name!r}]", a) for s, a in zip(steps, arrays)]
    for s, a in zip(steps, values):
        if a.shape != values[0].shape:
            raise ValueError(
                f"checkpoints[{s}][{name!r}]: shape {a.shape}, checkpoints[{steps[0]}]'s is {values[0].shape}"
            )
    return np.stack(values)  # (n, ...)
