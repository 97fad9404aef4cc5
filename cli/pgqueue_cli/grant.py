"""``pgqueue grant``: give a database role least-privilege rights on the schema."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue import grants
from pgqueue.errors import InvalidOption
from pgqueue_cli import output
from pgqueue_cli.context import state


def grant(
    role: Annotated[
        str, typer.Option("--role", help="The database role (it must exist).", show_default=False)
    ],
    producer: Annotated[
        bool, typer.Option("--producer", help="Enqueue, and read jobs and results.")
    ] = False,
    worker: Annotated[
        bool,
        typer.Option(
            "--worker",
            help="A producer that also runs workers: lease, complete, heartbeat, reap, schedule.",
        ),
    ] = False,
    admin: Annotated[
        bool,
        typer.Option("--admin", help="Everything: cancel, requeue, archive, prune, migrate..."),
    ] = False,
    sql: Annotated[
        bool,
        typer.Option(
            "--sql",
            help="Print the statements instead of running them (offline: no database needed).",
        ),
    ] = False,
    owner: Annotated[
        str | None,
        typer.Option(
            "--owner",
            help="With --sql --admin: the schema's owner, whom the admin becomes a member of.",
        ),
    ] = None,
) -> None:
    """Grant a role exactly what a producer, a worker or an admin needs.

    With --sql it only prints the SQL, without connecting (the role need not
    exist yet). Run it as the owner of the schema (or a superuser) after
    `pgqueue migrate`; the grant is recorded and `pgqueue migrate` applies it
    again after later revisions. A producer cannot change jobs except by
    enqueuing; a worker only leases, completes, fails, extends and releases
    the jobs it holds (never cancel, requeue, archive or prune); only an
    admin can migrate (as a member of the schema's owner, unless that owner
    is a superuser).

    Examples:

      pgqueue grant --role web --producer

      pgqueue grant --role jobs --worker --sql > grant-jobs.sql

      pgqueue grant --role ops --admin --sql --owner app_owner
    """
    chosen = (producer, worker, admin)
    kinds = [kind for kind, on in zip(grants.KINDS, chosen, strict=True) if on]
    if len(kinds) != 1:
        raise InvalidOption("give exactly one of --producer, --worker or --admin")
    if sql:
        typer.echo("\n".join(grants.grant_sql(role, kinds[0], state.schema, owner)))
        return
    if owner is not None:
        raise InvalidOption("--owner goes with --sql (online, the owner is read from the database)")
    grants.grant(role, kinds[0], dsn=state.dsn, schema=state.schema)
    output.info(f'granted {kinds[0]} rights on schema "{state.schema}" to role "{role}"')
