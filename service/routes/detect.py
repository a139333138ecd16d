"""``POST /v1/detect`` and ``POST /v1/detect/batch``: is this text watermarked by my keys?

The detector is an oracle (an attacker could probe it to learn the watermark), so every
request's cost is bounded and charged to the caller's token in the Redis rate limit before
the keyed work: one unit per item at once, then — after the pool has counted the keys to test
(from the key index, no record read) and tokenized the items — the rest of
ceil(tokens × keys / ``detect_work_unit``) per item, at most a whole window's budget, whether
the request then passes its limits or not (its tokenizing was work). A request over
``max_tokens``, ``max_evidence_tokens`` or a whole window's budget is refused (422). The
work itself — key lookups and the detector — runs on the detection pool, off the event loop.
A request that takes more than ``detect_deadline_s`` (waiting for a pool thread included) is
answered 504 ``deadline-exceeded``: its work not yet started on the pool never starts; work
under way (bounded by the limits above) finishes and is dropped.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from service.api_tokens import Principal
from service.auth import CanDetect, raw_evidence
from service.deps import ServiceDep, ServiceDeps
from service.detection import DetectPlan
from service.errors import DeadlineExceeded, LimitExceeded
from service.limits import check_batch, check_detect_input
from service.schemas.common import problem_responses
from service.schemas.detect import (
    DetectBatchRequest,
    DetectBatchResponse,
    DetectInput,
    DetectOptions,
    DetectRequest,
    DetectResponse,
)

router = APIRouter(prefix="/v1/detect", tags=["detect"])
_ERRORS = problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504)


async def _detect(
    items: list[DetectInput],
    options: DetectOptions,
    *,
    batch: bool,
    principal: Principal,
    service: ServiceDeps,
) -> list[DetectResponse]:
    """``_charged_detect`` within the deadline (``detect_deadline_s``; module docstring)."""
    limit = service.settings.detect_deadline_s
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await _charged_detect(
                items, options, batch=batch, principal=principal, service=service
            )
    except TimeoutError:
        if not deadline.expired():  # another timeout, not the deadline's
            raise
        raise DeadlineExceeded("detect_deadline_s", limit) from None


async def _charged_detect(
    items: list[DetectInput],
    options: DetectOptions,
    *,
    batch: bool,
    principal: Principal,
    service: ServiceDeps,
) -> list[DetectResponse]:
    """Charge, plan, charge the planned work, run (module docstring); the served target is
    passed to the tests that read it when ``options.reads_model``."""
    settings, store, pool, limiter = service.settings, service.store, service.pool, service.limiter
    model = service.resources.loaded.target if options.reads_model else None
    await limiter.spend(principal.token_id, len(items))
    max_keys = settings.max_keys_per_detect
    plan: DetectPlan = await pool.run(
        pool.plan, store, principal.tenant, items, options, max_keys, batch
    )
    unit = settings.detect_work_unit
    cost = plan.cost(unit)
    # charged as planned (tokenizing a refused text was work too), at most a window's budget
    charge = min(cost, limiter.limit) - len(items)
    if charge > 0:
        await limiter.spend(principal.token_id, charge)
    pool.check_plan(plan, items, options, batch)
    if cost > limiter.limit:
        field = "items" if batch else ("text" if items[0].token_ids is None else "token_ids")
        raise LimitExceeded(
            field,
            limiter.limit,
            cost,
            f"work units per request (ceil(tokens × keys tested / {unit}) per item, the "
            "detect_rate_limit of a whole window)",
        )
    return await pool.run(
        pool.run_plan,
        store,
        principal.tenant,
        items,
        plan,
        options,
        max_keys,
        model,
        batch,
        raw_evidence(principal),
    )


@router.post("", responses=_ERRORS)
async def detect(
    body: DetectRequest,
    principal: CanDetect,
    service: ServiceDep,
) -> DetectResponse:
    """Test one text against one key, or against every key of your tenant."""
    check_detect_input(body, service.settings, service.resources.vocab_size)
    (result,) = await _detect([body], body, batch=False, principal=principal, service=service)
    service.metrics.detections.labels(result.verdict).inc()
    return result


@router.post("/batch", responses=_ERRORS)
async def detect_batch(
    body: DetectBatchRequest,
    principal: CanDetect,
    service: ServiceDep,
) -> DetectBatchResponse:
    """Test several texts with the same options (each costs its work in the rate limit)."""
    check_batch(body.items, service.settings, service.resources.vocab_size)
    results = await _detect(body.items, body, batch=True, principal=principal, service=service)
    for result in results:
        service.metrics.detections.labels(result.verdict).inc()
    return DetectBatchResponse(results=results)
