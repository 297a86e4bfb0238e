"""Decoding, §3.2.3 and §6.1: the decoder one step at a time, and beam search with a length penalty.

Paper: §3.2.3 ("masking ... ensures that the predictions for position i can depend only on the known outputs at
positions less than i"); §6.1 ("We used beam search with a beam size of 4 and length penalty α = 0.6 [38] ... We set
the maximum output length during inference to input length + 50, but terminate early when possible"). [38] is Wu et
al. 2016 (GNMT), whose Eq. (14) is lp(Y) = ((5 + |Y|) / 6)^α; a finished hypothesis scores log P(Y | X) / lp(Y).

**Incremental decoding is the full forward restricted to a prefix.** The decoder's self-attention is causal, so the
logits at target position t depend on target tokens 0..t only: a decoder that caches the keys and values of s earlier
positions and is fed tokens s..t-1 must give ``transformer_forward(src, prefix[:t])[:, s:t]``, at the same absolute
positions (:func:`step_logits`). A cache changes the shapes of the products (one query row against s + k keys), so the
two agree within the forward budget, not bit for bit.

**Beam search** (:func:`beam_search`) over any next-token log-probability function; :func:`model_log_probs` gives the
model's (the last position of :func:`~aiayn.reference.model.transformer_forward`, log-softmax in longdouble). Every
comparison the search makes is recorded with its gap (:class:`Decision`), so a checker can tell a search that an
implementation must reproduce exactly from one where its own rounding may legitimately choose otherwise: a flip is
possible only where a gap is within the error the compared scores may carry (:meth:`BeamResult.undecided`).

Policies (the paper is silent; each a parameter; defaults are tensor2tensor's, the code the paper's authors
released, ``tensor2tensor/utils/beam_search.py``; what fairseq, Hugging Face and OpenNMT-py do is in
:data:`TOOLKITS`):

- ``eos_rank``: a candidate ending in EOS becomes a finished hypothesis when it ranks among the best ``"2k"``
  candidates of the step (tensor2tensor) or only among the best ``"k"`` (fairseq, Hugging Face).
- ``early_stop``: ``"bound"`` stops when the lowest of the k best finished scores exceeds the best alive log-probability
  divided by lp(maximum length) (tensor2tensor; Hugging Face ``early_stopping="never"``): log-probabilities only fall as
  tokens are added and lp only grows, so no alive hypothesis can still win; ``"full"`` stops once k hypotheses are
  finished (fairseq; Hugging Face ``early_stopping=True``), which may miss a better one; ``"none"`` runs to the maximum
  length.
- ``at_max_length``: the hypotheses still alive at the maximum length are ``"dropped"`` when any hypothesis finished
  (tensor2tensor; when none did, they are returned with their log-probabilities as scores), or ``"finished"`` as they
  stand, without EOS (Hugging Face, OpenNMT-py).
- ``length_counts``: |Y| counts the generated tokens with the final EOS (``"eos"``: tensor2tensor, fairseq, Hugging
  Face) or also the start symbol (``"bos_eos"``: OpenNMT-py, one more).
- Ties (exactly equal scores): the lower flat index ``beam * vocab + token`` first, as ``tf.nn.top_k`` documents.
  ``torch.topk`` leaves the order of ties unspecified, which is one reason the comparison is tie-aware.

Whether the penalty divides the alive hypotheses' scores at every step or only the finished ones' changes no choice:
at a step every alive candidate has the same length, so one divisor ranks them as their log-probabilities do.
The beam keeps k alive hypotheses: a finished one leaves it (tensor2tensor, fairseq, Hugging Face: the best k
candidates that do not end in EOS stay alive).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from aiayn.reference._checks import choice, positive_int
from aiayn.reference._exact import DEFAULT_DPS, check_dps, round_to_float64
from aiayn.reference.layers import LD
from aiayn.reference.model import DEFAULT_EPS, transformer_forward

#: What four toolkits do where §6.1 is silent, read in their sources (file and function named).
TOOLKITS = {
    "tensor2tensor": {
        "source": "tensor2tensor/utils/beam_search.py: beam_search, grow_topk, grow_alive, grow_finished, _is_finished",
        "length_penalty": "((5 + |Y|) / 6)^α (GNMT), α = 0.6 in decode_hparams",
        "eos_rank": "2k",
        "early_stop": "bound",
        "at_max_length": "dropped",
        "length_counts": "eos",
        "max_length": "padded input length + extra_length (50)",
    },
    "fairseq": {
        "source": "fairseq/sequence_generator.py: SequenceGenerator._generate, finalize_hypos; fairseq/search.py",
        "length_penalty": "|Y|^lenpen (not GNMT), lenpen 1 by default",
        "eos_rank": "k",
        "early_stop": "full",
        "at_max_length": "EOS forced at the last step",
        "length_counts": "eos",
        "max_length": "max_len_a * source length + max_len_b (0 and 200 by default)",
    },
    "huggingface": {
        "source": "transformers/generation/beam_search.py: BeamSearchScorer.process, BeamHypotheses.add, is_done",
        "length_penalty": "|Y|^length_penalty (not GNMT), 1.0 by default",
        "eos_rank": "k",
        "early_stop": "early_stopping=True: full; 'never': bound; False (default): a bound at the current length",
        "at_max_length": "finished",
        "length_counts": "eos",
        "max_length": "max_length or max_new_tokens (no source-relative option)",
    },
    "opennmt-py": {
        "source": "onmt/translate/beam_search.py: BeamSearchBase.advance, update_finished; onmt/translate/penalties.py",
        "length_penalty": "-length_penalty wu: GNMT; avg: |Y|; none",
        "eos_rank": "k (only k candidates per step)",
        "early_stop": "when the top-ranked candidate has ended and n_best hypotheses exist",
        "at_max_length": "finished",
        "length_counts": "bos_eos",
        "max_length": "fixed -max_length",
    },
}

EOS_RANKS = ("2k", "k")
EARLY_STOPS = ("bound", "full", "none")
#: A stopping rule no toolkit declares but a known bug: the search ends at the first finished hypothesis (what the
#: suite's diagnoses compute to name it; ``conformance/diagnoses/decoding.py``).
FIRST = "first"
#: Another: the bound of ``"bound"`` taken at the current length, best alive log P / lp(t) rather than / lp(maximum
#: length) (Hugging Face's ``early_stopping=False``); it stops earlier and may lose a longer hypothesis that would win.
BOUND_NOW = "bound_now"
AT_MAX_LENGTH = ("dropped", "finished")
LENGTH_COUNTS = ("eos", "bos_eos")
DEFAULT_ALPHA = 0.6  # §6.1
DEFAULT_EXTRA = 50  # §6.1: maximum output length = input length + 50


def length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α, GNMT Eq. (14) (Wu et al. 2016), the penalty §6.1 cites [38]; fast tier (float64)."""
    n = positive_int("length", length)
    return float(((LD(5) + LD(n)) / LD(6)) ** LD(_alpha(alpha)))


def length_penalty_exact(length: int, alpha: float, *, dps: int = DEFAULT_DPS) -> float:
    """lp(Y) as :func:`length_penalty`; exact tier (correctly rounded)."""
    n, a = positive_int("length", length), _alpha(alpha)
    with mpmath.workdps(check_dps(dps) + 10):
        return round_to_float64(mpmath.power((5 + mpmath.mpf(n)) / 6, mpmath.mpf(a)))


def penalised_score(log_prob: float, length: int, alpha: float) -> float:
    """log P(Y | X) / lp(Y), the score of a finished hypothesis (§6.1, GNMT Eq. (14)); fast tier."""
    return float(
        LD(_finite("log_prob", log_prob)) / ((LD(5) + LD(positive_int("length", length))) / LD(6)) ** LD(_alpha(alpha))
    )


def penalised_score_exact(log_prob: float, length: int, alpha: float, *, dps: int = DEFAULT_DPS) -> float:
    """log P(Y | X) / lp(Y) with ``log_prob`` as given (a float64), computed exactly and rounded once."""
    lp, n, a = _finite("log_prob", log_prob), positive_int("length", length), _alpha(alpha)
    with mpmath.workdps(check_dps(dps) + 10):
        return round_to_float64(mpmath.mpf(lp) / mpmath.power((5 + mpmath.mpf(n)) / 6, mpmath.mpf(a)))


def max_output_length(input_length: int, extra: int = DEFAULT_EXTRA) -> int:
    """§6.1's maximum output length, input length + 50 (``extra``); tokens generated, EOS included."""
    return positive_int("input_length", input_length, minimum=0) + positive_int("extra", extra)


def _alpha(alpha: Any) -> float:
    a = _finite("alpha", alpha)
    if a < 0:
        raise ValueError(f"alpha: expected a length-penalty exponent >= 0, got {a}")
    return a


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    v = float(value)
    if not np.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v}")
    return v


# --------------------------------------------------------------------------------------------
# the model's next-token distribution, and a cached step's oracle


def _tokens(name: str, x: Any, vocab: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        raise ValueError(f"{name}: expected ids in [0, {vocab}), got values in [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64)


def step_logits(
    src_tokens: Any,
    prefix: Any,
    params: Any,
    num_heads: int,
    start: int,
    *,
    src_lengths: Any = None,
    eps: float = DEFAULT_EPS,
) -> np.ndarray:
    """What a cached decoder must return when fed ``prefix[:, start:]`` after a cache of ``start`` positions (§3.2.3).

    The full forward pass over the whole prefix, kept at positions ``start`` .. n-1: causal masking makes position t
    independent of later tokens, so the prefix is all a step may see. Fast tier.

    Shapes: src_tokens (B, n_src), prefix (B, n) -> logits (B, n - start, vocab) float64.
    """
    n = np.asarray(prefix).shape[-1]
    s = positive_int("start", start, minimum=0)
    if s >= n:
        raise ValueError(f"start: expected a cache length below the prefix length {n}, got {s}")
    logits = transformer_forward(src_tokens, prefix, params, num_heads, src_lengths=src_lengths, eps=eps)
    return logits[:, s:]


def _log_softmax_ld(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis in longdouble (max subtracted, then log of the sum of exponentials)."""
    z = np.asarray(z, dtype=LD)
    m = np.max(z, axis=-1, keepdims=True)
    return (z - m) - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def model_log_probs(
    src_tokens: Any, params: Any, num_heads: int, *, bos: int, src_length: int | None = None, eps: float = DEFAULT_EPS
) -> Callable[[Sequence[Sequence[int]]], np.ndarray]:
    """The model's next-token log-probabilities for one source sentence, as a function of target prefixes.

    ``src_tokens`` (n_src,) ids; the returned function maps prefixes (each a sequence of generated ids, without
    ``bos``, all of one length) to log P(next | prefix, source), (len(prefixes), vocab) float64: the last position
    of :func:`transformer_forward` on ``[bos] + prefix``, log-softmax in longdouble. ``src_length`` masks the padded
    source positions (None: all real).
    """
    vocab = np.asarray(params["embedding"]).shape[0]
    src = _tokens("src_tokens", src_tokens, vocab)
    if src.ndim != 1:
        raise ValueError(f"src_tokens: expected one sentence, shape (n_src,), got {src.shape}")
    b = positive_int("bos", bos, minimum=0)
    if b >= vocab:
        raise ValueError(f"bos: expected an id below the vocabulary size {vocab}, got {b}")

    def log_probs(prefixes: Sequence[Sequence[int]]) -> np.ndarray:
        lengths = {len(p) for p in prefixes}
        if len(lengths) != 1:
            raise ValueError(f"prefixes: expected one length, got lengths {sorted(lengths)}")
        tgt = np.array([[b, *p] for p in prefixes], dtype=np.int64)  # (n, t + 1)
        n = tgt.shape[0]
        lengths_src = None if src_length is None else np.full(n, src_length)
        logits = transformer_forward(
            np.repeat(src[None], n, 0), tgt, params, num_heads, src_lengths=lengths_src, eps=eps
        )  # (n, t + 1, vocab)
        return _log_softmax_ld(logits[:, -1]).astype(np.float64)

    return log_probs


def sequence_log_probs(
    src_tokens: Any,
    tokens: Sequence[int],
    params: Any,
    num_heads: int,
    *,
    bos: int,
    src_length: int | None = None,
    eps: float = DEFAULT_EPS,
) -> np.ndarray:
    """log P(y_t | y_<t, source) of each token of ``tokens`` under teacher forcing (one forward pass); fast tier.

    Their sum is the log-probability a beam search accumulates for the hypothesis ``tokens`` (EOS included when it
    finished). Shapes: src_tokens (n_src,), tokens (T,) -> (T,) float64.
    """
    vocab = np.asarray(params["embedding"]).shape[0]
    ys = _tokens("tokens", np.asarray(list(tokens), dtype=np.int64), vocab)
    if ys.size == 0:
        return np.zeros(0)
    src = _tokens("src_tokens", src_tokens, vocab)
    tgt = np.concatenate(([bos], ys[:-1]))[None]  # (1, T), shifted right
    lengths = None if src_length is None else np.array([src_length])
    logits = transformer_forward(src[None], tgt, params, num_heads, src_lengths=lengths, eps=eps)[0]  # (T, vocab)
    lp = _log_softmax_ld(logits)
    return lp[np.arange(ys.size), ys].astype(np.float64)


# --------------------------------------------------------------------------------------------
# beam search


@dataclass(frozen=True)
class Hypothesis:
    """A hypothesis: ``tokens`` generated (EOS last when it ended in EOS), ``log_prob`` = log P(tokens | source) summed
    in longdouble, ``score`` = log_prob / ``penalty`` (lp(|Y|), or 1 for one returned unpenalised: ``at_max_length``),
    ``step`` the number of steps that produced it, ``ended`` whether it ends in EOS."""

    tokens: tuple[int, ...]
    log_prob: float
    score: float
    step: int
    ended: bool
    penalty: float


@dataclass(frozen=True)
class Decision:
    """One comparison the search made: ``gap`` >= 0 between the two quantities compared, and ``terms``: each quantity
    is an accumulated log-probability of ``step`` steps divided by ``divisor`` (1 for raw log-probabilities, lp for
    scores), so each may be off by err(step) / divisor when every step's log-probabilities are off by at most err."""

    step: int
    kind: str  # "alive": the k-th vs the (k+1)-th continuation; "finish": an EOS at the finishing rank; "stop";
    # "best": the best finished score vs the runner-up
    gap: float
    terms: tuple[tuple[int, float], ...]
    what: str

    def slack(self, err: Callable[[int], float]) -> float:
        """How far the gap is beyond the error the compared quantities may carry (<= 0: the choice may flip)."""
        return self.gap - sum(err(s) / d for s, d in self.terms)


@dataclass(frozen=True)
class BeamResult:
    """The search's outcome: ``best`` (highest score; ties: the first finished), every finished hypothesis in the
    order found, the number of steps, and every :class:`Decision`."""

    best: Hypothesis
    finished: tuple[Hypothesis, ...]
    steps: int
    decisions: tuple[Decision, ...] = field(repr=False)

    def undecided(self, err: Callable[[int], float]) -> list[Decision]:
        """The decisions an implementation whose per-step log-probabilities are within ``err(step)`` (accumulated over
        ``step`` steps) of these may take the other way; empty: it must return :attr:`best` exactly."""
        return [d for d in self.decisions if d.slack(err) <= 0]


def beam_search(
    log_probs: Callable[[Sequence[Sequence[int]]], np.ndarray],
    *,
    eos: int,
    max_length: int,
    beam: int = 4,
    alpha: float = DEFAULT_ALPHA,
    eos_rank: str = "2k",
    early_stop: str = "bound",
    at_max_length: str = "dropped",
    length_counts: str = "eos",
    penalty: Callable[[int, float], float] | None = None,
    keep_eos: bool = False,
    per_parent: bool = False,
    min_length: int = 0,
    renormalise: bool = True,
    stop_after: int = 0,
) -> BeamResult:
    """§6.1's beam search for one sentence, with GNMT's length penalty; policies as the module docstring says.

    ``log_probs(prefixes)`` -> (len(prefixes), vocab) next-token log-probabilities (e.g. :func:`model_log_probs`).
    At step t (1-based) every alive hypothesis is extended by every token; candidates are ranked by accumulated
    log-probability (ties: lower beam * vocab + token first). Candidates ending in EOS within the ``eos_rank`` best
    finish with score log P / lp(|Y|); the best ``beam`` that do not end in EOS stay alive. Accumulation in
    longdouble. Returns :class:`BeamResult`.

    Departures from §6.1, for the suite's diagnoses to compute a known bug and name it: ``penalty(|Y|, alpha)``
    replaces GNMT's lp; ``early_stop`` :data:`FIRST` stops at the first finished hypothesis, :data:`BOUND_NOW` bounds
    at the current length; ``keep_eos``: the best k candidates stay alive, EOS or not (a finished hypothesis is
    extended further); ``per_parent``: after the first step each alive hypothesis keeps only its own best
    continuation (k greedy searches, not a top-k over all k * vocab candidates); ``min_length`` m: EOS is disabled at
    steps 1..m, its log-probability set to -inf after the log-softmax (``renormalise`` False) or before it (True: the
    step's other log-probabilities renormalised without EOS, log p - log(1 - p(EOS))); ``stop_after`` s: the early stop
    is not applied before step s (a search that goes on until every sentence of its batch would stop, Hugging Face
    transformers PR #38778: for a monotone rule, "full" or "first", the sentence's own search with s the step at
    which the last sentence of its batch stops).
    """
    k = positive_int("beam", beam)
    limit = positive_int("max_length", max_length)
    a = _alpha(alpha)
    eos_rank = choice("eos_rank", eos_rank, EOS_RANKS)
    early_stop = choice("early_stop", early_stop, (*EARLY_STOPS, FIRST, BOUND_NOW))
    m = positive_int("min_length", min_length, minimum=0)
    stop_after = positive_int("stop_after", stop_after, minimum=0)
    at_max_length = choice("at_max_length", at_max_length, AT_MAX_LENGTH)
    length_counts = choice("length_counts", length_counts, LENGTH_COUNTS)
    extra = 1 if length_counts == "bos_eos" else 0

    def lp(t: int) -> float:
        if penalty is not None:
            return float(penalty(t + extra, a))
        return float(((LD(5) + LD(t + extra)) / LD(6)) ** LD(a))

    alive: list[tuple[tuple[int, ...], Any]] = [((), LD(0))]  # (tokens, log P) best first
    finished: list[Hypothesis] = []
    decisions: list[Decision] = []
    steps = 0
    for t in range(1, limit + 1):
        steps = t
        table = np.asarray(log_probs([seq for seq, _ in alive]), dtype=np.float64)
        if table.ndim != 2 or table.shape[0] != len(alive):
            raise ValueError(f"log_probs: expected shape ({len(alive)}, vocab), got {table.shape}")
        vocab = table.shape[1]
        if not 0 <= eos < vocab:
            raise ValueError(f"eos: expected an id below the vocabulary size {vocab}, got {eos}")
        if t <= m:  # EOS disabled: -inf, the others as they were or renormalised without it
            table = table.copy()
            if renormalise:
                with np.errstate(divide="ignore"):
                    table -= np.log1p(-np.exp(table[:, eos : eos + 1]))
            table[:, eos] = -np.inf  # the departure a diagnosis computes to name it; §6.1's search has m = 0
        cand = [
            (logp + LD(table[i, v]), i * vocab + v, i, v)
            for i, (_, logp) in enumerate(alive)
            for v in range(vocab)
            if np.isfinite(table[i, v])
        ]
        cand.sort(key=lambda c: (-c[0], c[1]))
        divisor = lp(t)
        ranked = cand[: (2 * k if eos_rank == "2k" else k)]
        for value, _, i, v in ranked:
            if v == eos:
                seq = (*alive[i][0], eos)
                finished.append(Hypothesis(seq, float(value), float(value / LD(divisor)), t, True, divisor))
        edge = len(ranked)
        for j, c in enumerate(cand):  # each EOS candidate against the rank that decides whether it finishes
            if c[3] != eos or (j < edge and edge >= len(cand)):
                continue
            other = cand[edge] if j < edge else cand[edge - 1]
            decisions.append(
                Decision(t, "finish", abs(float(c[0] - other[0])), ((t, 1.0), (t, 1.0)), f"EOS after beam {c[2]}")
            )
        rest = cand if keep_eos else [c for c in cand if c[3] != eos]
        if per_parent and t > 1:  # each parent's own best continuation only
            rest = [c for j, c in enumerate(rest) if all(o[2] != c[2] for o in rest[:j])]
        if len(rest) > k:
            decisions.append(
                Decision(t, "alive", float(rest[k - 1][0] - rest[k][0]), ((t, 1.0), (t, 1.0)), f"continuation {k}")
            )
        alive = [((*alive[i][0], v), value) for value, _, i, v in rest[:k]]
        if not alive:
            break
        if t == limit:
            break
        if t < stop_after:  # the departure a diagnosis computes to name it; §6.1's search has s = 0
            continue
        if (early_stop == "full" and len(finished) >= k) or (early_stop == FIRST and finished):
            break
        if early_stop in ("bound", BOUND_NOW) and finished:
            lowest = sorted(finished, key=lambda h: -h.score)[:k][-1]  # the k-th best finished score (or the last)
            longest = t if early_stop == BOUND_NOW else limit
            bound = float(alive[0][1] / LD(lp(longest)))
            # the k-th best of the finished scores moves by at most the largest error of any of them: err(s) / lp(s)
            # is at most err(latest step) / lp(earliest step), err growing and lp growing with the step
            first, last = min(h.step for h in finished), max(h.step for h in finished)
            decisions.append(
                Decision(t, "stop", abs(lowest.score - bound), ((last, lp(first)), (t, lp(longest))), "early stop")
            )
            if lowest.score > bound:
                break
    if (alive and steps == limit) or not finished:
        if at_max_length == "finished":
            divisor = lp(steps)
            finished += [Hypothesis(seq, float(v), float(v / LD(divisor)), steps, False, divisor) for seq, v in alive]
        elif not finished:  # "dropped", but nothing finished: the alive ones, scored by their log-probabilities
            finished += [Hypothesis(seq, float(v), float(v), steps, False, 1.0) for seq, v in alive]
    if not finished:
        raise ValueError("log_probs: every continuation had log-probability -inf; no hypothesis to return")
    order = sorted(range(len(finished)), key=lambda i: (-finished[i].score, i))
    best = finished[order[0]]
    for i in order[1:]:  # the best against each other one (a close one with a small error, a far one with a large)
        other = finished[i]
        decisions.append(
            Decision(
                steps,
                "best",
                best.score - other.score,
                ((best.step, best.penalty), (other.step, other.penalty)),
                f"best vs {other.tokens}",
            )
        )
    return BeamResult(best, tuple(finished), steps, tuple(decisions))
