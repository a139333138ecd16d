"""The web page at ``/``, its assets at ``/ui/…`` and the icon at ``/favicon.ico`` (static, no
build step).

The page is a client of the documented API only (``/v1/keys``, ``/v1/detect``,
``/v1/generate``). Its responses carry a strict Content-Security-Policy: scripts and styles
from this origin only, no inline script, no framing, requests to this origin only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

WEB: Final = Path(__file__).resolve().parents[1] / "web"
ASSETS: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_ICON_HEADERS: Final = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=86400"}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(
        WEB / "index.html", media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS
    )


@router.get("/ui/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(status_code=404)
    return FileResponse(WEB / name, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/favicon.ico")
async def favicon() -> FileResponse:
    """The site icon (an SVG of ~400 bytes: browsers take an SVG at this path too)."""
    return FileResponse(WEB / "favicon.svg", media_type="image/svg+xml", headers=_ICON_HEADERS)
