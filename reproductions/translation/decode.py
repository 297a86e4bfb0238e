"""Decoding as §6.1 says: beam search, beam 4, length penalty α = 0.6, maximum length input + 50.

Paper: §6.1 ("We used beam search with a beam size of 4 and length penalty α = 0.6 ... We set the
maximum output length during inference to input length + 50, but terminate early when possible").
The length penalty is GNMT's (Wu et al. 2016, Eq. (14)): lp(Y) = ((5 + |Y|) / 6)^α, and a
finished hypothesis scores log P(Y|X) / lp(Y).

Choices (the paper is silent):
    - |Y| counts the generated tokens including the final EOS (as tensor2tensor's beam search).
    - Each step expands the K alive hypotheses, takes the best 2K continuations, and keeps the K
      best that do not end in EOS alive; a continuation that ends in EOS is finished only if it is
      among the best K of the 2K (so beam 1 never finishes a hypothesis greedy search would not).
    - Early stopping (tensor2tensor's bound): a sentence stops when its best finished score
      exceeds the best alive log-probability divided by lp(maximum length) — log-probabilities
      only fall as tokens are added and lp only grows, so no alive hypothesis can still win.
    - At the maximum length the alive hypotheses are finished as they stand.
    - "Input length" is the source's token count without its EOS.
    - With α = 0 beam 1 equals greedy search (tested); with α > 0 beam 1 may prefer a longer
      output than greedy's, as the length penalty intends.
"""

from __future__ import annotations

import torch

from aiayn.reproductions.translation.data import BOS, EOS


def length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src_lengths: torch.Tensor, extra: int = 50) -> torch.Tensor:
    """Maximum output length per sentence: input length (without EOS) + ``extra`` (§6.1)."""
    return (src_lengths - 1).clamp(min=1) + extra


@torch.no_grad()
def greedy(model, src: torch.Tensor, src_lengths: torch.Tensor, extra: int = 50) -> list[list[int]]:
    """Argmax decoding with the incremental decoder; outputs without BOS/EOS."""
    model.eval()
    memory, mask = model.encode(src, src_lengths)
    state = model.start_state(memory, mask)
    limit = max_lengths(src_lengths, extra)
    b = src.shape[0]
    tokens = torch.full((b,), BOS, dtype=torch.long, device=src.device)
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for t in range(int(limit.max())):
        tokens = model.step(tokens, state).argmax(-1)
        for i in range(b):
            if not done[i]:
                if int(tokens[i]) == EOS:
                    done[i] = True
                else:
                    out[i].append(int(tokens[i]))
                    done[i] = t + 1 >= int(limit[i])
        if all(done):
            break
    return out


@torch.no_grad()
def beam_search(
    model,
    src: torch.Tensor,
    src_lengths: torch.Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    extra: int = 50,
    *,
    scores: bool = False,
) -> list[list[int]] | list[tuple[list[int], float, float]]:
    """Beam search with GNMT length penalty and early stopping (§6.1); outputs without BOS/EOS.

    With ``scores``: (output, log P(output + EOS | source) / lp, log P(output + EOS | source)) per
    sentence, the log-probability as the search accumulated it (what the decoding diagnosis
    compares with a teacher-forced rescoring; a hypothesis cut at the maximum length has no EOS).
    """
    if beam < 1:
        raise ValueError(f"beam: expected a positive beam size, got {beam}")
    model.eval()
    b, k = src.shape[0], beam
    memory, mask = model.encode(src, src_lengths)
    state = model.start_state(memory.repeat_interleave(k, 0), mask.repeat_interleave(k, 0))
    limit = max_lengths(src_lengths, extra).tolist()
    device = src.device
    alive_logp = torch.full((b, k), -torch.inf, device=device)
    alive_logp[:, 0] = 0.0  # only the first copy expands at step 0
    alive_seq = torch.full((b, k, 0), BOS, dtype=torch.long, device=device)
    tokens = torch.full((b * k,), BOS, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int], float]]] = [[] for _ in range(b)]  # (score, output, log P)
    done = [False] * b
    for t in range(max(limit)):
        logp = torch.log_softmax(model.step(tokens, state).float(), -1).view(b, k, -1)
        vocab = logp.shape[-1]
        cand = (alive_logp[..., None] + logp).view(b, k * vocab)
        top, ids = cand.topk(2 * k, dim=-1)  # (b, 2k), best first
        src_beam, tok = ids // vocab, ids % vocab
        is_eos = tok == EOS
        lp = length_penalty(t + 1, alpha)
        for i in range(b):
            if done[i]:
                continue
            for j in range(k):  # EOS continuations among the best k finish
                if is_eos[i, j] and torch.isfinite(top[i, j]):
                    finished[i].append(
                        (float(top[i, j]) / lp, alive_seq[i, int(src_beam[i, j])].tolist(), float(top[i, j]))
                    )
        keep_score = torch.where(is_eos, -torch.inf, top)
        new_logp, pick = keep_score.topk(k, dim=-1)  # (b, k): best k non-EOS continuations
        beams, toks = src_beam.gather(1, pick), tok.gather(1, pick)
        alive_seq = torch.cat(
            (alive_seq.gather(1, beams[..., None].expand(-1, -1, alive_seq.shape[2])), toks[..., None]), 2
        )
        alive_logp = new_logp
        for i in range(b):
            if done[i]:
                continue
            if t + 1 >= limit[i]:  # maximum length: finish the alive ones as they stand
                finished[i] += [
                    (float(alive_logp[i, j]) / lp, alive_seq[i, j].tolist(), float(alive_logp[i, j]))
                    for j in range(k)
                    if torch.isfinite(alive_logp[i, j])
                ]
                done[i] = True
            elif finished[i]:
                bound = float(alive_logp[i, 0]) / length_penalty(limit[i], alpha)
                done[i] = max(f[0] for f in finished[i]) > bound
            if done[i]:
                alive_logp[i] = -torch.inf
        if all(done):
            break
        index = (torch.arange(b, device=device)[:, None] * k + beams).view(-1)
        state = model.reorder(state, index)
        tokens = toks.reshape(-1)
    best = [max(f, key=lambda s: s[0]) for f in finished]
    return [(seq, score, logp) for score, seq, logp in best] if scores else [seq for _, seq, _ in best]
