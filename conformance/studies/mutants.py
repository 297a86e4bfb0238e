"""Deliberately broken implementations: proof that the conformance suite has teeth.

Each mutant is a built-in with one realistic bug, the kind a person writing the paper's equations
could make, and carries the name of that bug in the catalogue of ``diagnoses/forward.py`` (``departure``),
which the suite must name when it catches it. A mutant provides only the equations its bug lives
in (``targets``), so the suite runs just the checks that concern it.

- :data:`MUTANTS`: the NumPy built-in with one bug each, in its forward pass (:data:`FORWARD_MUTANTS`) or in its
  hand-written backward (:data:`BACKWARD_MUTANTS`, the forward intact). ``tests/meta/test_conformance_mutants.py``
  runs the suite (the derandomized ``smoke`` profile: the same 8 examples per check every run) against all of
  them and requires every one to be caught and
  diagnosed as itself, with the unbroken NumPy implementation as the control; ``aiayn mutants``
  does the same and writes the kill table to ``reports/conformance-mutants.md`` and ``.json``.
- :data:`TORCH_MUTANTS`: the PyTorch built-in with one bug each, built on first use (importing
  this module imports no torch); ``tests/test_torch_impl.py`` runs them through the registered
  checks on the fixed inputs (``inputs/fixed.py``) and requires each to be caught and diagnosed.

Check one with ``aiayn check aiayn.conformance.studies.mutants:NoScale`` (or ``:TorchNoScale``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.conformance.checks.training import NO_DROPOUT_AT_EVALUATION
from aiayn.conformance.diagnoses.split import PAGE_TAIL_TIMES_ZERO, UNNORMALISED_MERGE
from aiayn.conformance.report.results import Row, Status
from aiayn.conformance.run.runner import pytest_arguments
from aiayn.implementations import numpy_backward as backward
from aiayn.implementations import numpy_impl as base
from aiayn.implementations.numpy_impl import NumpyImplementation
from aiayn.kit import Report, md_table, write_report

__all__ = [
    "BACKWARD_MUTANTS",
    "DECODE_MUTANTS",
    "FORWARD_MUTANTS",
    "MUTANTS",
    "TORCH_MUTANTS",
    "Bug",
    "Mutant",
    "kill_table",
    "run",
    "run_mutants",
]


class Bug:
    """What a mutant declares besides its implementation: ``name``, ``targets`` (the equations it provides),
    ``departure`` (the bug's name in the catalogue of ``diagnoses/forward.py``) and its docstring's first line (the
    bug)."""

    targets: frozenset[str] = frozenset()
    departure: str = ""
    #: the dtype whose rows show the bug, where not every declared one does (a float32 path inside a float64 claim)
    shows_in: str | None = None

    def provides(self) -> frozenset[str]:
        return self.targets

    @classmethod
    def bug(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0]


class Mutant(Bug, NumpyImplementation):
    """The NumPy implementation with one bug in its forward pass; subclasses set what :class:`Bug` lists. Its
    gradients are not provided (the backward checks of a forward bug would only repeat it: a backward mutant's bug
    is in its gradients, :class:`BackwardMutant`)."""

    def vjp(self, equation: str, args: list[Any], d_out: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError("a forward mutant: its bug is in the forward pass")


def _visible(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    return np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return np.matmul(q, np.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))  # (..., n_q, n_k)


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        e = np.exp(z - np.max(z, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


# --------------------------------------------------------------------------------------------
# §3.2.1 softmax and Eq. (1)


class ScaleByDk(Mutant):
    """Scores divided by d_k instead of sqrt(d_k)."""

    name, targets = "mutant-scale-by-dk", frozenset({"scaled_dot_product_attention", "multi_head_attention"})
    departure = "scores divided by d_k instead of sqrt(d_k)"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        return super().scaled_dot_product_attention(q * (1.0 / math.sqrt(q.shape[-1])), k, v, mask)


class NoScale(Mutant):
    """No 1/sqrt(d_k) scaling of the scores."""

    name, targets = "mutant-no-scale", frozenset({"scaled_dot_product_attention", "multi_head_attention"})
    departure = "no 1/sqrt(d_k) scaling"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        return super().scaled_dot_product_attention(q * math.sqrt(q.shape[-1]), k, v, mask)


class SoftmaxOverQueries(Mutant):
    """Attention weights normalised over the query axis instead of the key axis."""

    name, targets = "mutant-softmax-over-queries", frozenset({"scaled_dot_product_attention"})
    departure = "softmax over the queries instead of the keys"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        s = _scores(q, k)
        s = np.where(_visible(mask, s.shape), s, -np.inf)
        return np.matmul(_softmax(s, -2), v)


class MaskAfterSoftmax(Mutant):
    """Mask applied after the softmax (weights zeroed, not renormalised)."""

    name, targets = "mutant-mask-after-softmax", frozenset({"scaled_dot_product_attention"})
    departure = "mask applied after the softmax"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        s = _scores(q, k)
        p = _softmax(s, -1) * _visible(mask, s.shape)
        return np.matmul(p, v)


class AdditiveMask(Mutant):
    """Mask as an additive -1e4 on the scores instead of -inf."""

    name, targets = "mutant-additive-mask", frozenset({"scaled_dot_product_attention"})
    departure = "finite mask value -1e4 added to the scores"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        s = _scores(q, k)
        s = s + np.where(_visible(mask, s.shape), 0.0, -1e4).astype(s.dtype)
        return np.matmul(_softmax(s, -1), v)


class SkipsLastPartialTile(Mutant):
    """Eq. (1) beyond 16 query rows computed in tiles of 16 whose loop covers whole tiles only: the rows past the last
    whole tile keep the zeros of the output buffer (16 rows or fewer take a path of their own)."""

    name = "mutant-skips-last-partial-tile"
    targets = frozenset({"scaled_dot_product_attention", "multi_head_attention"})
    departure = "the last partial tile of 16 query rows left unwritten (0)"

    def __init__(self) -> None:  # writes into the caller's out= too, where it leaves the same rows as they were
        super().__init__(policies={"writes_out": ("scaled_dot_product_attention",)})

    def scaled_dot_product_attention(self, q, k, v, mask=None, out=None):
        full = super().scaled_dot_product_attention(q, k, v, mask)
        if out is None and full.shape[-2] <= 16:
            return full
        out = np.zeros_like(full) if out is None else out
        whole = (full.shape[-2] // 16) * 16 if full.shape[-2] > 16 else full.shape[-2]
        for start in range(0, whole, 16):  # the bug: range(0, n_q, 16) would reach the last partial tile
            out[..., start : start + 16, :] = full[..., start : start + 16, :]
        return out


class MergeForgetsToRenormalise(Mutant):
    """Split keys: the merge of blocks' states weights each output by exp(L_p - max L) and sums, never dividing by
    the weights' sum (right only where one block holds every visible key)."""

    name, targets = "mutant-merge-forgets-to-renormalise", frozenset({"scaled_dot_product_attention"})
    departure = UNNORMALISED_MERGE

    def merge_attention_states(self, outs, lses):
        out, lse = super().merge_attention_states(outs, lses)
        m = np.max(lses, axis=0)
        alive = m > -np.inf
        w = np.exp(lses - np.where(alive, m, 0.0).astype(lses.dtype))  # (P, ..., n_q)
        return np.sum(w[..., None] * outs, axis=0).astype(outs.dtype), lse  # the bug: no division by sum_p w_p


class PagedTailTimesZero(Mutant):
    """Split keys: a paged kernel that gives the slots past a sentence's length weight 0 but multiplies their values
    by it, so a NaN left in the page (0 x NaN) reaches the result."""

    name, targets = "mutant-paged-tail-times-zero", frozenset({"scaled_dot_product_attention"})
    departure = PAGE_TAIL_TIMES_ZERO

    def paged_attention(self, q, k_pages, v_pages, block_table, lengths):
        b, m = block_table.shape
        span = m * k_pages.shape[1]
        visible = np.arange(span)[None, :] < lengths[:, None]  # (B, M page)
        k = np.where(visible[..., None], k_pages[block_table].reshape(b, span, -1), 0.0).astype(q.dtype)
        v = v_pages[block_table].reshape(b, span, -1)  # the bug: the tail's values kept
        s = np.where(visible[:, None, :], _scores(q, k), -np.inf)
        with np.errstate(invalid="ignore"):
            return np.matmul(_softmax(s, -1), v).astype(q.dtype)


class MaskIgnored(Mutant):
    """The mask argument is ignored."""

    name, targets = "mutant-mask-ignored", frozenset({"scaled_dot_product_attention"})
    departure = "mask ignored"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        return super().scaled_dot_product_attention(q, k, v, None)


class FullyMaskedZeros(Mutant):
    """Fully masked rows give zeros while the declared policy says NaN."""

    name, targets = "mutant-fully-masked-zeros", frozenset({"scaled_dot_product_attention"})
    departure = "fully masked rows give zeros"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        return NumpyImplementation(policies={"fully_masked": "zeros"}).scaled_dot_product_attention(q, k, v, mask)


class UnshiftedSoftmax(Mutant):
    """Softmax without the max shift: exp overflows for large logits."""

    name, targets = "mutant-unshifted-softmax", frozenset({"softmax"})
    departure = "softmax without the max shift"

    def softmax(self, x, axis=-1):
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(x)
            return e / np.sum(e, axis=axis, keepdims=True)


class SoftmaxLastAxisOnly(Mutant):
    """Softmax always over the last axis, whatever ``axis`` says."""

    name, targets = "mutant-softmax-last-axis", frozenset({"softmax"})
    departure = "softmax over the last axis whatever axis says"

    def softmax(self, x, axis=-1):
        return super().softmax(x, -1)


# --------------------------------------------------------------------------------------------
# §3.2.2 multi-head attention


def _mha_with(impl: NumpyImplementation, query, key, value, params, num_heads, mask, split, merge):
    q = split(base._affine(query, params["w_q"], params.get("b_q")), num_heads)
    k = split(base._affine(key, params["w_k"], params.get("b_k")), num_heads)
    v = split(base._affine(value, params["w_v"], params.get("b_v")), num_heads)
    heads = impl.scaled_dot_product_attention(q, k, v, None if mask is None else mask[..., None, :, :])
    return base._affine(merge(heads), params["w_o"], params.get("b_o"))


class HeadsSplitStrided(Mutant):
    """Heads split along the wrong axis: head i takes columns i, i+h, i+2h, ... instead of a block."""

    name, targets = "mutant-heads-split-strided", frozenset({"multi_head_attention"})
    departure = "heads interleaved (head i takes columns i, i+h, ...)"

    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        def split(x, h):
            *batch, n, width = x.shape
            return np.moveaxis(x.reshape(*batch, n, width // h, h), -1, -3)  # (..., h, n, d)

        return _mha_with(self, query, key, value, params, num_heads, mask, split, lambda x: base._merge_heads(x))


class HeadsConcatReversed(Mutant):
    """Heads concatenated in reverse order before W^O."""

    name, targets = "mutant-heads-concat-reversed", frozenset({"multi_head_attention"})
    departure = "heads concatenated in reverse order"

    def multi_head_attention(self, query, key, value, params, num_heads, mask=None):
        split = lambda x, h: base._split_heads(x, h, "w")  # noqa: E731
        return _mha_with(
            self, query, key, value, params, num_heads, mask, split, lambda x: base._merge_heads(x[..., ::-1, :, :])
        )


# --------------------------------------------------------------------------------------------
# §3.5 positional encoding


class PESinCosSwapped(Mutant):
    """Positional encoding with cos in the even and sin in the odd dimensions."""

    name, targets = "mutant-pe-sin-cos-swapped", frozenset({"positional_encoding"})
    departure = "cos in the even, sin in the odd dimensions"

    def positional_encoding(self, length, d_model, dtype):
        pe = super().positional_encoding(length, d_model, dtype)
        return np.ascontiguousarray(pe.reshape(length, d_model // 2, 2)[..., ::-1].reshape(length, d_model))


class PEBase1000(Mutant):
    """Positional encoding with base 1000 instead of 10000."""

    name, targets = "mutant-pe-base-1000", frozenset({"positional_encoding"})
    departure = "positional base 1000 instead of 10000"

    def positional_encoding(self, length, d_model, dtype):
        dt = np.dtype(dtype)
        inv_freq = np.power(dt.type(1000.0), -(np.arange(0, d_model, 2, dtype=dt) / dt.type(d_model)))
        angle = np.arange(length, dtype=dt)[:, None] * inv_freq
        pe = np.empty((length, d_model), dtype=dt)
        pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
        return pe


# --------------------------------------------------------------------------------------------
# §3.1 LayerNorm, §3.3 FFN


class LayerNormEpsOutsideSqrt(Mutant):
    """LayerNorm divides by sqrt(var) + eps instead of sqrt(var + eps)."""

    name, targets = "mutant-layernorm-eps-outside-sqrt", frozenset({"layer_norm"})
    departure = "eps added to the std"

    def layer_norm(self, x, gain, bias, eps):
        c = x - np.mean(x, axis=-1, keepdims=True)
        return c / (np.sqrt(np.mean(c * c, axis=-1, keepdims=True)) + eps) * gain + bias


class LayerNormUnbiasedVariance(Mutant):
    """LayerNorm with the unbiased variance (divide by d - 1)."""

    name, targets = "mutant-layernorm-unbiased-variance", frozenset({"layer_norm"})
    departure = "unbiased variance"

    def layer_norm(self, x, gain, bias, eps):
        with np.errstate(divide="ignore", invalid="ignore"):
            var = np.var(x, axis=-1, keepdims=True, ddof=1)
        return (x - np.mean(x, axis=-1, keepdims=True)) / np.sqrt(var + eps) * gain + bias


class LayerNormOnePassVariance(Mutant):
    """LayerNorm with the one-pass variance E[x^2] - E[x]^2 (cancels catastrophically on near-constant rows)."""

    name, targets = "mutant-layernorm-one-pass-variance", frozenset({"layer_norm"})
    departure = "one-pass variance E[x^2] - E[x]^2"

    def layer_norm(self, x, gain, bias, eps):
        mean = np.mean(x, axis=-1, keepdims=True)
        var = np.maximum(np.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0)
        return (x - mean) / np.sqrt(var + eps) * gain + bias


class FFNWithoutReLU(Mutant):
    """Feed-forward network without the ReLU: x W1 W2 + ..."""

    name, targets = "mutant-ffn-no-relu", frozenset({"feed_forward"})
    departure = "no ReLU"

    def feed_forward(self, x, w1, b1, w2, b2):
        return base._affine(base._affine(x, w1, b1), w2, b2)


# --------------------------------------------------------------------------------------------
# §5.3 lrate, §5.4 label smoothing


class LrateOffByOne(Mutant):
    """lrate evaluated at step + 1 (a 0-based step counter fed to Eq. (3))."""

    name, targets = "mutant-lrate-off-by-one", frozenset({"lrate"})
    departure = "lrate shifted by one step"

    def lrate(self, step, d_model, warmup_steps):
        if isinstance(step, int) and step < 0:
            raise ValueError(f"step: expected an int >= 0, got {step!r}")
        return super().lrate(step + 1, d_model, warmup_steps)


class AdamBeta2Default(Mutant):
    """Adam with beta2 left at the frameworks' default 0.999 (the beta2 it is given never reaches the step)."""

    name, targets = "mutant-adam-beta2-default", frozenset({"adam_step"})
    departure = "Adam's beta2 at the frameworks' default 0.999"

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):
        return super().adam_step(param, grad, m, v, step, lr, [betas[0], 0.999], eps)


class AdamEpsInsideSqrt(Mutant):
    """Adam with eps inside the square root, m_hat / sqrt(v_hat + eps), while declaring Algorithm 1."""

    name, targets = "mutant-adam-eps-inside-sqrt", frozenset({"adam_step"})
    departure = "Adam's eps inside the square root"

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):
        dt = param.dtype
        m1, v1 = base.adam_moments(grad, m, v, betas, dt)
        c1, c2 = 1.0 - float(betas[0]) ** step, 1.0 - float(betas[1]) ** step
        return param - dt.type(lr / c1) * m1 / np.sqrt(v1 / dt.type(c2) + dt.type(eps)), m1, v1


class AdamNoBiasCorrection(Mutant):
    """Adam without bias correction (m_t and v_t used as they are) while declaring Algorithm 1."""

    name, targets = "mutant-adam-no-bias-correction", frozenset({"adam_step"})
    departure = "Adam without bias correction"

    def adam_step(self, param, grad, m, v, step, lr, betas, eps):
        dt = param.dtype
        m1, v1 = base.adam_moments(grad, m, v, betas, dt)
        return param - dt.type(lr) * m1 / (np.sqrt(v1) + dt.type(eps)), m1, v1


class DropoutUnscaled(Mutant):
    """Dropout that zeroes the dropped elements but leaves the kept ones unscaled (no 1 / (1 - p))."""

    name, targets = "mutant-dropout-unscaled", frozenset({"dropout"})
    departure = "dropout without its 1 / (1 - p) scaling"

    def dropout(self, x, p, seed):
        keep = np.random.default_rng(seed).random(x.shape) >= p
        return np.where(keep, x, x.dtype.type(0)), keep


class DropoutMaskSharedAcrossRows(Mutant):
    """Dropout whose mask is drawn for the last axis only and shared by every row (a broadcast dimension)."""

    name, targets = "mutant-dropout-mask-shared-across-rows", frozenset({"dropout"})
    departure = "dropout draws each element independently of the others (§5.4)"

    def dropout(self, x, p, seed):
        row = np.random.default_rng(seed).random(x.shape[-1:]) >= p
        keep = np.broadcast_to(row, x.shape).copy()
        return np.where(keep, x * x.dtype.type(1 / (1 - p)), x.dtype.type(0)), keep


class DropoutSeedIgnored(Mutant):
    """Dropout that draws every mask from one fixed seed, whatever seed it is given."""

    name, targets = "mutant-dropout-seed-ignored", frozenset({"dropout"})
    departure = "dropout with different seeds draws independent masks (§5.4)"

    def dropout(self, x, p, seed):
        return super().dropout(x, p, 0)


class LayerDropoutAfterNorm(Mutant):
    """A layer in training mode that drops the LayerNorm's output, LayerNorm(x + Sublayer(x)), instead of the
    sub-layer's output before the sum."""

    name = "mutant-layer-dropout-after-norm"
    targets = frozenset({"encoder_layer_training", "decoder_layer_training"})
    departure = "dropout after the LayerNorm"

    def _residual_norm(self, x, sublayer_out, norm):
        drop = getattr(self, "_dropping", None)
        if drop is None:
            return super()._residual_norm(x, sublayer_out, norm)
        return drop(super()._residual_norm(x, sublayer_out, norm))

    def encoder_layer_training(self, x, params, num_heads, p, seed, mask=None):
        drop = base._Dropouts(self, p, seed)
        self._dropping = drop
        try:
            out = self._encoder(x, params, num_heads, mask, base._evaluation)
        finally:
            self._dropping = None
        return (out, *drop.masks)

    def decoder_layer_training(self, y, memory, params, num_heads, p, seed, self_mask=None, memory_mask=None):
        drop = base._Dropouts(self, p, seed)
        self._dropping = drop
        try:
            out = self._decoder(y, memory, params, num_heads, self_mask, memory_mask, base._evaluation)
        finally:
            self._dropping = None
        return (out, *drop.masks)


class LayerDropoutNotApplied(Mutant):
    """A layer in training mode that draws its masks and returns them but applies none (a rate not passed down to
    its sub-layers)."""

    name = "mutant-layer-dropout-not-applied"
    targets = frozenset({"encoder_layer_training"})
    departure = "no dropout in training mode"

    def encoder_layer_training(self, x, params, num_heads, p, seed, mask=None):
        drop = base._Dropouts(self, p, seed)
        out = self._encoder(x, params, num_heads, mask, lambda t: (drop(t), t)[1])
        return (out, *drop.masks)


class EmbeddingsNotDropped(Mutant):
    """The whole model in training mode draws a mask for each embedding sum but drops only the sub-layers' outputs."""

    name, targets = "mutant-embeddings-not-dropped", frozenset({"transformer_forward_training"})
    departure = "no dropout of the embeddings' sums"

    def _stacks(self, src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths, drop=None):
        if drop is None:
            return super()._stacks(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths)
        embeddings = {0, 1 + 2 * len(params["encoder"])}  # the draws of the source's and the target's sums

        def sub_layers_only(t):
            k = len(drop.masks)
            y = drop(t)
            return t if k in embeddings else y

        return super()._stacks(src_tokens, tgt_tokens, params, num_heads, src_lengths, tgt_lengths, sub_layers_only)


class DropoutLeftOnAtEvaluation(Mutant):
    """The evaluation layer still drops (P_drop = 0.1 from a generator seeded once): a model never switched to
    evaluation mode."""

    name, targets = "mutant-dropout-left-on-at-evaluation", frozenset({"encoder_layer"})
    departure = NO_DROPOUT_AT_EVALUATION

    def encoder_layer(self, x, params, num_heads, mask=None):
        return self.encoder_layer_training(x, params, num_heads, 0.1, 0, mask)[0]


class AveragesFirstGiven(Mutant):
    """Checkpoint averaging over the first n checkpoints as given (a directory's order), not the last n by step."""

    name, targets = "mutant-averages-first-given", frozenset({"average_checkpoints"})
    departure = "the first n checkpoints given averaged, not the last n"

    def average_checkpoints(self, checkpoints, n):
        first = list(checkpoints)[:n]
        return super().average_checkpoints({s: checkpoints[s] for s in first}, n)


class AveragesByName(Mutant):
    """Checkpoint averaging over the last n checkpoints by file name (checkpoint_100 before checkpoint_20)."""

    name, targets = "mutant-averages-by-name", frozenset({"average_checkpoints"})
    departure = "the last n checkpoints by name, not by step"

    def average_checkpoints(self, checkpoints, n):
        last = sorted(checkpoints, key=lambda s: f"checkpoint_{s}.pt")[-n:]
        return super().average_checkpoints({s: checkpoints[s] for s in last}, n)


class SmoothingOverKMinus1(Mutant):
    """Label smoothing spreads eps over the K-1 other classes while declaring the "K" variant."""

    name, targets = "mutant-smoothing-k-minus-1", frozenset({"label_smoothing", "smoothed_cross_entropy"})
    departure = "smoothing over K-1 classes"

    def _smoothed_targets(self, targets, vocab_size, eps, dt):
        return NumpyImplementation(policies={"label_smoothing": "K-1"})._smoothed_targets(targets, vocab_size, eps, dt)


class CrossEntropyIgnoresSmoothing(Mutant):
    """The "smoothed" cross-entropy ignores eps (plain negative log-likelihood of the target)."""

    name, targets = "mutant-cross-entropy-unsmoothed", frozenset({"smoothed_cross_entropy"})
    departure = "no label smoothing (one-hot targets)"

    def smoothed_cross_entropy(self, logits, targets, eps):
        return super().smoothed_cross_entropy(logits, targets, 0.0)


# --------------------------------------------------------------------------------------------
# §3.1 the layers and the model


class CausalMaskOffByOne(Mutant):
    """The decoder's default causal mask lets position i see position i + 1."""

    name, targets = "mutant-causal-off-by-one", frozenset({"decoder_layer"})
    departure = "causal mask off by one (position i sees i + 1)"

    def decoder_layer(self, y, memory, params, num_heads, self_mask=None, memory_mask=None):
        if self_mask is None:
            n = y.shape[-2]
            self_mask = np.tri(n, n, k=1, dtype=bool)
        return super().decoder_layer(y, memory, params, num_heads, self_mask, memory_mask)


class PreNormEncoder(Mutant):
    """Encoder layer in pre-norm form x + Sublayer(LayerNorm(x)) instead of the paper's post-norm."""

    name, targets = "mutant-pre-norm-encoder", frozenset({"encoder_layer"})
    departure = "pre-norm sub-layers x + Sublayer(LayerNorm(x))"

    def encoder_layer(self, x, params, num_heads, mask=None):
        eps = float(self.policies["layer_norm_eps"])
        n1, n2 = params["norm1"], params["norm2"]
        t = self.layer_norm(x, n1["gain"], n1["bias"], eps)
        z = x + self.multi_head_attention(t, t, t, params["self_attn"], num_heads, mask)
        t = self.layer_norm(z, n2["gain"], n2["bias"], eps)
        return z + self.feed_forward(t, **params["ffn"])


class EmbeddingNotScaled(Mutant):
    """Embeddings not multiplied by sqrt(d_model) (§3.4)."""

    name, targets = "mutant-embedding-not-scaled", frozenset({"transformer_forward"})
    departure = "embeddings not scaled by sqrt(d_model)"

    def _embed(self, tokens, embedding, positional, dt):
        positions = (
            self.positional_encoding(tokens.shape[1], embedding.shape[1], dt.name)
            if positional is None
            else positional[: tokens.shape[1]]
        )
        return embedding[tokens] + positions


# --------------------------------------------------------------------------------------------
# batch invariance: a kernel chosen by the size of the batch (what vLLM's and Thinking Machines' tests catch)

#: Batch elements beyond which the batch mutants take their other path: more than the suite's agreement strategies
#: draw for one example (at most 2 batch elements for Eq. (1), 3 rows for LayerNorm), so only a larger batch finds
#: it, as only a server's busy moments do.
_BATCHED_PATH = 3


def _elements(x: np.ndarray, core: int) -> int:
    return int(np.prod(np.shape(x)[: np.ndim(x) - core], dtype=np.int64))


class LayerNormFloat32WhenBatched(Mutant):
    """LayerNorm that takes a float32 kernel for more than 3 rows: its reductions depend on the batch's size."""

    name, targets = "mutant-layernorm-float32-when-batched", frozenset({"layer_norm"})
    departure, shows_in = "float32 inside a float64 claim", "float64"

    def layer_norm(self, x, gain, bias, eps):
        if x.dtype != np.float64 or _elements(x, 1) <= _BATCHED_PATH:
            return super().layer_norm(x, gain, bias, eps)
        low = super().layer_norm(x.astype(np.float32), gain.astype(np.float32), bias.astype(np.float32), eps)
        return low.astype(np.float64)


class AttentionFloat32WhenBatched(Mutant):
    """Eq. (1) that takes a float32 kernel for a batch of more than 3 elements: its result depends on the batch."""

    name, targets = "mutant-attention-float32-when-batched", frozenset({"scaled_dot_product_attention"})
    departure, shows_in = "float32 inside a float64 claim", "float64"

    def scaled_dot_product_attention(self, q, k, v, mask=None):
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if q.dtype != np.float64 or int(np.prod(batch, dtype=np.int64)) <= _BATCHED_PATH:
            return super().scaled_dot_product_attention(q, k, v, mask)
        low = super().scaled_dot_product_attention(
            q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), mask
        )
        return low.astype(np.float64)


#: Every mutant, by class name (``--impl aiayn.conformance.studies.mutants:<name>``).
#: The mutants of the forward pass, by class name.
FORWARD_MUTANTS: dict[str, type[Mutant]] = {
    cls.__name__: cls
    for cls in (
        ScaleByDk,
        NoScale,
        SoftmaxOverQueries,
        MaskAfterSoftmax,
        AdditiveMask,
        MaskIgnored,
        SkipsLastPartialTile,
        MergeForgetsToRenormalise,
        PagedTailTimesZero,
        FullyMaskedZeros,
        UnshiftedSoftmax,
        SoftmaxLastAxisOnly,
        HeadsSplitStrided,
        HeadsConcatReversed,
        PESinCosSwapped,
        PEBase1000,
        LayerNormEpsOutsideSqrt,
        LayerNormUnbiasedVariance,
        LayerNormOnePassVariance,
        FFNWithoutReLU,
        LrateOffByOne,
        AdamBeta2Default,
        AdamEpsInsideSqrt,
        AdamNoBiasCorrection,
        AveragesFirstGiven,
        AveragesByName,
        DropoutUnscaled,
        DropoutMaskSharedAcrossRows,
        DropoutSeedIgnored,
        LayerDropoutAfterNorm,
        LayerDropoutNotApplied,
        DropoutLeftOnAtEvaluation,
        EmbeddingsNotDropped,
        SmoothingOverKMinus1,
        CrossEntropyIgnoresSmoothing,
        CausalMaskOffByOne,
        PreNormEncoder,
        EmbeddingNotScaled,
        LayerNormFloat32WhenBatched,
        AttentionFloat32WhenBatched,
    )
}

CONTROL = "numpy"


# --------------------------------------------------------------------------------------------
# the backward pass: the NumPy built-in's hand-written VJP with one real backward bug each, the forward intact


class BackwardMutant(Mutant):
    """A mutant whose bug is in its gradients only: the equation's forward pass is the built-in's."""

    vjp = NumpyImplementation.vjp


class BackwardIgnoresMask(BackwardMutant):
    """The backward ignores the mask (the mask not saved for the backward; flash-attention #2424)."""

    name, targets = "mutant-backward-ignores-mask", frozenset({"scaled_dot_product_attention"})
    departure = "backward ignores the mask"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        out = self.scaled_dot_product_attention(q, k, v, mask)
        return backward.attention_vjp(q, k, v, None, out, d_out, self.policies["fully_masked"], None)


class BackwardEmbeddingOneUse(BackwardMutant):
    """The tied embedding's gradient from the output projection only: the lookups' shares dropped."""

    name, targets = "mutant-embedding-gradient-one-use", frozenset({"transformer_forward"})
    departure = "the tied embedding's gradient from the output projection only"

    def _tied_embedding_vjp(self, d_projection, lookups):
        return d_projection


class BackwardNoScaleInDS(BackwardMutant):
    """The 1/sqrt(d_k) is missing from dS: dQ and dK are sqrt(d_k) times too large."""

    name, targets = "mutant-backward-no-scale", frozenset({"scaled_dot_product_attention"})
    departure = "no 1/sqrt(d_k) in dS"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        grads = super()._scaled_dot_product_attention_vjp(q, k, v, mask, d_out=d_out)
        root = math.sqrt(q.shape[-1])
        return {**grads, "q": grads["q"] * root, "k": grads["k"] * root}


class BackwardAtomicKeyGradient(BackwardMutant):
    """dK accumulated over the query rows in an order that changes from call to call (atomic adds, as a GPU backward
    without its deterministic mode), while the implementation declares its gradients deterministic."""

    name, targets = "mutant-backward-atomic-dk", frozenset({"scaled_dot_product_attention"})
    departure = "each equation is a function of its inputs (§3): the same call gives the same gradients"

    def __init__(self) -> None:
        super().__init__(policies={"deterministic": True})
        self._order = np.random.default_rng()

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        grads = super()._scaled_dot_product_attention_vjp(q, k, v, mask, d_out=d_out)
        e, total = _unnormalised(q, k, v, mask)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = e / total
        out = np.matmul(p, v)
        ds = p * (np.matmul(d_out, np.swapaxes(v, -1, -2)) - np.sum(d_out * out, axis=-1, keepdims=True))
        parts = ds[..., :, :, None] * q[..., :, None, :] / np.asarray(math.sqrt(q.shape[-1]), dtype=q.dtype)
        dk = np.zeros(np.broadcast_shapes(parts.shape[:-3], k.shape[:-2]) + k.shape[-2:], dtype=q.dtype)
        for i in self._order.permutation(q.shape[-2]):  # the bug: the order of the adds differs every call
            dk = dk + parts[..., i, :, :]
        return {**grads, "k": dk.astype(k.dtype)}


def _unnormalised(q, k, v, mask):  # (exp(S - m), row sums l) of Eq. (1)'s scores, masked keys 0
    s = np.where(_visible(mask, _scores(q, k).shape), _scores(q, k), -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    return e, np.sum(e, axis=-1, keepdims=True)


def _attention_backward(q, k, v, p, p_for_dv, d_out, d_row):
    """dQ, dK, dV from the given weights: the formulas of the built-in's direct path."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dp = np.matmul(d_out, np.swapaxes(v, -1, -2))
    ds = p * (dp - d_row)
    return {
        "q": np.matmul(ds, k) * scale,
        "k": np.matmul(np.swapaxes(ds, -1, -2), q) * scale,
        "v": np.matmul(np.swapaxes(p_for_dv, -1, -2), d_out),
    }


class BackwardDFromUnnormalisedOutput(BackwardMutant):
    """D = rowsum(dO (.) O) taken from the unnormalised output (the accumulator before dividing by l)."""

    name, targets = "mutant-backward-d-unnormalised", frozenset({"scaled_dot_product_attention"})
    departure = "D from the unnormalised output"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        e, ell = _unnormalised(q, k, v, mask)
        p = e / ell
        return _attention_backward(q, k, v, p, p, d_out, np.sum(d_out * np.matmul(e, v), axis=-1, keepdims=True))


class BackwardDvUnnormalisedP(BackwardMutant):
    """dV formed with the weights before normalisation, exp(S - m), instead of P."""

    name, targets = "mutant-backward-dv-unnormalised", frozenset({"scaled_dot_product_attention"})
    departure = "dV from the unnormalised weights"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        e, ell = _unnormalised(q, k, v, mask)
        p = e / ell
        return _attention_backward(q, k, v, p, e, d_out, np.sum(d_out * np.matmul(p, v), axis=-1, keepdims=True))


class BackwardStaleLogSumExp(BackwardMutant):
    """P recomputed in the backward from the row maximum alone, not the log-sum-exp: exp(S - m), unnormalised."""

    name, targets = "mutant-backward-stale-lse", frozenset({"scaled_dot_product_attention"})
    departure = "P recomputed from the row max, not the log-sum-exp"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        e, ell = _unnormalised(q, k, v, mask)
        out = self.scaled_dot_product_attention(q, k, v, mask)
        return _attention_backward(q, k, v, e, e, d_out, np.sum(d_out * out, axis=-1, keepdims=True))


class BackwardTailNotMasked(BackwardMutant):
    """The last key tile is not masked in the backward only (the tail of a length not a multiple of the tile)."""

    name, targets = "mutant-backward-tail-unmasked", frozenset({"scaled_dot_product_attention"})
    departure = "the last keys not masked in the backward"

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        out = self.scaled_dot_product_attention(q, k, v, mask)
        n_k = k.shape[-2]
        if mask is not None and n_k > 1 and n_k % 2:  # tiles of 2 keys: a tail tile of one key, left unmasked
            mask = np.array(np.broadcast_to(mask, mask.shape[:-1] + (n_k,)))
            mask[..., -1] = True
        return backward.attention_vjp(q, k, v, mask, out, d_out, self.policies["fully_masked"], 2)


class BackwardUnsafeSoftmax(BackwardMutant):
    """Fully masked rows: the forward gives zeros (declared "zeros"), the backward 0 x NaN (PyTorch #41508)."""

    name, targets = "mutant-backward-unsafe-softmax", frozenset({"scaled_dot_product_attention"})
    departure = "0 x NaN on fully masked rows in the backward"

    def __init__(self) -> None:
        super().__init__(policies={"fully_masked": "zeros"})

    def _scaled_dot_product_attention_vjp(self, q, k, v, mask=None, *, d_out):
        out = self.scaled_dot_product_attention(q, k, v, mask)
        return backward.attention_vjp(q, k, v, mask, out, d_out, "nan", None)


class SoftmaxBackwardWithoutMean(BackwardMutant):
    """Softmax's backward drops the mean term: dx = y (.) dy."""

    name, targets = "mutant-softmax-backward-no-mean", frozenset({"softmax"})
    departure = "softmax backward without the mean term"

    def _softmax_vjp(self, x, axis, *, d_out):
        return {"x": self.softmax(x, axis) * d_out}


class LayerNormBackwardNoMeanTerm(BackwardMutant):
    """LayerNorm's dx without the mean(h) term (the gradient through the mean forgotten)."""

    name, targets = "mutant-layer-norm-backward-no-mean", frozenset({"layer_norm"})
    departure = "LayerNorm backward without the mean term"

    def _layer_norm_vjp(self, x, gain, bias, eps, *, d_out):
        grads = super()._layer_norm_vjp(x, gain, bias, eps, d_out=d_out)
        centred = x - np.mean(x, axis=-1, keepdims=True)
        s = np.sqrt(np.mean(np.square(centred), axis=-1, keepdims=True) + float(eps))
        return {**grads, "x": grads["x"] + np.mean(gain * d_out, axis=-1, keepdims=True) / s}


class LayerNormBackwardRawX(BackwardMutant):
    """LayerNorm's backward on raw x with a one-pass variance (the cancelling form; PaddlePaddle #35498)."""

    name, targets = "mutant-layer-norm-backward-raw-x", frozenset({"layer_norm"})
    departure = "LayerNorm backward on raw x (one-pass variance)"

    def _layer_norm_vjp(self, x, gain, bias, eps, *, d_out):
        mean = np.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.maximum(np.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0) + float(eps))
        h = gain * d_out
        x_hat = x * rstd - mean * rstd
        dx = rstd * (h - np.mean(h, axis=-1, keepdims=True) - x_hat * np.mean(h * x_hat, axis=-1, keepdims=True))
        rows = tuple(range(x.ndim - 1))
        return {"x": dx, "gain": np.sum(d_out * x_hat, axis=rows), "bias": np.sum(d_out, axis=rows)}


class LayerNormDgainFromX(BackwardMutant):
    """LayerNorm's dgain from x instead of x_hat."""

    name, targets = "mutant-layer-norm-dgain-from-x", frozenset({"layer_norm"})
    departure = "LayerNorm dgain from x instead of x_hat"

    def _layer_norm_vjp(self, x, gain, bias, eps, *, d_out):
        grads = super()._layer_norm_vjp(x, gain, bias, eps, d_out=d_out)
        return {**grads, "gain": np.sum(d_out * x, axis=tuple(range(x.ndim - 1)))}


class ReductionDropsLastBlock(BackwardMutant):
    """The FFN's dW1 reduction over rows drops its last block (attorch #18)."""

    name, targets = "mutant-reduction-drops-last-block", frozenset({"feed_forward"})
    departure = "a row reduction drops its last block"

    def _feed_forward_vjp(self, x, w1, b1, w2, b2, *, d_out):
        grads = super()._feed_forward_vjp(x, w1, b1, w2, b2, d_out=d_out)
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] < 2:
            return grads
        z = rows @ w1 + b1
        dz = (d_out.reshape(-1, d_out.shape[-1]) @ w2.T) * (z > 0)
        return {**grads, "w1": rows[:-1].T @ dz[:-1]}


class CrossEntropyBackwardSmoothingSpread(BackwardMutant):
    """The cross-entropy's gradient spreads the smoothing over the K - 1 other classes while the forward uses K."""

    name, targets = "mutant-cross-entropy-backward-k-1", frozenset({"smoothed_cross_entropy"})
    departure = "the gradient's label smoothing differs from the forward's"

    def _smoothed_cross_entropy_vjp(self, logits, targets, eps, *, d_out):
        other = NumpyImplementation(policies={"label_smoothing": "K-1"})
        return other._smoothed_cross_entropy_vjp(logits, targets, eps, d_out=d_out)


#: The backward mutants, by class name: each caught by the gradient checks of its equation and diagnosed as itself,
#: while its forward rows pass (``tests/meta/test_conformance_mutants.py``).
BACKWARD_MUTANTS: dict[str, type[BackwardMutant]] = {
    cls.__name__: cls
    for cls in (
        BackwardIgnoresMask,
        BackwardNoScaleInDS,
        BackwardAtomicKeyGradient,
        BackwardDFromUnnormalisedOutput,
        BackwardDvUnnormalisedP,
        BackwardStaleLogSumExp,
        BackwardTailNotMasked,
        BackwardUnsafeSoftmax,
        SoftmaxBackwardWithoutMean,
        LayerNormBackwardNoMeanTerm,
        LayerNormBackwardRawX,
        LayerNormDgainFromX,
        ReductionDropsLastBlock,
        CrossEntropyBackwardSmoothingSpread,
        BackwardEmbeddingOneUse,
    )
}

# --------------------------------------------------------------------------------------------
# §3.2.3 and §6.1 decoding: the cached decoder and beam search


class DecodeMutant(Mutant):
    """A mutant whose bug is in decoding only: the whole model's forward pass and gradients are the built-in's."""

    name = ""
    targets = frozenset({"transformer_forward"})
    vjp = NumpyImplementation.vjp


class DecodePositionsRestart(DecodeMutant):
    """Each decode step's positional encodings restart at 0 instead of the cache length (transformers #15736)."""

    name = "mutant-decode-positions-restart"
    departure = "positions restarted at 0 in each decode step"

    def _embed(self, tokens, embedding, positional, dt, start=0):
        return super()._embed(tokens, embedding, positional, dt, 0)


class DecodeTopLeftCausal(DecodeMutant):
    """A chunk of new tokens after a cache gets the causal mask aligned top-left (pytorch #103082, onnx PR #8068)."""

    name = "mutant-decode-top-left-causal"
    departure = "a top-left causal mask for a chunk after a cache"

    def _step_mask(self, k, c):
        return np.tri(k, c + k, 0, dtype=bool)


class DecodeSourceMaskOnce(DecodeMutant):
    """The source padding mask applied at the first decode step only, not extended to later ones (transformers
    #16811)."""

    name = "mutant-decode-source-mask-once"
    departure = "the source padding mask dropped after the first decode step"

    def decode_step(self, tokens, memory, params, num_heads, cache=None, src_lengths=None):
        return super().decode_step(tokens, memory, params, num_heads, cache, src_lengths if cache is None else None)


class DecodeStaleMemory(DecodeMutant):
    """The encoder memory kept from the first step and not reordered with the cache: cross-attention of a reordered
    beam reads another sentence's memory (vllm PR #38321)."""

    name = "mutant-decode-stale-memory"
    departure = "cross-attention over a memory not reordered with the cache"

    def decode_step(self, tokens, memory, params, num_heads, cache=None, src_lengths=None):
        kept = memory if cache is None else cache["memory"]
        logits, new = super().decode_step(tokens, kept, params, num_heads, cache, src_lengths)
        return logits, {**new, "memory": kept}

    def reorder_cache(self, cache, index):
        return {**super().reorder_cache(cache, index), "memory": cache["memory"]}


class DecodeCacheNotReordered(DecodeMutant):
    """The cache not reordered when beam search reorders its hypotheses (transformers #46612)."""

    name = "mutant-decode-cache-not-reordered"
    departure = "the cache not reordered"

    def reorder_cache(self, cache, index):
        return cache


class DecodeKeysWithoutBias(DecodeMutant):
    """Keys cached before the projection's bias is added: later steps attend to x W^K without b^K."""

    name = "mutant-decode-keys-without-bias"
    departure = "keys cached without their bias"

    def _cached(self, keys, values, p, h):
        b = p.get("b_k")
        if b is None:
            return keys, values
        return keys - b.reshape(h, 1, -1), values  # (B, h, k, d_k) less b^K split into heads


class DecodeKeysScaledTwice(DecodeMutant):
    """Keys cached after scaling by 1/sqrt(d_k), then scaled again by the attention: cached positions' scores are
    divided by d_k."""

    name = "mutant-decode-keys-scaled-twice"
    departure = "keys cached after scaling by 1/sqrt(d_k) (scaled twice)"

    def _cached(self, keys, values, p, h):
        return keys / math.sqrt(keys.shape[-1]), values


class DecodeReversedConcat(DecodeMutant):
    """The new keys and values concatenated before the cached ones (cat([new, past]))."""

    name = "mutant-decode-reversed-concat"
    departure = "keys and values concatenated in reverse order (new before cached)"

    def _join(self, held, new):
        return np.concatenate((new, held), axis=-2)


class DecodeUnextendedMask(DecodeMutant):
    """The self-attention mask of the new tokens not extended over the cached positions: those are masked out."""

    name = "mutant-decode-unextended-mask"
    departure = "a self-attention mask not extended over the cached positions"

    def _step_mask(self, k, c):
        return np.concatenate((np.zeros((k, c), dtype=bool), np.tri(k, k, 0, dtype=bool)), axis=1)


class DecodeSwappedKeyValue(DecodeMutant):
    """The cache keeps each step's values in the keys' slot and its keys in the values'."""

    name = "mutant-decode-swapped-key-value"
    departure = "cached keys and values swapped"

    def _cached(self, keys, values, p, h):
        return values, keys


class DecodeSkippedPosition(DecodeMutant):
    """A one-token step after a cache at position c + 1 (an off-by-one of single-token decoding)."""

    name = "mutant-decode-skipped-position"
    departure = "a position skipped for a one-token step (c + 1 instead of c)"

    def _embed(self, tokens, embedding, positional, dt, start=0):
        skip = 1 if start > 0 and np.shape(tokens)[1] == 1 else 0
        return super()._embed(tokens, embedding, positional, dt, start + skip)


class DecodeAliasedReorder(DecodeMutant):
    """The cache reordered in place over its own rows, row r := row index[r] in order: a row already overwritten is
    read again (the contract lets reorder_cache update its cache in place, not read what it has overwritten)."""

    name = "mutant-decode-aliased-reorder"
    departure = "a cache reordered in place over its own rows"

    def reorder_cache(self, cache, index):
        for pair in cache["self"]:
            for x in pair:
                for r, j in enumerate(np.asarray(index)):
                    x[r] = x[j]
        return cache


class BeamPenaltyPower(DecodeMutant):
    """The length penalty |Y|^alpha (fairseq, Hugging Face) instead of GNMT's ((5 + |Y|) / 6)^alpha."""

    name = "mutant-beam-penalty-power"
    departure = "length penalty |Y|^alpha instead of ((5 + |Y|) / 6)^alpha"

    def _length_penalty(self, length, alpha):
        return float(length) ** alpha


class BeamNoPenalty(DecodeMutant):
    """No length penalty: hypotheses ranked by log-probability alone."""

    name = "mutant-beam-no-penalty"
    departure = "no length penalty"

    def _length_penalty(self, length, alpha):
        return 1.0


class BeamStopsAtFirstFinished(DecodeMutant):
    """The search stops at the first finished hypothesis."""

    name = "mutant-beam-stops-at-first-finished"
    departure = "beam search stopped at the first finished hypothesis"

    def _stops(self, rule, scores, best_alive, lp_max, k):
        return len(scores) >= 1


class BeamExtendsFinished(DecodeMutant):
    """The best k candidates stay alive, EOS or not: a finished hypothesis keeps a beam slot and is extended further
    (a beam narrowed by its own finished hypotheses)."""

    name = "mutant-beam-extends-finished"
    departure = "finished hypotheses kept alive and extended after EOS"

    def _survivors(self, top, parents, tokens, t, k, eos):
        return list(range(k))


class BeamPerHypothesisBest(DecodeMutant):
    """After the first step each hypothesis keeps only its own best continuation: k greedy searches, not a top-k over
    all k * V candidates."""

    name = "mutant-beam-per-hypothesis-best"
    departure = "each hypothesis extended by its own best token only (k greedy searches)"

    def _survivors(self, top, parents, tokens, t, k, eos):
        keep = super()._survivors(top, parents, tokens, t, k, eos)
        if t == 1:
            return keep
        own = [j for j in range(len(tokens)) if tokens[j] != eos and np.isfinite(top[j])]
        return [j for n, j in enumerate(own) if all(parents[o] != parents[j] for o in own[:n])][:k]


class BeamBoundAtCurrentLength(DecodeMutant):
    """The early stop declared "bound" compares with the best alive log-probability over lp(current length), not
    lp(maximum length): it stops before a longer hypothesis can overtake."""

    name = "mutant-beam-bound-at-current-length"
    departure = "early stop bounded at the current length, lp(t) instead of lp(maximum length)"

    def _bound_at(self, t, limit):
        return t


class BeamBatchMaxLength(DecodeMutant):
    """Every sentence searched up to the batch's largest maximum length instead of its own."""

    name = "mutant-beam-batch-max-length"
    departure = "one maximum length per batch (the largest) instead of each sentence's own"

    def _limits(self, limits):
        return [max(limits)] * len(limits)


class BeamStopsWithItsBatch(DecodeMutant):
    """The early stop applied to the batch as a whole (Hugging Face transformers PR #38778): a sentence whose own rule
    says stop searches on until every sentence of its batch would stop, under fairseq's "full" rule."""

    name = "mutant-beam-stops-with-its-batch"
    departure = "the early stop applied to the whole batch (a sentence searched until every one of its batch stops)"

    def __init__(self) -> None:
        super().__init__(policies={"beam_search": {"early_stop": "full"}})

    def _stopped(self, stopping):
        return list(stopping) if all(stopping.values()) else []


class BeamMinLengthRenormalised(DecodeMutant):
    """EOS disabled for the first two steps before the log-softmax: the step is renormalised without it."""

    name = "mutant-beam-min-length-renormalised"
    departure = "a minimum length: EOS disabled at the first steps, renormalised without it"

    def _without_eos(self, logp, t, eos):
        if t > 2:
            return logp
        out = logp - np.log1p(-np.exp(logp[:, eos : eos + 1]))
        out[:, eos] = -np.inf  # the bug this mutant carries (EOS unreachable at steps 1-2): the suite must catch it
        return out


class BeamMinLength(DecodeMutant):
    """EOS's log-probability set to -inf at the first two steps (after the log-softmax: not renormalised)."""

    name = "mutant-beam-min-length"
    departure = "a minimum length: EOS disabled at the first steps (log-probability -inf)"

    def _without_eos(self, logp, t, eos):
        if t > 2:
            return logp
        out = logp.copy()
        out[:, eos] = -np.inf  # the bug this mutant carries (EOS unreachable at steps 1-2): the suite must catch it
        return out


class BeamOverHalvesTable(DecodeMutant):
    """Beam search over a model whose positional table is laid out [sin | cos] in two halves (tensor2tensor's layout)
    where §3.5 interleaves them: the cached decoder and the whole model are the paper's, the search is not."""

    name = "mutant-beam-over-halves-table"
    departure = "sin and cos in two halves"
    _searching = False

    def beam_search(self, *args, **kwargs):
        self._searching = True
        try:
            return super().beam_search(*args, **kwargs)
        finally:
            self._searching = False

    def positional_encoding(self, length, d_model, dtype):
        pe = super().positional_encoding(length, d_model, dtype)
        return np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=1) if self._searching else pe


#: The decoding mutants, by class name: each caught by the decoding checks and diagnosed as itself, while the whole
#: model's forward and backward rows pass (``tests/meta/test_conformance_mutants.py``).
DECODE_MUTANTS: dict[str, type[DecodeMutant]] = {
    cls.__name__: cls
    for cls in (
        DecodePositionsRestart,
        DecodeTopLeftCausal,
        DecodeSourceMaskOnce,
        DecodeStaleMemory,
        DecodeCacheNotReordered,
        DecodeKeysWithoutBias,
        DecodeKeysScaledTwice,
        DecodeReversedConcat,
        DecodeUnextendedMask,
        DecodeSwappedKeyValue,
        DecodeSkippedPosition,
        DecodeAliasedReorder,
        BeamPenaltyPower,
        BeamNoPenalty,
        BeamStopsAtFirstFinished,
        BeamExtendsFinished,
        BeamPerHypothesisBest,
        BeamBoundAtCurrentLength,
        BeamBatchMaxLength,
        BeamStopsWithItsBatch,
        BeamMinLengthRenormalised,
        BeamMinLength,
        BeamOverHalvesTable,
    )
}

#: Every mutant, forward, backward and decoding, by class name: what ``aiayn mutants`` runs.
MUTANTS: dict[str, type[Mutant]] = {**FORWARD_MUTANTS, **BACKWARD_MUTANTS, **DECODE_MUTANTS}


# --------------------------------------------------------------------------------------------
# the PyTorch built-in

#: The mutants of the PyTorch built-in, by class name: attributes of this module built on first access
#: (``mutants.TorchNoScale``, ``--impl aiayn.conformance.studies.mutants:TorchNoScale``), which imports torch.
TORCH_MUTANTS: tuple[str, ...] = ("TorchNoScale",)


@functools.cache
def _torch_mutants() -> dict[str, type]:
    from aiayn.implementations.torch_impl import TorchImplementation

    class TorchNoScale(Bug, TorchImplementation):
        """No 1/sqrt(d_k) scaling of the scores, in Eq. (1) and in every head of multi-head attention."""

        name, targets = "mutant-torch-no-scale", frozenset({"scaled_dot_product_attention", "multi_head_attention"})
        departure = "no 1/sqrt(d_k) scaling"

        def _attend(self, q, k, v, mask, dtype):  # type: ignore[no-untyped-def]
            return super()._attend(q * math.sqrt(q.shape[-1]), k, v, mask, dtype)

    built = {cls.__name__: cls for cls in (TorchNoScale,)}
    for cls in built.values():
        cls.__qualname__ = cls.__name__  # found again by name (pickling, replay): this module's __getattr__
    return built


def __getattr__(name: str) -> Any:
    if name in TORCH_MUTANTS:
        return _torch_mutants()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------
# running the suite against them


def run_mutants(
    report_dir: Path,
    *,
    workers: int = 0,
    profile: str | None = None,
    extra: list[str] | None = None,
    mutants: Mapping[str, type] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``pytest conformance`` on every mutant (``mutants``, default :data:`MUTANTS`) and the control (``numpy``),
    reports into ``report_dir``.

    ``AIAYN_FIND_ONLY=1`` keeps the default profile's example generation but skips shrinking and
    the example database: the question is only whether the freshly generated examples find a
    failure, as on a fresh clone.
    """
    specs = [f"aiayn.conformance.studies.mutants:{name}" for name in (MUTANTS if mutants is None else mutants)] + [
        CONTROL
    ]
    # in the suite's process: the mutants are aiayn's own built-in with one bug each, and the question is whether the
    # suite catches them, not whether its judge is out of their reach (a process each would cost a start per mutant)
    arguments = pytest_arguments(
        specs, report=report_dir, workers=workers, profile=profile, in_process=True, extra=["--tb=no", *(extra or [])]
    )
    cmd = [sys.executable, "-m", "pytest", *arguments]
    env = {**os.environ, "AIAYN_FIND_ONLY": "1", "AIAYN_FAILURES": str(report_dir / "failures")}
    return subprocess.run(cmd, cwd=report_dir.parent, env=env, capture_output=True, text=True, check=False)


def kill_table(report_dir: Path, mutants: Mapping[str, type] | None = None) -> dict[str, Any]:
    """Read the per-implementation reports of a :func:`run_mutants` run of ``mutants`` (default :data:`MUTANTS`) into
    the kill table."""
    rows = []
    for name, cls in (MUTANTS if mutants is None else mutants).items():
        data = json.loads((report_dir / f"conformance-{cls.name}.json").read_text())
        failing = [r for r in map(Row.from_dict, data["rows"]) if r.status is Status.FAIL]
        # a catalogued departure, or for a property's mutant the property it breaks
        named = sorted({d for r in failing for d in (*r.departures, *r.violations)})
        rows.append(
            {
                "mutant": name,
                "impl": cls.name,
                "bug": cls.bug(),
                "departure": cls.departure,
                "equations": sorted(cls.targets),
                "caught": bool(failing),
                "caught_by": sorted({f"{t} [{r.dtype}]" for r in failing for t in r.failed_tests}),
                "diagnosed_as": named,
                "diagnosed": cls.departure in named,
            }
        )
    control = json.loads((report_dir / f"conformance-{CONTROL}.json").read_text())
    return {
        "mutants": rows,
        "caught": sum(r["caught"] for r in rows),
        "diagnosed": sum(r["diagnosed"] for r in rows),
        "total": len(rows),
        "control": {
            "impl": CONTROL,
            "verdict": control["verdict"],
            "failing": [
                f"{r.equation} [{r.dtype}]" for r in map(Row.from_dict, control["rows"]) if r.status is Status.FAIL
            ],
        },
        "hypothesis_profile": control["hypothesis_profile"],
        "seed": control["seed"],
    }


def as_report(table: Mapping[str, Any]) -> Report:
    """The kill table as a report (``aiayn.kit.write_report``)."""
    total = table["total"]
    lines = [
        "",
        f"Control (`{table['control']['impl']}`, unbroken): **{table['control']['verdict']}**.",
        "",
        "Each mutant is the NumPy built-in with one bug (`conformance/studies/mutants.py`) in its forward pass or in "
        "its hand-written backward, checked by `pytest conformance` "
        f"(Hypothesis profile `{table['hypothesis_profile']}`, no shrinking) on the equations the bug lives in; "
        "the meta-test `tests/meta/test_conformance_mutants.py` repeats this in `make test-slow` with the derandomized "
        "profile `smoke` (the same 8 examples per check every run).",
        "",
        "*Diagnosed as*: the departures (`conformance/diagnoses/forward.py`; for gradients "
        "`conformance/diagnoses/backward.py`) whose output the failing agreement checks matched; a mutant is "
        "diagnosed as itself when its own departure is among them.",
        "",
    ]
    rows = []
    for r in table["mutants"]:
        shown = "; ".join(f"**{d}**" if d == r["departure"] else d for d in r["diagnosed_as"]) or "**none**"
        caught = "yes" if r["caught"] else "**NO**"
        rows.append([f"`{r['mutant']}`", r["bug"], ", ".join(r["equations"]), caught, "; ".join(r["caught_by"]), shown])
    lines += md_table(["mutant", "bug", "equations", "caught", "caught by", "diagnosed as"], rows)
    return Report(
        name="conformance-mutants",
        title="Mutants: does the conformance suite catch realistic bugs?",
        precision="float64, float32",
        seed=str(table["seed"]),
        packages=("numpy", "hypothesis"),
        fields={
            "mutants": total,
            "control": table["control"]["impl"],
            "profile": table["hypothesis_profile"],
            "find_only": "yes",
        },
        lines=lines,
        data=dict(table),
        verdict=f"{table['caught']} of {total} caught, {table['diagnosed']} of {total} diagnosed as themselves",
    )


def run(out: Path, *, workers: int = 2) -> int:
    """Run the mutants, write the kill table to ``out/conformance-mutants.{md,json}``; 0 when every
    mutant is caught and the control passes, else 1."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_mutants(Path(tmp) / "reports", workers=workers)
        try:
            table = kill_table(Path(tmp) / "reports")
        except FileNotFoundError:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
            raise RuntimeError("the conformance suite did not write its reports (its output is above)") from None
    report = as_report(table)
    write_report(Path(out), report)
    print("\n".join([report.verdict, *report.lines]))
    ok = table["caught"] == table["diagnosed"] == table["total"] and table["control"]["verdict"] == "PASS"
    return 0 if ok else 1
