"""``/v1/keys``: create, list, show and revoke the caller's tenant's keys.

Another tenant's key answers exactly like an absent one (404 ``unknown-key``): the key store
does the tenant check. Key store calls are sync Redis, so they run on a worker thread.
"""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Path, Query, status

from service.auth import CanManageKeys
from service.deps import ResourcesDep, StoreDep
from service.keystore import KeyRecord
from service.schemas.common import KeyId, problem_responses
from service.schemas.keys import KeyCreateRequest, KeyList, KeyOut

router = APIRouter(prefix="/v1/keys", tags=["keys"])
_ERRORS = problem_responses(401, 403, 422, 503)
_CREATE_ERRORS = problem_responses(400, 401, 403, 413, 422, 503)
KeyIdPath = Annotated[KeyId, Path(description="The key's id.")]


def _out(record: KeyRecord) -> KeyOut:
    return KeyOut(
        key_id=record.key_id,
        context_width=record.context_width,
        masking=record.masking,
        prf_version=record.prf_version,
        tokenizer=record.tokenizer,
        created_at=record.created_at,
        revoked=record.revoked,
    )


@router.post("", status_code=status.HTTP_201_CREATED, responses=_CREATE_ERRORS)
async def create_key(
    body: KeyCreateRequest, principal: CanManageKeys, store: StoreDep, resources: ResourcesDep
) -> KeyOut:
    """Create a key bound to the served model's tokenizer. The secret is never returned."""
    record = await to_thread.run_sync(
        lambda: store.create(
            resources.fingerprint, body.context_width, body.masking, principal.tenant
        )
    )
    return _out(record)


@router.get("", responses=_ERRORS)
async def list_keys(
    principal: CanManageKeys,
    store: StoreDep,
    include_revoked: Annotated[bool, Query(description="Include revoked keys.")] = True,
) -> KeyList:
    records = await to_thread.run_sync(
        lambda: store.list_keys(principal.tenant, include_revoked=include_revoked)
    )
    return KeyList(keys=[_out(r) for r in records])


@router.get("/{key_id}", responses=problem_responses(401, 403, 404, 422, 503))
async def get_key(key_id: KeyIdPath, principal: CanManageKeys, store: StoreDep) -> KeyOut:
    return _out(await to_thread.run_sync(store.get, key_id, principal.tenant))


@router.post("/{key_id}/revoke", responses=problem_responses(401, 403, 404, 422, 503))
async def revoke_key(key_id: KeyIdPath, principal: CanManageKeys, store: StoreDep) -> KeyOut:
    """Revoke a key (idempotent): it can no longer generate; detection with it still works."""
    return _out(await to_thread.run_sync(store.revoke, key_id, principal.tenant))
