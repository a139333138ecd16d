"""``poissonmark keys``: create, list, revoke and delete watermark keys (public fields only)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from service.cli.common import (
    Json,
    ModelOpt,
    emit_json,
    errors,
    key_store,
    out,
    read_settings,
    report,
    tokenizer_and_fingerprint,
)
from service.settings import model_name

if TYPE_CHECKING:
    from service.keys.record import KeyRecord
    from service.keys.store import KeyStore

app = typer.Typer(no_args_is_help=True, help="Create, list, revoke and delete watermark keys.")
audit = logging.getLogger("poissonmark.audit")


@app.command("create")
def create(
    context_width: Annotated[
        int,
        typer.Option(
            "--context-width",
            min=1,
            max=64,
            help="Label width m: a smaller m survives edits better, a larger one scores more "
            "tokens and is harder to learn.",
        ),
    ] = 4,
    no_masking: Annotated[
        bool, typer.Option("--no-masking", help="Turn the repeated-context rule off.")
    ] = False,
    tenant: Annotated[str, typer.Option(help="The tenant the key belongs to.")] = "default",
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Create a key bound to the model's tokenizer (the key records the model's name)."""
    settings = read_settings()
    with errors():
        _, fingerprint = tokenizer_and_fingerprint(settings, model, as_json)
        name = model_name(model or settings.model)
        with key_store(settings) as store:
            record = store.create(fingerprint, context_width, not no_masking, tenant, model=name)
    if as_json:
        emit_json(key_json(record))
        return
    out.print(
        f"created key [bold]{record.key_id}[/] for tenant {record.tenant} (model "
        f"{escape(record.model_shown)}, tokenizer {record.tokenizer}, context width "
        f"{record.context_width})",
        highlight=False,
    )


def key_json(record: KeyRecord) -> dict[str, str | int | bool | None]:
    """A key as ``GET /v1/keys`` shows it (``KeyOut``: revoked keys with ``revoked: true``),
    plus its ``tenant`` (the CLI lists across tenants; HTTP shows the caller's own)."""
    from service.schemas.keys import KeyOut

    public = record.public()
    return {name: public[name] for name in KeyOut.model_fields} | {"tenant": record.tenant}


@app.command("list")
def list_keys(
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant's keys (default: every tenant).")
    ] = None,
    active: Annotated[bool, typer.Option("--active", help="Leave revoked keys out.")] = False,
    _all: Annotated[
        bool, typer.Option("--all", hidden=True, help="Include revoked keys (the default).")
    ] = False,
    as_json: Json = False,
) -> None:
    """List keys, revoked ones included with their state, as GET /v1/keys does (public
    fields only), oldest first, with the model each was made for."""
    settings = read_settings()
    with errors(), key_store(settings) as store:
        records = _every_page(store, tenant, not active)
        if as_json:
            emit_json({"keys": [key_json(r) for r in records]})
            return
        row = "{:<20}  {:<16}  {:<24}  {:>2}  {:<7}  {:<7}  {:<32}  {}"
        out.print(
            row.format("KEY", "TENANT", "MODEL", "M", "MASKING", "STATE", "CREATED", "TOKENIZER"),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        for r in records:  # printed page by page, as they come
            state = "revoked" if r.revoked else "active"
            masking = "on" if r.masking else "off"
            out.print(
                row.format(
                    r.key_id,
                    r.tenant,
                    r.model_shown,
                    r.context_width,
                    masking,
                    state,
                    r.created_at,
                    r.tokenizer,
                ),
                highlight=False,
                markup=False,
                soft_wrap=True,
            )


def _every_page(store: KeyStore, tenant: str | None, include_revoked: bool) -> Iterator[KeyRecord]:
    """Every key of ``tenant`` (all tenants when None) in creation order, one ``list_page`` of
    ``PAGE_MAX`` at a time."""
    from service.keys.store import PAGE_MAX

    cursor = None
    while True:
        page = store.list_page(
            tenant, limit=PAGE_MAX, cursor=cursor, include_revoked=include_revoked
        )
        yield from page.records
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@app.command("revoke")
def revoke(key_id: str, as_json: Json = False) -> None:
    """Revoke a key: it can no longer generate (detection with it still works)."""
    settings = read_settings()
    with errors(), key_store(settings) as store:
        record = store.revoke(key_id)
    report(record.public(), as_json, f"revoked {record.key_id}")


@app.command("reseal")
def reseal(as_json: Json = False) -> None:
    """Re-seal every stored secret under the current KEK, bound to its tenant and parameters:
    those of earlier forms and those a previous KEK sealed (POISSONMARK_KEK_PREVIOUS, during a
    rotation); the service also does it when it starts. Idempotent. Reports how many records
    each KEK now seals (a rotation is done when only the current one is left)."""
    settings = read_settings()
    with errors(), key_store(settings) as store:
        count = store.reseal()
        sealed_by = store.sealed_by()
    others = sum(n for kek, n in sealed_by.items() if kek != store.kek_id)
    report(
        {"resealed": count, "kek_id": store.kek_id, "sealed_by": sealed_by},
        as_json,
        f"re-sealed {count} key record(s) under {store.kek_id}; "
        f"{others} sealed otherwise (unreadable under the configured KEKs)",
    )


@app.command("delete")
def delete(
    key_id: str,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    as_json: Json = False,
) -> None:
    """Delete a key for good: its secret is wiped, text it watermarked can no longer be tested
    with it (revoke instead to keep detecting)."""
    settings = read_settings()
    if not yes:
        typer.confirm(f"Delete {key_id}? Text it watermarked can no longer be detected", abort=True)
    with errors(), key_store(settings) as store:
        record = store.delete(key_id)
    audit.info("key deleted: key_id=%s tenant=%s by the CLI", record.key_id, record.tenant)
    report(record.public(), as_json, f"deleted {record.key_id}")
