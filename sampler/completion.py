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
from sampler.decoder import GenerationResult, SamplerConfig, generate
from sampler.drafters import Drafter, make_drafter
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
        drafter: a drafter spec (``self:N``, ``ngram``, ``model:PATH``) or instance; required for
            speculative methods and ignored otherwise.
    """
    instance: Drafter | None = None
    if config.speculative:
        if drafter is None:
            raise ValueError(f"drafter: method {config.method!r} needs one (e.g. ngram, self:8)")
        instance = make_drafter(drafter, loaded.model) if isinstance(drafter, str) else drafter
    result = generate(loaded.model, ids, config, source, instance, eos_ids(loaded))
    text = loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
    assert isinstance(text, str), "one sequence decodes to one string"
    return Completion(text=text, result=result, drafter=instance.name if instance else None)
