"""``POST /v1/detect`` and ``POST /v1/detect/batch``: is this text watermarked by my keys?

Parse, admit, run, answer. The detector is an oracle (an attacker could probe it to learn the
watermark), so ``service.admission.admit_detection`` bounds every request's cost and charges
it to the caller's token in the Redis rate limit before the keyed work (its docstring: the
caps, the charges, the plan's limits). The work itself — key lookups and the detector — runs
on the detection pool, off the event loop. A request that takes more than
``detect_deadline_s`` (admission and waiting for a pool thread included) is answered 504
``deadline-exceeded``: its work not yet started on the pool never starts; work under way
(bounded by the limits above) finishes and is dropped.
"""

from __future__ import annotations

from fastapi import APIRouter

from service.admission import AdmittedDetection, admit_detection
from service.http.auth import CanDetect, raw_evidence
from service.http.deps import ServiceDep, ServiceDeps
from service.keys.api_tokens import Principal
from service.schemas.common import problem_responses
from service.schemas.detect import DetectBatchRequest, DetectInput, DetectOptions, DetectRequest
from service.schemas.detect_result import DetectBatchResponse, DetectResponse

router = APIRouter(prefix="/v1/detect", tags=["detect"])
_ERRORS = problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504)


async def _run(
    items: list[DetectInput],
    options: DetectOptions,
    admitted: AdmittedDetection,
    *,
    batch: bool,
    principal: Principal,
    service: ServiceDeps,
) -> list[DetectResponse]:
    """The admitted detection on the pool, within its deadline; the served target is passed
    to the tests that read it when ``options.reads_model``."""
    pool = service.pool
    work = pool.run(
        pool.run_plan,
        service.store,
        principal.tenant,
        items,
        admitted.plan,
        options,
        admitted.max_keys,
        admitted.model,
        batch,
        raw_evidence(principal),
    )
    return await admitted.deadline.run(work)


@router.post("", responses=_ERRORS)
async def detect(
    body: DetectRequest,
    principal: CanDetect,
    service: ServiceDep,
) -> DetectResponse:
    """Test one text against one key, or against every key of your tenant."""
    admitted = await admit_detection([body], body, principal, service, batch=False)
    (result,) = await _run(
        [body], body, admitted, batch=False, principal=principal, service=service
    )
    service.metrics.detections.labels(result.verdict).inc()
    return result


@router.post("/batch", responses=_ERRORS)
async def detect_batch(
    body: DetectBatchRequest,
    principal: CanDetect,
    service: ServiceDep,
) -> DetectBatchResponse:
    """Test several texts with the same options (each costs its work in the rate limit)."""
    items = body.items
    admitted = await admit_detection(items, body, principal, service, batch=True)
    results = await _run(items, body, admitted, batch=True, principal=principal, service=service)
    for result in results:
        service.metrics.detections.labels(result.verdict).inc()
    return DetectBatchResponse(results=results)
