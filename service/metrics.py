"""Prometheus metrics of one app instance (its own registry, so several apps can coexist).

Labels are bounded: route templates (``/v1/keys/{key_id}``, never raw paths), methods, status
codes, verdicts. Nothing carries a tenant, a key id or a token.

Several server processes (``poissonmark serve --workers N``) share one view: ``serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the workers start (unless the operator
set it: then emptying it between runs is theirs, as prometheus-client asks), every process
writes its values there (prometheus-client's multiprocess mode), and ``/metrics`` — whichever
worker answers — adds them up: counters and histograms summed, the queue gauge summed over
live processes.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from sampler.decoder import GenerationResult

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_AATPS_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The shared directory of multiprocess mode, or None (one process)."""
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """The service's counters, gauges and histograms, in a private registry."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_dir() is not None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "poissonmark_http_requests",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "poissonmark_http_request_duration_seconds",
            "HTTP request latency (to the end of the response body).",
            ("route", "method"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_generated = Counter(
            "poissonmark_tokens_generated", "Tokens emitted by finished generations.", registry=r
        )
        self.aatps = Histogram(
            "poissonmark_generation_aatps",
            "Average accepted tokens per step (tokens per target forward pass) per generation.",
            buckets=_AATPS_BUCKETS,
            registry=r,
        )
        self.generation_seconds = Histogram(
            "poissonmark_generation_seconds",
            "Decoding time per generation (prefill excluded).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generations_cancelled = Counter(
            "poissonmark_generations_cancelled",
            "Generations stopped because the client went away.",
            registry=r,
        )
        self.queue_waiting = Gauge(
            "poissonmark_generation_queue_waiting",
            "Generation jobs waiting (all server processes).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.batch_size = Gauge(
            "poissonmark_generation_batch_size",
            "Generation jobs stepping together in the worker's batch (all server processes).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.detections = Counter(
            "poissonmark_detections",
            "Detections by verdict (batch items count one each).",
            ("verdict",),
            registry=r,
        )
        self.rate_limited = Counter(
            "poissonmark_rate_limited", "Requests refused by the per-token rate limit.", registry=r
        )
        self.redis_restarts = Counter(
            "poissonmark_embedded_redis_restarts",
            "Times the embedded Redis was found dead and started again on its data.",
            registry=r,
        )

    def generation_finished(self, result: GenerationResult) -> None:
        self.tokens_generated.inc(result.stats.emitted_tokens)
        self.aatps.observe(result.stats.aatps)
        self.generation_seconds.observe(result.stats.seconds)

    def render(self) -> bytes:
        """The exposition text: this registry's, or every process's in multiprocess mode."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
        return generate_latest(combined)

    def process_exiting(self) -> None:
        """Drop this process's live gauges from the shared view (multiprocess mode)."""
        if self.multiprocess:
            mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
