"""Per-token rate limits of detection and generation, counted in Redis (docs/design.md §5).

A fixed window: ``P ratelimit:<kind>:<token id>:<window>`` counts the work units of the
current ``window_s``-second window; what a request costs is the route's: for ``detect``
tokens × keys tested (``service.http.routes.detect``: the detector is an oracle), for ``generate``
prompt tokens + new tokens requested (``service.http.routes.generate``). INCRBY and EXPIRE run in
one MULTI, so
every process of a deployment shares the budget and a counter never outlives its window. At
the limit the request is refused with ``RateLimited`` (429 + Retry-After: the seconds to the
next window) and counted by ``on_limited`` (the ``poissonmark_rate_limited_total`` counter).
Fixed windows allow up to twice the limit across a window boundary; that is the
usual price of one round trip per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
import redis.asyncio

from service.errors import KeyStoreUnavailable, RateLimited


class RateLimiter:
    """``limit`` units per ``window_s`` seconds per token id.

    ``on_limited`` is called once per refused request (the service counts them in its metrics);
    ``clock`` (seconds since the epoch) is replaceable in tests so a window never rolls over
    mid-test. ``kind`` names the budget (``detect``, ``generate``: its counters and its setting
    ``<kind>_rate_limit``), ``unit`` what a unit is (the 429's detail says both).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str,
        limit: int,
        window_s: int,
        clock: Callable[[], float] = time.time,
        on_limited: Callable[[], object] = lambda: None,
        kind: str = "detect",
        unit: str = "detection work units (tokens × keys)",
    ) -> None:
        if limit < 1 or window_s < 1:
            raise ValueError(f"expected limit >= 1 and window_s >= 1, got {limit}, {window_s}")
        self._client = client
        self._prefix = prefix
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._on_limited = on_limited
        self.kind = kind
        self.unit = unit

    async def spend(self, token_id: str, cost: int = 1) -> None:
        """Count ``cost`` units for ``token_id``.

        Raises:
            RateLimited: the window's budget would be exceeded (the units still count, so a
                client hammering a closed window gains nothing).
            KeyStoreUnavailable: Redis failed.
        """
        now = self._clock()
        window = int(now // self.window_s)
        key = f"{self._prefix}ratelimit:{self.kind}:{token_id}:{window}"
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.incrby(key, cost)
                pipe.expire(key, self.window_s + 1)
                count, _ = await pipe.execute()
        except redis.RedisError as exc:
            raise KeyStoreUnavailable("redis (rate limit)", type(exc).__name__) from exc
        if int(count) > self.limit:
            self._on_limited()
            retry_after = max(1, int((window + 1) * self.window_s - now + 0.999))
            setting = f"{self.kind}_rate_limit"
            raise RateLimited(self.limit, self.window_s, retry_after, setting, self.unit)
