"""RFC 9457 problem+json responses: the exception handlers of the app (STYLE 12).

Which status and type an error gets is ``service.errors.PROBLEMS`` (looked up along the MRO);
this module only renders it. Only domain exceptions (``PoissonmarkError``, ``DetectorError``)
and request validation errors are the caller's fault; anything else, a plain ``ValueError``
included, is a bug: a 500 ``internal-error`` with a generic detail (no message, no traceback),
the traceback going to the log. A detail is the exception's message when the table marks it safe
to expose (messages never hold secrets; server-side faults keep a generic detail). Request
validation errors name every offending field and its constraint, never the input value (it
could be a pasted secret). Log lines carry the problem type and status, not the detail.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from detector.errors import DetectorError
from service.errors import (
    INTERNAL,
    INVALID_REQUEST,
    MALFORMED_REQUEST,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    BodyTooLarge,
    DeadlineExceeded,
    GenerationCancelled,
    InvalidInput,
    KeyStoreUnavailable,
    LimitExceeded,
    NotAuthenticated,
    NotReady,
    PoissonmarkError,
    ProblemType,
    QueueFull,
    QuotaExceeded,
    RateLimited,
    UnsupportedMediaType,
    problem_for,
)

PROBLEM_JSON = "application/problem+json"
_LOAD = (QueueFull, NotReady, GenerationCancelled, DeadlineExceeded)
"""503s and 504s that are logged as warnings: a full queue, a start not finished, a client
gone, a request past its deadline."""
log = logging.getLogger("poissonmark.service")
_RETRY_AFTER_UNAVAILABLE_S = 1
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}")
"""A media type's ``type/subtype`` (RFC 6838 names), short enough to show."""


def problem_body(
    exc: BaseException, instance: str | None = None, problem: ProblemType | None = None
) -> dict[str, Any]:
    """The problem document of ``exc`` (as a dict, for JSON responses and SSE ``error``)."""
    problem = problem or problem_for(exc)
    body: dict[str, Any] = {"type": problem.type, "title": problem.title, "status": problem.status}
    body["detail"] = str(exc) if problem.expose else _generic_detail(problem)
    if instance is not None:
        body["instance"] = instance
    if isinstance(exc, LimitExceeded):
        body["field"], body["limit"] = exc.field, exc.limit
    elif isinstance(exc, InvalidInput):
        body["field"] = exc.field
    elif isinstance(exc, BodyTooLarge):
        body["field"], body["limit"] = "body", exc.limit
    elif isinstance(exc, UnsupportedMediaType):
        body["field"] = "Content-Type"
    elif isinstance(exc, QuotaExceeded):
        body["field"], body["limit"] = "max_keys_per_tenant", exc.quota
    elif isinstance(exc, RateLimited):
        body["field"], body["limit"] = exc.setting, exc.limit
    elif isinstance(exc, DeadlineExceeded):
        body["field"], body["limit"] = exc.setting, exc.limit_s
    return body


def _generic_detail(problem: ProblemType) -> str:
    if problem.status == 503:
        return "the key store is unreachable; retry later"
    return "the server could not complete the request; the error was logged"


def _headers(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, QueueFull | RateLimited):
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, KeyStoreUnavailable | NotReady):
        return {"Retry-After": str(_RETRY_AFTER_UNAVAILABLE_S)}
    if isinstance(exc, NotAuthenticated):
        return {"WWW-Authenticate": 'Bearer realm="poissonmark"'}
    if isinstance(exc, UnsupportedMediaType):
        return {"Accept-Post": "application/json"}
    return {}


def problem_response(
    exc: BaseException, instance: str | None, problem: ProblemType | None = None
) -> JSONResponse:
    body = problem_body(exc, instance, problem)
    return JSONResponse(
        body, status_code=body["status"], headers=_headers(exc), media_type=PROBLEM_JSON
    )


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    problem = problem_for(exc)
    if problem is INTERNAL:  # a domain class without a table entry: a bug like any other
        return await _unhandled(request, exc)
    if isinstance(exc, _LOAD):  # the callers' load or their going away, not a fault here
        log.warning("%s on %s", problem.slug, _instance(request))
    elif problem.status >= 500:
        log.error("%s on %s: %s", problem.slug, _instance(request), type(exc).__name__)
    return problem_response(exc, _instance(request), problem)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled %s on %s", type(exc).__name__, _instance(request), exc_info=exc)
    return problem_response(exc, _instance(request), INTERNAL)


def _instance(request: Request) -> str | None:
    """The route template (``/v1/keys/{key_id}``), not the raw path: a path segment is caller
    input and could hold anything (it is never echoed)."""
    route = request.scope.get("route")
    return getattr(route, "path", None)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return _malformed(request, exc, "the body is not valid JSON")
    if not_json_body(exc):
        media = UnsupportedMediaType(shown_media_type(request.headers.get("content-type")))
        return problem_response(media, _instance(request))
    fields = [{"field": _field(e.get("loc", ())), "message": str(e.get("msg", ""))} for e in errors]
    body = problem_body(exc, _instance(request), INVALID_REQUEST)
    body["detail"] = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    body["errors"] = fields
    if fields:
        body["field"] = fields[0]["field"]
        limit = _limit(errors[0])
        if limit is not None:
            body["limit"] = limit
    return JSONResponse(body, status_code=422, media_type=PROBLEM_JSON)


def not_json_body(exc: RequestValidationError) -> bool:
    """Whether a route that reads a JSON body got a body it did not read as JSON: FastAPI keeps
    the raw bytes when the ``Content-Type`` is missing or not ``application/json`` (or
    ``…+json``), and the body then fails the model's validation."""
    return isinstance(exc.body, bytes | bytearray) and any(
        tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors()
    )


def shown_media_type(header: str | None) -> str:
    """A ``Content-Type`` header as it may be shown: its ``type/subtype`` (lowercase, without
    parameters) when that is a plain media type of at most 127 characters, ``"none"`` when
    there is no header, else a placeholder (a header is caller input of unknown content)."""
    if header is None or not header.strip():
        return "none"
    media = header.split(";", 1)[0].strip().lower()
    if _MEDIA_TYPE.fullmatch(media):
        return media
    return "an unreadable media type"


def _limit(error: Any) -> int | float | None:
    """The numeric bound a pydantic error broke (``le``, ``max_length``…), if any."""
    ctx = error.get("ctx") or {}
    for name in ("le", "lt", "ge", "gt", "max_length", "min_length"):
        value = ctx.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None


def _malformed(request: Request, exc: Exception, detail: str) -> JSONResponse:
    body = problem_body(exc, _instance(request), MALFORMED_REQUEST)
    body["detail"], body["field"] = detail, "body"
    return JSONResponse(body, status_code=400, media_type=PROBLEM_JSON)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's "error parsing the body": not UTF-8, nested too deep
        return _malformed(request, exc, "the body cannot be read as JSON (UTF-8)")
    problem = {404: NOT_FOUND, 405: METHOD_NOT_ALLOWED}.get(
        exc.status_code,
        ProblemType(f"http-{exc.status_code}", exc.status_code, "HTTP error"),
    )
    body = problem_body(exc, _instance(request), problem)
    body["detail"] = str(exc.detail)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return JSONResponse(body, status_code=exc.status_code, headers=headers, media_type=PROBLEM_JSON)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path, HEAD with GET (Starlette's own Allow
    header lists only the first route that matched the path; pages outside the API too)."""
    methods: set[str] = set()
    for context in iter_route_contexts(request.app.routes):
        match, _ = context.route.matches(request.scope)
        if match is not Match.NONE:
            methods |= context.methods or set()
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    """Register the handlers: domain errors by class, validation, HTTP errors, the rest (500)."""
    for cls in (PoissonmarkError, DetectorError):
        app.add_exception_handler(cls, _domain_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unhandled)
