"""Training as §5 says: token-budget batches, Adam(0.9, 0.98, 1e-9), Eq. (3), label smoothing, checkpoints.

Paper: §5.1 (batches by approximate length, ~25000 source + 25000 target tokens), §5.3 (Adam
β1 = 0.9, β2 = 0.98, ε = 10^-9; lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)),
§5.4 (residual dropout, label smoothing ε_ls), §6.1 (the base model averages the last 5
checkpoints, written every 10 minutes).

Choices:
    - The loss of a step is the sum over the global batch's target tokens of the smoothed cross
      entropy of §5.4 over K classes (:class:`SmoothedCrossEntropy`: the value of
      ``TorchImplementation.smoothed_cross_entropy``, the equation the conformance suite checks,
      computed from one fused log-softmax, with its closed-form gradient; ``tests/test_translation.py``
      pins both to the checked equation and its autograd gradient) divided by that batch's
      target-token count, so a step means the same whatever the number of workers.
    - The learning rate is ``TorchImplementation.lrate`` (Eq. (3)) at the 1-based step number.
    - Data parallelism: every worker builds the same global batches; batch b is split round-robin
      into ``world × accumulate`` shards; worker r runs shards r·A .. r·A + A - 1, each backward
      of (world · shard loss sum / global tokens) under DDP (which averages over workers), so the
      gradient is exactly the single-process gradient of the same shards (multiplying and dividing
      by a power of two is exact; a sum of two addends does not depend on their order).
    - Checkpoints hold the model, the optimizer, the step, the batch cursor (epoch, index), the
      RNG state, the target tokens and the training seconds so far (a time limit counts the whole
      run: a resumed run trains only for what is left of it); written to a temporary file then
      renamed (atomic on POSIX), every ``checkpoint_steps`` steps and every ``checkpoint_minutes``;
      the last ``keep`` are kept.
      Resuming restarts from the newest one: an interrupted run loses only the steps since.
    - A checkpoint is data: it holds only tensors, numbers, strings, lists and dicts, and is read with torch's
      ``weights_only`` loader, then field by field (:func:`load_checkpoint`); a file holding any other object (a
      pickle whose unpickling would run code) is refused before anything of it runs.
"""

from __future__ import annotations

import glob
import math
import os
import pickle
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aiayn.environment import UsageError
from aiayn.reproductions.translation.data import BOS, EOS, PAD, Example, batch_stream, shard, token_batches
from aiayn.reproductions.translation.model import Transformer


@dataclass
class TrainConfig:
    """Optimisation settings of one run (paper values where it gives them)."""

    max_tokens: int = 25_000  # padded tokens per global batch (§5.1: ~25000 per side)
    steps: int = 100_000  # optimizer steps (base: 100K, §5.2)
    minutes: float | None = None  # stop after this wall time (checkpointing first)
    max_train_tokens: int | None = None  # stop once this many target tokens were trained on (a fixed budget)
    warmup: int = 4000  # Eq. (3)
    lr_scale: float = 1.0  # multiplies Eq. (3) (1 = the paper)
    betas: tuple[float, float] = (0.9, 0.98)  # §5.3
    adam_eps: float = 1e-9  # §5.3
    accumulate: int = 1  # shards per worker per step (emulates more workers)
    seed: int = 1
    checkpoint_steps: int = 1000
    checkpoint_minutes: float = 10.0  # §6.1: every 10 minutes
    keep: int = 5  # checkpoints kept (and averaged: base 5, big 20)
    log_steps: int = 50
    max_len: int = 256  # training pairs longer than this (in tokens) are skipped
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """Padded tensors of one shard: source, target input (BOS + y), target output (y + EOS)."""

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.tgt_lengths.sum())


def collate(examples: Sequence[Example], idx: Sequence[int], device: str | torch.device = "cpu") -> Batch:
    """Pad one shard; targets get BOS in front (decoder input) and EOS behind (labels)."""
    src = [examples[i].src for i in idx]
    tgt = [examples[i].tgt for i in idx]
    ns, nt = max(map(len, src)), max(map(len, tgt)) + 1
    pad = lambda rows, n: torch.tensor([r + [PAD] * (n - len(r)) for r in rows], dtype=torch.long, device=device)  # noqa: E731
    return Batch(
        pad(src, ns),
        torch.tensor([len(s) for s in src], device=device),
        pad([[BOS] + t for t in tgt], nt),
        pad([t + [EOS] for t in tgt], nt),
        torch.tensor([len(t) + 1 for t in tgt], device=device),
    )


class SmoothedCrossEntropy(torch.autograd.Function):
    """§5.4's loss per position, -Σ_c q(c) log p(c) with q = (1 − ε)·onehot(target) + ε/K, and its gradient.

    Forward: log p = log_softmax(logits) once (PyTorch's fused kernel), then
    (1 − ε)·(−log p[target]) + ε·mean_c(−log p[c]), the formula of
    ``TorchImplementation.smoothed_cross_entropy``. Backward: ∂loss/∂logits = p − q, exact for
    this loss (Σ_c q(c) = 1), so autograd never differentiates the max shift of the softmax
    (which it would through the checked equation's explicit ``amax``: a full extra pass over the
    (tokens × K) logits). Shapes: logits (..., K) float, targets (...,) int64 -> (...,).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
        log_p = torch.log_softmax(logits, dim=-1)  # (..., K)
        nll = -log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (...,)
        ctx.save_for_backward(log_p, targets)
        ctx.eps = eps
        return (1.0 - eps) * nll - eps * log_p.mean(dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        log_p, targets = ctx.saved_tensors
        k = log_p.shape[-1]
        g = log_p.exp().sub_(ctx.eps / k)  # p − ε/K, (..., K)
        g.scatter_add_(
            -1, targets.unsqueeze(-1), torch.full((*targets.shape, 1), ctx.eps - 1.0, dtype=g.dtype, device=g.device)
        )
        return g.mul_(grad.unsqueeze(-1)), None, None


def smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """§5.4's smoothed cross entropy per position (see :class:`SmoothedCrossEntropy`); eps = 0 is plain NLL."""
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps: expected 0 <= eps < 1, got {eps!r}")
    return SmoothedCrossEntropy.apply(logits, targets, float(eps))


def token_losses(model: torch.nn.Module, batch: Batch, eps_ls: float) -> torch.Tensor:
    """Per-token smoothed cross entropy (§5.4), padding zeroed: (B, n_tgt)."""
    logits = model(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_lengths)
    loss = smoothed_cross_entropy(logits, batch.tgt_out, eps_ls)
    keep = torch.arange(batch.tgt_out.shape[1], device=loss.device)[None, :] < batch.tgt_lengths[:, None]
    return torch.where(keep, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@torch.no_grad()
def evaluate(model: Transformer, examples: Sequence[Example], max_tokens: int, eps_ls: float = 0.0) -> dict[str, float]:
    """Mean per-token cross entropy on ``examples`` (eps_ls = 0: plain NLL), and its perplexity."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    for idx in token_batches(examples, max_tokens):
        batch = collate(examples, idx, model.embedding.device)
        total += float(token_losses(model, batch, eps_ls).double().sum())
        tokens += batch.tokens
    model.train(was)
    nll = total / max(tokens, 1)
    return {"nll": nll, "ppl": math.exp(min(nll, 700.0)), "tokens": tokens}


# ---------------------------------------------------------------------------------------------
# checkpoints


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files ``ckpt-<step>.pt`` in ``folder``, oldest first."""
    found = [
        (int(m.group(1)), Path(p))
        for p in glob.glob(str(Path(folder) / "ckpt-*.pt"))
        if (m := re.search(r"ckpt-(\d+)\.pt$", p))
    ]
    return [p for _, p in sorted(found)]


def save_checkpoint(
    folder: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    step: int,
    cursor: tuple[int, int],
    keep: int,
    tokens: int,
    seconds: float = 0.0,
) -> Path:
    """Write ``ckpt-<step>.pt`` atomically and delete all but the newest ``keep``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-{step}.pt"
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "cursor": list(cursor),
        "rng": torch.get_rng_state(),
        "tokens": tokens,
        "seconds": seconds,
    }
    _atomic_save(state, path)
    for old in checkpoints(folder)[:-keep]:
        old.unlink()
    return path


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


#: A checkpoint's fields: (test, what is expected). ``seconds`` may be absent (0 s before this run).
_CHECKPOINT_FIELDS: dict[str, tuple[Any, str]] = {
    "model": (
        lambda v: isinstance(v, dict) and all(type(k) is str and isinstance(t, torch.Tensor) for k, t in v.items()),
        "a dict of parameter name -> tensor",
    ),
    "optimizer": (lambda v: isinstance(v, dict), "a dict (the optimizer's state_dict)"),
    "step": (_is_count, "an integer >= 0"),
    "cursor": (lambda v: isinstance(v, list) and len(v) == 2 and all(map(_is_count, v)), "a list of 2 integers >= 0"),
    "rng": (lambda v: isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1, "a uint8 tensor"),
    "tokens": (_is_count, "an integer >= 0"),
    "seconds": (lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0, "a number of seconds >= 0"),
}


def _refused(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{path}: refused, not a checkpoint of aiayn train: {why}; remove it to resume from the checkpoint before it"
    )


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint :func:`save_checkpoint` wrote, read as data: torch's ``weights_only`` loader, which builds only
    tensors, numbers, strings, lists and dicts (a file naming any other object, a pickle whose unpickling would run
    code included, is refused before anything of it runs), then each field checked by type. :class:`UsageError`,
    one line naming the file, for anything else."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\s+Please use|\n\n|$)", str(exc), re.DOTALL)
        detail = " ".join((found.group(1) if found else str(exc)).split())[:160]
        raise _refused(path, f"it holds more than tensors, numbers, strings, lists and dicts ({detail})") from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise _refused(path, f"it cannot be read as one ({detail})") from None
    if not isinstance(state, dict):
        raise _refused(path, f"it holds a {type(state).__name__}, expected a dict of the training state")
    for name, (test, expected) in _CHECKPOINT_FIELDS.items():
        if name not in state and name != "seconds":
            raise _refused(path, f"field {name!r} is missing")
        if name in state and not test(state[name]):
            raise _refused(path, f"field {name!r} is {type(state[name]).__name__}, expected {expected}")
    return state


def last_checkpoints(folder: Path, n: int) -> list[Path]:
    """The checkpoints §6.1 averages: the newest ``n`` of ``folder`` by step (all of them where fewer), oldest first."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a number of checkpoints >= 1, got {n!r}")
    return checkpoints(folder)[-n:]


def average_checkpoints(paths: Sequence[Path]) -> dict[str, torch.Tensor]:
    """Elementwise mean of the models in ``paths`` (§6.1 checkpoint averaging), accumulated in float64."""
    if not paths:
        raise ValueError("paths: expected at least one checkpoint to average, got none")
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        for name, t in load_checkpoint(p)["model"].items():
            total[name] = total.get(name, 0) + t.double()
    first = load_checkpoint(paths[0])["model"]
    return {name: (t / len(paths)).to(first[name].dtype) for name, t in total.items()}


# ---------------------------------------------------------------------------------------------
# the loop


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def _fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return (
        f"{seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def adam(parameters: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Adam:
    """§5.3's optimizer: Adam with ``cfg.betas`` and ``cfg.adam_eps``; its learning rate, 0 here, is set on each param
    group before every step (Eq. (3), in :func:`train`)."""
    return torch.optim.Adam(parameters, lr=0.0, betas=cfg.betas, eps=cfg.adam_eps)


def train(
    model: Transformer, examples: Sequence[Example], cfg: TrainConfig, folder: Path, *, log=print
) -> dict[str, Any]:
    """Train ``model`` on ``examples`` (resuming from ``folder``'s newest checkpoint); return a summary.

    Under ``torchrun`` (torch.distributed initialised) each worker runs its shards of every global
    batch and DDP all-reduces the gradients; only rank 0 logs and writes checkpoints.
    """
    rank, world = _world()
    parts = world * cfg.accumulate
    eps_ls = model.config.eps_ls
    optimizer = adam(model.parameters(), cfg)
    step, cursor, tokens_seen, seconds_before = 0, (0, 0), 0, 0.0
    found = checkpoints(folder)
    if found:
        state = load_checkpoint(found[-1], map_location=model.embedding.device)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"].cpu())
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise _refused(found[-1], f"it does not fit this model ({' '.join(str(exc).split())[:160]})") from None
        step, cursor, tokens_seen = state["step"], tuple(state["cursor"]), state["tokens"]
        seconds_before = float(state.get("seconds", 0.0))  # training time before the interruption
        if rank == 0:
            log(f"resumed from {found[-1]} at step {step}")
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    batches = [b for b in token_batches(examples, cfg.max_tokens) if len(b) >= parts]
    if not batches:
        raise ValueError(
            f"max_tokens={cfg.max_tokens}: no batch holds {parts} sentences (one per shard); raise max_tokens"
        )
    model.train()
    last_ckpt = time.perf_counter()
    start = last_ckpt - seconds_before  # the time limit counts the whole run, across resumes
    window_tokens, window_start, window_step, loss_sum, loss_tokens = 0, last_ckpt, step, 0.0, 0
    stream = batch_stream(batches, cfg.seed, cursor)

    def spent(now: float) -> bool:
        """The time limit or the token budget is used up (checked before every step and after it)."""
        return (cfg.minutes is not None and now - start > 60 * cfg.minutes) or (
            cfg.max_train_tokens is not None and tokens_seen >= cfg.max_train_tokens
        )

    while step < cfg.steps and not spent(time.perf_counter()):
        cursor, batch = next(stream)
        shards = shard(batch, parts)[rank * cfg.accumulate : (rank + 1) * cfg.accumulate]
        global_tokens = sum(len(examples[i].tgt) + 1 for i in batch)
        step += 1
        lr = cfg.lr_scale * model.impl.lrate(step, model.config.d_model, cfg.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        for a, idx in enumerate(shards):
            b = collate(examples, idx, model.embedding.device)
            sync = a == len(shards) - 1 or world == 1
            ctx = net.no_sync() if not sync else _null()
            with ctx:
                s = token_losses(net, b, eps_ls).sum()
                (s * world / global_tokens).backward()
            loss_sum += float(s.detach())
            loss_tokens += b.tokens
        optimizer.step()
        tokens_seen += global_tokens
        window_tokens += global_tokens
        now = time.perf_counter()
        out_of_time = spent(now)
        if step % cfg.log_steps == 0 or step == cfg.steps:
            rate = window_tokens / max(now - window_start, 1e-9)
            eta = (cfg.steps - step) * (now - window_start) / max(step - window_step, 1)
            if cfg.minutes is not None:
                eta = min(eta, 60 * cfg.minutes - (now - start))
            if cfg.max_train_tokens is not None:
                eta = min(eta, (cfg.max_train_tokens - tokens_seen) / max(rate, 1e-9))
            if rank == 0:
                of = (
                    f"/{cfg.steps}"
                    if cfg.max_train_tokens is None
                    else f" ({tokens_seen:,}/{cfg.max_train_tokens:,} tokens)"
                )
                log(
                    f"step {step}{of} | {rate:,.0f} tok/s | loss {loss_sum / max(loss_tokens, 1):.3f} | lr {lr:.2e} | "
                    f"ETA {_fmt_time(eta)}"
                )
            window_tokens, window_start, window_step, loss_sum, loss_tokens = 0, now, step, 0.0, 0
        wants = (
            step % cfg.checkpoint_steps == 0
            or now - last_ckpt > 60 * cfg.checkpoint_minutes
            or step == cfg.steps
            or out_of_time
        )
        if wants and rank == 0:
            save_checkpoint(folder, model, optimizer, step, _after(cursor), cfg.keep, tokens_seen, now - start)
            last_ckpt = now
        if out_of_time:
            break
    if world > 1:
        dist.barrier()
    return {"steps": step, "tokens": tokens_seen, "seconds": time.perf_counter() - start, "config": asdict(cfg)}


def _after(cursor: tuple[int, int]) -> tuple[int, int]:
    """The cursor of the batch after ``cursor`` (what a resumed run reads first)."""
    return cursor[0], cursor[1] + 1


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
