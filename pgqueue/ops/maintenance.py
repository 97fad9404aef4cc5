"""Reaper, archive and prune in bounded batches, worker registry, table stats.

Each batch is its own short autocommitted statement: no long transaction
holds locks or the xmin horizon, and a crash loses at most one batch's work
(which rolls back whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from pgqueue import validation
from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidOption
from pgqueue.models import TableVacuum
from pgqueue.ops import Execute, Op, OpContext, partitions, retention

Progress = Callable[[int], None]
FINISHED = ("succeeded", "dead", "cancelled")


def reap(ctx: OpContext, batch_size: int = 500) -> Op[int]:
    """Reclaim every job whose lease expired; returns how many."""
    validation.positive_int("batch_size", batch_size, 100_000)
    return _reap(ctx, batch_size)


def _reap(ctx: OpContext, batch_size: int) -> Op[int]:
    total = 0
    while True:
        rows = yield Execute("job_reap_expired", {"limit": batch_size, "now": ctx.clock()})
        total += len(rows)
        if len(rows) < batch_size:
            return total


def age(ctx: OpContext, older_than: str | float | timedelta) -> dict[str, Any]:
    """Parameters of an age cutoff; the statement subtracts it from the
    database clock, so client clock skew cannot move it."""
    return {"older_than": parse_duration(older_than), "now": ctx.clock()}


def _bounded(limit: int | None) -> int | None:
    return None if limit is None else validation.positive_int("limit", limit)


def archive(
    ctx: OpContext,
    older_than: str | float | timedelta,
    limit: int | None = None,
    statuses: Sequence[str] = ("succeeded",),
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> Op[int]:
    """Move finished jobs older than ``older_than`` to the archive table, in
    batches; returns how many moved."""
    params = {"statuses": archivable(statuses), **age(ctx, older_than)}
    return _archive(
        params,
        _bounded(limit),
        validation.positive_int("batch_size", batch_size, 100_000),
        progress,
    )


def _archive(
    params: dict[str, Any], limit: int | None, size: int, progress: Progress | None
) -> Op[int]:
    yield from partitions.ensure_for_archive(params)
    return (yield from _batches("job_archive_batch", params, limit, size, progress))


def archive_count(
    ctx: OpContext, older_than: str | float | timedelta, statuses: Sequence[str] = ("succeeded",)
) -> Op[int]:
    """How many jobs an archive with these arguments would move."""
    return _count("job_archive_count", {"statuses": archivable(statuses), **age(ctx, older_than)})


def archivable(statuses: Sequence[str]) -> list[str]:
    """The distinct statuses to archive; only finished ones may be."""
    if isinstance(statuses, str):
        statuses = [statuses]
    wanted = list(dict.fromkeys(statuses))
    for status in wanted:
        if status not in FINISHED:
            raise InvalidOption(f"cannot archive status {status!r}: only {', '.join(FINISHED)}")
    if not wanted:
        raise InvalidOption("give at least one status to archive")
    return wanted


def _count(query: Any, params: dict[str, Any]) -> Op[int]:
    row = yield Execute(query, params, fetch="one")
    return int(sum(row)) if row else 0


def prune(
    ctx: OpContext,
    older_than: str | float | timedelta,
    limit: int | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> Op[dict[str, int]]:
    """Delete attempt records (of jobs no longer live) and finished jobs
    older than the cutoff; returns {"attempts": n, "archived_jobs": m}.
    Finished jobs are archived when they end (their row moves once, to its
    status's partition) and go as the workers' retention removes them
    (:func:`pgqueue.ops.retention.run_pass`): whole time-range leaves past
    the cutoff, one statement each (``limit`` does not split a leaf), and the
    rows of the default leaves one by one; then the archive table's rows."""
    params = age(ctx, older_than)
    size = validation.positive_int("batch_size", batch_size, 100_000)
    return _prune_all(ctx, params, _bounded(limit), size, progress)


def _prune_all(
    ctx: OpContext,
    params: dict[str, Any],
    limit: int | None,
    size: int,
    progress: Progress | None,
) -> Op[dict[str, int]]:
    # The batches first: a role that may not prune is refused before anything is deleted.
    rest = yield from _prune(params, limit, size, progress)
    done = yield from retention.run_pass(
        ctx, params["older_than"], count=True, archive=False, progress=progress
    )
    return {"attempts": rest["attempts"], "archived_jobs": done.jobs + rest["archived_jobs"]}


def prune_count(ctx: OpContext, older_than: str | float | timedelta) -> Op[int]:
    """How many rows a prune with this cutoff would delete."""
    return _count("prune_count", age(ctx, older_than))


def _prune(
    params: dict[str, Any], limit: int | None, size: int, progress: Progress | None
) -> Op[dict[str, int]]:
    attempts = yield from _batches("attempt_prune_batch", params, limit, size, progress)
    left = None if limit is None else limit - attempts
    archived = 0
    if left is None or left > 0:
        # A partitioned archive drops whole partitions; the rows left over
        # (those of the partition the cutoff falls in) go row by row.
        archived = yield from partitions.drop_older(params, left)
        if archived and progress is not None:
            progress(archived)
        left = None if left is None else left - archived
    if left is None or left > 0:
        archived += yield from _batches("archive_prune_batch", params, left, size, progress)
    return {"attempts": attempts, "archived_jobs": archived}


def _batches(
    query: Any, params: dict[str, Any], limit: int | None, size: int, progress: Progress | None
) -> Op[int]:
    total = 0
    while limit is None or total < limit:
        step = size if limit is None else min(size, limit - total)
        moved = yield Execute(query, {**params, "limit": step}, fetch="none")
        total += moved
        if progress is not None and moved:
            progress(moved)
        if moved < step:
            break
    return total


def table_stats(schema: str) -> Op[list[dict[str, Any]]]:
    """Tuples, dead tuples and size of every table of the schema."""
    return _rows("table_stats", {"schema_name": schema})


#: The tables ``table_vacuum_analyze`` names: every table of the schema but
#: alembic_version (a test keeps the three in step).
VACUUM_TABLES = (
    "jobs",
    "job_attempts",
    "jobs_archive",
    "queues",
    "queue_lease_log",
    "workers",
    "schedules",
    "limits",
    "role_grants",
    "periodic_schedules",
    "tasks",
    "task_settings",
    "task_lease_log",
    "archive_partitioning",
    "workflows",
    "job_waits",
    "job_dependencies",
    "retention",
    "maintenance",
    "job_steps",
    "events",
)


def vacuum(schema: str) -> Op[list[TableVacuum]]:
    """VACUUM (ANALYZE) the queue tables, reading dead tuples before and after.
    Drive it on an autocommit connection: VACUUM refuses a transaction block."""
    return _vacuum(schema)


def _vacuum(schema: str) -> Op[list[TableVacuum]]:
    before = yield from table_stats(schema)
    yield Execute("table_vacuum_analyze", fetch="none")
    after = yield from table_stats(schema)
    dead_before = {row["table_name"]: int(row["n_dead_tup"]) for row in before}
    return [
        TableVacuum(
            table=row["table_name"],
            live_tuples=int(row["n_live_tup"]),
            dead_tuples_before=dead_before.get(row["table_name"], 0),
            dead_tuples_after=int(row["n_dead_tup"]),
            total_bytes=int(row["total_bytes"]),
        )
        for row in after
        if row["table_name"] in VACUUM_TABLES
    ]


def _rows(query: Any, params: dict[str, Any]) -> Op[list[dict[str, Any]]]:
    rows = yield Execute(query, params, rows="dict")
    return list(rows)
