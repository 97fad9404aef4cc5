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
        str,
        typer.Option(
            "--role",
            help="The database role (it must exist, unless --create).",
            show_default=False,
        ),
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
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Create the role when it does not exist (NOLOGIN: login roles are granted "
            "it, or SET ROLE to it; needs CREATEROLE).",
        ),
    ] = False,
    login: Annotated[
        bool,
        typer.Option(
            "--login", help="With --create: a role that logs in itself (set its password after)."
        ),
    ] = False,
) -> None:
    """Grant a role exactly what a producer, a worker or an admin needs.

    The role must exist, or pass --create: it is created NOLOGIN (a role
    that login roles are granted, or that `pgqueue serve` sets per request),
    or LOGIN with --login. With --sql it only prints the SQL, without
    connecting (the role need not exist yet). Run it as the owner of the
    schema (or a superuser) after
    `pgqueue migrate`; the grant is recorded and `pgqueue migrate` applies it
    again after later revisions. A producer cannot change jobs except by
    enqueuing; a worker only leases, completes, fails, extends and releases
    the jobs it holds (never cancel, requeue, archive or prune); only an
    admin can migrate (as a member of the schema's owner, unless that owner
    is a superuser).

    Examples:

      pgqueue grant --role web --producer

      pgqueue grant --role app_worker --worker --create

      pgqueue grant --role jobs --worker --sql > grant-jobs.sql

      pgqueue grant --role ops --admin --sql --owner app_owner
    """
    chosen = (producer, worker, admin)
    kinds = [kind for kind, on in zip(grants.KINDS, chosen, strict=True) if on]
    if len(kinds) != 1:
        raise InvalidOption("give exactly one of --producer, --worker or --admin")
    if login and not create:
        raise InvalidOption("--login goes with --create (an existing role is left as it is)")
    if sql:
        text = grants.grant_sql(role, kinds[0], state.schema, owner, create=create, login=login)
        typer.echo("\n".join(text))
        return
    if owner is not None:
        raise InvalidOption("--owner goes with --sql (online, the owner is read from the database)")
    done = grants.grant(
        role, kinds[0], dsn=state.dsn, schema=state.schema, create=create, login=login
    )
    if any(line.startswith("CREATE ROLE ") for line in done):
        output.info(f'created role "{role}" ({_created(role, login)})')
    elif create:
        output.info(f'role "{role}" exists: left as it is')
    output.info(f'granted {kinds[0]} rights on schema "{state.schema}" to role "{role}"')


def _created(role: str, login: bool) -> str:
    """What a role made by --create can do, and what is left to do."""
    quoted = '"' + role.replace('"', '""') + '"'
    if login:
        return f"LOGIN, no password yet: ALTER ROLE {quoted} PASSWORD '...'"
    return (
        f"NOLOGIN: grant it to a role that logs in, GRANT {quoted} TO that_role "
        "(pgqueue serve's user, for one); --login makes a role that logs in itself"
    )
