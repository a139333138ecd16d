"""Generation for the service: a request and a key record -> a generation -> its result.

The one path the CLI (``poissonmark generate``) and the HTTP edge (``POST /v1/generate``) share,
beside ``service.jobs.detection`` (docs/design.md §5):

1. ``generation_request`` (or ``from_body`` for an HTTP body) checks and builds the sampler
   config once, before anything is looked up: a bad method or B fails first.
2. ``prepare`` binds it to a key: the tokenizer check (``TokenizerMismatch``, a 409 over HTTP,
   one line on the CLI), the nonce (the caller's, or a fresh one chosen here and nowhere else),
   and the record's keyed source for that nonce (``KeyRecord.source``).
3. The caller runs it: ``run`` on a loaded model (the CLI), or the worker (``service.jobs.worker``).
4. ``Generated.to_json`` is the one wire shape of a result (``GenerateResponse``), for the CLI's
   ``--json`` and the HTTP response alike.

Glossary: **request** what a caller asks for besides the key and the prompt; **generation**
a request bound to a key and a nonce, ready to run; **drafter** its spec (``ngram``,
``self:N``, ``heads:PATH``, ``eagle:PATH``, ``model:PATH``), ``None`` for a method that does
not draft.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from detector.tokens import check_tokenizer
from keyed import KeyedSource
from sampler.completion import complete
from sampler.methods import DEFAULT_TREE, TREE_MODES, SamplerConfig, parse_method
from sampler.models import LoadedModel
from sampler.processing import Processing
from sampler.stats import GenerationResult, GenerationStats
from service.keys.record import KeyRecord
from service.schemas.generate import GenerateRequest

NONCE_BOUND = 2**63
"""Nonces are drawn from [0, 2^63): every one fits a JSON integer and the schema's bound."""


@dataclass(frozen=True)
class GenerationRequest:
    """What to sample, independent of the key: the config, the drafter spec, the nonce.

    Attributes:
        config: the sampler's config (method, B, L, N, processing).
        drafter: the drafter spec; ``None`` when the method does not draft.
        nonce: the request nonce for repeated contexts; ``None`` lets ``prepare`` choose one.
    """

    config: SamplerConfig
    drafter: str | None = None
    nonce: int | None = None


def generation_request(
    method: str,
    drafts: int,
    lookahead: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    drafter: str | None,
    nonce: int | None = None,
    tree: str = DEFAULT_TREE,
) -> GenerationRequest:
    """A checked request (a speculative method keeps ``drafter``, the others drop it);
    ``tree``: ``SamplerConfig.tree`` (``auto``: B and L are caps, the tree per step is the
    cost model's, ``sampler.autotree``).

    Raises:
        ValueError: an unknown method, or from ``SamplerConfig`` or ``Processing``, naming the
            field and the limit.
    """
    processing = Processing(temperature, top_k, top_p)
    if tree not in TREE_MODES:
        raise ValueError(f"tree must be one of {', '.join(TREE_MODES)}, got {tree!r}")
    config = SamplerConfig(
        parse_method(method), drafts, lookahead, max_new_tokens, processing, tree
    )
    return GenerationRequest(config, drafter if config.speculative else None, nonce)


def from_body(body: GenerateRequest) -> GenerationRequest:
    """The request of a ``POST /v1/generate`` body (its schema already checked the ranges)."""
    return generation_request(
        body.method,
        body.drafts,
        body.lookahead,
        body.max_new_tokens,
        body.temperature,
        body.top_k,
        body.top_p,
        body.drafter,
        body.nonce,
        body.tree,
    )


@dataclass(frozen=True)
class Generation:
    """A request bound to a key and a nonce: everything the decoder needs but the prompt."""

    key_id: str
    nonce: int
    config: SamplerConfig
    source: KeyedSource = field(repr=False)
    drafter: str | None

    def start_json(self) -> dict[str, Any]:
        """``{"key_id", "nonce", "method"}``: what is known before the first token."""
        return {"key_id": self.key_id, "nonce": self.nonce, "method": self.config.method}


def prepare(
    record: KeyRecord, fingerprint: str, request: GenerationRequest, model: str | None = None
) -> Generation:
    """Bind ``request`` to ``record`` (the caller chose it: active, the caller's tenant).

    Args:
        fingerprint: ``tokenizer_fingerprint`` of the model that will generate.
        model: that model's name (``service.settings.model_name``), for the message.
    Raises:
        TokenizerMismatch: the key was made for another tokenizer.
    """
    check_tokenizer(
        record.tokenizer, fingerprint, record.key_id, key_model=record.model, model=model
    )
    nonce = secrets.randbelow(NONCE_BOUND) if request.nonce is None else request.nonce
    return Generation(record.key_id, nonce, request.config, record.source(nonce), request.drafter)


def stats_json(stats: GenerationStats) -> dict[str, Any]:
    """The ``GenerationStatsOut`` shape of the decoder's counters."""
    return {
        "emitted_tokens": stats.emitted_tokens,
        "target_forward_passes": stats.target_forward_passes,
        "aatps": stats.aatps,
        "drafter_calls": stats.drafter_calls,
        "accepted_per_level": list(stats.accepted_per_level),
        "prefill_seconds": stats.prefill_seconds,
        "seconds": stats.seconds,
        "tokens_per_second": stats.tokens_per_second,
        "tree_choices": [
            {"drafts": b, "lookahead": depth, "steps": n} for b, depth, n in stats.tree_choices
        ],
        "step_seconds": {
            "draft": stats.step_seconds.draft,
            "forward": stats.step_seconds.forward,
            "walk": stats.step_seconds.walk,
        },
    }


@dataclass(frozen=True)
class Generated:
    """A finished generation: the completion alone (never the prompt, case C3) and how.

    Attributes:
        generation: what ran.
        text: the completion, decoded from ``result.token_ids``.
        result: the decoder's result.
        drafter: the name of the drafter that ran (``None`` without one).
    """

    generation: Generation
    text: str
    result: GenerationResult
    drafter: str | None

    def to_json(self) -> dict[str, Any]:
        """The ``GenerateResponse`` wire shape: plain JSON types, no key material."""
        r = self.result
        return {
            "text": self.text,
            "token_ids": list(r.token_ids),
            "key_id": self.generation.key_id,
            "method": self.generation.config.method,
            "drafter": self.drafter,
            "nonce": self.generation.nonce,
            "finish_reason": r.finish_reason,
            "watermark_applied": r.watermark_applied,
            "stats": stats_json(r.stats),
        }


def run(loaded: LoadedModel, prompt: list[int], generation: Generation) -> Generated:
    """Generate on this thread (the CLI; the service's worker runs the same decoder).

    Args:
        prompt: (T,) the chat-templated prompt ids (``sampler.completion.prompt_ids``).
    """
    done = complete(loaded, prompt, generation.config, generation.source, generation.drafter)
    return Generated(generation, done.text, done.result, done.drafter)
