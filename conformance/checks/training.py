"""Checks for §5.3 (the learning-rate schedule, Eq. (3), and Adam's step), §5.4 (label smoothing, the smoothed
cross-entropy, residual dropout) and §6.1 (checkpoint averaging)."""

from __future__ import annotations

import numpy as np

from aiayn.conformance.budgets.draws import ALPHA, binomial_region
from aiayn.conformance.checks._common import (
    agreement,
    agreement_check,
    declared,
    gradient_check,
    implementation_result,
    policy,
)
from aiayn.conformance.equations import lrate_value, record, smoothing
from aiayn.conformance.numerics import gamma
from aiayn.conformance.run.comparison import compare
from aiayn.conformance.run.harness import Case, check, current_stats

U64 = 2.0**-53

# --------------------------------------------------------------------------------------------
# the learning rate, §5.3, Eq. (3)


lrate = agreement_check("lrate")


@check(
    "lrate",
    kind="property",
    violates="lrate rises linearly for warmup_steps, then decays as step^-0.5 (Eq. (3))",
)
def lrate_rises_linearly_to_its_peak_then_decays_as_inverse_sqrt(
    case: Case, rise: list[int], decay: list[int], d_model: int, warmup_steps: int
) -> None:
    """The schedule rises linearly to its peak at warmup_steps, then decays as step^-0.5 (§5.3).

    With w = warmup_steps: lrate(s) = (s / w) lrate(w) for 1 <= s <= w, and
    lrate(s) = sqrt(w / s) lrate(w) for s >= w; lrate(w) is the maximum. Bounds: each value within
    its budget B(s), lrate(w) within B(w) scaled by the same factor, and our own float64
    arithmetic (3 roundings: 3 * 2^-53 relative).
    """
    w = warmup_steps
    (peak,), _, (b_peak,) = agreement(case, steps=[w], d_model=d_model, warmup_steps=w)
    got, _, b = agreement(case, steps=rise, d_model=d_model, warmup_steps=w)
    factor = np.array(rise, dtype=np.float64) / w
    compare(
        case,
        got,
        factor * peak,
        b + factor * b_peak + 3 * U64 * np.abs(got),
        what=f"lrate is not linear in the step below warmup_steps={w}",
        expected_name="(step / warmup) lrate(warmup)",
    )
    got, _, b = agreement(case, steps=decay, d_model=d_model, warmup_steps=w)
    factor = np.sqrt(w / np.array(decay, dtype=np.float64))
    compare(
        case,
        got,
        factor * peak,
        b + factor * b_peak + 3 * U64 * np.abs(got),
        what=f"lrate does not decay as step^-0.5 after warmup_steps={w}",
        expected_name="sqrt(warmup / step) lrate(warmup)",
    )
    got, _, b = agreement(case, steps=rise + decay, d_model=d_model, warmup_steps=w)
    compare(
        case,
        got,
        np.minimum(got, peak),
        b + b_peak,
        what=f"lrate exceeds its value at warmup_steps={w} (the peak)",
        expected_name="the peak lrate(warmup)",
    )


@check(
    "lrate",
    kind="property",
    violates="step 0 follows the declared step_zero policy; a negative step is refused (the contract)",
)
def lrate_at_step_zero_follows_the_declared_policy(case: Case, d_model: int, warmup_steps: int) -> None:
    """Step 0 follows the declared policy ("zero": exactly 0.0; "raise": refused; "one": exactly lrate(1)); a
    negative step is refused. A refusal is any exception (ValueError is the contract's; another type is named in the
    report)."""
    declared = policy(case, "step_zero")
    if declared == "zero":
        value = lrate_value(case, 0, d_model, warmup_steps)
        case.exact_checks()
        if value != 0.0:
            case.fail(
                f"lrate(0, ...) = {value!r}; declared step_zero='zero' means exactly 0.0 (min(inf, 0) = 0)",
                breaks_property=True,
            )
    elif declared == "one":
        value, one = lrate_value(case, 0, d_model, warmup_steps), lrate_value(case, 1, d_model, warmup_steps)
        case.exact_checks()
        if value != one:
            case.fail(
                f"lrate(0, ...) = {value!r} but lrate(1, ...) = {one!r}; "
                "declared step_zero='one' means step 0 is computed as step 1",
                breaks_property=True,
            )
    else:
        _expect_refusal(case, 0, d_model, warmup_steps, "declared step_zero='raise'")
    _expect_refusal(case, -1, d_model, warmup_steps, "the contract: a negative step is refused")


def _expect_refusal(case: Case, step: int, d_model: int, warmup_steps: int, why: str) -> None:
    """``lrate(step, ...)`` refuses: it raises an exception (any type; one other than ValueError is noted)."""
    try:
        value = case.impl.lrate(step, d_model, warmup_steps)
    except ValueError:
        case.exact_checks()
        return
    except Exception as exc:  # a refusal all the same (Python's own 0 ** -0.5 raises ZeroDivisionError)
        case.exact_checks()
        stats = current_stats().get()
        if stats is not None:
            stats.notes.add(f"lrate({'0' if step == 0 else 'a negative step'}) refused by {type(exc).__name__}")
        return
    case.fail(f"lrate({step}, ...) returned {value!r}; expected a refusal, an exception ({why})", breaks_property=True)


# --------------------------------------------------------------------------------------------
# Adam, §5.3 (Kingma & Ba 2015, Algorithm 1)


adam_step = agreement_check("adam_step")


# --------------------------------------------------------------------------------------------
# label smoothing, §5.4


label_smoothing = agreement_check("label_smoothing")


@check(
    "label_smoothing",
    kind="property",
    violates="each smoothed target distribution sums to 1 (§5.4)",
)
def smoothed_targets_sum_to_one(case: Case, targets: np.ndarray, vocab_size: int, eps: float) -> None:
    """Each smoothed target distribution sums to 1 (0 for a padding row under "K-2"):
    |sum_c q_hat_c - 1| <= sum_c B_c + gamma_K(2^-53) sum_c q_hat_c."""
    got, _, budget = agreement(case, targets=targets, vocab_size=vocab_size, eps=eps)
    bound = np.sum(budget, axis=-1) + float(gamma(vocab_size, U64)) * np.sum(np.abs(got), axis=-1)
    pad = smoothing(declared(case))["padding_id"]
    required = np.ones(got.shape[:-1]) if pad is None else np.where(np.asarray(targets) == pad, 0.0, 1.0)
    compare(
        case,
        np.sum(got, axis=-1),
        required,
        bound,
        what="smoothed targets do not sum to 1",
        expected_name="the required sum",
    )


smoothed_cross_entropy = agreement_check("smoothed_cross_entropy")
smoothed_cross_entropy_gradients = gradient_check("smoothed_cross_entropy")


@check(
    "smoothed_cross_entropy",
    kind="property",
    violates="the smoothed cross-entropy is smallest where softmax(logits) is the target distribution (§5.4)",
)
def smoothed_cross_entropy_is_minimised_at_the_target_with_value_its_entropy(
    case: Case, targets: np.ndarray, vocab_size: int, eps: float, shift: float, delta: np.ndarray
) -> None:
    """The loss is smallest when softmax(logits) is the smoothed target q, and its value there is H(q).

    At logits = log q + c (rounded to the dtype), the exact loss is H(q) + KL(q || softmax(logits)),
    KL >= 0 being only the rounding of the logits (the oracle computes it); so
    |L_hat - H| <= budget + KL. At any other logits (log q + c + delta) the exact loss is >= H, so
    L_hat >= H - budget.
    """
    from aiayn.reference.training import label_smoothing, smoothed_target_entropy

    variant = policy(case, "label_smoothing")
    if (
        variant == "K-2"
    ):  # the padding class carries no mass: log q = -inf there, and no finite logits reach the minimum
        case.tally(
            unchecked={
                "the minimum property needs every class to carry smoothing mass; 'K-2' gives the padding class none": 2
            }
        )
        return
    q = label_smoothing(targets, vocab_size, eps, variant=variant)
    entropy = float(smoothed_target_entropy(vocab_size, eps, variant=variant))
    at_target = np.log(q) + shift
    got, expected, budget = agreement(case, logits=at_target, targets=targets, eps=eps)
    kl = np.maximum(expected - entropy, 0.0)
    compare(
        case,
        got,
        np.full(got.shape, entropy),
        budget + kl,
        what=f"the loss at the smoothed target is not its entropy H(q) = {entropy!r}",
        expected_name="H(q)",
    )
    got2, _, budget2 = agreement(case, logits=at_target + delta, targets=targets, eps=eps)
    compare(
        case,
        got2,
        np.maximum(got2, entropy),
        budget2,
        what=f"the loss went below its minimum H(q) = {entropy!r} away from the target",
        expected_name="the minimum H(q)",
    )


# --------------------------------------------------------------------------------------------
# residual dropout, §5.4


dropout = agreement_check("dropout")


def _kept(case: Case, x: np.ndarray, p: float, seed: int) -> np.ndarray:
    """The mask the implementation drew for ``x`` of ones, read from y (0 exactly where dropped), y agreeing with the
    oracle given the mask the call returned."""
    got, expected, budget = agreement(case, x=x, p=p, seed=seed)
    compare(case, got, expected, budget, budget_name=record("dropout").budget_name)
    return got != 0


def _count_within(case: Case, count: int, n: int, q: float, what: str) -> None:
    """``count`` of ``n`` is among the counts of Binomial(n, q) accepted at the false-alarm rate ALPHA
    (``budgets/draws.py``), or the property fails."""
    lo, hi = binomial_region(n, q)
    case.tally(checked=1)
    if not lo <= count <= hi:
        case.fail(
            f"{what}: {count} of {n}, outside [{lo}, {hi}], the counts of Binomial({n}, {q:.6g}) accepted at "
            f"false-alarm rate {ALPHA:g} (expected about {n * q:.1f})",
            breaks_property=True,
        )


def _agreeing(p: float) -> float:
    """The probability that two independent draws of a mask agree at one element: both kept or both dropped."""
    return p * p + (1 - p) * (1 - p)


@check("dropout", kind="property", violates="dropout keeps each element with probability 1 - p (§5.4)")
def dropout_keeps_each_element_with_probability_one_minus_p(
    case: Case, x: np.ndarray, p: float, seed: int, other_seed: int
) -> None:
    """The number kept of n elements is Binomial(n, 1 - p): an exact two-sided test at false-alarm rate ALPHA. Its
    power against p = 0.11 where 0.1 is meant, and against p taken as the keep probability, is computed in
    ``tests/test_draws.py``."""
    kept = _kept(case, x, p, seed)
    _count_within(case, int(np.sum(kept)), kept.size, 1 - p, f"dropout(p={p!r}, seed={seed}) kept")


@check("dropout", kind="property", violates="dropout draws each element independently of the others (§5.4)")
def dropout_keeps_neighbours_independently(case: Case, x: np.ndarray, p: float, seed: int, other_seed: int) -> None:
    """Disjoint pairs of neighbours, along the last axis and along the first: with each element drawn independently,
    a pair agrees (both kept or both dropped) with probability p^2 + (1 - p)^2 and the pairs are independent, so the
    agreeing pairs are a binomial count. A mask shared along an axis (drawn once for every position, or for the
    whole batch) agrees in every pair along it."""
    kept = _kept(case, x, p, seed)
    for axis, pairs in (("last", kept[..., 0::2] == kept[..., 1::2]), ("first", kept[0::2] == kept[1::2])):
        _count_within(case, int(np.sum(pairs)), pairs.size, _agreeing(p), f"neighbours along the {axis} axis agreeing")


@check("dropout", kind="property", violates="dropout with different seeds draws independent masks (§5.4)")
def dropout_masks_of_different_seeds_are_independent(
    case: Case, x: np.ndarray, p: float, seed: int, other_seed: int
) -> None:
    """Two seeds' masks agree element by element with probability p^2 + (1 - p)^2 each: a binomial count (a seed
    ignored, or one generator restarted, agrees everywhere). The same seed's mask repeats bit for bit: the harness
    calls every method twice."""
    agree = _kept(case, x, p, seed) == _kept(case, x, p, other_seed)
    _count_within(
        case, int(np.sum(agree)), agree.size, _agreeing(p), f"the masks of seeds {seed} and {other_seed} agreeing"
    )


# the layers in training mode, §5.4: "dropout to the output of each sub-layer, before it is added to the sub-layer
# input and normalized"; and none at evaluation

encoder_layer_training = agreement_check("encoder_layer_training")
decoder_layer_training = agreement_check("decoder_layer_training")


def _layer_masks_keep(case: Case, p: float, seed: int, **args: object) -> None:
    """The masks a layer drew for all its sub-layers together: a binomial count of kept elements (as
    :func:`dropout_keeps_each_element_with_probability_one_minus_p`; the output given them is the agreement check's)."""
    _, seen = implementation_result(case, p=p, seed=seed, **args)
    keep = seen["keep"]
    kept = sum(int(np.sum(k)) for k in keep.values())
    total = sum(int(np.size(k)) for k in keep.values())
    names = ", ".join(keep) if len(keep) <= 4 else f"{len(keep)} places"
    _count_within(case, kept, total, 1 - p, f"{case.equation}(p={p!r}, seed={seed})'s masks ({names}) kept")


@check(
    "encoder_layer_training",
    kind="property",
    violates="dropout keeps each element with probability 1 - p (§5.4)",
)
def encoder_layer_training_keeps_each_element_with_probability_one_minus_p(
    case: Case, x: np.ndarray, params: dict, num_heads: int, p: float, seed: int, mask: np.ndarray | None
) -> None:
    """The masks of the self-attention's and the feed-forward's outputs keep Binomial(n, 1 - p) of their n elements."""
    _layer_masks_keep(case, p, seed, x=x, params=params, num_heads=num_heads, mask=mask)


@check(
    "decoder_layer_training",
    kind="property",
    violates="dropout keeps each element with probability 1 - p (§5.4)",
)
def decoder_layer_training_keeps_each_element_with_probability_one_minus_p(
    case: Case,
    y: np.ndarray,
    memory: np.ndarray,
    params: dict,
    num_heads: int,
    p: float,
    seed: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
) -> None:
    """The masks of the three sub-layers' outputs keep Binomial(n, 1 - p) of their n elements."""
    _layer_masks_keep(
        case,
        p,
        seed,
        y=y,
        memory=memory,
        params=params,
        num_heads=num_heads,
        self_mask=self_mask,
        memory_mask=memory_mask,
    )


transformer_forward_training = agreement_check("transformer_forward_training")


@check(
    "transformer_forward_training",
    kind="property",
    violates="dropout keeps each element with probability 1 - p (§5.4)",
)
def transformer_forward_training_keeps_each_element_with_probability_one_minus_p(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict,
    num_heads: int,
    p: float,
    seed: int,
    src_lengths: np.ndarray | None,
    tgt_lengths: np.ndarray | None,
) -> None:
    """The masks of every place §5.4 drops (the embeddings' sums, every sub-layer's output) keep Binomial(n, 1 - p) of
    their n elements together."""
    _layer_masks_keep(
        case,
        p,
        seed,
        src=src,
        tgt=tgt,
        params=params,
        num_heads=num_heads,
        src_lengths=src_lengths,
        tgt_lengths=tgt_lengths,
    )


#: What an evaluation-mode layer that drops breaks (the name a failure carries, and the mutant's).
NO_DROPOUT_AT_EVALUATION = "evaluation applies no dropout (§5.4 drops while training): copies of one input agree"


def _twice(a: np.ndarray | None) -> np.ndarray | None:
    """A batch of two copies of ``a`` along its first axis (None: no mask)."""
    return None if a is None else np.concatenate([a, a])


def _copies_agree(case: Case, got: np.ndarray, budget: np.ndarray) -> None:
    """The two halves of a batch of copies agree within the sum of their budgets (each is within its own of the
    oracle's one value); a dropped element moves a sub-layer's output by all of it, far outside."""
    half = got.shape[0] // 2
    compare(
        case,
        got[half:],
        got[:half],
        budget[half:] + budget[:half],
        what="two copies of one input in a batch differ in evaluation mode",
        expected_name="the first copy's output",
    )


@check("encoder_layer", kind="property", violates=NO_DROPOUT_AT_EVALUATION)
def encoder_layer_applies_no_dropout_at_evaluation(
    case: Case, x: np.ndarray, params: dict, num_heads: int, mask: np.ndarray | None
) -> None:
    """The evaluation layer run on a batch of two copies of x: any mask it drew differs between the copies (or it
    draws none): dropout left on at evaluation, with a fixed seed or not, makes them differ."""
    got, _, budget = agreement(case, x=_twice(x), params=params, num_heads=num_heads, mask=_twice(mask))
    _copies_agree(case, got, budget)


@check("decoder_layer", kind="property", violates=NO_DROPOUT_AT_EVALUATION)
def decoder_layer_applies_no_dropout_at_evaluation(
    case: Case,
    y: np.ndarray,
    memory: np.ndarray,
    params: dict,
    num_heads: int,
    self_mask: np.ndarray | None,
    memory_mask: np.ndarray | None,
) -> None:
    """As :func:`encoder_layer_applies_no_dropout_at_evaluation`, for the decoder layer (a mask given per sentence,
    (B, n, n), is copied with it; a shared one, (n, n), serves both)."""

    def batched(m: np.ndarray | None) -> np.ndarray | None:
        return _twice(m) if m is not None and np.ndim(m) == 3 and np.shape(m)[0] == np.shape(y)[0] else m

    got, _, budget = agreement(
        case,
        y=_twice(y),
        memory=_twice(memory),
        params=params,
        num_heads=num_heads,
        self_mask=batched(self_mask),
        memory_mask=batched(memory_mask),
    )
    _copies_agree(case, got, budget)


# --------------------------------------------------------------------------------------------
# checkpoint averaging, §6.1
# --------------------------------------------------------------------------------------------
# checkpoint averaging, §6.1


average_checkpoints = agreement_check("average_checkpoints")
