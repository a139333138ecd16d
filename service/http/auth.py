"""Bearer-token authentication and scopes for the routes (docs/design.md §5).

``Authorization: Bearer <token>``: the admin token from settings (compared in constant time) or
an API token verified against its stored hash (``service.keys.api_tokens``). No token, a malformed,
unknown or revoked one: 401 (the reason is not told). A valid token without the endpoint's
scope: 403. A Redis failure while checking: 503, never a 401 that would make clients drop a
good token. The principal's token id (never the token) goes to the access log.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import NotAuthenticated, ScopeMissing
from service.http.deps import ResourcesDep, SettingsDep
from service.keys.api_tokens import Principal, admin_principal, digest, verify_token

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API token (`pmt_…`, from `poissonmark tokens create`) or the admin token.",
)


async def authenticate(
    request: Request,
    resources: ResourcesDep,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise NotAuthenticated("missing bearer token")
    token = credentials.credentials
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    principal = admin_principal(token, admin, settings.admin_tenant) or await verify_token(
        resources.aredis,
        token,
        resources.token_key,
        settings.redis_prefix,
        legacy=settings.legacy_token_digests,
        previous_keys=resources.previous_token_keys,
    )
    if principal is None:
        raise NotAuthenticated("invalid or revoked bearer token")
    request.state.token_id = principal.token_id
    return principal


Authenticated = Annotated[Principal, Depends(authenticate)]


def _require(scope: str):  # type: ignore[no-untyped-def]
    async def dependency(principal: Authenticated) -> Principal:
        if scope not in principal.scopes:
            raise ScopeMissing(scope)
        return principal

    dependency.__name__ = f"require_{scope}"
    return dependency


CanGenerate = Annotated[Principal, Depends(_require("generate"))]
CanDetect = Annotated[Principal, Depends(_require("detect"))]
CanManageKeys = Annotated[Principal, Depends(_require("keys"))]


async def read_metrics(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """``/metrics``: the bearer must be the metrics token or the admin token (settings; each
    compared in constant time); anything else is 401. The counters show every tenant's
    traffic and verdicts, so no API token reads them."""
    given = credentials.credentials if credentials is not None else ""
    allowed = [t.get_secret_value() for t in (settings.metrics_token, settings.admin_token) if t]
    matches = [hmac.compare_digest(digest(given), digest(token)) for token in allowed]
    if not given or not any(matches):
        raise NotAuthenticated("missing or invalid metrics token")


CanReadMetrics = Depends(read_metrics)


def raw_evidence(principal: Principal) -> bool:
    """Whether ``principal`` may see raw per-token evidence (the ``evidence`` scope)."""
    return "evidence" in principal.scopes
