"""The known departures of the backward pass: what a failing gradient check names.

Each :class:`BackwardDeparture` is a real backward bug, computed: its ``gradients(a, g, dtype)`` gives the gradients
an implementation with that bug returns for the oracle's arguments ``a`` (the rounded inputs the implementation saw,
and the declared policies) and the cotangent ``g``, by gradient name (the equation's argument names). A failing
gradient is named as every departure whose gradient for that name agrees with the implementation's within the
check's budget (and NaN where it is NaN); the departure's other gradients are not consulted (a check fails on one
gradient at a time). Departures are computed in float64 from the same formulas as the oracle's VJP with the one
change, except those that only show in the dtype's arithmetic (``numerical``: the cancelling LayerNorm form), which
are computed in the check's dtype.

The forward pass's departures are in ``diagnoses/forward.py``; a gradient whose forward is wrong fails the forward check
too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.conformance.diagnoses.forward import (
    CATALOGUE,
    PAIRS,
    PRECISION_DEPARTURES,
    Departure,
    _changes,
    _structural,
    _together,
    positional_encoding,
)
from aiayn.reference import attention as ref_attention
from aiayn.reference import layers as ref_layers
from aiayn.reference import model as ref_model
from aiayn.reference import training as ref_training

__all__ = ["BACKWARD_CATALOGUE", "BackwardDeparture", "BackwardDiagnosis", "arithmetic", "explain"]

Grads = dict[str, np.ndarray]


@dataclass(frozen=True)
class BackwardDeparture:
    """One known backward bug: its name (what messages say), who had it, its equation, and how to compute it."""

    name: str
    note: str
    equation: str
    gradients: Callable[[Mapping[str, Any], np.ndarray, str], Grads | list[Grads]]
    numerical: bool = False
    forward: Departure | None = None  # a whole-model departure: the forward catalogue's entry it computes


# --------------------------------------------------------------------------------------------
# the whole model: the tied embedding (§3.4)


def _embedding_one_use(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    """The tied matrix E's gradient from the output projection alone (dlogits^T y), the lookups' shares dropped:
    E handled as two matrices, one of them frozen; every other gradient the oracle's."""
    grads = dict(
        ref_model.transformer_forward_vjp(
            a["src"],
            a["tgt"],
            a["params"],
            a["num_heads"],
            g,
            src_lengths=a["src_lengths"],
            tgt_lengths=a["tgt_lengths"],
            eps=a["eps"],
        )
    )
    src_mask, tgt_mask = ref_model._masks(a["src"].shape[1], a["tgt"].shape[1], a["src_lengths"], a["tgt_lengths"])
    e = np.asarray(a["params"]["embedding"], dtype=np.float64)
    root = math.sqrt(e.shape[1])
    x = e[a["src"]] * root + ref_model.positional_encoding(a["src"].shape[1], e.shape[1])
    for layer in a["params"]["encoder"]:
        x = ref_model.encoder_layer(x, layer, a["num_heads"], src_mask, eps=a["eps"])
    y = e[a["tgt"]] * root + ref_model.positional_encoding(a["tgt"].shape[1], e.shape[1])
    for layer in a["params"]["decoder"]:
        y = ref_model.decoder_layer(y, x, layer, a["num_heads"], tgt_mask, src_mask, eps=a["eps"])
    grads["embedding"] = np.asarray(g, dtype=np.float64).reshape(-1, e.shape[0]).T @ y.reshape(-1, e.shape[1])
    return grads


#: The fields of the forward diagnoses' ``Ops`` that the whole model's VJP below can depart in: the positional table
#: (§3.5), the embedding's and the output's scale (§3.4), a final LayerNorm after a stack (§3.1 has none), pre-norm
#: layers (§3.1's are post-norm).
WHOLE_MODEL_FIELDS = frozenset(
    {"pe", "pe_spacing", "pe_base", "pe_start", "embed_scale", "output_scale", "final_norm", "residual"}
)


def _whole_model(ops: Any) -> Callable[[Mapping[str, Any], np.ndarray, str], Grads]:
    """The gradients of the whole model with the departure ``ops`` (the forward diagnoses' ``Ops``, departing only in
    :data:`WHOLE_MODEL_FIELDS`): the oracle's pullback (``reference/model.py``, fast tier) with its positional table
    replaced by the departure's and the departure's stack ends and scales; the table's own gradient dropped (the
    implementation's table is no parameter)."""
    stacks = {"encoder": ("encoder",), "decoder": ("decoder",), "both": ("encoder", "decoder")}
    departure = {
        "final_norms": stacks.get(ops.final_norm, ()),
        "embed_scale": ops.embed_scale,
        "residual": ops.residual,
    }

    def gradients(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
        params = dict(a["params"])
        d_model = np.shape(params["embedding"])[1]
        n = max(np.shape(a["src"])[1], np.shape(a["tgt"])[1])
        params["positional"] = np.asarray(positional_encoding(n, d_model, ops), dtype=np.float64)
        scale = {"none": 1, "rsqrt_d": 1 / np.sqrt(np.longdouble(d_model))}[ops.output_scale]
        grads = ref_model._transformer_forward_vjp(
            a["src"],
            a["tgt"],
            params,
            a["num_heads"],
            g,
            a["src_lengths"],
            a["tgt_lengths"],
            a["eps"],
            relu=0.0,
            exact=False,
            dps=0,
            departure={**departure, "output_scale": scale},
        )
        grads.pop("positional")
        return grads

    return gradients


# --------------------------------------------------------------------------------------------
# Eq. (1): the formulas of the oracle's VJP, with the weights and D given


def _scores(a: Mapping[str, Any], masked: bool = True) -> np.ndarray:
    q, k = np.asarray(a["q"], dtype=np.float64), np.asarray(a["k"], dtype=np.float64)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    if masked and a.get("mask") is not None:
        s = np.where(np.broadcast_to(a["mask"], s.shape), s, -np.inf)
    return s


def _weights(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exp(S - m), row sums): the unnormalised weights and their normaliser (masked entries 0; a fully masked row
    NaN, which :func:`_attention_backward` replaces by the declared policy's weights)."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    return e, np.sum(e, axis=-1, keepdims=True)


def _attention_backward(a: Mapping[str, Any], g: np.ndarray, p: np.ndarray, p_v: np.ndarray, d_row: np.ndarray):
    """dQ, dK, dV from the given weights (for dS and for dV) and D, fully masked rows per the declared policy: these
    departures concern the rows with a visible key."""
    q, k, v = (np.asarray(a[n], dtype=np.float64) for n in "qkv")
    scale = 1.0 / math.sqrt(q.shape[-1])
    policy = a["fully_masked"]
    if a.get("mask") is not None and policy != "nan":
        shape = np.broadcast_shapes(np.shape(p), np.shape(a["mask"]))
        dead = ~np.any(np.broadcast_to(a["mask"], shape), axis=-1, keepdims=True)
        fill = 0.0 if policy == "zeros" else 1.0 / shape[-1]
        p, p_v = np.where(dead, 0.0, p), np.where(dead, fill, p_v)  # no gradient to a dead row's scores
    with np.errstate(invalid="ignore", over="ignore"):
        ds = p * (np.matmul(g, np.swapaxes(v, -1, -2)) - d_row)
        return {
            "q": np.matmul(ds, k) * scale,
            "k": np.matmul(np.swapaxes(ds, -1, -2), q) * scale,
            "v": np.matmul(np.swapaxes(p_v, -1, -2), g),
        }


def _output(a: Mapping[str, Any]) -> np.ndarray:
    return ref_attention.scaled_dot_product_attention(a["q"], a["k"], a["v"], a["mask"], fully_masked=a["fully_masked"])


def _d_row(g: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.sum(g * out, axis=-1, keepdims=True)


def _mask_forgotten(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    e, ell = _weights(_scores(a, masked=False))
    p = e / ell
    return _attention_backward(a, g, p, p, _d_row(g, _output(a)))


def _no_scale(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    grads = dict(zip("qkv", _oracle_attention(a, g)))
    root = math.sqrt(np.shape(a["q"])[-1])
    return {**grads, "q": grads["q"] * root, "k": grads["k"] * root}


def _oracle_attention(a: Mapping[str, Any], g: np.ndarray) -> tuple[np.ndarray, ...]:
    return ref_attention.scaled_dot_product_attention_vjp(
        a["q"], a["k"], a["v"], g, a["mask"], fully_masked=a["fully_masked"]
    )


def _d_unnormalised(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    e, ell = _weights(_scores(a))
    with np.errstate(invalid="ignore"):
        p = e / ell
    return _attention_backward(a, g, p, p, _d_row(g, np.matmul(e, np.asarray(a["v"], dtype=np.float64))))


def _dv_unnormalised(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    e, ell = _weights(_scores(a))
    with np.errstate(invalid="ignore"):
        p = e / ell
    return _attention_backward(a, g, p, e, _d_row(g, _output(a)))


def _from_row_max(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    e, _ = _weights(_scores(a))
    return _attention_backward(a, g, e, e, _d_row(g, _output(a)))


def _tail_unmasked(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> list[Grads]:
    """The last t keys unmasked in the backward only, for every t (the tile's tail the backward forgot to mask)."""
    if a.get("mask") is None:
        return []
    s = _scores(a, masked=False)
    visible = np.broadcast_to(a["mask"], s.shape)
    out = _output(a)
    variants = []
    for t in range(1, s.shape[-1]):  # all of them: the mask ignored, its own departure
        vis = visible.copy()
        vis[..., -t:] = True
        e, ell = _weights(np.where(vis, s, -np.inf))
        p = e / ell
        variants.append(_attention_backward(a, g, p, p, _d_row(g, out)))
    return variants


def _unsafe_fully_masked(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    return dict(zip("qkv", ref_attention.scaled_dot_product_attention_vjp(a["q"], a["k"], a["v"], g, a["mask"])))


# --------------------------------------------------------------------------------------------
# softmax, LayerNorm, Eq. (2), the smoothed cross-entropy


def _softmax_no_mean(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    return {"x": ref_attention.softmax(a["x"], a["axis"]) * g}


def _layer_norm_parts(a: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a["x"], dtype=np.float64)
    c = x - np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + a["eps"])
    return c / s, s


def _layer_norm_oracle(a: Mapping[str, Any], g: np.ndarray) -> Grads:
    return dict(zip(("x", "gain", "bias"), ref_layers.layer_norm_vjp(a["x"], a["gain"], a["bias"], g, a["eps"])))


def _layer_norm_no_mean(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    grads = _layer_norm_oracle(a, g)
    _, s = _layer_norm_parts(a)
    return {**grads, "x": grads["x"] + np.mean(np.asarray(a["gain"]) * g, axis=-1, keepdims=True) / s}


def _layer_norm_raw_x(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    """The cancelling form, in the dtype: rstd from E[x^2] - E[x]^2 and x_hat = x rstd - mean rstd."""
    if dtype not in ("float64", "float32", "float16"):
        raise ValueError(f"computed in NumPy dtypes only, not {dtype}")
    dt = np.dtype(dtype)
    x, gain, gd = np.asarray(a["x"], dtype=dt), np.asarray(a["gain"], dtype=dt), np.asarray(g, dtype=dt)
    mean = np.mean(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rstd = 1.0 / np.sqrt(np.maximum(np.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0) + a["eps"])
        h = gain * gd
        x_hat = x * rstd - mean * rstd
        dx = rstd * (h - np.mean(h, axis=-1, keepdims=True) - x_hat * np.mean(h * x_hat, axis=-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return {
        "x": dx.astype(np.float64),
        "gain": np.sum(gd * x_hat, axis=rows).astype(np.float64),
        "bias": np.sum(gd, axis=rows).astype(np.float64),
    }


def _dgain_from_x(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> Grads:
    grads = _layer_norm_oracle(a, g)
    x = np.asarray(a["x"], dtype=np.float64)
    return {**grads, "gain": np.sum(g * x, axis=tuple(range(x.ndim - 1)))}


def _last_row_dropped(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> list[Grads]:
    """One of Eq. (2)'s parameter gradients, each a sum over rows, without the last row (the others the oracle's)."""
    oracle = dict(
        zip(("x", "w1", "b1", "w2", "b2"), ref_layers.feed_forward_vjp(a["x"], a["w1"], a["b1"], a["w2"], a["b2"], g))
    )
    x = np.asarray(a["x"], dtype=np.float64).reshape(-1, np.shape(a["x"])[-1])
    gr = np.asarray(g, dtype=np.float64).reshape(-1, np.shape(g)[-1])
    if x.shape[0] < 2:
        return []
    z = x @ a["w1"] + a["b1"]
    dz = (gr @ np.asarray(a["w2"]).T) * (z > 0)
    r = np.maximum(z, 0)
    dropped = {"w1": x[:-1].T @ dz[:-1], "b1": dz[:-1].sum(0), "w2": r[:-1].T @ gr[:-1], "b2": gr[:-1].sum(0)}
    return [{**oracle, name: value} for name, value in dropped.items()]


def _other_smoothing(a: Mapping[str, Any], g: np.ndarray, dtype: str) -> list[Grads]:
    """The gradient with a label-smoothing variant other than the forward's."""
    variants = []
    for variant in ("K", "K-1"):
        if variant == a["variant"] and a["padding_id"] is None:
            continue
        d = ref_training.smoothed_cross_entropy_vjp(a["logits"], a["targets"], a["eps"], g, variant=variant)
        variants.append({"logits": d})
    return variants


BACKWARD_CATALOGUE: tuple[BackwardDeparture, ...] = (
    BackwardDeparture(
        "backward ignores the mask",
        "the mask not saved for the backward (flash-attention #2424)",
        "scaled_dot_product_attention",
        _mask_forgotten,
    ),
    BackwardDeparture(
        "no 1/sqrt(d_k) in dS",
        "the score scaling forgotten in the backward: dQ, dK sqrt(d_k) times too large",
        "scaled_dot_product_attention",
        _no_scale,
    ),
    BackwardDeparture(
        "D from the unnormalised output",
        "D = rowsum(dO (.) O) taken from the accumulator before dividing by l",
        "scaled_dot_product_attention",
        _d_unnormalised,
    ),
    BackwardDeparture(
        "dV from the unnormalised weights",
        "dV = exp(S - m)^T dO, the weights before normalisation",
        "scaled_dot_product_attention",
        _dv_unnormalised,
    ),
    BackwardDeparture(
        "P recomputed from the row max, not the log-sum-exp",
        "a stale or shifted log-sum-exp: P = exp(S - m) unnormalised (PyTorch #119320)",
        "scaled_dot_product_attention",
        _from_row_max,
    ),
    BackwardDeparture(
        "the last keys not masked in the backward",
        "the tail of a length not a multiple of the tile, masked in the forward only (flash-attention bwd overflow)",
        "scaled_dot_product_attention",
        _tail_unmasked,
    ),
    BackwardDeparture(
        "0 x NaN on fully masked rows in the backward",
        "safe softmax in the forward, the unsafe one in the backward (PyTorch #41508)",
        "scaled_dot_product_attention",
        _unsafe_fully_masked,
    ),
    BackwardDeparture(
        "softmax backward without the mean term",
        "dx = y (.) dy: the - sum(y dy) forgotten",
        "softmax",
        _softmax_no_mean,
    ),
    BackwardDeparture(
        "LayerNorm backward without the mean term",
        "dx without - mean(gain dy): the gradient through the mean forgotten",
        "layer_norm",
        _layer_norm_no_mean,
    ),
    BackwardDeparture(
        "LayerNorm backward on raw x (one-pass variance)",
        "rstd from E[x^2] - E[x]^2: cancels when |mean| >> sigma (PaddlePaddle #35498)",
        "layer_norm",
        _layer_norm_raw_x,
        numerical=True,
    ),
    BackwardDeparture("LayerNorm dgain from x instead of x_hat", "dgain = sum dy (.) x", "layer_norm", _dgain_from_x),
    BackwardDeparture(
        "a row reduction drops its last block",
        "a parameter gradient summed over all rows but the last (attorch #18)",
        "feed_forward",
        _last_row_dropped,
    ),
    BackwardDeparture(
        "the tied embedding's gradient from the output projection only",
        "E's lookups treated as another (frozen) matrix: its gradient lacks their shares (§3.4 ties all three uses)",
        "transformer_forward",
        _embedding_one_use,
    ),
    BackwardDeparture(
        "the gradient's label smoothing differs from the forward's",
        "the smoothing spread over other classes in the backward than in the loss",
        "smoothed_cross_entropy",
        _other_smoothing,
    ),
)


#: The forward catalogue's structural departures of the whole model that its VJP can depart in (the positional
#: tables, the embedding's and output's scales, the final LayerNorms): a failing gradient of the whole model is named
#: by the same name as the forward's.
BACKWARD_CATALOGUE = BACKWARD_CATALOGUE + tuple(
    BackwardDeparture(d.name, d.note, "transformer_forward", _whole_model(d.ops), forward=d)
    for d in CATALOGUE
    if _structural(d) and set(_changes(d.ops)) and set(_changes(d.ops)) <= WHOLE_MODEL_FIELDS
)


#: Where a departure puts gradient where the paper has none (a masked key's dK), the check's budget there is a bare
#: floor; the departure's own rounding is allowed instead: this many units of the dtype times its largest |gradient|.
OWN_ROUNDOFFS = 64


def _agrees(got: np.ndarray, variant: np.ndarray, budget: np.ndarray, u: float) -> bool:
    if np.shape(variant) != np.shape(got) or not np.array_equal(np.isnan(got), np.isnan(variant)):
        return False
    live = ~np.isnan(got)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(live & (got != variant), np.abs(got - variant), 0.0)
        scale = float(np.max(np.abs(np.where(live, variant, 0.0)), initial=0.0))
        allowed = np.maximum(np.broadcast_to(budget, got.shape), OWN_ROUNDOFFS * u * scale)
        return bool(np.all(np.where(live, err <= allowed, True)))


def _agrees_with_every(
    variant: Mapping[str, np.ndarray],
    gradients: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]],
    u: float,
    budgets: Mapping[str, np.ndarray] | None = None,
) -> bool:
    """Whether ``variant`` (gradients by argument name) agrees with every gradient the implementation gave, each within
    its check's budget (or within ``budgets``, by argument name, where given)."""
    for names, got, budget in gradients.values():
        if not all(n in variant for n in names) or (budgets is not None and not all(n in budgets for n in names)):
            return False
        bound = budget if budgets is None else np.sum([budgets[n] for n in names], axis=0)
        if not _agrees(got, np.sum([variant[n] for n in names], axis=0), bound, u):
            return False
    return True


def explain(
    equation: str,
    a: Mapping[str, Any],
    g: np.ndarray,
    gradients: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]],
    dtype: str,
) -> list[str]:
    """The backward departures whose gradients agree with every gradient the implementation gave: ``gradients`` maps a
    label to (the argument names it is the gradient of, summed where one array was passed under several; the
    implementation's gradient; the check's budget). A departure that explains the failing gradient but contradicts
    one that passed is not named."""
    from aiayn.conformance.numerics import precision

    u = precision(dtype).u
    found, seen = [], []
    for departure in BACKWARD_CATALOGUE:
        if departure.equation != equation:
            continue
        try:
            with np.errstate(all="ignore"):
                computed = departure.gradients(a, g, dtype)
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            continue  # no meaning for these inputs
        if departure.forward is not None:
            refined = next((other for d, other in seen if d.name == departure.forward.same_as), None)
            if refined is not None and _same(computed, refined):
                continue  # where it is the departure it refines, that name stands for both
            seen.append((departure, computed))
        if any(_agrees_with_every(v, gradients, u) for v in (computed if isinstance(computed, list) else [computed])):
            found.append(departure.name)
    return found or (_pairs(a, g, gradients, u, seen) if PAIRS.get() else [])


def _same(a: Grads, b: Grads) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _pairs(
    a: Mapping[str, Any],
    g: np.ndarray,
    gradients: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]],
    u: float,
    singles: list[tuple[BackwardDeparture, Grads]],
) -> list[str]:
    """Two whole-model departures at once (``singles``: each with its gradients, none agreeing alone), changes to
    different fields, named "A + B" as the forward names them, where the pair agrees with every gradient within the
    check's budgets. Every such pair is computed (about 80, a VJP of about 10 ms each on the suite's shapes): no
    cheaper ranking held (a table's start and its layout, or a final LayerNorm after another table, are far from first
    order in the gradients)."""
    found = []
    for i, (first, _) in enumerate(singles):
        for second, _ in singles[i + 1 :]:
            if set(_changes(first.forward.ops)) & set(_changes(second.forward.ops)):
                continue  # two choices of one field: not both at once
            pair = _together(first.forward, second.forward)
            try:
                with np.errstate(all="ignore"):
                    variant = _whole_model(pair.ops)(a, g, "")
            except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
                continue
            if _agrees_with_every(variant, gradients, u):
                found.append(pair.name)
    return found


@dataclass(frozen=True)
class BackwardDiagnosis:
    """What ``comparison.matches`` needs to name the backward departure a failing gradient matches: the equation, the
    oracle's arguments ``a`` and cotangent ``g``, the failing gradient's ``label``, every gradient the
    implementation gave (see :func:`explain`) and the equation's backward record (``equations.Backward``: its VJP and
    budget, for :func:`arithmetic`)."""

    equation: str
    a: Mapping[str, Any]
    g: np.ndarray
    label: str
    gradients: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]]
    backward: Any

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        names, _, budget = self.gradients[self.label]
        gradients = {**self.gradients, self.label: (names, got, budget)}
        return arithmetic(self.backward, self.a, self.g, gradients, dtype) or explain(
            self.equation, self.a, self.g, gradients, dtype
        )


def arithmetic(
    backward: Any,
    a: Mapping[str, Any],
    g: np.ndarray,
    gradients: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]],
    dtype: str,
) -> list[str]:
    """The precision departure ("float32 inside a float64 claim", "subnormal results flushed to zero") under whose
    arithmetic every gradient the implementation gave agrees with the oracle's VJP: the same backward budget, derived
    for that arithmetic (``backward``, the equation's ``equations.Backward``: its ``oracle`` and ``budget_at``); empty
    when none does. As for the forward
    (``diagnoses.forward.explain``), the paper's equations computed at another arithmetic are named before any departure
    of an equation."""
    if backward is None:
        return []
    with np.errstate(all="ignore"):
        expected = {name: np.asarray(v, dtype=np.float64) for name, v in backward.oracle(a, g).items()}
    candidates = [("float32", "float32")] if dtype == "float64" else []
    if not dtype.endswith("-ftz"):
        candidates.append(("ftz", f"{dtype}-ftz"))
    for kind, target in candidates:
        with np.errstate(all="ignore"):
            budgets = backward.budget_at(a, g, expected, target)
        if _agrees_with_every(expected, gradients, 0.0, budgets):  # the arithmetic's own budget, no extra slack
            return [PRECISION_DEPARTURES[kind]]
    return []
