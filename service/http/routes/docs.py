"""``/docs``: Swagger UI for the served OpenAPI document, with no request leaving the host.

FastAPI's own page loads Swagger UI from a CDN (blank offline, and every visit told the CDN
who reads the docs). Here the Swagger UI dist files come from the ``fastapi-offline``
package (a dependency), and the page and its start script are ours, so the page's
Content-Security-Policy allows scripts and styles from this origin only; the one thing looser
than the web page's policy is ``img-src data:``, for the ``data:`` SVG icons of Swagger UI's
stylesheet (the browser test fails on any violation). ReDoc is not served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import fastapi_offline
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from service.http.routes.ui import SECURITY_HEADERS, WEB

SWAGGER_UI: Final = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS: Final = {
    "swagger-ui-bundle.js": (SWAGGER_UI, "text/javascript; charset=utf-8"),
    "swagger-ui.css": (SWAGGER_UI, "text/css; charset=utf-8"),
    "favicon.png": (SWAGGER_UI, "image/png"),
    "docs.js": (WEB, "text/javascript; charset=utf-8"),
}
DOCS_HEADERS: Final = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'none'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def docs() -> FileResponse:
    return FileResponse(
        WEB / "docs.html", media_type="text/html; charset=utf-8", headers=DOCS_HEADERS
    )


@router.get("/docs/{name}")
async def docs_asset(name: str) -> FileResponse:
    found = ASSETS.get(name)
    if found is None:
        raise HTTPException(status_code=404)
    directory, media_type = found
    return FileResponse(directory / name, media_type=media_type, headers=DOCS_HEADERS)
