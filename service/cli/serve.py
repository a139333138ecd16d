"""``poissonmark serve``: the HTTP service under uvicorn (settings from POISSONMARK_*)."""

from __future__ import annotations

import shutil
from typing import Annotated

import typer

from service.cli.common import errors, quiet_transformers, read_settings

LOG_LEVELS = ("debug", "info", "warning", "error")


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address [POISSONMARK_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [POISSONMARK_PORT].")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1, max=64, help="Server processes [POISSONMARK_WORKERS]; > 1 needs REDIS_URL."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the HTTP service (FastAPI under uvicorn; settings from POISSONMARK_* variables)."""
    from sampler.targets.model_files import check_model
    from service.server import prepare_workers, run_server

    quiet_transformers()
    settings = read_settings()
    with errors():
        processes = settings.workers if workers is None else workers
        if log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"--log-level: expected debug, info, warning or error: {log_level}")
        check_model(settings.model, settings.home)  # an unknown name or a bad file: one line
        shared = prepare_workers(settings) if processes > 1 else None
    try:
        run_server(
            settings,
            host=host or settings.host,
            port=settings.port if port is None else port,
            workers=processes,
            log_level=log_level.lower(),
        )
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
