"""The API contract as served: FastAPI's OpenAPI document, made to say what this server accepts.

The request schemas carry the libraries' hard limits; what depends on the deployment is added
here, from the values the routes check (a schema looser than the server misleads
every generated client and fuzzer):

- the limits of the settings (``max_new_tokens``, ``max_drafts``, ``max_text_chars``…; the
  checks are ``service.admission``), as ``maximum`` / ``maxLength`` / ``maxItems``, and a
  default over its limit lowered to it (``admission.capped_defaults``);
- once the model is loaded, the token ids of its tokenizer (``maximum``) and the drafter specs
  it accepts (an ``enum`` instead of the pattern; ``served_drafters``);
- integer bounds as integers (FastAPI's document model stores bounds as floats, and a client
  reading ``9.223372036854776e18`` as a bound would send 2^63).

The committed ``openapi.yaml`` is the document of the default settings before a model loads;
the web page reads the served one (``/openapi.json``) for its form's limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from sampler.completion import MAX_MESSAGES
from sampler.drafters.eagle import eagle_drafter
from sampler.drafters.heads import SHIPPED_HEADS, find_trained, heads_drafter
from service.settings import Settings

JsonSchema = dict[str, Any]
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def served_drafters(model: PreTrainedModel, data_dir: Path | None = None) -> tuple[str, ...]:
    """The drafter specs ``POST /v1/generate`` accepts for ``model``: ``ngram``, ``self:N``
    for every N below its depth, and ``eagle`` and ``heads`` when a head and heads fit it
    (trained for it in ``data_dir`` or shipped: ``sampler.drafters.heads.find_trained``)."""
    depth = int(model.config.num_hidden_layers)
    specs = ["ngram", *(f"self:{n}" for n in range(1, depth))]
    try:
        eagle_drafter("", model, data_dir)
        specs.insert(0, "eagle")
    except ValueError:
        pass  # trained for another target
    if find_trained(data_dir, model, "heads", SHIPPED_HEADS).is_dir():
        try:
            heads_drafter("", model, data_dir)
            specs.insert(specs.index("ngram") + 1, "heads")
        except ValueError:
            pass  # trained for another target
    return tuple(specs)


def tighten(
    document: JsonSchema,
    settings: Settings,
    vocab_size: int | None = None,
    drafters: tuple[str, ...] | None = None,
) -> None:
    """Add the deployment's limits to ``document`` in place (see the module docstring).

    Args:
        document: an OpenAPI 3.1 document made by FastAPI from this app.
        settings: the limits. vocab_size, drafters: the served model's, once loaded.
    """
    schemas: dict[str, JsonSchema] = document.get("components", {}).get("schemas", {})
    messages = min(settings.max_messages, MAX_MESSAGES)
    limits: list[tuple[str, str, str, int]] = [
        ("GenerateRequest", "max_new_tokens", "maximum", settings.max_new_tokens),
        ("GenerateRequest", "drafts", "maximum", settings.max_drafts),
        ("GenerateRequest", "lookahead", "maximum", settings.max_lookahead),
        ("GenerateRequest", "prompt", "maxLength", settings.max_prompt_chars),
        ("GenerateRequest", "messages", "maxItems", messages),
        ("ChatMessage", "content", "maxLength", settings.max_prompt_chars),
        ("DetectBatchRequest", "items", "maxItems", settings.max_batch),
    ]
    for name in ("ChatCompletionRequest", "CompletionRequest"):  # the OpenAI-compatible routes
        limits.append((name, "B", "maximum", settings.max_drafts))
        limits.append((name, "L", "maximum", settings.max_lookahead))
        limits.append((name, "max_tokens", "maximum", settings.max_new_tokens))
    limits.append(("ChatCompletionRequest", "max_completion_tokens", "maximum",
                   settings.max_new_tokens))  # fmt: skip
    for name in ("DetectRequest", "DetectInput"):
        limits.append((name, "text", "maxLength", settings.max_text_chars))
        limits.append((name, "token_ids", "maxItems", settings.max_token_ids))
        limits.append((name, "prompt", "maxLength", settings.max_prompt_chars))
        limits.append((name, "messages", "maxItems", messages))
    for model, field, keyword, value in limits:
        for branch in _branches(schemas, model, field):
            branch[keyword] = min(branch.get(keyword, value), value)
            if keyword == "maximum" and branch.get("default", value) > value:
                branch["default"] = value  # what the server uses (limits.capped_defaults)
    if vocab_size is not None:
        for name in ("DetectRequest", "DetectInput"):
            for branch in _branches(schemas, name, "token_ids"):
                items = branch["items"]
                items["maximum"] = min(items.get("maximum", vocab_size - 1), vocab_size - 1)
    if drafters is not None:
        for request in ("GenerateRequest", "ChatCompletionRequest", "CompletionRequest"):
            for branch in _branches(schemas, request, "drafter"):
                branch.pop("pattern", None)
                branch["enum"] = list(drafters)
    _integer_bounds(document)


def _branches(schemas: dict[str, JsonSchema], model: str, field: str) -> Iterator[JsonSchema]:
    """The non-null schemas of ``model.field`` (the branches of an optional field's anyOf)."""
    prop = schemas.get(model, {}).get("properties", {}).get(field)
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            yield branch


def _integer_bounds(node: Any) -> None:
    """Integral float bounds of ``type: integer`` schemas back to integers, everywhere."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in _BOUNDS:
                value = node.get(key)
                if isinstance(value, float) and value.is_integer():
                    node[key] = int(value)
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)
