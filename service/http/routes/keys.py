"""``/v1/keys``: create, list (in pages), show, revoke and delete the caller's tenant's keys.

Another tenant's key answers exactly like an absent one (404 ``unknown-key``): the key store
does the tenant check. Key store calls are sync Redis, so they run on a worker thread. A
deletion is written to the audit log (``poissonmark.audit``: key id, tenant, the caller's
token id; never key material).
"""

from __future__ import annotations

import logging
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Response, status

from service.http.auth import CanManageKeys
from service.http.deps import PoolDep, ResourcesDep, SettingsDep, StoreDep
from service.keys.page import CURSOR_PATTERN
from service.keys.record import KeyRecord
from service.keys.store import KEY_PREFIX_MAX_CHARS, PAGE_DEFAULT, PAGE_MAX
from service.schemas.common import KeyId, problem_responses
from service.schemas.keys import KeyCreateRequest, KeyList, KeyOut

router = APIRouter(prefix="/v1/keys", tags=["keys"])
_ERRORS = problem_responses(401, 403, 422, 503)
_CREATE_ERRORS = problem_responses(400, 401, 403, 413, 415, 422, 503)
KeyIdPath = Annotated[KeyId, Path(description="The key's id.")]
audit = logging.getLogger("poissonmark.audit")


def _out(record: KeyRecord) -> KeyOut:
    return KeyOut(
        key_id=record.key_id,
        context_width=record.context_width,
        masking=record.masking,
        prf_version=record.prf_version,
        tokenizer=record.tokenizer,
        model=record.model,
        created_at=record.created_at,
        revoked=record.revoked,
    )


@router.post("", status_code=status.HTTP_201_CREATED, responses=_CREATE_ERRORS)
async def create_key(
    body: KeyCreateRequest,
    principal: CanManageKeys,
    store: StoreDep,
    resources: ResourcesDep,
    settings: SettingsDep,
) -> KeyOut:
    """Create a key bound to the served model's tokenizer, naming the served model (as
    `GET /v1/models` does). The secret is never returned. A
    tenant holds at most ``max_keys_per_tenant`` keys, revoked ones included until deleted
    (403 ``quota-exceeded``)."""
    record = await to_thread.run_sync(
        lambda: store.create(
            resources.fingerprint,
            body.context_width,
            body.masking,
            principal.tenant,
            quota=settings.max_keys_per_tenant,
            model=resources.model,
        )
    )
    return _out(record)


@router.get("", responses=_ERRORS)
async def list_keys(
    principal: CanManageKeys,
    store: StoreDep,
    include_revoked: Annotated[
        bool, Query(description="Include revoked keys (shown with `revoked: true`).")
    ] = True,
    limit: Annotated[
        int, Query(ge=1, le=PAGE_MAX, description="Keys per page (index entries examined).")
    ] = PAGE_DEFAULT,
    cursor: Annotated[
        str | None,
        Query(
            max_length=40,
            pattern=f"^{CURSOR_PATTERN}$",
            description="`next_cursor` of the previous page, unchanged (opaque: a position in "
            "the listing).",
        ),
    ] = None,
    prefix: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=KEY_PREFIX_MAX_CHARS,
            pattern=r"^[a-z0-9_]+$",
            description="Only keys whose id starts with this (e.g. `pmk_3f`), in key-id order.",
        ),
    ] = None,
) -> KeyList:
    """Your tenant's keys, one page at a time, oldest first (key-id order with `prefix`).

    Follow `next_cursor` until it is null: every key that exists for the whole listing is
    shown exactly once, whatever is created or deleted meanwhile."""
    page = await to_thread.run_sync(
        lambda: store.list_page(
            principal.tenant,
            limit=limit,
            cursor=cursor,
            include_revoked=include_revoked,
            prefix=prefix,
        )
    )
    return KeyList(keys=[_out(r) for r in page.records], next_cursor=page.next_cursor)


@router.get("/{key_id}", responses=problem_responses(401, 403, 404, 422, 503))
async def get_key(key_id: KeyIdPath, principal: CanManageKeys, store: StoreDep) -> KeyOut:
    return _out(await to_thread.run_sync(store.get, key_id, principal.tenant))


@router.post("/{key_id}/revoke", responses=problem_responses(401, 403, 404, 422, 503))
async def revoke_key(key_id: KeyIdPath, principal: CanManageKeys, store: StoreDep) -> KeyOut:
    """Revoke a key (idempotent): it can no longer generate; detection with it still works."""
    return _out(await to_thread.run_sync(store.revoke, key_id, principal.tenant))


@router.delete(
    "/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(401, 403, 404, 422, 503),
)
async def delete_key(
    key_id: KeyIdPath, principal: CanManageKeys, store: StoreDep, pool: PoolDep
) -> Response:
    """Delete a key for good: its secret is wiped from the key store, and the key is unknown
    (404) from then on — to listing, generation and detection.

    Text the key watermarked keeps its watermark, but nobody can test for it any more: only
    the secret could, and no copy is kept (revoke instead to stop generating but keep
    detecting). Redis may hold the sealed (encrypted) secret in its append-only or snapshot
    file until the next rewrite. Another replica may still detect by this key id for up to
    `POISSONMARK_KEY_CACHE_TTL_S` seconds (its record cache)."""
    record = await to_thread.run_sync(store.delete, key_id, principal.tenant)
    pool.forget(record.key_id)
    audit.info(
        "key deleted: key_id=%s tenant=%s by token %s",
        record.key_id,
        record.tenant,
        principal.token_id,
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)
