"""Fixed inputs: argument sets of the registered checks, the same on every device and dtype.

Hypothesis draws small, varied inputs; these are a few hand-built ones, kept stable so that a
GPU run, a CPU run and last month's run can be compared case by case (they were the inputs of
the former prepared GPU script). Each :class:`Fixed` names a registered check (``checks/``) and
its arguments, float64/int64/bool NumPy arrays and Python numbers, exactly as a Hypothesis
example would; ``test_fixed.py`` runs them through the same harness, budgets and report as every
other check (``aiayn check SPEC --device cuda`` runs them on a GPU).

Magnitudes: inputs N(0, 1) (scores up to a sharp softmax at 3 N(0, 1); multi-head attention at
0.5 N(0, 1) with weights at half scale, so that its scores stay resolvable in bfloat16); the composites use
d_model 8, h 2, d_ff 16 and weights N(0, 1/fan_in) scaled by 0.3, one layer per stack.
Where inputs are shared (self-attention), the same array is passed, so an implementation sees
the same native array as query, key and value (PyTorch's fused kernels require it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aiayn.conformance.directions import BACKWARD, BEAM_SEARCH, CACHED_STEPS, DECODE, FORWARD, REORDERED_CACHE, SPLIT

__all__ = ["FIXED", "Fixed", "beam_model", "cases"]


@dataclass(frozen=True)
class Fixed:
    """One fixed case: a label, the registered check it runs, and that check's arguments."""

    equation: str
    label: str
    check: str
    args: dict[str, Any] = field(hash=False)
    needs: tuple[
        str, ...
    ] = ()  # what of the domain it uses (Scope.unmet): out of scope where a declared Scope excludes it
    direction: str = FORWARD  # BACKWARD: of the equation's gradients (a cotangent d_out among its args); DECODE
    # the dtypes whose numbers hold the case's values (None: every dtype); another dtype runs a case of its own
    dtypes: tuple[str, ...] | None = None

    def __str__(self) -> str:  # the test id, and the name a known deviation uses
        return self.label


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(20170612 + seed)  # arXiv v1 date of the paper, plus the case number


def _mha_params(
    rng: np.random.Generator, d_model: int, biases: bool = True, scale: float = 1.0
) -> dict[str, np.ndarray]:
    p = {n: scale * rng.normal(size=(d_model, d_model)) / math.sqrt(d_model) for n in ("w_q", "w_k", "w_v", "w_o")}
    if biases:
        p.update({n: 0.1 * rng.normal(size=d_model) for n in ("b_q", "b_k", "b_v", "b_o")})
    return p


def _norm(rng: np.random.Generator, d: int) -> dict[str, np.ndarray]:
    return {"gain": 1.0 + 0.1 * rng.normal(size=d), "bias": 0.1 * rng.normal(size=d)}


def _ffn(rng: np.random.Generator, d: int, d_ff: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "w1": scale * rng.normal(size=(d, d_ff)) / math.sqrt(d),
        "b1": 0.1 * rng.normal(size=d_ff),
        "w2": scale * rng.normal(size=(d_ff, d)) / math.sqrt(d_ff),
        "b2": 0.1 * rng.normal(size=d),
    }


_D, _DFF, _H, _SCALE = 8, 16, 2, 0.3


def _encoder_params(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "self_attn": _mha_params(rng, _D, scale=_SCALE),
        "norm1": _norm(rng, _D),
        "ffn": _ffn(rng, _D, _DFF, _SCALE),
        "norm2": _norm(rng, _D),
    }


def _decoder_params(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "self_attn": _mha_params(rng, _D, scale=_SCALE),
        "norm1": _norm(rng, _D),
        "cross_attn": _mha_params(rng, _D, scale=_SCALE),
        "norm2": _norm(rng, _D),
        "ffn": _ffn(rng, _D, _DFF, _SCALE),
        "norm3": _norm(rng, _D),
    }


def _softmax() -> list[Fixed]:
    rng = _rng(1)
    x = np.stack([rng.normal(size=7), 30.0 * rng.normal(size=7), 5.0 + 1e-3 * rng.normal(size=7), rng.normal(size=7)])
    x[3, [1, 4]] = -np.inf  # masked scores: weight exactly 0
    y = rng.normal(size=(5, 3, 2))
    return [
        Fixed(
            "softmax",
            "rows N(0,1), 30 N(0,1), 5+1e-3 N(0,1), masked -inf",
            "softmax",
            {"x": x, "axis": -1},
            ("batchdims:1",),
        ),
        Fixed("softmax", "axis 0 of (5, 3, 2)", "softmax", {"x": y, "axis": 0}, ("batchdims:2",)),
    ]


def _attention() -> list[Fixed]:
    rng = _rng(2)
    q, k, v = rng.normal(size=(2, 3, 4, 8)), rng.normal(size=(2, 3, 6, 8)), rng.normal(size=(2, 3, 6, 5))
    mask = rng.random((2, 1, 4, 6)) < 0.6
    mask[:, :, :, 0] = True
    mask[1, 0, 2, :] = False  # one fully masked query row: the declared policy decides
    causal = np.arange(6)[None, :] <= np.arange(4)[:, None] + 2  # (4, 6), aligned at the end
    check = "scaled_dot_product_attention"
    cross = ("cross-attention", "batchdims:2")
    return [
        Fixed(check, "no mask, (2,3) batch", check, {"q": q, "k": k, "v": v, "mask": None}, (*cross, "masks:none")),
        Fixed(
            check, "sharp weights (3 q)", check, {"q": 3.0 * q, "k": k, "v": v, "mask": None}, (*cross, "masks:none")
        ),
        Fixed(
            check,
            "random mask with a fully masked row",
            check,
            {"q": q, "k": k, "v": v, "mask": mask},
            (*cross, "masks:random"),
        ),
        Fixed(check, "causal (4, 6) mask", check, {"q": q, "k": k, "v": v, "mask": causal}, (*cross, "masks:causal")),
        Fixed(
            check,
            "broadcast batch (2,1) x (1,3)",
            check,
            {"q": q[:, :1], "k": k[:1], "v": v[:1], "mask": None},
            (*cross, "masks:none"),
        ),
        Fixed(
            check,
            "33 queries, 65 keys: a partial last tile of 16, 32 or 64 (strategies.TILE_LENGTHS)",
            check,
            {
                "q": rng.uniform(-1, 1, (33, 4)),
                "k": rng.uniform(-1, 1, (65, 4)),
                "v": rng.normal(size=(65, 3)),
                "mask": None,
            },
            ("cross-attention", "masks:none", "length:65"),
        ),
    ]


def _mha() -> list[Fixed]:
    rng = _rng(3)
    d = 16
    # inputs 0.5 N(0, 1) and weights at half the 1/sqrt(fan_in) scale: scores of order 1, which
    # bfloat16 still resolves (conformance/inputs/strategies.py, logit_scale_cap)
    x, memory = 0.5 * rng.normal(size=(2, 5, d)), 0.5 * rng.normal(size=(2, 7, d))
    with_b, without_b = _mha_params(rng, d, scale=0.5), _mha_params(rng, d, biases=False, scale=0.5)
    pad = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]  # (2, 1, 5)
    causal = np.tril(np.ones((5, 5), dtype=bool))
    masked = np.broadcast_to(causal, (2, 5, 5)).copy()
    masked[1, 3, :] = False  # a fully masked row
    check = "multi_head_attention"

    def case(label: str, key: np.ndarray, params: dict, h: int, mask: np.ndarray | None, mask_kind: str) -> Fixed:
        needs = (
            ("batchdims:1", f"masks:{mask_kind}")
            + (("cross-attention",) if key is not x else ())
            + (("bias:attention",) if "b_q" in params else ())
        )
        return Fixed(
            check,
            label,
            check,
            {"query": x, "key": key, "value": key, "params": params, "num_heads": h, "mask": mask},
            needs,
        )

    return [
        case("self-attention, 4 heads, biases, padding mask", x, with_b, 4, pad, "padding"),
        case("self-attention, 2 heads, no biases, causal", x, without_b, 2, causal, "causal"),
        case("cross-attention n_q=5, n_k=7, 4 heads", memory, with_b, 4, None, "none"),
        case("self-attention with a fully masked row", x, with_b, 2, masked, "random"),
    ]


def _positional() -> list[Fixed]:
    return [
        Fixed(
            "positional_encoding",
            f"length {n}, d_model {d}",
            "positional_encoding",
            {"length": n, "d_model": d},
            (f"length:{n}",),
        )
        for n, d in ((50, 16), (0, 8), (2048, 64))
    ]


def _layer_norm() -> list[Fixed]:
    rng = _rng(4)
    d = 16
    x = np.stack([rng.normal(size=(4, d)), 3.0 + rng.normal(size=(4, d)), 0.01 * rng.normal(size=(4, d))])  # (3, 4, d)
    gain, bias = _norm(rng, d)["gain"], _norm(rng, d)["bias"]
    return [
        Fixed(
            "layer_norm",
            f"N(0,1), 3+N(0,1), 0.01 N(0,1) rows; eps {eps}",
            "layer_norm",
            {"x": x, "gain": gain, "bias": bias, "eps": eps},
            ("batchdims:2", f"eps:{eps!r}", "bias:layer_norm"),
        )
        for eps in (1e-6, 1e-5)
    ]


def _feed_forward() -> list[Fixed]:
    rng = _rng(5)
    x = rng.normal(size=(2, 5, 16))
    return [
        Fixed(
            "feed_forward",
            "x (2,5,16), d_ff 32",
            "feed_forward",
            {"x": x, **_ffn(rng, 16, 32)},
            ("batchdims:2", "d_ff:2", "bias:ffn"),
        )
    ]


def _training() -> list[Fixed]:
    rng = _rng(6)
    targets = rng.integers(0, 11, size=(2, 5))
    rng = _rng(7)
    logits, ce_targets = 3.0 * rng.normal(size=(2, 5, 11)), rng.integers(0, 11, size=(2, 5))
    return [
        Fixed(
            "lrate",
            "steps 1..100000, d_model 512, warmup 4000",
            "lrate",
            {"steps": [1, 10, 3999, 4000, 4001, 100000], "d_model": 512, "warmup_steps": 4000},
        ),
        Fixed(
            "label_smoothing",
            "targets (2,5), K=11, eps 0.1",
            "label_smoothing",
            {"targets": targets, "vocab_size": 11, "eps": 0.1},
        ),
        *[
            Fixed(
                "smoothed_cross_entropy",
                f"logits 3 N(0,1) (2,5,11), eps {eps}",
                "smoothed_cross_entropy",
                {"logits": logits, "targets": ce_targets, "eps": eps},
            )
            for eps in (0.1, 0.0)
        ],
        *[
            Fixed(
                "adam_step",
                f"the paper's betas and eps at step {step}: zero moments, a gradient of 0, one near eps",
                "adam_step",
                {
                    "param": np.array([0.5, -1.5, 2.0, 0.25]),
                    "grad": np.array([0.1, 0.0, -3e-9, 2.0]),
                    "m": np.array([0.0, 0.0, 1e-9, -0.5]) if step > 1 else np.zeros(4),
                    "v": np.array([0.0, 1e-6, 1e-17, 0.25]) if step > 1 else np.zeros(4),
                    "step": step,
                    "lr": 0.0007,
                    "betas": [0.9, 0.98],
                    "eps": 1e-9,
                },
                # bfloat16 resolves no first step: 1 - beta2^t is within its pow's error of 0 (strategies.adam_inputs)
                dtypes=("float64", "float32", *(("bfloat16",) if step > 1 else ())),
            )
            for step in (1, 4000)
        ],
        Fixed(  # eps = 1e-9 is 0 in float16, and its gradients' squares below 2.4e-4 too (strategies.adam_inputs)
            "adam_step",
            "float16's Adam at step 4000: eps 1e-3, a gradient of 0, moments from 1e-2",
            "adam_step",
            {
                "param": np.array([0.5, -1.5, 2.0, 0.25]),
                "grad": np.array([0.1, 0.0, -0.03, 2.0]),
                "m": np.array([0.0, 0.0, 0.01, -0.5]),
                "v": np.array([0.0, 1e-4, 1e-3, 0.25]),
                "step": 4000,
                "lr": 0.0007,
                "betas": [0.9, 0.98],
                "eps": 1e-3,
            },
            dtypes=("float16",),
        ),
        *[
            Fixed(
                "dropout",
                f"x N(0,1) (4,8), p {p}",
                "dropout",
                {"x": _rng(8).normal(size=(4, 8)), "p": p, "seed": 2017},
            )
            for p in (0.1, 0.3)
        ],
        *[
            Fixed(
                "average_checkpoints",
                f"checkpoints at steps 20, 1000, 5, 300 (in that order), n {n}",
                "average_checkpoints",
                {
                    "checkpoints": {
                        s: {"w": 0.1 * s * np.ones((2, 2)) + rng.normal(size=(2, 2)), "b": rng.normal(size=2)}
                        for s in (20, 1000, 5, 300)
                    },
                    "n": n,
                },
            )
            for n in (2, 4)
        ],
    ]


def _layers() -> list[Fixed]:
    rng = _rng(8)
    x, params = rng.normal(size=(2, 5, _D)), _encoder_params(rng)
    pad = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]
    layer = ("d_ff:2", "length:5", "bias:attention", "bias:layer_norm", "bias:ffn")
    out = [
        Fixed(
            "encoder_layer",
            "x (2,5,8), h 2, d_ff 16, no mask",
            "encoder_layer",
            {"x": x, "params": params, "num_heads": _H, "mask": None},
            (*layer, "masks:none"),
        ),
        Fixed(
            "encoder_layer",
            "padding lengths [5, 3]",
            "encoder_layer",
            {"x": x, "params": params, "num_heads": _H, "mask": pad},
            (*layer, "masks:padding"),
        ),
    ]
    rng = _rng(9)
    y, memory, params = rng.normal(size=(2, 4, _D)), rng.normal(size=(2, 5, _D)), _decoder_params(rng)
    memory_mask = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]
    self_mask = np.tril(np.ones((4, 4), dtype=bool)) & (np.arange(4)[None, :] < np.array([4, 2])[:, None])[:, None, :]
    base = {"y": y, "memory": memory, "params": params, "num_heads": _H}
    out += [
        Fixed(
            "decoder_layer",
            "default (causal) self mask, no memory mask",
            "decoder_layer",
            {**base, "self_mask": None, "memory_mask": None},
            layer,
        ),
        Fixed(
            "decoder_layer",
            "causal+padding self mask, memory padding",
            "decoder_layer",
            {**base, "self_mask": self_mask, "memory_mask": memory_mask},
            (*layer, "masks:padding"),
        ),
    ]
    rng = _rng(10)
    vocab = 11
    model = {
        "embedding": rng.normal(size=(vocab, _D)) / math.sqrt(_D),
        "encoder": [_encoder_params(rng)],
        "decoder": [_decoder_params(rng)],
    }
    src, tgt = rng.integers(0, vocab, size=(2, 5)), rng.integers(0, vocab, size=(2, 4))
    base = {"src": src, "tgt": tgt, "params": model, "num_heads": _H}
    out += [
        Fixed(
            "transformer_forward",
            "N=1, d 8, h 2, vocab 11, no padding",
            "transformer_forward",
            {**base, "src_lengths": None, "tgt_lengths": None},
            layer,
        ),
        Fixed(
            "transformer_forward",
            "padding: src [5, 3], tgt [4, 2]",
            "transformer_forward",
            {**base, "src_lengths": np.array([5, 3]), "tgt_lengths": np.array([4, 2])},
            (*layer, "masks:padding"),
        ),
    ]
    return out


def _gradients() -> list[Fixed]:
    """Cases of the backward pass: each with the cotangent ``d_out``, of a non-zero mean or of one sign."""
    rng = _rng(20)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)) + 1.5, rng.normal(size=(2, 5, 3))
    mask = np.ones((2, 3, 5), dtype=bool)
    mask[0, :, 4] = False  # the last key of an odd length, masked: the tail of a tile of 2
    mask[1, 0, 1], mask[1, 2, [0, 4]] = False, False
    attention = "scaled_dot_product_attention"
    # |mean| / sigma 4, what bfloat16 still resolves (strategies.resolvable_level): the cancelling forms lose here
    x_ln = 4.0 + rng.normal(size=(3, 8))
    x_ffn = rng.normal(size=(4, 6))
    x_ffn[1] = 0.0  # with b1 0 on some units, ReLU's input is exactly 0 there: either branch is allowed
    ffn = _ffn(rng, 6, 12)
    ffn["b1"][:4] = 0.0
    query = 0.5 * rng.normal(size=(2, 4, 8))
    padding = np.ones((2, 4, 4), dtype=bool)
    padding[1, :, 3] = False
    logits = 3.0 * rng.normal(size=(2, 3, 9))
    return [
        Fixed(
            "softmax",
            "one-sign cotangent, masked -inf",
            "softmax_gradients",
            {
                "x": np.where(rng.random((3, 6)) < 0.2, -np.inf, rng.normal(size=(3, 6))),
                "axis": -1,
                "d_out": np.abs(rng.normal(size=(3, 6))) + 1.0,
            },
            ("batchdims:1",),
            BACKWARD,
        ),
        Fixed(
            attention,
            "keys with a common component, odd length, last key masked, cotangent mean 2",
            "scaled_dot_product_attention_gradients",
            {"q": q, "k": k, "v": v, "mask": mask, "d_out": 2.0 + rng.normal(size=(2, 3, 3))},
            ("cross-attention", "masks:padding", "masks:random", "batchdims:1"),
            BACKWARD,
        ),
        Fixed(
            "multi_head_attention",
            "self-attention, one array, padding, h 2",
            "multi_head_attention_gradients",
            {
                "query": query,
                "key": query,
                "value": query,
                "params": _mha_params(rng, 8, scale=0.5),
                "num_heads": 2,
                "mask": padding,
                "d_out": 1.0 + rng.normal(size=(2, 4, 8)),
            },
            ("masks:padding", "batchdims:1", "bias:attention"),
            BACKWARD,
        ),
        Fixed(
            "layer_norm",
            "rows at 4 +- 1 (|mean| / sigma 4), eps 1e-5",
            "layer_norm_gradients",
            {"x": x_ln, **_norm(rng, 8), "eps": 1e-5, "d_out": 1.0 + rng.normal(size=(3, 8))},
            ("batchdims:1",),
            BACKWARD,
        ),
        Fixed(
            "feed_forward",
            "ReLU inputs exactly 0 on some units, 4 rows",
            "feed_forward_gradients",
            {"x": x_ffn, **ffn, "d_out": rng.normal(size=(4, 6)) - 1.0},
            ("batchdims:1",),
            BACKWARD,
        ),
        Fixed(
            "smoothed_cross_entropy",
            "logits 3 N(0,1), eps 0.1, cotangent 1",
            "smoothed_cross_entropy_gradients",
            {"logits": logits, "targets": rng.integers(0, 9, size=(2, 3)), "eps": 0.1, "d_out": np.ones((2, 3))},
            (),
            BACKWARD,
        ),
    ]


def beam_model(seed: int, scale: float, vocab: int = 6) -> tuple[dict[str, Any], np.ndarray, int]:
    """A whole model (one layer a stack, d 8) whose embedding, and so its logits, is ``scale`` times the usual, two
    source sentences of 4 ids, and its number of heads (2). The decoding cases are built on these, and the beam
    inputs drawn near them (``strategies._steered_beam``)."""
    rng = _rng(seed)
    model = {
        "embedding": scale * rng.normal(size=(vocab, _D)) / math.sqrt(_D),
        "encoder": [_encoder_params(rng)],
        "decoder": [_decoder_params(rng)],
    }
    return model, rng.integers(0, vocab, size=(2, 4)), _H


def _cache() -> list[Fixed]:
    """The cached decoder fed a prefill then one token at a time, the same with canaries at the hidden source
    positions, and a cache of two sentences reordered by a swap (a reorder that reads rows it has already overwritten
    shows only where a row moves)."""
    model, src, _ = beam_model(30, 1.0, vocab=11)
    tgt = _rng(31).integers(0, 11, size=(2, 5))
    layer = ("d_ff:2", "bias:attention", "bias:layer_norm", "bias:ffn", "length:5", "masks:padding")
    base = {"src": src, "params": model, "num_heads": _H, "src_lengths": np.array([4, 2])}
    return [
        Fixed(
            "transformer_forward",
            "cache: a prefill of 2, then 1, 1, 1",
            CACHED_STEPS,
            {**base, "tgt": tgt, "chunks": [2, 1, 1, 1]},
            layer,
            direction=DECODE,
        ),
        Fixed(
            "transformer_forward",
            "cache: canaries at the hidden source positions (other tokens, the largest safe values in the memory)",
            "cached_decoding_ignores_what_padding_holds",
            {**base, "tgt": tgt, "chunks": [2, 1, 1, 1], "filler_seed": 32},
            layer,
            direction=DECODE,
        ),
        Fixed(
            "transformer_forward",
            "cache: 3 positions, rows swapped, then 2 tokens",
            REORDERED_CACHE,
            {**base, "tgt": tgt[:, :3], "index": np.array([1, 0]), "new": tgt[::-1, 3:]},
            layer,
            direction=DECODE,
        ),
    ]


def _beam() -> list[Fixed]:
    """Beam searches where a known bug of the search changes the hypothesis returned, on every run: each input was
    found among small models by running the oracle's search (``reference.decoding.beam_search``) with §6.1's
    choices (tensor2tensor's defaults) and with the bug switched in, keeping one where the two differ and every
    choice of the first is wider than float32's error (``tests/meta/test_beam_diagnoses.py``: on each, the NumPy
    built-in passes and the bug's mutant fails, named)."""
    check = BEAM_SEARCH
    out = []
    for label, seed, scale, eos, beam, alpha, extra, batch in (
        (
            "an EOS among the best candidates early (a finished one kept alive would be extended)",
            0,
            1.0,
            4,
            4,
            1.0,
            2,
            1,
        ),
        ("best continuations sharing a parent (a per-hypothesis top-1 loses them)", 0, 1.0, 4, 2, 0.6, 2, 1),
        ("a longer hypothesis overtakes after a stop bounded at the current length", 2, 2.0, 2, 1, 2.0, 4, 1),
        ("two sentences with different maximum lengths (the shorter one's matters)", 0, 1.0, 4, 2, 0.6, 2, 2),
        (
            "sentences that stop at different steps under the 'full' rule (a stop for the whole batch lets the first "
            "search on)",
            8,
            2.0,
            3,
            2,
            0.6,
            4,
            2,
        ),
    ):
        model, src, _ = beam_model(seed, scale)
        lengths = np.array([2, 4]) if batch == 2 else None
        args = {
            "src": src[:batch],
            "params": model,
            "num_heads": _H,
            "src_lengths": lengths,
            "beam": beam,
            "alpha": alpha,
            "extra": extra,
            "bos": 0,
            "eos": eos,
        }
        needs = ("d_ff:2", "bias:attention", "bias:layer_norm", "bias:ffn", f"length:{4 + extra}")
        needs += ("masks:padding",) if batch == 2 else ()
        out.append(Fixed("transformer_forward", f"beam: {label}", check, args, needs, direction=DECODE))
    return out


def _split() -> list[Fixed]:
    """Split keys (§3.2.1): a merge of three states (one empty, log-sum-exps 30 apart); a paged cache whose unowned
    slots hold NaN; and 9 keys cut into blocks of 3, 0 and 6 keys merged, the last block hidden from one query."""
    rng = _rng(40)
    eq = "scaled_dot_product_attention"
    lses = np.array([[1.5, 31.0], [-np.inf, 2.0], [0.25, -np.inf]])  # (P = 3, n_q = 2): every query has two alive
    merge = {"outs": rng.normal(size=(3, 2, 4)), "lses": lses}
    mask = np.ones((4, 9), dtype=bool)
    mask[2, 3:] = False  # query 2 sees the first block only
    split = {
        "q": rng.uniform(-1, 1, (4, 5)),
        "k": rng.uniform(-1, 1, (9, 5)),
        "v": rng.normal(size=(9, 3)),
        "mask": mask,
        "edges": (0, 3, 3, 9),
    }
    table, lengths = np.array([[3, 1, 4], [0, 2, 5]], dtype=np.int64), np.array([3, 5], dtype=np.int64)
    k_pages, v_pages = np.full((7, 2, 4), np.nan), np.full((7, 2, 3), np.nan)  # page 6 is no sentence's
    for s, n in enumerate(lengths):
        for t in range(n):
            k_pages[table[s, t // 2], t % 2] = rng.uniform(-1, 1, 4)
            v_pages[table[s, t // 2], t % 2] = rng.normal(size=3)
    paged = {"q": rng.uniform(-1, 1, (2, 2, 4)), "k_pages": k_pages, "v_pages": v_pages}
    return [
        Fixed(eq, "merge: 3 states, one empty per query", "merge_attention_states", merge, (), direction=SPLIT),
        Fixed(
            eq,
            "paged: 2 sentences of 3 and 5 positions in pages of 2, NaN in every slot they do not own",
            "paged_attention",
            {**paged, "block_table": table, "lengths": lengths},
            ("cross-attention",),
            direction=SPLIT,
        ),
        Fixed(
            eq,
            "9 keys in blocks of 3, 0 and 6, one hidden from a query",
            "attention_over_split_keys_equals_the_whole",
            split,
            ("cross-attention", "masks:random", "length:9"),
            direction=SPLIT,
        ),
    ]


#: Every fixed case, in paper order.
FIXED: tuple[Fixed, ...] = (
    *_softmax(),
    *_attention(),
    *_split(),
    *_mha(),
    *_positional(),
    *_layer_norm(),
    *_feed_forward(),
    *_training(),
    *_layers(),
    *_gradients(),
    *_cache(),
    *_beam(),
)


def cases(equation: str, direction: str = FORWARD) -> list[Fixed]:
    """The fixed cases of ``equation`` in ``direction`` ("forward", "backward": its gradients, or "decode")."""
    return [c for c in FIXED if c.equation == equation and c.direction == direction]
