"""``/healthz`` (the process is up), ``/readyz`` (Redis answers, model loaded; which model and
tokenizer it serves), ``/metrics`` (behind the metrics or admin token)."""

from __future__ import annotations

import logging
from typing import Literal

import redis
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.http.auth import CanReadMetrics
from service.http.deps import MetricsDep
from service.jobs.resources import Resources
from service.schemas.common import problem_responses
from service.schemas.health import Health, Readiness

router = APIRouter(tags=["health"])
log = logging.getLogger("poissonmark.service")


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready (see `checks`)."}},
)
async def readyz(request: Request) -> JSONResponse:
    resources: Resources | None = getattr(request.app.state, "resources", None)
    checks: dict[str, Literal["ok", "failing"]] = {"redis": "failing", "model": "failing"}
    if resources is not None:
        try:
            await resources.aredis.ping()
            checks["redis"] = "ok"
        except redis.RedisError as exc:
            log.warning("readiness: redis ping failed (%s)", type(exc).__name__)
        if resources.worker.alive:
            checks["model"] = "ok"
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(
        status="ready" if ready else "not_ready",
        checks=checks,
        model=None if resources is None else resources.model,
        tokenizer=None if resources is None else resources.fingerprint,
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **problem_responses(401),
    },
    dependencies=[CanReadMetrics],
)
async def metrics(metrics: MetricsDep) -> Response:
    """Prometheus counters of every tenant: the bearer is the metrics token
    (``POISSONMARK_METRICS_TOKEN``) or the admin token."""
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
