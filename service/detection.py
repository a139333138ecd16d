"""Detection for the service: choose the keys, run the detector off the event loop (DESIGN §5).

The event loop only awaits: key lookups (sync Redis) and the detector (tokenizer + PRF + stats)
run on a small thread pool, each thread with its own copy of the tokenizer (a fast tokenizer
is not safe to share between threads that encode) and one torch thread (the detector's tensors
are small: intra-op threads only add synchronisation; measured 10.7 -> 4.5 ms per 300-token
text on 2 cores). Which keys a request tests is decided here:
its ``key_id`` (revoked keys still detect: text they marked keeps its mark), or every key of the
caller's tenant made for this tokenizer (active ones, revoked too on request). The statistics
are the detector's (``detector.multikey.detect_multi``: per-key results, Bonferroni over keys).

A record looked up by ``key_id`` is kept, decrypted, for ``key_cache_ttl_s`` seconds per
(tenant, key id) — a Redis round trip and an AES-GCM open less per request. Nothing detection
uses can go stale: a record never changes but for ``revoked``, and detection by key id ignores
it. Failed lookups are not cached, and the listing of a tenant's keys (no ``key_id``) always
reads Redis, so a new key is tested at once.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import cachetools
import torch

from detector.multikey import detect_multi
from detector.options import DetectOptions as DetectorOptions
from detector.tokens import check_tokenizer
from keyed import KeyedSource
from service.errors import LimitExceeded, NoKeys
from service.keystore import KeyRecord, KeyStore
from service.schemas.detect import DetectInput, DetectOptions

T = TypeVar("T")


class DetectionPool:
    """Threads for tokenizer- and Redis-bound work, each with a private tokenizer copy.

    Args:
        tokenizer: the served model's tokenizer (copied per thread; the original is not used
            from these threads).
        fingerprint: its ``tokenizer_fingerprint``.
        threads: pool size.
        key_cache_ttl_s: seconds a record looked up by id stays cached (0: no cache).
        key_cache_size: at most this many cached records (least recently used go first).
    """

    def __init__(
        self,
        tokenizer: Any,
        fingerprint: str,
        threads: int,
        *,
        key_cache_ttl_s: float = 0.0,
        key_cache_size: int = 1024,
    ) -> None:
        self._tokenizer = tokenizer
        self.fingerprint = fingerprint
        self._local = threading.local()
        self._copy_lock = threading.Lock()
        self._records: cachetools.TTLCache[tuple[str, str], KeyRecord] | None = None
        if key_cache_ttl_s > 0:
            self._records = cachetools.TTLCache(key_cache_size, key_cache_ttl_s)
        self._records_lock = threading.Lock()  # TTLCache is not thread-safe
        self._executor = ThreadPoolExecutor(
            threads, thread_name_prefix="detect", initializer=torch.set_num_threads, initargs=(1,)
        )

    def tokenizer(self) -> Any:
        """This thread's tokenizer copy (call from a pool thread)."""
        mine = getattr(self._local, "tokenizer", None)
        if mine is None:
            with self._copy_lock:  # deepcopy reads the shared original
                mine = copy.deepcopy(self._tokenizer)
            self._local.tokenizer = mine
        return mine

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a pool thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    # --- work done on the pool ---------------------------------------------------------------

    def candidate_keys(
        self, store: KeyStore, tenant: str, options: DetectOptions, max_keys: int
    ) -> list[KeyRecord]:
        """The keys a request tests (see module docstring).

        Raises:
            UnknownKey: ``key_id`` is absent or another tenant's.
            TokenizerMismatch: ``key_id`` was made for another tokenizer.
            NoKeys: no ``key_id`` and the tenant has no key for this tokenizer.
            LimitExceeded: no ``key_id`` and more than ``max_keys`` candidates.
        """
        if options.key_id is not None:
            record = self._record(store, options.key_id, tenant)
            check_tokenizer(record.tokenizer, self.fingerprint, record.key_id)
            return [record]
        records = [
            r
            for r in store.list_keys(tenant, include_revoked=options.include_revoked)
            if r.tokenizer == self.fingerprint
        ]
        if not records:
            raise NoKeys(tenant)
        if len(records) > max_keys:
            raise LimitExceeded("key_id (omitted: keys to test)", max_keys, len(records), "keys")
        return records

    def _record(self, store: KeyStore, key_id: str, tenant: str) -> KeyRecord:
        """``store.get(key_id, tenant)``, through the cache (module docstring)."""
        if self._records is None:
            return store.get(key_id, tenant)
        with self._records_lock:
            record = self._records.get((tenant, key_id))
        if record is None:
            record = store.get(key_id, tenant)  # outside the lock: a Redis round trip
            with self._records_lock:
                self._records[(tenant, key_id)] = record
        return record

    def detect(
        self, records: Sequence[KeyRecord], item: DetectInput, options: DetectOptions
    ) -> dict[str, Any]:
        """One text against ``records``: the ``DetectResponse`` wire shape."""
        sources = {r.key_id: KeyedSource(r.secret, r.context_width, r.masking) for r in records}
        found = detect_multi(
            self.tokenizer(),
            sources,
            text=item.text,
            token_ids=item.token_ids,
            options=DetectorOptions(
                alpha=options.alpha, scores=options.scores, spans=options.spans
            ),
        )
        results = []
        for key_id, detection in found.results.items():
            out = detection.to_json(tokens=options.evidence)
            out["key_id"] = key_id
            out["min_scored_tokens"] = detection.min_scored_tokens
            results.append(out)
        return {
            "verdict": found.verdict.value,
            "alpha": found.alpha,
            "best_key_id": found.best_key_id,
            "num_keys": found.num_keys,
            "p_value": found.p_value,
            "log10_p_value": found.log10_p_value,
            "results": results,
        }

    def detect_all(
        self,
        store: KeyStore,
        tenant: str,
        items: Sequence[DetectInput],
        options: DetectOptions,
        max_keys: int,
    ) -> list[dict[str, Any]]:
        """Every item against the request's keys (looked up once)."""
        records = self.candidate_keys(store, tenant, options, max_keys)
        return [self.detect(records, item, options) for item in items]
