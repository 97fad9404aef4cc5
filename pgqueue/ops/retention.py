"""Retention: finished jobs leave by themselves.

Finished jobs live in time-range leaves of their status's partition
(``jobs_succeeded``, ``jobs_dead``, ``jobs_cancelled``; sql/schema.sql). A
maintenance pass plans what to do (``retention_plan``) and does each step in
a transaction of its own: create the leaves of the next finish times, drop
the leaves that retention has passed (one statement however many jobs they
hold), and delete one by one only the rows of a default leaf (finished while
no worker made leaves) and of the optional archive. The workers run a pass
every few seconds, one at a time (an election in the database, see
:mod:`pgqueue.worker.maintenance`); ``pgqueue prune`` runs the same pass with
its own cutoff.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidDuration, QueryFailed
from pgqueue.models import Retention, RetentionPass
from pgqueue.ops import Execute, Op, OpContext

Progress = Callable[[int], None]

#: At most this long, as PostgreSQL's interval arithmetic goes.
MAX_RETENTION = timedelta(days=36500)
#: Rows one purge statement deletes (a default leaf, the archive).
PURGE_BATCH = 5000


def get() -> Op[Retention]:
    """The stored retention."""
    row = yield Execute("retention_get", {}, fetch="one")
    return _retention(row)


def set_(
    succeeded: str | float | timedelta | None = None,
    cancelled: str | float | timedelta | None = None,
    dead: str | float | timedelta | None = None,
) -> Op[Retention]:
    """Change how long finished jobs are kept (None: unchanged; 0: deleted
    when they end); the new settings."""
    params = {
        "succeeded": _keep("succeeded", succeeded),
        "cancelled": _keep("cancelled", cancelled),
        "dead": _keep("dead", dead),
    }
    return _set(params)


def _set(params: dict[str, timedelta | None]) -> Op[Retention]:
    row = yield Execute("retention_set", params, fetch="one")
    return _retention(row)


def _keep(name: str, value: str | float | timedelta | None) -> timedelta | None:
    if value is None:
        return None
    try:
        kept = parse_duration(value)
    except InvalidDuration as exc:
        raise InvalidDuration(f"retention of {name} jobs: {exc}") from None
    if kept > MAX_RETENTION:
        raise InvalidDuration(f"retention of {name} jobs: at most 100 years, got {value!r}")
    return kept


def _retention(row: Any) -> Retention:
    return Retention(succeeded=row[0], cancelled=row[1], dead=row[2], updated_at=row[3])


def run_pass(
    ctx: OpContext,
    older_than: str | float | timedelta | None = None,
    *,
    count: bool = False,
    archive: bool = True,
    progress: Progress | None = None,
) -> Op[RetentionPass]:
    """One maintenance pass: by the stored retention, or with ``older_than``
    for every status (``pgqueue prune``: drops the leaves and deletes the
    default leaves' rows finished before it; creates no leaves). ``count``:
    count the jobs of a dropped leaf instead of estimating them. ``archive``:
    also apply retention to the archive (prune deletes archived rows with its
    own statement). A step that meets a lock is skipped (the next pass does
    it)."""
    cutoffs = None
    if older_than is not None:
        cut = parse_duration(older_than)
        cutoffs = [cut, cut, cut]
    return _run_pass(ctx, cutoffs, count, archive, progress)


def _run_pass(
    ctx: OpContext,
    cutoffs: list[timedelta] | None,
    count: bool,
    archive: bool,
    progress: Progress | None,
) -> Op[RetentionPass]:
    plan = yield Execute("retention_plan", {"now": ctx.clock(), "cutoffs": cutoffs})
    done = {"jobs": 0, "archived_jobs": 0, "leaves_created": 0, "leaves_dropped": 0, "skipped": 0}
    for action, status, leaf, lower, upper in plan:
        try:
            if action == "create":
                name = yield Execute(
                    "retention_create_leaf",
                    {"status": status, "lower": lower, "upper": upper},
                    fetch="one",
                )
                done["leaves_created"] += 1 if name and name[0] else 0
            elif action == "drop":
                row = yield Execute(
                    "retention_drop_leaf", {"leaf": leaf, "count": count}, fetch="one"
                )
                dropped = int(row[0]) if row and row[0] else 0
                done["jobs"] += dropped
                done["leaves_dropped"] += 1
                if progress is not None and dropped:
                    progress(dropped)
            elif action == "purge" and (leaf != "jobs_archive" or archive):
                key = "archived_jobs" if leaf == "jobs_archive" else "jobs"
                done[key] += yield from _purge(leaf, status, upper, progress)
        except QueryFailed as exc:
            if not exc.transient:
                raise
            done["skipped"] += 1  # a lock it waited too long for: next pass
    return RetentionPass(**done)


def _purge(table: str, status: str, before: Any, progress: Progress | None) -> Op[int]:
    total = 0
    while True:
        row = yield Execute(
            "retention_purge",
            {"table": table, "status": status, "before": before, "limit": PURGE_BATCH},
            fetch="one",
        )
        deleted = int(row[0]) if row else 0
        total += deleted
        if progress is not None and deleted:
            progress(deleted)
        if deleted < PURGE_BATCH:
            return total


def claim(worker_id: str, seconds: float) -> Op[bool]:
    """Take or keep the maintenance turn for ``seconds``."""
    row = yield Execute(
        "maintenance_claim", {"worker_id": worker_id, "seconds": seconds}, fetch="one"
    )
    return bool(row and row[0])


def done(worker_id: str, error: str | None = None) -> Op[bool]:
    """Record the holder's finished pass (``error``: what failed)."""
    row = yield Execute("maintenance_done", {"worker_id": worker_id, "error": error}, fetch="one")
    return bool(row and row[0])


def release(worker_id: str) -> Op[None]:
    """Hand the maintenance turn on."""
    yield Execute("maintenance_release", {"worker_id": worker_id}, fetch="none")


def state() -> Op[dict[str, Any] | None]:
    """The maintenance row (who holds the turn, the last pass) for the doctor."""
    row = yield Execute("maintenance_state", {}, fetch="one", rows="dict")
    return dict(row) if row else None
