"""The service's request limits (settings), checked before any work is queued.

Each violation raises ``LimitExceeded`` naming the field and the limit (422 ``limit-exceeded``);
body size is the middleware's (413). Hard limits of the libraries are in the schemas, or
applied here when they depend on the served model (``InvalidInput``, 422 ``invalid-request``):
no input a client can send reaches a library's ``ValueError``.
"""

from __future__ import annotations

from sampler.completion import MAX_MESSAGES
from service.errors import InvalidInput, LimitExceeded
from service.schemas.common import ChatMessage
from service.schemas.detect import DetectInput
from service.schemas.generate import GenerateRequest
from service.settings import Settings


def _at_most(field: str, actual: int, limit: int, unit: str = "") -> None:
    if actual > limit:
        raise LimitExceeded(field, limit, actual, unit)


_CAPPED: dict[str, str] = {
    "max_new_tokens": "max_new_tokens",
    "drafts": "max_drafts",
    "lookahead": "max_lookahead",
}
"""Request field -> the setting that bounds it, for the defaults ``capped_defaults`` lowers."""


def capped_defaults(request: GenerateRequest, settings: Settings) -> GenerateRequest:
    """``request`` with each omitted ``max_new_tokens``, ``drafts``, ``lookahead`` lowered to
    the server's limit where the schema's default is over it (the served document states the
    lowered default): leaving a field out never breaks a limit."""
    lowered = {
        field: getattr(settings, setting)
        for field, setting in _CAPPED.items()
        if field not in request.model_fields_set
        and getattr(request, field) > getattr(settings, setting)
    }
    return request.model_copy(update=lowered) if lowered else request


def check_generate(request: GenerateRequest, settings: Settings) -> None:
    _at_most("max_new_tokens", request.max_new_tokens, settings.max_new_tokens)
    _at_most("drafts", request.drafts, settings.max_drafts)
    _at_most("lookahead", request.lookahead, settings.max_lookahead)
    check_prompt(request.prompt, request.messages, settings)


def check_prompt(
    prompt: str | None, messages: list[ChatMessage] | None, settings: Settings, where: str = ""
) -> None:
    """A chat prompt's limits (``POST /v1/generate``, and the generation's prompt a detect item
    may carry): ``prompt`` characters, ``messages`` count and their characters in all."""
    if prompt is not None:
        _at_most(f"{where}prompt", len(prompt), settings.max_prompt_chars, "characters")
    if messages is not None:
        limit = min(settings.max_messages, MAX_MESSAGES)  # the chat prompt's own bound
        _at_most(f"{where}messages", len(messages), limit, "messages")
        chars = sum(len(m.content) for m in messages)
        _at_most(
            f"{where}messages[].content", chars, settings.max_prompt_chars, "characters in all"
        )


def check_drafter(spec: str | None, drafters: tuple[str, ...]) -> None:
    """``spec`` is one of the served model's drafters, or None (the served model's default;
    whatever the method: the schema's enum holds for every request, so a drafter the method
    does not use is checked too)."""
    if spec is not None and spec not in drafters:
        raise InvalidInput("drafter", f"expected one of {', '.join(drafters)} for the served model")


def check_prompt_tokens(count: int, limit: int, field: str = "prompt") -> None:
    """A prompt's token count after the chat template (``max_prompt_tokens``), for generate,
    the OpenAI-compatible routes and a detect item's prompt; ``field`` names the request field
    it came from (``prompt`` or ``messages``)."""
    _at_most(field, count, limit, "tokens after the chat template")


def check_detect_input(
    item: DetectInput, settings: Settings, vocab_size: int, where: str = ""
) -> None:
    """Limits of one text, and its ``token_ids`` inside the served tokenizer's vocabulary."""
    if item.text is not None:
        _at_most(f"{where}text", len(item.text), settings.max_text_chars, "characters")
    check_prompt(item.prompt, item.messages, settings, where)
    if item.token_ids is not None:
        _at_most(f"{where}token_ids", len(item.token_ids), settings.max_token_ids, "ids")
        for i, token in enumerate(item.token_ids):
            if not 0 <= token < vocab_size:
                raise InvalidInput(
                    f"{where}token_ids[{i}]",
                    f"expected an id of the served tokenizer, in [0, {vocab_size}), got {token}",
                )


def check_batch(items: list[DetectInput], settings: Settings, vocab_size: int) -> None:
    _at_most("items", len(items), settings.max_batch, "items")
    for i, item in enumerate(items):
        check_detect_input(item, settings, vocab_size, f"items[{i}].")
