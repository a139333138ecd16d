"""OpenAI's wire shapes over poissonmark's generation (the edge is ``service.http.routes.openai``).

- ``generate_request``: an OpenAI body as the ``POST /v1/generate`` body it means (its ranges
  apply, and at admission its limits and served drafters; ``renamed``: a limit named by its
  OpenAI parameter);
  the key from ``key_id`` or the ``X-Poissonmark-Key`` header (``key_id_of``).
- ``facts_of``, ``usage_of``, ``finish_reason_of``: a finished generation in OpenAI's terms
  (``usage.completion_tokens`` counts the EOS token too) and poissonmark's extension object.
- ``chat_chunk`` / ``completion_chunk``: one ``data:`` chunk of a stream (``data_line``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from service.errors import KEY_ID_PATTERN
from service.http.openai_errors import InvalidParameter
from service.jobs.detection_pool import DetectionPool
from service.jobs.generation import Generation
from service.jobs.resources import Resources
from service.jobs.worker import Finished, Job
from service.schemas.generate import GenerateRequest
from service.schemas.openai import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    FinishReason,
    OpenAIRequest,
    Usage,
    WatermarkFacts,
    WatermarkStart,
)
from service.settings import Settings

KEY_HEADER = "X-Poissonmark-Key"
"""The header that names the watermark key when the body has no ``key_id``."""


def served_model(resources: Resources) -> str:
    """The id clients name in ``model``: the served model's name (``service.settings.model_name``:
    an alias, or a directory's or file's own name), as a key made here records it."""
    return resources.model


@dataclasses.dataclass
class Served:
    """A started generation: what ran, its job, and how to word the answer."""

    generation: Generation
    job: Job
    prompt_tokens: int
    model: str
    tokenizer: Any  # decode only (immutable), on the event loop


def key_id_of(body: OpenAIRequest, request: Request) -> str:
    """The body's ``key_id``, else the header's (a default for clients that set headers only)."""
    header = request.headers.get(KEY_HEADER)
    if header is not None and not KEY_ID_PATTERN.fullmatch(header):
        raise InvalidParameter(KEY_HEADER, "expected a key id: `pmk_` and 16 lowercase hex digits")
    key_id = body.key_id or header
    if key_id is None:
        raise InvalidParameter(
            "key_id",
            "missing: name the watermark key in the body (`key_id`, the SDK's extra_body) "
            "or in the X-Poissonmark-Key header",
            "missing_key",
        )
    return key_id


def max_tokens_of(body: OpenAIRequest, default: int, settings: Settings) -> tuple[str, int]:
    """The tokens to generate, and the name of the parameter that said so (the schema allows
    one of ``max_tokens`` and ``max_completion_tokens``)."""
    if isinstance(body, ChatCompletionRequest):
        if {"max_tokens", "max_completion_tokens"} <= body.model_fields_set:
            raise InvalidParameter(
                "max_completion_tokens", "give one of max_tokens or max_completion_tokens"
            )
        if body.max_completion_tokens is not None:
            return "max_completion_tokens", body.max_completion_tokens
    if body.max_tokens is not None:
        return "max_tokens", body.max_tokens
    return "max_tokens", min(default, settings.max_new_tokens)


_RENAMED = {"drafts": "B", "lookahead": "L", "nonce": "seed"}


def generate_request(
    body: OpenAIRequest,
    key_id: str,
    max_name: str,
    max_tokens: int,
    *,
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
) -> GenerateRequest:
    """The ``POST /v1/generate`` body of an OpenAI request (its checks and limits apply)."""
    names = renamed(max_name)
    fields: dict[str, Any] = {
        "key_id": key_id,
        "prompt": prompt,
        "messages": messages,
        "method": body.method,
        "drafter": body.drafter,
        "max_new_tokens": max_tokens,
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "nonce": body.seed,
        "stream": body.stream,
        "tree": body.tree,
    }
    for name in ("drafts", "lookahead"):  # omitted: /v1/generate's default, capped there too
        if name in body.model_fields_set:
            fields[name] = getattr(body, name)
    try:
        return GenerateRequest.model_validate(fields)
    except ValidationError as exc:  # a rule of /v1/generate this schema does not repeat
        error = exc.errors()[0]
        loc = [str(names.get(str(p), p)) for p in error["loc"]]
        raise InvalidParameter(".".join(loc) or "body", error["msg"]) from None


def renamed(max_name: str) -> dict[str, str]:
    """``POST /v1/generate``'s field -> its OpenAI parameter, for the errors that name one
    (``max_name``: ``max_tokens`` or ``max_completion_tokens``, whichever the body gave)."""
    return {**_RENAMED, "max_new_tokens": max_name}


def encode_raw_prompt(pool: DetectionPool, body: GenerateRequest, loaded: Any) -> list[int]:
    """The prompt's own ids (no chat template, no special tokens), with this pool thread's
    tokenizer."""
    assert body.prompt is not None
    ids = pool.tokenizer()(body.prompt, add_special_tokens=False)["input_ids"]
    return [int(t) for t in ids]


def facts_of(served: Served, finished: Finished) -> WatermarkFacts:
    r, g = finished.result, served.generation
    return WatermarkFacts(
        key_id=g.key_id,
        nonce=g.nonce,
        method=g.config.method,
        drafter=finished.drafter,
        watermark_applied=r.watermark_applied,
        aatps=r.stats.aatps,
        token_ids=list(r.token_ids),
    )


def usage_of(served: Served, finished: Finished) -> Usage:
    completion = finished.result.stats.emitted_tokens  # EOS included
    return Usage(
        prompt_tokens=served.prompt_tokens,
        completion_tokens=completion,
        total_tokens=served.prompt_tokens + completion,
    )


def finish_reason_of(finished: Finished) -> FinishReason:
    return "stop" if finished.result.finish_reason == "eos" else "length"


def data_line(chunk: dict[str, Any]) -> bytes:
    payload = json.dumps(chunk, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


DONE = b"data: [DONE]\n\n"

ChunkOf = Callable[..., dict[str, Any]]
"""``chunk(text, finish_reason=None, usage=None, facts=None, first=False)`` -> one chunk."""


def chat_chunk(served: Served, reply_id: str, created: int) -> ChunkOf:
    def chunk(
        text: str,
        finish_reason: FinishReason | None = None,
        usage: Usage | None = None,
        facts: WatermarkFacts | WatermarkStart | None = None,
        first: bool = False,
    ) -> dict[str, Any]:
        delta = ChatDelta(role="assistant", content="") if first else ChatDelta(content=text)
        if finish_reason is not None:
            delta = ChatDelta()
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish_reason)
        out = ChatCompletionChunk(
            id=reply_id,
            created=created,
            model=served.model,
            choices=[choice],
            usage=usage,
            poissonmark=facts,
        ).model_dump()
        out["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
        return out

    return chunk


def completion_chunk(served: Served, reply_id: str, created: int) -> ChunkOf:
    def chunk(
        text: str,
        finish_reason: FinishReason | None = None,
        usage: Usage | None = None,
        facts: WatermarkFacts | WatermarkStart | None = None,
        first: bool = False,
    ) -> dict[str, Any]:
        choice = CompletionChoice(index=0, text=text, finish_reason=finish_reason)
        return Completion(
            id=reply_id,
            created=created,
            model=served.model,
            choices=[choice],
            usage=usage,
            poissonmark=facts,
        ).model_dump()

    return chunk
