"""Typed dependencies of the routes (``Annotated`` aliases, STYLE 13); tests override these.

Each reads the lifespan's ``Resources`` from ``app.state``; before startup finished (or after
shutdown began) a request gets 503 ``not-ready``. They are ``async`` although they never wait:
FastAPI runs a plain ``def`` dependency on a worker thread, a hop per dependency per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from service.errors import NotReady, UnknownQueryParameter
from service.jobs.detection_pool import DetectionPool
from service.jobs.resources import Resources
from service.jobs.worker import GenerationWorker
from service.keys.store import KeyStore
from service.metrics import Metrics
from service.ratelimit import RateLimiter
from service.settings import Settings


async def get_resources(request: Request) -> Resources:
    resources: Resources | None = getattr(request.app.state, "resources", None)
    if resources is None:
        raise NotReady("the service is starting or stopping")
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_store(resources: ResourcesDep) -> KeyStore:
    return resources.store


async def get_worker(resources: ResourcesDep) -> GenerationWorker:
    return resources.worker


async def get_pool(resources: ResourcesDep) -> DetectionPool:
    return resources.pool


async def get_limiter(resources: ResourcesDep) -> RateLimiter:
    return resources.limiter


async def get_generate_limiter(resources: ResourcesDep) -> RateLimiter:
    return resources.generate_limiter


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
StoreDep = Annotated[KeyStore, Depends(get_store)]
WorkerDep = Annotated[GenerationWorker, Depends(get_worker)]
PoolDep = Annotated[DetectionPool, Depends(get_pool)]
LimiterDep = Annotated[RateLimiter, Depends(get_limiter)]
GenerateLimiterDep = Annotated[RateLimiter, Depends(get_generate_limiter)]


@dataclass(frozen=True)
class ServiceDeps:
    """Everything a generate or detect route reads besides its body, its caller and the
    request: one parameter (``ServiceDep``) instead of eight. Each field comes from its own
    dependency above, so a test's override of one (``get_worker``, ``get_limiter``…) holds."""

    settings: Settings
    metrics: Metrics
    resources: Resources
    store: KeyStore
    worker: GenerationWorker
    pool: DetectionPool
    limiter: RateLimiter
    generate_limiter: RateLimiter


async def get_service(
    settings: SettingsDep,
    metrics: MetricsDep,
    resources: ResourcesDep,
    store: StoreDep,
    worker: WorkerDep,
    pool: PoolDep,
    limiter: LimiterDep,
    generate_limiter: GenerateLimiterDep,
) -> ServiceDeps:
    return ServiceDeps(settings, metrics, resources, store, worker, pool, limiter, generate_limiter)


ServiceDep = Annotated[ServiceDeps, Depends(get_service)]


async def no_unknown_query_parameters(request: Request) -> None:
    """Refuse query parameters the route does not declare (like unknown body fields)."""
    route = request.scope.get("route")
    if not getattr(route, "include_in_schema", True):
        return  # the web page and its assets are not API: a query string there is harmless
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    known = _query_names(dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise UnknownQueryParameter(unknown[0], sorted(known))


def _query_names(dependant: Any) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
