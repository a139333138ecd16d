"""Pure ASGI middleware: the body-size limit, HEAD on GET routes, and the access log with
request metrics.

Pure ASGI (not ``BaseHTTPMiddleware``) so streaming responses and client disconnects pass
through untouched.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import BodyTooLarge
from service.http.problems import problem_response
from service.metrics import Metrics

access_log = logging.getLogger("poissonmark.access")


class BodyLimit:
    """Refuse bodies over ``max_bytes`` with 413 before the app parses anything.

    A ``Content-Length`` over the limit is refused at once; otherwise the body is read (at
    most ``max_bytes`` + 1 bytes, so chunked uploads are bounded too) and replayed to the app.
    Later ``receive`` calls go to the server, so disconnects are still seen.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # the server validates the framing itself
                if declared > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(BodyTooLarge(self.max_bytes), None)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


class HeadAsGet:
    """Answer ``HEAD`` like ``GET`` without the body (RFC 9110 §9.3.2), for every route.

    FastAPI routes accept only the methods they declare, so ``HEAD /healthz`` was a 405 whose
    ``Allow`` header listed HEAD. Here the request goes to the app as a GET (its routing, auth
    and status are the GET's) and the response keeps its status and headers, including
    ``Content-Length``, with the body dropped. The access log still records ``HEAD``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # wait for the last chunk: one empty body message ends the response
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(dict(scope, method="GET"), receive, headers_only)


class AccessLog:
    """One log line and the request metrics per HTTP request.

    The line has method, route template, status, milliseconds and the caller's token id
    (``admin`` or the public id; never the token, never headers or bodies).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template, method).observe(seconds)
            state = scope.get("state") or {}
            access_log.info(
                "%s %s %d %.1fms token=%s",
                method,
                template,
                status,
                seconds * 1000,
                state.get("token_id", "-"),
            )
