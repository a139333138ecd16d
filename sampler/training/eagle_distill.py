"""The eagle head's batched ``ce`` stage (``sampler.drafters.eagle``; docs/design.md §7):
distillation of the target's processed law on rollout shards
(``sampler.training.rollouts.RolloutShard``, made by ``bench.eagle_data``).

``AnchorData`` flattens the shards and computes the target's top-k logits at every position
once. A step draws ``EagleDistillConfig.batch`` roots across all rollouts; from each root the head
runs L levels on its own states, fed the target's continuation (EAGLE-3's training-time test,
Li et al. 2025 §3), and level ℓ is fitted to the target's top-k law there by cross-entropy
(``distill_loss``, weight level_decay^(ℓ−1)). ``validate`` measures one-draft acceptance per
level, 1 − TV of the processed laws on the target's path. The draft vocabulary
(``draft_vocabulary``) is the N tokens with the most teacher probability over the training
positions. The on-policy MDraft post-training is ``sampler.training.eagle_train.train``.
``distill_eagle`` is ``poissonmark distill --drafter eagle``'s run: this stage on the model's
own rollouts (``sampler.training.rollouts.prepare_data``), resumable, into one directory.

Shapes: N flat positions, M roots, B roots of a step, k teacher tokens, L levels, V vocabulary,
d hidden size.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from sampler.drafters.eagle import EagleHead, new_eagle
from sampler.drafters.heads import output_head
from sampler.targets.cpu_features import native_bfloat16
from sampler.training.optimiser import Checkpoint, Optimisation, Optimiser, TrainLog
from sampler.training.rollouts import Rollout, RolloutShard


@dataclass(frozen=True)
class AnchorData:
    """Rollout shards (``sampler.training.rollouts.RolloutShard``) flattened for batched
    distillation.

    Flat index g is position a of one rollout; ``hidden[g]`` is h_a, ``tokens[g]`` is x_a.
    A root g drafts from (h_{a−1}, x_a) = (hidden[g − 1], tokens[g]); level ℓ's teacher is the
    target's law p(·|x_{≤a+ℓ−1}), top-k ``top_k`` of ``teacher_logits[g + ℓ − 1]`` (the
    target's logits at T = 1 on its k best tokens ``teacher_tokens``, computed once), valid
    while x_{a+ℓ} exists (g + ℓ ≤ ``last[g]``).

    Attributes:
        hidden: (N, d) bfloat16; tokens: (N,) int64; last: (N,) int64 the flat index of the
            row's last position.
        teacher_tokens: (N, k) int64; teacher_logits: (N, k) float32.
        roots: (M,) int64 flat indices of the roots (a >= prompt_len − 1, a + 1 <= end).
    """

    hidden: torch.Tensor
    tokens: torch.Tensor
    last: torch.Tensor
    teacher_tokens: torch.Tensor
    teacher_logits: torch.Tensor
    roots: torch.Tensor

    @classmethod
    @torch.inference_mode()
    def from_shards(
        cls, target: PreTrainedModel, shards: Sequence[Any], top_k: int = 50, chunk: int = 4096
    ) -> AnchorData:
        """Flatten ``shards`` and compute the teachers' top-k logits with the target's LM head
        (in its dtype, ``chunk`` rows at a time)."""
        hidden, tokens, last, roots = [], [], [], []
        offset = 0
        for shard in shards:
            start = shard.prompt_len - 2  # hidden[i][0] is position prompt_len − 2
            for ids, h in zip(shard.ids, shard.hidden, strict=True):
                n = len(ids) - start
                hidden.append(h)
                tokens.append(ids[start:].long())
                last.append(torch.full((n,), offset + n - 1, dtype=torch.long))
                roots.append(torch.arange(offset + 1, offset + n - 1))
                offset += n
        flat = torch.cat(hidden)
        head = output_head(target)
        top_tokens, top_logits = [], []
        for i in range(0, len(flat), chunk):
            rows = flat[i : i + chunk].to(head.weight.device, head.weight.dtype)
            values, indices = head(rows).float().topk(top_k, -1)
            top_tokens.append(indices.cpu())
            top_logits.append(values.cpu())
        return cls(
            flat,
            torch.cat(tokens),
            torch.cat(last),
            torch.cat(top_tokens),
            torch.cat(top_logits),
            torch.cat(roots),
        )

    @classmethod
    def from_rollouts(
        cls,
        target: PreTrainedModel,
        rollouts: Sequence[Rollout],
        hiddens: Sequence[torch.Tensor],
        top_k: int = 50,
    ) -> AnchorData:
        """``from_shards`` over one-rollout shards of ``rollouts`` with their (T, d) hidden
        states (``sampler.training.rollouts.prepare_data``'s); rollouts whose prompt has fewer
        than 2 tokens hold no root and are left out.

        Raises:
            ValueError: no rollout is left.
        """
        shards = [
            RolloutShard(
                seq.id,
                seq.prompt_len,
                1.0,
                0,
                [torch.tensor(seq.ids, dtype=torch.int32)],
                [hidden[seq.prompt_len - 2 :].to(torch.bfloat16)],
            )
            for seq, hidden in zip(rollouts, hiddens, strict=True)
            if seq.prompt_len >= 2
        ]
        if not shards:
            raise ValueError("no rollout with a prompt of 2 tokens or more")
        return cls.from_shards(target, shards, top_k)

    def to(self, device: torch.device) -> AnchorData:
        """The same data with every tensor on ``device``."""
        return AnchorData(*(getattr(self, f.name).to(device) for f in fields(self)))


def distill_loss(
    head: EagleHead,
    target: PreTrainedModel,
    data: AnchorData,
    roots: torch.Tensor,
    lookahead: int,
    level_decay: float = 0.8,
    temperature: float = 1.0,
    measure: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``ce`` objective on a batch of roots: the head runs L levels on its own states fed
    the target's continuation (EAGLE-3's training-time test); level ℓ's loss is the cross-
    entropy −Σ_x p'(x) log q(x) of the head's law at ``temperature`` against the target's
    processed law p' (top-k of the target at ``temperature``: what the decoder races), weighted
    by ``level_decay``^(ℓ−1) (deeper levels are reached less often).

    Args:
        roots: (A,) flat root indices (``AnchorData.roots``).
        measure: also measure the acceptance (a top-k over the vocabulary per level).
    Returns:
        (the weighted mean loss, (L,) per-level mean 1 − TV(p', q') of the processed laws
        (q' = top-k of q): the acceptance of one draft at each level, on the target's path;
        empty unless ``measure``).
    """
    embed = target.get_input_embeddings()
    k = data.teacher_tokens.shape[1]
    drafted = head.draft_tokens
    slot = None  # vocabulary id -> column of the draft vocabulary (-1: not drafted)
    if drafted is not None:
        slot = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=drafted.device)
        slot[drafted] = torch.arange(drafted.numel(), device=drafted.device)
    state, past = head.advance(data.hidden[roots - 1], embed(data.tokens[roots]), None)
    losses, accept, weights = [], [], []
    for level in range(lookahead):
        index = roots + level  # the teacher of level ℓ = level + 1 reads h_{a+ℓ−1}
        valid = (index + 1 <= data.last[roots]).float()
        index = torch.minimum(index, data.last[roots])
        logits = head.draft_logits(target, state).float()
        log_q = torch.log_softmax(logits if temperature == 1 else logits / temperature, -1)
        p = torch.softmax(data.teacher_logits[index] / temperature, -1)
        teacher = data.teacher_tokens[index]
        if slot is None:
            cross = -(p * log_q.gather(1, teacher)).sum(-1)
        else:  # a teacher token outside the draft vocabulary cannot be drafted: no term
            columns = slot[teacher]
            inside = columns >= 0
            cross = -(p * inside * log_q.gather(1, columns.clamp(min=0))).sum(-1)
        weight = valid * level_decay**level
        losses.append((cross * weight).sum())
        weights.append(weight.sum())
        if measure:
            with torch.no_grad():
                q_top, q_columns = log_q.topk(k, -1)
                q = torch.softmax(q_top, -1)
                q_tokens = q_columns if drafted is None else drafted[q_columns]
                p_full = p.new_zeros((p.shape[0], head.config.vocab_size))
                p_full.scatter_(1, teacher, p)
                overlap = torch.minimum(p_full.gather(1, q_tokens), q).sum(-1)
                accept.append((overlap * valid).sum() / valid.sum().clamp(min=1))
        if level + 1 < lookahead:
            nxt = torch.minimum(roots + level + 1, data.last[roots])
            state, past = head.advance(state, embed(data.tokens[nxt]), past)
    loss = torch.stack(losses).sum() / torch.stack(weights).sum().clamp(min=1)
    return loss, torch.stack(accept) if accept else torch.empty(0)


def mixed_precision(device: torch.device) -> torch.autocast:
    """bfloat16 autocast where bfloat16 matrix products are native (CUDA; a CPU with AMX
    bfloat16), else off: float32 (an emulated bfloat16 product is many times slower)."""
    native = device.type == "cuda" or (device.type == "cpu" and native_bfloat16())
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=native)


@dataclass(frozen=True, kw_only=True)
class EagleDistillConfig(Optimisation):
    """The batched ``ce`` stage (``fit``); optimiser settings:
    ``sampler.training.optimiser.Optimisation``.

    Attributes:
        lookahead: L levels unrolled per root.
        steps, batch: optimiser steps and roots per step.
        level_decay: level ℓ's loss weight is level_decay^(ℓ−1).
        seed: root sampling and the fresh head's initialisation.
        checkpoint_every: steps between ``fit``'s checkpoints (the last step is always saved).
    Raises:
        ValueError: naming the field and its range.
    """

    lookahead: int = 6
    steps: int = 1000
    batch: int = 256
    warmup: int = 50
    level_decay: float = 0.8
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least(batch=1, checkpoint_every=1)
        if not 0 < self.level_decay <= 1:
            raise ValueError(f"level_decay must be in (0, 1], got {self.level_decay}")


def fit(
    target: PreTrainedModel,
    data: AnchorData,
    config: EagleDistillConfig,
    init: EagleHead | None = None,
    on_step: Callable[[EagleHead, TrainLog], None] | None = None,
    draft_tokens: torch.Tensor | None = None,
    checkpoint: Checkpoint | None = None,
) -> tuple[EagleHead, TrainLog]:
    """Train a head (float32 weights, ``mixed_precision``) by ``distill_loss`` on roots drawn
    uniformly from ``data`` (with replacement across steps) on the target's device;
    ``draft_tokens``: a fresh head's draft vocabulary (``new_eagle``; ``init``'s own
    otherwise). With a ``checkpoint``, a run resumes from its file where one exists (its steps
    are not repeated: an interrupted run ends with the weights of an uninterrupted one) and
    saves to it every ``config.checkpoint_every`` steps and after the last.

    Raises:
        ValueError: ``data`` has no root; ``Checkpoint.restore``'s errors.
    """
    if data.roots.numel() == 0:
        raise ValueError("no root in the training data")
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(config.seed)
    if init is not None:
        draft_tokens = init.draft_tokens
    head = new_eagle(target, "ce", draft_tokens).float()
    if init is not None:
        head.load_state_dict(init.state_dict())
    head.train()
    optimiser = Optimiser(head, config)
    generator = torch.Generator().manual_seed(config.seed)
    device = next(target.parameters()).device
    data = data.to(device)
    log = checkpoint.restore(head, optimiser, generator) if checkpoint else TrainLog()
    while log.steps < config.steps:
        started = time.perf_counter()
        pick = torch.randint(0, data.roots.numel(), (config.batch,), generator=generator)
        with mixed_precision(device):
            loss, _ = distill_loss(
                head, target, data, data.roots[pick.to(device)], config.lookahead,
                config.level_decay,
            )  # fmt: skip
        entry = optimiser.step(loss)
        log.steps += 1
        log.seconds += time.perf_counter() - started
        log.log.append({**entry, "step": log.steps})
        if checkpoint and (log.steps % config.checkpoint_every == 0 or log.steps == config.steps):
            checkpoint.save(head, optimiser, generator, log)
        if on_step is not None:
            on_step(head, log)
    return head.eval(), log


@torch.inference_mode()
def validate(
    head: EagleHead,
    target: PreTrainedModel,
    data: AnchorData,
    lookahead: int,
    roots: int = 2048,
    temperature: float = 1.0,
    seed: int = 99,
) -> list[float]:
    """(L,) per-level one-draft acceptance 1 − TV(p', q') on the target's path (``distill_loss``)
    at ``temperature``, over ``roots`` roots of ``data`` drawn with a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    pick = torch.randperm(data.roots.numel(), generator=generator)[:roots]
    device = next(target.parameters()).device
    data = data.to(device)
    totals = torch.zeros(lookahead, dtype=torch.float64)
    chunks = 0
    for part in torch.split(data.roots[pick.to(device)], 512):
        with mixed_precision(device):
            _, accept = distill_loss(head, target, data, part, lookahead, 1.0, temperature, True)
        totals += accept.double().cpu()
        chunks += 1
    return (totals / max(chunks, 1)).tolist()


def teacher_mass(tokens: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) float64: each token's teacher probability summed over positions, from (N, k)
    int64 ``tokens`` and (N, k) ``probs`` (a top-k law per position). ``mass[S].sum() / N`` is
    the mean probability on a token set S (``vocabulary_coverage``)."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    mass.index_add_(0, tokens.flatten(), probs.double().flatten())
    return mass


def draft_vocabulary(data: AnchorData, size: int, vocab_size: int) -> torch.Tensor:
    """(size,) int64 sorted token ids: the ``size`` tokens with the most teacher probability
    (top-k laws at T = 1) summed over ``data``'s positions, a draft vocabulary for
    ``new_eagle`` (EAGLE-3 §3 drafts over a reduced vocabulary the same way).

    Raises:
        ValueError: ``size`` outside [1, vocab_size].
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {size}")
    laws = torch.softmax(data.teacher_logits, -1)
    mass = teacher_mass(data.teacher_tokens, laws, vocab_size)
    return mass.topk(size).indices.sort().values


def vocabulary_coverage(data: AnchorData, tokens: torch.Tensor, vocab_size: int) -> float:
    """The mean teacher probability (top-k laws at T = 1) on ``tokens`` over ``data``'s
    positions: an upper bound on a draft of that vocabulary's acceptance there."""
    laws = torch.softmax(data.teacher_logits, -1)
    mass = teacher_mass(data.teacher_tokens, laws, vocab_size)
    return float(mass[tokens].sum()) / max(data.teacher_tokens.shape[0], 1)


def narrowed(head: EagleHead, tokens: torch.Tensor) -> EagleHead:
    """A copy of ``head`` drafting over ``tokens`` only: the same trained weights, the draft
    vocabulary cut to a subset of its own (its LM-head rows for those tokens). Its law is the
    head's, conditioned on the subset: a smaller drafting step (the rows are most of a level's
    bytes) for the mass left out; exactness never depends on it (MPFR paper Thm. 5.1).

    Args:
        head: an eagle head (any draft vocabulary, or the whole vocabulary).
        tokens: (N,) int64 distinct token ids of ``head``'s draft vocabulary, fewer than it has.
    Raises:
        ValueError: tokens that repeat, lie outside the head's draft vocabulary, or are all of it.
    """
    vocab = int(head.config.vocab_size)
    own = torch.arange(vocab) if head.draft_tokens is None else head.draft_tokens.cpu()
    tokens = tokens.cpu().long()
    if (
        tokens.numel() == 0
        or torch.unique(tokens).numel() != tokens.numel()
        or not bool(torch.isin(tokens, own).all())
    ):
        raise ValueError("narrowed: tokens must be distinct ids of the head's draft vocabulary")
    if tokens.numel() >= own.numel():
        raise ValueError(
            f"narrowed: {tokens.numel()} tokens do not narrow a draft vocabulary of {own.numel()}"
        )
    config = replace(head.config, draft_vocab=int(tokens.numel()))
    param = head.fuse.weight
    out = EagleHead(config).to(param.device, param.dtype)
    state = head.state_dict()
    state["draft_tokens"] = tokens.sort().values.to(param.device)
    out.load_state_dict(state)
    return out.eval()


@dataclass(frozen=True)
class EagleRun:
    """What ``distill_eagle`` did.

    Attributes:
        head: the trained head (float32, eval mode), also saved in the run's directory.
        log: its steps, wall seconds of the steps (over every resumed part) and per-step entries.
        resumed_from: the step the run resumed from (0: a fresh run).
        draft_vocab: N, the head's draft vocabulary (0: the whole vocabulary).
        roots: training roots (``AnchorData.roots``).
    """

    head: EagleHead
    log: TrainLog
    resumed_from: int
    draft_vocab: int
    roots: int


def distill_eagle(
    target: PreTrainedModel,
    rollouts: Sequence[Rollout],
    hiddens: Sequence[torch.Tensor],
    config: EagleDistillConfig,
    out_dir: Path,
    draft_vocab: int = 16384,
    on_step: Callable[[EagleHead, TrainLog], None] | None = None,
) -> EagleRun:
    """The eagle head for ``target`` from its own rollouts (``prepare_data``'s train split with
    their hidden states): ``AnchorData.from_rollouts``, the draft vocabulary of the
    ``draft_vocab`` tokens with the most teacher probability (``draft_vocabulary``; 0, or the
    vocabulary's size or more: the whole vocabulary), then ``fit``, resumable from
    ``out_dir/checkpoint.pt``. Writes ``out_dir/eagle.*`` (``EagleHead.save``) and
    ``out_dir/training.json`` (config, steps, seconds, per-step log).

    Raises:
        ValueError: ``draft_vocab`` < 0, rollouts without roots, a checkpoint of another run.
    """
    if draft_vocab < 0:
        raise ValueError(f"draft_vocab must be >= 0, got {draft_vocab}")
    data = AnchorData.from_rollouts(target, rollouts, hiddens)
    vocab = int(target.config.vocab_size)
    size = draft_vocab if 0 < draft_vocab < vocab else 0
    tokens = draft_vocabulary(data, size, vocab) if size else None
    run = {k: v for k, v in asdict(config).items() if k != "checkpoint_every"}
    run["data"] = hashlib.sha256(json.dumps([r.ids for r in rollouts]).encode()).hexdigest()
    run["draft_vocab"] = size
    checkpoint = Checkpoint(out_dir / "checkpoint.pt", run)
    head, log = fit(target, data, config, None, on_step, tokens, checkpoint)
    head.save(out_dir)
    record = {
        "run": checkpoint.run,
        "steps": log.steps,
        "train_seconds": log.seconds,
        "resumed_from": checkpoint.resumed_from,
        "roots": int(data.roots.numel()),
        "log": log.log,
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return EagleRun(head, log, checkpoint.resumed_from, size, int(data.roots.numel()))
