"""Diagnoses of decoding (§3.2.3, §6.1): the known decoding bugs, each computed, so that a failing decoding check
names the one its output matches.

A cached decoder's bugs are computed by a decoder of the oracle's sub-layers (``aiayn.reference``'s fast tier) run
step by step with a cache, the bug switched in (:func:`cached_logits`); a beam search's by the oracle's search with
the bug's penalty or stopping rule (``aiayn.reference.decoding.beam_search``'s ``penalty`` and ``early_stop``
"first"). A bug is named where its output agrees with the implementation's within the check's own budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aiayn.conformance.budgets._heads import affine
from aiayn.conformance.budgets._heads import merge as _merge
from aiayn.conformance.budgets._heads import split as _split
from aiayn.conformance.directions import BEAM_SEARCH, CACHED_STEPS, REORDERED_CACHE
from aiayn.implementations.decoding import BEAM_POLICY_CHOICES
from aiayn.reference.attention import multi_head_attention, scaled_dot_product_attention
from aiayn.reference.decoding import BOUND_NOW, FIRST
from aiayn.reference.layers import embedding_lookup, feed_forward, layer_norm, output_logits
from aiayn.reference.model import encoder_layer
from aiayn.reference.positional import positional_encoding


@dataclass(frozen=True)
class DecodeDeparture:
    """One known decoding bug: its name (what messages say), who had it, the checks where it shows, and its switch
    (``flags`` for :func:`cached_logits`; ``penalty``/``stop`` for a beam search)."""

    name: str
    note: str
    checks: frozenset[str]
    flags: Mapping[str, bool] = field(default_factory=dict)
    penalty: Callable[[int, float], float] | None = None
    search: Mapping[str, Any] = field(default_factory=dict)


#: What a departure's ``search`` gives for the maximum length: the batch's largest, not the sentence's own.
BATCH = "the batch's largest"
#: What a departure's ``search`` gives for a minimum length: each m from 1 up to the maximum length less one.
ANY = "any"

_STEPS = frozenset({CACHED_STEPS, REORDERED_CACHE})
_REORDER = frozenset({REORDERED_CACHE})
_BEAM = frozenset({BEAM_SEARCH})

#: Every decoding bug the suite can name; each decoding mutant (``studies/mutants.py``) carries one of these names.
DECODING_CATALOGUE: tuple[DecodeDeparture, ...] = (
    DecodeDeparture(
        "positions restarted at 0 in each decode step",
        "positions not offset by the cache length (transformers #15736, PR #15444)",
        _STEPS,
        {"restart": True},
    ),
    DecodeDeparture(
        "a top-left causal mask for a chunk after a cache",
        "SDPA's is_causal with n_q != n_k (pytorch #103082); the ONNX Attention operator's cache path (onnx PR #8068)",
        _STEPS,
        {"top_left": True},
    ),
    DecodeDeparture(
        "the source padding mask dropped after the first decode step",
        "a padding mask not extended to later steps (transformers #16811)",
        _STEPS,
        {"mask_once": True},
    ),
    DecodeDeparture(
        "cross-attention over a memory not reordered with the cache",
        "cross-attention state kept from before a beam reordering (vllm PR #38321)",
        _REORDER,
        {"stale_memory": True},
    ),
    DecodeDeparture(
        "the cache not reordered",
        "the cache left in place when beam search reorders its hypotheses (transformers #46612)",
        _REORDER,
        {"not_reordered": True},
    ),
    DecodeDeparture(
        "keys cached without their bias",
        "keys cached as x W^K, the bias b^K added only to the step's own keys",
        _STEPS,
        {"keys_no_bias": True},
    ),
    DecodeDeparture(
        "keys cached after scaling by 1/sqrt(d_k) (scaled twice)",
        "keys cached pre-scaled, then scaled again by the attention",
        _STEPS,
        {"keys_scaled": True},
    ),
    DecodeDeparture(
        "keys and values concatenated in reverse order (new before cached)",
        "cat([new, past]) instead of cat([past, new]): the causal mask of a chunk then hides the wrong positions",
        _STEPS,
        {"reversed": True},
    ),
    DecodeDeparture(
        "a self-attention mask not extended over the cached positions",
        "the causal mask of the k new tokens (k, k) used after a cache: the cached positions masked out",
        _STEPS,
        {"unextended_mask": True},
    ),
    DecodeDeparture(
        "cached keys and values swapped",
        "the cache's key and value slots exchanged: later steps attend with past values as keys",
        _STEPS,
        {"swapped_kv": True},
    ),
    DecodeDeparture(
        "a position skipped for a one-token step (c + 1 instead of c)",
        "an off-by-one in the position of a single-token step after a cache",
        _STEPS,
        {"skip_position": True},
    ),
    DecodeDeparture(
        "a cache reordered in place over its own rows",
        "row r := row index[r] in place, in order: a row read after it was overwritten (aliasing source and result)",
        _REORDER,
        {"aliased_reorder": True},
    ),
    DecodeDeparture(
        "length penalty |Y|^alpha instead of ((5 + |Y|) / 6)^alpha",
        "fairseq's and Hugging Face's penalty (sum of log-probabilities / |Y|^alpha), not GNMT's that §6.1 cites",
        _BEAM,
        penalty=lambda n, alpha: float(n) ** alpha,
    ),
    DecodeDeparture("no length penalty", "hypotheses ranked by log-probability alone", _BEAM, penalty=lambda n, a: 1.0),
    DecodeDeparture(
        "beam search stopped at the first finished hypothesis",
        "the search ends when one hypothesis has finished, not when no alive one can still win",
        _BEAM,
        search={"early_stop": FIRST},
    ),
    DecodeDeparture(
        "early stop bounded at the current length, lp(t) instead of lp(maximum length)",
        "the bound of a declared 'bound' rule taken at the current length (Hugging Face's early_stopping=False): it "
        "stops before a longer hypothesis can overtake",
        _BEAM,
        search={"early_stop": BOUND_NOW},
    ),
    DecodeDeparture(
        "finished hypotheses kept alive and extended after EOS",
        "the best k candidates kept alive, EOS or not: a finished hypothesis takes a beam slot",
        _BEAM,
        search={"keep_eos": True},
    ),
    DecodeDeparture(
        "each hypothesis extended by its own best token only (k greedy searches)",
        "a top-1 per hypothesis after the first step instead of a top-k over all k * vocab candidates",
        _BEAM,
        search={"per_parent": True},
    ),
    DecodeDeparture(
        "one maximum length per batch (the largest) instead of each sentence's own",
        "every sentence searched to the batch's largest input length + 50, not its own (§6.1)",
        _BEAM,
        search={"max_length": BATCH},
    ),
    DecodeDeparture(
        "the early stop applied to the whole batch (a sentence searched until every one of its batch stops)",
        "a stopping rule checked for the batch, not per sentence: a finished sentence goes on searching while another "
        "of its batch does (Hugging Face transformers PR #38778; sockeye PR #474)",
        _BEAM,
        search={"stop_after": BATCH},
    ),
    DecodeDeparture(
        "a minimum length: EOS disabled at the first steps, renormalised without it",
        "EOS masked before the log-softmax for the first m steps (a default of several inference engines): the "
        "other tokens' log-probabilities rise by -log(1 - p(EOS))",
        _BEAM,
        search={"min_length": ANY, "renormalise": True},
    ),
    DecodeDeparture(
        "a minimum length: EOS disabled at the first steps (log-probability -inf)",
        "EOS's log-probability set to -inf for the first m steps, after the log-softmax (an option of toolkits: "
        "fairseq's min_len, Hugging Face's min_length)",
        _BEAM,
        search={"min_length": ANY, "renormalise": False},
    ),
)


# --------------------------------------------------------------------------------------------
# a cached decoder of the oracle's sub-layers, with a bug switched in


def _affine(x: np.ndarray, p: Mapping[str, Any], w: str) -> np.ndarray:
    b = p.get(f"b_{w}")
    return affine(x, np.asarray(p[f"w_{w}"]), None if b is None else np.asarray(b))


#: A table of positions (length, d_model) -> (length, d_model): §3.5's sinusoids, or a layout of them that departs.
Table = Callable[[int, int], np.ndarray]


def _positions(params: Mapping[str, Any], start: int, n: int, d_model: int, table: Table) -> np.ndarray:
    if "positional" in params:
        return np.asarray(params["positional"], dtype=np.float64)[start : start + n]
    return table(start + n, d_model)[start:]


def _source_mask(n_src: int, lengths: Any) -> np.ndarray | None:
    """The source padding mask (B, 1, n_src) of ``lengths``, or None."""
    return None if lengths is None else np.arange(n_src)[None, None, :] < np.asarray(lengths)[:, None, None]


def _memory(a: Mapping[str, Any], src: np.ndarray, lengths: Any, table: Table) -> tuple[np.ndarray, np.ndarray | None]:
    """The encoder's output and the source padding mask (B, 1, n_src) or None."""
    params, h, eps = a["params"], a["num_heads"], a["eps"]
    d_model = np.asarray(params["embedding"]).shape[1]
    mask = _source_mask(src.shape[1], lengths)
    x = embedding_lookup(src, params["embedding"]) + _positions(params, 0, src.shape[1], d_model, table)
    for layer in params["encoder"]:
        x = encoder_layer(x, layer, h, mask, eps=eps)
    return x, mask


def cached_logits(
    a: Mapping[str, Any],
    ops: Sequence[tuple[str, Any]],
    flags: Mapping[str, bool] | None = None,
    table: Table = positional_encoding,
) -> np.ndarray:
    """The logits of the last ``("step", tokens)`` ops of ``ops`` (concatenated since the last ``("reorder",
    index)``), run by a cached decoder of the oracle's sub-layers in float64 with the bug ``flags`` switched in.

    ``a``: the oracle's arguments (``src``, ``params``, ``num_heads``, ``src_lengths``, ``eps``). After a reorder the
    memory is the encoder's output for the reordered sources (as the suite passes it), unless ``stale_memory`` (the
    first step's memory kept, read under the padding mask of the reordered lengths each step is passed).
    Flags: ``restart`` (positions from 0 at each step), ``skip_position`` (a one-token step after a cache at position
    c + 1), ``top_left`` (the causal mask aligned top-left), ``unextended_mask`` (the new tokens' causal mask only,
    the cached positions hidden), ``mask_once`` (the source mask at the first step only), ``stale_memory``,
    ``not_reordered``, ``aliased_reorder`` (rows copied in place, in order, reading rows already overwritten),
    ``keys_no_bias``, ``keys_scaled`` (what the cache keeps of each new key), ``swapped_kv`` (the cache keeps values
    in the keys' slot and keys in the values'), ``reversed`` (new positions concatenated before the cached ones).
    ``table``: the positions where ``params`` has no learned ones (§3.5's sinusoids; a departing layout,
    ``diagnoses.CATALOGUE``'s "positional" family, for a model whose positions depart and whose cache may still be
    right).
    """
    f = dict(flags or {})
    params, h, eps = a["params"], a["num_heads"], a["eps"]
    embedding = np.asarray(params["embedding"], dtype=np.float64)
    d_model = embedding.shape[1]
    src, lengths = np.asarray(a["src"]), a["src_lengths"]
    memory, mask = _memory(a, src, lengths, table)
    cache: list[tuple[np.ndarray, np.ndarray]] | None = None
    c, first, out = 0, True, []
    for kind, value in ops:
        if kind == "reorder":
            index = np.asarray(value)
            if f.get("aliased_reorder"):  # row r := row index[r], in place, in order: a row read after it was written
                if len(index) != len(src):
                    raise ValueError("an in-place reorder keeps the batch size")
                cache = [(k.copy(), v.copy()) for k, v in cache or []]
                for pair in cache:
                    for x in pair:
                        for r, j in enumerate(index):
                            x[r] = x[j]
            elif not f.get("not_reordered"):
                cache = [(k[index], v[index]) for k, v in cache or []]
            lengths = None if lengths is None else np.asarray(lengths)[index]
            if f.get("stale_memory"):  # the first step's memory kept; the padding mask of the lengths passed now
                mask = _source_mask(src.shape[1], lengths)
            else:
                memory, mask = _memory(a, src[index], lengths, table)
            out = []
            continue
        tokens = np.asarray(value)
        k = tokens.shape[1]
        start = 0 if f.get("restart") else c + (1 if f.get("skip_position") and k == 1 and c > 0 else 0)
        y = embedding_lookup(tokens, embedding) + _positions(params, start, k, d_model, table)
        causal = np.tri(k, c + k, 0 if f.get("top_left") else c, dtype=bool)
        if f.get("unextended_mask"):
            causal[:, :c] = False  # the new tokens' own causal mask, not extended: the cached positions hidden
        step_mask = None if (f.get("mask_once") and not first) else mask
        kept = []
        for i, layer in enumerate(params["decoder"]):
            p = layer["self_attn"]
            q, k_new, v_new = (_split(_affine(y, p, w), h) for w in ("q", "k", "v"))

            def join(held: np.ndarray, new: np.ndarray) -> np.ndarray:  # (B, h, c, d), (B, h, k, d) -> (B, h, c + k, d)
                return np.concatenate((new, held) if f.get("reversed") else (held, new), axis=-2)

            keys = k_new if cache is None else join(cache[i][0], k_new)
            values = v_new if cache is None else join(cache[i][1], v_new)
            store = k_new
            if f.get("keys_no_bias") and p.get("b_k") is not None:
                store = k_new - _split(np.asarray(p["b_k"])[None, None, :], h)
            if f.get("keys_scaled"):
                store = store / math.sqrt(k_new.shape[-1])
            new = (v_new, store) if f.get("swapped_kv") else (store, v_new)  # what the cache keeps, in its slots
            kept.append(new if cache is None else (join(cache[i][0], new[0]), join(cache[i][1], new[1])))
            heads = scaled_dot_product_attention(q, keys, values, causal)
            attn = _merge(heads) @ np.asarray(p["w_o"]) + (0.0 if p.get("b_o") is None else np.asarray(p["b_o"]))
            x1 = layer_norm(y + attn, layer["norm1"]["gain"], layer["norm1"]["bias"], eps)
            cross = multi_head_attention(x1, memory, memory, layer["cross_attn"], h, step_mask)
            x2 = layer_norm(x1 + cross, layer["norm2"]["gain"], layer["norm2"]["bias"], eps)
            ffn = feed_forward(x2, **layer["ffn"])
            y = layer_norm(x2 + ffn, layer["norm3"]["gain"], layer["norm3"]["bias"], eps)
        cache, c, first = kept, c + k, False
        out.append(output_logits(y, embedding))
    return np.concatenate(out, axis=1)


def positional_variants(a: Mapping[str, Any], ops: Sequence[tuple[str, Any]]) -> list[tuple[Any, np.ndarray]]:
    """(departure, logits) for each departure of §3.5's table in ``diagnoses.CATALOGUE`` (its "positional" family):
    a right cache over positions laid out as that departure lays them out. A model whose whole forward departs there
    (a declared layout, e.g. sin and cos in two halves) is named by it in decoding too, and only where the cache adds
    no error of its own."""
    from aiayn.conformance.diagnoses.forward import CATALOGUE
    from aiayn.conformance.diagnoses.forward import positional_encoding as departing

    if "positional" in a["params"]:
        return []  # learned positions: no table to lay out otherwise
    out = []
    for departure in CATALOGUE:
        if departure.family != "positional" or departure.numerical or departure.precision:
            continue

        def table(n: int, d: int, ops_: Any = departure.ops) -> np.ndarray:
            return np.asarray(departing(n, d, ops_), dtype=np.float64)

        with np.errstate(all="ignore"):
            out.append((departure, cached_logits(a, ops, table=table)))
    return out


def _agrees(got: np.ndarray, variant: np.ndarray, budget: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        return got.shape == variant.shape and bool(np.all(np.abs(got - variant) <= budget))


@dataclass(frozen=True)
class StepDiagnosis:
    """What ``comparison.matches`` needs to name the bug a failing cached-decoding check matches: the check's name, the
    oracle's arguments, the decoder's ``ops`` as the check ran them, and the check's budget at an arithmetic
    (``budget_at(dtype)``), the expected logits."""

    check: str
    a: Mapping[str, Any]
    ops: Sequence[tuple[str, Any]]
    expected: np.ndarray
    budget_at: Callable[[str], np.ndarray]

    def explain(self, got: np.ndarray, dtype: str) -> list[str]:
        from aiayn.conformance.diagnoses.forward import PRECISION_DEPARTURES

        got = np.asarray(got, dtype=np.float64)
        budget = self.budget_at(dtype)
        names = []
        for departure in DECODING_CATALOGUE:
            if self.check not in departure.checks or not departure.flags:
                continue
            try:
                with np.errstate(all="ignore"):
                    variant = cached_logits(self.a, self.ops, departure.flags)
            except (ValueError, IndexError, KeyError, TypeError):
                continue  # no meaning for these inputs
            if _agrees(got, variant, budget) and not _agrees(variant, self.expected, budget):
                names.append(departure.name)
        if not names:
            names = [d.name for d, variant in positional_variants(self.a, self.ops) if _agrees(got, variant, budget)]
        if not names and dtype == "float64" and _agrees(got, self.expected, self.budget_at("float32")):
            # no decoding bug computes this output, and float32 arithmetic explains it
            return [PRECISION_DEPARTURES["float32"]]
        return names


@dataclass(frozen=True)
class BeamAnswer:
    """One sentence's answer of a beam search and what the oracle says of it: the ``tokens`` and ``score`` returned,
    ``log_p`` the oracle's log P(tokens | source) with the error ``bound`` it may carry, ``length`` |Y| and
    ``penalty`` §6.1's divisor of them under the declared policies (``declared``), ``eos_log_probs`` the oracle's
    log P(EOS) at each step along the tokens (teacher-forced), ``max_length`` the sentence's own and ``batch_max``
    the batch's largest, ``batch_steps()`` the step at which the oracle's search of the batch's last sentence stops
    (computed when asked: it searches the other sentences); ``search(**overrides)`` runs the oracle's search
    (``reference.decoding.beam_search``) with the declared policies and ``overrides``."""

    search: Callable[..., Any]
    tokens: tuple[int, ...]
    score: float
    log_p: float
    bound: float
    length: int
    penalty: float
    alpha: float
    declared: Mapping[str, str]
    eos_log_probs: Sequence[float]
    max_length: int
    batch_max: int
    batch_steps: Callable[[], int]

    def agrees(self, score: float, penalty: float) -> bool:
        """The score returned is ``score`` within the error over ``penalty``."""
        return abs(self.score - score) <= self.bound / penalty

    def paper(self) -> bool:
        return self.agrees(self.log_p / self.penalty, self.penalty)


def _renormalised(a: BeamAnswer, m: int) -> float:
    """log P of the answer's tokens with EOS disabled and the first ``m`` steps renormalised without it."""
    return a.log_p - float(np.sum(np.log1p(-np.exp(np.asarray(a.eos_log_probs[:m], dtype=np.float64)))))


def _overrides(departure: DecodeDeparture, a: BeamAnswer) -> list[dict[str, Any]]:
    """The oracle searches that compute ``departure`` for this sentence (one for each minimum length m it may have)."""
    kw = dict(departure.search)
    if kw.get("max_length") == BATCH:
        return [] if a.batch_max == a.max_length else [{**kw, "max_length": a.batch_max}]
    if kw.get("stop_after") == BATCH:
        return [{**kw, "stop_after": a.batch_steps()}]
    if kw.get("min_length") == ANY:
        return [{**kw, "min_length": m} for m in range(1, a.max_length)]
    return [kw]


def policy_alternatives(declared: Mapping[str, str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Every other choice of one of §6.1's open policies (``BEAM_POLICY_CHOICES``), and every pair of them."""
    singles = [
        {key: value} for key, values in BEAM_POLICY_CHOICES.items() for value in values if value != declared[key]
    ]
    pairs = [{**x, **y} for n, x in enumerate(singles) for y in singles[n + 1 :] if not set(x) & set(y)]
    return singles, pairs


def policy_name(choices: Mapping[str, str], declared: Mapping[str, str]) -> str:
    """How a failure names a search choice the implementation makes but does not declare."""
    made = ", ".join(f"{k}={v!r}" for k, v in choices.items())
    was = ", ".join(f"{k}={declared[k]!r}" for k in choices)
    return f"the search with {made} (declared {was}): declare it in policies['beam_search']"


def beam_departures(a: BeamAnswer) -> list[str]:
    """The beam-search bugs and undeclared search choices that explain an implementation's answer ``a``.

    A penalty departure is named where the score is ``a.log_p`` over its penalty (within ``a.bound`` over it) and not
    over §6.1's; a renormalised minimum length where the score is the log-probability renormalised over some first m
    steps. A departure of the search (its ``search`` overrides) is named where the oracle's search with it switched
    in (and with a penalty named above) returns exactly these tokens and this score, and the declared search does not.
    The searches are tried in tiers, simplest first, and the first tier where any reproduces the answer is named:
    the catalogue's fixed departures; each other choice of one of §6.1's open policies ("declare it"); a minimum
    length (a search for each m); each pair of other choices. Tokens alone never name a bug: a decoder with another
    defect returns other tokens too, so the score must agree as well.
    """
    names: list[str] = []
    paper = a.paper()
    penalties = [None]
    for departure in DECODING_CATALOGUE:
        if departure.penalty is None or paper:
            continue
        divisor = departure.penalty(a.length, a.alpha)
        if a.agrees(a.log_p / divisor, divisor):
            names.append(departure.name)
            penalties = [departure.penalty]
    renormalised = next(d for d in DECODING_CATALOGUE if d.search.get("renormalise") is True)
    if not paper and any(
        a.agrees(_renormalised(a, m) / a.penalty, a.penalty) for m in range(1, min(len(a.tokens), a.max_length))
    ):
        names.append(renormalised.name)

    def reproduces(**overrides: Any) -> bool:
        try:
            variant = a.search(**overrides).best
        except ValueError:
            return False
        if variant.tokens != a.tokens or not a.agrees(variant.score, variant.penalty):
            return False
        return True

    declared = a.search(penalty=penalties[0]).best
    if declared.tokens == a.tokens and a.agrees(declared.score, declared.penalty):
        return names  # the declared search (with the penalty named) gives this answer: nothing more to name
    # tiers, simplest first, the first that reproduces the answer named: the catalogue's fixed departures, one
    # undeclared choice, a minimum length (one search per m), two undeclared choices
    singles, pairs = policy_alternatives(a.declared)
    fixed, ranged = [], []
    for departure in DECODING_CATALOGUE:
        if departure.name in names or (departure.penalty is None and not departure.search):
            continue
        if departure.penalty is not None:  # its score is §6.1's (one token: lp = 1 under every penalty)
            if paper:
                fixed.append((departure.name, [{"penalty": departure.penalty}]))
            continue
        tier = ranged if departure.search.get("min_length") == ANY else fixed
        tier.append((departure.name, [{"penalty": penalties[0], **kw} for kw in _overrides(departure, a)]))
    found: list[str] = []
    for tier in (
        fixed,
        [(policy_name(c, a.declared), [{"penalty": penalties[0], **c}]) for c in singles],
        ranged,
        [(policy_name(c, a.declared), [{"penalty": penalties[0], **c}]) for c in pairs],
    ):
        found = [name for name, searches in tier if any(reproduces(**kw) for kw in searches)]
        if found:
            break
    return names + found
