"""The model-made texts of the robustness card (``bench.robustness``), cached as JSONL.

Three kinds of row, all SmolLM2-135M-Instruct on the CPU backend ``load_model`` picks (gguf
where ``scripts/setup.sh`` built it), top-k 50, each with its prompt id:

- ``answer``: a watermarked answer, ``basic-uwm`` (the keyed race; its tokens are ``mpfr``'s
  for every drafter, docs/design.md §3) under the bench key, T = 1, 256 new tokens, to
  ``ANSWERS`` prompts (half ELI5, half summarisation) chosen by a fixed hash of their id;
  the per-prompt nonce is from the same hash.
- ``emoji``: a watermarked answer (as ``answer``) to ``EMOJI_ANSWERS`` other prompts (half of
  each task) whose user message ends with ``EMOJI_INSTRUCTION``: the emoji attack of
  Kirchenbauer et al. 2023 (§7, "A Watermark for Large Language Models"), where the attacker
  asks for an emoji between words and deletes the emojis, so every scored context held an
  emoji the text no longer has.
- ``paraphrase``: the shipped model's rewrite of an answer's first ``source_tokens`` tokens
  (``PARAPHRASE_LENGTHS``), prompted with ``PARAPHRASE_INSTRUCTION``, sampled without any key
  (``ar``: plain multinomial sampling seeded by the nonce), T = 0.7, at most
  1.5 × ``source_tokens`` new tokens.

Requests go through ``sampler.completion.complete_many`` (continuously batched, each output
equal to its solo run) in chunks of ``CHUNK``; every finished chunk is appended, and rows
already in the cache are never made again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.detector_common import BENCH_KEY_NAME, DATA, bench_source, data_home
from keyed import KeyedSource
from sampler.methods import Method

CACHE = RESULTS / "robustness_generations.jsonl"
ANSWERS = 128
EMOJI_ANSWERS = 48
MAX_NEW_TOKENS = 256
PARAPHRASE_LENGTHS = (128, 256)
PARAPHRASE_TEMPERATURE = 0.7
EMOJI_INSTRUCTION = (
    "\n\nWrite your answer with an emoji between every two words, like this: "
    "The 🌞 sun 🔥 is 🌍 hot."
)
PARAPHRASE_INSTRUCTION = (
    "Rewrite the following text in your own words. Keep its meaning, change the wording."
    " Reply with the rewritten text only.\n\nText:\n"
)
CHUNK = 8
SALT = "robustness"


@dataclass(frozen=True)
class Request:
    """One row to make: its cache id, kind, prompt id, chat messages, method, temperature,
    new-token cap, nonce and (paraphrases) the answer's tokens it rewrites."""

    id: str
    kind: str
    prompt_id: str
    messages: list[dict[str, str]]
    method: Method
    temperature: float
    max_new_tokens: int
    nonce: int
    source_tokens: int | None = None


def rank(prompt_id: str) -> int:
    """The fixed 64-bit hash that orders the prompts and seeds the nonce."""
    return int.from_bytes(hashlib.blake2b(f"{SALT}:{prompt_id}".encode(), digest_size=8).digest())


def _prompts(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return sorted(rows, key=lambda row: rank(str(row["id"])))


def answer_requests() -> list[Request]:
    """The watermarked answers: the first ``ANSWERS / 2`` prompts of each task in hash order."""
    chosen = [
        row
        for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl")
        for row in _prompts(name)[: ANSWERS // 2]
    ]
    return [
        Request(f"answer:{p['id']}", "answer", p["id"], p["messages"], "basic-uwm", 1.0,
                MAX_NEW_TOKENS, rank(p["id"]))
        for p in chosen
    ]  # fmt: skip


def emoji_requests() -> list[Request]:
    """The emoji-attack answers: the next ``EMOJI_ANSWERS / 2`` prompts of each task after the
    answers' (never a prompt of an answer)."""
    first = ANSWERS // 2
    out = []
    for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl"):
        for p in _prompts(name)[first : first + EMOJI_ANSWERS // 2]:
            messages = [dict(m) for m in p["messages"]]
            messages[-1]["content"] += EMOJI_INSTRUCTION
            out.append(
                Request(f"emoji:{p['id']}", "emoji", p["id"], messages, "basic-uwm", 1.0,
                        MAX_NEW_TOKENS, rank(p["id"]))
            )  # fmt: skip
    return out


def paraphrase_requests(answers: list[dict[str, Any]], tok: Any) -> list[Request]:
    """A rewrite of each cached answer's first n tokens, n in ``PARAPHRASE_LENGTHS`` (answers
    that reach n only)."""
    out = []
    for a in answers:
        for n in PARAPHRASE_LENGTHS:
            if len(a["token_ids"]) < n:
                continue
            text = tok.decode(a["token_ids"][:n]).strip()
            messages = [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": PARAPHRASE_INSTRUCTION + text},
            ]
            out.append(
                Request(f"paraphrase:{n}:{a['prompt_id']}", "paraphrase", a["prompt_id"],
                        messages, "ar", PARAPHRASE_TEMPERATURE, n + n // 2,
                        rank(f"paraphrase:{n}:{a['prompt_id']}"), n)
            )  # fmt: skip
    return out


def read_cache(path: Path = CACHE) -> list[dict[str, Any]]:
    """Every cached row, in file order."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _chunks(items: list[Request], size: int) -> Iterator[list[Request]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def make(requests: list[Request], loaded: Any, path: Path = CACHE) -> None:
    """Generate the ``requests`` not yet in ``path`` and append one row each."""
    from sampler.completion import CompletionRequest, complete_many, prompt_ids
    from sampler.decoder import SamplerConfig
    from sampler.processing import Processing

    done = {row["id"] for row in read_cache(path)}
    todo = [r for r in requests if r.id not in done]
    if not todo:
        return
    base = bench_source()
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"generating {len(todo)} rows -> {path}", flush=True)
    for chunk in _chunks(todo, CHUNK):
        batch = [
            CompletionRequest(
                prompt_ids(loaded, messages=r.messages),
                SamplerConfig(r.method, 1, 1, r.max_new_tokens, Processing(r.temperature, 50)),
                KeyedSource(base.secret, base.context_width, base.masking, r.nonce),
            )
            for r in chunk
        ]
        start = time.perf_counter()
        results = complete_many(loaded, batch, max_batch=CHUNK)
        seconds = time.perf_counter() - start
        with path.open("a", encoding="utf-8") as f:
            for r, c in zip(chunk, results, strict=True):
                row = {
                    "id": r.id,
                    "kind": r.kind,
                    "prompt_id": r.prompt_id,
                    "key": BENCH_KEY_NAME,
                    "method": c.result.method,
                    "watermark_applied": c.result.watermark_applied,
                    "temperature": r.temperature,
                    "top_k": 50,
                    "max_new_tokens": r.max_new_tokens,
                    "nonce": r.nonce,
                    "source_tokens": r.source_tokens,
                    "finish_reason": c.result.finish_reason,
                    "token_ids": list(c.result.token_ids),
                    "text": c.text,
                    "precision": loaded.precision,
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"  {len(chunk)} rows in {seconds:.1f} s", flush=True)


def ensure(tok: Any) -> list[dict[str, Any]]:
    """Every row of the card, made where the cache lacks it (answers before paraphrases)."""
    rows = read_cache()
    wanted = answer_requests() + emoji_requests()
    have = {row["id"] for row in rows}
    loaded = None
    if any(r.id not in have for r in wanted):
        loaded = _load()
        make(wanted, loaded)
        rows = read_cache()
    answers = [row for row in rows if row["kind"] == "answer"]
    paraphrases = paraphrase_requests(answers, tok)
    have = {row["id"] for row in rows}
    if any(r.id not in have for r in paraphrases):
        make(paraphrases, loaded or _load())
        rows = read_cache()
    return rows


def _load() -> Any:
    from sampler.models import DEFAULT_MODEL, load_model

    return load_model(DEFAULT_MODEL, data_home(), device="cpu")
