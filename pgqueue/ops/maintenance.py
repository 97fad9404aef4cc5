"""Reaper, archive and prune in bounded batches, worker registry, table stats.

Each batch is its own short autocommitted statement: no long transaction
holds locks or the xmin horizon, and a crash loses at most one batch's work
(which rolls back whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pgqueue import validation
from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidOption
from pgqueue.ops import Execute, Op, OpContext

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


def cutoff(older_than: str | float | timedelta, now: datetime | None = None) -> datetime:
    age = parse_duration(older_than)
    return (now or datetime.now(UTC)) - age


def _bounded(limit: int | None) -> int | None:
    return None if limit is None else validation.positive_int("limit", limit)


def archive(
    older_than: str | float | timedelta,
    limit: int | None = None,
    statuses: Sequence[str] = ("succeeded",),
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> Op[int]:
    """Move finished jobs older than ``older_than`` to the archive table, in
    batches; returns how many moved."""
    wanted = list(dict.fromkeys(statuses))
    for status in wanted:
        if status not in FINISHED:
            raise InvalidOption(f"cannot archive status {status!r}: only {', '.join(FINISHED)}")
    if not wanted:
        raise InvalidOption("give at least one status to archive")
    params = {"statuses": wanted, "cutoff": cutoff(older_than)}
    return _batches(
        "job_archive_batch",
        params,
        _bounded(limit),
        validation.positive_int("batch_size", batch_size, 100_000),
        progress,
    )


def archive_count(
    older_than: str | float | timedelta, statuses: Sequence[str] = ("succeeded",)
) -> Op[int]:
    """How many jobs an archive with these arguments would move."""
    return _count("job_archive_count", {"statuses": list(statuses), "cutoff": cutoff(older_than)})


def _count(query: Any, params: dict[str, Any]) -> Op[int]:
    row = yield Execute(query, params, fetch="one")
    return int(sum(row)) if row else 0


def prune(
    older_than: str | float | timedelta,
    limit: int | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> Op[dict[str, int]]:
    """Delete attempt records (of jobs no longer live) and archived jobs
    finished before the cutoff; returns {"attempts": n, "archived_jobs": m}."""
    params = {"cutoff": cutoff(older_than)}
    size = validation.positive_int("batch_size", batch_size, 100_000)
    return _prune(params, _bounded(limit), size, progress)


def prune_count(older_than: str | float | timedelta) -> Op[int]:
    """How many rows a prune with this cutoff would delete."""
    return _count("prune_count", {"cutoff": cutoff(older_than)})


def _prune(
    params: dict[str, Any], limit: int | None, size: int, progress: Progress | None
) -> Op[dict[str, int]]:
    attempts = yield from _batches("attempt_prune_batch", params, limit, size, progress)
    left = None if limit is None else limit - attempts
    archived = 0
    if left is None or left > 0:
        archived = yield from _batches("archive_prune_batch", params, left, size, progress)
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


def workers() -> Op[list[dict[str, Any]]]:
    """Registered workers, their heartbeat age and running job count."""
    return _rows("worker_list", {})


def _rows(query: Any, params: dict[str, Any]) -> Op[list[dict[str, Any]]]:
    rows = yield Execute(query, params, rows="dict")
    return list(rows)
