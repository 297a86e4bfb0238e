"""Batch invariance (§3.1-§3.3, §3.2.3): an example's result does not depend on what else is in its batch.

For every batched equation (its record's ``batch``, ``inputs/batches.py``), one check ``<equation>_is_batch_invariant``
computes the drawn example three ways: alone, as one block at another index of a larger batch whose other blocks
have other lengths, and with hidden padding appended. Two tiers:

- *within budget* (always): each arrangement agrees with the oracle within the equation's own budget (the bound of
  the example's computation, whatever else shares the call), and how many ulps apart the arrangements came out
  from the example alone is reported (``Counts.apart``);
- *bitwise* (where the implementation declares ``policies["batch_invariant"]``): the example in the batch has the
  same bits as alone, as vLLM's and Thinking Machines' batch-invariance tests demand. Padding changes the lengths a
  kernel reduces over, so it is held to the first tier only.

Decoding (§3.2.3, §6.1) gets the same arrangements of its sentences: ``cached_decoding_is_batch_invariant`` (each
call within the whole model's forward budget) and ``beam_search_is_batch_invariant`` (each call's hypotheses judged
against the oracle's search, tie-aware, so a sentence keeps its hypothesis wherever that search decided it; tokens and
score bit for bit where declared). Their batched arguments are the decoding record's ``steps_batch`` and
``search_batch``.

Gradients (the backward direction): ``<equation>_gradients_are_batch_invariant`` compares the gradients of the
example's own arguments alone, in a batch and padded (the weights' gradients sum over the batch and are held to the
budget only), and ``<equation>_gradients_are_deterministic`` runs the same backward call :data:`RERUNS` times (the row
reports the ulps between reruns; bit for bit where ``policies["deterministic"]`` is declared). Every call is held to
the record's backward budget against the oracle's VJP.

The padded call is judged against the oracle on the padded arguments: the declared policy "uniform" gives a fully
masked query row the mean of every value, padded ones included, so there the padded result differs from the example's
by definition; elements whose oracle values differ between the two are left out of the ulps apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aiayn.conformance.checks import decoding as D
from aiayn.conformance.checks._common import (
    UNDEFINED_GRADIENT,
    agreement,
    declared,
    gradient_agreement,
    implementation_result,
    prepare,
)
from aiayn.conformance.directions import BACKWARD, DECODE
from aiayn.conformance.equations import record
from aiayn.conformance.inputs import batches
from aiayn.conformance.inputs.strategies import scope
from aiayn.conformance.numerics import first_index, ulp
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check, current_stats

__all__ = ["NO_BATCH", "NO_PADDING", "TIE_APART", "ulps_apart"]

#: What an example counts as where it could not be put in a batch (one "not checked" per example): the scope accepts
#: no batch dimension to add.
NO_BATCH = "batch invariance: the scope accepts no batch dimension to add"
#: The row's note where an example could not be padded (the record's ``why_no_padding`` where it has no padding
#: arrangement at all).
NO_PADDING = "padded arrangement not checked on some examples: the scope accepts no padding mask or no longer sequence"


#: The row's note where a sentence's beam-search hypothesis differed between arrangements: each was judged against
#: the oracle's search, which was within the scores' error there, so either is right (bit for bit only where declared).
TIE_APART = (
    "beam search: a sentence's hypothesis differed between arrangements where the oracle's search was within the "
    "scores' error (either is right)"
)


def _note(text: str) -> None:
    stats = current_stats().get()
    if stats is not None:
        stats.notes.add(text)


#: What a failure of batch invariance breaks.
VIOLATES = (
    "each sentence's result depends on that sentence alone, and padding is as if absent (§3.1-§3.3; masking, §3.2.3)"
)


def ulps_apart(a: np.ndarray, b: np.ndarray, dtype: str) -> float:
    """The most ulps of ``dtype`` (at the larger magnitude of the pair) between ``a`` and ``b``, elementwise; NaN
    against NaN and equal infinities count 0 (a differing NaN pattern is an oracle disagreement, judged before)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if bool(np.all(same)):
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.where(same, 0.0, np.abs(a - b) / ulp(np.maximum(np.abs(a), np.abs(b)), dtype))
    # inf against a finite number (or inf against -inf) gives NaN above: counted as infinitely far apart, so it can
    # only fail a declared batch invariance or show as the row's worst distance, never read as 0
    gap = np.where(np.isnan(gap), np.inf, gap)
    return float(np.max(gap))


def differing_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where ``a`` and ``b`` differ bit for bit, as a declared invariance judges them: +0 and -0 differ; any NaN
    matches any NaN (the agreement checks judge NaN by where it is, not by its payload)."""
    same = (a == b) & (np.signbit(a) == np.signbit(b))
    return ~(same | (np.isnan(a) & np.isnan(b)))


def _bitwise(case: Case, got: np.ndarray, alone: np.ndarray, declared_as: str, what: str, against: str) -> None:
    """Under a declared ``policies[declared_as]``: ``got`` (``what``) has exactly the bits of ``alone``
    (``against``)."""
    differs = differing_bits(got, alone)
    if np.any(differs):
        i = first_index(differs)
        case.fail(
            f"policies[{declared_as!r}] is declared, but {what} differs from {against} in {int(np.sum(differs))} of "
            f"{differs.size} elements, up to {ulps_apart(got, alone, case.dtype):.3g} ulps (first at index {i}: "
            f"{float(got[i])!r}, against {float(alone[i])!r})",
            breaks_property=True,
        )


def _placements(
    example: batches.Placed, b: batches.Batching, where: Any, size: int, index: int, hidden: int, rng: Any
) -> list[tuple[str, batches.Placed | None]]:
    """The arrangements of ``example`` (from ``batches.alone``) by their report key: at ``index`` of a batch of
    ``size`` blocks, and with ``hidden`` padded positions (None where the scope accepts none)."""
    return [
        ("in a batch", batches.in_batch(example, b, where, size, index, rng)),
        ("padded", batches.padded(example, b, where, hidden, rng)),
    ]


def _batch_check(equation: str) -> Callable[..., None]:
    """Register ``<equation>_is_batch_invariant``: the example alone, in a batch and padded, each within the
    equation's budget; the batch bit for bit where declared."""
    r = record(equation)
    b = r.batch
    assert b is not None

    def is_batch_invariant(case: Case, size: int, index: int, hidden: int, seed: int, **args: Any) -> None:
        rng = np.random.default_rng(seed)
        where = scope(case.impl, equation)
        example = batches.alone(args, b, where)
        if example is None:
            case.tally(unchecked={NO_BATCH: 1})
            return
        undefined = r.undefined(example.args) if r.undefined is not None else None
        got, expected, budget = agreement(case, **example.args)
        compare(
            case,
            got,
            expected,
            budget,
            what=f"{example.what} disagrees with the oracle",
            budget_name=r.budget_name,
            undefined=undefined,
        )
        for key, placed in _placements(example, b, where, size, index, hidden, rng):
            if placed is None:
                _note(b.why_no_padding or NO_PADDING)
                continue
            if key == "padded":  # the oracle of the padded call: a policy may read the padding (see the docstring)
                mine, want, bound = (x[placed.keep] for x in agreement(case, **placed.args))
            else:
                mine, want, bound = implementation_result(case, **placed.args)[0][placed.keep], expected, budget
            compare(
                case,
                mine,
                want,
                bound,
                what=f"{placed.what} disagrees with the oracle",
                budget_name=r.budget_name,
                undefined=undefined,
            )
            invariant = "batch_invariant" if key == "in a batch" else None
            free = None if undefined is None else undefined[0]
            _apart(case, key, (mine, want), (got, expected), placed.what, invariant, free)

    name = f"{equation}_is_batch_invariant"
    is_batch_invariant.__name__ = is_batch_invariant.__qualname__ = name
    is_batch_invariant.__doc__ = (
        f"{r.title}: the example alone, in a batch and padded, each within {r.budget_name}; the batch bit for bit "
        "where policies['batch_invariant'] is declared."
    )
    return check(equation, kind="property", violates=VIOLATES)(is_batch_invariant)


softmax_is_batch_invariant = _batch_check("softmax")
scaled_dot_product_attention_is_batch_invariant = _batch_check("scaled_dot_product_attention")
multi_head_attention_is_batch_invariant = _batch_check("multi_head_attention")
layer_norm_is_batch_invariant = _batch_check("layer_norm")
feed_forward_is_batch_invariant = _batch_check("feed_forward")
encoder_layer_is_batch_invariant = _batch_check("encoder_layer")
decoder_layer_is_batch_invariant = _batch_check("decoder_layer")
transformer_forward_is_batch_invariant = _batch_check("transformer_forward")


# --------------------------------------------------------------------------------------------
# the backward pass: an example's gradients in a batch, padded, and run again

#: How many times the determinism checks run the same backward call.
RERUNS = 3


def _cotangent(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A cotangent of mixed sign around a drawn offset (a loss's gradient need not have mean 0)."""
    return rng.standard_normal(shape) + rng.choice([0.0, -3.0, 2.0])


def _judged_gradients(case: Case, d_out: np.ndarray, args: dict[str, Any], what: str) -> dict[str, tuple]:
    """Every gradient the implementation gives for ``args`` and ``d_out``, each compared with the oracle's VJP within
    the record's backward budget (``what`` names the call): (got, the oracle's) by gradient label."""
    bw = record(case.equation).backward
    diagnoses: dict[str, Any] = {}
    out = {}
    for label, (got, want, bound) in gradient_agreement(case, d_out, diagnoses, **args).items():
        case.diagnosis = diagnoses[label]
        compare(
            case,
            got,
            want,
            bound,
            what=f"the gradient {label} of {what} disagrees with the oracle's VJP",
            budget_name=bw.budget_name,
            expected_name="the oracle's VJP",
            undefined=(np.isnan(want), UNDEFINED_GRADIENT),
        )
        out[label] = (got, want)
    return out


def _apart(
    case: Case,
    key: str,
    mine: tuple,
    theirs: tuple,
    what: str,
    declared_as: str | None,
    undefined: np.ndarray | None = None,
) -> None:
    """Note how many ulps ``mine`` (got, the oracle's) came out from ``theirs`` (the example's own: got, the
    oracle's) under the report key ``key``, leaving out elements whose oracle values differ (a policy that reads
    padding), are NaN, or are ``undefined``; under a declared ``policies[declared_as]`` the bits must match."""
    (got, want), (alone, expected) = mine, theirs
    free = ~((want == expected) | (np.isnan(want) & np.isnan(expected))) | np.isnan(want)
    if undefined is not None:
        free = free | np.broadcast_to(undefined, free.shape)
    a, b = np.where(free, 0.0, got), np.where(free, 0.0, alone)
    case.apart(key, ulps_apart(a, b, case.dtype))
    if declared_as is not None and declared(case).get(declared_as, False):
        _bitwise(case, a, b, declared_as, what, "the example computed alone" if key != "rerun" else "run 1")


def _gradient_batch_check(equation: str) -> Callable[..., None]:
    """Register ``<equation>_gradients_are_batch_invariant``: the gradients of the example's own arguments alone, in
    a batch and padded, each within the backward budget; the batch bit for bit where declared."""
    r = record(equation)
    b = r.batch
    assert b is not None and r.backward is not None

    def gradients_are_batch_invariant(case: Case, size: int, index: int, hidden: int, seed: int, **args: Any) -> None:
        rng = np.random.default_rng(seed)
        where = scope(case.impl, equation)
        example = batches.alone(args, b, where)
        if example is None:
            case.tally(unchecked={NO_BATCH: 1})
            return
        policies = r.policies(declared(case))
        d_alone = _cotangent(np.shape(r.oracle({**example.args, **policies})), rng)
        alone = _judged_gradients(case, d_alone, example.args, example.what)
        ranks = b.core(example.args)
        for key, placed in _placements(example, b, where, size, index, hidden, rng):
            if placed is None:
                _note(b.why_no_padding or NO_PADDING)
                continue
            shape = np.shape(r.oracle({**placed.args, **policies}))
            # the other blocks' cotangents drawn; padded positions' 0, as a loss over a padded batch masks them
            d = _cotangent(shape, rng) if key == "in a batch" else np.zeros(shape)
            d[placed.keep] = d_alone
            got = _judged_gradients(case, d, placed.args, placed.what)
            for label, pair in got.items():
                parts = label[1:].split("+d")
                if label not in alone or not all(p in ranks for p in parts):
                    continue  # a weight the batch shares: its gradient sums over the batch
                if key == "in a batch":
                    part = placed.keep
                else:  # the example's own positions: the first n of each argument padding extends
                    n = np.shape(example.args[parts[0]])[-2] if parts[0] in b.positions else None
                    part = (Ellipsis, slice(0, n), slice(None)) if n is not None else (Ellipsis,)
                mine = (pair[0][part], pair[1][part])
                invariant = "batch_invariant" if key == "in a batch" else None
                _apart(case, key, mine, alone[label], f"the gradient {label} {placed.what}", invariant)

    name = f"{equation}_gradients_are_batch_invariant"
    gradients_are_batch_invariant.__name__ = gradients_are_batch_invariant.__qualname__ = name
    gradients_are_batch_invariant.__doc__ = (
        f"{r.title}: the gradients of the example's own arguments alone, in a batch and padded, each within "
        f"{r.backward.budget_name}; the batch bit for bit where policies['batch_invariant'] is declared."
    )
    return check(equation, kind="property", violates=VIOLATES, direction=BACKWARD)(gradients_are_batch_invariant)


#: What a failure of run-to-run determinism breaks: a declared promise rather than the paper (§3 defines functions).
DETERMINISM_VIOLATES = "each equation is a function of its inputs (§3): the same call gives the same gradients"


def _determinism_check(equation: str) -> Callable[..., None]:
    """Register ``<equation>_gradients_are_deterministic``: the same backward call :data:`RERUNS` times, each within
    the budget, the spread between runs reported; bit for bit where ``policies["deterministic"]`` is declared."""
    r = record(equation)
    assert r.backward is not None

    def gradients_are_deterministic(case: Case, seed: int, **args: Any) -> None:
        rng = np.random.default_rng(seed)
        d = _cotangent(np.shape(r.oracle({**args, **r.policies(declared(case))})), rng)
        first = _judged_gradients(case, d, args, "the call")
        for n in range(2, RERUNS + 1):
            again = _judged_gradients(case, d, args, f"the call run again ({n} of {RERUNS})")
            for label, pair in again.items():
                if label in first:
                    what = f"the gradient {label} of run {n} (against run 1)"
                    _apart(case, "rerun", pair, first[label], what, "deterministic")

    name = f"{equation}_gradients_are_deterministic"
    gradients_are_deterministic.__name__ = gradients_are_deterministic.__qualname__ = name
    gradients_are_deterministic.__doc__ = (
        f"{r.title}: the same backward call {RERUNS} times, each within {r.backward.budget_name}, the ulps between "
        "runs reported; bit for bit where policies['deterministic'] is declared."
    )
    return check(equation, kind="property", violates=DETERMINISM_VIOLATES, direction=BACKWARD)(
        gradients_are_deterministic
    )


softmax_gradients_are_batch_invariant = _gradient_batch_check("softmax")
scaled_dot_product_attention_gradients_are_batch_invariant = _gradient_batch_check("scaled_dot_product_attention")
multi_head_attention_gradients_are_batch_invariant = _gradient_batch_check("multi_head_attention")
layer_norm_gradients_are_batch_invariant = _gradient_batch_check("layer_norm")
feed_forward_gradients_are_batch_invariant = _gradient_batch_check("feed_forward")
encoder_layer_gradients_are_batch_invariant = _gradient_batch_check("encoder_layer")
decoder_layer_gradients_are_batch_invariant = _gradient_batch_check("decoder_layer")

softmax_gradients_are_deterministic = _determinism_check("softmax")
scaled_dot_product_attention_gradients_are_deterministic = _determinism_check("scaled_dot_product_attention")
multi_head_attention_gradients_are_deterministic = _determinism_check("multi_head_attention")
layer_norm_gradients_are_deterministic = _determinism_check("layer_norm")
feed_forward_gradients_are_deterministic = _determinism_check("feed_forward")
encoder_layer_gradients_are_deterministic = _determinism_check("encoder_layer")
decoder_layer_gradients_are_deterministic = _determinism_check("decoder_layer")
smoothed_cross_entropy_gradients_are_deterministic = _determinism_check("smoothed_cross_entropy")
transformer_forward_gradients_are_deterministic = _determinism_check("transformer_forward")


# --------------------------------------------------------------------------------------------
# decoding (§3.2.3, §6.1): a sentence decoded, and searched, in a batch of other sentences

#: What a failure of batch invariance in decoding breaks.
DECODING_VIOLATES = (
    "each sentence is decoded, and beam-searched, from that sentence alone (§6.1's search is per sentence), and "
    "source padding is as if absent (§3.2.3)"
)

_DECODE = record("transformer_forward").decode


def _arrangements(
    args: dict[str, Any], b: batches.Batching, size: int, index: int, hidden: int, rng: np.random.Generator, impl: Any
) -> tuple[batches.Placed, list[tuple[str, batches.Placed | None]]]:
    """The sentences as drawn (they always have a batch axis), in a larger batch, and with hidden source padding."""
    where = scope(impl, "transformer_forward")
    example = batches.alone(args, b, where)
    assert example is not None  # a batch axis is there already: alone adds none
    return example, _placements(example, b, where, size, index, hidden, rng)


@check("transformer_forward", kind="property", violates=DECODING_VIOLATES, direction=DECODE)
def cached_decoding_is_batch_invariant(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    chunks: list[int],
    size: int,
    index: int,
    hidden: int,
    seed: int,
) -> None:
    """The sentences decoded with a cache in ``chunks`` as drawn, at another index of a larger batch of other
    sentences of other lengths, and with hidden source padding: each within the whole model's forward budget
    (``checks/decoding.judge_decoding``), the ulps between them reported; the batch bit for bit where
    policies['batch_invariant'] is declared."""
    D.provided(case.impl, "steps")
    rng = np.random.default_rng(seed)
    sentences = {"src": src, "tgt": tgt, "src_lengths": src_lengths}
    example, arrangements = _arrangements(sentences, _DECODE.steps_batch, size, index, hidden, rng, case.impl)

    def run(placed: batches.Placed, where: str) -> tuple[np.ndarray, np.ndarray]:
        a = placed.args
        natives, seen = prepare(
            case, src=a["src"], tgt=a["tgt"], params=params, num_heads=num_heads, src_lengths=a["src_lengths"]
        )
        got = D.decoded_in_chunks(case, natives, seen, num_heads, chunks)
        return got, D.judge_decoding(case, seen, chunks, got, where)[0]

    got, expected = run(example, "")
    for key, placed in arrangements:
        if placed is None:
            _note(NO_PADDING)
            continue
        mine, want = (x[placed.keep] for x in run(placed, f" ({placed.what})"))
        # the padded call is judged against its own oracle (the forward checks' rule); where the two oracles differ
        # the distance is left out
        invariant = "batch_invariant" if key == "in a batch" else None
        _apart(case, key, (mine, want), (got, expected), placed.what, invariant)


@check("transformer_forward", kind="property", violates=DECODING_VIOLATES, direction=DECODE)
def beam_search_is_batch_invariant(
    case: Case,
    src: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    beam: int,
    alpha: float,
    extra: int,
    bos: int,
    eos: int,
    size: int,
    index: int,
    hidden: int,
    seed: int,
) -> None:
    """Each sentence's beam search as drawn, at another index of a larger batch of other sentences of other lengths
    (so other maximum lengths and other stopping steps), and with hidden source padding: each hypothesis judged
    against the oracle's search (``checks/decoding.judge_hypotheses``: exact wherever that search decided it), so a
    sentence's hypothesis is the same in every arrangement wherever the oracle's search was not within the scores'
    error; the scores' ulps apart reported; tokens and score bit for bit in the batch where
    policies['batch_invariant'] is declared."""
    D.provided(case.impl, "search")
    rng = np.random.default_rng(seed)
    sentences = {"src": src, "src_lengths": src_lengths}
    example, arrangements = _arrangements(sentences, _DECODE.search_batch, size, index, hidden, rng, case.impl)

    def run(placed: batches.Placed, rows: list[int], where: str, scored: Any = None) -> tuple[dict, D.Searches]:
        a = placed.args
        natives, seen = prepare(case, src=a["src"], params=params, num_heads=num_heads, src_lengths=a["src_lengths"])
        ml = D.max_lengths_of(a["src"], a["src_lengths"], extra)
        out = D.searched(case, natives, num_heads, beam, alpha, ml, bos, eos)
        searches = D.Searches(case, seen, beam, alpha, ml, bos, eos, scored)
        return D.judge_hypotheses(case, out, searches, rows, where), searches

    n = src.shape[0]
    alone, searches = run(example, list(range(n)), "")
    for key, placed in arrangements:
        if placed is None:
            _note(NO_PADDING)
            continue
        calls = np.shape(placed.args["src"])[0]
        rows = list(range(calls))[placed.keep[0]] if key == "in a batch" else list(range(n))
        # the same sentences, the same rounded model: the oracle's searches of the example serve the batch's rows
        shared = {p: searches.of(j) for j, p in enumerate(rows)} if key == "in a batch" else None
        got, _ = run(placed, rows, f" ({placed.what})", shared)
        for j, p in enumerate(rows):
            (mine, score, _), (theirs, alone_score, _) = got[p], alone[j]
            if mine == theirs:
                case.apart(key, ulps_apart(np.array(score), np.array(alone_score), case.dtype))
            else:  # both judged against the oracle above: only a choice within the scores' error lets them differ
                _note(TIE_APART)
            bitwise = mine == theirs and np.float64(score).tobytes() == np.float64(alone_score).tobytes()
            if key == "in a batch" and declared(case).get("batch_invariant", False) and not bitwise:
                case.fail(
                    f"policies['batch_invariant'] is declared, but beam search returned {mine} (score {score!r}) for "
                    f"sentence {j} {placed.what}, and {theirs} (score {alone_score!r}) for it as drawn",
                    breaks_property=True,
                )
