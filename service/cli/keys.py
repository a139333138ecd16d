"""``poissonmark keys``: create, list, revoke and delete watermark keys (public fields only)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from service.cli.common import Json, ModelOpt, emit_json, errors, key_store, out, report, tokenizer
from service.settings import Settings

if TYPE_CHECKING:
    from service.key_record import KeyRecord
    from service.keystore import KeyStore

app = typer.Typer(no_args_is_help=True, help="Create, list, revoke and delete watermark keys.")
audit = logging.getLogger("poissonmark.audit")


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
        records = _every_page(store, include_revoked)
        if as_json:
            emit_json({"keys": [r.public() for r in records]})
            return
        for r in records:  # printed page by page, as they come
            state = "revoked" if r.revoked else "active"
            out.print(f"{r.key_id}  m={r.context_width}  {state}  {r.created_at}  {r.tokenizer}")


def _every_page(store: KeyStore, include_revoked: bool) -> Iterator[KeyRecord]:
    """Every key (all tenants) in creation order, one ``list_page`` of ``PAGE_MAX`` at a time."""
    from service.keystore import PAGE_MAX

    cursor = None
    while True:
        page = store.list_page(limit=PAGE_MAX, cursor=cursor, include_revoked=include_revoked)
        yield from page.records
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@app.command("revoke")
def revoke(key_id: str, as_json: Json = False) -> None:
    """Revoke a key: it can no longer generate (detection with it still works)."""
    settings = Settings()
    with errors(), key_store(settings) as store:
        record = store.revoke(key_id)
    report(record.public(), as_json, f"revoked {record.key_id}")


@app.command("delete")
def delete(
    key_id: str,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    as_json: Json = False,
) -> None:
    """Delete a key for good: its secret is wiped, text it watermarked can no longer be tested
    with it (revoke instead to keep detecting)."""
    settings = Settings()
    if not yes:
        typer.confirm(f"Delete {key_id}? Text it watermarked can no longer be detected", abort=True)
    with errors(), key_store(settings) as store:
        record = store.delete(key_id)
    audit.info("key deleted: key_id=%s tenant=%s by the CLI", record.key_id, record.tenant)
    report(record.public(), as_json, f"deleted {record.key_id}")
