"""``pgqueue dlq``: the dead-letter queue, i.e. jobs whose status is dead."""

from __future__ import annotations

from typing import Annotated

import typer

import pgqueue
from pgqueue.commands import command
from pgqueue.errors import InvalidJobState, InvalidOption
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.errors import fail
from pgqueue_cli.jobs import print_page
from pgqueue_cli.options import (
    CursorOption,
    JsonOption,
    LimitOption,
    ProgressOption,
    QueueFilter,
    QuietOption,
    TaskFilter,
)

app = typer.Typer(
    name="dlq",
    help="Dead jobs: list them, put them back in their queue.",
    no_args_is_help=True,
)

DLQ_COLUMNS = ("id", "queue", "task", "attempts", "finished", "last error")


@app.command("list")
def list_dead(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    as_json: JsonOption = False,
) -> None:
    """List dead jobs, newest first, a page at a time.

    With --json: {"jobs": [Job, ...], "next_cursor": ...}.

    Examples:

      pgqueue dlq list

      pgqueue dlq list --queue mail --task send_email --json
    """
    with open_app() as queue_app:
        page = queue_app.list_jobs(
            queue=queue, status="dead", task=task, limit=limit, cursor=cursor
        )
    print_page(page, as_json, DLQ_COLUMNS, command("dlq list"))


@app.command()
def requeue(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="ID...", help="Dead jobs to requeue.", show_default=False),
    ] = None,
    all_dead: Annotated[
        bool, typer.Option("--all", help="Requeue every dead job (narrow with --queue/--task).")
    ] = False,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    batch_size: Annotated[
        int,
        typer.Option(
            help="Jobs per statement (each batch is its own short transaction).", min=1, max=100_000
        ),
    ] = 500,
    progress: ProgressOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Put dead jobs back in their queue, to run now (with one more attempt when theirs ran out).

    Give ids, or --all with optional --queue/--task filters; --all works in
    batches with a progress bar. With --json: {"requeued": n, "job_ids": [...]}.
    A job whose dedup key is taken by a live job again is left dead.

    Examples:

      pgqueue dlq requeue 42 43

      pgqueue dlq requeue --all --queue mail --task send_email
    """
    if all_dead == bool(job_ids):
        raise InvalidOption("give dead job ids or --all, not both and not neither")
    if job_ids and (queue is not None or task is not None):
        raise InvalidOption("--queue and --task narrow --all; with ids, give the ids only")
    show_bar = output.progress_wanted(progress, quiet=quiet, as_json=as_json)
    with open_app() as queue_app:
        if job_ids:
            requeued = _requeue_ids(
                queue_app, [parsing.job_id(i) for i in job_ids], batch_size, show_bar
            )
        else:
            requeued = _requeue_all(queue_app, queue, task, batch_size, show_bar)
    if as_json:
        output.print_json({"requeued": len(requeued), "job_ids": requeued})
    elif not quiet:
        output.info(f"requeued {len(requeued)} dead job{'s' if len(requeued) != 1 else ''}")


def _requeue_ids(app: pgqueue.App, ids: list[int], batch_size: int, show_bar: bool) -> list[int]:
    wanted = list(dict.fromkeys(ids))
    if len(wanted) == 1:
        # One job: the library's own checks give the precise reason it cannot be requeued.
        app.requeue_dead(wanted[0])
        return wanted
    # Many: check them all first, so that a typo in one id writes nothing.
    for ident in wanted:
        job = app.get_job(ident)
        if job.status != pgqueue.JobStatus.DEAD:
            raise InvalidJobState(
                f"job {ident} is {job.status.value}, not dead: nothing was requeued"
            )
    requeued: list[int] = []
    with output.progress("requeueing dead jobs", len(wanted), show_bar) as advance:
        for start in range(0, len(wanted), batch_size):
            batch = wanted[start : start + batch_size]
            done = app.requeue_dead_many(batch, limit=len(batch))
            requeued += done
            advance(len(done))
    if missed := sorted(set(wanted) - set(requeued)):
        listed = ", ".join(str(i) for i in missed)
        fail(
            f"requeued {len(requeued)} of {len(wanted)} jobs; jobs {listed} were not requeued: "
            "they are archived, were requeued meanwhile, or a live job holds their dedup key "
            f"(see `{command('jobs explain ID')}`)"
        )
    return requeued


def _requeue_all(
    app: pgqueue.App, queue: str | None, task: str | None, batch_size: int, show_bar: bool
) -> list[int]:
    # Bounded by the count taken first: jobs that die again while this runs
    # (a worker failing them at once) are left for the next run, not looped on.
    total = app.count_dead(queue, task)
    requeued: list[int] = []
    with output.progress("requeueing dead jobs", total, show_bar) as advance:
        while len(requeued) < total:
            step = min(batch_size, total - len(requeued))
            done = app.requeue_dead_many(queue=queue, task=task, limit=step)
            requeued += done
            advance(len(done))
            if len(done) < step:
                break
    return requeued
