"""``/metrics`` counts what it says it counts (the rate-limit counter stayed 0)."""

from __future__ import annotations

import re

import pytest

from tests.service.conftest import Service, ServiceFactory


def counter(service: Service, name: str) -> float:
    text = service.client.get("/metrics", headers=service.admin).text
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


def test_metrics_need_the_metrics_or_the_admin_token(embedded_services: ServiceFactory) -> None:
    """The counters show every tenant's traffic and verdicts: no API token reads them, however
    many scopes it has; the metrics token reads them and nothing else."""
    import secrets

    metrics_token = secrets.token_urlsafe(32)
    service = embedded_services(metrics_token=metrics_token)
    scraper = {"Authorization": f"Bearer {metrics_token}"}
    everything = service.token("default", ("generate", "detect", "keys", "evidence"))
    for headers in ({}, everything, {"Authorization": f"Bearer {metrics_token}x"}):
        r = service.client.get("/metrics", headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["type"] == "urn:poissonmark:problem:unauthenticated"
        assert "poissonmark_" not in r.text
    for headers in (scraper, service.admin):
        r = service.client.get("/metrics", headers=headers)
        assert r.status_code == 200 and "poissonmark_detections_total" in r.text
    assert service.client.get("/v1/keys", headers=scraper).status_code == 401  # nothing else


def test_a_weak_metrics_token_is_refused() -> None:
    from service.settings import Settings

    with pytest.raises(ValueError, match="POISSONMARK_METRICS_TOKEN"):
        Settings(metrics_token="changeme-changeme-changeme-changeme-1234")
