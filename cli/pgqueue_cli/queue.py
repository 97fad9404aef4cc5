"""``pgqueue queue``: pause, resume, limit, purge and delete queues across every worker."""

from __future__ import annotations

from typing import Annotated, Any

import typer

import pgqueue
from pgqueue import validation
from pgqueue.errors import InvalidName
from pgqueue.ops import admin
from pgqueue_cli import output
from pgqueue_cli.bulk import bulk_cancel
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption, YesOption

app = typer.Typer(
    name="queue",
    help="Control queues on every worker at once: pause, resume, limit, purge, delete.",
    no_args_is_help=True,
)

QueueArgument = Annotated[str, typer.Argument(metavar="QUEUE", help="The queue's name.")]
CreateOption = Annotated[
    bool,
    typer.Option("--create", help="Create the queue when it does not exist yet (else: an error)."),
]


@app.command()
def pause(queue: QueueArgument, create: CreateOption = False, as_json: JsonOption = False) -> None:
    """Stop every worker from leasing jobs of a queue (enqueueing still works; running jobs finish).

    With --json: {"queue", "paused", "concurrency_limit", "rate_limit"}.

    Examples:

      pgqueue queue pause mail

      pgqueue queue pause reports --create
    """
    with open_app() as queue_app:
        must_exist(queue_app, queue, create)
        queue_app.pause_queue(queue)
        settings = current(queue_app, queue)
    report(settings, as_json, f"queue {queue!r} paused")


@app.command()
def resume(queue: QueueArgument, create: CreateOption = False, as_json: JsonOption = False) -> None:
    """Let workers lease jobs of a paused queue again.

    With --json: {"queue", "paused", "concurrency_limit", "rate_limit"}.

    Examples:

      pgqueue queue resume mail
    """
    with open_app() as queue_app:
        must_exist(queue_app, queue, create)
        queue_app.resume_queue(queue)
        settings = current(queue_app, queue)
    report(settings, as_json, f"queue {queue!r} resumed")


@app.command()
def limit(
    queue: QueueArgument,
    concurrency: Annotated[
        int | None,
        typer.Option(help="At most this many jobs of the queue running at once, over all workers."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            help="At most COUNT/PERIOD lease starts per sliding window, e.g. 100/1m or 5/s."
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Lift the limits not given in this command.")
    ] = False,
    create: CreateOption = False,
    as_json: JsonOption = False,
) -> None:
    """Set a queue's concurrency and rate limits, over all workers.

    A limit not given is kept; --clear lifts the limits not given.

    Without options, shows the current limits. With --json: {"queue",
    "paused", "concurrency_limit", "rate_limit"}.

    Examples:

      pgqueue queue limit mail --concurrency 5

      pgqueue queue limit mail --rate 100/1m

      pgqueue queue limit mail --clear
    """
    # Bad values first: they are wrong whether or not the queue exists.
    if rate is not None:
        admin.parse_rate(rate)
    if concurrency is not None:
        validation.positive_int("--concurrency", concurrency)
    with open_app() as queue_app:
        must_exist(queue_app, queue, create)
        before = current(queue_app, queue)
        changing = clear or concurrency is not None or rate is not None
        if changing:
            queue_app.set_queue_limit(
                queue,
                concurrency=concurrency
                if concurrency is not None or clear
                else before["concurrency_limit"],
                rate=rate if rate is not None or clear else before["rate_limit"],
            )
        settings = current(queue_app, queue) if changing else before
    report(settings, as_json, f"queue {queue!r} limits set" if changing else None)


@app.command()
def purge(
    queue: QueueArgument,
    running: Annotated[
        bool, typer.Option("--running", help="Also ask the queue's running jobs to stop.")
    ] = False,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Cancel every queued and scheduled job of a queue (asks first; --yes to skip).

    Running jobs finish unless --running (they are asked to stop and end
    cancelled). Cancelled jobs stay visible and can be replayed. With --json:
    {"queue", "cancelled"}.

    Examples:

      pgqueue queue purge mail

      pgqueue queue purge mail --running --yes
    """
    statuses = ["queued", "scheduled", *(["running"] if running else [])]
    with open_app() as queue_app:
        must_exist(queue_app, queue, create=None)
        done = bulk_cancel(queue_app, f"of queue {queue!r}", yes, queue=queue, statuses=statuses)
    if as_json:
        output.print_json({"queue": queue, "cancelled": done})
    else:
        output.info(f"cancelled {done} job{'s' if done != 1 else ''} of queue {queue!r}")


@app.command()
def delete(queue: QueueArgument, as_json: JsonOption = False) -> None:
    """Delete a queue and its settings (pause, limits).

    Refused while the queue holds queued, scheduled, running or dead jobs:
    purge it first. Succeeded and cancelled jobs stay. A later job in the
    queue creates it again. With --json: {"queue", "deleted": true}.

    Examples:

      pgqueue queue delete old-mail
    """
    with open_app() as queue_app:
        queue_app.delete_queue(queue)
    if as_json:
        output.print_json({"queue": queue, "deleted": True})
    else:
        output.info(f"queue {queue!r} deleted")


def must_exist(app: pgqueue.App, queue: str, create: bool | None) -> None:
    """Refuse a queue that does not exist (a typo would otherwise create it or
    show nothing); ``create`` True allows it, None: the command has no --create."""
    validation.queue_name(queue)
    if create:
        return
    names = app.list_queues()
    if queue not in names:
        known = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
        hint = "; pass --create to create it" if create is False else ""
        raise InvalidName(f"unknown queue {queue!r} (queues: {known or 'none yet'}){hint}")


def current(app: pgqueue.App, queue: str) -> dict[str, Any]:
    """The queue's settings as stored (defaults for a queue never seen)."""
    metrics = app.metrics(queue).get(queue)
    return {
        "queue": queue,
        "paused": metrics.paused if metrics else False,
        "concurrency_limit": metrics.concurrency_limit if metrics else None,
        "rate_limit": metrics.rate_limit if metrics else None,
    }


def report(settings: dict[str, Any], as_json: bool, done: str | None) -> None:
    if as_json:
        output.print_json(settings)
        return
    limits = []
    if settings["concurrency_limit"] is not None:
        limits.append(f"at most {settings['concurrency_limit']} running")
    if settings["rate_limit"] is not None:
        limits.append(f"at most {settings['rate_limit']} lease starts")
    state = "paused" if settings["paused"] else "active"
    summary = f"{state}, {', '.join(limits) or 'no limits'}"
    output.info(f"{done}: {summary}" if done else f"queue {settings['queue']!r}: {summary}")
