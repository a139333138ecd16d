"""``poissonmark generate``: a watermarked completion on this machine
(``service.jobs.generation``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sampler.methods import DEFAULT_TREE, METHODS
from service.cli.common import (
    DeviceOpt,
    Json,
    ModelOpt,
    PrecisionOpt,
    emit_json,
    errors,
    key_store,
    load,
    out,
    read_settings,
)
from service.settings import model_name

if TYPE_CHECKING:
    from service.jobs.generation import Generated

METHOD_HELP = (
    f"watermarked: {', '.join(m for m, spec in METHODS.items() if spec.watermarked)}; "
    f"no watermark: {', '.join(m for m, spec in METHODS.items() if not spec.watermarked)}"
)
"""From the sampler's table of methods (``sampler.methods.METHODS``)."""


def read_messages(path: Path) -> list[dict[str, str]]:
    """Chat messages from a JSON file: a list of ``{role, content}``, or ``{"messages": [...]}``.

    Raises:
        ValueError: not JSON, or not a list (``sampler.completion`` checks each message).
    """
    try:
        messages = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--messages-file: not JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(messages, dict) and "messages" in messages:
        messages = messages["messages"]
    if not isinstance(messages, list):
        raise ValueError("--messages-file: expected a JSON list of messages")
    return messages


def generate(
    key: Annotated[str, typer.Option("--key", help="Key id.")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="User message.")] = None,
    messages_file: Annotated[
        Path | None,
        typer.Option("--messages-file", help="JSON list of {role, content} chat messages."),
    ] = None,
    method: Annotated[str, typer.Option(help=METHOD_HELP)] = "mpfr",
    drafter: Annotated[
        str | None,
        typer.Option(
            help="The cheap model that guesses ahead: eagle (the shipped draft head, the default "
            "where it fits the model), ngram (copies from the prompt and answer; the default "
            "otherwise), heads, self:N, heads:PATH, eagle:PATH or model:PATH. With a "
            "watermarked method it changes the speed, never the text."
        ),
    ] = None,
    drafts: Annotated[
        int,
        typer.Option(
            "--drafts",
            "-B",
            help="Drafts B: how many guesses the drafter offers at each step; the model checks "
            "them all in one pass (watermarked methods: the speed changes, never the text).",
        ),
    ] = 4,
    lookahead: Annotated[
        int,
        typer.Option(
            "--lookahead",
            "-L",
            help="Lookahead L: how many tokens ahead each guess reaches (watermarked methods: "
            "the speed changes, never the text).",
        ),
    ] = 4,
    tree: Annotated[
        str,
        typer.Option(
            help="The shape of the guesses checked at each step: auto (B and L are upper "
            "bounds; each step picks the shape expected to be fastest) or fixed (always B "
            "guesses of L tokens); the same text either way."
        ),
    ] = DEFAULT_TREE,
    max_new_tokens: Annotated[int, typer.Option(help="At most this many new tokens.")] = 128,
    temperature: float = 1.0,
    top_k: Annotated[int, typer.Option(help="0 = off.")] = 50,
    top_p: float = 1.0,
    nonce: Annotated[
        int | None, typer.Option(help="Request nonce (repeated contexts); random when omitted.")
    ] = None,
    model: ModelOpt = None,
    device: DeviceOpt = None,
    precision: PrecisionOpt = None,
    as_json: Json = False,
) -> None:
    """Generate a watermarked completion (an exact sample of the model)."""
    from sampler.completion import prompt_ids
    from sampler.targets.model_files import tokenizer_fingerprint
    from service.jobs.generation import generation_request, prepare, run

    settings = read_settings()
    with errors():
        if (prompt is None) == (messages_file is None):
            raise ValueError("give exactly one of --prompt or --messages-file")
        messages = None if messages_file is None else read_messages(messages_file)
        wanted = generation_request(
            method,
            drafts,
            lookahead,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            drafter,
            nonce,
            tree,
        )
        with key_store(settings) as store:
            record = store.get_active(key)
        loaded = load(settings, model, device, as_json, precision)
        fingerprint = tokenizer_fingerprint(loaded.tokenizer)
        generation = prepare(record, fingerprint, wanted, model_name(loaded.name))
        ids = prompt_ids(loaded, prompt, messages)
        context = getattr(loaded.model.config, "max_position_embeddings", None)
        if context is not None and len(ids) + max_new_tokens > context:
            raise ValueError(
                f"--max-new-tokens: the prompt's {len(ids)} tokens and {max_new_tokens} new "
                f"tokens do not fit the model's context of {context} tokens"
            )
        done = run(loaded, ids, generation)
    if as_json:
        emit_json(done.to_json())
    else:
        show(done)


def show(done: Generated) -> None:
    """The completion, then one dim line of how it was made."""
    r, s = done.result, done.result.stats
    out.print(done.text, highlight=False, markup=False)
    out.print(
        f"\n[dim]{s.emitted_tokens} tokens · {s.target_forward_passes} target passes · "
        f"AATPS {s.aatps:.2f} · {s.tokens_per_second:.1f} tok/s · {r.method}"
        f"{' + ' + done.drafter if done.drafter else ''} · watermark "
        f"{'on' if r.watermark_applied else 'off'} · nonce {done.generation.nonce}"
        f"{tree_summary(s.tree_choices)}[/]"
    )


def tree_summary(choices: tuple[tuple[int, int, int], ...]) -> str:
    """`` · trees 30×1-token, 12×B2L3`` (the most used first, at most three), or ``""``."""
    ranked = sorted(choices, key=lambda c: -c[2])[:3]
    named = [f"{n}×{'1-token' if d == 0 else f'B{b}L{d}'}" for b, d, n in ranked]
    return f" · trees {', '.join(named)}" if named else ""
