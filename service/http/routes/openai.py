"""OpenAI-compatible ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``.

What the OpenAI SDK, LangChain and chat UIs speak, over poissonmark's one generation path: the
body becomes a ``GenerateRequest`` (so the schema's ranges and the server's limits are those of
``POST /v1/generate``), ``service.jobs.generation`` binds it to the caller's key, it is charged
to the token's generation budget as there (prompt tokens + ``max_tokens``: 429 + Retry-After
beyond it), the worker's queue runs it (503 + Retry-After when full; 504 past
``generation_deadline_s``) and ``service.http.streaming`` decodes the stream.

- chat completions go through the model's chat template, as ``/v1/generate`` messages do;
  completions continue ``prompt`` as raw text (no template), as OpenAI's legacy endpoint does.
- the key: ``key_id`` in the body (the SDK's ``extra_body``) or the ``X-Poissonmark-Key``
  header; ``seed`` is the watermark nonce (random when omitted, returned either way).
- the answer's text is ``/v1/generate``'s ``text`` (the completion alone, EOS not included);
  ``poissonmark.token_ids`` its ids, for exact detection; ``usage.completion_tokens`` counts
  the EOS token too (every token the model emitted).
- ``stream=true``: ``data:`` chunks, then ``data: [DONE]``. The first chunk carries
  ``poissonmark`` {key_id, nonce, method}, the finishing one the ``finish_reason``, the full
  ``poissonmark`` facts and ``usage`` (with ``stream_options.include_usage`` the ``usage`` comes
  in OpenAI's extra last chunk with ``choices: []`` instead). The text deltas concatenate to
  the non-streamed text for the same key and seed. An error after the first chunk comes as
  ``data: {"error": …}``, then ``[DONE]``.
- errors are OpenAI's ``{"error": {...}}`` (``service.http.openai_errors``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from service.admission import admit_generation, encode_chat_prompt
from service.errors import KEY_ID_PATTERN
from service.http.auth import CanGenerate
from service.http.deps import ResourcesDep, ServiceDep, ServiceDeps
from service.http.openai_compat import (
    DONE,
    KEY_HEADER,
    ChunkOf,
    Served,
    chat_chunk,
    completion_chunk,
    data_line,
    encode_raw_prompt,
    facts_of,
    finish_reason_of,
    generate_request,
    key_id_of,
    max_tokens_of,
    renamed,
    served_model,
    usage_of,
)
from service.http.openai_errors import ModelNotFound, OpenAIRoute, openai_error
from service.http.routes.generate import result_unless_gone, submit
from service.http.streaming import EventStreamResponse, IncrementalDecoder, decode_text
from service.jobs.resources import Resources
from service.jobs.worker import Failed, Finished, Tokens
from service.keys.api_tokens import Principal
from service.metrics import Metrics
from service.schemas.generate import GenerateRequest
from service.schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIError,
    OpenAIRequest,
    ServedModelFacts,
    WatermarkStart,
)

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)

CHAT_MAX_TOKENS = 128
"""``max_tokens`` of a chat completion that names none (``POST /v1/generate``'s default)."""
COMPLETION_MAX_TOKENS = 16
"""``max_tokens`` of a completion that names none (OpenAI's documented default)."""

_KEY_HEADER_DOC = {
    "parameters": [
        {
            "name": KEY_HEADER,
            "in": "header",
            "required": False,
            "description": "The watermark key id, when the body has no `key_id`.",
            "schema": {"type": "string", "pattern": f"^{KEY_ID_PATTERN.pattern}$"},
        }
    ]
}
"""Documented by hand: FastAPI would type the optional header "string or null", and a header
cannot be null."""


_ERROR_DESCRIPTIONS: dict[int | str, str] = {
    400: "Invalid, unknown or unsupported parameter, a limit exceeded, malformed JSON.",
    401: "Missing, invalid or revoked bearer token.",
    403: "The token lacks the `generate` scope.",
    404: "Unknown key (or another tenant's), or a model this server does not serve.",
    409: "The key cannot generate (revoked, made for another tokenizer).",
    413: "Request body over the size limit.",
    415: "The body is not JSON (`Content-Type` other than `application/json`).",
    429: "The token's generation budget (`generate_rate_limit`) is spent; see Retry-After.",
    503: "Generation queue full, key store unreachable or not ready; see Retry-After.",
    504: "The generation ran past its deadline (`generation_deadline_s`).",
    "default": "Any other error (405 for another method, 500), in the same shape.",
}


def _errors(*statuses: int | str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` with OpenAI's error body (``default`` also keeps FastAPI from
    documenting a 422 these routes never send)."""
    return {s: {"model": OpenAIError, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


_GENERATION_ERRORS = _errors(400, 401, 403, 404, 409, 413, 415, 429, 503, 504, "default")


def _stream_doc(chunk: str) -> dict[str, Any]:
    return {
        "description": f"The answer; with `stream: true`, `text/event-stream` of `data: <{chunk}>` "
        "chunks, then `data: [DONE]`.",
        "content": {
            "text/event-stream": {
                "schema": {  # one server-sent event (no `event:` line: the default, message)
                    "type": "object",
                    "properties": {
                        "event": {"type": "string", "enum": ["message"]},
                        "data": {
                            "type": "string",
                            "description": f"A {chunk} as JSON, or `[DONE]` after the last.",
                        },
                    },
                    "required": ["data"],
                }
            }
        },
    }


async def _start(
    wanted: GenerateRequest,
    raw: bool,
    max_name: str,
    principal: Principal,
    service: ServiceDeps,
    stream: bool,
) -> Served:
    """Admit ``wanted`` as ``POST /v1/generate`` does (a limit named by its OpenAI parameter)
    and queue it."""
    admitted = await admit_generation(
        wanted,
        principal,
        service,
        encode=encode_raw_prompt if raw else encode_chat_prompt,
        renamed=renamed(max_name),
        prompt_field="prompt" if raw else "messages",
    )
    job = submit(service.worker, admitted, principal, stream)
    resources = service.resources
    model = served_model(resources)
    return Served(admitted.generation, job, len(admitted.ids), model, resources.loaded.tokenizer)


async def _chunks(
    served: Served, chunk: ChunkOf, include_usage: bool, request: Request
) -> AsyncIterator[bytes]:
    """The stream of one generation as OpenAI chunks (module docstring)."""
    decoder = IncrementalDecoder(served.tokenizer)
    yield data_line(chunk("", facts=WatermarkStart(**served.generation.start_json()), first=True))
    while True:
        event = await served.job.next_event()
        if isinstance(event, Tokens):
            text = decoder.push(event.ids)
            if text:
                yield data_line(chunk(text))
        elif isinstance(event, Finished):
            tail = decoder.finish()
            if tail:
                yield data_line(chunk(tail))
            usage = usage_of(served, event)
            facts = facts_of(served, event)
            reason = finish_reason_of(event)
            yield data_line(chunk("", reason, None if include_usage else usage, facts))
            if include_usage:
                yield data_line({**chunk(""), "choices": [], "usage": usage.model_dump()})
            yield DONE
            return
        elif isinstance(event, Failed):
            body = json.loads(bytes(openai_error(_as_exception(event.error), request).body))
            yield data_line(body)
            yield DONE
            return


def _as_exception(error: BaseException) -> Exception:
    return error if isinstance(error, Exception) else RuntimeError(type(error).__name__)


def _stream(
    served: Served, chunk: ChunkOf, body: OpenAIRequest, request: Request, metrics: Metrics
) -> EventStreamResponse:
    job = served.job

    def on_close() -> None:
        if not job.ended.is_set():
            metrics.generations_cancelled.inc()
        job.cancel()

    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return EventStreamResponse(_chunks(served, chunk, include_usage, request), on_close)


def _check_model(body: OpenAIRequest, resources: Resources) -> None:
    served = served_model(resources)
    if body.model != served:
        raise ModelNotFound(served)


def _reply_fields(served: Served, reply_id: str, created: int, done: Finished) -> dict[str, Any]:
    """What a chat completion and a completion answer share besides their choice."""
    return {
        "id": reply_id,
        "created": created,
        "model": served.model,
        "usage": usage_of(served, done),
        "poissonmark": facts_of(served, done),
    }


async def _answer(
    served: Served,
    body: OpenAIRequest,
    request: Request,
    metrics: Metrics,
    id_prefix: str,
    chunk_of: Callable[[Served, str, int], ChunkOf],
    reply_of: Callable[[str, Finished, dict[str, Any]], ChatCompletion | Completion],
) -> ChatCompletion | Completion | EventStreamResponse:
    """The stream of a started generation, or its whole answer once it finished."""
    reply_id, created = f"{id_prefix}-{secrets.token_hex(12)}", int(time.time())
    if body.stream:
        return _stream(served, chunk_of(served, reply_id, created), body, request, metrics)
    finished = await result_unless_gone(served.job, request, metrics)
    text = decode_text(served.tokenizer, finished.result.token_ids)
    return reply_of(text, finished, _reply_fields(served, reply_id, created, finished))


def _chat_reply(text: str, done: Finished, fields: dict[str, Any]) -> ChatCompletion:
    message = AssistantMessage(content=text)
    choice = ChatChoice(index=0, message=message, finish_reason=finish_reason_of(done))
    return ChatCompletion(choices=[choice], **fields)


def _completion_reply(text: str, done: Finished, fields: dict[str, Any]) -> Completion:
    choice = CompletionChoice(index=0, text=text, finish_reason=finish_reason_of(done))
    return Completion(choices=[choice], **fields)


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={200: _stream_doc("ChatCompletionChunk"), **_GENERATION_ERRORS},
    openapi_extra=_KEY_HEADER_DOC,
)
async def chat_completions(
    body: ChatCompletionRequest,
    principal: CanGenerate,
    request: Request,
    service: ServiceDep,
) -> ChatCompletion | Completion | EventStreamResponse:
    """OpenAI's chat completion, watermarked with the caller's key (`key_id` or the
    `X-Poissonmark-Key` header); `seed` is the watermark nonce; the watermark facts are in
    `poissonmark`. Errors are OpenAI's `{"error": {...}}`."""
    settings, resources = service.settings, service.resources
    _check_model(body, resources)
    max_name, max_tokens = max_tokens_of(body, CHAT_MAX_TOKENS, settings)
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in body.messages
    ]
    wanted = generate_request(
        body, key_id_of(body, request), max_name, max_tokens, messages=messages
    )
    served = await _start(wanted, False, max_name, principal, service, body.stream)
    return await _answer(
        served, body, request, service.metrics, "chatcmpl", chat_chunk, _chat_reply
    )


@router.post(
    "/completions",
    response_model=Completion,
    responses={200: _stream_doc("Completion"), **_GENERATION_ERRORS},
    openapi_extra=_KEY_HEADER_DOC,
)
async def completions(
    body: CompletionRequest,
    principal: CanGenerate,
    request: Request,
    service: ServiceDep,
) -> ChatCompletion | Completion | EventStreamResponse:
    """OpenAI's (legacy) completion: a watermarked raw continuation of `prompt` (no chat
    template). Key, seed, extension fields and errors as for chat completions."""
    settings, resources = service.settings, service.resources
    _check_model(body, resources)
    max_name, max_tokens = max_tokens_of(body, COMPLETION_MAX_TOKENS, settings)
    wanted = generate_request(
        body, key_id_of(body, request), max_name, max_tokens, prompt=body.prompt
    )
    served = await _start(wanted, True, max_name, principal, service, body.stream)
    return await _answer(
        served, body, request, service.metrics, "cmpl", completion_chunk, _completion_reply
    )


@router.get("/models", response_model=ModelList, responses=_errors(401, 403, 503, "default"))
async def list_models(principal: CanGenerate, resources: ResourcesDep) -> ModelList:
    """The one model this server serves (what `model` must name), and its tokenizer's
    fingerprint (what a key must have been made for)."""
    facts = ServedModelFacts(tokenizer=resources.fingerprint)
    card = ModelCard(
        id=served_model(resources), created=0, owned_by="poissonmark", poissonmark=facts
    )
    return ModelList(data=[card])
