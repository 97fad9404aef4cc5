"""``pgqueue workers``: registered workers, their state, and forgetting lost ones."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue_cli import output
from pgqueue_cli.context import open_app
from pgqueue_cli.errors import fail
from pgqueue_cli.options import JsonOption

app = typer.Typer(
    name="workers",
    help="Registered workers: alive, stale (heartbeat late) or lost.",
    no_args_is_help=True,
)


@app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """List workers with their state, heartbeat age, version, tasks and running jobs.

    With --json: a list of {id, host, pid, queues, concurrency, tasks,
    started_at, last_heartbeat_at, lost_at, heartbeat_age_seconds, state, running,
    version, pool}.

    Examples:

      pgqueue workers list
    """
    with open_app() as workers_app:
        found = workers_app.list_workers()
    if as_json:
        output.print_json(found)
        return
    rows = [
        (
            w.id,
            w.state,
            w.host,
            w.pid,
            w.version or "-",
            w.pool or "-",
            output.fmt_age(w.heartbeat_age_seconds),
            output.fmt_time(w.lost_at) if w.lost_at else "-",
            w.running,
            ",".join(w.queues) if w.queues else "all",
            len(w.tasks or []),
        )
        for w in found
    ]
    columns = (
        "worker",
        "state",
        "host",
        "pid",
        "version",
        "pool",
        "heartbeat",
        "lost at",
        "running",
        "queues",
        "tasks",
    )
    output.stdout().print(output.table(None, columns, rows))


@app.command()
def forget(
    worker_id: Annotated[str, typer.Argument(metavar="WORKER_ID", help="The worker's id.")],
    force: Annotated[
        bool, typer.Option("--force", help="Forget it even though it sent a heartbeat lately.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove a lost worker's registration (its jobs are left to the reaper).

    Examples:

      pgqueue workers forget web-1:4711:ab12cd
    """
    with open_app() as workers_app:
        known = {w.id: w for w in workers_app.list_workers()}
        if worker_id not in known:
            fail(f"no worker {worker_id!r} is registered")
        if not workers_app.forget_worker(worker_id, force):
            fail(f"worker {worker_id!r} is alive (heartbeat lately); use --force to forget it")
    if as_json:
        output.print_json({"worker_id": worker_id, "forgotten": True})
    else:
        output.info(f"forgot worker {worker_id!r}")
