"""Training parallel drafter heads on-policy with MDraft (MDraft paper Alg. 1; docs/design.md §7).

Pipeline (``poissonmark distill``):
1. **Data** and 2. **Features** — the target's rollouts of the shared prompts (train and
   held-out splits) and their final hidden states h_t, generated once and cached
   (``sampler.training.rollouts.prepare_data``).
3. **Steps** — a step takes one sequence and A anchors (root positions a, from the last prompt
   token to T−1−L so L tokens follow); the heads read (h_{a−1}, x_a) and give q [A, L, V].
   On-policy objectives sample K blocks per anchor from q (temperature 1), run the frozen target
   ONCE over the prefix and all A·K blocks (a tree-attention mask: a block sees the prefix up to
   its anchor and its own earlier tokens) and fit q to the blended targets
   (``sampler.training.mdraft.on_policy_loss``); ``ce`` fits the target's own continuation instead.
   AdamW, cosine schedule with warm-up, gradient clipping, seeded (``sampler.training.optimiser``).
4. **Evaluation** — on held-out sequences, the expected acceptance length of standard
   speculative sampling with one chain of L drafts, τ = 1 + Σ_ℓ Π_{m≤ℓ} a_m with
   a_m = min(1, p_m(x_m)/q_m(x_m)) at temperature T (T = 0: a_m = 1 iff the greedy draft equals
   the target's greedy token), averaged over sampled drafts (Rao-Blackwellised over the accept
   coins), per position too.

Checkpoints (``checkpoint.pt``: heads, optimiser, schedule, step, generator state) make a run
resumable; the final heads are written with ``ParallelHeads.save``.

Shapes: A anchors of a step, K drafted blocks per anchor, L heads (lookahead), V vocabulary,
T tokens of a rollout, d hidden size. Head and target laws are log-probabilities
(A, L, V) / (A, K, L, V) float32; drafts (A, K, L) int64; hidden states (T, d) float16 (cached)
cast to the heads' dtype; acceptance probabilities (A, K, L) float32.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from sampler.drafters.heads import ParallelHeads, new_heads, output_head
from sampler.training.mdraft import (
    Objective,
    acceptance_probabilities,
    off_policy_loss,
    on_policy_loss,
)
from sampler.training.optimiser import Optimisation, Optimiser
from sampler.training.rollouts import Rollout


@torch.inference_mode()
def verifier_laws(
    target: PreTrainedModel, ids: Sequence[int], anchors: torch.Tensor, drafts: torch.Tensor
) -> torch.Tensor:
    """log p_ℓ^{(k)} [A, K, L, V] (float32): the target's laws on every sampled block, in ONE
    forward over the prefix and all A·K·(L−1) block tokens with a tree-attention mask.

    Args:
        ids: the sequence; anchors: [A] root positions a; drafts: [A, K, L] sampled tokens.
    Row ℓ = 1 is p(·|x_{≤a}) (shared by the K blocks); row ℓ is p(·|x_{≤a}, x^{(k)}_{<ℓ}).
    """
    a_count, k, length = drafts.shape
    device = next(target.parameters()).device
    prefix = int(anchors.max()) + 1
    block = drafts[:, :, : length - 1].reshape(-1)  # (A·K·(L−1),) depth-major within a block
    n = prefix + block.numel()
    tokens = torch.cat([torch.tensor(ids[:prefix]), block.cpu()]).to(device)
    anchor_of = anchors.repeat_interleave(k * (length - 1))
    depth = torch.arange(1, length).repeat(a_count * k)  # 1..L−1
    block_id = torch.arange(a_count * k).repeat_interleave(length - 1)
    positions = torch.cat([torch.arange(prefix), anchor_of + depth])
    visible = torch.zeros((n, n), dtype=torch.bool)
    visible[:prefix, :prefix] = torch.tril(torch.ones((prefix, prefix), dtype=torch.bool))
    cols = torch.arange(prefix)
    visible[prefix:, :prefix] = cols[None, :] <= anchor_of[:, None]
    same = (block_id[:, None] == block_id[None, :]) & (depth[None, :] <= depth[:, None])
    visible[prefix:, prefix:] = same
    dtype = next(target.parameters()).dtype
    mask = torch.zeros((1, 1, n, n), dtype=dtype)
    mask.masked_fill_(~visible[None, None], torch.finfo(dtype).min)
    hidden = target.model(
        input_ids=tokens[None],
        attention_mask=mask.to(device),
        position_ids=positions[None].to(device),
    ).last_hidden_state[0]
    head = output_head(target)
    first = torch.log_softmax(head(hidden[anchors.to(device)]).float(), -1)  # [A, V]
    rest = torch.log_softmax(head(hidden[prefix:]).float(), -1).view(a_count, k, length - 1, -1)
    return torch.cat([first[:, None, None, :].expand(-1, k, 1, -1), rest], dim=2)


@dataclass(frozen=True, kw_only=True)
class DistillConfig(Optimisation):
    """One training run (the optimiser settings: ``sampler.training.optimiser.Optimisation``).

    Attributes:
        objective: what to fit (``sampler.training.mdraft.Objective``).
        lookahead: L heads.
        steps: optimiser steps (one sequence, ``anchors`` contexts each).
        anchors: A contexts per step.
        seed: sequence order, anchors, drafts.
        eval_every, checkpoint_every: in steps (0 = never).
        init: a heads directory to start from (e.g. off-policy ``ce`` heads, as the MDraft
            paper post-trains a DFlash drafter), else fresh heads.
    Raises:
        ValueError: naming the field and its range.
    """

    objective: Objective = field(default_factory=Objective)
    steps: int = 300
    anchors: int = 32
    warmup: int = 20
    eval_every: int = 100
    checkpoint_every: int = 50
    init: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least(anchors=1, eval_every=0, checkpoint_every=0)


def anchor_positions(
    seq: Rollout, count: int, lookahead: int, generator: torch.Generator
) -> torch.Tensor:
    """(≤ count,) int64 sorted distinct root positions a of ``seq``, from its last prompt token
    to T − 1 − ``lookahead`` (so ``lookahead`` tokens follow each); empty when none fits."""
    low, high = max(seq.prompt_len - 1, 1), len(seq.ids) - 1 - lookahead
    if high < low:
        return torch.empty(0, dtype=torch.long)
    span = high - low + 1
    picks = torch.randperm(span, generator=generator)[: min(count, span)] + low
    return picks.sort().values


def _sample_drafts(
    log_q: torch.Tensor, k: int, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """[A, K, L] tokens from q at ``temperature`` (0 = greedy)."""
    a_count, length, vocab = log_q.shape
    if temperature == 0:
        return log_q.argmax(-1)[:, None, :].expand(a_count, k, length).contiguous()
    probs = torch.softmax(log_q.detach().float() / temperature, -1).reshape(-1, vocab).cpu()
    drawn = torch.multinomial(probs, k, replacement=True, generator=generator)  # (A·L, K)
    return drawn.view(a_count, length, k).transpose(1, 2).to(log_q.device)


def training_loss(
    heads: ParallelHeads,
    target: PreTrainedModel,
    seq: Rollout,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    objective: Objective,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step loss over ``anchors`` of one sequence and the [A, K, L] acceptance probabilities
    of the sampled drafts (on-policy objectives; empty for ``ce``)."""
    device = next(target.parameters()).device
    dtype = next(heads.parameters()).dtype
    h = hidden[anchors - 1].to(device, dtype)
    roots = torch.tensor(seq.ids, device=device)[anchors.to(device)]
    log_q = torch.log_softmax(heads.logits(target, h, roots).float(), -1)  # [A, L, V]
    length = log_q.shape[1]
    if not objective.on_policy:
        ids = torch.tensor(seq.ids, device=device)
        follow = anchors.to(device)[:, None] + torch.arange(1, length + 1, device=device)
        losses = [off_policy_loss(log_q[i], ids[follow[i]], objective) for i in range(len(anchors))]
        return torch.stack(losses).mean(), torch.empty(0)
    drafts = _sample_drafts(log_q, objective.proposals, 1.0, generator)
    log_p = verifier_laws(target, seq.ids, anchors, drafts)
    loss = on_policy_loss(log_q, log_p, drafts, objective)
    return loss, acceptance_probabilities(log_q.detach(), log_p, drafts)


@torch.inference_mode()
def evaluate(
    heads: ParallelHeads,
    target: PreTrainedModel,
    sequences: Sequence[Rollout],
    hiddens: Sequence[torch.Tensor],
    temperatures: Sequence[float] = (0.0, 0.6, 1.0),
    anchors: int = 16,
    seed: int = 1234,
) -> dict[str, Any]:
    """Expected acceptance length τ and per-position acceptance of standard speculative sampling
    (one chain of L drafts) on held-out sequences (module docstring, step 4).

    Raises:
        ValueError: no rollout is long enough for L draft positions.
    Returns:
        ``{"T=<t>": {"tau": float, "tau_std_over_sequences": float, "reach": [L floats],
        "conditional": [L floats], "contexts": int}}``; ``reach[ℓ−1]`` = P(ℓ drafts accepted),
        ``conditional[ℓ−1]`` = P(draft ℓ accepted | ℓ−1 accepted).
    """
    device = next(target.parameters()).device
    results: dict[str, Any] = {}
    for temperature in temperatures:
        generator = torch.Generator().manual_seed(seed)
        per_sequence, reach_sum, count = [], None, 0
        for seq, hidden in zip(sequences, hiddens, strict=True):
            picks = anchor_positions(seq, anchors, heads.config.lookahead, generator)
            if picks.numel() == 0:
                continue
            roots = torch.tensor(seq.ids, device=device)[picks.to(device)]
            h = hidden[picks - 1].to(device, next(heads.parameters()).dtype)
            log_q = torch.log_softmax(heads.logits(target, h, roots).float(), -1)
            drafts = _sample_drafts(log_q, 1, temperature, generator)
            log_p = verifier_laws(target, seq.ids, picks, drafts)
            if temperature == 0:
                accept = (log_p.argmax(-1) == drafts).double()
            else:
                accept = acceptance_probabilities(
                    torch.log_softmax(log_q / temperature, -1),
                    torch.log_softmax(log_p / temperature, -1),
                    drafts,
                ).double()
            reach = torch.cumprod(accept[:, 0, :], dim=1)  # [A, L]
            per_sequence.append(float(1 + reach.sum(1).mean()))
            reach_sum = reach.sum(0) if reach_sum is None else reach_sum + reach.sum(0)
            count += reach.shape[0]
        if reach_sum is None:
            raise ValueError(
                f"no held-out rollout has room for {heads.config.lookahead} draft tokens after "
                "its prompt; raise --max-new-tokens"
            )
        reach_mean = (reach_sum / count).tolist()
        conditional = [reach_mean[0]] + [
            reach_mean[i] / reach_mean[i - 1] if reach_mean[i - 1] > 0 else 0.0
            for i in range(1, len(reach_mean))
        ]
        tau = 1 + sum(reach_mean)
        spread = torch.tensor(per_sequence, dtype=torch.float64)
        results[f"T={temperature:g}"] = {
            "tau": tau,
            "tau_std_over_sequences": float(spread.std()) if len(per_sequence) > 1 else 0.0,
            "reach": reach_mean,
            "conditional": conditional,
            "contexts": count,
        }
    return results


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)


def sequence_order(count: int, generator: torch.Generator) -> Iterator[int]:
    """Indices 0..count−1 in a fresh random order each epoch, forever."""
    while True:
        yield from torch.randperm(count, generator=generator).tolist()


def train(
    target: PreTrainedModel,
    train_set: Sequence[Rollout],
    train_hidden: Sequence[torch.Tensor],
    heldout: Sequence[Rollout],
    heldout_hidden: Sequence[torch.Tensor],
    config: DistillConfig,
    out_dir: Path,
    on_step: Callable[[TrainState, float], None] | None = None,
) -> tuple[ParallelHeads, TrainState]:
    """Train heads for ``target`` (MDraft Alg. 1 or a baseline objective), resuming from
    ``out_dir/checkpoint.pt`` when it exists for the same config. Writes ``out_dir/heads.*`` and
    ``out_dir/training.json`` (config, loss and evaluation log, wall seconds) at the end.

    Raises:
        ValueError: an existing checkpoint was written for another config.
    """
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(config.seed)
    if config.init is not None:
        start = ParallelHeads.load(Path(config.init), target)
        if start.config.lookahead != config.lookahead:
            raise ValueError(
                f"init: {config.init} has {start.config.lookahead} heads, lookahead is "
                f"{config.lookahead}"
            )
        heads = new_heads(target, config.lookahead, config.objective.name).float()
        heads.load_state_dict(start.state_dict())
    else:
        heads = new_heads(target, config.lookahead, config.objective.name).float()
    heads.train()
    optimiser = Optimiser(heads, config)
    generator = torch.Generator().manual_seed(config.seed)
    state = TrainState()
    checkpoint = out_dir / "checkpoint.pt"
    config_json = json.loads(json.dumps(asdict(config)))
    data = json.dumps([r.ids for r in train_set]).encode()
    config_json["data"] = hashlib.sha256(data).hexdigest()  # resume only on the same rollouts
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=True)
        if saved["config"] != config_json:
            raise ValueError(
                f"{checkpoint} was written for another config or other rollouts; use a new --out"
            )
        heads.load_state_dict(saved["heads"])
        optimiser.load_state_dict(saved)
        generator.set_state(saved["generator"])
        state = TrainState(**saved["state"])
    if not any(len(r.ids) - max(r.prompt_len - 1, 1) > config.lookahead for r in train_set):
        raise ValueError(
            f"no training rollout has room for {config.lookahead} draft tokens after its prompt; "
            "raise --max-new-tokens"
        )
    order = sequence_order(len(train_set), torch.Generator().manual_seed(config.seed + 1))
    for _ in range(state.step):  # replay the sequence order up to the resumed step
        next(order)
    out_dir.mkdir(parents=True, exist_ok=True)
    eval_subset = list(range(min(8, len(heldout))))
    while state.step < config.steps:
        started = time.perf_counter()
        index = next(order)
        seq = train_set[index]
        anchors = anchor_positions(seq, config.anchors, config.lookahead, generator)
        if anchors.numel() == 0:
            state.step += 1
            continue
        loss, accept = training_loss(
            heads, target, seq, train_hidden[index], anchors, config.objective, generator
        )
        entry: dict[str, Any] = optimiser.step(loss)
        state.step += 1
        state.seconds += time.perf_counter() - started
        entry["step"] = state.step
        if accept.numel():
            entry["train_tau"] = float(1 + torch.cumprod(accept, -1).sum(-1).mean())
        if config.eval_every and (
            state.step % config.eval_every == 0 or state.step == config.steps
        ):
            heads.eval()
            entry["eval"] = evaluate(
                heads,
                target,
                [heldout[i] for i in eval_subset],
                [heldout_hidden[i] for i in eval_subset],
                (1.0,),
                anchors=8,
            )
            heads.train()
        state.log.append(entry)
        if on_step is not None:
            on_step(state, entry["loss"])
        if config.checkpoint_every and (
            state.step % config.checkpoint_every == 0 or state.step == config.steps
        ):
            tmp = checkpoint.with_suffix(".tmp")
            torch.save(
                {
                    "config": config_json,
                    "heads": heads.state_dict(),
                    **optimiser.state_dict(),
                    "generator": generator.get_state(),
                    "state": asdict(state),
                },
                tmp,
            )
            tmp.replace(checkpoint)
    heads.eval()
    heads.save(out_dir)
    (out_dir / "training.json").write_text(
        json.dumps(
            {
                "config": config_json,
                "steps": state.step,
                "train_seconds": state.seconds,
                "log": state.log,
            },
            indent=1,
        )
        + "\n"
    )
    return heads, state


def reach_summary(results: dict[str, Any]) -> str:
    """One line: τ per temperature."""
    return ", ".join(f"{k}: τ={v['tau']:.3f}" for k, v in results.items())
