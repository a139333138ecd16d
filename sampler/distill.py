"""Training parallel drafter heads on-policy with MDraft (MDraft paper Alg. 1; docs/design.md §7).

Pipeline (``poissonmark distill``):
1. **Data** — the target samples a continuation (temperature 1, full support) for every shared
   prompt; prompts are split by a hash of their id (``split_of``: 1 in 5 held out). Cached as
   JSONL under ``<data dir>/distill/<target fingerprint>/``; generation resumes where it stopped.
2. **Features** — one target forward per sequence gives the final hidden states h_t (cached).
3. **Steps** — a step takes one sequence and A anchors (root positions a, from the last prompt
   token to T−1−L so L tokens follow); the heads read (h_{a−1}, x_a) and give q [A, L, V].
   On-policy objectives sample K blocks per anchor from q (temperature 1), run the frozen target
   ONCE over the prefix and all A·K blocks (a tree-attention mask: a block sees the prefix up to
   its anchor and its own earlier tokens) and fit q to the blended targets
   (``sampler.mdraft.on_policy_loss``); ``ce`` fits the target's own continuation instead.
   AdamW, cosine schedule with warm-up, gradient clipping, seeded.
4. **Evaluation** — on held-out sequences, the expected acceptance length of standard
   speculative sampling with one chain of L drafts, τ = 1 + Σ_ℓ Π_{m≤ℓ} a_m with
   a_m = min(1, p_m(x_m)/q_m(x_m)) at temperature T (T = 0: a_m = 1 iff the greedy draft equals
   the target's greedy token), averaged over sampled drafts (Rao-Blackwellised over the accept
   coins), per position too.

Checkpoints (``checkpoint.pt``: heads, optimiser, schedule, step, generator state) make a run
resumable; the final heads are written with ``ParallelHeads.save``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import GenerationMixin, PreTrainedModel, get_cosine_schedule_with_warmup
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from sampler.completion import chat_prompt_ids
from sampler.heads import ParallelHeads, new_heads, output_head, target_fingerprint
from sampler.mdraft import Objective, acceptance_probabilities, off_policy_loss, on_policy_loss

HELDOUT_EVERY = 5  # 1 prompt in 5 is held out


def split_of(prompt_id: str) -> str:
    """``"heldout"`` for 1 id in ``HELDOUT_EVERY`` (by SHA-256 of the id), else ``"train"``."""
    digest = hashlib.sha256(prompt_id.encode()).digest()
    return "heldout" if digest[0] % HELDOUT_EVERY == 0 else "train"


@dataclass(frozen=True)
class Rollout:
    """A prompt and the target's continuation: ``ids`` = prompt ids + continuation ids."""

    id: str
    prompt_len: int
    ids: tuple[int, ...]


def load_prompts(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Prompt records from JSONL files: each a JSON object with a string ``id`` and either
    ``messages`` (chat messages) or ``prompt`` (a string).

    Raises:
        ValueError: a line that is not such an object (naming the file and line), or a
            repeated id.
    """
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"--prompts {path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str):
                raise ValueError(f"{where}: expected an object with a string 'id'")
            if not isinstance(record.get("messages"), list) and not isinstance(
                record.get("prompt"), str
            ):
                raise ValueError(f"{where}: expected 'messages' (a list) or 'prompt' (a string)")
            if record["id"] in seen:
                raise ValueError(f"{where}: id {record['id']!r} appears twice")
            seen.add(record["id"])
            records.append(record)
    return records


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, record: dict[str, Any]) -> list[int]:
    """The ids generation would see for this record (chat template, as ``generate`` uses)."""
    return chat_prompt_ids(tokenizer, record.get("prompt"), record.get("messages"))


@torch.inference_mode()
def generate_sequences(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[dict[str, Any]],
    cache: Path,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_size: int = 8,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Rollout]:
    """Target continuations (temperature 1, full support) for ``prompts``, cached in ``cache``
    (JSONL, one line per prompt, appended as batches finish: an interrupted run resumes).

    Each batch is seeded with ``seed`` and its first prompt id, so a resumed run samples the
    same continuations. Returns the sequences in prompt order.
    """
    done: dict[str, Rollout] = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = Rollout(row["id"], row["prompt_len"], tuple(row["ids"]))
    todo = [p for p in prompts if p["id"] not in done]
    cache.parent.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(target.parameters()).device
    with cache.open("a") as out:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            encoded = [_prompt_ids(tokenizer, p) for p in batch]
            width = max(map(len, encoded))
            ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)
            mask = torch.tensor(
                [[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device
            )
            torch.manual_seed(
                seed * 1_000_003 + int(hashlib.sha256(batch[0]["id"].encode()).hexdigest()[:8], 16)
            )
            outputs = cast(GenerationMixin, target).generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
            )
            for record, prompt, row in zip(
                batch, encoded, outputs[:, width:].tolist(), strict=True
            ):
                continuation = []
                for token in row:
                    continuation.append(token)
                    if token == tokenizer.eos_token_id:
                        break
                seq = Rollout(record["id"], len(prompt), tuple(prompt + continuation))
                done[seq.id] = seq
                out.write(
                    json.dumps({"id": seq.id, "prompt_len": seq.prompt_len, "ids": list(seq.ids)})
                    + "\n"
                )
            out.flush()
            if on_progress is not None:
                on_progress(len(done), len(prompts))
    return [done[p["id"]] for p in prompts]


@torch.inference_mode()
def hidden_states(target: PreTrainedModel, seq: Rollout) -> torch.Tensor:
    """(T, d) the target's final (normed) hidden states over ``seq.ids``, float16 on the CPU."""
    device = next(target.parameters()).device
    out = target.model(input_ids=torch.tensor([seq.ids], device=device))
    hidden: torch.Tensor = out.last_hidden_state[0]
    return hidden.to("cpu", torch.float16)


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


@dataclass(frozen=True)
class DistillConfig:
    """One training run.

    Attributes:
        objective: what to fit (``sampler.mdraft.Objective``).
        lookahead: L heads.
        steps: optimiser steps (one sequence, ``anchors`` contexts each).
        anchors: A contexts per step.
        lr, weight_decay, warmup, clip: AdamW, cosine schedule warm-up steps, grad-norm clip.
        seed: sequence order, anchors, drafts.
        eval_every, checkpoint_every: in steps (0 = never).
        init: a heads directory to start from (e.g. off-policy ``ce`` heads, as the MDraft
            paper post-trains a DFlash drafter), else fresh heads.
    """

    objective: Objective = field(default_factory=Objective)
    lookahead: int = 4
    steps: int = 300
    anchors: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 20
    clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 50
    init: str | None = None

    def __post_init__(self) -> None:
        for name, low in (("lookahead", 1), ("steps", 1), ("anchors", 1), ("warmup", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


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
    optimiser = torch.optim.AdamW(
        heads.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    schedule = get_cosine_schedule_with_warmup(optimiser, config.warmup, config.steps)
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
        optimiser.load_state_dict(saved["optimiser"])
        schedule.load_state_dict(saved["schedule"])
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
        optimiser.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(heads.parameters(), config.clip))
        optimiser.step()
        schedule.step()
        state.step += 1
        state.seconds += time.perf_counter() - started
        entry: dict[str, Any] = {
            "step": state.step,
            "loss": float(loss.detach()),
            "grad_norm": grad_norm,
            "lr": schedule.get_last_lr()[0],
        }
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
            on_step(state, float(loss.detach()))
        if config.checkpoint_every and (
            state.step % config.checkpoint_every == 0 or state.step == config.steps
        ):
            tmp = checkpoint.with_suffix(".tmp")
            torch.save(
                {
                    "config": config_json,
                    "heads": heads.state_dict(),
                    "optimiser": optimiser.state_dict(),
                    "schedule": schedule.state_dict(),
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


def data_dir_for(target: PreTrainedModel, data_dir: Path) -> Path:
    """``<data dir>/distill/<target fingerprint>``: where sequences and features are cached."""
    return data_dir / "distill" / target_fingerprint(target).replace(":", "-")


def cached_hidden_states(
    target: PreTrainedModel, sequences: Sequence[Rollout], path: Path
) -> list[torch.Tensor]:
    """``hidden_states`` for every sequence, cached in ``path`` (keyed by sequence ids)."""
    key = hashlib.sha256(json.dumps([s.ids for s in sequences]).encode()).hexdigest()[:16]
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved.get("key") == key:
            return list(saved["hidden"])
    hidden = [hidden_states(target, s) for s in sequences]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "hidden": hidden}, path)
    return hidden


def reach_summary(results: dict[str, Any]) -> str:
    """One line: τ per temperature."""
    return ", ".join(f"{k}: τ={v['tau']:.3f}" for k, v in results.items())


@dataclass(frozen=True)
class DistillData:
    """Train and held-out rollouts with their cached hidden states."""

    train: list[Rollout]
    train_hidden: list[torch.Tensor]
    heldout: list[Rollout]
    heldout_hidden: list[torch.Tensor]


def prepare_data(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_files: Sequence[Path],
    data_dir: Path,
    max_new_tokens: int = 128,
    seed: int = 0,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> DistillData:
    """Steps 1-2 of the module docstring: rollouts for both splits and their hidden states,
    generated once and cached under ``data_dir_for(target, data_dir)``."""
    prompts = load_prompts(prompt_files)
    if not prompts:
        raise ValueError("no prompts in " + ", ".join(map(str, prompt_files)))
    root = data_dir_for(target, data_dir)
    splits: dict[str, tuple[list[Rollout], list[torch.Tensor]]] = {}
    for split in ("train", "heldout"):
        chosen = [p for p in prompts if split_of(p["id"]) == split]
        if not chosen:
            raise ValueError(
                f"--prompts: no prompt falls in the {split} split (1 id in {HELDOUT_EVERY} is "
                f"held out by a hash of the id); give more prompts ({len(prompts)} now)"
            )
        rollouts = generate_sequences(
            target,
            tokenizer,
            chosen,
            root / f"rollouts-{split}-n{max_new_tokens}-s{seed}.jsonl",
            max_new_tokens,
            seed,
            on_progress=functools.partial(on_progress, f"rollouts ({split})")
            if on_progress
            else None,
        )
        hidden = cached_hidden_states(
            target, rollouts, root / f"hidden-{split}-n{max_new_tokens}-s{seed}.pt"
        )
        splits[split] = (rollouts, hidden)
    return DistillData(*splits["train"], *splits["heldout"])
