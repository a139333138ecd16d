"""``poissonmark keys``: create, list and revoke watermark keys (public fields only)."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.common import Json, ModelOpt, emit_json, errors, key_store, out, report, tokenizer
from service.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Create, list and revoke watermark keys.")


@app.command("create")
def create(
    context_width: Annotated[
        int, typer.Option("--context-width", min=1, max=64, help="Label width m.")
    ] = 4,
    no_masking: Annotated[
        bool, typer.Option("--no-masking", help="Turn the repeated-context rule off.")
    ] = False,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Create a key bound to the model's tokenizer."""
    from sampler.models import tokenizer_fingerprint

    settings = Settings()
    with errors():
        fingerprint = tokenizer_fingerprint(tokenizer(settings, model, as_json))
        with key_store(settings) as store:
            record = store.create(fingerprint, context_width, not no_masking)
    if as_json:
        public = record.public()
        shown = ("key_id", "context_width", "masking", "prf_version", "tokenizer", "created_at")
        emit_json({name: public[name] for name in shown})
        return
    out.print(
        f"created key [bold]{record.key_id}[/] (context width {record.context_width}, "
        f"tokenizer {record.tokenizer})"
    )


@app.command("list")
def list_keys(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    as_json: Json = False,
) -> None:
    """List keys (public fields only)."""
    settings = Settings()
    with errors(), key_store(settings) as store:
        records = store.list_keys(include_revoked=include_revoked)
    if as_json:
        emit_json({"keys": [r.public() for r in records]})
        return
    for r in records:
        state = "revoked" if r.revoked else "active"
        out.print(f"{r.key_id}  m={r.context_width}  {state}  {r.created_at}  {r.tokenizer}")


@app.command("revoke")
def revoke(key_id: str, as_json: Json = False) -> None:
    """Revoke a key: it can no longer generate (detection with it still works)."""
    settings = Settings()
    with errors(), key_store(settings) as store:
        record = store.revoke(key_id)
    report(record.public(), as_json, f"revoked {record.key_id}")
