"""Training the eagle head (``sampler.drafters.eagle``) on the target's own continuations (DESIGN
§7).

Data: ``sampler.training.rollouts.prepare_data`` — target rollouts at temperature 1 on the train
split of the prompts and the target's final hidden states over them (cached). A step takes one
rollout and A anchors a (root positions); the head starts from (h_{a−1}, x_a) and runs L levels on
its own states, as it drafts (EAGLE-3's training-time test, Li et al. 2025 §3):

- ``ce`` (the off-policy baseline): level ℓ is fed the target's continuation x_{a+ℓ−1} and is
  fitted to x_{a+ℓ} by cross-entropy with DFlash weights
  (``sampler.training.mdraft.off_policy_loss``).
- on-policy (``mdraft``, ``rkl``, ``fkl``; MDraft paper Alg. 1): K draft chains per anchor, each
  level's token sampled from the head's own law at temperature 1; the frozen target scores the
  A·K blocks in ONE forward (``sampler.training.distill.verifier_laws``) and the head's per-chain
  laws q_ℓ^{(k)} = q(·| c, x^{(k)}_{<ℓ}) are fitted to the blended targets
  r_ℓ^{(k)} ∝ (p_ℓ^{(k)})^{1−α} (p̂_ℓ)^α by reverse KL with survival weights
  (``sampler.training.mdraft.on_policy_loss``, Eq. 1-2, App. D). An autoregressive drafter sees its
  prefix, so the blend only pools the verifier's evidence across the K prefixes; with K = 1 it
  is per-prefix reverse KL.

The batched ``ce`` stage on rollout shards, which trained the shipped head, is
``sampler.training.eagle_distill``; MDraft post-trains its head here (``train(init=...)``).

AdamW with a cosine schedule, gradient clipping (``sampler.training.optimiser``); sequence order,
anchors and sampled chains all come from generators seeded by ``EagleTrainConfig.seed``
(training randomness only; nothing here is keyed). ``evaluate`` gives τ, the expected acceptance
length of standard speculative sampling with one chain of L drafts
(``sampler.training.distill.evaluate``'s measure), on held-out rollouts.

Shapes: A anchors, K chains, L levels, V vocabulary, d hidden size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from sampler.drafters.eagle import EagleHead, new_eagle
from sampler.training.distill import anchor_positions, sequence_order, verifier_laws
from sampler.training.mdraft import (
    Objective,
    acceptance_probabilities,
    off_policy_loss,
    on_policy_loss,
)
from sampler.training.optimiser import Optimisation, Optimiser, TrainLog
from sampler.training.rollouts import Rollout


@dataclass(frozen=True, kw_only=True)
class EagleTrainConfig(Optimisation):
    """One on-policy training run (the optimiser settings:
    ``sampler.training.optimiser.Optimisation``).

    Attributes:
        objective: what to fit (``sampler.training.mdraft.Objective``; ``ce`` or an on-policy one).
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
    T), averaged over anchors of held-out rollouts (as ``sampler.training.distill.evaluate``).

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
