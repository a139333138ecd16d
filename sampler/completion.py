"""From a prompt or chat messages to a completion on a loaded model (the library entry point).

Chat messages go through the tokenizer's chat template with the generation prompt appended; a
plain prompt is sent as one user message. The completion (text and ids) never contains the
prompt (case C3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from keyed import KeyedSource
from sampler.batch import generate_many
from sampler.decoder import GenerationResult, SamplerConfig, generate
from sampler.drafters import Drafter, default_drafter, fresh_drafter, make_drafter
from sampler.models import LoadedModel

MAX_MESSAGES = 256


@dataclass(frozen=True)
class Completion:
    """The completion text (decoded from ``result.token_ids``) and the decoder's result."""

    text: str
    result: GenerationResult
    drafter: str | None


def prompt_ids(
    loaded: LoadedModel,
    prompt: str | None = None,
    messages: Sequence[dict[str, str]] | None = None,
) -> list[int]:
    """Token ids of the chat-templated prompt (``chat_prompt_ids`` with the model's tokenizer)."""
    return chat_prompt_ids(loaded.tokenizer, prompt, messages)


def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | None = None,
    messages: Sequence[dict[str, str]] | None = None,
) -> list[int]:
    """Token ids of the chat-templated prompt; ``prompt`` is sent as one user message.

    Raises:
        ValueError: neither or both of prompt/messages, malformed messages (naming the index).
    """
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    if prompt is not None:
        messages = [{"role": "user", "content": prompt}]
    assert messages is not None
    if not 1 <= len(messages) <= MAX_MESSAGES:
        raise ValueError(f"messages: expected 1..{MAX_MESSAGES} messages, got {len(messages)}")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"messages[{i}]: expected {{'role': str, 'content': str}}")
    encoded = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, return_dict=True
    )
    assert isinstance(encoded, Mapping), "return_dict=True gives a BatchEncoding"
    return [int(t) for t in encoded["input_ids"]]


def eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """End-of-sequence ids of the model (tokenizer and generation config)."""
    ids: set[int] = set()
    for source in (
        loaded.tokenizer.eos_token_id,
        getattr(loaded.model.generation_config, "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def complete(
    loaded: LoadedModel,
    ids: list[int],
    config: SamplerConfig,
    source: KeyedSource,
    drafter: str | Drafter | None = None,
) -> Completion:
    """Generate a completion of ``ids`` (from ``prompt_ids``).

    Args:
        drafter: a drafter spec (``eagle``, ``ngram``, ``self:N``, ``model:PATH``…) or instance
            for a speculative method (``None``: ``sampler.drafters.default_drafter``); ignored
            otherwise.
    """
    instance: Drafter | None = None
    if config.speculative:
        if drafter is None:
            instance = default_drafter(loaded.target, loaded.data_dir)
        elif isinstance(drafter, str):
            instance = make_drafter(drafter, loaded.target, loaded.data_dir)
        else:
            instance = drafter
    result = generate(loaded.target, ids, config, source, instance, eos_ids(loaded))
    text = loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
    assert isinstance(text, str), "one sequence decodes to one string"
    return Completion(text=text, result=result, drafter=instance.name if instance else None)


@dataclass(frozen=True)
class CompletionRequest:
    """One request of ``complete_many``: prompt ids (``prompt_ids``), config, keyed source and
    drafter (a spec or an instance; ``None``: ``sampler.drafters.default_drafter`` for a
    speculative method, none otherwise)."""

    ids: list[int]
    config: SamplerConfig
    source: KeyedSource
    drafter: str | Drafter | None = None


def complete_many(
    loaded: LoadedModel,
    requests: Sequence[CompletionRequest],
    max_batch: int | None = 8,
    node_budget: int | None = None,
) -> list[Completion]:
    """``complete`` for many requests, continuously batched (``sampler.batch``): up to
    ``max_batch`` step together (one target forward over all their draft trees per step), the
    next joins when one finishes. Each completion equals the request's ``complete`` output.

    A drafter spec is built once per spec and each request gets its own instance of it
    (``fresh_drafter``); an instance passed in is copied the same way (never shared).

    Args:
        max_batch: requests stepping together (None: all at once).
        node_budget: cap on draft-tree nodes per target forward (``step_many``; keyed-race
            requests only, their output unchanged).
    Raises:
        ValueError: ``complete``'s errors.
    """
    built: dict[str, Drafter] = {}
    default: Drafter | None = None
    runs: list[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None]] = []
    for request in requests:
        instance: Drafter | None = None
        if request.config.speculative:
            spec = request.drafter
            if spec is None:
                if default is None:
                    default = default_drafter(loaded.target, loaded.data_dir)
                spec = default
            if isinstance(spec, str):
                if spec not in built:
                    built[spec] = make_drafter(spec, loaded.target, loaded.data_dir)
                spec = built[spec]
            instance = fresh_drafter(spec)
        runs.append((request.ids, request.config, request.source, instance))
    results = generate_many(loaded.target, runs, eos_ids(loaded), max_batch, node_budget)
    out = []
    for (_, _, _, instance), result in zip(runs, results, strict=True):
        text = loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
        assert isinstance(text, str), "one sequence decodes to one string"
        out.append(
            Completion(text=text, result=result, drafter=instance.name if instance else None)
        )
    return out
