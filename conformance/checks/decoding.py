"""Checks of decoding (§3.2.3, §6.1): the cached decoder step by step, a reordered cache, and beam search.

The oracle is ``aiayn.reference.decoding``: a step fed after c cached positions must give the whole model's forward
pass over the prefix at those positions (the decoder is causal), within the whole model's forward budget there
(``budgets.composites.forward.transformer_forward``; the products have other shapes, so not bit for bit); a beam search
must return the oracle's best hypothesis on the same rounded model with the policies the implementation declares
(``policies["beam_search"]``), wherever every choice the oracle's search made is wider than the error the
implementation's scores may carry (``budgets/decoding.py``); where one is not, either hypothesis is right and the
sentence is counted "not checked". Its score must be the oracle's score of the hypothesis it returned, within that
error, whatever the search chose.

An implementation without ``encode``/``decode_step``/``reorder_cache`` (or ``beam_search``) is reported "not
provided" (``implementations/protocol.py``, "Decoding").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from aiayn.conformance.budgets import decoding as DB
from aiayn.conformance.checks._common import declared, prepare
from aiayn.conformance.diagnoses.decoding import (
    BATCH,
    DECODING_CATALOGUE,
    BeamAnswer,
    StepDiagnosis,
    beam_departures,
    cached_logits,
)
from aiayn.conformance.diagnoses.forward import CATALOGUE, evaluate
from aiayn.conformance.directions import CACHED_STEPS, DECODE
from aiayn.conformance.equations import record
from aiayn.conformance.numerics import precision
from aiayn.conformance.run.comparison import compare, matches
from aiayn.conformance.run.harness import Case, OverBudget, check
from aiayn.implementations.decoding import beam_policies

#: Why a beam search's hypothesis is not checked where it differs from the oracle's: a choice of the oracle's search
#: (which candidates stay alive, which finish, when it stops, which is best) was within the error the two sets of
#: scores may carry, so the implementation's own rounding may take it the other way.
TIE = "beam search: a choice within the scores' error (tie-aware: either hypothesis is right)"

#: The record decoding is checked against: the whole model's (its oracle, budget, policies and diagnoses' model).
_MODEL = record("transformer_forward")


def provided(impl: Any, which: str) -> None:
    """Skip as "not provided" unless ``impl`` has the record's ``which`` methods ("steps", "search"): the tests call
    it before they draw, the checks again (a replayed check)."""
    import pytest

    methods = getattr(_MODEL.decode, which)
    missing = [m for m in methods if not callable(getattr(impl, m, None))]
    if missing:  # reported "not provided" in the decode row (report._row), never counted as a pass
        pytest.skip(f"not provided: {getattr(impl, 'name', impl)} has no {', '.join(missing)}")


def _arguments(seen: dict[str, Any], src: np.ndarray, tgt: np.ndarray | None, lengths: Any) -> dict[str, Any]:
    """The whole model's arguments (its record's ``arguments``) on (src, tgt) with the model the implementation saw:
    a decoder's target is the tokens it generated, never padded. ``tgt`` None: the encoder's side only (a cached
    decoder is fed its target step by step)."""
    a = {"src": src, "tgt": tgt, "params": seen["params"], "num_heads": seen["num_heads"], "src_lengths": lengths}
    return {**a, "tgt_lengths": None} if tgt is not None else a


def _oracle_args(case: Case, seen: dict[str, Any]) -> dict[str, Any]:
    return {**_arguments(seen, seen["src"], None, seen["src_lengths"]), **_MODEL.policies(declared(case))}


def _forward(
    case: Case, seen: dict[str, Any], src: np.ndarray, tgt: np.ndarray, lengths: Any, arithmetic: str | None = None
):
    """The oracle's logits of the whole model on (src, tgt), their budget at the case's arithmetic (or
    ``arithmetic``), and the budget's name."""
    r = _MODEL
    a = {**_arguments(seen, src, tgt, lengths), **r.policies(declared(case))}
    expected = np.asarray(r.oracle(a), dtype=np.float64)
    return expected, r.budget_at(a, expected, arithmetic or case.arithmetic), r.budget_name


def _step(case: Case, tokens: Any, memory: Any, params: Any, h: int, cache: Any, lengths: Any, want: tuple) -> tuple:
    """One call of ``decode_step``: (its logits as float64, checked in shape and dtype, and its cache)."""
    out = case.call("decode_step", tokens, memory, params, h, cache, lengths)
    if not isinstance(out, tuple) or len(out) != 2:
        case.fail(f"decode_step returned {type(out).__name__}, expected a pair (logits, cache)")
    if out[1] is None:
        case.fail(
            "decode_step returned None as its cache: the contract's decode_step returns the cache of the c + k "
            "positions it has seen (None is what the suite passes for no positions yet; implementations/protocol.py, "
            "Decoding)"
        )
    got = case.numpy(out[0], "decode_step(...)[0]")
    if not isinstance(got, np.ndarray) or got.shape != want:
        case.fail(f"decode_step returned logits of shape {getattr(got, 'shape', None)}, expected {want}")
    case._check_native_dtype(out[0], got, case.dtype, "decode_step")
    return got, out[1]


def decoded_in_chunks(
    case: Case,
    natives: dict[str, Any],
    seen: dict[str, Any],
    num_heads: int,
    chunks: Sequence[int],
    poison: float | None = None,
) -> np.ndarray:
    """The logits of ``encode`` then ``decode_step`` fed the target ``seen["tgt"]`` in ``chunks`` (one call each, the
    cache passed on), concatenated over the target's positions: (B, T, vocab) float64. ``poison``: the memory's rows
    at hidden source positions (at or past ``src_lengths``) replaced by +-poison (alternating by column) before the
    first step."""
    tgt = seen["tgt"]
    b, vocab = tgt.shape[0], seen["params"]["embedding"].shape[0]
    memory = case.call("encode", natives["src"], natives["params"], num_heads, natives["src_lengths"])
    if poison is not None and seen["src_lengths"] is not None:
        held = case.numpy(memory, "encode(...)")
        if not isinstance(held, np.ndarray) or held.ndim != 3 or held.shape[:2] != seen["src"].shape:
            case.fail(f"encode returned a memory of shape {getattr(held, 'shape', None)}, expected (B, n_src, d_model)")
        hidden = np.arange(held.shape[1])[None, :] >= np.asarray(seen["src_lengths"])[:, None]  # (B, n_src)
        sign = np.where(np.arange(held.shape[2]) % 2 == 0, 1.0, -1.0)
        memory = case.native(np.where(hidden[..., None], poison * sign, held))
    got, cache, start = [], None, 0
    for k in chunks:
        tokens = case.native(tgt[:, start : start + k])
        logits, cache = _step(
            case, tokens, memory, natives["params"], num_heads, cache, natives["src_lengths"], (b, k, vocab)
        )
        got.append(logits)
        start += k
    return np.concatenate(got, axis=1)


def judge_decoding(
    case: Case, seen: dict[str, Any], chunks: Sequence[int], got: np.ndarray, where: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Compare the logits ``got`` of decoding ``seen["tgt"]`` in ``chunks`` with the whole model's forward pass at
    those positions, within its forward budget (``where`` names the call in messages); returns the oracle's logits
    and their budget."""
    expected, budget, name = _forward(case, seen, seen["src"], seen["tgt"], seen["src_lengths"])
    ops, start = [], 0
    for k in chunks:
        ops.append(("step", seen["tgt"][:, start : start + k]))
        start += k
    case.diagnosis = StepDiagnosis(
        case.check,
        _oracle_args(case, seen),
        ops,
        expected,
        lambda dtype: _forward(case, seen, seen["src"], seen["tgt"], seen["src_lengths"], dtype)[1],
    )
    compare(
        case,
        got,
        expected,
        budget,
        what=f"decoding with a cache, fed in chunks {list(chunks)}{where}, differs from the whole forward pass at "
        "those positions",
        budget_name=name,
        expected_name="the full forward pass over the prefix",
    )
    return expected, budget


def _cached_decoding_check(name: str, doc: str) -> Any:
    """Register a check ``name`` of the cached decoder: feeding the target to ``decode_step`` in ``chunks`` gives the
    whole model's logits at every position, within its forward budget."""

    def decodes(
        case: Case,
        src: np.ndarray,
        tgt: np.ndarray,
        params: dict[str, Any],
        num_heads: int,
        src_lengths: np.ndarray | None,
        chunks: list[int],
    ) -> None:
        provided(case.impl, "steps")
        if sum(chunks) != tgt.shape[1]:
            raise ValueError(f"test construction: chunks {chunks} do not sum to the target length {tgt.shape[1]}")
        natives, seen = prepare(case, src=src, tgt=tgt, params=params, num_heads=num_heads, src_lengths=src_lengths)
        judge_decoding(case, seen, chunks, decoded_in_chunks(case, natives, seen, num_heads, chunks))

    decodes.__name__ = decodes.__qualname__ = name
    decodes.__doc__ = doc
    return check("transformer_forward", direction=DECODE)(decodes)


cached_decoding_equals_the_full_forward = _cached_decoding_check(
    "cached_decoding_equals_the_full_forward",
    "Feeding the target to ``decode_step`` in ``chunks`` (one at a time, a prefill then one at a time, any split) "
    "gives the whole model's logits at every position, within its forward budget.",
)
cached_decoding_across_tiles = _cached_decoding_check(
    "cached_decoding_across_tiles",
    "The same on targets whose length crosses a tile of 16 or 32 cached positions (``strategies.decode_inputs``, "
    "``across_tiles``): a cache kernel's last partial tile of keys.",
)


#: Why a canary draw is not counted: it hides no source position.
NO_HIDDEN_SOURCE = "decoding canary: no hidden source position in this draw (the scope accepts no padding)"


def canary(params: dict[str, Any], dtype: str) -> float:
    """The memory poison of :func:`cached_decoding_ignores_what_padding_holds`: the largest magnitude whose
    projections and scores stay finite, max / (16 d^4 max(1, w)^2) with d = d_model and w the largest parameter
    magnitude (a decoder query is at most sqrt(d) d w + w per element after LayerNorm and a projection; a key row of
    the poison at most d w X + w), so that an implementation that masks by replacing scores has nothing to overflow,
    and one that adds a finite penalty (-1e4, -1e9) sees the poison outweigh it."""
    from aiayn.reference.model import flatten_params

    d = int(params["embedding"].shape[1])
    w = max(float(np.max(np.abs(a), initial=0.0)) for a in flatten_params(params).values())
    return precision(dtype).max / (16.0 * d**4 * max(1.0, w) ** 2)


@check(
    "transformer_forward",
    kind="property",
    violates="a hidden (padded) source position is as if absent (§3.2.3): what it holds cannot reach a target",
    direction=DECODE,
)
def cached_decoding_ignores_what_padding_holds(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    chunks: list[int],
    filler_seed: int,
) -> None:
    """Canaries in decoding: other source tokens at the hidden positions, and the memory's rows there replaced by the
    largest finite values that cannot overflow (:func:`canary`) between ``encode`` and the first ``decode_step``;
    the cached decoder's logits must still be the whole model's on the clean sentence, within its forward budget.
    (NaN is not the poison here: a memory row is projected to keys and values, and 0 x NaN = NaN in every P V.)"""
    provided(case.impl, "steps")
    if src_lengths is None or np.all(np.asarray(src_lengths) >= src.shape[1]):
        case.tally(unchecked={NO_HIDDEN_SOURCE: 1})
        return
    vocab = int(params["embedding"].shape[0])
    hidden = np.arange(src.shape[1])[None, :] >= np.asarray(src_lengths)[:, None]
    others = np.random.default_rng(filler_seed).integers(0, vocab, src.shape)
    src = np.where(hidden, others, src).astype(np.int64)
    natives, seen = prepare(case, src=src, tgt=tgt, params=params, num_heads=num_heads, src_lengths=src_lengths)
    poison = canary(seen["params"], case.dtype)
    got = decoded_in_chunks(case, natives, seen, num_heads, chunks, poison=poison)
    where = f" with other tokens and +-{poison:.3g} in the memory at the hidden source positions"
    judge_decoding(case, seen, chunks, got, where)


@check("transformer_forward", direction=DECODE)
def reordered_cache_equals_the_reordered_prefixes(
    case: Case,
    src: np.ndarray,
    tgt: np.ndarray,
    params: dict[str, Any],
    num_heads: int,
    src_lengths: np.ndarray | None,
    index: np.ndarray,
    new: np.ndarray,
) -> None:
    """A cache of the prefixes ``tgt``, reordered to rows ``index`` (repeats allowed) and fed ``new`` tokens, gives
    the whole model's logits for the reordered prefixes followed by those tokens."""
    provided(case.impl, "steps")
    natives, seen = prepare(case, src=src, tgt=tgt, params=params, num_heads=num_heads, src_lengths=src_lengths)
    memory = case.call("encode", natives["src"], natives["params"], num_heads, natives["src_lengths"])
    b, s = tgt.shape
    vocab = params["embedding"].shape[0]
    _, cache = _step(
        case, natives["tgt"], memory, natives["params"], num_heads, None, natives["src_lengths"], (b, s, vocab)
    )
    cache = case.call("reorder_cache", cache, case.native(index))
    if cache is None:
        case.fail(
            "reorder_cache returned None: the contract's reorder_cache returns the cache of batch rows index "
            "(implementations/protocol.py, Decoding); None is what the suite passes for no positions yet"
        )
    kept = None if src_lengths is None else src_lengths[index]
    memory = case.call(
        "encode", case.native(src[index]), natives["params"], num_heads, None if kept is None else case.native(kept)
    )
    got, _ = _step(
        case,
        case.native(new),
        memory,
        natives["params"],
        num_heads,
        cache,
        None if kept is None else case.native(kept),
        (len(index), new.shape[1], vocab),
    )
    lengths = None if seen["src_lengths"] is None else seen["src_lengths"][index]
    full = np.concatenate((seen["tgt"][index], new), axis=1)
    expected, budget, name = _forward(case, seen, seen["src"][index], full, lengths)
    case.diagnosis = StepDiagnosis(
        case.check,
        _oracle_args(case, seen),
        [("step", seen["tgt"]), ("reorder", index), ("step", new)],
        expected[:, s:],
        lambda dtype: _forward(case, seen, seen["src"][index], full, lengths, dtype)[1][:, s:],
    )
    compare(
        case,
        got,
        expected[:, s:],
        budget[:, s:],
        what=f"a cache reordered to rows {index.tolist()} and fed {new.shape[1]} more token(s) differs from the "
        "whole forward pass over the reordered prefixes",
        budget_name=name,
        expected_name="the full forward pass over the reordered prefixes",
    )


def _beam_policies(case: Case) -> dict[str, str]:
    """The declared beam-search choices (``implementations/decoding.py``), or a failure naming what is wrong."""
    try:
        return beam_policies(getattr(case.impl, "policies", {}))
    except ValueError as exc:
        case.fail(str(exc))
        raise  # case.fail raises


class _Scored:
    """The oracle's next-token log-probabilities for one sentence, with each step's error bound
    (``budgets.decoding.step_error``) and the largest |log P| of the step's candidates, as the search asks for them."""

    def __init__(
        self, case: Case, seen: dict[str, Any], row: int, bos: int, ps: list, ops: Any = None, flags: Any = None
    ) -> None:
        self.case, self.seen, self.row, self.bos, self.ps, self.ops = case, seen, row, bos, ps, ops
        self.flags = flags
        self.errors: dict[int, float] = {}  # step -> bound on one step's log-probability
        self.sizes: dict[int, float] = {}  # step -> largest |log P| among its finite candidates
        self.logp: dict[tuple[int, ...], float] = {(): 0.0}
        # prefix -> (log-probabilities (V,), logits (V,), their budget (V,)): the searches a diagnosis runs ask for
        # the same prefixes again
        self.rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def logits(self, src: np.ndarray, tgt: np.ndarray, lengths: Any) -> tuple[np.ndarray, np.ndarray]:
        """The whole model's logits on (src, tgt) and their budget: the oracle's, or with ``ops`` the diagnoses'
        model with a departure switched in (``diagnoses.Ops``), or with ``flags`` a cached decoder fed one token at a
        time with a bug switched in (``diagnoses.decoding.cached_logits``); the budget stays the paper's at the same
        inputs."""
        logits, beta, _ = _forward(self.case, self.seen, src, tgt, lengths)
        if self.flags is not None:
            a = {**_oracle_args(self.case, self.seen), "src": src, "src_lengths": lengths}
            steps = [("step", tgt[:, j : j + 1]) for j in range(tgt.shape[1])]
            with np.errstate(all="ignore"):
                logits = cached_logits(a, steps, self.flags)
        if self.ops is not None:
            seen = _arguments(self.seen, src, tgt, lengths)
            logits = evaluate(_MODEL.model, _MODEL.model_arguments(declared(self.case), seen), self.ops)
        return logits, beta

    def __call__(self, prefixes: Sequence[Sequence[int]]) -> np.ndarray:
        src = self.seen["src"][self.row : self.row + 1]
        lengths = None if self.seen["src_lengths"] is None else self.seen["src_lengths"][self.row : self.row + 1]
        missing = list(dict.fromkeys(tuple(p) for p in prefixes if tuple(p) not in self.rows))
        if missing:
            n = len(missing)
            tgt = np.array([[self.bos, *p] for p in missing], dtype=np.int64)
            logits, beta = self.logits(np.repeat(src, n, 0), tgt, None if lengths is None else np.repeat(lengths, n))
            z = logits[:, -1]  # (n, V)
            d = z - z.max(axis=-1, keepdims=True)
            table = d - np.log(np.sum(np.exp(d), axis=-1, keepdims=True))
            for p, row, zr, br in zip(missing, table, z, beta[:, -1]):
                self.rows[p] = (row, zr, br)
        rows = [self.rows[tuple(p)] for p in prefixes]
        table = np.stack([r[0] for r in rows])  # (len(prefixes), V)
        t = len(prefixes[0]) + 1
        self.errors[t] = DB.step_error(np.stack([r[1] for r in rows]), np.stack([r[2] for r in rows]), self.ps)
        sizes = []
        for p, row in zip(prefixes, table):
            base = self.logp[tuple(p)]
            for v, x in enumerate(row):
                self.logp[(*p, v)] = base + float(x)
                sizes.append(abs(base + float(x)))
        self.sizes[t] = max(sizes)
        return table

    def err(self, step: int) -> float:
        """Bound on an accumulated log-probability after ``step`` steps (``budgets.decoding.accumulated``)."""
        steps = [self.errors[s] for s in range(1, step + 1) if s in self.errors]
        return DB.accumulated(steps, self.sizes.get(step, max(self.sizes.values(), default=0.0)), self.ps)


def max_lengths_of(src: np.ndarray, src_lengths: np.ndarray | None, extra: int) -> np.ndarray:
    """Each sentence's maximum output length (§6.1: input length + ``extra``), (B,) int64; the input length is its
    source length where lengths are given, else the source's width."""
    inputs = src.shape[1] if src_lengths is None else src_lengths
    return np.broadcast_to(np.asarray(inputs) + extra, (src.shape[0],)).astype(np.int64)


def searched(
    case: Case,
    natives: dict[str, Any],
    num_heads: int,
    beam: int,
    alpha: float,
    max_lengths: np.ndarray,
    bos: int,
    eos: int,
) -> list[Any]:
    """One call of ``beam_search`` on the native arguments: its answer, checked to be a list of one item per
    sentence (each item is judged by :func:`judge_hypotheses`)."""
    b = len(max_lengths)
    out = case.call(
        "beam_search",
        natives["src"],
        natives["params"],
        num_heads,
        beam,
        alpha,
        case.native(max_lengths),
        bos,
        eos,
        natives["src_lengths"],
    )
    if not isinstance(out, (list, tuple)) or len(out) != b:
        case.fail(
            f"beam_search returned {type(out).__name__} of length {len(out) if hasattr(out, '__len__') else '?'}, "
            f"expected a list of {b} (tokens, score) pairs"
        )
    return list(out)


class Searches:
    """The oracle's beam searches of the sentences of one call (what the implementation saw of them, ``seen``), with
    the declared policies: each sentence's scorer (:class:`_Scored`, made when first asked; ``scored`` shares those of
    the same sentences in another call) and result, memoised; :meth:`batch_steps` the step at which the last of them
    stops."""

    def __init__(
        self,
        case: Case,
        seen: dict[str, Any],
        beam: int,
        alpha: float,
        max_lengths: np.ndarray,
        bos: int,
        eos: int,
        scored: dict[int, _Scored] | None = None,
    ) -> None:
        self.case, self.seen, self.beam, self.alpha, self.bos, self.eos = case, seen, beam, alpha, bos, eos
        self.max_lengths = np.asarray(max_lengths)
        self.rule = _beam_policies(case)
        self.ps = [precision(case.arithmetic), precision("float64")]
        self.scored: dict[int, _Scored] = dict(scored or {})
        self.results: dict[int, Any] = {}

    def of(self, p: int) -> _Scored:
        if p not in self.scored:
            self.scored[p] = _Scored(self.case, self.seen, p, self.bos, self.ps)
        return self.scored[p]

    def kw(self, p: int) -> dict[str, Any]:
        """The declared search's arguments for sentence ``p``."""
        return {
            "eos": self.eos,
            "max_length": int(self.max_lengths[p]),
            "beam": self.beam,
            "alpha": self.alpha,
            **{key: self.rule[key] for key in ("eos_rank", "early_stop", "at_max_length", "length_counts")},
        }

    def result(self, p: int) -> Any:
        if p not in self.results:
            self.results[p] = _MODEL.decode.search_oracle(self.of(p), **self.kw(p))
        return self.results[p]

    def batch_steps(self) -> int:
        """The step at which the oracle's search of the call's last sentence stops (searches every sentence)."""
        return max(self.result(p).steps for p in range(len(self.max_lengths)))


def judge_hypotheses(
    case: Case, out: Sequence[Any], searches: Searches, positions: Sequence[int], where: str = ""
) -> dict[int, tuple[list[int], float, bool]]:
    """Judge the answer ``out`` of one call of ``beam_search`` at ``positions`` (its sentences there): each a
    (tokens, score) pair by the contract's types, its score the oracle's score of those tokens within the accumulated
    error, its tokens the oracle's search's best wherever every choice of that search was wider than the scores'
    error (``where`` names the call in messages). Returns each position's (tokens, score, whether the oracle's search
    decided it)."""
    vocab = searches.seen["params"]["embedding"].shape[0]
    ml, alpha, eos, bos, rule = searches.max_lengths, searches.alpha, searches.eos, searches.bos, searches.rule
    judged: dict[int, tuple[list[int], float, bool]] = {}
    for i in positions:
        tokens, score = _hypothesis(case, out[i], i, vocab, eos, int(ml[i]), int(ml.max()))
        scored, kw, result = searches.of(i), searches.kw(i), searches.result(i)
        log_p, bound, penalty, eos_lp = _path(case, scored, tokens, alpha, eos, rule, bos)
        extra = 1 if rule["length_counts"] == "bos_eos" else 0
        case.diagnosis = _BeamDiagnosis(
            scored,
            kw,
            BeamAnswer(
                _searcher(scored, kw),
                tuple(tokens),
                score,
                log_p,
                bound,
                len(tokens) + extra,
                penalty,
                alpha,
                rule,
                eos_lp,
                int(ml[i]),
                int(ml.max()),
                searches.batch_steps,
            ),
            lambda ops, flags=None, scored=scored, tokens=tokens: _variant_path(
                case, scored, ops, tokens, alpha, eos, rule, flags
            ),
        )
        compare(
            case,
            np.array(score),
            np.array(log_p / penalty),
            np.array(bound / penalty),
            what=f"beam search's score of its hypothesis {tokens} for sentence {i}{where} differs from log P(tokens | "
            f"source) / lp(|Y|) with lp(|Y|) = ((5 + |Y|) / 6)^{alpha}"
            + (" (unpenalised: no hypothesis finished)" if penalty == 1.0 and tokens[-1] != eos else ""),
            budget_name="budgets.decoding.accumulated",
            expected_name="the oracle's score of the same tokens",
        )
        if tuple(tokens) == result.best.tokens:
            case.tally(checked=1)
            judged[i] = (tokens, score, True)
            continue
        if result.undecided(scored.err):
            case.tally(unchecked={TIE: 1})
            judged[i] = (tokens, score, False)
            continue
        closest = min(result.decisions, key=lambda d: d.slack(scored.err), default=None)
        matched, _ = matches(case, np.array(score))
        case.fail(
            f"beam search returned {tokens} for sentence {i}{where}, the oracle's search {list(result.best.tokens)} "
            f"(score {score!r}, the oracle's {result.best.score!r}){matched}; every choice of the oracle's search was "
            f"wider than the scores' error"
            + (f" (the closest: {closest.what} at step {closest.step}, gap {closest.gap:.3g})" if closest else "")
            + f"; policies {rule}, beam {searches.beam}, alpha {alpha}, maximum length {int(ml[i])}",
            kind=OverBudget,
        )
    return judged


@check("transformer_forward", direction=DECODE)
def beam_search_finds_the_oracles_hypothesis(
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
) -> None:
    """Each sentence's hypothesis is the oracle's beam search's on the same model with the declared policies (where
    no choice of the search was within the scores' error), and its score is the oracle's score of what it returned."""
    provided(case.impl, "search")
    natives, seen = prepare(case, src=src, params=params, num_heads=num_heads, src_lengths=src_lengths)
    max_lengths = max_lengths_of(src, src_lengths, extra)
    out = searched(case, natives, num_heads, beam, alpha, max_lengths, bos, eos)
    searches = Searches(case, seen, beam, alpha, max_lengths, bos, eos)
    judge_hypotheses(case, out, searches, range(len(out)))


def _searcher(scored: _Scored, kw: dict[str, Any]) -> Any:
    """The oracle's search over ``scored`` with the declared arguments ``kw``, overrides by keyword."""
    return lambda **overrides: _MODEL.decode.search_oracle(scored, **{**kw, **overrides})


class _BeamDiagnosis:
    """What ``comparison.matches`` needs to name the beam-search bug an answer matches (``diagnoses.decoding``): the
    oracle's search (its log-probabilities and arguments ``kw``), the answer and the oracle's reading of it
    (``diagnoses.decoding.BeamAnswer``); ``variant(ops)``, the same for the model with a departure of the forward
    pass switched in (:func:`_variant_path`)."""

    def __init__(self, scored: _Scored, kw: dict, answer: BeamAnswer, variant: Any) -> None:
        self.scored, self.kw, self.answer, self.variant = scored, kw, answer, variant

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        """What explains the answer: a bug of the cached decoder (``diagnoses.decoding.DECODING_CATALOGUE``'s step
        bugs that show one token at a time) under which the declared search returns exactly these tokens and this
        score; else the beam-search departures on the oracle's model; where none does, on a model whose positions
        depart (``diagnoses.CATALOGUE``'s "positional" family, e.g. a declared layout of §3.5's table): that departure
        named, with the search's own departures on that model."""
        answer = replace(self.answer, score=float(np.asarray(got)))
        decoder = []  # a bug of the cached decoder that a beam search feeds one token at a time, the search declared
        for departure in DECODING_CATALOGUE:
            if answer.paper():  # the score is the paper model's log P of the tokens: no decoder bug on their path
                break
            if departure.flags and _STEP_CHECK in departure.checks and not set(departure.flags) & _CHUNKS_ONLY:
                scored, log_p, bound, penalty, eos_lp = self.variant(None, departure.flags)
                there = replace(answer, search=_searcher(scored, self.kw), log_p=log_p, bound=bound, penalty=penalty)
                best = there.search().best
                if best.tokens == there.tokens and there.agrees(best.score, best.penalty):
                    decoder.append(departure.name)
        if decoder:
            return decoder
        names = beam_departures(answer)
        if names or "positional" in self.scored.seen["params"]:
            return names
        for departure in CATALOGUE:
            if departure.family != "positional" or departure.numerical or departure.precision:
                continue
            scored, log_p, bound, penalty, eos_lp = self.variant(departure.ops)
            there = replace(
                answer,
                search=_searcher(scored, self.kw),
                log_p=log_p,
                bound=bound,
                penalty=penalty,
                eos_log_probs=eos_lp,
            )
            with np.errstate(all="ignore"):
                found = beam_departures(there)
            if found or there.paper():
                names += [departure.name, *found]
        return names


def _variant_path(
    case: Case,
    scored: _Scored,
    ops: Any,
    tokens: list[int],
    alpha: float,
    eos: int,
    rule: dict[str, str],
    flags: Any = None,
) -> tuple[_Scored, float, float, float, np.ndarray]:
    """The search of ``scored``'s sentence on the model with ``ops`` (``diagnoses.Ops``) or the cached decoder with
    ``flags``, and what :func:`_path` gives of ``tokens`` on it."""
    variant = _Scored(case, scored.seen, scored.row, scored.bos, scored.ps, ops, flags)
    return (variant, *_path(case, variant, tokens, alpha, eos, rule, scored.bos))


#: The check whose departures are bugs of a cached step, and the flags of those that show only in a chunk of several
#: tokens (a beam search feeds one at a time).
_STEP_CHECK = CACHED_STEPS
_CHUNKS_ONLY = frozenset({"top_left", "reversed"})

#: The departure a hypothesis longer than its sentence's maximum length, within the batch's largest, matches.
BATCH_MAX = next(d.name for d in DECODING_CATALOGUE if d.search.get("max_length") == BATCH)
#: The departure a hypothesis that goes on after its EOS matches.
EXTENDS_FINISHED = next(d.name for d in DECODING_CATALOGUE if d.search.get("keep_eos"))


class _Named:
    """A diagnosis that the check has already computed: the answer breaks a rule that exactly one departure breaks."""

    def __init__(self, name: str) -> None:
        self.name = name

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        return [self.name]


def _is_id(value: Any) -> bool:
    """A token id as the contract returns it: a Python or NumPy integer, never a bool (an int subclass), a float or
    a string that would convert to one."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    """A score as the contract returns it: a Python or NumPy real number, never a bool, a string or an array."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _hypothesis(
    case: Case, item: Any, i: int, vocab: int, eos: int, limit: int, batch_max: int
) -> tuple[list[int], float]:
    """One (tokens, score) pair of a beam search's answer, checked against the contract by type before value: the
    tokens a list (or tuple) of integer ids, the score a real number; nothing is converted into a passing answer."""
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        case.fail(f"beam_search's answer for sentence {i} is {item!r}, expected a pair (tokens, score)")
    tokens, score = item
    if not isinstance(tokens, (list, tuple)):
        case.fail(
            f"beam_search's tokens for sentence {i} are {type(tokens).__name__} {tokens!r}, expected a list of int ids"
        )
    wrong = [(j, t) for j, t in enumerate(tokens) if not _is_id(t)]
    if wrong:
        j, t = wrong[0]
        case.fail(
            f"beam_search's tokens for sentence {i} are {list(tokens)!r}: id {j} is {type(t).__name__} {t!r}, "
            f"expected an int (Python or NumPy integer, not bool, float or str); {len(wrong)} such id(s)"
        )
    if not _is_real(score):
        case.fail(
            f"beam_search's score for sentence {i} is {type(score).__name__} {score!r}, expected a real number "
            "(a Python or NumPy float or int, not bool, str or an array)"
        )
    tokens = [int(t) for t in tokens]  # every one an integer already (checked above): the same values as Python ints
    try:
        score = float(score)  # a real number already (checked above): float() only widens a NumPy scalar
    except OverflowError:
        case.fail(f"beam_search's score for sentence {i} is an int beyond the float range: {score!r}")
    if tokens and all(0 <= t < vocab for t in tokens) and eos in tokens[:-1]:
        j = tokens.index(eos)  # a hypothesis returned after its EOS: the search extended a finished one
        case.diagnosis = _Named(EXTENDS_FINISHED)
        matched, _ = matches(case, np.array(score))
        case.fail(
            f"beam_search's tokens for sentence {i} are {tokens}: the hypothesis ended at EOS ({eos}) at position {j} "
            f"and was extended by {len(tokens) - j - 1} more token(s): a returned hypothesis never extends a finished "
            f"one{matched}",
            kind=OverBudget,
        )
    if limit < len(tokens) <= batch_max and all(0 <= t < vocab for t in tokens) and eos not in tokens[:-1]:
        case.diagnosis = _Named(BATCH_MAX)
        matched, _ = matches(case, np.array(score))
        case.fail(
            f"beam_search's tokens for sentence {i} are {tokens}: {len(tokens)} ids, more than its maximum length "
            f"{limit} (input length + extra), within the batch's largest, {batch_max}{matched}",
            kind=OverBudget,
        )
    if any(not 0 <= t < vocab for t in tokens) or eos in tokens[:-1] or not tokens or len(tokens) > limit:
        case.fail(
            f"beam_search's tokens for sentence {i} are {tokens}: expected 1 to {limit} ids in [0, {vocab}), "
            f"eos ({eos}) at most once and last"
        )
    return tokens, score


def _path(
    case: Case,
    scored: _Scored,
    tokens: list[int],
    alpha: float,
    eos: int,
    rule: dict[str, str],
    bos: int,
) -> tuple[float, float, float, np.ndarray]:
    """The oracle's log P(tokens | source) of a hypothesis (teacher-forced log-probabilities summed), the bound on an
    implementation's (``budgets.decoding.accumulated`` along that path), its penalty lp(|Y|) (1 where a
    "dropped" search returns an alive hypothesis because none finished), and log P(EOS) at each step (T,)."""
    seen, i = scored.seen, scored.row
    src = seen["src"][i : i + 1]
    lengths = None if seen["src_lengths"] is None else seen["src_lengths"][i : i + 1]
    tgt = np.array([[bos, *tokens[:-1]]], dtype=np.int64)
    logits, beta = scored.logits(src, tgt, lengths)
    z = logits[0]  # (T, V)
    d = z - z.max(axis=-1, keepdims=True)
    lp = d - np.log(np.sum(np.exp(d), axis=-1, keepdims=True))
    log_p = float(np.sum(lp[np.arange(len(tokens)), tokens]))
    steps = [DB.step_error(z[t : t + 1], beta[0, t : t + 1], scored.ps) for t in range(len(tokens))]
    raw = tokens[-1] != eos and rule["at_max_length"] == "dropped"
    extra = 1 if rule["length_counts"] == "bos_eos" else 0
    penalty = 1.0 if raw else _MODEL.decode.length_penalty(len(tokens) + extra, alpha)
    return log_p, DB.accumulated(steps, log_p, scored.ps), penalty, lp[:, eos]
