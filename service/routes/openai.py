"""OpenAI-compatible ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``.

What the OpenAI SDK, LangChain and chat UIs speak, over poissonmark's one generation path: the
body becomes a ``GenerateRequest`` (so the schema's ranges and the server's limits are those of
``POST /v1/generate``), ``service.generation`` binds it to the caller's key, the worker's queue
runs it (503 + Retry-After when full) and ``service.streaming`` decodes the stream.

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
- errors are OpenAI's ``{"error": {...}}`` (``service.openai_errors``).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from pydantic import ValidationError

from service.api_tokens import Principal
from service.auth import CanGenerate
from service.deps import MetricsDep, PoolDep, ResourcesDep, SettingsDep, StoreDep, WorkerDep
from service.detection import DetectionPool
from service.errors import KEY_ID_PATTERN, LimitExceeded
from service.generation import Generation, from_body, prepare
from service.keystore import KeyStore
from service.limits import capped_defaults, check_drafter, check_generate, check_prompt_tokens
from service.metrics import Metrics
from service.openai_errors import InvalidParameter, ModelNotFound, OpenAIRoute, openai_error
from service.resources import Resources
from service.routes.generate import _encode, _result_unless_gone
from service.schemas.generate import GenerateRequest
from service.schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReason,
    ModelCard,
    ModelList,
    OpenAIError,
    OpenAIRequest,
    Usage,
    WatermarkFacts,
    WatermarkStart,
)
from service.settings import Settings
from service.streaming import EventStreamResponse, IncrementalDecoder, decode_text
from service.worker import Failed, Finished, GenerationWorker, Job, Tokens

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)

CHAT_MAX_TOKENS = 128
"""``max_tokens`` of a chat completion that names none (``POST /v1/generate``'s default)."""
COMPLETION_MAX_TOKENS = 16
"""``max_tokens`` of a completion that names none (OpenAI's documented default)."""

KEY_HEADER = "X-Poissonmark-Key"
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
    503: "Generation queue full, key store unreachable or not ready; see Retry-After.",
    "default": "Any other error (405 for another method, 500), in the same shape.",
}


def _errors(*statuses: int | str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` with OpenAI's error body (``default`` also keeps FastAPI from
    documenting a 422 these routes never send)."""
    return {s: {"model": OpenAIError, "description": _ERROR_DESCRIPTIONS[s]} for s in statuses}


_GENERATION_ERRORS = _errors(400, 401, 403, 404, 409, 413, 503, "default")


def _stream_doc(chunk: str) -> dict[str, Any]:
    return {
        "description": f"The answer; with `stream: true`, `text/event-stream` of `data: <{chunk}>` "
        "chunks, then `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }


def served_model(resources: Resources) -> str:
    """The id clients name in ``model``: the served model's name (a directory's last part)."""
    name = resources.loaded.name
    return Path(name).name if Path(name).is_dir() else name


@dataclasses.dataclass
class _Served:
    """A started generation: what ran, its job, and how to word the answer."""

    generation: Generation
    job: Job
    prompt_tokens: int
    model: str
    tokenizer: Any  # decode only (immutable), on the event loop


def _key_id(body: OpenAIRequest, request: Request) -> str:
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


def _max_tokens(body: OpenAIRequest, default: int, settings: Settings) -> tuple[str, int]:
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


def _generate_request(
    body: OpenAIRequest,
    key_id: str,
    max_name: str,
    max_tokens: int,
    *,
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
) -> GenerateRequest:
    """The ``POST /v1/generate`` body of an OpenAI request (its checks and limits apply)."""
    renamed = {**_RENAMED, "max_new_tokens": max_name}
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
    }
    for name in ("drafts", "lookahead"):  # omitted: /v1/generate's default, capped there too
        if name in body.model_fields_set:
            fields[name] = getattr(body, name)
    try:
        return GenerateRequest.model_validate(fields)
    except ValidationError as exc:  # a rule of /v1/generate this schema does not repeat
        error = exc.errors()[0]
        loc = [str(renamed.get(str(p), p)) for p in error["loc"]]
        raise InvalidParameter(".".join(loc) or "body", error["msg"]) from None


def _checked(
    wanted: GenerateRequest, settings: Settings, resources: Resources, max_name: str
) -> GenerateRequest:
    """``/v1/generate``'s checks of ``wanted`` (limits, the served drafters), with a limit
    named by its OpenAI parameter; omitted B and L lowered to the limits, as there."""
    renamed = {**_RENAMED, "max_new_tokens": max_name}
    wanted = capped_defaults(wanted, settings)
    try:
        check_generate(wanted, settings)
    except LimitExceeded as exc:
        raise LimitExceeded(
            renamed.get(exc.field, exc.field), exc.limit, exc.actual, exc.unit
        ) from None
    check_drafter(wanted.drafter, resources.drafters)
    return wanted


def _encode_raw(pool: DetectionPool, body: GenerateRequest, loaded: Any) -> list[int]:
    """The prompt's own ids (no chat template, no special tokens), with this pool thread's
    tokenizer."""
    assert body.prompt is not None
    ids = pool.tokenizer()(body.prompt, add_special_tokens=False)["input_ids"]
    return [int(t) for t in ids]


async def _start(
    wanted: GenerateRequest,
    raw: bool,
    principal: Principal,
    settings: Settings,
    store: KeyStore,
    worker: GenerationWorker,
    pool: DetectionPool,
    resources: Resources,
) -> _Served:
    request = from_body(wanted)
    record = await to_thread.run_sync(store.get_active, wanted.key_id, principal.tenant)
    generation = prepare(record, resources.fingerprint, request)
    ids = await pool.run(_encode_raw if raw else _encode, pool, wanted, resources.loaded)
    try:
        check_prompt_tokens(len(ids), settings)
    except LimitExceeded as exc:
        field = "prompt" if raw else "messages"
        raise LimitExceeded(field, exc.limit, exc.actual, exc.unit) from None
    job = worker.submit(ids, generation.config, generation.source, generation.drafter)
    loaded = resources.loaded
    model = served_model(resources)
    return _Served(generation, job, len(ids), model, loaded.tokenizer)


def _facts(served: _Served, finished: Finished) -> WatermarkFacts:
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


def _usage(served: _Served, finished: Finished) -> Usage:
    completion = finished.result.stats.emitted_tokens  # EOS included
    return Usage(
        prompt_tokens=served.prompt_tokens,
        completion_tokens=completion,
        total_tokens=served.prompt_tokens + completion,
    )


def _finish_reason(finished: Finished) -> FinishReason:
    return "stop" if finished.result.finish_reason == "eos" else "length"


def _data(chunk: dict[str, Any]) -> bytes:
    payload = json.dumps(chunk, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


_DONE = b"data: [DONE]\n\n"

ChunkOf = Callable[..., dict[str, Any]]
"""``chunk(text, finish_reason=None, usage=None, facts=None, first=False)`` -> one chunk."""


async def _chunks(
    served: _Served, chunk: ChunkOf, include_usage: bool, request: Request
) -> AsyncIterator[bytes]:
    """The stream of one generation as OpenAI chunks (module docstring)."""
    decoder = IncrementalDecoder(served.tokenizer)
    yield _data(chunk("", facts=WatermarkStart(**served.generation.start_json()), first=True))
    while True:
        event = await served.job.events.get()
        if isinstance(event, Tokens):
            text = decoder.push(event.ids)
            if text:
                yield _data(chunk(text))
        elif isinstance(event, Finished):
            tail = decoder.finish()
            if tail:
                yield _data(chunk(tail))
            usage = _usage(served, event)
            facts = _facts(served, event)
            reason = _finish_reason(event)
            yield _data(chunk("", reason, None if include_usage else usage, facts))
            if include_usage:
                yield _data({**chunk(""), "choices": [], "usage": usage.model_dump()})
            yield _DONE
            return
        elif isinstance(event, Failed):
            body = json.loads(bytes(openai_error(_as_exception(event.error), request).body))
            yield _data(body)
            yield _DONE
            return


def _as_exception(error: BaseException) -> Exception:
    return error if isinstance(error, Exception) else RuntimeError(type(error).__name__)


def _stream(
    served: _Served, chunk: ChunkOf, body: OpenAIRequest, request: Request, metrics: Metrics
) -> EventStreamResponse:
    job = served.job

    def on_close() -> None:
        if not job.ended.is_set():
            metrics.generations_cancelled.inc()
        job.cancel()

    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return EventStreamResponse(_chunks(served, chunk, include_usage, request), on_close)


def _chat_chunk(served: _Served, reply_id: str, created: int) -> ChunkOf:
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


def _completion_chunk(served: _Served, reply_id: str, created: int) -> ChunkOf:
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


def _check_model(body: OpenAIRequest, resources: Resources) -> None:
    served = served_model(resources)
    if body.model != served:
        raise ModelNotFound(served)


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
    settings: SettingsDep,
    store: StoreDep,
    worker: WorkerDep,
    pool: PoolDep,
    resources: ResourcesDep,
    metrics: MetricsDep,
) -> ChatCompletion | EventStreamResponse:
    """OpenAI's chat completion, watermarked with the caller's key (`key_id` or the
    `X-Poissonmark-Key` header); `seed` is the watermark nonce; the watermark facts are in
    `poissonmark`. Errors are OpenAI's `{"error": {...}}`."""
    _check_model(body, resources)
    key_id = _key_id(body, request)
    max_name, max_tokens = _max_tokens(body, CHAT_MAX_TOKENS, settings)
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in body.messages
    ]
    wanted = _generate_request(body, key_id, max_name, max_tokens, messages=messages)
    wanted = _checked(wanted, settings, resources, max_name)
    served = await _start(wanted, False, principal, settings, store, worker, pool, resources)
    reply_id, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    if body.stream:
        return _stream(served, _chat_chunk(served, reply_id, created), body, request, metrics)
    finished = await _result_unless_gone(served.job, request, metrics)
    text = decode_text(served.tokenizer, finished.result.token_ids)
    choice = ChatChoice(
        index=0,
        message=AssistantMessage(content=text),
        finish_reason=_finish_reason(finished),
    )
    return ChatCompletion(
        id=reply_id,
        created=created,
        model=served.model,
        choices=[choice],
        usage=_usage(served, finished),
        poissonmark=_facts(served, finished),
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
    settings: SettingsDep,
    store: StoreDep,
    worker: WorkerDep,
    pool: PoolDep,
    resources: ResourcesDep,
    metrics: MetricsDep,
) -> Completion | EventStreamResponse:
    """OpenAI's (legacy) completion: a watermarked raw continuation of `prompt` (no chat
    template). Key, seed, extension fields and errors as for chat completions."""
    _check_model(body, resources)
    key_id = _key_id(body, request)
    max_name, max_tokens = _max_tokens(body, COMPLETION_MAX_TOKENS, settings)
    wanted = _generate_request(body, key_id, max_name, max_tokens, prompt=body.prompt)
    wanted = _checked(wanted, settings, resources, max_name)
    served = await _start(wanted, True, principal, settings, store, worker, pool, resources)
    reply_id, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    if body.stream:
        return _stream(served, _completion_chunk(served, reply_id, created), body, request, metrics)
    finished = await _result_unless_gone(served.job, request, metrics)
    text = decode_text(served.tokenizer, finished.result.token_ids)
    choice = CompletionChoice(
        index=0,
        text=text,
        finish_reason=_finish_reason(finished),
    )
    return Completion(
        id=reply_id,
        created=created,
        model=served.model,
        choices=[choice],
        usage=_usage(served, finished),
        poissonmark=_facts(served, finished),
    )


@router.get("/models", response_model=ModelList, responses=_errors(401, 403, 503, "default"))
async def list_models(principal: CanGenerate, resources: ResourcesDep) -> ModelList:
    """The one model this server serves (what `model` must name)."""
    card = ModelCard(id=served_model(resources), created=0, owned_by="poissonmark")
    return ModelList(data=[card])
