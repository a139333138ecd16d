"""The site icon: ``/favicon.ico`` is a small SVG the app serves itself (browsers ask for it on
every page)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.service.conftest import Service, ServiceFactory


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services()


def test_favicon_is_a_small_svg_served_by_the_app(svc: Service) -> None:
    icon = svc.client.get("/favicon.ico")
    assert icon.status_code == 200
    assert icon.headers["content-type"] == "image/svg+xml"
    assert len(icon.content) <= 2048  # bytes: a few hundred are enough for an icon
    root = ET.fromstring(icon.content)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox") == "0 0 32 32"
    assert "max-age" in icon.headers["cache-control"]  # asked for on every page: cached
    head = svc.client.head("/favicon.ico")
    assert head.status_code == 200 and head.content == b""
    page = svc.client.get("/")
    assert 'rel="icon"' in page.text and 'href="/favicon.ico"' in page.text
