"""Detection for the service: choose keys, run the detector, shape the result (docs/design.md §5).

The functions at the top are the one path the HTTP routes (through ``DetectionPool``) and the
CLI (``poissonmark detect``) share:

- ``choose_keys``: which keys a detection tests — its ``key_id`` (revoked keys still detect:
  text they marked keeps its mark; the key's tokenizer must be this one), or every key of the
  tenant made for this tokenizer (active ones, revoked too on request), at most ``max_keys``
  (``POISSONMARK_MAX_KEYS_PER_DETECT``, 10,000 by default: ``bench/results/multikey_cost.json``
  measures the cost per key). A deleted key is in neither.
- ``detect_keys``: the detector over those keys (``detector.multikey.detect_multi``: every
  key's Aaronson p and best window in one vectorised pass, the verdict's combined test
  (``detector.combined``), Bonferroni over keys, full results for the best ``detailed`` keys;
  one key is the case K = 1).
- ``detection_json`` / ``multi_key_json``: the wire shapes of one key's result
  (``KeyDetectionOut``) and of the whole detection (``DetectResponse``), for the HTTP responses
  and the CLI's ``--json`` alike.

The event loop only awaits: key lookups (sync Redis) and the detector (tokenizer + PRF + stats)
run on a small thread pool, each thread with its own copy of the tokenizer (a fast tokenizer
is not safe to share between threads that encode) and one torch thread (the detector's tensors
are small: intra-op threads only add synchronisation; measured 10.7 -> 4.5 ms per 300-token
text on 2 cores).

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
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import cachetools

from detector.bands import NO_BAND, evidence_bands
from detector.detect import tokenize_input
from detector.errors import TextTokenIdsMismatch
from detector.evidence import Detection
from detector.multikey import MultiKeyDetection, detect_multi
from detector.options import DetectOptions as DetectorOptions
from detector.tokens import TokenizedText, Tokenizer, check_tokenizer
from service.errors import InvalidInput, LimitExceeded, NoKeys
from service.key_record import KeyRecord
from service.keystore import KeyStore
from service.schemas.detect import DetectInput, DetectOptions

T = TypeVar("T")
KeyLookup = Callable[[str, str | None], KeyRecord]
"""(key id, tenant or None) -> record: ``KeyStore.get``, or a cache in front of it."""
ManyLookup = Callable[[Sequence[str], str | None], list[KeyRecord]]
"""(key ids, tenant or None) -> the records still there: ``KeyStore.get_many``, or a cache."""
DEFAULT_DETAILED = 10
"""Keys whose full result a multi-key detection returns by default (best first)."""

DETECTION_NONCE = 0
"""The nonce of a detection's keyed sources. Detection never reads the nonce stream (positions
keyed by it are never scored), so any nonce gives the same result."""


def choose_keys(
    store: KeyStore,
    fingerprint: str,
    tenant: str | None,
    key_id: str | None,
    *,
    include_revoked: bool,
    max_keys: int,
    lookup: KeyLookup | None = None,
    lookup_many: ManyLookup | None = None,
    key_ids: Sequence[str] | None = None,
) -> list[KeyRecord]:
    """The keys a detection tests (module docstring), in the store's order (creation).

    Args:
        fingerprint: ``tokenizer_fingerprint`` of the tokenizer detection uses.
        tenant: the caller's tenant; None (the CLI, by key id) for any tenant's key.
        key_id: test this key alone; None for every key of ``tenant`` for this tokenizer.
        lookup: how a record is read by id (default ``store.get``).
        lookup_many: how the candidates' records are read (default ``store.get_many``).
        key_ids: no ``key_id``: the candidates ``candidate_key_ids`` gave (default: read
            them now).
    Raises:
        UnknownKey: ``key_id`` is absent or another tenant's.
        TokenizerMismatch: ``key_id`` was made for another tokenizer.
        NoKeys: no ``key_id`` and the tenant has no key for this tokenizer.
        LimitExceeded: no ``key_id`` and more than ``max_keys`` candidates (before any record
            is read).
    """
    if key_id is not None:
        record = (lookup or store.get)(key_id, tenant)
        check_tokenizer(record.tokenizer, fingerprint, record.key_id)
        return [record]
    if key_ids is None:
        key_ids = candidate_key_ids(store, tenant, None, include_revoked, max_keys)
    listed = (lookup_many or store.get_many)(key_ids, tenant)
    records = [r for r in listed if r.tokenizer == fingerprint]
    if not records:
        raise NoKeys("(any)" if tenant is None else tenant)
    return records


def candidate_key_ids(
    store: KeyStore, tenant: str | None, key_id: str | None, include_revoked: bool, max_keys: int
) -> list[str]:
    """The ids of the keys a detection will test, from the key index alone (no record is read
    or unsealed): ``[key_id]``, or every key of ``tenant`` (revoked ones with
    ``include_revoked``; keys of another tokenizer are counted here and left out later).

    Raises:
        LimitExceeded: no ``key_id`` and more than ``max_keys`` candidates.
    """
    if key_id is not None:
        return [key_id]
    key_ids = store.candidate_ids(tenant, include_revoked)
    if len(key_ids) > max_keys:
        raise LimitExceeded("key_id (omitted: keys to test)", max_keys, len(key_ids), "keys")
    return key_ids


DETAILED_KEY_WEIGHT: Final = 8
"""What one key's full result (``max_results``) costs per token, in keys tested: the full
result of a detailed key (every requested score family, spans, per-token columns) took about 7
times the keyed pivots of one more key tested (``detect_keys`` on 8,192 tokens of human text,
200 keys, every family and spans, 1 against 100 detailed keys, CPU time on 2 shared cores:
1.15 against 0.17 µs per token), plus that key's own pivots."""


@dataclass(frozen=True)
class DetectPlan:
    """What a detection request will do, known before any key record is read or any text
    scored (``DetectionPool.plan``): the cost the rate limit charges.

    Attributes:
        tokenized: each item's tokens (``detector.detect.tokenize_input``), in item order.
        prompts: each item's templated prompt ids (for the tests that read the model), or None.
        key_ids: the keys to test (the request's ``key_id``, or the tenant's candidates).
        detailed: how many keys get a full result: min(keys, ``max_results``).
    """

    tokenized: list[TokenizedText]
    prompts: list[list[int] | None]
    key_ids: list[str]
    detailed: int = 1

    @property
    def work(self) -> list[int]:
        """(items,) work in token·keys per item: tokens × (keys tested +
        ``DETAILED_KEY_WEIGHT`` × keys detailed)."""
        keys = len(self.key_ids) + DETAILED_KEY_WEIGHT * self.detailed
        return [len(t.ids) * keys for t in self.tokenized]

    def cost(self, unit: int) -> int:
        """Rate-limit units: Σ over items of max(1, ceil(work / ``unit``))."""
        return sum(max(1, -(-work // unit)) for work in self.work)


def detect_keys(
    tokenizer: Tokenizer,
    records: Sequence[KeyRecord],
    options: DetectorOptions,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    detailed: int = DEFAULT_DETAILED,
    tokenized: TokenizedText | None = None,
) -> MultiKeyDetection:
    """One text against ``records`` (from ``choose_keys``), tokenized once (or given as
    ``tokenized`` instead of ``text``/``token_ids``); the full result of the best ``detailed``
    keys.

    Raises:
        ValueError: from the detector (bad ids, no keys, ``options.key_id`` set).
    """
    sources = {r.key_id: r.source(DETECTION_NONCE) for r in records}
    return detect_multi(
        tokenizer,
        sources,
        text=text,
        token_ids=token_ids,
        options=options,
        detailed=detailed,
        tokenized=tokenized,
    )


_RAW_FIELDS: Final = ("pivot", "score", "terms")
"""Per-token fields that are outputs of the keyed PRF (only with raw evidence)."""


def evidence_rows(detection: Detection, *, raw: bool) -> list[dict[str, Any]]:
    """One key's per-token evidence (``TokenEvidenceOut``): every token's id, piece, offsets,
    status and coarse ``band`` (``detector.bands``: one per block of scored tokens, null when
    skipped); with ``raw`` also its pivot, Aaronson term and per-family terms, else those are
    null (they are the keyed PRF's outputs: docs/threat-model.md: the detector is no oracle)."""
    columns = detection.evidence
    bands = evidence_bands(columns.skip, columns.terms["aaronson"]).tolist()
    rows = []
    for token, band in zip(detection.tokens, bands, strict=True):
        row = token.to_json()
        row["band"] = None if band == NO_BAND else band
        if not raw:
            for name in _RAW_FIELDS:
                row[name] = None
        rows.append(row)
    return rows


def detection_json(detection: Detection, *, tokens: bool, raw: bool = True) -> dict[str, Any]:
    """One key's result, uncorrected (``KeyDetectionOut``): the detector's wire shape and the
    scored tokens a verdict needs; ``tokens`` null unless asked for, raw per-token evidence
    only with ``raw`` (``evidence_rows``)."""
    shaped = detection.to_json(tokens=False) | {"min_scored_tokens": detection.min_scored_tokens}
    shaped["tokens"] = evidence_rows(detection, raw=raw) if tokens else None
    return shaped


def multi_key_json(found: MultiKeyDetection, *, tokens: bool, raw: bool = True) -> dict[str, Any]:
    """The whole detection (``DetectResponse``): the verdict on the best key's corrected
    p-value (whole text and spans, ``detector.combined``), the plain whole-text and the span
    p-values corrected for the keys too, what the text could have shown (``power``), then the
    detailed keys' own results in ``results``, best first, with per-token evidence
    (``tokens``; raw only with ``raw``: ``evidence_rows``) in the best key's alone; each of
    their spans also carries ``keys_corrected_p_value`` (its windows-corrected p times K,
    capped at 1), and so does their ``edit_tolerant`` test (its p times K: the keys are
    ranked by the verdict's p, which shares the plain labels' pivots, so a detailed key's own
    re-aligned p is selected, not valid for "one of these keys"). Plain JSON, no key
    material."""
    keys = math.log10(found.num_keys)
    results = []
    for key_id, detection in found.results.items():
        best = key_id == found.best_key_id
        shaped = detection_json(detection, tokens=tokens and best, raw=raw)
        if shaped["spans"] is not None:
            for span in shaped["spans"]["spans"]:
                log10 = min(0.0, span["corrected_log10_p_value"] + keys)
                span["keys_corrected_log10_p_value"] = log10
                span["keys_corrected_p_value"] = 10.0**log10
        edit = shaped["edit_tolerant"]
        if edit is not None:  # the best key is chosen by the verdict's p, not this one: K·p
            log10 = min(0.0, edit["log10_p_value"] + keys)
            edit["keys_corrected_log10_p_value"] = log10
            edit["keys_corrected_p_value"] = 10.0**log10
        shaped["entropy_weighted"] = None  # with entropy_weighting: add_model_tests
        shaped["likelihood_ratio"] = None  # with likelihood_ratio: add_model_tests
        shaped["edit_filtered"] = None  # with edit_filter: add_model_tests
        results.append(shaped)
    mu = found.min_detectable_mean_score
    span = found.span_log10_p_value
    return {
        "verdict": found.verdict.value,
        "alpha": found.alpha,
        "best_key_id": found.best_key_id,
        "num_keys": found.num_keys,
        "p_value": found.p_value,
        "log10_p_value": found.log10_p_value,
        "whole_text_p_value": 10.0**found.whole_text_log10_p_value,
        "whole_text_log10_p_value": found.whole_text_log10_p_value,
        "span_p_value": None if span is None else 10.0**span,
        "span_log10_p_value": span,
        "entropy_weighted_p_value": None,
        "entropy_weighted_log10_p_value": None,
        "likelihood_ratio_p_value": None,
        "likelihood_ratio_log10_p_value": None,
        "edit_filtered_p_value": None,
        "edit_filtered_log10_p_value": None,
        "min_scored_tokens": found.min_scored_tokens,
        "power": {
            "min_detectable_mean_score": mu,
            "reference_mean_score": found.reference_mean_score,
            "detectable": mu is not None and mu <= found.reference_mean_score,
        },
        "results": results,
    }


def add_model_tests(
    shaped: dict[str, Any],
    found: MultiKeyDetection,
    model: Any,
    processing: Any,
    *,
    entropy_weighting: bool = False,
    likelihood_ratio: bool = False,
    edit_filter: bool = False,
    prompt_ids: Sequence[int] | None = None,
    prompt_field: str = "prompt",
) -> dict[str, Any]:
    """Add the tests that read the target's law (``detector.weighted``) to a
    ``multi_key_json`` shape: the entropy-weighted test, the likelihood-ratio test and/or the
    edit-filtered test (``RankFilter``, with each key's own context width).

    The law at every position of the text (``sampler.entropy.position_laws``: one causal
    forward of ``model`` over the ids, after the generation's chat-templated prompt when the
    caller gives it, else after the tokenizer's BOS when it has one) is computed once — it
    does not depend on the key — and weighs each detailed key's scored positions:
    ``entropy_weighted`` / ``likelihood_ratio`` / ``edit_filtered`` in each of ``results`` (with
    its p times K, as ``edit_tolerant``: the keys are ranked by the verdict's p), and at the
    top ``<name>_p_value``, K times the smallest of them
    (a subset of the keys: still valid for "one of the K keys").

    Args:
        shaped: ``multi_key_json(found, ...)``, changed in place and returned.
        model: the target (``LoadedModel.target``). processing: a ``sampler.processing.
            Processing`` (the generation's temperature, top-k, top-p).
        entropy_weighting, likelihood_ratio, edit_filter: which tests (none: ``shaped``
            unchanged).
        prompt_ids: the generation's prompt as the model saw it (``chat_prompt_ids``), or None.
        prompt_field: the request field the prompt came from (``prompt`` or ``messages``).
    Raises:
        InvalidInput: ``prompt_field`` (with a prompt) or the test's field: the prompt and the
            text are longer than the model's positions.
    """
    wanted = (
        ("entropy_weighted", entropy_weighting, "entropy_weighting"),
        ("likelihood_ratio", likelihood_ratio, "likelihood_ratio"),
        ("edit_filtered", edit_filter, "edit_filter"),
    )
    asked = [(name, field) for name, on, field in wanted if on]
    if not asked:
        return shaped
    from detector.weighted import (
        entropy_weighted_test,
        likelihood_ratio_test,
        rank_filtered_test,
    )
    from sampler.entropy import position_laws  # torch: only when asked for

    first = next(iter(found.results.values()))
    ids = first.evidence.ids.tolist()
    if prompt_ids is None:
        bos = getattr(model.config, "bos_token_id", None)
        prefix = [int(bos)] if isinstance(bos, int) else []
    else:
        prefix = [int(t) for t in prompt_ids]
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and len(prefix) + len(ids) > limit:
        field = prompt_field if prompt_ids is not None else asked[0][1]
        raise InvalidInput(
            field,
            f"expected the prompt and the text within {limit} tokens (the model's positions), "
            f"got {len(prefix)} + {len(ids)}",
        )
    laws = position_laws(model, ids, processing, prefix=prefix)
    entropy, logp = laws.entropy.numpy(), laws.token_logp.numpy()  # (T,) each, once
    rank = laws.raw_rank.numpy()
    conditioned = prompt_ids is not None

    def run(name: str, detection: Detection) -> dict[str, Any]:
        skip, terms = detection.evidence.skip, detection.evidence.terms["aaronson"]
        if name == "entropy_weighted":
            return entropy_weighted_test(skip, terms, entropy).to_json()
        if name == "edit_filtered":
            assert detection.context_width is not None, "detect() sets it"
            return rank_filtered_test(skip, terms, rank, detection.context_width).to_json()
        return likelihood_ratio_test(skip, terms, logp, conditioned_on_prompt=conditioned).to_json()

    keys = math.log10(found.num_keys)
    for name, _ in asked:
        best: float | None = None
        for result, detection in zip(shaped["results"], found.results.values(), strict=True):
            test = run(name, detection)
            log10 = min(0.0, test["log10_p_value"] + keys)
            test["keys_corrected_log10_p_value"] = log10
            test["keys_corrected_p_value"] = 10.0**log10
            result[name] = test
            best = log10 if best is None else min(best, log10)
        shaped[f"{name}_log10_p_value"] = best
        shaped[f"{name}_p_value"] = None if best is None else 10.0**best
    return shaped


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
        tokenized: TokenizedText | None = None,
    ) -> dict[str, Any]:
        """One text against ``records``: the ``DetectResponse`` wire shape; with
        ``options.reads_model`` (entropy weighting, likelihood ratio, edit filter), those
        tests too (``add_model_tests`` with ``model``, the served target, after
        ``prompt_ids``, the item's checked prompt from ``prompt_ids()``, when it has one).
        With ``options.evidence``, the best key's per-token evidence: raw (pivots and terms)
        only with ``raw_evidence`` and for a text (never for caller-chosen ``token_ids``),
        else coarse bands (``evidence_rows``). ``tokenized``: the item already tokenized
        (``plan``).

        Raises:
            InvalidInput: ``token_ids`` when the item's ids do not decode to its ``text``
                (``tokenized``).
        """
        wanted = DetectorOptions(
            alpha=options.alpha,
            scores=options.scores,
            spans=options.spans,
            realign=options.realign,
            reference_mean_score=options.reference_mean_score,
        )
        if tokenized is None:
            tokenized = self.tokenized(item)
        found = detect_keys(
            self.tokenizer(), records, wanted, detailed=options.max_results, tokenized=tokenized
        )
        raw = raw_evidence and item.token_ids is None
        shaped = multi_key_json(found, tokens=options.evidence, raw=raw)
        if options.reads_model:
            assert model is not None, "the route passes the served model"
            shaped = add_model_tests(
                shaped,
                found,
                model,
                entropy_processing(options),
                entropy_weighting=options.entropy_weighting,
                likelihood_ratio=options.likelihood_ratio,
                edit_filter=options.edit_filter,
                prompt_ids=prompt_ids,
                prompt_field="prompt" if item.messages is None else "messages",
            )
        return shaped

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

        from sampler.completion import chat_prompt_ids
        from service.limits import check_prompt_tokens  # imports sampler: torch

        messages = None if item.messages is None else [m.model_dump() for m in item.messages]
        field = "prompt" if item.messages is None else "messages"
        try:
            ids = chat_prompt_ids(self.tokenizer(), item.prompt, messages)
        except TemplateError as e:
            raise InvalidInput(field, f"the served chat template refused it: {e}") from None
        if self.max_prompt_tokens is not None:
            check_prompt_tokens(len(ids), self.max_prompt_tokens, field)
        return ids

    def tokenized(self, item: DetectInput) -> TokenizedText:
        """The item's tokens (text tokenized, or its ``token_ids`` with their pieces); their
        number is checked by ``check_plan``.

        Raises:
            InvalidInput: ``token_ids`` when both are given and the ids do not decode to the
                text (``TextTokenIdsMismatch``; a verdict about the ids would read as one about
                the text; the message names both fields).
        """
        try:
            return tokenize_input(self.tokenizer(), item.text, item.token_ids)
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
        tokenized = _each_item(items, batch, self.tokenized)
        detailed = min(len(key_ids), options.max_results)
        return DetectPlan(tokenized, prompts, key_ids, detailed)

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
        for i, (item, tokenized) in enumerate(zip(items, plan.tokenized, strict=True)):
            if cap is not None and len(tokenized.ids) > cap:
                field = "text" if item.token_ids is None else "token_ids"
                field = f"items[{i}].{field}" if batch else field
                raise LimitExceeded(field, cap, len(tokenized.ids), "tokens after tokenizing")
        rows = sum(len(t.ids) for t in plan.tokenized)
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
    ) -> list[dict[str, Any]]:
        """The planned detection (``plan``): the keys' records read once, then every item;
        ``model``: the served target, for the tests that read its law
        (``options.reads_model``); ``batch``: an item's InvalidInput or LimitExceeded names it
        (``items[i].<field>``); ``raw_evidence``: the caller holds the ``evidence`` scope
        (``detect``)."""
        records = self.candidate_keys(store, tenant, options, max_keys, plan.key_ids)
        work = list(zip(items, plan.prompts, plan.tokenized, strict=True))
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
    ) -> list[dict[str, Any]]:
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


def entropy_processing(options: DetectOptions) -> Any:
    """The ``sampler.processing.Processing`` of a request's ``processing`` (its defaults when
    omitted)."""
    from sampler.processing_config import Processing  # no torch

    given = options.processing
    if given is None:
        return Processing()
    return Processing(given.temperature, given.top_k, given.top_p)
