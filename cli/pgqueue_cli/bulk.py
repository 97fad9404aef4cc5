"""Confirmation and batching shared by the commands that change many jobs or
drop data: ``jobs cancel`` by filter, ``queue purge``, ``uninstall``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

import pgqueue
from pgqueue_cli import output
from pgqueue_cli.errors import fail

#: Jobs cancelled per statement: each batch is one short transaction.
BATCH = 1000


def confirm(question: str, yes: bool) -> None:
    """Ask ``question`` on a terminal; without one, --yes is required.
    Answering no exits with code 1 and changes nothing."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question.rstrip('?')}: pass --yes to confirm (stdin is not a terminal)")
    if not typer.confirm(question, default=False, err=True):
        fail("not confirmed: nothing changed")


def bulk_cancel(
    app: pgqueue.App,
    what: str,
    yes: bool,
    *,
    queue: str | None = None,
    task: str | None = None,
    statuses: Sequence[str] = ("queued", "scheduled"),
) -> int:
    """Count the matching live jobs, confirm, then cancel them in batches;
    returns how many were cancelled (or asked to stop, when running)."""
    count = app.count_cancellable(queue=queue, task=task, statuses=statuses)
    if count == 0:
        return 0
    confirm(f"Cancel {count} {'/'.join(statuses)} job{'s' if count != 1 else ''} {what}?", yes)
    done = 0
    with output.progress(
        "cancelling", count, output.progress_wanted(None, quiet=False, as_json=False)
    ) as advance:
        while True:
            batch = app.cancel_many(queue=queue, task=task, statuses=statuses, limit=BATCH)
            done += len(batch)
            advance(len(batch))
            if len(batch) < BATCH:
                return done
