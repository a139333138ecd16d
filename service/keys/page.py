"""A page of a key listing and its cursor (``service.keys.store.KeyStore.list_page``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from service.errors import InvalidInput
from service.keys.record import KeyRecord

__all__ = ["CURSOR_PATTERN", "KeyPage", "parse_cursor"]

CURSOR_PATTERN: Final = r"(0|[1-9][0-9]{0,17})-(pmk_[0-9a-f]{16})"
"""A cursor: the (score, id) position of the last key shown, ``<µs>-<key id>``. Any string of
this form is a valid position (keys after it), so the schema's pattern is the whole contract;
clients treat it as opaque."""
_CURSOR: Final = re.compile(CURSOR_PATTERN)


@dataclass(frozen=True)
class KeyPage:
    """One page of a listing.

    Attributes:
        records: the page's keys in the listing's order (creation order; key-id order with a
            prefix). May hold fewer than the limit — even none, when revoked keys are left out
            — while ``next_cursor`` is set.
        next_cursor: the opaque cursor of the next page, or None after the last one.
    """

    records: list[KeyRecord]
    next_cursor: str | None


def parse_cursor(cursor: str) -> tuple[int, str]:
    """(score, key id) of a cursor, or ``InvalidInput`` for anything not of its form."""
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidInput("cursor", "expected a next_cursor from a previous page")
    return int(match.group(1)), match.group(2)
