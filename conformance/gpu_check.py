"""The prepared GPU check: fixed-input agreement with the oracle, and a short attention throughput run.

Run ``python -m aiayn.conformance.gpu_check --out DIR`` on a machine with a CUDA GPU. In well under five
minutes it

1. runs the ``torch`` and ``torch-sdpa`` implementations (and ``torch-nn``, with and without
   PyTorch's fused inference "fast path") on the GPU through the fixed-input agreement checks
   below, in float32, float16 and bfloat16: every equation of the paper (§3.1-§3.5, §5.3, §5.4),
   each compared with the oracle (``reference/``) run on the *same* rounded inputs, against an
   error bound derived for that equation, dtype and input;
2. times Eq. (1) (B = 1, h = 8, d_k = 64, n in {512, 2048, 8192}, causal and not) for those
   implementations, and a cuBLAS GEMM in the same dtype as the machine's ceiling, measured in the
   same run;
3. writes ``DIR/gpu_check.json`` and ``DIR/gpu_check.md`` naming the GPU, the versions and the
   numerical switches that matter (TF32, reduced-precision reductions, SDPA backends).

Without CUDA it stops with a message and exit status 2; ``--allow-cpu`` runs the same code on
the CPU with small throughput sizes (a dry run of the script itself). Exit status 1 means some
agreement check failed (the reports are written anyway).

The agreement checker (:func:`run_checks`) is shared with ``tests/test_torch_impl.py``.

Error bounds
------------
The implementation and the oracle see the same inputs: float64 draws rounded to the dtype by the
implementation's own ``from_numpy`` and read back with ``to_numpy``. The implementation is
modelled as storing every result in the dtype (unit roundoff ``u``: float64 2^-53, float32 2^-24,
float16 2^-11, bfloat16 2^-8) and accumulating products and reductions at ``acc`` (the dtype's
own, float32's for float16/bfloat16; see :class:`Precision`). The oracle's fast tier computes in
longdouble and rounds to float64 at the end of each sub-layer, so its error is at most that of the
same model at 2^-53. Each bound below is superadditive in the unit roundoffs (sums and products
of increasing convex terms vanishing at 0), so the sum of both errors is bounded by the same
formula with 2^-53 added to ``u`` and ``acc``. An implementation that keeps intermediates in
higher precision than this model only does better.

Bounds are propagated entrywise through each equation as the pair (value, error bound) of
:class:`Est`, with ``gamma(n) = n u / (1 - n u)`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Lemma 3.1 and §3.5: |fl(a.b) - a.b| <= gamma_n |a|.|b| for a length-n dot
product in any summation order, so blocked and split-K kernels included). Magnitudes are
evaluated in float64 from the rounded inputs; their own relative error (< 1e-13 at these sizes)
is covered by multiplying every bound by ``1 + 2^-30``. Where a bound's derivation needs a
perturbation to be small (LayerNorm: perturbation of sigma below sigma / 2) it checks that and
raises :class:`BoundNotApplicable` instead of reporting a meaningless number. Being worst-case
and entrywise, the bounds compound through the layers (each weight matrix multiplies them by
the column sums of |W|, each LayerNorm by about 3); see the composite cases for what that costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BoundNotApplicable",
    "CheckResult",
    "Est",
    "KNOWN_DEVIATIONS",
    "Precision",
    "fixed_cases",
    "main",
    "run_checks",
]

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
SMALLEST_SUBNORMAL = {"float64": 2.0**-1074, "float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}
ORACLE_U = 2.0**-53  # the oracle's fast tier rounds to float64 (see module docstring)
MAGNITUDE_SLACK = 1.0 + 2.0**-30  # covers evaluating the bounds' magnitudes in float64


class BoundNotApplicable(ValueError):
    """The error analysis's smallness assumption fails for these inputs and this dtype."""


@dataclass(frozen=True)
class Precision:
    """Unit roundoffs and underflow threshold that bound implementation + oracle error together.

    ``u``: storage, the dtype's unit roundoff (every result stored in the dtype is rounded once).
    ``acc``: accumulation, the unit roundoff of the arithmetic inside matrix products and
    reductions (sums, softmax, LayerNorm statistics, log-sum-exp): the dtype's own for float32
    and float64, float32's for float16 and bfloat16. That is an *assumption about the
    implementation*, and it is what the torch built-ins declare and do: float32 reductions, cuBLAS
    and SDPA kernels with float32 accumulators (``gpu_check`` switches off cuBLAS's
    reduced-precision split-K reductions while checking, so that holds there too). An
    implementation that accumulates in half precision can fail these bounds without being wrong
    in its own terms; the conformance suite's budgets are the general ones.
    Both carry the oracle's 2^-53 (module docstring).
    """

    u: float
    acc: float
    eta: float

    @classmethod
    def for_dtype(cls, dtype: str) -> Precision:
        acc = UNIT_ROUNDOFF["float32"] if dtype in ("float16", "bfloat16") else UNIT_ROUNDOFF[dtype]
        return cls(UNIT_ROUNDOFF[dtype] + ORACLE_U, acc + ORACLE_U, SMALLEST_SUBNORMAL[dtype])

    @staticmethod
    def _gamma(n: Any, unit: float) -> Any:
        nu = np.asarray(n, dtype=np.float64) * unit
        if np.any(nu >= 0.5):
            raise BoundNotApplicable(f"gamma_n with n u = {float(np.max(nu)):.3g} >= 1/2: the dtype is too coarse for this size")
        return nu / (1.0 - nu)

    def gamma(self, n: Any) -> Any:
        """gamma_n = n u / (1 - n u) at the storage precision (Higham Lemma 3.1; we ask n u < 1/2)."""
        return self._gamma(n, self.u)

    def gamma_acc(self, n: Any) -> Any:
        """gamma_n at the accumulation precision."""
        return self._gamma(n, self.acc)

    def dot(self, n: Any) -> Any:
        """Relative bound for n accumulated terms then one rounding to the dtype: u + gamma_acc(n)(1 + u)."""
        return self.u + self.gamma_acc(n) * (1.0 + self.u)


@dataclass
class Est:
    """An intermediate quantity: ``val`` its value (float64, from the rounded inputs) and ``err``
    an entrywise bound on |computed - exact| for an implementation following :class:`Precision`'s model."""

    val: np.ndarray
    err: np.ndarray

    @classmethod
    def exact(cls, x: np.ndarray) -> Est:
        """An input: representable in the dtype, so both sides hold it exactly."""
        x = np.asarray(x, dtype=np.float64)
        return cls(x, np.zeros_like(x))

    @property
    def mag(self) -> np.ndarray:
        """A bound on |computed value|."""
        return np.abs(self.val) + self.err


# ---------------------------------------------------------------------------------------------
# bound propagation, one function per operation of the paper's equations


def linear(x: Est, w: np.ndarray, b: np.ndarray | None, p: Precision) -> Est:
    """y = x W (+ b), §3.2.2 projections, Eq. (2), the output layer.

    |y^ - y| <= |dx| |W| + (dot(d+1) + u) (|x^| |W| + |b|): the input's error through W, a
    length-d dot product and the bias add accumulated (Higham Lemma 3.5), and up to two roundings
    to the dtype (the product, then the bias added to it).
    """
    d = w.shape[0]
    aw = np.abs(w)
    bias = 0.0 if b is None else b
    val = x.val @ w + bias
    err = x.err @ aw + (p.dot(d + 1) + p.u) * (x.mag @ aw + np.abs(bias))
    return Est(val, err)


def relu(x: Est) -> Est:
    """max(0, x), Eq. (2): exact in floating point and 1-Lipschitz, so the error passes through."""
    return Est(np.maximum(x.val, 0.0), x.err)


def add(x: Est, y: Est, p: Precision) -> Est:
    """x + y (the residual of §3.1): both errors plus one rounding of the sum to the dtype."""
    return Est(x.val + y.val, x.err + y.err + p.u * (x.mag + y.mag))


def scores(q: Est, k: Est, p: Precision) -> Est:
    """S = Q K^T / sqrt(d_k), inside Eq. (1).

    |S^ - S| <= (|dQ| |K^|^T + |Q| |dK|^T) / sqrt(d_k) + dot(d_k+4) |Q^| |K^|^T / sqrt(d_k):
    the inputs' errors, the dot product (d_k), up to four roundings from the scale (the rounded
    constant 1/sqrt(d_k) and its product, or d_k^-1/4 applied to both Q and K as some kernels
    do), and a rounding of S to the dtype if the kernel stores it.
    """
    d_k = q.val.shape[-1]
    kt_val, kt_mag, kt_err = (np.swapaxes(a, -1, -2) for a in (k.val, k.mag, k.err))
    s = 1.0 / math.sqrt(d_k)
    val = (q.val @ kt_val) * s
    err = (q.err @ kt_mag + np.abs(q.val) @ kt_err) * s + p.dot(d_k + 4) * (q.mag @ kt_mag) * s
    return Est(val, err)


def softmax_rows(s: Est, visible: np.ndarray | None, p: Precision) -> tuple[Est, np.ndarray]:
    """P = softmax over the last axis of the visible entries (§3.2.1; masked entries are -inf).

    Derivation, per row with visible set V, m = max_V s, D_i = |s_i - m|, e_i >= |ds_i|:
    - input perturbation: softmax(s + ds)_i / softmax(s)_i = e^{ds_i} / sum_j P_j e^{ds_j}, whose
      log lies within e_i + sum_j P_j expm1(e_j) (Jensen below, log(1 + x) <= x above);
    - computed shift: |s^_i - m^| <= D_i + 2 max_V e =: D^_i, and the argument of exp carries
      relative error <= 2 acc (the subtraction, and a rounded log2(e) or scale folded into it by
      fused kernels);
    - exp to 1 ulp (2 acc), the sum of n_k terms (gamma_{n_k-1}), the division, and a few
      online-softmax rescalings: together within gamma_acc(n_k+6); a final cast: u.
    So P^_i = P_i exp(theta_i) with |theta_i| <= L_i = e_i + sum_j P_j expm1(e_j)
    + 2 acc (D^_i + max_V D^) - log(1 - gamma_acc(n_k+6)) - log(1 - u), and
    |P^_i - P_i| <= P_i expm1(L_i) + 3 eta (underflow of tiny weights).
    Masked entries are exactly 0 on both sides (bound 0). Returns (P, fully_masked_rows); P is
    NaN on fully masked rows (the caller applies the policy).
    """
    shape = s.val.shape
    vis = np.ones(shape, dtype=bool) if visible is None else np.broadcast_to(visible, shape)
    n_k = shape[-1]
    sv = np.where(vis, s.val, -np.inf)
    full = ~vis.any(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        m = sv.max(axis=-1, keepdims=True)
        e = np.exp(sv - m)
        val = e / e.sum(axis=-1, keepdims=True)
        e_vis = np.where(vis, s.err, 0.0)
        d_hat = np.where(vis, np.abs(sv - m), 0.0) + 2.0 * e_vis.max(axis=-1, keepdims=True)
        spread = np.sum(np.nan_to_num(val) * np.expm1(e_vis), axis=-1, keepdims=True)
    rounding = 2.0 * p.acc * (d_hat + d_hat.max(axis=-1, keepdims=True)) - math.log1p(-float(p.gamma_acc(n_k + 6))) - math.log1p(-p.u)
    log_rel = e_vis + spread + rounding
    err = np.where(vis, val * np.expm1(log_rel) + 3.0 * p.eta, 0.0)
    return Est(val, err), full


def weighted_sum(prob: Est, v: Est, p: Precision) -> Est:
    """O = P V, Eq. (1)'s last product: |dP| |V^| + P |dV| + dot(n_k+3) |P^| |V^| (the dot
    product of n_k terms, an online kernel's final division by the row sum and rescalings, and
    the rounding to the dtype)."""
    n_k = v.val.shape[-2]
    with np.errstate(invalid="ignore"):
        val = prob.val @ v.val
        err = prob.err @ v.mag + prob.val @ v.err + p.dot(n_k + 3) * (prob.mag @ v.mag)
    return Est(val, err)


def attention(q: Est, k: Est, v: Est, visible: np.ndarray | None, fully_masked: str, p: Precision) -> Est:
    """Eq. (1) with the mask of §3.2.3; fully masked rows NaN ("nan") or exactly 0 ("zeros")."""
    prob, full = softmax_rows(scores(q, k, p), visible, p)
    if fully_masked == "zeros":
        prob = Est(np.where(full, 0.0, prob.val), np.where(full, 0.0, prob.err))
    return weighted_sum(prob, v, p)


def _split(x: Est, h: int) -> Est:
    """(..., n, h*d) -> (..., h, n, d) for value and bound alike."""
    def f(a: np.ndarray) -> np.ndarray:
        return np.swapaxes(a.reshape(*a.shape[:-1], h, a.shape[-1] // h), -2, -3)

    return Est(f(x.val), f(x.err))


def _merge(x: Est) -> Est:
    """(..., h, n, d) -> (..., n, h*d)."""
    def f(a: np.ndarray) -> np.ndarray:
        b = np.swapaxes(a, -2, -3)
        return b.reshape(*b.shape[:-2], -1)

    return Est(f(x.val), f(x.err))


def multi_head(query: Est, key: Est, value: Est, params: Mapping[str, np.ndarray], h: int, visible: np.ndarray | None, fully_masked: str, p: Precision) -> Est:
    """§3.2.2: the three projections, h heads of Eq. (1), concatenation, W^O — composed from the above."""
    q = _split(linear(query, params["w_q"], params.get("b_q"), p), h)
    k = _split(linear(key, params["w_k"], params.get("b_k"), p), h)
    v = _split(linear(value, params["w_v"], params.get("b_v"), p), h)
    head_mask = None if visible is None else np.asarray(visible)[..., None, :, :]
    return linear(_merge(attention(q, k, v, head_mask, fully_masked, p)), params["w_o"], params.get("b_o"), p)


def _mean(a: np.ndarray) -> np.ndarray:
    return a.mean(axis=-1, keepdims=True)


def _rms(a: np.ndarray) -> np.ndarray:
    return np.sqrt(_mean(a * a))


def _require_small(err: np.ndarray, scale: np.ndarray, what: str) -> None:
    """Raise :class:`BoundNotApplicable` unless err < scale / 2 on every row (naming the worst row)."""
    ratio = err / scale
    if np.any(ratio >= 0.5):
        row = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        raise BoundNotApplicable(f"{what} {float(err[row]):.3g} is not below half of sigma {float(scale[row]):.3g} (row {tuple(int(i) for i in row[:-1])})")


def layer_norm(x: Est, gain: np.ndarray, bias: np.ndarray, eps: float, p: Precision) -> Est:
    """LayerNorm over the last axis (§3.1): (x - mu) / sigma * g + b, sigma = sqrt(var + eps).

    With c = x - mu, z = c / sigma (exact, from the rounded inputs):
    - input error |dx| <= e: the centred input moves by a_i <= e_i + mean(e), sigma by at most
      r = rms(a) (sigma is 1-Lipschitz in the RMS norm of c), so
      |dz_i| <= (a_i + |z_i| r) / (sigma - r);
    - rounding of the statistics (at acc), on the perturbed input: the mean within
      gamma_acc(3d) mean|x| (pairwise, two-pass or Welford's running updates), each centred value
      within alpha_i = dmu + acc (|c_i| + dmu); the variance within (rms c + rms alpha)^2 -
      (rms c)^2 + gamma_acc(d+1) (rms c + rms alpha)^2 (two pass) plus 3 gamma_acc(d+2) mean(x^2)
      (one-pass / Welford forms, Chan, Golub & LeVeque 1983), so sigma within
      rho = dvar / (sigma - r) + gamma_acc(3) (sigma + r) (eps add and sqrt);
      |dz_i| <= (alpha_i + |z^_i| rho) / (sigma - r - rho), and the division within gamma_acc(2);
    - the affine step z g + b (gamma_acc(2)) and the rounding to the dtype (u).
    Needs r < sigma / 2 and rho < (sigma - r) / 2, else :class:`BoundNotApplicable`.
    """
    d = x.val.shape[-1]
    mu = _mean(x.val)
    c = x.val - mu
    sigma = np.sqrt(_mean(c * c) + eps)
    z = c / sigma
    val = z * gain + bias
    a = x.err + _mean(x.err)
    r = _rms(a)
    _require_small(r, sigma, "LayerNorm input error (rms)")
    dz_in = (a + np.abs(z) * r) / (sigma - r)
    x_mag, c_mag = np.abs(x.val) + x.err, np.abs(c) + a
    dmu = p.gamma_acc(3 * d) * _mean(x_mag)
    alpha = dmu + p.acc * (c_mag + dmu)
    rc, ra = _rms(c_mag), _rms(alpha)
    dvar = (rc + ra) ** 2 - rc**2 + p.gamma_acc(d + 1) * (rc + ra) ** 2 + 3.0 * p.gamma_acc(d + 2) * _mean(x_mag**2)
    sig_lo = sigma - r
    rho = dvar / sig_lo + p.gamma_acc(3) * (sigma + r)
    _require_small(rho, sig_lo, "LayerNorm rounding of sigma")
    z_hat = np.abs(z) + dz_in
    dz_rnd = (alpha + z_hat * rho) / (sig_lo - rho)
    z_mag = (z_hat + dz_rnd) * (1 + p.gamma_acc(2))
    err = np.abs(gain) * (dz_in + dz_rnd + p.gamma_acc(2) * (z_hat + dz_rnd)) + p.dot(2) * (np.abs(gain) * z_mag + np.abs(bias))
    return Est(val, err)


def feed_forward(x: Est, params: Mapping[str, np.ndarray], p: Precision) -> Est:
    """Eq. (2): linear, ReLU, linear."""
    return linear(relu(linear(x, params["w1"], params["b1"], p)), params["w2"], params["b2"], p)


def encoder_layer(x: Est, params: Mapping[str, Any], h: int, visible: np.ndarray | None, eps: float, fully_masked: str, p: Precision) -> Est:
    """§3.1: z = LN(x + MHA(x)); LN(z + FFN(z))."""
    a = multi_head(x, x, x, params["self_attn"], h, visible, fully_masked, p)
    z = layer_norm(add(x, a, p), params["norm1"]["gain"], params["norm1"]["bias"], eps, p)
    return layer_norm(add(z, feed_forward(z, params["ffn"], p), p), params["norm2"]["gain"], params["norm2"]["bias"], eps, p)


def decoder_layer(y: Est, memory: Est, params: Mapping[str, Any], h: int, self_visible: np.ndarray, memory_visible: np.ndarray | None, eps: float, fully_masked: str, p: Precision) -> Est:
    """§3.1: masked self-attention, encoder-decoder attention, FFN; each post-norm."""
    def norm(t: Est, name: str) -> Est:
        return layer_norm(t, params[name]["gain"], params[name]["bias"], eps, p)

    a = norm(add(y, multi_head(y, y, y, params["self_attn"], h, self_visible, fully_masked, p), p), "norm1")
    b = norm(add(a, multi_head(a, memory, memory, params["cross_attn"], h, memory_visible, fully_masked, p), p), "norm2")
    return norm(add(b, feed_forward(b, params["ffn"], p), p), "norm3")


def sinusoids(length: int, d_model: int) -> np.ndarray:
    """§3.5's table in float64, for magnitudes only (the expected values come from the oracle)."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    angle = pos / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    return np.stack((np.sin(angle), np.cos(angle)), axis=-1).reshape(length, d_model)


def positional_bound(length: int, d_model: int, p: Precision) -> np.ndarray:
    """|PE^ - PE| <= u |PE| + eta + (3 length + 4) 2^-52: the final rounding to the dtype, and a
    float64 evaluation whose angle pos / 10000^(2i/d) (pow, division: 3 roundings of a value up to
    ``length``) and sin/cos (1 ulp) each err by a few float64 ulps of the angle."""
    return p.u * np.abs(sinusoids(length, d_model)) + p.eta + (3 * length + 4) * 2.0**-52


def embed(tokens: np.ndarray, params: Mapping[str, Any], p: Precision) -> Est:
    """E[tokens] sqrt(d_model) + PE (§3.4, §3.5): gamma_3 (|E| sqrt(d) + |PE|) (the rounded sqrt,
    the product, the sum) plus the positional table's own error."""
    emb = params["embedding"]
    n, d = tokens.shape[1], emb.shape[1]
    x = emb[tokens] * math.sqrt(d)
    pe = params["positional"][:n] if "positional" in params else sinusoids(n, d)
    pe_err = 0.0 if "positional" in params else positional_bound(n, d, p)
    return Est(x + pe, p.gamma(3) * (np.abs(x) + np.abs(pe)) + pe_err)


def _key_visible(lengths: np.ndarray | None, n: int) -> np.ndarray | None:
    return None if lengths is None else (np.arange(n)[None, :] < np.asarray(lengths)[:, None])[:, None, :]


def transformer(src: np.ndarray, tgt: np.ndarray, params: Mapping[str, Any], h: int, src_lengths: np.ndarray | None, tgt_lengths: np.ndarray | None, eps: float, fully_masked: str, p: Precision) -> Est:
    """Figure 1: embed, N encoder layers, N decoder layers, logits = y E^T (§3.4)."""
    src_vis = _key_visible(src_lengths, src.shape[1])
    n_tgt = tgt.shape[1]
    tgt_vis = np.tril(np.ones((n_tgt, n_tgt), dtype=bool))
    if tgt_lengths is not None:
        tgt_vis = tgt_vis & _key_visible(tgt_lengths, n_tgt)
    x = embed(src, params, p)
    for layer in params["encoder"]:
        x = encoder_layer(x, layer, h, src_vis, eps, fully_masked, p)
    y = embed(tgt, params, p)
    for layer in params["decoder"]:
        y = decoder_layer(y, x, layer, h, tgt_vis, src_vis, eps, fully_masked, p)
    return linear(y, params["embedding"].T, None, p)


def log_softmax_loss(logits: np.ndarray, targets: np.ndarray, eps: float, p: Precision) -> Est:
    """§5.4's smoothed cross-entropy (1 - eps)(-ls_t) + eps mean(-ls), ls = log softmax (variant K).

    All at acc except the final cast. ls_i = (x_i - m) - log S: the shift errs by acc |x_i - m|;
    S = sum exp(x_j - m) by a relative expm1(2 acc max|x - m| + gamma_acc(K+2)) (arguments, exp
    to 1 ulp, the sum), so log S by -log1p(-that) plus acc |log S|; the subtraction adds
    acc |ls_i|. The weighted sum of K + 1 terms and the final cast: dot(K+3) ((1 - eps) |ls_t|
    + eps mean|ls|).
    """
    k = logits.shape[-1]
    m = logits.max(axis=-1, keepdims=True)
    dist = np.abs(logits - m)
    log_s = np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    ls = (logits - m) - log_s
    rel_s = np.expm1(2 * p.acc * dist.max(axis=-1, keepdims=True) + float(p.gamma_acc(k + 2)))
    d_log_s = -np.log1p(-rel_s) + p.acc * np.abs(log_s)
    d_ls = p.acc * dist + d_log_s + p.acc * (np.abs(ls) + p.acc * dist + d_log_s)

    def take(a: np.ndarray) -> np.ndarray:  # the target's entry of each row
        return np.take_along_axis(a, targets[..., None], axis=-1)[..., 0]

    val = (1 - eps) * -take(ls) + eps * -ls.mean(axis=-1)
    err = (1 - eps) * take(d_ls) + eps * d_ls.mean(axis=-1)
    err = err + p.dot(k + 3) * ((1 - eps) * np.abs(take(ls)) + eps * np.abs(ls).mean(axis=-1) + err)
    return Est(val, err)


# ---------------------------------------------------------------------------------------------
# the fixed cases


@dataclass
class Case:
    """One fixed input for one equation.

    ``floats``: float64 arrays (possibly nested in dicts/lists) that go through the dtype;
    ``others``: name -> (array dtype "int64"/"bool", array) or a plain Python value.
    ``call(impl, args)`` runs the implementation on native args; ``oracle(args, policies)`` the
    oracle on the rounded float64 args; ``bound(args, policies, p)`` bounds |impl - oracle|.
    """

    label: str
    floats: dict[str, Any]
    others: dict[str, Any]
    call: Callable[[Any, dict[str, Any]], Any]
    oracle: Callable[[dict[str, Any], Mapping[str, Any]], Any]
    bound: Callable[[dict[str, Any], Mapping[str, Any], Precision], Any]
    once: bool = False  # a Python-number or fixed-dtype equation: checked in dtypes[0] only


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(20170612 + seed)  # arXiv v1 date of the paper, plus the case number


def _mha_params(rng: np.random.Generator, d_model: int, biases: bool = True, scale: float = 1.0) -> dict[str, np.ndarray]:
    p = {n: scale * rng.normal(size=(d_model, d_model)) / math.sqrt(d_model) for n in ("w_q", "w_k", "w_v", "w_o")}
    if biases:
        p.update({n: 0.1 * rng.normal(size=d_model) for n in ("b_q", "b_k", "b_v", "b_o")})
    return p


def _norm_params(rng: np.random.Generator, d: int) -> dict[str, np.ndarray]:
    return {"gain": 1.0 + 0.1 * rng.normal(size=d), "bias": 0.1 * rng.normal(size=d)}


def _ffn_params(rng: np.random.Generator, d: int, d_ff: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"w1": scale * rng.normal(size=(d, d_ff)) / math.sqrt(d), "b1": 0.1 * rng.normal(size=d_ff),
            "w2": scale * rng.normal(size=(d_ff, d)) / math.sqrt(d_ff), "b2": 0.1 * rng.normal(size=d)}


# The layers and the whole model compose a dozen roundings with weight products, and worst-case
# entrywise bounds grow by the sum of |W| at each of them (x3 more at each LayerNorm). With
# weights N(0, 1/fan_in) at d_model 16 the bound of one decoder layer is already vacuous in
# float32. The composite cases therefore use a small width and weights scaled by 0.3, where the
# bounds stay informative in float64/float32 (and float16 for one layer); where they still are
# not, the check is reported as skipped ("error bound not applicable"), never loosened.
_D, _DFF, _H, _SCALE = 8, 16, 2, 0.3


def _enc_params(rng: np.random.Generator, d: int, d_ff: int, scale: float = _SCALE) -> dict[str, Any]:
    return {"self_attn": _mha_params(rng, d, scale=scale), "norm1": _norm_params(rng, d), "ffn": _ffn_params(rng, d, d_ff, scale), "norm2": _norm_params(rng, d)}


def _dec_params(rng: np.random.Generator, d: int, d_ff: int, scale: float = _SCALE) -> dict[str, Any]:
    return {"self_attn": _mha_params(rng, d, scale=scale), "norm1": _norm_params(rng, d), "cross_attn": _mha_params(rng, d, scale=scale),
            "norm2": _norm_params(rng, d), "ffn": _ffn_params(rng, d, d_ff, scale), "norm3": _norm_params(rng, d)}


def _softmax_cases() -> list[Case]:
    rng = _rng(1)
    x = np.stack([rng.normal(size=7), 30.0 * rng.normal(size=7), 5.0 + 1e-3 * rng.normal(size=7), rng.normal(size=7)])
    x[3, [1, 4]] = -np.inf  # masked scores: weight exactly 0
    y = rng.normal(size=(5, 3, 2))

    def case(label: str, arr: np.ndarray, axis: int) -> Case:
        def bound(a: dict, _pol: Mapping, p: Precision) -> np.ndarray:
            moved = np.moveaxis(a["x"], axis, -1)
            est, _ = softmax_rows(Est(np.where(np.isinf(moved), 0.0, moved), np.zeros_like(moved)), ~np.isinf(moved), p)
            return np.moveaxis(est.err, -1, axis)

        return Case(label, {"x": arr}, {"axis": axis},
                    lambda impl, a: impl.softmax(a["x"], axis=a["axis"]),
                    lambda a, _pol: _ref("attention").softmax(a["x"], axis=a["axis"]),
                    bound)

    return [case("rows: N(0,1), 30 N(0,1), 5+1e-3 N(0,1), masked -inf", x, -1), case("axis 0 of (5, 3, 2)", y, 0)]


def _sdpa_case(label: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> Case:
    others = {} if mask is None else {"mask": ("bool", mask)}

    def bound(a: dict, pol: Mapping, p: Precision) -> np.ndarray:
        return attention(Est.exact(a["q"]), Est.exact(a["k"]), Est.exact(a["v"]), a.get("mask"), pol["fully_masked"], p).err

    return Case(label, {"q": q, "k": k, "v": v}, others,
                lambda impl, a: impl.scaled_dot_product_attention(a["q"], a["k"], a["v"], a.get("mask")),
                lambda a, pol: _ref("attention").scaled_dot_product_attention(a["q"], a["k"], a["v"], a.get("mask"), fully_masked=pol["fully_masked"]),
                bound)


def _sdpa_cases() -> list[Case]:
    rng = _rng(2)
    q, k, v = rng.normal(size=(2, 3, 4, 8)), rng.normal(size=(2, 3, 6, 8)), rng.normal(size=(2, 3, 6, 5))
    mask = rng.random((2, 1, 4, 6)) < 0.6
    mask[:, :, :, 0] = True
    mask[1, 0, 2, :] = False  # one fully masked query row: the declared policy decides
    causal = np.arange(6)[None, :] <= np.arange(4)[:, None] + 2  # (4, 6), aligned at the end
    return [
        _sdpa_case("no mask, (2,3) batch", q, k, v, None),
        _sdpa_case("sharp softmax (3 q)", 3.0 * q, k, v, None),
        _sdpa_case("random mask with a fully masked row", q, k, v, mask),
        _sdpa_case("causal (4, 6) mask", q, k, v, causal),
        _sdpa_case("broadcast batch (2,1) x (1,3)", q[:, :1], k[:1], v[:1], None),
    ]


def _mha_case(label: str, query: np.ndarray, key: np.ndarray, params: dict, h: int, mask: np.ndarray | None, self_attention: bool) -> Case:
    floats = {"query": query, "params": params} if self_attention else {"query": query, "key": key, "params": params}
    others = {"num_heads": h} | ({} if mask is None else {"mask": ("bool", mask)})

    def kv(a: dict) -> tuple[Any, Any]:
        return (a["query"], a["query"]) if self_attention else (a["key"], a["key"])

    def bound(a: dict, pol: Mapping, p: Precision) -> np.ndarray:
        x = Est.exact(a["query"])
        k, v = (x, x) if self_attention else (Est.exact(a["key"]), Est.exact(a["key"]))
        return multi_head(x, k, v, a["params"], h, a.get("mask"), pol["fully_masked"], p).err

    return Case(label, floats, others,
                lambda impl, a: impl.multi_head_attention(a["query"], *kv(a), a["params"], a["num_heads"], a.get("mask")),
                lambda a, pol: _ref("attention").multi_head_attention(a["query"], *kv(a), a["params"], h, a.get("mask"), fully_masked=pol["fully_masked"]),
                bound)


def _mha_cases() -> list[Case]:
    rng = _rng(3)
    d = 16
    x, mem = rng.normal(size=(2, 5, d)), rng.normal(size=(2, 7, d))
    with_b, without_b = _mha_params(rng, d), _mha_params(rng, d, biases=False)
    pad = np.arange(5)[None, :] < np.array([5, 3])[:, None]
    pad_mask = pad[:, None, :]  # (2, 1, 5)
    masked = np.broadcast_to(np.tril(np.ones((5, 5), dtype=bool)), (2, 5, 5)).copy()
    masked[1, 3, :] = False  # a fully masked row
    return [
        _mha_case("self-attention, 4 heads, biases, padding mask", x, x, with_b, 4, pad_mask, True),
        _mha_case("self-attention, 2 heads, no biases, causal", x, x, without_b, 2, np.tril(np.ones((5, 5), dtype=bool)), True),
        _mha_case("cross-attention n_q=5, n_k=7, 4 heads", x, mem, with_b, 4, None, False),
        _mha_case("self-attention with a fully masked row", x, x, with_b, 2, masked, True),
    ]


def _pe_cases() -> list[Case]:
    def case(length: int, d_model: int) -> Case:
        return Case(f"length {length}, d_model {d_model}", {}, {"length": length, "d_model": d_model},
                    lambda impl, a: impl.positional_encoding(a["length"], a["d_model"], a["dtype"]),
                    lambda a, _pol: _ref("positional").positional_encoding(a["length"], a["d_model"]),
                    lambda a, _pol, p: positional_bound(a["length"], a["d_model"], p))

    return [case(50, 16), case(0, 8), case(2048, 64)]


def _ln_cases() -> list[Case]:
    rng = _rng(4)
    d = 16
    x = np.stack([rng.normal(size=(4, d)), 3.0 + rng.normal(size=(4, d)), 0.01 * rng.normal(size=(4, d))])  # (3, 4, d)
    g, b = _norm_params(rng, d)["gain"], _norm_params(rng, d)["bias"]

    def case(label: str, eps: float) -> Case:
        return Case(label, {"x": x, "gain": g, "bias": b}, {"eps": eps},
                    lambda impl, a: impl.layer_norm(a["x"], a["gain"], a["bias"], a["eps"]),
                    lambda a, _pol: _ref("layers").layer_norm(a["x"], a["gain"], a["bias"], a["eps"]),
                    lambda a, _pol, p: layer_norm(Est.exact(a["x"]), a["gain"], a["bias"], a["eps"], p).err)

    return [case("N(0,1), 3+N(0,1), 0.01 N(0,1) rows; eps 1e-6", 1e-6), case("same rows; eps 1e-5 (the argument is honoured)", 1e-5)]


def _ffn_cases() -> list[Case]:
    rng = _rng(5)
    x = rng.normal(size=(2, 5, 16))
    w = _ffn_params(rng, 16, 32)
    return [Case("x (2,5,16), d_ff 32", {"x": x, **w}, {},
                 lambda impl, a: impl.feed_forward(a["x"], a["w1"], a["b1"], a["w2"], a["b2"]),
                 lambda a, _pol: _ref("layers").feed_forward(a["x"], a["w1"], a["b1"], a["w2"], a["b2"]),
                 lambda a, _pol, p: feed_forward(Est.exact(a["x"]), a, p).err)]


def _lrate_cases() -> list[Case]:
    """Eq. (3) in float64 on both sides: a handful of roundings (rsqrt, pow, products), within
    gamma_8 of float64 for each side, so |impl - oracle| <= gamma_8(2^-52) |lrate|."""
    steps = [0, 1, 10, 3999, 4000, 4001, 100000]

    def used(pol: Mapping) -> list[int]:  # step 0 only where the declared policy gives it a value
        return steps if pol["step_zero"] == "zero" else steps[1:]

    def run(impl: Any, a: dict) -> np.ndarray:
        return np.array([impl.lrate(s, 512, 4000) for s in used(impl.policies)], dtype=np.float64)

    def oracle(a: dict, pol: Mapping) -> np.ndarray:
        lr = _ref("training").lrate
        return np.array([float(lr(s, 512, 4000, step_zero=pol["step_zero"])) for s in used(pol)])

    def bound(a: dict, pol: Mapping, _p: Precision) -> np.ndarray:
        return Precision(2.0**-52, 2.0**-52, 0.0).gamma(8) * np.abs(oracle(a, pol))

    return [Case(f"steps {steps}, d_model 512, warmup 4000", {}, {}, run, oracle, bound, once=True)]


def _smoothing_cases() -> list[Case]:
    """q computed in float64 (two roundings) then rounded to dtypes[0]: u |q| + gamma_2(2^-53) |q|."""
    rng = _rng(6)
    targets = rng.integers(0, 11, size=(2, 5))

    def bound(a: dict, pol: Mapping, p: Precision) -> np.ndarray:
        q = oracle(a, pol)
        return (p.u + 3 * 2.0**-53) * np.abs(q)

    def oracle(a: dict, pol: Mapping) -> np.ndarray:
        return _ref("training").label_smoothing(a["targets"], 11, 0.1, variant=pol["label_smoothing"])

    return [Case("targets (2,5), K=11, eps 0.1", {}, {"targets": ("int64", targets)},
                 lambda impl, a: impl.label_smoothing(a["targets"], 11, 0.1), oracle, bound, once=True)]


def _xent_cases() -> list[Case]:
    rng = _rng(7)
    logits = 3.0 * rng.normal(size=(2, 5, 11))
    targets = rng.integers(0, 11, size=(2, 5))

    def case(eps: float) -> Case:
        return Case(f"logits 3 N(0,1) (2,5,11), eps {eps}", {"logits": logits}, {"targets": ("int64", targets), "eps": eps},
                    lambda impl, a: impl.smoothed_cross_entropy(a["logits"], a["targets"], a["eps"]),
                    lambda a, pol: _ref("training").smoothed_cross_entropy(a["logits"], a["targets"], a["eps"], variant=pol["label_smoothing"]),
                    lambda a, _pol, p: log_softmax_loss(a["logits"], a["targets"], a["eps"], p).err)

    return [case(0.1), case(0.0)]


def _encoder_cases() -> list[Case]:
    rng = _rng(8)
    x, params = rng.normal(size=(2, 5, _D)), _enc_params(rng, _D, _DFF)
    pad = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]

    def case(label: str, mask: np.ndarray | None) -> Case:
        return Case(label, {"x": x, "params": params}, {"num_heads": _H} | ({} if mask is None else {"mask": ("bool", mask)}),
                    lambda impl, a: impl.encoder_layer(a["x"], a["params"], a["num_heads"], a.get("mask")),
                    lambda a, pol: _ref("model").encoder_layer(a["x"], a["params"], _H, a.get("mask"), eps=pol["layer_norm_eps"]),
                    lambda a, pol, p: encoder_layer(Est.exact(a["x"]), a["params"], _H, a.get("mask"), pol["layer_norm_eps"], pol["fully_masked"], p).err)

    return [case("x (2,5,8), h 2, d_ff 16, no mask", None), case("padding lengths [5, 3]", pad)]


def _decoder_cases() -> list[Case]:
    rng = _rng(9)
    y, mem, params = rng.normal(size=(2, 4, _D)), rng.normal(size=(2, 5, _D)), _dec_params(rng, _D, _DFF)
    mem_mask = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]
    causal = np.tril(np.ones((4, 4), dtype=bool))
    self_mask = causal & (np.arange(4)[None, :] < np.array([4, 2])[:, None])[:, None, :]

    def case(label: str, sm: np.ndarray | None, mm: np.ndarray | None) -> Case:
        others = {"num_heads": _H} | ({} if sm is None else {"self_mask": ("bool", sm)}) | ({} if mm is None else {"memory_mask": ("bool", mm)})
        return Case(label, {"y": y, "memory": mem, "params": params}, others,
                    lambda impl, a: impl.decoder_layer(a["y"], a["memory"], a["params"], a["num_heads"], a.get("self_mask"), a.get("memory_mask")),
                    lambda a, pol: _ref("model").decoder_layer(a["y"], a["memory"], a["params"], _H, a.get("self_mask"), a.get("memory_mask"), eps=pol["layer_norm_eps"]),
                    lambda a, pol, p: decoder_layer(Est.exact(a["y"]), Est.exact(a["memory"]), a["params"], _H,
                                                    causal if sm is None else a["self_mask"], a.get("memory_mask"), pol["layer_norm_eps"], pol["fully_masked"], p).err)

    return [case("default (causal) self mask, no memory mask", None, None), case("causal+padding self mask, memory padding", self_mask, mem_mask)]


def _transformer_cases() -> list[Case]:
    rng = _rng(10)
    vocab, n_layers = 11, 1
    params = {"embedding": rng.normal(size=(vocab, _D)) / math.sqrt(_D),
              "encoder": [_enc_params(rng, _D, _DFF) for _ in range(n_layers)],
              "decoder": [_dec_params(rng, _D, _DFF) for _ in range(n_layers)]}
    src, tgt = rng.integers(0, vocab, size=(2, 5)), rng.integers(0, vocab, size=(2, 4))

    def case(label: str, src_len: np.ndarray | None, tgt_len: np.ndarray | None) -> Case:
        others = {"src": ("int64", src), "tgt": ("int64", tgt), "num_heads": _H}
        others |= ({} if src_len is None else {"src_lengths": ("int64", src_len)}) | ({} if tgt_len is None else {"tgt_lengths": ("int64", tgt_len)})
        return Case(label, {"params": params}, others,
                    lambda impl, a: impl.transformer_forward(a["src"], a["tgt"], a["params"], a["num_heads"], a.get("src_lengths"), a.get("tgt_lengths")),
                    lambda a, pol: _ref("model").transformer_forward(a["src"], a["tgt"], a["params"], _H, src_lengths=a.get("src_lengths"),
                                                                     tgt_lengths=a.get("tgt_lengths"), eps=pol["layer_norm_eps"]),
                    lambda a, pol, p: transformer(a["src"], a["tgt"], a["params"], _H, a.get("src_lengths"), a.get("tgt_lengths"),
                                                  pol["layer_norm_eps"], pol["fully_masked"], p).err)

    return [case("N=1, d 8, h 2, vocab 11, no padding", None, None), case("padding: src [5, 3], tgt [4, 2]", np.array([5, 3]), np.array([4, 2]))]


def fixed_cases() -> dict[str, list[Case]]:
    """Every equation's fixed cases, by the contract's equation names."""
    return {
        "softmax": _softmax_cases(),
        "scaled_dot_product_attention": _sdpa_cases(),
        "multi_head_attention": _mha_cases(),
        "positional_encoding": _pe_cases(),
        "layer_norm": _ln_cases(),
        "feed_forward": _ffn_cases(),
        "lrate": _lrate_cases(),
        "label_smoothing": _smoothing_cases(),
        "smoothed_cross_entropy": _xent_cases(),
        "encoder_layer": _encoder_cases(),
        "decoder_layer": _decoder_cases(),
        "transformer_forward": _transformer_cases(),
    }


def _ref(module: str) -> Any:
    """The oracle module ``reference.<module>`` (imported on use: a missing one skips its checks)."""
    import importlib

    return importlib.import_module(f"reference.{module}")


# ---------------------------------------------------------------------------------------------
# running a case


#: Disagreements that are understood and documented (``implementations/torch_nn.py``), keyed by
#: (implementation, equation, case). They are still reported, as status "known-deviation", but
#: do not make the script exit non-zero. Measured on the CPU with torch 2.13.
KNOWN_DEVIATIONS: dict[tuple[str, str, str], str] = {
    ("torch-nn-fastpath", "multi_head_attention", "self-attention with a fully masked row"): (
        "PyTorch's fused inference kernel (torch._native_multi_head_attention) returns NaN for a fully "
        "masked query row; the modules' documented forward (scaled_dot_product_attention) returns 0"
    ),
}


@dataclass
class CheckResult:
    """One case of one equation in one dtype on one implementation."""

    impl: str
    device: str
    equation: str
    dtype: str
    case: str
    status: str  # "pass" | "fail" | "known-deviation" | "skip"
    worst_fraction_of_bound: float | None = None  # max |impl - oracle| / bound
    max_abs_error: float | None = None
    message: str = ""


def _convert(impl: Any, tree: Any, dtype: str) -> Any:
    if isinstance(tree, dict):
        return {k: _convert(impl, v, dtype) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_convert(impl, v, dtype) for v in tree]
    return impl.from_numpy(np.asarray(tree, dtype=np.float64), dtype)


def _back(impl: Any, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _back(impl, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_back(impl, v) for v in tree]
    return impl.to_numpy(tree)


def _compare(out: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> tuple[bool, float, float, str]:
    """NaN where the oracle has NaN (and only there); elsewhere |out - ref| <= bound."""
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return False, math.inf, math.inf, f"shape {out.shape}, expected {ref.shape}"
    nan_out, nan_ref = np.isnan(out), np.isnan(ref)
    if np.any(nan_out != nan_ref):
        where = tuple(int(i) for i in np.argwhere(nan_out != nan_ref)[0])
        return False, math.inf, math.inf, f"NaN pattern differs first at {where}: got {out[where]}, oracle {ref[where]}"
    if ref.size == 0:
        return True, 0.0, 0.0, "empty on both sides"
    if not np.any(~nan_ref):
        return True, 0.0, 0.0, "all NaN on both sides"
    diff = np.where(nan_ref, 0.0, np.abs(out - ref))
    b = np.where(nan_ref, 0.0, np.broadcast_to(bound, ref.shape) * MAGNITUDE_SLACK)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(diff == 0, 0.0, diff / b)
    idx = np.unravel_index(int(np.argmax(frac)), frac.shape)
    where = tuple(int(i) for i in idx)
    worst = float(frac[idx])
    msg = f"worst at {where}: got {out[idx]!r}, oracle {ref[idx]!r}, |diff| {diff[idx]:.3g} vs bound {b[idx]:.3g}"
    return worst <= 1.0, worst, float(diff.max()), msg


def run_case(impl: Any, equation: str, dtype: str, case: Case) -> CheckResult:
    """Run one case: convert inputs, call the implementation and the oracle, compare with the bound."""
    base = dict(impl=impl.name, device=str(impl.device), equation=equation, dtype=dtype, case=case.label)
    native = _convert(impl, case.floats, dtype)
    rounded = _back(impl, native)
    for name, value in case.others.items():
        if isinstance(value, tuple):
            native[name] = impl.from_numpy(value[1], value[0])
            rounded[name] = value[1]
        else:
            native[name] = rounded[name] = value
    native["dtype"] = rounded["dtype"] = dtype
    pol = dict(impl.policies)
    try:
        ref = case.oracle(rounded, pol)
    except ImportError as exc:
        return CheckResult(**base, status="skip", message=f"oracle not available: {exc}")
    try:
        bound = case.bound(rounded, pol, Precision.for_dtype(dtype))
    except BoundNotApplicable as exc:
        return CheckResult(**base, status="skip", message=f"error bound not applicable: {exc}")
    result = case.call(impl, native)
    out = result if isinstance(result, np.ndarray) else impl.to_numpy(result)
    ok, worst, max_abs, msg = _compare(out, ref, bound)
    known = KNOWN_DEVIATIONS.get((impl.name, equation, case.label))
    status = "pass" if ok else ("known-deviation" if known else "fail")
    return CheckResult(**base, status=status, worst_fraction_of_bound=worst, max_abs_error=max_abs, message=f"{known}: {msg}" if known and not ok else msg)


def run_checks(impl: Any, equations: list[str] | None = None, dtypes: list[str] | None = None) -> list[CheckResult]:
    """Every fixed case of ``equations`` (default: all provided) in ``dtypes`` (default: all declared)."""
    from aiayn.implementations.protocol import provided_equations

    provided = provided_equations(impl)
    cases = fixed_cases()
    results = []
    for equation in equations or list(cases):
        for dtype in dtypes or list(impl.dtypes):
            for case in cases[equation]:
                base = dict(impl=impl.name, device=str(impl.device), equation=equation, dtype=dtype, case=case.label)
                if equation not in provided:
                    results.append(CheckResult(**base, status="skip", message="not provided"))
                elif dtype not in impl.dtypes:
                    results.append(CheckResult(**base, status="skip", message=f"dtype not declared (declares {impl.dtypes})"))
                elif case.once and dtype != impl.dtypes[0]:
                    results.append(CheckResult(**base, status="skip", message=f"dtype-independent: checked in {impl.dtypes[0]} only"))
                else:
                    results.append(run_case(impl, equation, dtype, case))
    return results


# ---------------------------------------------------------------------------------------------
# throughput


@dataclass
class Timing:
    what: str
    dtype: str
    n: int
    causal: bool
    seconds: float
    tflops: float
    fraction_of_gemm: float | None = None
    note: str = ""


def _time(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds per call after one warm-up call (CUDA events on a GPU)."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gemm_ceiling(dtype: str, device: str, n: int) -> Timing:
    """An n x n x n GEMM (torch.matmul -> cuBLAS on CUDA): 2 n^3 flops; the machine's ceiling here."""
    import torch

    from aiayn.implementations.torch_impl import TORCH_DTYPES

    a = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(TORCH_DTYPES[dtype])
    s = _time(lambda: torch.matmul(a, b), device, repeats=5)
    return Timing("GEMM (ceiling)", dtype, n, False, s, 2 * n**3 / s / 1e12, 1.0)


def attention_throughput(impls: list[Any], dtype: str, n: int, causal: bool, ceiling: float, heads: int = 8, d_k: int = 64) -> list[Timing]:
    """Eq. (1) at B = 1, h = 8, d_k = 64. Useful flops 4 d_k h per visible (query, key) pair (QK^T
    and PV): n^2 pairs, or n (n + 1) / 2 when causal."""
    import torch
    import torch.nn.functional as F

    from aiayn.implementations.torch_impl import TORCH_DTYPES

    device = str(impls[0].device)
    dt = TORCH_DTYPES[dtype]
    q, k, v = (torch.randn(1, heads, n, d_k, device=device).to(dt) for _ in range(3))
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril() if causal else None
    pairs = n * (n + 1) // 2 if causal else n * n  # (query, key) pairs that take part
    flops = 4 * pairs * d_k * heads
    rows = []
    runs: list[tuple[str, Callable[[], Any], str]] = [
        (impl.name, (lambda impl=impl: impl.scaled_dot_product_attention(q, k, v, mask)), "boolean mask" if causal else "") for impl in impls
    ]
    runs.append(("F.sdpa (is_causal flag)" if causal else "F.sdpa (no mask)", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), "PyTorch's own kernel choice"))
    for what, fn, note in runs:
        try:
            s = _time(fn, device, repeats=3)
        except RuntimeError as exc:  # e.g. out of memory at the largest n
            rows.append(Timing(what, dtype, n, causal, math.nan, math.nan, None, f"failed: {str(exc).splitlines()[0][:120]}"))
            continue
        tf = flops / s / 1e12
        rows.append(Timing(what, dtype, n, causal, s, tf, tf / ceiling, note))
    del q, k, v, mask
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# the script


def _environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                           "device": device, "platform": platform.platform()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "sdpa_flash_enabled": torch.backends.cuda.flash_sdp_enabled(),
            "sdpa_mem_efficient_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "sdpa_math_enabled": torch.backends.cuda.math_sdp_enabled(),
        }
    else:
        env["gpu"] = "none (CPU dry run)"
    return env


@contextlib.contextmanager
def _float32_accumulation(cuda: bool) -> Iterator[None]:
    """While checking, make cuBLAS keep float32 split-K reductions for float16/bfloat16 products.

    The bounds assume float32 accumulation (:class:`Precision`); PyTorch's defaults let cuBLAS
    round split-K partial sums to half precision. The throughput run keeps the defaults.
    """
    if not cuda:
        yield
        return
    import torch

    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction)
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = saved


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [f"# GPU check: {env['gpu']}", "",
             f"torch {env['torch']}, numpy {env['numpy']}, Python {env['python']}, device `{env['device']}`; "
             f"{report['elapsed_seconds']:.0f} s; generated {report['generated']}.", "", "## Environment", ""]
    lines += [f"- {k}: `{v}`" for k, v in env.items()]
    summary = report["summary"]
    lines += ["", "## Agreement with the oracle (fixed inputs)", "",
              "Checked with cuBLAS reduced-precision (split-K) reductions switched off, as the bounds assume float32 "
              "accumulation; the environment above lists PyTorch's settings as found.", "",
              f"{summary['pass']} passed, {summary['fail']} failed, {summary['known-deviation']} known deviations, {summary['skip']} skipped. "
              "`worst` is max |impl - oracle| / derived bound (<= 1 passes).", "",
              "| impl | equation | dtype | case | status | worst | message |", "|---|---|---|---|---|---|---|"]
    for r in report["checks"]:
        if r["status"] == "skip" and r["message"].startswith(("dtype-independent", "not provided", "dtype not declared")):
            continue
        worst = "" if r["worst_fraction_of_bound"] is None else f"{r['worst_fraction_of_bound']:.3g}"
        msg = r["message"] if r["status"] != "pass" else ""
        lines.append(f"| {r['impl']} | {r['equation']} | {r['dtype']} | {r['case']} | {r['status']} | {worst} | {msg} |")
    lines += ["", "## Throughput: Eq. (1), B=1, h=8, d_k=64", "",
              "TFLOP/s counts useful flops (4 d_k h per visible query-key pair: n^2, or n(n+1)/2 when causal); `of GEMM` divides by the same dtype's "
              "square GEMM measured in this run.", "",
              "| what | dtype | n | causal | ms | TFLOP/s | of GEMM | note |", "|---|---|---|---|---|---|---|---|"]
    for t in report["throughput"]:
        frac = "" if t["fraction_of_gemm"] is None else f"{t['fraction_of_gemm']:.2f}"
        lines.append(f"| {t['what']} | {t['dtype']} | {t['n']} | {t['causal']} | {t['seconds'] * 1e3:.3f} | {t['tflops']:.2f} | {frac} | {t['note']} |")
    for note in report["notes"]:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def _load_impls(names: list[str]) -> list[Any]:
    from aiayn.implementations.registry import load
    from aiayn.implementations.torch_nn import TorchNNImplementation

    impls = []
    for name in names:
        impls.append(TorchNNImplementation(fastpath=True) if name == "torch-nn-fastpath" else load(name))
    return impls


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (0 ok, 1 a check failed, 2 no CUDA)."""
    parser = argparse.ArgumentParser(prog="python -m aiayn.conformance.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for gpu_check.json and gpu_check.md")
    parser.add_argument("--allow-cpu", action="store_true", help="without CUDA, do a CPU dry run (small sizes) instead of failing")
    parser.add_argument("--impls", default="torch,torch-sdpa,torch-nn,torch-nn-fastpath", help="comma-separated implementations to check")
    parser.add_argument("--sizes", default=None, help="comma-separated sequence lengths (default 512,2048,8192 on CUDA, 128,256 on CPU)")
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds after which remaining throughput runs are skipped")
    args = parser.parse_args(argv)

    import torch

    t0 = time.perf_counter()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu_check: no CUDA device is visible to PyTorch (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or pass --allow-cpu for a CPU dry run.", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    impls = _load_impls([s for s in args.impls.split(",") if s])
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([512, 2048, 8192] if cuda else [128, 256])
    check_dtypes = ["float32", "float16", "bfloat16"]

    env = _environment(device)  # PyTorch's settings as found, before the checks change any
    checks: list[CheckResult] = []
    with _float32_accumulation(cuda):
        for impl in impls:
            checks += run_checks(impl, dtypes=[d for d in check_dtypes if d in impl.dtypes] or list(impl.dtypes))

    notes: list[str] = []
    timings: list[Timing] = []
    attn_impls = [i for i in impls if i.name in ("torch", "torch-sdpa")]
    for dtype in (["float16", "bfloat16", "float32"] if cuda else ["float32"]):
        if time.perf_counter() - t0 > args.time_limit:
            notes.append(f"time limit {args.time_limit:.0f} s reached: throughput runs from {dtype} on were skipped")
            break
        ceiling = gemm_ceiling(dtype, device, 8192 if cuda else 512)
        timings.append(ceiling)
        for n in sizes:
            for causal in (False, True):
                if time.perf_counter() - t0 > args.time_limit:
                    break
                timings += attention_throughput(attn_impls, dtype, n, causal, ceiling.tflops)

    summary = {s: sum(r.status == s for r in checks) for s in ("pass", "fail", "known-deviation", "skip")}
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "elapsed_seconds": time.perf_counter() - t0,
        "environment": env,
        "implementations": [{"name": i.name, "version": i.version, "device": str(i.device), "dtypes": list(i.dtypes), "policies": dict(i.policies)} for i in impls],
        "summary": summary,
        "checks": [asdict(r) for r in checks],
        "throughput": [asdict(t) for t in timings],
        "notes": notes,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "gpu_check.md").write_text(_markdown(report))
    print(f"gpu_check: {summary['pass']} passed, {summary['fail']} failed, {summary['known-deviation']} known deviations, {summary['skip']} skipped; "
          f"{len(timings)} timings; {report['elapsed_seconds']:.0f} s; wrote {args.out / 'gpu_check.md'}")
    for r in checks:
        if r.status == "fail":
            print(f"  FAIL {r.impl} {r.equation} {r.dtype} [{r.case}]: {r.message}")
    return 1 if summary["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
