"""Running the app under uvicorn: one process, or several sharing a Redis server.

``poissonmark serve`` calls ``prepare_workers`` (for more than one process) and ``run_server``.
One process serves an app built here from the settings. Several processes each build their own
app from the same environment (``service.http.app:served_app`` as a factory) behind one listening
socket that uvicorn's supervisor hands them; what they must share is made first, once
(``prepare_workers``). One process opens the port before the model loads (``/readyz`` says
``not_ready`` until it has); each of several loads first and only then accepts from the shared
socket, so the ready ones take every connection meanwhile.
"""

from __future__ import annotations

import contextlib
import logging.config
import os
import socket
import tempfile
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from sampler.models import materialise
from service.http.app import create_app
from service.keys.kek import load_or_create_kek
from service.metrics import MULTIPROC_ENV
from service.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TcpConfig(uvicorn.Config):
    """uvicorn's config, whose listening socket says it is TCP.

    For several workers uvicorn binds the listening socket itself with ``proto`` 0; accepted
    sockets inherit it, and asyncio turns Nagle off (TCP_NODELAY) only for ``IPPROTO_TCP``
    sockets, so every keep-alive response after the first waited for the client's delayed
    ACK: ~40 ms on Linux (uvicorn issue #3149; measured here: p50 48 ms per /v1/detect at one
    client with 2 workers, against 5 ms with one). The same descriptor, with ``proto`` set.
    """

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return sock  # a unix socket: no Nagle
        fixed = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, sock.detach())
        fixed.set_inheritable(True)
        return fixed


def log_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` with one stderr handler on the root logger; uvicorn
    applies it in every worker process too."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": LOG_FORMAT}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
    }


def prepare_workers(settings: Settings) -> str | None:
    """Before several server processes start: what they must share, made once, here.

    - a Redis server: the embedded one belongs to one process;
    - the converted model cache (workers converting at once would race on its temp dir);
    - the generated KEK file when ``POISSONMARK_KEK`` is unset (its creation is atomic anyway);
    - ``PROMETHEUS_MULTIPROC_DIR``: a fresh directory, so ``/metrics`` sums every worker.

    Returns:
        the metrics directory made here (the caller removes it at exit), or None when
        ``PROMETHEUS_MULTIPROC_DIR`` was already set.
    Raises:
        ValueError: no Redis server configured; the model is unknown.
    """
    if settings.redis_url is None:
        raise ValueError(
            "workers: more than one server process needs a Redis server (set REDIS_URL or "
            "POISSONMARK_REDIS_URL); the embedded Redis belongs to one process"
        )
    materialise(settings.model, settings.home)
    if settings.kek is None:
        load_or_create_kek(settings.home)
    if os.environ.get(MULTIPROC_ENV):
        return None
    shared = tempfile.mkdtemp(prefix="poissonmark-metrics-")
    os.environ[MULTIPROC_ENV] = shared  # read by prometheus-client as each worker imports it
    return shared


WORKER_HEALTHCHECK_SECONDS = 120
"""How long a worker may take to answer the supervisor's health ping (uvicorn's
``timeout_worker_healthcheck``) before it is killed and restarted."""


def run_server(settings: Settings, *, host: str, port: int, workers: int, log_level: str) -> None:
    """Serve until interrupted (SIGINT/SIGTERM: graceful shutdown of every process).

    Args:
        settings: the service settings (several workers re-read them from the environment).
        host, port: where to listen. workers: server processes (> 1: after ``prepare_workers``).
        log_level: debug, info, warning or error.
    """
    logging_config = log_config(log_level)
    logging.config.dictConfig(logging_config)
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "log_config": logging_config,
        "access_log": False,  # ours (service.http.middleware.AccessLog) has no secrets
    }
    if workers == 1:
        uvicorn.run(create_app(settings, load_in_background=True), **options)
        return
    # A worker answers the supervisor's health ping from a thread, which waits for the GIL while
    # the worker imports torch and transformers: on 2 busy cores that took over uvicorn's
    # default 5 s, and the supervisor killed and restarted every worker before it served.
    config = TcpConfig(
        "service.http.app:served_app", factory=True, workers=workers,
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS, **options,
    )  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        Multiprocess(config, sockets=[config.bind_socket()]).run()  # what uvicorn.run does
