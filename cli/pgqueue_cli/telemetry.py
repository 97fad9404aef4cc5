"""``pgqueue metrics`` (the database view as Prometheus text or JSON) and
``pgqueue doctor`` (what is wrong with the database, with exit code 0/1/2)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pgqueue.telemetry.doctor import exit_code
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption


def metrics(
    cap: Annotated[
        int,
        typer.Option(
            help="Count jobs exactly up to this many per queue and status; estimate beyond.", min=1
        ),
    ] = 10_000,
    as_json: JsonOption = False,
) -> None:
    """Print queue depth by status, oldest ready age, paused and live workers.

    Prometheus text by default (for a node-exporter textfile collector or a
    scrape job); --json prints {"queues": [{"queue", "jobs", "oldest_ready_age_seconds",
    "paused", "estimated"}], "workers_alive"}. Cheap on big tables: counts stop at --cap.

    Examples:

      pgqueue metrics > /var/lib/node_exporter/textfile/pgqueue.prom

      pgqueue metrics --json
    """
    with open_app() as app:
        view = app.queue_view(cap)
    if as_json:
        output.print_json(view.as_dict())
    else:
        sys.stdout.write(view.prometheus_text())


def doctor(
    max_transaction_age: Annotated[
        str, typer.Option(help="Warn about transactions (and prepared ones) open longer.")
    ] = "5m",
    worker_timeout: Annotated[
        str, typer.Option(help="A registered worker silent for longer is stale.")
    ] = "60s",
    max_ready_age: Annotated[
        str, typer.Option(help="Warn when a queue's oldest ready job waited longer.")
    ] = "5m",
    archive_after: Annotated[
        str, typer.Option(help="Finished jobs older than this belong in the archive.")
    ] = "7d",
    as_json: JsonOption = False,
) -> None:
    """Diagnose the database: every finding with severity, evidence and fix.

    Checks: connection, clock skew, a transaction pooler in the path,
    migrations at head, what holds the xmin horizon back (long and idle-in-
    transaction sessions, prepared transactions, replication slots), NOTIFY
    queue usage, connections vs max_connections, dead tuples and last vacuum
    of the queue tables, stale workers, jobs past their lease, backlog age,
    finished jobs waiting for archive. Exit code 0 all ok, 1 a warning, 2 an
    error. --json prints a list of {"check", "severity", "summary", "detail",
    "fix", "evidence"}.

    Examples:

      pgqueue doctor

      pgqueue doctor --max-transaction-age 1m --json
    """
    thresholds = {
        "max_transaction_age": parsing.duration("--max-transaction-age", max_transaction_age),
        "worker_timeout": parsing.duration("--worker-timeout", worker_timeout),
        "max_ready_age": parsing.duration("--max-ready-age", max_ready_age),
        "archive_after": parsing.duration("--archive-after", archive_after),
    }
    with open_app() as app:
        findings = app.doctor(**thresholds)
    if as_json:
        output.print_json([f.as_dict() for f in findings])
    else:
        # Plain lines (no wrapping): evidence and fixes are copied into terminals.
        marks = {"ok": "ok   ", "warn": "WARN ", "error": "ERROR"}
        for f in findings:
            typer.echo(f"{marks[f.severity]} {f.check}: {f.summary}")
            if f.severity != "ok":
                if f.detail:
                    typer.echo(f"      {f.detail}")
                if f.fix:
                    typer.echo(f"      fix: {f.fix}")
    raise typer.Exit(exit_code(findings))
