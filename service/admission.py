"""Admission: a request's checks and charges, in one call per route, before any model work.

``admit_generation`` (``POST /v1/generate`` and the OpenAI-compatible routes) and
``admit_detection`` (``POST /v1/detect`` and ``/v1/detect/batch``) take a parsed body and its
caller and either refuse the request or hand back what the job needs; a route reads "parse,
admit, run, answer". In order, a generation's admission

1. lowers each omitted ``max_new_tokens``, ``drafts``, ``lookahead`` to the server's limit
   (``capped_defaults``) and checks the caps: those three, the prompt's characters and
   messages (``max_prompt_chars``, ``max_messages``) and the drafter (one the model serves);
2. checks the key: the caller's tenant's, not revoked, made for the served tokenizer;
3. charges the new tokens asked for to the token's ``generate_rate_limit`` (429 beyond the
   window's budget), before the prompt is tokenized: a token without budget costs no work;
4. tokenizes the prompt on the detection pool, then charges its tokens (tokenizing was work,
   whether the request then passes or not) and refuses a request costing more than a whole
   window (prompt + new tokens) and a prompt over ``max_prompt_tokens``;
5. sets the deadline (``generation_deadline_s``: the worker cancels the job at it, 504).

A detection's admission

1. checks the caps of each text (``max_text_chars``, ``max_token_ids``, ids inside the served
   vocabulary, a prompt's characters and messages) and of a batch (``max_batch``);
2. starts the deadline (``detect_deadline_s``): what follows, and the run, must end by it, or
   the request is answered 504 ``deadline-exceeded`` (work not yet started on the pool never
   starts);
3. charges one unit per item to the token's ``detect_rate_limit``, then plans on the pool
   (the keys to test, counted from the key index; the items tokenized) and charges the rest of
   ceil(tokens × keys / ``detect_work_unit``) per item, at most a window's budget: the
   detector is an oracle, so every request's cost is bounded and paid before the keyed work;
4. checks the plan (``max_tokens``, ``max_evidence_tokens``) and refuses a request costing
   more than a whole window's budget.

Each violation raises the service's domain exception (``LimitExceeded``, ``InvalidInput``,
``RateLimited``, ``UnknownKey``…; ``service.errors`` maps them to problems). Hard limits of the
libraries are in the schemas, or applied here when they depend on the served model: no input a
client can send reaches a library's ``ValueError``. Body size is the middleware's (413); the
queue's bound is the worker's (503).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from anyio import to_thread

from sampler.completion import MAX_MESSAGES, prompt_ids
from service.errors import DeadlineExceeded, InvalidInput, LimitExceeded
from service.jobs.detection import DetectPlan
from service.jobs.detection_pool import DetectionPool
from service.jobs.generation import Generation, from_body, prepare
from service.jobs.resources import Resources
from service.keys.api_tokens import Principal
from service.keys.store import KeyStore
from service.ratelimit import RateLimiter
from service.schemas.common import ChatMessage
from service.schemas.detect import DetectInput, DetectOptions
from service.schemas.generate import GenerateRequest
from service.settings import Settings

T = TypeVar("T")

Encoder = Callable[[DetectionPool, GenerateRequest, Any], list[int]]
"""How a prompt becomes ids on a pool thread: ``encode_chat_prompt``, or the OpenAI raw
completion's own encoder."""


class Gate(Protocol):
    """What admission reads besides the body and its caller (``service.http.deps.ServiceDeps``
    is one)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def resources(self) -> Resources: ...
    @property
    def store(self) -> KeyStore: ...
    @property
    def pool(self) -> DetectionPool: ...
    @property
    def limiter(self) -> RateLimiter: ...
    @property
    def generate_limiter(self) -> RateLimiter: ...


@dataclasses.dataclass(frozen=True)
class Deadline:
    """An absolute deadline on the event loop's clock, named by its setting."""

    setting: str
    seconds: float
    at: float

    @classmethod
    def from_now(cls, setting: str, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now on the running event loop's clock, named by its
        ``setting`` in the 504 it causes."""
        return cls(setting, seconds, asyncio.get_running_loop().time() + seconds)

    async def run(self, work: Awaitable[T]) -> T:
        """``await work`` unless the deadline passes first.

        Raises:
            DeadlineExceeded: the deadline passed (``work`` is cancelled).
        """
        timeout = asyncio.timeout_at(self.at)
        try:
            async with timeout:
                return await work
        except TimeoutError:
            if not timeout.expired():  # another timeout, not the deadline's
                raise
            raise DeadlineExceeded(self.setting, self.seconds) from None


@dataclasses.dataclass(frozen=True)
class AdmittedGeneration:
    """A generation that passed admission.

    Attributes:
        body: the request, omitted B, L and new tokens lowered to the server's limits.
        generation: the request bound to the caller's key.
        ids: the prompt's token ids (through the chat template unless raw).
        deadline_s: seconds the worker gives the job (``generation_deadline_s``).
    """

    body: GenerateRequest
    generation: Generation
    ids: list[int]
    deadline_s: float


@dataclasses.dataclass(frozen=True)
class AdmittedDetection:
    """A detection that passed admission.

    Attributes:
        plan: the keys to test and the items' tokens (``DetectionPool.plan``), paid for.
        max_keys: ``max_keys_per_detect``, which the plan was made under.
        model: the served target, for the tests that read it (``options.reads_model``).
        deadline: when the request must be answered; the run goes through ``deadline.run``.
    """

    plan: DetectPlan
    max_keys: int
    model: Any
    deadline: Deadline


async def admit_generation(
    body: GenerateRequest,
    principal: Principal,
    gate: Gate,
    *,
    encode: Encoder | None = None,
    renamed: Mapping[str, str] | None = None,
    prompt_field: str | None = None,
) -> AdmittedGeneration:
    """Admit a generation (module docstring, steps 1-5).

    Args:
        encode: the prompt's encoder (default ``encode_chat_prompt``).
        renamed: request field -> the caller's name for it, in a refusal (the OpenAI routes
            name ``max_tokens``, ``B``, ``L``).
        prompt_field: the field a prompt over ``max_prompt_tokens`` is named by (default
            ``prompt`` or ``messages``, whichever the body has).
    """
    settings, resources = gate.settings, gate.resources
    names = dict(renamed or {})
    body = capped_defaults(body, settings)
    try:
        check_generate(body, settings)
    except LimitExceeded as exc:
        raise LimitExceeded(
            names.get(exc.field, exc.field), exc.limit, exc.actual, exc.unit
        ) from None
    check_drafter(body.drafter, resources.drafters)
    record = await to_thread.run_sync(gate.store.get_active, body.key_id, principal.tenant)
    generation = prepare(record, resources.fingerprint, from_body(body), resources.model)
    limiter, new_tokens = gate.generate_limiter, body.max_new_tokens
    new_field = names.get("max_new_tokens", "max_new_tokens")
    await charge_new_tokens(limiter, principal, new_tokens, new_field)
    pool = gate.pool
    ids = await pool.run(encode or encode_chat_prompt, pool, body, resources.loaded)
    await charge_prompt(limiter, principal, len(ids), new_tokens, new_field)
    field = prompt_field or ("prompt" if body.messages is None else "messages")
    check_prompt_tokens(len(ids), settings.max_prompt_tokens, field)
    return AdmittedGeneration(body, generation, ids, settings.generation_deadline_s)


async def admit_detection(
    items: list[DetectInput],
    options: DetectOptions,
    principal: Principal,
    gate: Gate,
    *,
    batch: bool,
) -> AdmittedDetection:
    """Admit a detection of ``items`` (one, unless ``batch``) with ``options`` (module
    docstring, steps 1-4)."""
    settings, resources = gate.settings, gate.resources
    if batch:
        check_batch(items, settings, resources.vocab_size)
    else:
        (item,) = items
        check_detect_input(item, settings, resources.vocab_size)
    deadline = Deadline.from_now("detect_deadline_s", settings.detect_deadline_s)
    plan = await deadline.run(_charged_plan(items, options, principal, gate, batch))
    model = resources.loaded.target if options.reads_model else None
    return AdmittedDetection(plan, settings.max_keys_per_detect, model, deadline)


async def _charged_plan(
    items: list[DetectInput],
    options: DetectOptions,
    principal: Principal,
    gate: Gate,
    batch: bool,
) -> DetectPlan:
    """Charge, plan, charge the planned work, check the plan (module docstring, steps 3-4)."""
    settings, pool, limiter = gate.settings, gate.pool, gate.limiter
    await limiter.spend(principal.token_id, len(items))
    plan: DetectPlan = await pool.run(
        pool.plan, gate.store, principal.tenant, items, options, settings.max_keys_per_detect, batch
    )
    unit = settings.detect_work_unit
    cost = plan.cost(unit)
    # charged as planned (tokenizing a refused text was work too), at most a window's budget
    charge = min(cost, limiter.limit) - len(items)
    if charge > 0:
        await limiter.spend(principal.token_id, charge)
    pool.check_plan(plan, items, options, batch)
    if cost > limiter.limit:
        field = "items" if batch else ("text" if items[0].token_ids is None else "token_ids")
        raise LimitExceeded(
            field,
            limiter.limit,
            cost,
            f"work units per request (ceil(tokens × keys tested / {unit}) per item, the "
            "detect_rate_limit of a whole window)",
        )
    return plan


def encode_chat_prompt(pool: DetectionPool, body: GenerateRequest, loaded: Any) -> list[int]:
    """Prompt ids through the chat template, with this pool thread's tokenizer."""
    mine = dataclasses.replace(loaded, tokenizer=pool.tokenizer())
    messages = None if body.messages is None else [m.model_dump() for m in body.messages]
    return prompt_ids(mine, body.prompt, messages)


# --- charges: the generation budget ------------------------------------------------------


async def charge_new_tokens(
    limiter: RateLimiter, principal: Principal, new_tokens: int, field: str
) -> None:
    """Charge the new tokens a generation asks for (``field``: the request's name for them),
    before its prompt is tokenized: a token without budget left costs no tokenizing."""
    await limiter.spend(principal.token_id, min(new_tokens, limiter.limit))
    if new_tokens > limiter.limit:
        raise _over_window(limiter, new_tokens, field)


async def charge_prompt(
    limiter: RateLimiter, principal: Principal, prompt_tokens: int, new_tokens: int, field: str
) -> None:
    """Charge the prompt's tokens (tokenizing was work, whether the request then passes its
    limits or not), the request at most a window's budget in all; a request costing more than
    a whole window (prompt + new tokens) is refused, naming ``field`` (the new tokens')."""
    charge = min(prompt_tokens, limiter.limit - new_tokens)  # the new tokens are charged
    if charge > 0:
        await limiter.spend(principal.token_id, charge)
    if prompt_tokens + new_tokens > limiter.limit:
        raise _over_window(limiter, prompt_tokens + new_tokens, field)


def _over_window(limiter: RateLimiter, cost: int, field: str) -> LimitExceeded:
    return LimitExceeded(
        field,
        limiter.limit,
        cost,
        "tokens per request, prompt + new tokens (the generate_rate_limit of a whole window)",
    )


# --- caps: the settings' request limits --------------------------------------------------


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
    """A generation's caps (``max_new_tokens``, ``drafts``, ``lookahead``, the prompt's
    characters and messages). Raises ``LimitExceeded`` naming the field and the limit."""
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
    """A prompt's token count after the chat template (``max_prompt_tokens``); ``field`` names
    the request field it came from (``prompt`` or ``messages``)."""
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
    """A batch's size (``max_batch``) and each item's caps, named ``items[i].<field>``. Raises
    ``LimitExceeded`` or ``InvalidInput``."""
    _at_most("items", len(items), settings.max_batch, "items")
    for i, item in enumerate(items):
        check_detect_input(item, settings, vocab_size, f"items[{i}].")
