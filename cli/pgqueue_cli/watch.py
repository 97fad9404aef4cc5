"""``pgqueue watch``: the event stream of ``app.subscribe()``, one line per event."""

from __future__ import annotations

import signal
import sys
from datetime import datetime
from types import FrameType
from typing import Annotated

import typer

from pgqueue.events import JobEvent
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption


def _line(event: JobEvent) -> str:
    return f"{datetime.now().astimezone().isoformat(timespec='milliseconds')} {event}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def watch(
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Only events of this queue (repeatable); default: all."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print one line per event until Ctrl-C: enqueued, finished, paused, resumed, resync.

    Events are hints from LISTEN/NOTIFY: "enqueued" may stand for many jobs of
    one transaction (job= is set when it was one); "finished" is sent for jobs
    someone waits on (result()); "resync" means events may have been missed
    (after a reconnect): re-read what you care about. With --json: one object
    per line {"kind", "queue", "job_id", "status"}. Behind a transaction-mode
    pooler set PGQUEUE_LISTEN_DSN to a direct connection.

    Examples:

      pgqueue watch --queue mail --queue reports

      pgqueue watch --json | jq -c 'select(.kind == "enqueued")'
    """
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: close the connection
    try:
        with open_app() as app, app.subscribe(queue or None) as events:
            if not as_json:
                typer.echo("watching for events; Ctrl-C to stop", err=True)
            for event in events:
                sys.stdout.write((event.to_json() if as_json else _line(event)) + "\n")
                sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except BrokenPipeError:  # e.g. piped into `head`
        raise typer.Exit(0) from None
