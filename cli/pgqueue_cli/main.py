"""``pgqueue``: the command line of pgqueue.

This module only wires the commands together; each lives in its own module.
Commands get the global options from :data:`pgqueue_cli.context.state` and
report errors through :mod:`pgqueue_cli.errors` (import those, not this
module, to avoid an import cycle).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

import pgqueue
from pgqueue.errors import InvalidOption, PgQueueError
from pgqueue.logs import LEVELS
from pgqueue_cli import (
    apps,
    check,
    dashboard,
    dev,
    dlq,
    enqueue,
    event,
    grant,
    helptext,
    jobs,
    maintenance,
    parsing,
    queue,
    schedule,
    serve,
    status,
    task,  # task registry (0006)
    uninstall,
    workers,  # workers list|forget (0006)
    workflow,
)
from pgqueue_cli import telemetry as telemetry_commands
from pgqueue_cli import watch as watch_command
from pgqueue_cli.context import open_app, state
from pgqueue_cli.errors import PgQueueGroup, fail, one_line

helptext.install()

app = typer.Typer(
    name="pgqueue",
    cls=PgQueueGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


LOG_FORMATS = ("auto", "console", "json")


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"pgqueue {pgqueue.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    dsn: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL DSN (else PGQUEUE_DSN, DATABASE_URL, libpq's PG* variables, "
            "else postgresql://postgres@127.0.0.1:5432/postgres).",
            envvar="PGQUEUE_DSN",
            show_envvar=False,
        ),
    ] = None,
    schema: Annotated[
        str, typer.Option(help="Schema holding pgqueue's tables.", envvar="PGQUEUE_SCHEMA")
    ] = "pgqueue",
    pooler: Annotated[
        str | None,
        typer.Option(
            help="session or transaction: the PgBouncer pool mode in front of PostgreSQL.",
            envvar="PGQUEUE_POOLER",
        ),
    ] = None,
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
    state.pooler = pooler


@app.command()
def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL for a DBA instead of running it.")
    ] = False,
    partitioned_archive: Annotated[
        bool,
        typer.Option(
            "--partitioned-archive",
            help="Also range-partition the archive by finish time, online (prune then drops "
            "whole partitions). Idempotent.",
        ),
    ] = False,
    partition_period: Annotated[
        str,
        typer.Option("--partition-period", help="With --partitioned-archive: day, week or month."),
    ] = "day",
) -> None:
    """Create or upgrade the pgqueue schema (idempotent); says what it applied.

    Examples:

      pgqueue --dsn postgresql://localhost/app migrate

      pgqueue --schema jobs migrate --sql > pgqueue.sql

      pgqueue migrate --partitioned-archive --partition-period week
    """
    from pgqueue.migrate import current, upgrade
    from pgqueue.ops.partitions import period_name

    if partitioned_archive and sql:
        fail("--partitioned-archive converts a live table in steps and has no --sql form")
    period = period_name(partition_period)
    if sql:
        upgrade(state.dsn, state.schema, sql=True)
        return
    before = current(state.dsn, state.schema)
    upgrade(state.dsn, state.schema)
    after = current(state.dsn, state.schema)
    typer.echo(migrated_message(state.schema, before, after))
    if partitioned_archive:
        with open_app() as queue_app:
            layout_before = queue_app.archive_layout()
            layout = queue_app.partition_archive(period)
        done = "is" if layout_before.partitioned else "is now"
        typer.echo(
            f"the archive {done} partitioned by {layout.period} "
            f"({layout.partitions} partition{'s' if layout.partitions != 1 else ''})"
        )


def migrated_message(schema: str, before: str | None, after: str | None) -> str:
    """What ``migrate`` did: created, upgraded (from → to), or nothing to do."""
    if before == after:
        return f'schema "{schema}" is up to date (revision {after}): nothing applied'
    if before is None:
        return f'created schema "{schema}": 0001 → {after}'
    return f'upgraded schema "{schema}": {before} → {after}'


@app.command()
def worker(
    ctx: typer.Context,
    app_path: Annotated[
        str,
        typer.Option("--app", envvar="PGQUEUE_APP", help="The App to serve, as pkg.module:app."),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Queue to serve (repeatable); default: all."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Jobs running at once in this process.", min=1, max=100_000)
    ] = 10,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Most jobs leased per statement (default: concurrency, at most 500).",
            min=1,
            max=100_000,
        ),
    ] = None,
    poll_interval: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="Time between polls when no notification comes, e.g. 2s."
        ),
    ] = "2s",
    shutdown_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="Time running jobs get to finish on SIGTERM, e.g. 30s or 2m."
        ),
    ] = "30s",
    scheduler: Annotated[
        bool, typer.Option("--scheduler/--no-scheduler", help="Run the cron scheduler.")
    ] = True,
    maintenance: Annotated[
        bool,
        typer.Option(
            "--maintenance/--no-maintenance",
            help="Take part in the fleet's maintenance (one worker at a time applies "
            "`pgqueue retention`: finished jobs leave by themselves).",
        ),
    ] = True,
    listen: Annotated[
        bool,
        typer.Option(
            "--listen/--no-listen",
            help="Wake on LISTEN/NOTIFY (off behind a transaction-mode PgBouncer).",
        ),
    ] = True,
    reap_interval: Annotated[
        str, typer.Option(metavar="DURATION", help="Time between reaper runs, e.g. 5s.")
    ] = "5s",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[
        str, typer.Option(help="auto (console on a TTY, else JSON), console or json.")
    ] = "auto",
    unknown_task_grace: Annotated[
        str,
        typer.Option(
            help="How long jobs of a task this worker does not know are handed back "
            "(for a worker that knows it) before they are dead-lettered, e.g. 10m."
        ),
    ] = "1h",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs pgqueue[metrics]).",
            min=0,
            max=65535,
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="Address the metrics server binds to.")
    ] = "0.0.0.0",
    event_loop: Annotated[
        str,
        typer.Option(
            help="auto (uvloop when installed, e.g. by pgqueue[speed]), asyncio or uvloop.",
        ),
    ] = "auto",
    pool: Annotated[
        str,
        typer.Option(
            help="Where sync tasks run: thread (threads of this process) or process "
            "(--concurrency child processes with hard time limits; async tasks stay on "
            "the event loop).",
        ),
    ] = "thread",
    kill_grace: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="--pool process: time between SIGTERM and SIGKILL of a child past its "
            "task's timeout, and between a cancel and stopping the child, e.g. 5s.",
        ),
    ] = "5s",
    max_tasks_per_child: Annotated[
        int | None,
        typer.Option(help="--pool process: replace a child after this many tasks.", min=1),
    ] = None,
    max_memory_per_child: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="--pool process: replace a child after the task that leaves it at or "
            "above this resident memory, e.g. 512MB or 1GiB.",
        ),
    ] = None,
) -> None:
    """Run a worker: lease jobs in batches, run them, record every attempt.

    The worker serves the App's database and schema: a global --dsn is what
    an App created without dsn= connects to; a --dsn or --schema that differs
    from the App's own is refused.

    Examples:

      pgqueue worker --app myproject.tasks:app --queue mail --concurrency 20

      pgqueue worker --app ./tasks.py:app --shutdown-timeout 2m
    """
    if log_format not in LOG_FORMATS:
        raise InvalidOption(f"--log-format must be auto, console or json, got {log_format!r}")
    if log_level.lower() not in LEVELS:
        raise InvalidOption(f"--log-level must be one of {', '.join(LEVELS)}, got {log_level!r}")
    poll = parsing.duration("--poll-interval", poll_interval)
    shutdown = parsing.duration("--shutdown-timeout", shutdown_timeout)
    reap = parsing.duration("--reap-interval", reap_interval)
    if state.dsn and apps.given_on_command_line(ctx, "dsn"):
        # An App() that names no DSN reads PGQUEUE_DSN when the module is imported.
        os.environ["PGQUEUE_DSN"] = state.dsn
    grace = parsing.duration("--unknown-task-grace", unknown_task_grace)
    if pool not in ("thread", "process"):
        raise InvalidOption(f"--pool must be thread or process, got {pool!r}")
    kill = parsing.duration("--kill-grace", kill_grace)
    if pool != "process" and (max_tasks_per_child is not None or max_memory_per_child):
        raise InvalidOption("--max-tasks-per-child and --max-memory-per-child need --pool process")
    application = apps.load_app(app_path)
    if isinstance(application, pgqueue.Router):  # serves every App of the router
        for routed in application.apps.values():
            apps.check_target(routed, ctx, state.dsn, state.schema)
    else:
        apps.check_target(application, ctx, state.dsn, state.schema)
    application.run_worker(
        queues=queue or None,
        concurrency=concurrency,
        batch_size=batch_size,
        poll_interval=poll.total_seconds(),
        shutdown_timeout=shutdown.total_seconds(),
        scheduler=scheduler,
        maintenance=maintenance,
        listen=listen,
        reap_interval=reap.total_seconds(),
        log_level=log_level,
        log_format=log_format,
        unknown_task_grace=grace.total_seconds(),
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        event_loop=event_loop,
        pool=pool,
        app_path=app_path if pool == "process" else None,
        kill_grace=kill.total_seconds(),
        max_tasks_per_child=max_tasks_per_child,
        max_memory_per_child=max_memory_per_child,
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
app.command()(maintenance.retention)
app.command()(maintenance.maintenance)
app.command()(check.check)
app.add_typer(schedule.app)
app.command()(grant.grant)
app.command()(uninstall.uninstall)
app.command()(dev.dev)
app.command()(telemetry_commands.metrics)
app.command()(telemetry_commands.doctor)
app.command()(dashboard.dashboard)
app.command()(serve.serve)
app.command()(watch_command.watch)
# Task registry, settings, limits and stats; workers (0006).
app.add_typer(task.app)
app.command()(task.tasks)
app.add_typer(workers.app)
app.add_typer(workflow.app)
# Durable tasks: events.
app.add_typer(event.app)


def run() -> None:
    """Console-script entry point: expected errors print one line, no traceback."""
    try:
        app()
    except PgQueueError as exc:  # raised outside a command, e.g. while parsing options
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(1)
