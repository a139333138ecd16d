"""``POST /v1/detect`` and ``POST /v1/detect/batch``: is this text watermarked by my keys?

The detector is an oracle (an attacker could probe it to learn the watermark), so every text
is charged to the caller's token in the Redis rate limit before any work. The work itself —
key lookups and the detector — runs on the detection pool, off the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import CanDetect, raw_evidence
from service.deps import LimiterDep, MetricsDep, PoolDep, ResourcesDep, SettingsDep, StoreDep
from service.limits import check_batch, check_detect_input
from service.schemas.common import problem_responses
from service.schemas.detect import (
    DetectBatchRequest,
    DetectBatchResponse,
    DetectRequest,
    DetectResponse,
)

router = APIRouter(prefix="/v1/detect", tags=["detect"])
_ERRORS = problem_responses(400, 401, 403, 404, 409, 413, 422, 429, 503)


@router.post("", responses=_ERRORS)
async def detect(
    body: DetectRequest,
    principal: CanDetect,
    settings: SettingsDep,
    store: StoreDep,
    pool: PoolDep,
    limiter: LimiterDep,
    metrics: MetricsDep,
    resources: ResourcesDep,
) -> DetectResponse:
    """Test one text against one key, or against every key of your tenant."""
    check_detect_input(body, settings, resources.vocab_size)
    await limiter.spend(principal.token_id)
    model = resources.loaded.model if body.reads_model else None
    (result,) = await pool.run(
        pool.detect_all,
        store,
        principal.tenant,
        [body],
        body,
        settings.max_keys_per_detect,
        model,
        False,
        raw_evidence(principal),
    )
    metrics.detections.labels(result["verdict"]).inc()
    return DetectResponse.model_validate(result)


@router.post("/batch", responses=_ERRORS)
async def detect_batch(
    body: DetectBatchRequest,
    principal: CanDetect,
    settings: SettingsDep,
    store: StoreDep,
    pool: PoolDep,
    limiter: LimiterDep,
    metrics: MetricsDep,
    resources: ResourcesDep,
) -> DetectBatchResponse:
    """Test several texts with the same options (each counts against the rate limit)."""
    check_batch(body.items, settings, resources.vocab_size)
    await limiter.spend(principal.token_id, len(body.items))
    model = resources.loaded.model if body.reads_model else None
    results = await pool.run(
        pool.detect_all,
        store,
        principal.tenant,
        body.items,
        body,
        settings.max_keys_per_detect,
        model,
        True,
        raw_evidence(principal),
    )
    for result in results:
        metrics.detections.labels(result["verdict"]).inc()
    return DetectBatchResponse.model_validate({"results": results})
