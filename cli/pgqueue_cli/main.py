"""``pgqueue``: the command line of pgqueue.

This module only wires the commands together; each lives in its own module.
Commands get the global options from :data:`pgqueue_cli.context.state` and
report errors through :mod:`pgqueue_cli.errors` (import those, not this
module, to avoid an import cycle).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer

import pgqueue
from pgqueue.errors import PgQueueError
from pgqueue_cli import check, dlq, enqueue, grant, jobs, maintenance, queue, schedule, status
from pgqueue_cli.context import state
from pgqueue_cli.errors import PgQueueGroup, fail, one_line

app = typer.Typer(
    name="pgqueue",
    cls=PgQueueGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"pgqueue {pgqueue.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    dsn: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL DSN (else PGQUEUE_DSN, DATABASE_URL, libpq defaults).",
            envvar="PGQUEUE_DSN",
            show_envvar=False,
        ),
    ] = None,
    schema: Annotated[
        str, typer.Option(help="Schema holding pgqueue's tables.", envvar="PGQUEUE_SCHEMA")
    ] = "pgqueue",
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """A task queue whose whole state lives in PostgreSQL.

    Global options go before the command. Durations read 30s, 15m, 2h, 7d or
    ISO-8601 (PT15M); times ISO-8601. Every command that prints data takes
    --json. Exit code 0 on success, 1 with a one-line reason on error.

    Examples:

      pgqueue --dsn postgresql://localhost/app migrate

      PGQUEUE_DSN=postgresql://localhost/app pgqueue status --watch
    """
    state.dsn = dsn
    state.schema = schema


@app.command()
def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL for a DBA instead of running it.")
    ] = False,
) -> None:
    """Create or upgrade the pgqueue schema (idempotent).

    Examples:

      pgqueue --dsn postgresql://localhost/app migrate

      pgqueue --schema jobs migrate --sql > pgqueue.sql
    """
    from pgqueue.migrate import upgrade

    upgrade(state.dsn, state.schema, sql=sql)
    if not sql:
        typer.echo(f'schema "{state.schema}" is up to date')


def load_app(path: str) -> pgqueue.App:
    """Import ``pkg.module:attribute`` and return the App it names."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        fail(f"--app must look like pkg.module:app, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import {module_name!r}: {exc}")
    obj: Any = getattr(module, attribute, None)
    if not isinstance(obj, pgqueue.App):
        fail(f"{path!r} is not a pgqueue.App (got {type(obj).__name__})")
    return obj


@app.command()
def worker(
    app_path: Annotated[
        str,
        typer.Option("--app", envvar="PGQUEUE_APP", help="The App to serve, as pkg.module:app."),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Queue to serve (repeatable); default: all."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Jobs running at once in this process.")] = 10,
    batch_size: Annotated[
        int | None,
        typer.Option(help="Most jobs leased per statement (default: concurrency, at most 500)."),
    ] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between polls when no notification comes.")
    ] = 2.0,
    shutdown_timeout: Annotated[
        float, typer.Option(help="Seconds running jobs get to finish on SIGTERM.")
    ] = 30.0,
    scheduler: Annotated[
        bool, typer.Option("--scheduler/--no-scheduler", help="Run the cron scheduler.")
    ] = True,
    listen: Annotated[
        bool,
        typer.Option(
            "--listen/--no-listen",
            help="Wake on LISTEN/NOTIFY (off behind a transaction-mode PgBouncer).",
        ),
    ] = True,
    reap_interval: Annotated[float, typer.Option(help="Seconds between reaper runs.")] = 5.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[
        str, typer.Option(help="auto (console on a TTY, else JSON), console or json.")
    ] = "auto",
) -> None:
    """Run a worker: lease jobs in batches, run them, record every attempt.

    Examples:

      pgqueue worker --app myproject.tasks:app --queue mail --concurrency 20
    """
    application = load_app(app_path)
    if state.dsn and application.dsn != state.dsn:
        fail("--dsn differs from the App's dsn; configure the App instead")
    application.run_worker(
        queues=queue or None,
        concurrency=concurrency,
        batch_size=batch_size,
        poll_interval=poll_interval,
        shutdown_timeout=shutdown_timeout,
        scheduler=scheduler,
        listen=listen,
        reap_interval=reap_interval,
        log_level=log_level,
        log_format=log_format,
    )


# Operator commands, in the order `pgqueue --help` lists them.
app.command()(enqueue.enqueue)
app.command()(status.status)
app.add_typer(jobs.app)
app.add_typer(dlq.app)
app.add_typer(queue.app)
app.command()(maintenance.reap)
app.command()(maintenance.archive)
app.command()(maintenance.prune)
app.command()(maintenance.maintenance)
app.command()(check.check)
app.add_typer(schedule.app)
app.command()(grant.grant)
app.command()(importlib.import_module("pgqueue_cli.dashboard").dashboard)


def run() -> None:
    """Console-script entry point: expected errors print one line, no traceback."""
    try:
        app()
    except PgQueueError as exc:  # raised outside a command, e.g. while parsing options
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(1)
