"""The served app listens before its model loads (the port opened only after
the load, so ``/readyz`` could never say ``not_ready``).

``run_server`` is called with uvicorn's ``run`` replaced by one that records the app; that app
then runs on a loopback port with a loader that waits for the test's signal.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import service.http.app
from sampler.models import LoadedModel
from service import server
from tests.service.conftest import LiveServer, make_settings


def test_ready_only_once_the_model_has_loaded(
    tmp_path: Path, tiny_loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = threading.Event()

    def slow_loader(_: object) -> LoadedModel:
        # Released by the test. The timeout only frees the server's thread if the test never
        # does (the old code loaded before the port opened: LiveServer gives up after 60 s);
        # 10 s let an overloaded machine finish the "load" before /readyz was asked.
        loading.wait(120)
        return tiny_loaded

    served: list[Any] = []
    monkeypatch.setattr(service.http.app, "load_served_model", slow_loader)
    monkeypatch.setattr(server.uvicorn, "run", lambda app, **_: served.append(app))
    settings = make_settings(tmp_path / f"home-{secrets.token_hex(4)}")
    server.run_server(settings, host="127.0.0.1", port=0, workers=1, log_level="warning")
    (app,) = served
    with (
        LiveServer(app) as live,
        contextlib.ExitStack() as stack,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        stack.callback(loading.set)  # a failing test frees the loader before the server stops
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "not_ready", r.text
        assert r.json()["checks"]["model"] == "failing"
        assert (r.json()["model"], r.json()["tokenizer"]) == (None, None)  # not loaded yet
        admin = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}  # type: ignore[union-attr]
        body = {"key_id": "pmk_0123456789abcdef", "prompt": "Hi", "max_new_tokens": 2}
        r = client.post("/v1/generate", json=body, headers=admin)
        assert r.status_code == 503 and r.json()["type"].endswith(":not-ready"), r.text
        assert "retry-after" in r.headers
        loading.set()
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        key = client.post("/v1/keys", json={}, headers=admin).json()["key_id"]
        r = client.post("/v1/generate", json={**body, "key_id": key}, headers=admin)
        assert r.status_code == 200, r.text
