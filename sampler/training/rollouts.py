"""Rollouts for drafter training: the target's own continuations of the shared prompts and
their hidden states (steps 1-2 of ``sampler.training.distill``; docs/design.md §7).

Prompts are split by a hash of their id (``split_of``: 1 in 5 held out). The target samples a
continuation (temperature 1, full support) for every prompt, cached as JSONL under
``<data dir>/distill/<target fingerprint>/`` (generation resumes where it stopped); one target
forward per rollout gives its final hidden states, cached beside them.

Shapes: T tokens of a rollout (prompt + continuation), d the target's hidden size;
hidden states (T, d) float16 on the CPU; token ids int64.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from sampler.completion import chat_prompt_ids
from sampler.drafters.heads import target_fingerprint

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


def prompt_ids(tokenizer: PreTrainedTokenizerBase, record: dict[str, Any]) -> list[int]:
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
            encoded = [prompt_ids(tokenizer, p) for p in batch]
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


@dataclass(frozen=True)
class RolloutShard:
    """Several target continuations of one prompt at one temperature, with the target's final
    (normed) hidden states over each from position ``prompt_len − 2`` on.

    Attributes:
        prompt_id: the prompt's id; prompt_len: its token count P (P >= 2).
        temperature, top_k: how the continuations were sampled.
        ids: N int32 tensors (P + n_i,): prompt + continuation i (EOS kept when drawn).
        hidden: N bfloat16 tensors (P + n_i − (P − 2), d): hidden[i][j] is the hidden state at
            position P − 2 + j.
    """

    prompt_id: str
    prompt_len: int
    temperature: float
    top_k: int
    ids: list[torch.Tensor]
    hidden: list[torch.Tensor]

    def continuation_tokens(self) -> int:
        return sum(len(x) - self.prompt_len for x in self.ids)

    def save(self, path: Path) -> None:
        """Write atomically (a temporary file, then a rename)."""
        partial = path.with_suffix(".partial")
        torch.save({f.name: getattr(self, f.name) for f in fields(self)}, partial)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> RolloutShard:
        return cls(**torch.load(path, weights_only=True))


@torch.inference_mode()
def sample_shards(
    target: PreTrainedModel,
    prompts: Sequence[tuple[str, list[int]]],
    samples: int,
    temperature: float,
    top_k: int,
    max_new_tokens: int,
    pad_id: int,
    eos_id: int,
    seed: int = 0,
) -> list[RolloutShard]:
    """``samples`` continuations of each prompt (id, token ids) sampled by the target at
    ``temperature`` with top-k ``top_k`` (0: off): one transformers ``generate`` over all
    prompts × samples (left-padded with ``pad_id``), training randomness seeded by ``seed``,
    the prompt ids and the temperature (unkeyed); a continuation ends after ``eos_id`` or
    ``max_new_tokens`` tokens. Then one forward per prompt for the hidden states
    (continuations right-padded: causal attention leaves every position before the padding
    as it is).

    Raises:
        ValueError: a prompt of fewer than 2 tokens.
    """
    for prompt_id, ids in prompts:
        if len(ids) < 2:
            raise ValueError(f"prompt {prompt_id!r} has {len(ids)} tokens; at least 2 needed")
    device = next(target.parameters()).device
    tag = f"{seed}:{','.join(i for i, _ in prompts)}:{temperature:g}".encode()
    torch.manual_seed(int(hashlib.sha256(tag).hexdigest()[:12], 16))
    width = max(len(ids) for _, ids in prompts)
    rows = [[pad_id] * (width - len(ids)) + ids for _, ids in prompts for _ in range(samples)]
    mask = [[0] * (width - len(ids)) + [1] * len(ids) for _, ids in prompts for _ in range(samples)]
    outputs = cast(GenerationMixin, target).generate(
        input_ids=torch.tensor(rows, device=device),
        attention_mask=torch.tensor(mask, device=device),
        do_sample=True,
        temperature=temperature,
        top_k=top_k,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
    )
    new = outputs[:, width:].tolist()
    shards: list[RolloutShard] = []
    for index, (prompt_id, prefix) in enumerate(prompts):
        sequences: list[torch.Tensor] = []
        for row in new[index * samples : (index + 1) * samples]:
            continuation = []
            for token in row:
                continuation.append(token)
                if token == eos_id:
                    break
            sequences.append(torch.tensor(prefix + continuation, dtype=torch.int32))
        longest = max(len(r) for r in sequences)
        batch = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
        for i, r in enumerate(sequences):
            batch[i, : len(r)] = r
        hidden = target.model(input_ids=batch.to(device)).last_hidden_state
        start = len(prefix) - 2
        kept = [
            hidden[i, start : len(r)].to("cpu", torch.bfloat16).clone()
            for i, r in enumerate(sequences)
        ]
        shards.append(RolloutShard(prompt_id, len(prefix), temperature, top_k, sequences, kept))
    return shards
