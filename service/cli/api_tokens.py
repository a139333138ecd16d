"""``poissonmark tokens``: create, list and revoke the HTTP service's API bearer tokens."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.common import Json, emit_json, err, errors, out, read_settings, report, token_store

app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API bearer tokens.")


@app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the token acts for.")] = "default",
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="generate, detect, keys or evidence (raw per-token evidence: pivots and "
            "terms); repeat for several (default: generate, detect and keys).",
        ),
    ] = None,
    name: Annotated[str, typer.Option(help="A label shown in lists.")] = "",
    as_json: Json = False,
) -> None:
    """Create an API token. It is shown once, here; the service stores only its hash."""
    from service.keys.api_tokens import DEFAULT_SCOPES

    settings = read_settings()
    with errors(), token_store(settings) as store:
        token, record = store.create(tenant, scope or DEFAULT_SCOPES, name)
    if as_json:
        emit_json(record.public() | {"token": token})
        return
    err.print(
        f"created token [bold]{record.token_id}[/] for tenant {record.tenant} "
        f"(scopes {', '.join(record.scopes)}); store it now, it is not shown again:"
    )
    out.print(token, highlight=False, markup=False)


@app.command("list")
def list_tokens(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    as_json: Json = False,
) -> None:
    """List API tokens (ids, tenants, scopes; never the tokens)."""
    settings = read_settings()
    with errors(), token_store(settings) as store:
        records = store.list_tokens(tenant)
    if as_json:
        emit_json({"tokens": [r.public() for r in records]})
        return
    row = "{:<16}  {:<16}  {:<20}  {:<7}  {:<32}  {}"
    out.print(
        row.format("TOKEN ID", "TENANT", "SCOPES", "STATE", "CREATED", "NAME"),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    for r in records:
        state = "revoked" if r.revoked else "active"
        out.print(
            row.format(r.token_id, r.tenant, ",".join(r.scopes), state, r.created_at, r.name),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


@app.command("revoke")
def revoke(token_id: str, as_json: Json = False) -> None:
    """Revoke an API token by its id; it stops working at once."""
    settings = read_settings()
    with errors(), token_store(settings) as store:
        record = store.revoke(token_id)
    report(record.public(), as_json, f"revoked token {record.token_id}")
