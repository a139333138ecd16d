"""Training the eagle head (``sampler.eagle``) on the target's own continuations (DESIGN §7).

Data: ``sampler.rollouts.prepare_data`` — target rollouts at temperature 1 on the train split of
the prompts and the target's final hidden states over them (cached). A step takes one rollout
and A anchors a (root positions); the head starts from (h_{a−1}, x_a) and runs L levels on its
own states, as it drafts (EAGLE-3's training-time test, Li et al. 2025 §3):

- ``ce`` (the off-policy baseline): level ℓ is fed the target's continuation x_{a+ℓ−1} and is
  fitted to x_{a+ℓ} by cross-entropy with DFlash weights (``sampler.mdraft.off_policy_loss``).
- on-policy (``mdraft``, ``rkl``, ``fkl``; MDraft paper Alg. 1): K draft chains per anchor, each
  level's token sampled from the head's own law at temperature 1; the frozen target scores the
  A·K blocks in ONE forward (``sampler.distill.verifier_laws``) and the head's per-chain laws
  q_ℓ^{(k)} = q(·| c, x^{(k)}_{<ℓ}) are fitted to the blended targets
  r_ℓ^{(k)} ∝ (p_ℓ^{(k)})^{1−α} (p̂_ℓ)^α by reverse KL with survival weights
  (``sampler.mdraft.on_policy_loss``, Eq. 1-2, App. D). An autoregressive drafter sees its
  prefix, so the blend only pools the verifier's evidence across the K prefixes; with K = 1 it
  is per-prefix reverse KL.

AdamW with a cosine schedule, gradient clipping; sequence order, anchors and sampled chains all
come from generators seeded by ``EagleTrainConfig.seed`` (training randomness only; nothing
here is keyed). ``evaluate`` gives τ, the expected acceptance length of standard speculative
sampling with one chain of L drafts (``sampler.distill.evaluate``'s measure), on held-out
rollouts.

Shapes: A anchors, K chains, L levels, V vocabulary, d hidden size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from sampler.distill import anchor_positions, sequence_order, verifier_laws
from sampler.eagle import EagleHead, new_eagle
from sampler.heads import output_head
from sampler.mdraft import Objective, acceptance_probabilities, off_policy_loss, on_policy_loss
from sampler.rollouts import Rollout
from sampler.training import Optimisation, Optimiser


@dataclass(frozen=True, kw_only=True)
class EagleTrainConfig(Optimisation):
    """One on-policy training run (the optimiser settings: ``sampler.training.Optimisation``).

    Attributes:
        objective: what to fit (``sampler.mdraft.Objective``; ``ce`` or an on-policy one).
        lookahead: L levels unrolled per anchor.
        steps: optimiser steps (one rollout, ``anchors`` contexts each).
        anchors: A contexts per step.
        seed: sequence order, anchors, sampled chains.
    Raises:
        ValueError: naming the field and its range.
    """

    objective: Objective = field(default_factory=Objective)
    anchors: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least(anchors=1)


def unroll(
    head: EagleHead,
    target: PreTrainedModel,
    hidden: torch.Tensor,
    roots: torch.Tensor,
    lookahead: int,
    chains: int = 1,
    teacher: torch.Tensor | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the head L levels from A anchors, as it drafts (differentiable in the head).

    Args:
        hidden: (A, d) h_{a−1}; roots: (A,) int64 x_a.
        lookahead: L.
        chains: K chains per anchor (sampled; 1 with ``teacher``).
        teacher: (A, L) int64 tokens to feed and return instead of sampling (``ce``).
        temperature: the sampling temperature (> 0) of the chains.
        generator: for the sampled tokens (on the CPU).
    Returns:
        (log q (A, K, L, V) float32 log-laws, chains' tokens (A, K, L) int64); level 1's law is
        shared by the K chains of an anchor.
    """
    a_count = roots.shape[0]
    k = 1 if teacher is not None else chains
    embed = target.get_input_embeddings()
    state, past = head.advance(hidden, embed(roots), None)
    laws: list[torch.Tensor] = []
    tokens: list[torch.Tensor] = []
    for level in range(lookahead):
        log_q = torch.log_softmax(head.logits(target, state).float(), -1)  # (A·k or A, V)
        if teacher is not None:
            token = teacher[:, level]
        else:
            probs = torch.softmax(log_q.detach() / temperature, -1).cpu()
            drawn = torch.multinomial(probs, k if level == 0 else 1, True, generator=generator)
            token = drawn.reshape(-1).to(roots.device)  # (A·K,)
        if level == 0 and k > 1:  # one law per anchor, K chains from here on
            log_q = log_q.repeat_interleave(k, 0)
            state = state.repeat_interleave(k, 0)
            past = (past[0].repeat_interleave(k, 0), past[1].repeat_interleave(k, 0))
        laws.append(log_q)
        tokens.append(token)
        if level + 1 < lookahead:
            state, past = head.advance(state, embed(token), past)
    log_q_all = torch.stack(laws, 1).view(a_count, k, lookahead, -1)
    return log_q_all, torch.stack(tokens, 1).view(a_count, k, lookahead)


def training_loss(
    head: EagleHead,
    target: PreTrainedModel,
    seq: Rollout,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    config: EagleTrainConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step loss over ``anchors`` (A,) of one rollout with its (T, d) hidden states, and
    the (A, K, L) acceptance probabilities of the sampled chains (empty for ``ce``)."""
    device = next(target.parameters()).device
    ids = torch.tensor(seq.ids, device=device)
    h = hidden[anchors - 1].to(device)
    roots = ids[anchors.to(device)]
    objective, length = config.objective, config.lookahead
    if not objective.on_policy:
        follow = anchors.to(device)[:, None] + torch.arange(1, length + 1, device=device)
        log_q, _ = unroll(head, target, h, roots, length, teacher=ids[follow])
        losses = [off_policy_loss(log_q[i, 0], ids[follow[i]], objective) for i in range(len(h))]
        return torch.stack(losses).mean(), torch.empty(0)
    log_q, drafts = unroll(
        head, target, h, roots, length, objective.proposals, None, 1.0, generator
    )
    log_p = verifier_laws(target, seq.ids, anchors, drafts)
    loss = on_policy_loss(log_q, log_p, drafts, objective)
    return loss, acceptance_probabilities(log_q.detach(), log_p, drafts)


@torch.inference_mode()
def evaluate(
    head: EagleHead,
    target: PreTrainedModel,
    sequences: Sequence[Rollout],
    hiddens: Sequence[torch.Tensor],
    lookahead: int = 4,
    temperatures: Sequence[float] = (1.0,),
    anchors: int = 16,
    seed: int = 1234,
) -> dict[str, Any]:
    """τ = 1 + Σ_ℓ Π_{m≤ℓ} a_m of standard speculative sampling with one chain of L drafts
    sampled from the head at temperature T (a_m = min(1, p_m(x_m)/q_m(x_m)) with both laws at
    T), averaged over anchors of held-out rollouts (as ``sampler.distill.evaluate``).

    Returns:
        ``{"T=<t>": {"tau": float, "conditional": [L floats], "contexts": int}}``;
        ``conditional[ℓ−1]`` = P(draft ℓ accepted | ℓ−1 accepted).
    Raises:
        ValueError: no rollout has room for L drafts after its prompt.
    """
    device = next(target.parameters()).device
    results: dict[str, Any] = {}
    for temperature in temperatures:
        generator = torch.Generator().manual_seed(seed)
        reach_sum: torch.Tensor | None = None
        count = 0
        for seq, hidden in zip(sequences, hiddens, strict=True):
            picks = anchor_positions(seq, anchors, lookahead, generator)
            if picks.numel() == 0:
                continue
            ids = torch.tensor(seq.ids, device=device)
            h = hidden[picks - 1].to(device)
            log_q, drafts = unroll(
                head, target, h, ids[picks.to(device)], lookahead, 1, None, temperature, generator
            )
            log_p = verifier_laws(target, seq.ids, picks, drafts)
            accept = acceptance_probabilities(
                torch.log_softmax(log_q / temperature, -1),
                torch.log_softmax(log_p / temperature, -1),
                drafts,
            ).double()
            reach = torch.cumprod(accept[:, 0, :], dim=1).sum(0)  # (L,)
            reach_sum = reach if reach_sum is None else reach_sum + reach
            count += len(picks)
        if reach_sum is None:
            raise ValueError(f"no held-out rollout has room for {lookahead} drafts")
        mean = (reach_sum / count).tolist()
        conditional = [mean[0]] + [
            mean[i] / mean[i - 1] if mean[i - 1] > 0 else 0.0 for i in range(1, len(mean))
        ]
        results[f"T={temperature:g}"] = {
            "tau": 1 + sum(mean),
            "conditional": conditional,
            "contexts": count,
        }
    return results


@dataclass
class TrainLog:
    """What a run did: steps, wall seconds of the optimiser steps, per-step entries."""

    steps: int = 0
    seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)


def train(
    target: PreTrainedModel,
    train_set: Sequence[Rollout],
    train_hidden: Sequence[torch.Tensor],
    config: EagleTrainConfig,
    init: EagleHead | None = None,
    on_step: Callable[[TrainLog], None] | None = None,
) -> tuple[EagleHead, TrainLog]:
    """Train a head for ``target`` (float32 weights), from ``init``'s weights or a fresh head.

    Raises:
        ValueError: no training rollout has room for L tokens after its prompt.
    """
    if not any(len(r.ids) - max(r.prompt_len - 1, 1) > config.lookahead for r in train_set):
        raise ValueError(f"no training rollout has room for {config.lookahead} tokens")
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(config.seed)  # the fresh head's layer initialisation
    drafted = init.draft_tokens if init is not None else None
    head = new_eagle(target, config.objective.name, drafted).float()
    if init is not None:
        head.load_state_dict(init.state_dict())
    head.train()
    optimiser = Optimiser(head, config)
    generator = torch.Generator().manual_seed(config.seed)
    order = sequence_order(len(train_set), torch.Generator().manual_seed(config.seed + 1))
    log = TrainLog()
    while log.steps < config.steps:
        started = time.perf_counter()
        index = next(order)
        anchors = anchor_positions(train_set[index], config.anchors, config.lookahead, generator)
        log.steps += 1
        if anchors.numel() == 0:
            continue
        loss, accept = training_loss(
            head, target, train_set[index], train_hidden[index], anchors, config, generator
        )
        entry: dict[str, Any] = optimiser.step(loss)
        log.seconds += time.perf_counter() - started
        entry["step"] = log.steps
        if accept.numel():
            entry["train_tau"] = float(1 + torch.cumprod(accept, -1).sum(-1).mean())
        log.log.append(entry)
        if on_step is not None:
            on_step(log)
    return head.eval(), log


@dataclass(frozen=True)
class AnchorData:
    """Rollout shards (``sampler.rollouts.RolloutShard``) flattened for batched distillation.

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
            logits = head(flat[i : i + chunk].to(head.weight.dtype)).float()
            values, indices = logits.topk(top_k, -1)
            top_tokens.append(indices)
            top_logits.append(values)
        return cls(
            flat,
            torch.cat(tokens),
            torch.cat(last),
            torch.cat(top_tokens),
            torch.cat(top_logits),
            torch.cat(roots),
        )


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


@dataclass(frozen=True, kw_only=True)
class DistillConfig(Optimisation):
    """The batched ``ce`` stage (``fit``); optimiser settings: ``sampler.training.Optimisation``.

    Attributes:
        lookahead: L levels unrolled per root.
        steps, batch: optimiser steps and roots per step.
        level_decay: level ℓ's loss weight is level_decay^(ℓ−1).
        seed: root sampling and the fresh head's initialisation.
    Raises:
        ValueError: naming the field and its range.
    """

    lookahead: int = 6
    steps: int = 1000
    batch: int = 256
    warmup: int = 50
    level_decay: float = 0.8

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least(batch=1)
        if not 0 < self.level_decay <= 1:
            raise ValueError(f"level_decay must be in (0, 1], got {self.level_decay}")


def fit(
    target: PreTrainedModel,
    data: AnchorData,
    config: DistillConfig,
    init: EagleHead | None = None,
    on_step: Callable[[EagleHead, TrainLog], None] | None = None,
    draft_tokens: torch.Tensor | None = None,
) -> tuple[EagleHead, TrainLog]:
    """Train a head (float32 weights, bfloat16 autocast on the CPU) by ``distill_loss`` on
    roots drawn uniformly from ``data`` (with replacement across steps); ``draft_tokens``:
    a fresh head's draft vocabulary (``new_eagle``; ``init``'s own otherwise).

    Raises:
        ValueError: ``data`` has no root.
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
    device_type = next(target.parameters()).device.type
    log = TrainLog()
    while log.steps < config.steps:
        started = time.perf_counter()
        pick = torch.randint(0, data.roots.numel(), (config.batch,), generator=generator)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss, _ = distill_loss(
                head, target, data, data.roots[pick], config.lookahead, config.level_decay
            )
        entry = optimiser.step(loss)
        log.steps += 1
        log.seconds += time.perf_counter() - started
        log.log.append({**entry, "step": log.steps})
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
    device_type = next(target.parameters()).device.type
    totals = torch.zeros(lookahead, dtype=torch.float64)
    chunks = 0
    for part in torch.split(data.roots[pick], 512):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            _, accept = distill_loss(head, target, data, part, lookahead, 1.0, temperature, True)
        totals += accept.double()
        chunks += 1
    return (totals / max(chunks, 1)).tolist()


def draft_vocabulary(data: AnchorData, size: int, vocab_size: int) -> torch.Tensor:
    """(size,) int64 sorted token ids: the ``size`` tokens with the most teacher probability
    (top-k laws at T = 1) summed over ``data``'s positions, a draft vocabulary for
    ``new_eagle`` (EAGLE-3 §3 drafts over a reduced vocabulary the same way).

    Raises:
        ValueError: ``size`` outside [1, vocab_size].
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {size}")
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    laws = torch.softmax(data.teacher_logits, -1).double()
    mass.index_add_(0, data.teacher_tokens.flatten(), laws.flatten())
    return mass.topk(size).indices.sort().values


def vocabulary_coverage(data: AnchorData, tokens: torch.Tensor, vocab_size: int) -> float:
    """The mean teacher probability (top-k laws at T = 1) on ``tokens`` over ``data``'s
    positions: an upper bound on a draft of that vocabulary's acceptance there."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[tokens] = True
    laws = torch.softmax(data.teacher_logits, -1).double()
    return float((laws * inside[data.teacher_tokens]).sum(-1).mean())
