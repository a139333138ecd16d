"""Errors of the OpenAI-compatible routes in OpenAI's shape (the rest of the API keeps RFC 9457).

``{"error": {"message", "type", "param", "code"}}``, what the ``openai`` SDK turns into its
``BadRequestError``, ``AuthenticationError``… The status, the safe message and the headers
(``Retry-After``, ``WWW-Authenticate``) are the problem+json ones (``service.errors.PROBLEMS``,
``service.http.problems``), with two changes OpenAI clients expect: an invalid or over-the-limit
parameter is a 400 (not 422), and ``code`` is the problem's slug in snake case
(``unknown_key``, ``queue_full``, ``limit_exceeded``…). Request validation errors name the
parameter as OpenAI does (``messages[0].content``), never the value.

``OpenAIRoute`` is the route class of those routes: it renders every error raised while
handling one of them (dependencies, body validation, the handler) and a wrong method (405).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from detector.errors import TokenizerMismatch
from service.errors import (
    INTERNAL,
    METHOD_NOT_ALLOWED,
    KeyRevoked,
    ProblemType,
    UnknownKey,
    UnsupportedMediaType,
    problem_for,
)
from service.http.problems import not_json_body, problem_response, shown_media_type
from service.schemas.openai import OpenAIError

log = logging.getLogger("poissonmark.service")

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_KEPT_HEADERS = ("retry-after", "www-authenticate", "allow", "accept-post")


class InvalidParameter(Exception):
    """A 400 ``invalid_request_error`` about one parameter, raised by the OpenAI routes for a
    rule their schema cannot express (a missing key id, two different max_tokens)."""

    def __init__(self, param: str, message: str, code: str = "invalid_request") -> None:
        super().__init__(param, message, code)
        self.param = param
        self.message = message
        self.code = code


class ModelNotFound(Exception):
    """``model`` names a model this server does not serve (404 ``model_not_found``)."""

    def __init__(self, served: str) -> None:
        super().__init__(served)
        self.served = served


def error_type(status: int) -> str:
    """OpenAI's ``type`` for a status."""
    if status >= 500:
        return "server_error"
    return _TYPES.get(status, "invalid_request_error")


def error_response(
    status: int,
    message: str,
    param: str | None,
    code: str | None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"message": message, "type": error_type(status), "param": param, "code": code}
    return JSONResponse(
        OpenAIError.model_validate({"error": body}).model_dump(),
        status_code=status,
        headers=headers,
    )


def _param(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "messages", 0, "content")`` -> ``messages[0].content``; a union member's tag
    (``list[TextPart]``) is not a parameter and is left out."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "header", "query") else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" not in str(part) and "(" not in str(part):
            out += f".{part}" if out else str(part)
    return out or "body"


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "the body is not valid JSON", None, "malformed_request")
    # the most specific error: of a union's members, the one that got furthest in
    first = max(errors, key=lambda e: len(_param(e.get("loc", ())))) if errors else {}
    param = _param(first.get("loc", ()))
    kind = str(first.get("type", ""))
    if kind == "extra_forbidden":
        message, code = (
            f"{param}: unknown parameter (openapi.yaml lists those served)",
            ("unknown_parameter"),
        )
    else:
        message = f"{param}: {first.get('msg', 'invalid value')}"
        code = "unsupported_value" if kind == "unsupported_value" else "invalid_request"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return error_response(400, message, param, code)


def _problem_error(exc: Exception, request: Request) -> JSONResponse:
    problem: ProblemType = problem_for(exc)
    if problem is INTERNAL:
        log.error("unhandled %s on %s", type(exc).__name__, request.url.path, exc_info=exc)
    elif problem.status >= 500:
        log.warning("%s on %s: %s", problem.slug, request.url.path, type(exc).__name__)
    rendered = problem_response(exc, request.url.path, problem)
    document = json.loads(bytes(rendered.body))
    status = 400 if problem.status == 422 else problem.status
    headers = {k: v for k, v in rendered.headers.items() if k.lower() in _KEPT_HEADERS}
    code = problem.slug.replace("-", "_")
    param = document.get("field")
    if param is None and isinstance(exc, UnknownKey | KeyRevoked | TokenizerMismatch):
        param = "key_id"
    return error_response(status, document["detail"], param, code, headers)


def openai_error(exc: Exception, request: Request) -> JSONResponse:
    """The OpenAI-shaped response of any exception raised while serving an OpenAI route."""
    if isinstance(exc, RequestValidationError):
        if not_json_body(exc):
            media = shown_media_type(request.headers.get("content-type"))
            return _problem_error(UnsupportedMediaType(media), request)
        return _validation_error(exc)
    if isinstance(exc, InvalidParameter):
        return error_response(400, f"{exc.param}: {exc.message}", exc.param, exc.code)
    if isinstance(exc, ModelNotFound):
        message = f"model: this server serves '{exc.served}' only (see GET /v1/models)"
        return error_response(404, message, "model", "model_not_found")
    if isinstance(exc, StarletteHTTPException):
        headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() in _KEPT_HEADERS}
        code = f"http_{exc.status_code}"
        return error_response(exc.status_code, str(exc.detail), None, code, headers)
    return _problem_error(exc, request)


class OpenAIRoute(APIRoute):
    """A route whose every error is in OpenAI's shape (module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # every error of this route, in one shape
                return openai_error(exc, request)

        return handle

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.methods and scope["method"] not in self.methods:
            served = self.methods | ({"HEAD"} if "GET" in self.methods else set())
            allow = ", ".join(sorted(served))  # as service.http.problems words it
            message = f"method {scope['method']} not allowed; use {allow}"
            code = METHOD_NOT_ALLOWED.slug.replace("-", "_")
            response = error_response(405, message, None, code, {"Allow": allow})
            await response(scope, receive, send)
            return
        await super().handle(scope, receive, send)
