"""The FastAPI app factory (docs/design.md §5).

``create_app(settings)`` builds the app; its lifespan opens the heavy resources once
(``service.jobs.resources``: Redis clients, key store, model, generation worker, detection pool) and
closes them on shutdown. Routes live in ``service.http.routes`` (one module per resource), errors
are rendered by ``service.http.problems`` from the table in ``service.errors``, and
``service.http.middleware`` enforces the body limit and writes the access log and metrics.

``poissonmark serve`` runs it under uvicorn; ``openapi.yaml`` is generated from it
(``python -m service.http.openapi``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI

from service import contract
from service.http import problems
from service.http.deps import no_unknown_query_parameters
from service.http.middleware import AccessLog, BodyLimit, HeadAsGet
from service.http.routes import detect, docs, generate, health, keys, openai, ui
from service.jobs.resources import ModelLoader, load_served_model, open_resources
from service.metrics import Metrics
from service.settings import Settings, get_settings

log = logging.getLogger("poissonmark.service")
API_VERSION = "1.0.0"
DESCRIPTION = (
    "Watermarked text by keyed multi-draft speculative sampling (MPFR), and its detector. "
    "Authenticate with `Authorization: Bearer <token>`; tokens carry scopes (`generate`, "
    "`detect`, `keys`) and belong to one tenant. Errors are RFC 9457 "
    "`application/problem+json` with a stable `type` (`urn:poissonmark:problem:<slug>`)."
)


def create_app(
    settings: Settings | None = None,
    *,
    loader: ModelLoader | None = None,
    load_in_background: bool = False,
) -> FastAPI:
    """A new app instance.

    Args:
        settings: defaults to the cached ``get_settings()`` (environment).
        loader: loads the served model from the settings (default: ``load_model`` of
            ``settings.model``); tests pass one that returns an already loaded model.
        load_in_background: open the resources (Redis, model, worker) after startup instead
            of during it, so the server listens at once: ``/healthz`` answers, ``/readyz`` is
            503 ``not_ready`` and every route that needs them 503 ``not-ready`` until they are
            open (``poissonmark serve`` with one process). A failure to open them is logged and
            stops the process (SIGTERM to itself), as a failed startup does.
    """
    settings = settings or get_settings()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def open_into(app: FastAPI) -> AsyncIterator[None]:
        async with open_resources(settings, metrics, loader or load_served_model) as resources:
            app.state.resources = resources
            log.info("poissonmark ready")
            try:
                yield
            finally:
                app.state.resources = None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if not load_in_background:
                async with open_into(app):
                    yield
                return
            stopping = asyncio.Event()

            async def hold() -> None:
                try:
                    async with open_into(app):
                        await stopping.wait()
                except Exception:
                    log.critical("poissonmark could not start; stopping", exc_info=True)
                    os.kill(os.getpid(), signal.SIGTERM)

            holder = asyncio.create_task(hold())
            try:
                yield
            finally:
                stopping.set()
                if app.state.resources is None:  # still opening: stop waiting for it
                    holder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await holder
        finally:
            metrics.process_exiting()

    app = FastAPI(
        title="poissonmark",
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,
        dependencies=[Depends(no_unknown_query_parameters)],
        docs_url=None,  # service.http.routes.docs serves Swagger UI from packaged files (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.resources = None
    app.state.openapi_resources = None
    for module in (generate, detect, keys, openai, health, ui, docs):
        app.include_router(module.router)
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HeadAsGet)
    app.add_middleware(AccessLog, metrics=metrics)  # outermost: sees 413s too
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def served_app() -> FastAPI:
    """The app each of several ``poissonmark serve --workers N`` processes runs (a uvicorn
    factory, settings from the environment). It opens its resources before it accepts: the
    processes share one listening socket, so a worker still loading would answer 503 to
    clients that a ready one can serve (one process opens the port first instead:
    ``run_server``)."""
    return create_app()


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with error bodies documented as ``application/problem+json`` and the
    deployment's limits (``service.contract``; again once the model has loaded)."""
    resources = app.state.resources
    if app.openapi_schema is None or app.state.openapi_resources is not resources:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        for path in schema["paths"].values():
            for operation in path.values():
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    openai_shape = "openai" in operation.get("tags", ())  # OpenAI's errors
                    if status[0] in "45" and "application/json" in content and not openai_shape:
                        content["application/problem+json"] = content.pop("application/json")
        if resources is None:
            contract.tighten(schema, app.state.settings)
        else:
            contract.tighten(schema, app.state.settings, resources.vocab_size, resources.drafters)
        app.openapi_schema = schema
        app.state.openapi_resources = resources
    return app.openapi_schema
