"""Detection for the service: which keys a detection tests and the detector over them
(docs/design.md §5).

The one path the HTTP routes (through ``service.jobs.detection_pool.DetectionPool``) and the CLI
(``poissonmark detect``) share:

- ``choose_keys``: which keys a detection tests — its ``key_id`` (revoked keys still detect:
  text they marked keeps its mark; the key's tokenizer must be this one), or every key of the
  tenant made for this tokenizer (active ones, revoked too on request), at most ``max_keys``
  (``POISSONMARK_MAX_KEYS_PER_DETECT``, 10,000 by default: ``bench/results/multikey_cost.json``
  measures the cost per key). A deleted key is in neither. ``candidate_key_ids`` counts them
  from the key index alone, before any record is read.
- ``detect_keys``: the detector over those keys (``detector.multikey.detect_multi``: every
  key's Aaronson p and best window in one vectorised pass, the verdict's combined test
  (``detector.combined``), Bonferroni over keys, full results for the best ``detailed`` keys;
  one key is the case K = 1).
- ``DetectPlan``: what a request will cost, known before any record is read.

Then ``service.jobs.model_tests`` runs the tests that read the model and
``service.jobs.detect_response`` builds the one ``DetectResponse`` both edges return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from detector.multikey import MultiKeyDetection, detect_multi
from detector.options import DetectOptions as DetectorOptions
from detector.readings import ReadText
from detector.tokens import Tokenizer, check_tokenizer
from service.errors import LimitExceeded, NoKeys
from service.keys.record import KeyRecord
from service.keys.store import KeyStore

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
    model: str | None = None,
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
        model: the name of the model in use, for ``TokenizerMismatch``'s message.
    Raises:
        UnknownKey: ``key_id`` is absent or another tenant's.
        TokenizerMismatch: ``key_id`` was made for another tokenizer.
        NoKeys: no ``key_id`` and the tenant has no key for this tokenizer.
        LimitExceeded: no ``key_id`` and more than ``max_keys`` candidates (before any record
            is read).
    """
    if key_id is not None:
        record = (lookup or store.get)(key_id, tenant)
        check_tokenizer(
            record.tokenizer, fingerprint, record.key_id, key_model=record.model, model=model
        )
        return [record]
    if key_ids is None:
        key_ids = candidate_key_ids(store, tenant, None, include_revoked, max_keys)
    listed = (lookup_many or store.get_many)(key_ids, tenant)
    records = [r for r in listed if r.tokenizer == fingerprint]
    if not records:
        raise NoKeys("(any)" if tenant is None else tenant, model)
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
        read: each item's readings, tokenized (``detector.detect.read_input``: the text as
            submitted and its canonical reading when it differs; exact ids alone), in item
            order.
        prompts: each item's templated prompt ids (for the tests that read the model), or None.
        key_ids: the keys to test (the request's ``key_id``, or the tenant's candidates).
        detailed: how many keys get a full result: min(keys, ``max_results``).
    """

    read: list[tuple[ReadText, ...]]
    prompts: list[list[int] | None]
    key_ids: list[str]
    detailed: int = 1

    @property
    def work(self) -> list[int]:
        """(items,) work in token·keys per item: tokens of every reading × (keys tested +
        ``DETAILED_KEY_WEIGHT`` × keys detailed)."""
        keys = len(self.key_ids) + DETAILED_KEY_WEIGHT * self.detailed
        return [sum(len(r.tokenized.ids) for r in read) * keys for read in self.read]

    def tokens(self, index: int) -> int:
        """Tokens of item ``index``'s longest reading (what ``max_tokens`` bounds)."""
        return max(len(r.tokenized.ids) for r in self.read[index])

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
    read: Sequence[ReadText] | None = None,
) -> MultiKeyDetection:
    """One text against ``records`` (from ``choose_keys``), each reading tokenized once (or
    given as ``read`` instead of ``text``/``token_ids``); the full result of the best
    ``detailed`` keys, every p corrected for the keys and the readings tried.

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
        read=read,
    )
