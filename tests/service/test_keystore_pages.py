"""Key listing in pages, the key-id prefix search and deletion (``service/keys/store.py``).

On both backends (the ``backend`` fixture of ``test_keystore.py``): pages walk the creation
order after an opaque cursor, never repeat or skip a key present for the whole listing (even
with keys created meanwhile, or created in the same microsecond), show revoked keys with their
state; a deleted key leaves nothing behind under the store's prefix.
"""

from __future__ import annotations

import dataclasses

import pytest

from keyed.prf import Secret
from service.errors import InvalidInput, UnknownKey
from service.keys.record import KeyRecord, created_score, new_key_id
from service.keys.store import PAGE_MAX, KeyStore
from tests.service.test_keystore import TOKENIZER, Backend, backend, store

__all__ = ["backend", "store"]  # fixtures


def _flat(pages: list[list[str]]) -> list[str]:
    return [key_id for page in pages for key_id in page]


def _walk(store: KeyStore, **kwargs: object) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = store.list_page(cursor=cursor, **kwargs)  # type: ignore[arg-type]
        pages.append([r.key_id for r in page.records])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def test_pages_walk_the_creation_order_with_revoked_keys_marked(store: KeyStore) -> None:
    made = [store.create(TOKENIZER, tenant="acme").key_id for _ in range(25)]
    store.create(TOKENIZER, tenant="other")
    store.revoke(made[3])
    pages = _walk(store, tenant="acme", limit=10)
    assert [len(p) for p in pages] == [10, 10, 5]
    assert _flat(pages) == made == [r.key_id for r in store.list_keys("acme")]
    page = store.list_page("acme", limit=5)
    assert [r.revoked for r in page.records] == [False, False, False, True, False]
    active = _walk(store, tenant="acme", limit=10, include_revoked=False)
    assert [len(p) for p in active] == [9, 10, 5]  # a page may be short: follow the cursor
    assert _flat(active) == made[:3] + made[4:]
    assert len(_flat(_walk(store, limit=PAGE_MAX))) == 26  # every tenant's (the CLI)


def test_keys_created_in_one_microsecond_and_during_the_listing(store: KeyStore) -> None:
    # Five keys with one created_at (one score): the cursor holds (score, id), so limit-1 pages
    # walk them in id order; keys created between pages never make a present key repeat or
    # vanish.
    base = KeyRecord(
        key_id=new_key_id(),
        secret=Secret(bytes(32)),
        tokenizer=TOKENIZER,
        tenant="acme",
        # after any real now (the test needs it to sort after the keys created below), and
        # exact as a score: µs since the epoch stay below 2^53, a float64's, until 2255
        created_at="2200-01-01T00:00:00.000001+00:00",
    )
    tied = sorted(new_key_id() for _ in range(5))
    for key_id in tied:
        assert store._insert(dataclasses.replace(base, key_id=key_id))
    later = [store.create(TOKENIZER, tenant="acme").key_id for _ in range(3)]
    seen, cursor = [], None
    while True:
        page = store.list_page("acme", limit=2, cursor=cursor)
        seen += [r.key_id for r in page.records]
        store.create(TOKENIZER, tenant="acme")  # created meanwhile: may or may not appear
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    present = later + tied  # created_at 2200 sorts after now
    assert [k for k in seen if k in present] == present and len(seen) == len(set(seen))


def test_prefix_search_in_key_id_order(store: KeyStore) -> None:
    made = sorted(store.create(TOKENIZER, tenant="acme").key_id for _ in range(40))
    store.create(TOKENIZER, tenant="other")
    prefix = made[0][:5]  # "pmk_" and one hex digit
    expected = [k for k in made if k.startswith(prefix)]
    assert _flat(_walk(store, tenant="acme", limit=1, prefix=prefix)) == expected
    assert _flat(_walk(store, tenant="acme", limit=100, prefix="pmk_")) == made
    whole = store.list_page("acme", prefix=made[7])
    assert [r.key_id for r in whole.records] == [made[7]] and whole.next_cursor is None
    assert store.list_page("other", prefix=made[7]).records == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": PAGE_MAX + 1}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "01-pmk_0123456789abcdef"}, "cursor"),  # not a number we write
        ({"prefix": "PMK_"}, "prefix"),
        ({"prefix": ""}, "prefix"),
    ],
    ids=["limit0", "limit_max", "garbage", "leading_zero", "upper", "empty"],
)
def test_bad_page_requests_name_the_field(store: KeyStore, kwargs: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidInput) as caught:
        store.list_page("acme", **kwargs)
    assert caught.value.field == field


def test_any_cursor_of_the_form_is_a_position(store: KeyStore) -> None:
    # A cursor is a (score, id) position: one of a key that is gone, or never was, still
    # lists the keys after it (the schema's pattern is the whole contract); a cursor from one
    # kind of listing continues the other from the same key.
    made = [store.create(TOKENIZER, tenant="acme").key_id for _ in range(4)]
    first = store.list_page("acme", limit=2)
    assert first.next_cursor == f"{created_score(store.get(made[1]))}-{made[1]}"
    store.delete(made[1])
    assert [r.key_id for r in store.list_page("acme", cursor=first.next_cursor).records] == made[2:]
    assert (
        store.list_page("acme", cursor="0-pmk_0000000000000000").records
        == store.list_page("acme").records
    )
    assert store.list_page("acme", cursor=f"{10**17}-pmk_0000000000000000").records == []
    by_id = sorted(made[:1] + made[2:])
    page = store.list_page("acme", limit=1, prefix="pmk_")
    assert page.next_cursor is not None
    rest = store.list_page("acme", prefix="pmk_", cursor=page.next_cursor)
    assert [r.key_id for r in rest.records] == by_id[1:]


def test_delete_leaves_nothing_behind(backend: Backend) -> None:
    store = backend.store()
    keep = store.create(TOKENIZER, tenant="acme")
    gone = store.create(TOKENIZER, tenant="acme")
    store.revoke(gone.key_id)
    with pytest.raises(UnknownKey):
        store.delete(gone.key_id, tenant="globex")  # another tenant's: untouched
    assert store.delete(gone.key_id, tenant="acme") == dataclasses.replace(gone, revoked=True)
    with pytest.raises(UnknownKey):
        store.get(gone.key_id)
    with pytest.raises(UnknownKey):
        store.delete(gone.key_id)
    assert [r.key_id for r in store.list_page("acme").records] == [keep.key_id]
    assert store.candidate_ids("acme", include_revoked=True) == [keep.key_id]
    client, mark = backend.client, gone.key_id.encode()
    for key in client.scan_iter(match=f"{backend.prefix}*"):
        kind = client.type(key)
        members = (
            client.smembers(key)
            if kind == b"set"
            else set(client.zrange(key, 0, -1))
            if kind == b"zset"
            else set()
        )
        assert mark not in members and mark not in key, key


def test_candidate_ids_follow_revocation_at_once(store: KeyStore) -> None:
    made = [store.create(TOKENIZER, tenant="acme").key_id for _ in range(4)]
    store.revoke(made[1])
    assert store.candidate_ids("acme", include_revoked=False) == [made[0], *made[2:]]
    assert store.candidate_ids("acme", include_revoked=True) == made
    assert [r.key_id for r in store.get_many(made[::-1], "acme")] == made[::-1]
    assert store.get_many(made, "globex") == []
