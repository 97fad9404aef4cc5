"""``pgqueue check``: a health probe with an exit code (0 healthy, 1 not)."""

from __future__ import annotations

from typing import Annotated

import typer

import pgqueue
from pgqueue.health_report import unreachable
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.errors import FAILURE, one_line
from pgqueue_cli.options import JsonOption, QuietOption


def check(
    max_ready_age: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="Fail when a queue's oldest ready job waited longer than this."
        ),
    ] = "5m",
    worker_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="A registered worker silent for longer than this is dead."
        ),
    ] = "60s",
    max_clock_skew: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="Fail when the server's clock differs from this machine's by more.",
        ),
    ] = "5s",
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Check connection, schema version, clock skew, stuck jobs, dead workers, backlog.

    Stuck jobs are running jobs whose lease expired (no reaper ran); dead
    workers are registered workers without a heartbeat; paused queues never
    count as backlogged. Exit code 0 when every check passes, 1 otherwise,
    for health probes and monitoring; with --quiet only the failed checks
    are printed, one `error:` line each on stderr. With --json: a HealthReport object
    {"ok", "checks": [{"name", "ok", "message"}], ...}.

    Examples:

      pgqueue check

      pgqueue check --max-ready-age 15m --json
    """
    ready_age = parsing.duration("--max-ready-age", max_ready_age)
    timeout = parsing.duration("--worker-timeout", worker_timeout)
    skew = parsing.duration("--max-clock-skew", max_clock_skew)
    try:
        with open_app() as app:
            report = app.check(ready_age, timeout, skew)
    except pgqueue.ConnectionFailed as exc:  # e.g. a DSN libpq cannot parse
        report = unreachable(exc)
    if as_json:
        output.print_json(report)
    elif not quiet:
        for item in report.checks:
            mark = "ok  " if item.ok else "FAIL"
            output.info(f"{mark} {item.name}: {one_line(item.message)}")
        output.info("healthy" if report.ok else "unhealthy")
    if not report.ok:
        if quiet:  # quiet hides the OK lines, never the reason for a failure
            for item in report.checks:
                if not item.ok:
                    typer.echo(f"error: {item.name}: {one_line(item.message)}", err=True)
        raise typer.Exit(FAILURE)
