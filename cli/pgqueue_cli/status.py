"""``pgqueue status``: one row per queue, once or refreshed in place."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

import pgqueue
from pgqueue.errors import InvalidDuration
from pgqueue.ops.inspect import METRICS_CAP
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption
from pgqueue_cli.queue import must_exist

COLUMNS = (
    "queue",
    "queued",
    "scheduled",
    "running",
    "dead",
    "done/1h",
    "oldest ready",
    "paused",
    "limits",
)


def status(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")
    ] = False,
    interval: Annotated[
        str, typer.Option(metavar="DURATION", help="Time between refreshes with --watch, e.g. 2s.")
    ] = "2s",
    count: Annotated[
        int | None,
        typer.Option(help="With --watch: stop after this many refreshes.", min=1),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show each queue: job counts, oldest ready job, pause state and limits.

    Columns: queued, scheduled, running, dead, succeeded in the last hour
    (done/1h), age of the oldest ready job, paused, limits. Counts are exact
    below 10,000: a queued or running count stops there ("10,000+"), the
    others are estimated past it ("≈52,300"; --json gives the numbers).

    An unknown --queue is an error. With --json: a list of QueueMetrics
    objects, each with a "queue" field.
    With --watch --json: one such list per line, per refresh.

    Examples:

      pgqueue status

      pgqueue status --queue mail --json

      pgqueue status --watch --interval 5s
    """
    pause = parsing.duration("--interval", interval).total_seconds()
    if watch and pause <= 0:
        raise InvalidDuration("--interval must be longer than zero")
    with open_app() as app:
        if queue is not None:
            must_exist(app, queue, None)
        if not watch:
            show(app.metrics(queue), as_json)
            if not as_json:
                task_waits(app)
            return
        try:
            if as_json:
                _watch_json(app, queue, pause, count)
            else:
                _watch_table(app, queue, pause, count)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends: not an error


def rows(metrics: dict[str, pgqueue.QueueMetrics]) -> list[dict[str, Any]]:
    """The --json form: QueueMetrics fields, with the queue's name first."""
    return [{"queue": name, **output.to_jsonable(m)} for name, m in metrics.items()]


def show(metrics: dict[str, pgqueue.QueueMetrics], as_json: bool) -> None:
    if as_json:
        output.print_json(rows(metrics))
        return
    output.stdout().print(render(metrics))
    if not metrics:
        output.hint("no queues yet: a queue appears with its first job or setting")


def render(metrics: dict[str, pgqueue.QueueMetrics], title: str | None = None) -> Table:
    return output.table(
        title,
        COLUMNS,
        [
            (
                name,
                count_text(m.queued),
                count_text(m.scheduled),
                count_text(m.running),
                count_text(m.dead),
                count_text(m.succeeded),
                output.fmt_age(m.oldest_ready_age_seconds),
                "PAUSED" if m.paused else "no",
                limits_text(m),
            )
            for name, m in metrics.items()
        ],
    )


def count_text(value: int) -> str:
    """Counts are exact below METRICS_CAP; a queued or running count stops at
    it ("10,000+"); past it the other statuses are estimates ("≈52,300")."""
    if value < METRICS_CAP:
        return str(value)
    if value == METRICS_CAP:
        return f"{METRICS_CAP:,}+"
    return f"≈{value:,}"


def limits_text(m: pgqueue.QueueMetrics) -> str:
    parts = []
    if m.concurrency_limit is not None:
        parts.append(f"{m.concurrency_limit} at once")
    if m.rate_limit is not None:
        parts.append(m.rate_limit)
    return ", ".join(parts) or "-"


def _title(pause: float) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"pgqueue status at {now}, every {pause:g}s (Ctrl-C to stop)"


def _watch_table(app: pgqueue.App, queue: str | None, pause: float, count: int | None) -> None:
    with Live(render(app.metrics(queue), _title(pause)), console=output.stdout()) as live:
        done = 1
        while count is None or done < count:
            time.sleep(pause)
            live.update(render(app.metrics(queue), _title(pause)))
            done += 1


def _watch_json(app: pgqueue.App, queue: str | None, pause: float, count: int | None) -> None:
    done = 0
    while count is None or done < count:
        if done:
            time.sleep(pause)
        output.print_json(rows(app.metrics(queue)), compact=True)
        done += 1


def task_waits(app: pgqueue.App) -> None:
    """Why jobs wait on their task: at a task limit, or no live worker knows it."""
    for info in app.list_tasks():
        limit = info.settings.concurrency
        if limit is not None and info.running >= limit:
            output.hint(f"task {info.name!r} is at its concurrency limit {info.running}/{limit}")
    for unknown in app.unknown_tasks():
        output.hint(
            f"{unknown.jobs} job{'s' if unknown.jobs != 1 else ''} of task {unknown.task!r} "
            f"wait for a worker that knows it (oldest {output.fmt_age(unknown.oldest_age_seconds)})"
        )
