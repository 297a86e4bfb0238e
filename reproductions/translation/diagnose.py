"""Why beam search repeats: decoding variants, repetition rates, and the model's own scores.

An undertrained translation model's beam search emits loops ("der Fürsten der Fürsten der
Fürsten ..."). Three explanations are told apart by measurement, on the test books of a finished
run:

- **a bug** in the search or its cached decoder: then the log-probability the search accumulated
  for its output differs from the same output rescored by a plain teacher-forced pass (no cache,
  no reordering), computed here in float64;
- **the length penalty** (§6.1's α = 0.6 rewards length): then looping falls as α falls; the
  same model is decoded at α = 0, the run's α, and α = 1, and greedily;
- **the model**: then the model itself scores the looping output above the reference
  (length-normalised as the search scores it), i.e. the search found what the model prefers.

:func:`diagnose` returns every number; the training report (``report.py``) states the verdict.
Runtime: two extra beam decodes, one greedy decode and three teacher-forced rescorings of the
test books (a minute or two on the CPU preset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from aiayn.reproductions.bleu_scoring import chrf, repetition_rate, sacre_bleu
from aiayn.reproductions.translation.data import EOS, Example, Vocab  # noqa: F401 (unused; kept in the measured code, see code_hash)
from aiayn.reproductions.translation.decode import beam_search, greedy, length_penalty, max_lengths
from aiayn.reproductions.translation.train import collate

#: α values decoded besides the run's own (§6.1: 0.6).
ALPHAS = (0.0, 1.0)
#: Per-sentence |search log P − teacher-forced log P| (nats) below which the two count as the same
#: computation. A wrong cached key/value or a wrong beam reordering changes a step's context, which
#: moves that step's log-probability by the order of the per-token log-probabilities themselves
#: (nats); float32 rounding moves a whole sentence's by far less (the diagnosis measures it as the
#: gap between a float32 and a float64 teacher-forced pass, ``float32_rounding_max_abs_nats``).
AGREE_NATS = 1e-2


def decode_all(
    model, examples: Sequence[Example], *, beam: int, alpha: float, sentences: int
) -> list[tuple[list[int], float | None, float | None]]:
    """(output ids, search score or None, search log P or None) per example, in the original order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))
    out: dict[int, tuple[list[int], float | None, float | None]] = {}
    device = model.embedding.device
    for k in range(0, len(order), sentences):
        idx = order[k : k + sentences]
        b = collate(examples, idx, device)
        if beam == 0:
            out.update({i: (seq, None, None) for i, seq in zip(idx, greedy(model, b.src, b.src_lengths))})
        else:
            out.update(dict(zip(idx, beam_search(model, b.src, b.src_lengths, beam=beam, alpha=alpha, scores=True))))
    return [out[i] for i in range(len(examples))]


@torch.no_grad()
def teacher_forced_logprob(
    model,
    examples: Sequence[Example],
    outputs: Sequence[list[int]],
    with_eos: Sequence[bool],
    sentences: int = 32,
    *,
    float64: bool = True,
) -> list[float]:
    """log P(output (+ EOS) | source) per example by one teacher-forced pass (no cache, no beam).

    With ``float64`` the model is copied to float64, so that the rescoring's own rounding is
    negligible; without, the model's own float32.
    """
    exact = _float64_copy(model) if float64 else model
    pairs = [Example(e.src, list(y)) for e, y in zip(examples, outputs)]
    scores = [0.0] * len(pairs)
    for k in range(0, len(pairs), sentences):
        idx = list(range(k, min(k + sentences, len(pairs))))
        b = collate(pairs, idx, model.embedding.device)
        logp = torch.log_softmax(exact(b.src, b.src_lengths, b.tgt_in, b.tgt_lengths), dim=-1)  # (B, n, V) float64
        picked = logp.gather(-1, b.tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, n)
        for row, i in enumerate(idx):
            n = len(pairs[i].tgt) + (1 if with_eos[i] else 0)
            scores[i] = float(picked[row, :n].sum())
    return scores


def _float64_copy(model):
    copy = type(model)(
        model.config,
        model.vocab_size,
        max_positions=model.max_positions,
        device=str(model.embedding.device),
        attention_tile=model.attention_tile,
    )
    copy.load_state_dict(model.state_dict())
    return copy.double().eval()


def _stats(
    hyps: list[str], refs: list[str], outputs: Sequence[list[int]], src_lengths: Sequence[int]
) -> dict[str, Any]:
    rep = repetition_rate(hyps)
    s = sacre_bleu(hyps, refs)
    limits = max_lengths(torch.tensor(src_lengths)).tolist()
    return {
        "sacrebleu": s.score,
        "bp": s.bp,
        "sys_len": s.sys_len,
        "ref_len": s.ref_len,
        "chrf": chrf(hyps, refs).score,
        "repetition_rate": rep.rate,
        "looping_lines": rep.looping_lines,
        "lines": rep.lines,
        "at_max_length": sum(len(o) >= lim for o, lim in zip(outputs, limits)),
    }


def diagnose(
    model,
    examples: Sequence[Example],
    vocab: Vocab,
    refs: list[str],
    *,
    beam: int,
    alpha: float,
    main: Sequence[tuple[list[int], float, float]],
    sentences: int = 32,
) -> dict[str, Any]:
    """Every measurement of the module docstring for one finished run; ``main`` is its beam-α decode (with scores)."""
    model.eval()
    src_lengths = [len(e.src) for e in examples]
    limits = max_lengths(torch.tensor(src_lengths)).tolist()
    decodes: dict[str, list] = {f"beam {beam}, α = {alpha:g}": list(main)}
    for a in ALPHAS:
        if a != alpha:
            decodes[f"beam {beam}, α = {a:g}"] = decode_all(model, examples, beam=beam, alpha=a, sentences=sentences)
    decodes["greedy"] = decode_all(model, examples, beam=0, alpha=0.0, sentences=sentences)
    table = {}
    for label, outs in decodes.items():
        ids = [o[0] for o in outs]
        table[label] = _stats([vocab.decode(y) for y in ids], refs, ids, src_lengths)
        table[label]["alpha"] = None if label == "greedy" else float(label.rsplit("= ", 1)[1])
    main_ids = [o[0] for o in main]
    cut = [len(y) >= lim for y, lim in zip(main_ids, limits)]
    rescored = teacher_forced_logprob(model, examples, main_ids, [not c for c in cut], sentences)
    diffs = [abs(r - o[2]) for r, o in zip(rescored, main)]
    rounding = [
        abs(r - r32)
        for r, r32 in zip(
            rescored, teacher_forced_logprob(model, examples, main_ids, [not c for c in cut], sentences, float64=False)
        )
    ]
    greedy_ids = [o[0] for o in decodes["greedy"]]
    greedy_cut = [len(y) >= lim for y, lim in zip(greedy_ids, limits)]
    greedy_lp = teacher_forced_logprob(model, examples, greedy_ids, [not c for c in greedy_cut], sentences)
    ref_ids = [e.tgt for e in examples]
    ref_lp = teacher_forced_logprob(model, examples, ref_ids, [True] * len(examples), sentences)

    def norm(logp: float, n_tokens: int, with_eos: bool) -> float:
        return logp / length_penalty(n_tokens + (1 if with_eos else 0), alpha)

    beam_n = [norm(r, len(y), not c) for r, y, c in zip(rescored, main_ids, cut)]
    greedy_n = [norm(r, len(y), not c) for r, y, c in zip(greedy_lp, greedy_ids, greedy_cut)]
    ref_n = [norm(r, len(y), True) for r, y in zip(ref_lp, ref_ids)]
    looping = [bool(repetition_rate([vocab.decode(y)]).looping_lines) for y in main_ids]
    prefer = [b > r for b, r in zip(beam_n, ref_n)]
    return {
        "decodes": table,
        "rescoring": {
            "max_abs_nats": max(diffs),
            "mean_abs_nats": sum(diffs) / len(diffs),
            "sentences": len(diffs),
            "tokens": sum(len(y) + (0 if c else 1) for y, c in zip(main_ids, cut)),
            "agree_nats": AGREE_NATS,
            "agree": max(diffs) <= AGREE_NATS,
            "float32_rounding_max_abs_nats": max(rounding),
        },
        "model_prefers_output_over_reference": sum(prefer),
        "looping_outputs": sum(looping),
        "model_prefers_looping_output_over_reference": sum(p for p, lo in zip(prefer, looping) if lo),
        "beam_scores_at_least_greedy": sum(b >= g for b, g in zip(beam_n, greedy_n)),
        "sentences": len(examples),
        "alpha": alpha,
        "beam": beam,
        "mean_normalised_logprob": {
            "beam": sum(beam_n) / len(beam_n),
            "greedy": sum(greedy_n) / len(greedy_n),
            "reference": sum(ref_n) / len(ref_n),
        },
    }
