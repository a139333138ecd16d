"""``POST /v1/generate``: a watermarked completion, whole or as server-sent events.

Parse, admit, run, answer: ``service.admission.admit_generation`` checks the limits, the key
(the caller's tenant's, not revoked, made for the served tokenizer) and the prompt, and
charges the token's generation budget (``generate_rate_limit``), before anything is queued;
then the worker generates, the caller's tenant sharing its slots fairly with the others
(``service.jobs.worker``). A client that disconnects cancels its job (the decoder stops within one
step); so does the deadline (``generation_deadline_s``: 504, or a final ``error`` event). With
``stream=true`` the deltas are decoded here, at the edge (``service.http.streaming``), and
concatenate to exactly the ``text`` the non-streamed call returns for the same key and nonce.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from service.admission import AdmittedGeneration, admit_generation
from service.errors import GenerationCancelled
from service.http.auth import CanGenerate
from service.http.deps import ServiceDep
from service.http.problems import problem_body
from service.http.streaming import EventStreamResponse, IncrementalDecoder, decode_text, sse
from service.jobs.generation import Generated, Generation
from service.jobs.worker import Failed, Finished, GenerationWorker, Job, Tokens
from service.keys.api_tokens import Principal
from service.metrics import Metrics
from service.schemas.common import problem_responses
from service.schemas.generate import GenerateDelta, GenerateRequest, GenerateResponse

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


def submit(
    worker: GenerationWorker, admitted: AdmittedGeneration, principal: Principal, stream: bool
) -> Job:
    """Queue an admitted generation as the principal's tenant's, with its deadline; ``stream``:
    its steps' tokens come back as they are made (else its end alone)."""
    return worker.submit(
        admitted.ids,
        admitted.generation.config,
        admitted.generation.source,
        admitted.generation.drafter,
        tenant=principal.tenant,
        deadline_s=admitted.deadline_s,
        stream=stream,
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
    admitted = await admit_generation(body, principal, service)
    job = submit(service.worker, admitted, principal, body.stream)
    generation, metrics = admitted.generation, service.metrics
    tokenizer = service.resources.loaded.tokenizer  # decode only (immutable) on the event loop
    if body.stream:

        def on_close() -> None:
            if not job.ended.is_set():
                metrics.generations_cancelled.inc()
            job.cancel()

        decoder = IncrementalDecoder(tokenizer)
        return EventStreamResponse(_events(job, generation, decoder), on_close)
    finished = await result_unless_gone(job, request, metrics)
    return _response(generation, finished, decode_text(tokenizer, finished.result.token_ids))
