"""``pgqueue enqueue``: one job from the command line, or many from stdin."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

import pgqueue
from pgqueue.errors import InvalidOption
from pgqueue.models import EnqueueOptions
from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption, ProgressOption, QuietOption


def enqueue(
    task: Annotated[str, typer.Argument(help="The task's name (the worker must know it).")],
    payload: Annotated[
        str | None,
        typer.Option(help="The task's keyword arguments as a JSON object.", show_default=False),
    ] = None,
    payload_file: Annotated[
        str | None,
        typer.Option(
            help="Read the JSON object from this file ('-' for stdin).", show_default=False
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", help="Queue (default: the task's, else 'default')."),
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", "-p", help="Higher runs first (-32768..32767).")
    ] = None,
    delay: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION", help="Run after this long, e.g. 30s, 15m, PT1H.", show_default=False
        ),
    ] = None,
    run_at: Annotated[
        str | None, typer.Option(help="Run at this ISO-8601 time.", show_default=False)
    ] = None,
    dedup_key: Annotated[
        str | None,
        typer.Option(
            help="At most one live job per queue with this key: a duplicate returns the live job."
        ),
    ] = None,
    serial_key: Annotated[
        str | None, typer.Option(help="Jobs sharing this key run one at a time, in order.")
    ] = None,
    dedup_window: Annotated[
        str | None,
        typer.Option(
            help="With --dedup-key: no new job if one with the key was created within "
            "this long (e.g. 1h), finished or not.",
            show_default=False,
        ),
    ] = None,
    debounce: Annotated[
        str | None,
        typer.Option(
            help="With --dedup-key: while the key's job is still queued, replace its "
            "payload and run it this long from now (e.g. 30s).",
            show_default=False,
        ),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Attempts before the job goes dead.", show_default=False)
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag", help="A label for the job (repeat for more, up to 16).", show_default=False
        ),
    ] = None,
    meta: Annotated[
        str | None,
        typer.Option(help="A JSON object stored with the job (up to 8 KiB).", show_default=False),
    ] = None,
    depends_on: Annotated[
        list[int] | None,
        typer.Option(
            "--depends-on",
            help="Wait until this job succeeded (repeat for more); status waiting until then.",
            show_default=False,
        ),
    ] = None,
    allow_failed: Annotated[
        bool,
        typer.Option(
            "--allow-failed", help="With --depends-on: run once they ended, whatever the end."
        ),
    ] = False,
    group_key: Annotated[
        str | None,
        typer.Option(
            "--group",
            metavar="KEY",
            help="The tenant, customer, API key or domain the job belongs to "
            "(1 to 200 characters).",
            show_default=False,
        ),
    ] = None,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch", help="Read one JSON payload per line from stdin; enqueue them all."
        ),
    ] = False,
    batch_size: Annotated[
        int, typer.Option(help="With --batch: jobs per statement.", min=1, max=100_000)
    ] = 1000,
    progress: ProgressOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Enqueue a job by task name; with --batch, one job per JSON line on stdin.

    With --json: {"job_id", "created"} (created is false when a live job with
    the same dedup key exists: its id is returned); with --batch, a list of
    those, in input order. A --batch run is one transaction: every line is
    enqueued or, on any error, none.

    Examples:

      pgqueue enqueue send_email --payload '{"to": "a@b.c"}'

      pgqueue enqueue report --queue slow --delay 15m --dedup-key report:2026-12

      pgqueue enqueue import --tag tenant:42 --tag nightly --meta '{"by": "cron"}'

      pgqueue enqueue crawl --group example.com --payload '{"url": "https://example.com/"}'

      jq -c '.[]' users.json | pgqueue enqueue welcome --batch
    """
    if run_at is not None and delay is not None:
        raise InvalidOption("give --run-at or --delay, not both")
    when = parsing.moment("--run-at", run_at)
    wait = parsing.optional_duration("--delay", delay)
    window = parsing.optional_duration("--dedup-window", dedup_window)
    settle = parsing.optional_duration("--debounce", debounce)
    options = EnqueueOptions(
        queue=queue,
        priority=priority,
        run_at=when,
        delay=wait,
        max_attempts=max_attempts,
        dedup_key=dedup_key,
        serial_key=serial_key,
        dedup_window=window,
        debounce=settle,
        tags=tag or None,
        meta=parsing.json_object(meta, "--meta") if meta is not None else None,
        depends_on=depends_on or None,
        allow_failed=allow_failed,
        group_key=group_key,
    )
    if batch:
        if payload is not None or payload_file is not None:
            raise InvalidOption("--batch reads payloads from stdin: drop --payload/--payload-file")
        payloads = parsing.json_lines(sys.stdin.read().splitlines(), "stdin")
        specs = [pgqueue.JobSpec(task, p, **options) for p in payloads]
        show_bar = output.progress_wanted(progress, quiet=quiet, as_json=as_json)
        with open_app() as app:
            results = enqueue_all(app, specs, batch_size, show_bar)
        if as_json:
            output.print_json(results)
        elif not quiet:
            created = sum(1 for r in results if r.created)
            output.info(
                f"enqueued {created} job{'s' if created != 1 else ''}"
                + (f" ({len(results) - created} already live)" if created < len(results) else "")
            )
        return
    body = _one_payload(payload, payload_file)
    with open_app() as app:
        result = app.enqueue(task, body, **options)
    if as_json:
        output.print_json(result)
    elif not quiet:
        if result.created:
            output.info(f"enqueued job {result.job_id}")
        else:
            output.info(
                f"job {result.job_id} with dedup key {dedup_key!r} is live: not enqueued again"
            )


def _one_payload(payload: str | None, payload_file: str | None) -> dict[str, Any]:
    if payload is not None and payload_file is not None:
        raise InvalidOption("give --payload or --payload-file, not both")
    if payload is not None:
        return parsing.json_object(payload, "--payload")
    if payload_file is not None:
        return parsing.json_file(payload_file)
    return {}


def enqueue_all(
    app: pgqueue.App, specs: list[pgqueue.JobSpec], batch_size: int, show_bar: bool
) -> list[pgqueue.Enqueued]:
    """Enqueue ``specs`` in batches inside one transaction (all or nothing)."""
    results: list[pgqueue.Enqueued] = []
    if not specs:
        return results
    # One transaction around the batches: a bad payload on line 90,000 or a
    # dropped connection leaves nothing half-imported, so the run can simply
    # be repeated. Batches keep each statement (and its JSON) bounded. A pooled
    # connection: it gets the pool's session setup and schema check.
    with (
        app.transaction() as conn,
        output.progress("enqueueing", len(specs), show_bar) as advance,
    ):
        for start in range(0, len(specs), batch_size):
            chunk = specs[start : start + batch_size]
            results += app.enqueue_many(chunk, conn=conn)
            advance(len(chunk))
    return results
