"""The decoding oracle (reference/decoding.py): a cached step's oracle, GNMT's length penalty, and beam search.

Beam search is checked against an exhaustive search (a beam wide enough to keep every prefix prunes nothing, so its
best is the best sequence), the bound-based early stop against running to the maximum length (it must never change
the best), beam 1 with α = 0 against greedy decoding, and its decisions against the gaps they record.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.reference import decoding as D
from aiayn.reference.counts import TransformerConfig
from aiayn.reference.model import init_params, transformer_forward

EOS = 0


def _toy(seed: int, vocab: int, eos_bias: float = 0.0):
    """A next-token distribution that depends on the whole prefix (a seeded draw per prefix)."""

    def log_probs(prefixes):
        out = []
        for p in prefixes:
            rng = np.random.default_rng([seed, len(p), *p])
            z = rng.normal(size=vocab) * 2.0
            z[EOS] += eos_bias
            out.append(z - np.log(np.sum(np.exp(z - z.max()))) - z.max())
        return np.array(out)

    return log_probs


def _exhaustive(log_probs, vocab: int, limit: int, alpha: float, at_max_length: str):
    """The best score over every output: each sequence ending in EOS at length <= limit, or (``finished``) each of
    length limit without EOS."""
    best = None
    for n in range(1, limit + 1):
        for body in itertools.product([v for v in range(vocab) if v != EOS], repeat=n - 1):
            for last in [EOS] + ([v for v in range(vocab) if v != EOS] if n == limit else []):
                seq = (*body, last)
                if last != EOS and at_max_length != "finished":
                    continue
                logp = sum(float(log_probs([seq[:i]])[0, seq[i]]) for i in range(n))
                score = logp / D.length_penalty(n, alpha)
                if best is None or score > best[0] + 1e-12:
                    best = (score, seq)
    return best


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), alpha=st.sampled_from([0.0, 0.6, 1.0]), eos_bias=st.sampled_from([-1.0, 0.0, 1.5]))
def test_a_beam_that_prunes_nothing_finds_the_best_sequence(seed: int, alpha: float, eos_bias: float) -> None:
    vocab, limit = 3, 4
    fn = _toy(seed, vocab, eos_bias)
    score, seq = _exhaustive(fn, vocab, limit, alpha, "finished")
    for eos_rank in D.EOS_RANKS:  # a beam of vocab^limit: every candidate ranks within k
        result = D.beam_search(
            fn,
            eos=EOS,
            max_length=limit,
            beam=vocab**limit,
            alpha=alpha,
            eos_rank=eos_rank,
            early_stop="none",
            at_max_length="finished",
        )
        assert result.best.tokens == seq, (eos_rank, result.best, seq)
        assert math.isclose(result.best.score, score, rel_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    beam=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.6, 2.0]),
    eos_rank=st.sampled_from(D.EOS_RANKS),
    at_max_length=st.sampled_from(D.AT_MAX_LENGTH),
)
def test_the_bound_never_changes_the_best(
    seed: int, beam: int, alpha: float, eos_rank: str, at_max_length: str
) -> None:
    """tensor2tensor's early stop is exact: stopping when the k-th best finished score beats every alive hypothesis's
    best possible score returns what running to the maximum length returns."""
    fn = _toy(seed, 5, eos_bias=0.5)
    kw = dict(eos=EOS, max_length=7, beam=beam, alpha=alpha, eos_rank=eos_rank, at_max_length=at_max_length)
    stopped, full = D.beam_search(fn, early_stop="bound", **kw), D.beam_search(fn, early_stop="none", **kw)
    assert stopped.best.tokens == full.best.tokens and stopped.best.score == full.best.score


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    beam=st.integers(1, 3),
    early_stop=st.sampled_from(["full", D.FIRST]),
    at_max_length=st.sampled_from(D.AT_MAX_LENGTH),
)
def test_an_early_stop_held_off_to_a_later_step(seed: int, beam: int, early_stop: str, at_max_length: str) -> None:
    """``stop_after`` (the early stop held off until the batch's last sentence stops) at or before the step the
    search stops at changes nothing; at the maximum length it is the search without an early stop; in between, a
    monotone rule stops exactly there."""
    fn = _toy(seed, 5, eos_bias=0.5)
    kw = dict(eos=EOS, max_length=7, beam=beam, at_max_length=at_max_length)
    own = D.beam_search(fn, early_stop=early_stop, **kw)
    for s in range(own.steps + 1):
        assert D.beam_search(fn, early_stop=early_stop, stop_after=s, **kw).finished == own.finished
    late = D.beam_search(fn, early_stop=early_stop, stop_after=7, **kw)
    never = D.beam_search(fn, early_stop="none", **kw)
    assert late.finished == never.finished and late.steps == never.steps
    for s in range(own.steps + 1, 7):
        held = D.beam_search(fn, early_stop=early_stop, stop_after=s, **kw)
        assert held.steps == s or (held.steps < s and held.steps == never.steps), (s, held.steps, never.steps)


def test_beam_one_without_penalty_is_greedy() -> None:
    for seed in range(20):
        fn = _toy(seed, 6, eos_bias=0.3)
        seq: tuple[int, ...] = ()
        while len(seq) < 9 and (not seq or seq[-1] != EOS):
            seq = (*seq, int(np.argmax(fn([seq])[0])))
        result = D.beam_search(fn, eos=EOS, max_length=9, beam=1, alpha=0.0, eos_rank="k", at_max_length="finished")
        assert result.best.tokens == seq


def test_a_tie_is_undecided_and_a_clear_choice_is_decided() -> None:
    def tied(prefixes):  # tokens 1 and 2 equally likely at every step; EOS likely at step 2
        rows = []
        for p in prefixes:
            z = np.array([5.0 if len(p) == 1 else -5.0, 1.0, 1.0, -3.0])
            rows.append(z - np.log(np.sum(np.exp(z))))
        return np.array(rows)

    result = D.beam_search(tied, eos=EOS, max_length=4, beam=1)
    assert result.best.tokens == (1, EOS)  # ties: the lower token id
    assert result.undecided(lambda s: 1e-9 * s), "an exact tie must be undecided under any error"
    clear = D.beam_search(_toy(3, 4, eos_bias=3.0), eos=EOS, max_length=4, beam=2)
    gaps = [d.gap for d in clear.decisions]
    small = min(gaps) / 4  # an error well inside every gap decides every choice
    assert not clear.undecided(lambda s: small * s / max(1, clear.steps))


def test_the_length_penalty_is_gnmt_and_the_exact_tier_is_correctly_rounded() -> None:
    assert D.length_penalty(1, 0.6) == 1.0  # (5 + 1) / 6 = 1
    for n, alpha in [(1, 0.6), (4, 0.6), (7, 1.0), (50, 0.6), (3, 0.0), (19, 2.0)]:
        with mpmath.workdps(60):
            want = float(mpmath.power(mpmath.mpf(5 + n) / 6, mpmath.mpf(alpha)))
        assert D.length_penalty_exact(n, alpha) == want
        assert abs(D.length_penalty(n, alpha) - want) <= 2 * np.spacing(want)
    assert D.length_penalty_exact(7, 1.0) == float(Fraction(12, 6))
    with mpmath.workdps(60):
        want = float(mpmath.mpf(-3) / mpmath.power(mpmath.mpf(9) / 6, mpmath.mpf(0.6)))
    assert D.penalised_score_exact(-3.0, 4, 0.6) == want
    assert abs(D.penalised_score(-3.0, 4, 0.6) - want) <= 2 * np.spacing(abs(want))
    assert D.max_output_length(12) == 62


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: D.length_penalty(0, 0.6), "length"),
        (lambda: D.length_penalty(3, -0.1), "alpha: expected a length-penalty exponent >= 0"),
        (lambda: D.beam_search(_toy(0, 3), eos=0, max_length=3, eos_rank="3k"), "eos_rank"),
        (lambda: D.beam_search(_toy(0, 3), eos=0, max_length=3, early_stop="soon"), "early_stop"),
        (lambda: D.beam_search(_toy(0, 3), eos=5, max_length=3), "eos: expected an id below the vocabulary size 3"),
        (lambda: D.beam_search(_toy(0, 3), eos=0, max_length=0), "max_length"),
    ],
)
def test_bad_arguments_are_named(call, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def _model(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = init_params(TransformerConfig(n_layers=1, d_model=8, d_ff=16, num_heads=2), 11, rng)
    src = rng.integers(1, 11, size=5)
    return params, src


def test_a_step_is_the_full_forward_restricted_to_its_prefix() -> None:
    params, src = _model()
    prefix = np.array([[1, 4, 2, 7, 3]])
    full = transformer_forward(src[None], prefix, params, 2)
    np.testing.assert_array_equal(D.step_logits(src[None], prefix, params, 2, 3), full[:, 3:])
    # position t does not see tokens after t: a prefix of the prefix gives the same logits there
    short = transformer_forward(src[None], prefix[:, :4], params, 2)
    np.testing.assert_allclose(short[:, 3], full[:, 3], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="start: expected a cache length below the prefix length 5"):
        D.step_logits(src[None], prefix, params, 2, 5)


def test_the_model_log_probs_sum_to_the_teacher_forced_sequence_log_prob() -> None:
    params, src = _model(1)
    fn = D.model_log_probs(src, params, 2, bos=1)
    result = D.beam_search(fn, eos=EOS, max_length=6, beam=3)
    per_token = D.sequence_log_probs(src, result.best.tokens, params, 2, bos=1)
    assert math.isclose(float(np.sum(per_token)), result.best.log_prob, rel_tol=0, abs_tol=1e-12)
    rows = fn([(), ()])
    np.testing.assert_allclose(np.exp(rows).sum(axis=1), 1.0, rtol=0, atol=1e-14)


def test_the_translation_reproductions_beam_search_is_the_oracles_under_its_policies() -> None:
    """reproductions/translation/decode.py (its cached decoder, in float64) returns the oracle's best hypothesis with
    the policies it declares (an EOS finishes among the best k; hypotheses alive at the maximum length finish as they
    stand; its early stop compares the best finished score with the bound, which returns what the k-th best does)."""
    import torch

    from aiayn.reproductions.translation.data import BOS
    from aiayn.reproductions.translation.data import EOS as T_EOS
    from aiayn.reproductions.translation.decode import beam_search as translation_beam_search
    from aiayn.reproductions.translation.model import Transformer

    torch.manual_seed(0)
    config = TransformerConfig(n_layers=2, d_model=16, d_ff=32, num_heads=2, p_drop=0.0, train_steps=10)
    model = Transformer(config, 24, max_positions=64).double().eval()
    with torch.no_grad():  # EOS less likely than at random, so that outputs have several tokens
        model.embedding[T_EOS] *= 0.5
    params = {
        k: (v.detach().numpy() if hasattr(v, "detach") else v)
        for k, v in model.canonical_params().items()
        if k in ("embedding", "positional")
    }
    params["encoder"] = [
        {n: {p: t.detach().numpy() for p, t in sub.items()} for n, sub in layer.items()}
        for layer in model.canonical_params()["encoder"]
    ]
    params["decoder"] = [
        {n: {p: t.detach().numpy() for p, t in sub.items()} for n, sub in layer.items()}
        for layer in model.canonical_params()["decoder"]
    ]
    src = torch.randint(4, 24, (6, 5))
    src[:, -1] = T_EOS
    lengths = torch.tensor([5, 4, 3, 5, 5, 4])
    src[1, 3], src[1, 4], src[2, 2], src[2, 3:], src[5, 3], src[5, 4] = T_EOS, 0, T_EOS, 0, T_EOS, 0
    extra = 6
    got = translation_beam_search(model, src, lengths, beam=3, alpha=0.6, extra=extra, scores=True)
    checked = 0
    for i, (tokens, score, _) in enumerate(got):
        n = int(lengths[i])
        fn = D.model_log_probs(src[i, :n].numpy(), params, 2, bos=BOS)
        want = D.beam_search(
            fn, eos=T_EOS, max_length=n - 1 + extra, beam=3, alpha=0.6, eos_rank="k", at_max_length="finished"
        )
        # decode.py takes the log-softmax in float32 (`.float()`): a step's log-probability is off by at most
        # u (|z - max z| + |log p| + log V + 4) <= 2^-24 (2 * 20 + 4 + 4) < 3e-6 here (|log p| <= 20, V = 24),
        # and a sum of s steps by s times that plus the float32 sum's own s u |log P|

        def err(steps: int) -> float:
            return steps * 3e-6 * 2

        if want.undecided(err):  # a choice within those errors: either is right
            continue
        checked += 1
        out = want.best.tokens[:-1] if want.best.ended else want.best.tokens
        assert list(out) == tokens, (i, want.best, tokens)
        assert abs(score - want.best.score) <= err(want.best.step), (score, want.best)
    assert checked >= 4 and sum(len(t) > 1 for t, _, _ in got) >= 3


def test_the_oracles_choices_are_the_contracts() -> None:
    from aiayn.implementations.decoding import BEAM_POLICY_CHOICES, DEFAULT_BEAM_POLICIES

    assert dict(BEAM_POLICY_CHOICES) == {
        "eos_rank": D.EOS_RANKS,
        "early_stop": D.EARLY_STOPS,
        "at_max_length": D.AT_MAX_LENGTH,
        "length_counts": D.LENGTH_COUNTS,
    }
    defaults = {p.name: p.default for p in __import__("inspect").signature(D.beam_search).parameters.values()}
    assert all(defaults[k] == v for k, v in DEFAULT_BEAM_POLICIES.items())
