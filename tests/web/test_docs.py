"""``/docs`` renders offline (Swagger UI came from a CDN, so the page was blank).

Every request the browser makes is intercepted: those to the live server on loopback go
through, any other is aborted and recorded. The page must list the API's operations, with no
request leaving the host and no Content-Security-Policy violation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.service.conftest import Service
from tests.web.test_page import browser

__all__ = ["browser"]
pytestmark = pytest.mark.browser


def test_docs_render_with_no_request_leaving_the_host(
    browser: Any, live: Callable[..., Service]
) -> None:
    service = live()
    origin = urlparse(str(service.client.base_url))
    local: list[str] = []
    outside: list[str] = []

    def intercept(route: Any) -> None:
        url = urlparse(route.request.url)
        if (url.scheme, url.hostname, url.port) == (origin.scheme, "127.0.0.1", origin.port):
            local.append(url.path)
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context = browser.new_context()
    context.route("**/*", intercept)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(str(e)))
    response = page.goto(f"{service.client.base_url}/docs")
    assert response is not None and response.status == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "unsafe-eval" not in policy
    page.wait_for_selector(".opblock-summary", timeout=30_000)
    paths = set(page.locator(".opblock-summary-path").all_text_contents())
    assert {"/v1/generate", "/v1/detect", "/v1/keys", "/readyz"} <= {
        p.replace("\u200b", "") for p in paths
    }, paths
    page.locator(".opblock-summary").first.click()  # an operation opens (its schema renders)
    page.wait_for_selector(".opblock-body", timeout=10_000)
    assert outside == []
    assert {"/docs", "/docs/swagger-ui-bundle.js", "/docs/docs.js", "/openapi.json"} <= set(local)
    assert console == [], console  # a CSP violation is a console error
    context.close()


def test_redoc_is_not_served(live: Callable[..., Service]) -> None:
    assert live().client.get("/redoc").status_code == 404
