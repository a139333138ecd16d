"""``/metrics`` counts what it says it counts (issue 17: the rate-limit counter stayed 0)."""

from __future__ import annotations

import re

import pytest

from tests.service.conftest import Service, ServiceFactory


def counter(service: Service, name: str) -> float:
    text = service.client.get("/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not exposed"
    return float(found.group(1))


def test_every_rate_limited_request_is_counted(
    embedded_services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = embedded_services(detect_rate_limit=3, detect_rate_window_s=3600)
    # The app's own limiter (its counter wiring is what is tested) on a frozen clock, as in
    # tests/service/test_api_errors.py's rate-limit test: windows are aligned to the epoch, so
    # on the real clock a test that ran across the full hour got a fresh budget mid-test.
    monkeypatch.setattr(service.resources.limiter, "_clock", lambda: 1_000_010.0)
    service.create_key()
    headers = service.token("default", ("detect",))
    assert counter(service, "poissonmark_rate_limited_total") == 0
    statuses = [
        service.client.post("/v1/detect", json={"text": "x"}, headers=headers).status_code
        for _ in range(5)
    ]
    batch = service.client.post(
        "/v1/detect/batch", json={"items": [{"text": "x"}] * 2}, headers=headers
    )
    assert statuses == [200, 200, 200, 429, 429] and batch.status_code == 429
    assert counter(service, "poissonmark_rate_limited_total") == 3
