"""The ``poissonmark`` command line: keys, generate, detect.

``--json`` prints one JSON object (the contract later checks rely on); without it the output is
for people. Errors print one line naming the problem and exit with status 2 (bad input) or 1
(environment: Redis, model files). Secrets never appear in any output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from service.errors import PoissonmarkError
from service.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Watermarked LLM text by keyed multi-draft speculative sampling (MPFR).")
keys_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke watermark keys.")
app.add_typer(keys_app, name="keys")

out = Console()
err = Console(stderr=True)
log = logging.getLogger("poissonmark")


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def _emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def _store(settings: Settings) -> Iterator[Any]:
    from service.keystore import KeyStore, close_redis, load_or_create_kek, open_redis

    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    client = open_redis(url, settings.home)
    try:
        kek = settings.kek_bytes()
        if kek is None:
            kek = load_or_create_kek(settings.home)
        yield KeyStore(client, kek)
    finally:
        close_redis(client)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Map domain and input errors to one clear line; never a traceback for bad input."""
    try:
        yield
    except PoissonmarkError as exc:
        _fail(str(exc), 1 if type(exc).__name__ in ("KeyStoreUnavailable",) else 2)
    except ValueError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{type(exc).__name__}: {exc}", 1)


def _load(settings: Settings, model: str | None, device: str | None, quiet: bool) -> Any:
    from sampler.models import load_model

    with err.status("loading model…", spinner="dots") if not quiet else contextlib.nullcontext():
        return load_model(model or settings.model, settings.home, device or settings.device,
                          on_progress=(lambda msg: err.print(msg)) if not quiet else None)


def _tokenizer(settings: Settings, model: str | None, quiet: bool) -> Any:
    from sampler.models import load_tokenizer, materialise

    with err.status("preparing tokenizer…") if not quiet else contextlib.nullcontext():
        materialise(model or settings.model, settings.home,
                    (lambda msg: err.print(msg)) if not quiet else None)
        return load_tokenizer(model or settings.model, settings.home)


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Alias or local HF model dir.")]


@keys_app.command("create")
def keys_create(
    context_width: Annotated[int, typer.Option("--context-width", min=1, max=64,
                                               help="Label width m.")] = 4,
    no_masking: Annotated[bool, typer.Option("--no-masking",
                                             help="Turn the repeated-context rule off.")] = False,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Create a key bound to the model's tokenizer."""
    from sampler.models import tokenizer_fingerprint

    settings = Settings()
    with _errors():
        fingerprint = tokenizer_fingerprint(_tokenizer(settings, model, as_json))
        with _store(settings) as store:
            record = store.create(fingerprint, context_width, not no_masking)
    public = record.public()
    view = {k: public[k] for k in ("key_id", "context_width", "prf_version", "tokenizer",
                                   "created_at")} | {"masking": record.masking}
    if as_json:
        _emit_json(view)
    else:
        out.print(f"created key [bold]{record.key_id}[/] (context width {record.context_width}, "
                  f"tokenizer {record.tokenizer})")


@keys_app.command("list")
def keys_list(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    as_json: Json = False,
) -> None:
    """List keys (public fields only)."""
    settings = Settings()
    with _errors(), _store(settings) as store:
        records = store.list(include_revoked=include_revoked)
    if as_json:
        _emit_json({"keys": [r.public() for r in records]})
        return
    for r in records:
        state = "revoked" if r.revoked else "active"
        out.print(f"{r.key_id}  m={r.context_width}  {state}  {r.created_at}  {r.tokenizer}")


@keys_app.command("revoke")
def keys_revoke(key_id: str, as_json: Json = False) -> None:
    """Revoke a key: it can no longer generate (detection with it still works)."""
    settings = Settings()
    with _errors(), _store(settings) as store:
        record = store.revoke(key_id)
    if as_json:
        _emit_json(record.public())
    else:
        out.print(f"revoked {record.key_id}")


@app.command()
def generate(
    key: Annotated[str, typer.Option("--key", help="Key id.")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="User message.")] = None,
    messages_file: Annotated[Path | None, typer.Option(
        "--messages-file", help="JSON list of {role, content} chat messages.")] = None,
    method: Annotated[str, typer.Option(help="ar, basic-uwm, pfr, mpfr, pfr-nowm, mpfr-nowm")
                      ] = "mpfr",
    drafter: Annotated[str, typer.Option(help="ngram, self:N or model:PATH")] = "ngram",
    drafts: Annotated[int, typer.Option("--drafts", "-B", help="Drafts B.")] = 4,
    lookahead: Annotated[int, typer.Option("--lookahead", "-L", help="Lookahead L.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="At most this many new tokens.")] = 128,
    temperature: float = 1.0,
    top_k: Annotated[int, typer.Option(help="0 = off.")] = 50,
    top_p: float = 1.0,
    nonce: Annotated[int | None, typer.Option(
        help="Request nonce (repeated contexts); random when omitted.")] = None,
    model: ModelOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda…")] = None,
    as_json: Json = False,
) -> None:
    """Generate a watermarked completion (an exact sample of the model)."""
    from keyed import KeyedSource
    from sampler.completion import complete, prompt_ids
    from sampler.decoder import SamplerConfig
    from sampler.models import tokenizer_fingerprint
    from sampler.processing import Processing

    settings = Settings()
    with _errors():
        if (prompt is None) == (messages_file is None):
            raise ValueError("give exactly one of --prompt or --messages-file")
        messages = None
        if messages_file is not None:
            try:
                messages = json.loads(messages_file.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"--messages-file: not JSON ({exc.msg} at line {exc.lineno})"
                                 ) from None
            if isinstance(messages, dict) and "messages" in messages:
                messages = messages["messages"]
            if not isinstance(messages, list):
                raise ValueError("--messages-file: expected a JSON list of messages")
        config = SamplerConfig(method, drafts, lookahead, max_new_tokens,
                               Processing(temperature, top_k, top_p))
        if nonce is None:
            nonce = secrets.randbelow(2**63)
        with _store(settings) as store:
            record = store.get_active(key)
        loaded = _load(settings, model, device, as_json)
        if tokenizer_fingerprint(loaded.tokenizer) != record.tokenizer:
            raise ValueError(f"key {record.key_id} was made for tokenizer {record.tokenizer}; "
                             "this model's tokenizer differs")
        source = KeyedSource(record.secret, record.context_width, record.masking, nonce)
        ids = prompt_ids(loaded, prompt, messages)
        done = complete(loaded, ids, config, source, drafter)
    r, s = done.result, done.result.stats
    payload = {
        "text": done.text,
        "token_ids": list(r.token_ids),
        "key_id": record.key_id,
        "method": r.method,
        "drafter": done.drafter,
        "nonce": nonce,
        "finish_reason": r.finish_reason,
        "watermark_applied": r.watermark_applied,
        "stats": {
            "emitted_tokens": s.emitted_tokens,
            "target_forward_passes": s.target_forward_passes,
            "aatps": s.aatps,
            "drafter_calls": s.drafter_calls,
            "accepted_per_level": list(s.accepted_per_level),
            "prefill_seconds": s.prefill_seconds,
            "seconds": s.seconds,
            "tokens_per_second": s.tokens_per_second,
        },
    }
    if as_json:
        _emit_json(payload)
        return
    out.print(done.text, highlight=False, markup=False)
    out.print(
        f"\n[dim]{s.emitted_tokens} tokens · {s.target_forward_passes} target passes · "
        f"AATPS {s.aatps:.2f} · {s.tokens_per_second:.1f} tok/s · {r.method}"
        f"{' + ' + done.drafter if done.drafter else ''} · watermark "
        f"{'on' if r.watermark_applied else 'off'} · nonce {nonce}[/]"
    )


@app.command()
def detect(
    key: Annotated[str, typer.Option("--key", help="Key id.")],
    text: Annotated[str | None, typer.Option("--text", help="Text to check.")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read the text from a file.")
                    ] = None,
    token_ids: Annotated[str | None, typer.Option(
        "--token-ids", help="JSON list of exact token ids (scored instead of re-tokenizing).")
    ] = None,
    alpha: Annotated[float, typer.Option(help="Level of the verdict.")] = 0.01,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Test a text for the key's watermark (text from --text, --file or stdin)."""
    from detector import detect as run_detect
    from keyed import KeyedSource
    from sampler.models import tokenizer_fingerprint

    settings = Settings()
    with _errors():
        if text is not None and file is not None:
            raise ValueError("give at most one of --text or --file")
        if file is not None:
            text = file.read_text(encoding="utf-8")
        ids = None
        if token_ids is not None:
            try:
                ids = json.loads(token_ids)
            except json.JSONDecodeError:
                raise ValueError("--token-ids: expected a JSON list of integers") from None
            if not isinstance(ids, list):
                raise ValueError("--token-ids: expected a JSON list of integers")
        if text is None and ids is None:
            if sys.stdin.isatty():
                raise ValueError("give --text, --file, --token-ids or pipe the text on stdin")
            text = sys.stdin.read()
        with _store(settings) as store:
            record = store.get(key)
        tokenizer = _tokenizer(settings, model, as_json)
        if tokenizer_fingerprint(tokenizer) != record.tokenizer:
            raise ValueError(f"key {record.key_id} was made for tokenizer {record.tokenizer}; "
                             "this model's tokenizer differs")
        source = KeyedSource(record.secret, record.context_width, record.masking)
        result = run_detect(tokenizer, source, text=text, token_ids=ids, alpha=alpha,
                            key_id=record.key_id)
    if as_json:
        _emit_json(result.to_json())
        return
    _print_detection(result)


def _print_detection(result: Any) -> None:
    a = result.scores["aaronson"]
    colour = {"watermarked": "bold green", "not_detected": "bold",
              "insufficient_evidence": "bold yellow"}[result.verdict.value]
    out.print(f"verdict: [{colour}]{result.verdict.value}[/]")
    out.print(f"p-value: {a.p_value:.3g}   log10 p: {a.log10_p_value:.2f}   "
              f"scored tokens: {result.num_scored} of {result.num_tokens}   "
              f"Aaronson score: {a.score:.1f}", highlight=False)
    skipped = ", ".join(f"{k} {v}" for k, v in result.skipped.items() if v)
    if skipped:
        out.print(f"[dim]skipped: {skipped}[/]")
    shown = Text()
    for t in result.tokens:
        if t.status == "scored":
            # per-token Aaronson term: mean 1 under H0; brighter = more evidence
            strength = min(t.score / 4.0, 1.0)
            shown.append(t.text, style=f"on rgb(0,{int(60 + 140 * strength)},0)")
        else:
            shown.append(t.text, style="dim")
    out.print(shown)
    out.print("[dim](scored tokens on green, brighter = stronger evidence; dim = skipped)[/]")


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own status line shows progress; keep stderr clean
    hf_logging.set_verbosity_error()
    app()


if __name__ == "__main__":
    main()
