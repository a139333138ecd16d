"""HEAD and the ``Allow`` header (``HEAD`` on a GET route was a 405 whose ``Allow``
header was empty, or listed HEAD itself)."""

from __future__ import annotations

import pytest

from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services()


@pytest.mark.parametrize(
    "path", ["/healthz", "/readyz", "/metrics", "/v1/keys", "/", "/ui/app.js", "/openapi.json"]
)
def test_head_is_get_without_the_body(svc: Service, path: str) -> None:
    get = svc.client.get(path, headers=svc.admin)
    head = svc.client.head(path, headers=svc.admin)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path != "/metrics":  # its counters moved with the GET
        assert head.headers["content-length"] == get.headers["content-length"]


def test_head_of_a_key_follows_get(svc: Service) -> None:
    key = svc.create_key()
    assert svc.client.head(f"/v1/keys/{key}", headers=svc.admin).status_code == 200
    assert svc.client.head("/v1/keys/pmk_0123456789abcdef", headers=svc.admin).status_code == 404
    assert svc.client.head("/v1/keys").status_code == 401  # auth as for GET


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        pytest.param("PATCH", "/v1/keys", "GET, HEAD, POST", id="keys"),
        pytest.param("DELETE", "/healthz", "GET, HEAD", id="healthz"),
        pytest.param("PUT", "/v1/detect", "POST", id="detect"),
        pytest.param("HEAD", "/v1/generate", "POST", id="head_of_post"),
        pytest.param("POST", "/", "GET, HEAD", id="page"),
        pytest.param("POST", "/ui/app.js", "GET, HEAD", id="asset"),
    ],
)
def test_an_undeclared_method_is_405_with_allow(
    svc: Service, method: str, path: str, allow: str
) -> None:
    r = svc.client.request(method, path, headers=svc.admin)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    if method != "HEAD":
        problem(r, 405, "method-not-allowed")
