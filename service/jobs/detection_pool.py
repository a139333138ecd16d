"""The detection pool: the HTTP routes' detections, off the event loop (docs/design.md §5).

The event loop only awaits: key lookups (sync Redis) and the detector (tokenizer + PRF + stats)
run on a small thread pool, each thread with its own copy of the tokenizer (a fast tokenizer
is not safe to share between threads that encode) and one torch thread (the detector's tensors
are small: intra-op threads only add synchronisation; measured 10.7 -> 4.5 ms per 300-token
text on 2 cores). A request is planned first (``DetectionPool.plan``: its keys from the index
and its tokens, what the rate limit charges), checked against the limits, then run.

A record is kept, decrypted, for ``key_cache_ttl_s`` seconds per (tenant, key id) — a Redis
round trip and an AES-GCM open less per key and request (2,000 keys over HTTP here: 0.5 s for
the first detection, which decodes them, 0.2 s for the next).
Nothing detection uses goes stale: a record never changes but for ``revoked``, which
detection by key id ignores, and which keys a multi-key detection tests is read from the key
store's index at every request (``KeyStore.candidate_ids``), so a created, revoked or deleted
key counts at once. A key deleted through this process is also dropped from the cache
(``forget``); another replica's by-id cache may still hold it for up to ``key_cache_ttl_s``.
Failed lookups are not cached.
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

from detector.detect import read_input
from detector.errors import TextTokenIdsMismatch
from detector.options import DetectOptions as DetectorOptions
from detector.readings import ReadText
from service.errors import InvalidInput, LimitExceeded
from service.jobs.detect_response import detect_response
from service.jobs.detection import DetectPlan, candidate_key_ids, choose_keys, detect_keys
from service.jobs.model_tests import request_processing, run_model_tests
from service.keys.record import KeyRecord
from service.keys.store import KeyStore
from service.schemas.detect import DetectInput, DetectOptions
from service.schemas.detect_result import DetectResponse

T = TypeVar("T")


def _one_torch_thread() -> None:
    import torch  # the pool's threads only; the CLI's use of this module needs no torch

    torch.set_num_threads(1)


class DetectionPool:
    """Threads for tokenizer- and Redis-bound work, each with a private tokenizer copy.

    Args:
        tokenizer: the served model's tokenizer (copied per thread; the original is not used
            from these threads).
        fingerprint: its ``tokenizer_fingerprint``.
        threads: pool size.
        model: the served model's name, for the message that refuses a key of another
            tokenizer.
        key_cache_ttl_s: seconds a record stays cached (0: no cache).
        key_cache_size: at most this many cached records (least recently used go first); at
            least the keys of a multi-key detection, or each one reads most of them again.
        max_prompt_tokens: the most tokens a detect item's templated prompt may have (the
            ``max_prompt_tokens`` setting; None: no limit).
        max_tokens: the most tokens a detect item may have after tokenizing (``max_tokens``;
            None: no limit).
        max_evidence_tokens: the most per-token evidence rows of one response, summed over
            its items (``max_evidence_tokens``; None: no limit).
    """

    def __init__(
        self,
        tokenizer: Any,
        fingerprint: str,
        threads: int,
        *,
        model: str | None = None,
        key_cache_ttl_s: float = 0.0,
        key_cache_size: int = 20_000,
        max_prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        max_evidence_tokens: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.max_tokens = max_tokens
        self.max_evidence_tokens = max_evidence_tokens
        self.fingerprint = fingerprint
        self.model = model
        self._local = threading.local()
        self._copy_lock = threading.Lock()
        self._records: cachetools.TTLCache[tuple[str | None, str], KeyRecord] | None = None
        if key_cache_ttl_s > 0:
            self._records = cachetools.TTLCache(key_cache_size, key_cache_ttl_s)
        self._records_lock = threading.Lock()  # TTLCache is not thread-safe
        self._executor = ThreadPoolExecutor(
            threads, thread_name_prefix="detect", initializer=_one_torch_thread
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
        self,
        store: KeyStore,
        tenant: str,
        options: DetectOptions,
        max_keys: int,
        key_ids: Sequence[str] | None = None,
    ) -> list[KeyRecord]:
        """``choose_keys`` for a request of ``tenant``, by-id lookups through the cache."""
        return choose_keys(
            store,
            self.fingerprint,
            tenant,
            options.key_id,
            include_revoked=options.include_revoked,
            max_keys=max_keys,
            lookup=functools.partial(self._record, store),
            lookup_many=functools.partial(self._records_of, store),
            key_ids=key_ids,
            model=self.model,
        )

    def forget(self, key_id: str) -> None:
        """Drop every cached copy of ``key_id`` (after it was deleted)."""
        if self._records is None:
            return
        with self._records_lock:
            for cached in [k for k in self._records if k[1] == key_id]:
                self._records.pop(cached, None)

    def _records_of(
        self, store: KeyStore, key_ids: Sequence[str], tenant: str | None
    ) -> list[KeyRecord]:
        """``store.get_many(key_ids, tenant)`` through the cache: one round trip for the ids
        not cached, in ``key_ids`` order."""
        if self._records is None:
            return store.get_many(key_ids, tenant)
        with self._records_lock:
            cached = {k: r for k in key_ids if (r := self._records.get((tenant, k))) is not None}
        missing = [k for k in key_ids if k not in cached]
        if missing:
            fetched = store.get_many(missing, tenant)  # outside the lock: a Redis round trip
            with self._records_lock:
                for record in fetched:
                    self._records[(tenant, record.key_id)] = record
            cached.update((r.key_id, r) for r in fetched)
        return [cached[k] for k in key_ids if k in cached]

    def _record(self, store: KeyStore, key_id: str, tenant: str | None) -> KeyRecord:
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
        self,
        records: Sequence[KeyRecord],
        item: DetectInput,
        options: DetectOptions,
        model: Any = None,
        prompt_ids: list[int] | None = None,
        raw_evidence: bool = False,
        read: Sequence[ReadText] | None = None,
    ) -> DetectResponse:
        """One text against ``records`` (``detect_response``); with
        ``options.reads_model`` (entropy weighting, likelihood ratio, edit filter), those
        tests too (``run_model_tests`` with ``model``, the served target, after
        ``prompt_ids``, the item's checked prompt from ``prompt_ids()``, when it has one).
        With ``options.evidence``, the best key's per-token evidence: raw (pivots and terms)
        only with ``raw_evidence`` and for a text (never for caller-chosen ``token_ids``),
        else coarse bands (``evidence_rows``). ``read``: the item's readings already
        tokenized (``plan``).

        Raises:
            InvalidInput: ``token_ids`` when the item's ids do not decode to its ``text``
                (``read``).
        """
        wanted = DetectorOptions(
            alpha=options.alpha,
            scores=options.scores,
            spans=options.spans,
            realign=options.realign,
            reference_mean_score=options.reference_mean_score,
        )
        if read is None:
            read = self.read(item)
        found = detect_keys(
            self.tokenizer(), records, wanted, detailed=options.max_results, read=read
        )
        raw = raw_evidence and item.token_ids is None
        tests = None
        if options.reads_model:
            assert model is not None, "the route passes the served model"
            tests = run_model_tests(
                found,
                model,
                request_processing(options),
                entropy_weighting=options.entropy_weighting,
                likelihood_ratio=options.likelihood_ratio,
                edit_filter=options.edit_filter,
                prompt_ids=prompt_ids,
                prompt_field="prompt" if item.messages is None else "messages",
            )
        return detect_response(found, tokens=options.evidence, raw=raw, model_tests=tests)

    def prompt_ids(self, item: DetectInput) -> list[int] | None:
        """The item's ``prompt`` or ``messages`` through the served chat template (None
        without one; the schema and ``check_detect_input`` have bounded their characters).

        Raises:
            InvalidInput: naming the field, when the template refuses the conversation (a
                template may raise on, e.g., roles out of order).
            LimitExceeded: naming the field, when the templated prompt has more than
                ``max_prompt_tokens`` tokens (generate's limit, the same setting).
        """
        if item.prompt is None and item.messages is None:
            return None
        from jinja2 import TemplateError

        from sampler.completion import chat_prompt_ids  # imports torch

        messages = None if item.messages is None else [m.model_dump() for m in item.messages]
        field = "prompt" if item.messages is None else "messages"
        try:
            ids = chat_prompt_ids(self.tokenizer(), item.prompt, messages)
        except TemplateError as e:
            raise InvalidInput(field, f"the served chat template refused it: {e}") from None
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            # generate's limit, worded as there (``service.admission.check_prompt_tokens``)
            unit = "tokens after the chat template"
            raise LimitExceeded(field, self.max_prompt_tokens, len(ids), unit)
        return ids

    def read(self, item: DetectInput) -> tuple[ReadText, ...]:
        """The item's readings tokenized (a text as submitted and its canonical reading when it
        differs, or its ``token_ids`` with their pieces); their number is checked by
        ``check_plan``.

        Raises:
            InvalidInput: ``token_ids`` when both are given and the ids do not decode to the
                text (``TextTokenIdsMismatch``; a verdict about the ids would read as one about
                the text; the message names both fields).
        """
        try:
            return read_input(self.tokenizer(), item.text, item.token_ids)
        except TextTokenIdsMismatch as exc:
            raise InvalidInput("token_ids", str(exc)) from None

    def plan(
        self,
        store: KeyStore,
        tenant: str,
        items: Sequence[DetectInput],
        options: DetectOptions,
        max_keys: int,
        batch: bool = False,
    ) -> DetectPlan:
        """Everything a detection's cost depends on, before any key record is read or text
        scored: the keys to test (their ids, from the index: ``candidate_key_ids``), every
        item's prompt (templated and checked, for the tests that read the model) and tokens
        (not yet checked against ``max_tokens``: ``check_plan``, once the caller has charged
        the tokenizing).

        Raises:
            LimitExceeded: too many keys, or an item's prompt over ``max_prompt_tokens``
                (``items[i].<field>`` in a batch).
        """
        key_ids = candidate_key_ids(
            store, tenant, options.key_id, options.include_revoked, max_keys
        )
        model_tests = options.reads_model
        prompts = _each_item(
            items, batch, lambda item: self.prompt_ids(item) if model_tests else None
        )
        read = _each_item(items, batch, self.read)
        detailed = min(len(key_ids), options.max_results)
        return DetectPlan(read, prompts, key_ids, detailed)

    def check_plan(
        self,
        plan: DetectPlan,
        items: Sequence[DetectInput],
        options: DetectOptions,
        batch: bool = False,
    ) -> None:
        """The limits a plan must keep: every item at most ``max_tokens`` tokens, and with
        ``options.evidence`` at most ``max_evidence_tokens`` evidence rows in all (the best
        key's: one per token).

        Raises:
            LimitExceeded: naming ``text`` or ``token_ids`` (``items[i].…`` in a batch) and the
                token limit, or ``evidence`` and the row limit.
        """
        cap = self.max_tokens
        for i, item in enumerate(items):
            tokens = plan.tokens(i)
            if cap is not None and tokens > cap:
                field = "text" if item.token_ids is None else "token_ids"
                field = f"items[{i}].{field}" if batch else field
                raise LimitExceeded(field, cap, tokens, "tokens after tokenizing")
        rows = sum(plan.tokens(i) for i in range(len(items)))
        rows_cap = self.max_evidence_tokens
        if options.evidence and rows_cap is not None and rows > rows_cap:
            raise LimitExceeded("evidence", rows_cap, rows, "rows (tokens) per response")

    def run_plan(
        self,
        store: KeyStore,
        tenant: str,
        items: Sequence[DetectInput],
        plan: DetectPlan,
        options: DetectOptions,
        max_keys: int,
        model: Any = None,
        batch: bool = False,
        raw_evidence: bool = False,
    ) -> list[DetectResponse]:
        """The planned detection (``plan``): the keys' records read once, then every item;
        ``model``: the served target, for the tests that read its law
        (``options.reads_model``); ``batch``: an item's InvalidInput or LimitExceeded names it
        (``items[i].<field>``); ``raw_evidence``: the caller holds the ``evidence`` scope
        (``detect``)."""
        records = self.candidate_keys(store, tenant, options, max_keys, plan.key_ids)
        work = list(zip(items, plan.prompts, plan.read, strict=True))
        return _each_item(
            work,
            batch,
            lambda each: self.detect(
                records, each[0], options, model, each[1], raw_evidence, each[2]
            ),
        )

    def detect_all(
        self,
        store: KeyStore,
        tenant: str,
        items: Sequence[DetectInput],
        options: DetectOptions,
        max_keys: int,
        model: Any = None,
        batch: bool = False,
        raw_evidence: bool = False,
    ) -> list[DetectResponse]:
        """``plan``, ``check_plan`` and ``run_plan`` in one call (no rate limit)."""
        plan = self.plan(store, tenant, items, options, max_keys, batch)
        self.check_plan(plan, items, options, batch)
        return self.run_plan(
            store, tenant, items, plan, options, max_keys, model, batch, raw_evidence
        )


_Item = TypeVar("_Item")
_Out = TypeVar("_Out")


def _each_item(items: Sequence[_Item], batch: bool, work: Callable[[_Item], _Out]) -> list[_Out]:
    """``work`` on every item in order; in a batch, an item's InvalidInput or LimitExceeded is
    raised again naming it (``items[i].<field>``)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(work(item))
        except InvalidInput as e:
            if not batch:
                raise
            raise InvalidInput(f"items[{i}].{e.field}", e.problem) from None
        except LimitExceeded as e:
            if not batch:
                raise
            raise LimitExceeded(f"items[{i}].{e.field}", e.limit, e.actual, e.unit) from None
    return out
