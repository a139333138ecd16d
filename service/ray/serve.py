"""The HTTP service as Ray Serve replicas: ``service.http.app.create_app`` behind Serve's proxy.

Each replica is a Serve deployment (``serve.ingress``) that builds its own app at start —
the app's lifespan opens its Redis clients, key store, model, generation worker and detection
pool, as one ``poissonmark serve`` process does — so every replica owns a model (~1 GB of
memory each for SmolLM2-135M) and they share what lives in Redis: keys, API tokens and rate
limits. Settings come from each replica's environment (``service.settings.Settings``): set
``REDIS_URL`` (one Redis for all), ``POISSONMARK_KEK`` (the same KEK everywhere, or keys made
by one replica can't be opened by another), ``POISSONMARK_ADMIN_TOKEN``, ``POISSONMARK_MODEL``
… on every node before ``ray start``, or pass them with ``env``.

Serve's proxy prefers replicas on its own node while they keep up; set
``RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING=0`` on the nodes to spread requests evenly.

Every response carries ``x-poissonmark-replica`` (the Serve replica's id, no secret) so an
operator — or a test — can tell which replica answered.

    serve run service.ray.serve:app_builder num_replicas=2

or from Python: ``serve.run(build(num_replicas=2), route_prefix="/")``. Needs the ``ray``
extra (``pip install 'poissonmark[ray]'``); nothing in the default import path imports it.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI, Request, Response
from ray import serve
from ray.serve import Application
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

REPLICA_HEADER: Final = "x-poissonmark-replica"


def _replica_id() -> str:
    return str(serve.get_replica_context().replica_id.unique_id)


class _ReplicaHeader(BaseHTTPMiddleware):
    """Adds ``x-poissonmark-replica`` to every response."""

    def __init__(self, app: Any, replica: str) -> None:
        super().__init__(app)
        self.replica = replica

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers[REPLICA_HEADER] = self.replica
        return response


@serve.ingress()
class PoissonmarkReplica:
    """One replica: the app of ``service.http.app.create_app`` with settings from the environment
    (opened before the replica takes requests: Serve runs the app's lifespan at start)."""

    def __serve_build_asgi_app__(self) -> FastAPI:
        from service.http.app import create_app

        app = create_app()
        app.add_middleware(_ReplicaHeader, replica=_replica_id())
        return app


def build(
    num_replicas: int = 2,
    *,
    num_cpus: float = 1.0,
    env: dict[str, str] | None = None,
) -> Application:
    """The Serve application: ``num_replicas`` replicas of the app.

    Args:
        num_replicas: replicas, 1..64 (each loads the model).
        num_cpus: Ray CPUs reserved per replica.
        env: environment variables for the replicas (``runtime_env``; values are stored in
            the cluster's metadata — prefer the nodes' environment for secrets).
    Raises:
        ValueError: ``num_replicas`` out of range.
    """
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int):
        raise ValueError(f"num_replicas: expected an int in [1, 64], got {num_replicas!r}")
    if not 1 <= num_replicas <= 64:
        raise ValueError(f"num_replicas: expected an int in [1, 64], got {num_replicas!r}")
    actor_options: dict[str, Any] = {"num_cpus": num_cpus}
    if env:
        actor_options["runtime_env"] = {"env_vars": dict(env)}
    deployment = serve.deployment(
        name="poissonmark",
        num_replicas=num_replicas,
        ray_actor_options=actor_options,
        graceful_shutdown_timeout_s=30,
    )(PoissonmarkReplica)
    application: Application = deployment.bind()
    return application


def app_builder(args: dict[str, str]) -> Application:
    """For ``serve run service.ray.serve:app_builder num_replicas=N num_cpus=C``."""
    return build(int(args.get("num_replicas", "2")), num_cpus=float(args.get("num_cpus", "1")))
