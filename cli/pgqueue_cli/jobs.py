"""``pgqueue jobs``: list, show, cancel, replay and explain jobs."""

from __future__ import annotations

import json
from typing import Annotated

import typer

import pgqueue
from pgqueue.commands import command
from pgqueue.errors import InvalidJobState, InvalidOption
from pgqueue.ops import operator
from pgqueue_cli import output, parsing
from pgqueue_cli.bulk import bulk_cancel
from pgqueue_cli.context import open_app
from pgqueue_cli.options import (
    CursorOption,
    JsonOption,
    LimitOption,
    QueueFilter,
    TaskFilter,
    YesOption,
)
from pgqueue_cli.queue import must_exist

app = typer.Typer(
    name="jobs",
    help="Inspect and change single jobs: list, show, cancel, replay, explain.",
    no_args_is_help=True,
)

JobIdArgument = Annotated[
    str, typer.Argument(metavar="ID", help="The job's id.", show_default=False)
]

LIST_COLUMNS = (
    "id",
    "queue",
    "task",
    "status",
    "priority",
    "attempts",
    "run at",
    "finished",
    "last error",
)


@app.command("list")
def list_jobs(
    queue: QueueFilter = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            "-s",
            help="queued, scheduled, running, succeeded, dead or cancelled.",
        ),
    ] = None,
    task: TaskFilter = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="Only jobs having this tag (repeat: all of them)."),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", metavar="KEY", help="Only the jobs of this group (group_key)."),
    ] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first, a page at a time.

    With --json: {"jobs": [Job, ...], "next_cursor": ...}; pass next_cursor
    back with --cursor for the next page (null on the last page).

    Examples:

      pgqueue jobs list --queue mail --status running

      pgqueue jobs list --status dead --limit 200 --json

      pgqueue jobs list --cursor MTIzNDU

      pgqueue jobs list --tag tenant:42 --tag nightly

      pgqueue jobs list --group customer-42 --status queued
    """
    with open_app() as queue_app:
        page = queue_app.list_jobs(
            queue=queue,
            status=status,
            task=task,
            limit=limit,
            cursor=cursor,
            tags=tag or None,
            group_key=group,
        )
    print_page(page, as_json, LIST_COLUMNS, command("jobs list"))


def print_page(page: pgqueue.Page, as_json: bool, columns: tuple[str, ...], again: str) -> None:
    """A page of jobs as JSON or as a table, with the next page's command as a hint."""
    if as_json:
        output.print_json(page)
        return
    output.stdout().print(output.table(None, columns, [job_row(job, columns) for job in page.jobs]))
    if not page.jobs:
        output.hint("no jobs match")
    if page.next_cursor:
        output.hint(f"more: {again} ... --cursor {page.next_cursor}")


def job_row(job: pgqueue.Job, columns: tuple[str, ...]) -> list[object]:
    values: dict[str, object] = {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "status": job.status.value,
        "priority": job.priority,
        "attempts": f"{job.attempts}/{job.max_attempts}",
        "run at": job.run_at,
        "created": job.created_at,
        "finished": job.finished_at,
        "last error": output.shorten(job.last_error),
    }
    return [values[name] for name in columns]


@app.command()
def show(
    job_id: JobIdArgument,
    tracebacks: Annotated[
        bool, typer.Option("--tracebacks", help="Also print each failed attempt's traceback.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show a job (live or archived), every attempt with its error, and why it is there.

    With --json: a Job object, attempt_history included.

    Examples:

      pgqueue jobs show 42

      pgqueue jobs show 42 --tracebacks

      pgqueue jobs show 42 --json
    """
    ident = parsing.job_id(job_id)
    with open_app() as queue_app:
        job = queue_app.get_job(ident, history=True)
        explanation = None if as_json else queue_app.explain(ident)
    if as_json:
        output.print_json(job)
        return
    console = output.stdout()
    fields = output.table(
        f"job {job.id}",
        ("field", "value"),
        [
            ("status", job.status.value),
            ("task", job.task),
            ("queue", job.queue),
            ("priority", job.priority),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("snoozes", job.snoozes),
            ("progress", job.progress),
            ("run at", job.run_at),
            ("created", job.created_at),
            ("finished", job.finished_at),
            ("dedup key", job.dedup_key),
            ("serial key", job.serial_key),
            ("group", job.group_key),
            ("payload", job.payload),
            ("tags", ", ".join(job.tags) or None),
            ("meta", job.meta),
            ("result", job.result),
            ("last error", job.last_error),
        ],
    )
    console.print(fields)
    attempts = job.attempt_history or []
    if not attempts:
        output.info("no attempts yet")
    else:
        _print_attempts(attempts)
    if job.steps:
        _print_steps(job.steps)
    if tracebacks:
        for a in attempts:
            if a.traceback:
                output.info(f"--- attempt {a.attempt} traceback ---")
                console.print(a.traceback, markup=False, highlight=False)
    output.info(f"why: {explanation}")


def _print_steps(steps: list[pgqueue.StepRecord]) -> None:
    """A durable task's stored steps, sleeps and event waits."""
    output.stdout().print(
        output.table(
            "steps",
            ("name", "kind", "status", "result", "started", "finished", "until", "event"),
            [
                (
                    s.name,
                    s.kind,
                    s.status,
                    output.shorten(json.dumps(s.result)) if s.result is not None else None,
                    s.started_at,
                    s.finished_at,
                    s.wake_at,
                    s.event_key,
                )
                for s in steps
            ],
        )
    )


def _print_attempts(attempts: list[pgqueue.Attempt]) -> None:
    output.stdout().print(
        output.table(
            "attempts",
            ("#", "attempt id", "worker", "started", "finished", "outcome", "latency", "error"),
            [
                (
                    a.attempt,
                    a.attempt_id,
                    a.worker_id,
                    a.started_at,
                    a.finished_at,
                    a.outcome.value,
                    None if a.latency_ms is None else f"{a.latency_ms:.0f}ms",
                    None if a.error_code is None else f"{a.error_code}: {a.error_message or ''}",
                )
                for a in attempts
            ],
        )
    )


@app.command()
def cancel(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="ID...", help="The jobs' ids.", show_default=False),
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Cancel the live jobs of this queue.")
    ] = None,
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="Cancel the live jobs of this task.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            "-s",
            help="With --queue/--task: comma-separated queued, scheduled, running "
            "(default: queued,scheduled).",
        ),
    ] = None,
    if_live: Annotated[
        bool,
        typer.Option("--if-live", help="A job that already finished is not an error: skip it."),
    ] = False,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Cancel jobs by id, or every live job matching --queue/--task/--status.

    A queued or scheduled job ends cancelled at once; a running one is asked
    to stop and ends cancelled when its attempt ends. Cancelling a finished
    job is an error unless --if-live; an unknown id is always an error, and
    then nothing is cancelled. A cancel by filter counts the jobs and asks
    first (--yes to skip). With --json: {"job_id", "status"} (status
    "cancelled", "running" while the worker stops it, or the final status of
    a job skipped by --if-live), a list of them for several ids; by filter:
    {"cancelled": n}.

    Examples:

      pgqueue jobs cancel 42

      pgqueue jobs cancel 42 43 44 --if-live

      pgqueue jobs cancel --queue mail --task send_receipt --status queued --yes
    """
    if job_ids and (queue is not None or task is not None or status is not None):
        raise InvalidOption("give job ids or --queue/--task/--status filters, not both")
    if not job_ids:
        if queue is None and task is None:
            raise InvalidOption("give job ids, or --queue and/or --task to cancel by filter")
        statuses = parsing.csv(status) if status is not None else ["queued", "scheduled"]
        filters = " and ".join(
            f"{name} {value!r}" for name, value in (("queue", queue), ("task", task)) if value
        )
        with open_app() as queue_app:
            if queue is not None:
                must_exist(queue_app, queue, None)
            done = bulk_cancel(
                queue_app, f"with {filters}", yes, queue=queue, task=task, statuses=statuses
            )
        if as_json:
            output.print_json({"cancelled": done})
        else:
            output.info(f"cancelled {done} job{'s' if done != 1 else ''} with {filters}")
        return
    idents = list(dict.fromkeys(parsing.job_id(text) for text in job_ids))
    with open_app() as queue_app:
        found = queue_app.job_statuses(idents)
        if missing := [i for i in idents if i not in found]:
            raise pgqueue.JobNotFound(missing[0])
        finished = {i: s for i, s in found.items() if s not in operator.CANCELLABLE}
        if finished and not if_live:
            first = next(iter(finished))
            raise InvalidJobState(
                f"job {first} already finished ({finished[first]}): nothing to cancel "
                "(--if-live skips finished jobs); nothing was cancelled"
            )
        live = [i for i in idents if i not in finished]
        if live:
            queue_app.cancel_many(live, statuses=operator.CANCELLABLE, limit=len(live))
            # Cancelled, asked to stop (still running), or finished meanwhile.
            found = queue_app.job_statuses(idents)
    results = [{"job_id": i, "status": finished.get(i) or found.get(i, "unknown")} for i in idents]
    if as_json:
        output.print_json(results[0] if len(results) == 1 else results)
        return
    for r in results:
        job_id, now = r["job_id"], r["status"]
        if job_id in finished:
            output.info(f"job {job_id} already {now}: skipped")
        elif now == "cancelled":
            output.info(f"job {job_id} cancelled")
        elif now == "running":
            output.info(
                f"job {job_id} is running: its worker was asked to stop; "
                "it ends cancelled when the attempt ends"
            )
        else:
            output.info(f"job {job_id} is {now}")


@app.command()
def replay(
    job_id: JobIdArgument,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Enqueue the copy in this queue instead.")
    ] = None,
    run_at: Annotated[
        str | None, typer.Option(help="Run the copy at this ISO-8601 time instead of now.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Enqueue a copy of any job (succeeded, dead, cancelled, archived...) as a new job.

    With --json: {"job_id": the new job, "replayed_from": the original}.

    Examples:

      pgqueue jobs replay 42

      pgqueue jobs replay 42 --queue slow --run-at 2026-12-24T18:00:00+01:00
    """
    ident = parsing.job_id(job_id)
    when = parsing.moment("--run-at", run_at)
    with open_app() as queue_app:
        new_id = queue_app.replay(ident, queue=queue, run_at=when)
    if as_json:
        output.print_json({"job_id": new_id.job_id, "replayed_from": new_id.replayed_from})
    else:
        output.info(f"job {ident} replayed as job {new_id}")


@app.command()
def explain(job_id: JobIdArgument, as_json: JsonOption = False) -> None:
    """Say in plain words why a job is where it is (waiting on what, or how it ended).

    With --json: {"job_id", "explanation"}.

    Examples:

      pgqueue jobs explain 42
    """
    ident = parsing.job_id(job_id)
    with open_app() as queue_app:
        text = queue_app.explain(ident)
    if as_json:
        output.print_json({"job_id": ident, "explanation": text})
    else:
        output.info(text)
