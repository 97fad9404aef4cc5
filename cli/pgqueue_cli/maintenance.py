"""Maintenance commands for operators and cron: reap, archive, prune, maintenance."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue_cli import output, parsing
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption, ProgressOption, QuietOption

OlderThan = Annotated[
    str,
    typer.Option(
        "--older-than",
        metavar="DURATION",
        help="Age cutoff by finish time: 30s, 15m, 7d, P7D...",
        show_default=False,
    ),
]
LimitTotal = Annotated[
    int | None, typer.Option("--limit", help="Stop after this many rows in total.", min=1)
]
BatchSize = Annotated[
    int,
    typer.Option(
        help="Rows per statement; each batch is its own short transaction.", min=1, max=100_000
    ),
]


def reap(as_json: JsonOption = False, quiet: QuietOption = False) -> None:
    """Reclaim jobs whose lease expired (workers do this every few seconds; run it when none runs).

    Each such job counts a failed attempt (lease_expired) and goes back to its
    queue with backoff, or dead when its attempts ran out. With --json:
    {"reaped": n}.

    Examples:

      pgqueue reap
    """
    with open_app() as app:
        reaped = app.reap()
    if as_json:
        output.print_json({"reaped": reaped})
    elif not quiet:
        output.info(f"reaped {reaped} job{'s' if reaped != 1 else ''} whose lease expired")


def archive(
    older_than: OlderThan,
    status: Annotated[
        str,
        typer.Option(
            "--status",
            help="Comma-separated finished statuses to move: succeeded, dead, cancelled.",
        ),
    ] = "succeeded",
    limit: LimitTotal = None,
    batch_size: BatchSize = 1000,
    progress: ProgressOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Move finished jobs older than a cutoff from the jobs table to the archive table.

    Runs in short batches with SKIP LOCKED: safe beside workers and beside
    another archive (each job moves exactly once), and an interrupted run
    loses nothing. Archived jobs stay visible to `jobs show` and `jobs
    replay` until `prune` deletes them. With --json: {"archived": n}.

    Examples:

      pgqueue archive --older-than 7d

      pgqueue archive --older-than 30d --status succeeded,dead,cancelled --quiet
    """
    cutoff = parsing.duration("--older-than", older_than)
    statuses = parsing.csv(status)
    show_bar = output.progress_wanted(progress, quiet=quiet, as_json=as_json)
    with open_app() as app:
        total = app.archive_count(cutoff, statuses) if show_bar else None
        if total is not None and limit is not None:
            total = min(total, limit)
        with output.progress("archiving", total, show_bar) as advance:
            moved = app.archive(cutoff, limit, statuses, batch_size, advance)
    if as_json:
        output.print_json({"archived": moved})
    elif not quiet:
        output.info(
            f"archived {moved} job{'s' if moved != 1 else ''} "
            f"({', '.join(statuses)}) finished over {older_than} ago"
        )


def prune(
    older_than: OlderThan,
    limit: LimitTotal = None,
    batch_size: BatchSize = 1000,
    progress: ProgressOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Delete finished jobs, attempt history and archived jobs older than a cutoff.

    The workers do this by themselves, by `pgqueue retention` (their
    maintenance); prune runs the same pass now with its own cutoff: it drops
    the time ranges of finished jobs wholly past the cutoff (one statement
    each, whatever they hold), then deletes attempt records and the archive
    table's jobs in short batches like archive. Attempts of live jobs are
    kept. With --json: {"pruned": total, "attempts": n, "archived_jobs": m}
    (finished jobs count as archived: their row moved when they ended).

    Examples:

      pgqueue prune --older-than 30d

      pgqueue prune --older-than 90d --limit 100000 --quiet
    """
    cutoff = parsing.duration("--older-than", older_than)
    show_bar = output.progress_wanted(progress, quiet=quiet, as_json=as_json)
    with open_app() as app:
        total = app.prune_count(cutoff) if show_bar else None
        if total is not None and limit is not None:
            total = min(total, limit)
        with output.progress("pruning", total, show_bar) as advance:
            deleted = app.prune(cutoff, limit, batch_size, advance)
    pruned = deleted["attempts"] + deleted["archived_jobs"]
    if as_json:
        output.print_json({"pruned": pruned, **deleted})
    elif not quiet:
        output.info(
            f"pruned {deleted['attempts']} attempt records and "
            f"{deleted['archived_jobs']} archived jobs finished over {older_than} ago"
        )


def maintenance(as_json: JsonOption = False, quiet: QuietOption = False) -> None:
    """VACUUM (ANALYZE) the queue tables and report their dead tuples before and after.

    Autovacuum normally keeps up; run this after a large archive or prune,
    or when `status` gets slow. With --json: a list of {"table",
    "live_tuples", "dead_tuples_before", "dead_tuples_after", "total_bytes"}.

    Examples:

      pgqueue maintenance
    """
    with open_app() as app:
        tables = app.vacuum()
    if as_json:
        output.print_json(tables)
    elif not quiet:
        output.stdout().print(
            output.table(
                "VACUUM (ANALYZE)",
                ("table", "live", "dead before", "dead after", "size"),
                [
                    (
                        t.table,
                        t.live_tuples,
                        t.dead_tuples_before,
                        t.dead_tuples_after,
                        output.fmt_bytes(t.total_bytes),
                    )
                    for t in tables
                ],
            )
        )


def retention(
    succeeded: Annotated[
        str | None,
        typer.Option(
            "--succeeded", metavar="DURATION", help="Keep succeeded jobs this long (default 1d)."
        ),
    ] = None,
    cancelled: Annotated[
        str | None,
        typer.Option(
            "--cancelled", metavar="DURATION", help="Keep cancelled jobs this long (default 7d)."
        ),
    ] = None,
    dead: Annotated[
        str | None,
        typer.Option("--dead", metavar="DURATION", help="Keep dead jobs this long (default 30d)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show or set how long finished jobs are kept before they are deleted.

    Workers apply it by themselves (one at a time; `pgqueue worker
    --no-maintenance` opts a worker out): finished jobs past their retention
    are deleted with their attempts, a whole time range at once. 0s deletes
    a job when it ends. Without options: show. With --json:
    {"succeeded": seconds, "cancelled": seconds, "dead": seconds}.

    Examples:

      pgqueue retention

      pgqueue retention --succeeded 6h --dead 90d
    """
    given = {
        "succeeded": succeeded,
        "cancelled": cancelled,
        "dead": dead,
    }
    parsed = {
        name: parsing.duration(f"--{name}", value)
        for name, value in given.items()
        if value is not None
    }
    with open_app() as app:
        kept = app.set_retention(**parsed) if parsed else app.get_retention()
    rows = {
        "succeeded": kept.succeeded,
        "cancelled": kept.cancelled,
        "dead": kept.dead,
    }
    if as_json:
        output.print_json({name: value.total_seconds() for name, value in rows.items()})
        return
    output.stdout().print(
        output.table(
            "finished jobs are kept for",
            ["status", "kept"],
            [[name, output.fmt_age(value.total_seconds())] for name, value in rows.items()],
        )
    )
