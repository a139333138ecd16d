"""``POST /v1/generate``: a watermarked completion, whole or as server-sent events.

The handler checks limits, the key (the caller's tenant's, not revoked, made for the served
tokenizer) and the prompt length before it queues anything, and charges the token's
generation budget (``generate_rate_limit``): the new tokens asked for before the prompt is
tokenized, its tokens after (``charge_new_tokens``, ``charge_prompt``); then the worker
generates, the caller's tenant sharing its slots fairly with the others
(``service.worker``). A client that disconnects cancels its job (the decoder stops within one
step); so does the deadline (``generation_deadline_s``: 504, or a final ``error`` event). With
``stream=true`` the deltas are decoded here, at the edge (``service.streaming``), and
concatenate to exactly the ``text`` the non-streamed call returns for the same key and nonce.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request

from sampler.completion import prompt_ids
from service.api_tokens import Principal
from service.auth import CanGenerate
from service.deps import ServiceDep
from service.detection_pool import DetectionPool
from service.errors import GenerationCancelled, LimitExceeded
from service.generation import Generated, Generation, from_body, prepare
from service.limits import (
    capped_defaults,
    check_drafter,
    check_generate,
    check_prompt_tokens,
)
from service.metrics import Metrics
from service.problems import problem_body
from service.ratelimit import RateLimiter
from service.schemas.common import problem_responses
from service.schemas.generate import GenerateDelta, GenerateRequest, GenerateResponse
from service.settings import Settings
from service.streaming import EventStreamResponse, IncrementalDecoder, decode_text, sse
from service.worker import Failed, Finished, GenerationWorker, Job, Tokens

router = APIRouter(prefix="/v1", tags=["generate"])

_STREAM_DOC = {
    "description": "The completion; with `stream: true`, `text/event-stream` events `start`, "
    "`delta` (GenerateDelta) ..., then `done` (GenerateResponse) or `error` (Problem).",
    "content": {
        "text/event-stream": {
            "schema": {  # one event (OpenAPI 3.1: the schema of an event stream is per event)
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["start", "delta", "done", "error"]},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "description": "The event's JSON: `start` {key_id, nonce, method}, "
                        "`delta` GenerateDelta, `done` GenerateResponse, `error` Problem.",
                    },
                },
                "required": ["event", "data"],
            }
        }
    },
}


def encode_chat_prompt(pool: DetectionPool, body: GenerateRequest, loaded: Any) -> list[int]:
    """Prompt ids through the chat template, with this pool thread's tokenizer."""
    mine = dataclasses.replace(loaded, tokenizer=pool.tokenizer())
    messages = None if body.messages is None else [m.model_dump() for m in body.messages]
    return prompt_ids(mine, body.prompt, messages)


async def charge_new_tokens(
    limiter: RateLimiter, principal: Principal, new_tokens: int, field: str
) -> None:
    """Charge the new tokens a generation asks for (``field``: the request's name for them),
    before its prompt is tokenized: a token without budget left costs no tokenizing."""
    await limiter.spend(principal.token_id, min(new_tokens, limiter.limit))
    if new_tokens > limiter.limit:
        raise _over_window(limiter, new_tokens, field)


async def charge_prompt(
    limiter: RateLimiter, principal: Principal, prompt_tokens: int, new_tokens: int, field: str
) -> None:
    """Charge the prompt's tokens (tokenizing was work, whether the request then passes its
    limits or not), the request at most a window's budget in all; a request costing more than
    a whole window (prompt + new tokens) is refused, naming ``field`` (the new tokens')."""
    charge = min(prompt_tokens, limiter.limit - new_tokens)  # the new tokens are charged
    if charge > 0:
        await limiter.spend(principal.token_id, charge)
    if prompt_tokens + new_tokens > limiter.limit:
        raise _over_window(limiter, prompt_tokens + new_tokens, field)


def _over_window(limiter: RateLimiter, cost: int, field: str) -> LimitExceeded:
    return LimitExceeded(
        field,
        limiter.limit,
        cost,
        "tokens per request, prompt + new tokens (the generate_rate_limit of a whole window)",
    )


def submit(
    worker: GenerationWorker,
    ids: list[int],
    generation: Generation,
    principal: Principal,
    settings: Settings,
) -> Job:
    """Queue the generation as the principal's tenant's, with the deadline of the settings."""
    return worker.submit(
        ids,
        generation.config,
        generation.source,
        generation.drafter,
        tenant=principal.tenant,
        deadline_s=settings.generation_deadline_s,
    )


def _response(generation: Generation, finished: Finished, text: str) -> GenerateResponse:
    done = Generated(generation, text, finished.result, finished.drafter)
    return GenerateResponse.model_validate(done.to_json())


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (the body was read: only ``http.disconnect`` comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def result_unless_gone(job: Job, request: Request, metrics: Metrics) -> Finished:
    result = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if result.done():
            return result.result()
        metrics.generations_cancelled.inc()
        raise GenerationCancelled()
    finally:
        job.cancel()  # a no-op once the job finished
        for task in (result, gone):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _events(
    job: Job, generation: Generation, decoder: IncrementalDecoder
) -> AsyncIterator[bytes]:
    yield sse("start", generation.start_json())
    while True:
        event = await job.next_event()
        if isinstance(event, Tokens):
            delta = GenerateDelta(text=decoder.push(event.ids), token_ids=event.ids)
            yield sse("delta", delta.model_dump())
        elif isinstance(event, Finished):
            tail = decoder.finish()
            if tail:
                yield sse("delta", GenerateDelta(text=tail, token_ids=[]).model_dump())
            done = _response(generation, event, decoder.text)
            yield sse("done", done.model_dump())
            return
        elif isinstance(event, Failed):
            yield sse("error", problem_body(event.error, "/v1/generate"))
            return


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses={
        200: _STREAM_DOC,
        **problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504),
    },
)
async def generate(
    body: GenerateRequest,
    principal: CanGenerate,
    request: Request,
    service: ServiceDep,
) -> GenerateResponse | EventStreamResponse:
    """Sample a watermarked completion with the caller's key (an exact sample of the model)."""
    settings, resources, pool, metrics, limiter = (
        service.settings,
        service.resources,
        service.pool,
        service.metrics,
        service.generate_limiter,
    )
    body = capped_defaults(body, settings)
    check_generate(body, settings)
    check_drafter(body.drafter, resources.drafters)
    wanted = from_body(body)
    record = await to_thread.run_sync(service.store.get_active, body.key_id, principal.tenant)
    generation = prepare(record, resources.fingerprint, wanted)
    await charge_new_tokens(limiter, principal, body.max_new_tokens, "max_new_tokens")
    ids = await pool.run(encode_chat_prompt, pool, body, resources.loaded)
    await charge_prompt(limiter, principal, len(ids), body.max_new_tokens, "max_new_tokens")
    check_prompt_tokens(
        len(ids), settings.max_prompt_tokens, "prompt" if body.messages is None else "messages"
    )
    job = submit(service.worker, ids, generation, principal, settings)
    tokenizer = resources.loaded.tokenizer  # decode only (immutable) on the event loop
    if body.stream:

        def on_close() -> None:
            if not job.ended.is_set():
                metrics.generations_cancelled.inc()
            job.cancel()

        decoder = IncrementalDecoder(tokenizer)
        return EventStreamResponse(_events(job, generation, decoder), on_close)
    finished = await result_unless_gone(job, request, metrics)
    return _response(generation, finished, decode_text(tokenizer, finished.result.token_ids))
