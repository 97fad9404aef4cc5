"""Cron schedules: define, inspect, run now, and the scheduler's firing step.

Fire times come from :mod:`pgqueue.cron`, computed from the database clock;
the database decides who fires (see ``schedule_fire_many``). Jobs are built
exactly like ``app.enqueue`` builds them (same validation, the enqueuing
App's task defaults) and go through ``enqueue_batch``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pgqueue import validation
from pgqueue.cron import Cron
from pgqueue.errors import (
    DuplicateSchedule,
    InvalidName,
    InvalidOption,
    ScheduleConflict,
    ScheduleNotFound,
)
from pgqueue.models import Enqueued, JobSpec, Schedule
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.ops.enqueue import job_object
from pgqueue.payloads import encode_batch
from pgqueue.queries import QueryName

MAX_NAME = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A scheduler whose previous look at the schedules is older than this was not
# really running (suspended, cut off from the database): what fell due since
# counts as missed and fires once.
MAX_WATCH_GAP = timedelta(seconds=60)
# Retries of a compare-and-set that lost to a concurrent change of the same schedule.
_RETRIES = 5


def schedule_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidName(f"invalid schedule name {name!r}: must be a non-empty string")
    if len(name) > MAX_NAME or _CONTROL.search(name):
        raise InvalidName(
            f"invalid schedule name {name[:80]!r}: at most {MAX_NAME} characters, "
            "no control characters"
        )
    if not validation.unicode_text(name):
        raise InvalidName(f"invalid schedule name {name[:80]!r}: {validation.NOT_UNICODE}")
    return name


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule definition (what ``add_schedule`` writes)."""

    name: str
    cron: Cron
    task: str
    payload: str  # JSON object
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    enabled: bool = True

    @classmethod
    def build(
        cls,
        ctx: OpContext,
        name: str,
        cron: str,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        timezone: str = "UTC",
        priority: int | None = None,
        max_attempts: int | None = None,
        enabled: bool = True,
    ) -> ScheduleSpec:
        """Validate everything; raises before anything is written."""
        if not isinstance(enabled, bool):
            raise InvalidOption(f"enabled must be True or False, got {enabled!r}")
        body = validation.payload_object(payload)
        encode_batch([{"payload": body}], ctx.max_payload_bytes)  # the same checks as enqueue
        return cls(
            name=schedule_name(name),
            cron=Cron.parse(cron, timezone),
            task=validation.task_name(task),
            payload=json.dumps(body, ensure_ascii=False, separators=(",", ":")),
            queue=validation.queue_name(queue) if queue is not None else None,
            priority=validation.priority(priority) if priority is not None else None,
            max_attempts=validation.positive_int("max_attempts", max_attempts)
            if max_attempts is not None
            else None,
            enabled=enabled,
        )


def _schedule(row: dict[str, Any]) -> Schedule:
    return Schedule(
        name=row["name"],
        cron=row["cron"],
        timezone=row["timezone"],
        task=row["task"],
        queue=row["queue"],
        payload=row["payload"],
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        enabled=row["enabled"],
        next_fire_at=row["next_fire_at"],
        last_fire_at=row["last_fire_at"],
        last_job_id=row["last_job_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _clock(ctx: OpContext) -> Op[datetime]:
    row = yield Execute("schedule_now", {"now": ctx.clock()}, fetch="one")
    return row[0]  # type: ignore[no-any-return]


def _get(name: str) -> Op[dict[str, Any]]:
    row = yield Execute("schedule_get", {"name": name}, fetch="one", rows="dict")
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return row  # type: ignore[no-any-return]


# --- definitions ---------------------------------------------------------------


def add_schedule(
    ctx: OpContext,
    name: str,
    cron: str,
    task: str,
    payload: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    timezone: str = "UTC",
    priority: int | None = None,
    max_attempts: int | None = None,
    enabled: bool = True,
    replace: bool = True,
) -> Op[Schedule]:
    """Create the schedule, or change it when ``replace`` (else
    DuplicateSchedule). Validates now, before any connection is taken."""
    spec = ScheduleSpec.build(
        ctx, name, cron, task, payload, queue=queue, timezone=timezone,
        priority=priority, max_attempts=max_attempts, enabled=enabled,
    )  # fmt: skip
    return _add(ctx, spec, replace)


def _add(
    ctx: OpContext, spec: ScheduleSpec, replace: bool, keep_enabled: bool = False
) -> Op[Schedule]:
    now = yield from _clock(ctx)
    params = {
        "name": spec.name,
        "cron": spec.cron.expression,
        "timezone": spec.cron.timezone,
        "task": spec.task,
        "queue": spec.queue,
        "payload": spec.payload,
        "priority": spec.priority,
        "max_attempts": spec.max_attempts,
        "enabled": spec.enabled,
        "next_fire_at": spec.cron.next_after(now) if spec.enabled else None,
        "replace": replace,
        "keep_enabled": keep_enabled,
    }
    if keep_enabled:
        # Through a function that never lets a worker rewrite an operator's schedule.
        del params["replace"], params["keep_enabled"]
        row = yield Execute("schedule_register_periodic", params, fetch="one", rows="dict")
    else:
        row = yield Execute("schedule_upsert", params, fetch="one", rows="dict")
    if row is not None:
        return _schedule(row)
    if not replace:
        raise DuplicateSchedule(
            f"a schedule named {spec.name!r} already exists: pass replace=True to "
            "overwrite it, or remove it first"
        )
    current = yield from _get(spec.name)  # nothing to change
    return _schedule(current)


def register_periodic(ctx: OpContext, specs: Sequence[ScheduleSpec]) -> Op[list[Schedule]]:
    """Create or update the schedules of ``@app.periodic`` tasks. The code
    owns their definition; whether one is enabled stays the operator's call."""
    done = []
    for spec in specs:
        done.append((yield from _add(ctx, spec, replace=True, keep_enabled=True)))
    return done


def list_schedules() -> Op[list[Schedule]]:
    """Every schedule, by name."""
    rows = yield Execute("schedule_list", {}, rows="dict")
    return [_schedule(r) for r in rows]


def get_schedule(name: str) -> Op[Schedule]:
    """One schedule by name; ScheduleNotFound when there is none."""
    return _get_schedule(schedule_name(name))


def _get_schedule(name: str) -> Op[Schedule]:
    row = yield from _get(name)
    return _schedule(row)


def enable_schedule(ctx: OpContext, name: str) -> Op[Schedule]:
    """Enable a schedule; it next fires at its first slot after now."""
    return _enable(ctx, schedule_name(name))


def _enable(ctx: OpContext, name: str) -> Op[Schedule]:
    for _ in range(_RETRIES):
        row = yield from _get(name)
        now = yield from _clock(ctx)
        following = Cron.parse(row["cron"], row["timezone"]).next_after(now)
        params = {
            "name": name,
            "cron": row["cron"],
            "timezone": row["timezone"],
            "next_fire_at": following,
        }
        updated = yield Execute("schedule_enable", params, fetch="one", rows="dict")
        if updated is not None:
            return _schedule(updated)
    raise ScheduleConflict(f"schedule {name!r} kept changing while being enabled; try again")


def disable_schedule(name: str) -> Op[Schedule]:
    """Disable a schedule: it does not fire until enabled again."""
    return _update_one("schedule_disable", schedule_name(name))


def _update_one(query: QueryName, name: str) -> Op[Schedule]:
    row = yield Execute(query, {"name": name}, fetch="one", rows="dict")
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return _schedule(row)


def remove_schedule(name: str) -> Op[None]:
    """Delete a schedule (the jobs it enqueued stay)."""
    return _remove(schedule_name(name))


def _remove(name: str) -> Op[None]:
    row = yield Execute("schedule_remove", {"name": name}, fetch="one")
    if row is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")


def _job(ctx: OpContext, row: dict[str, Any], run_at: datetime | None) -> dict[str, Any]:
    spec = JobSpec(
        row["task"],
        row["payload"],
        queue=row["queue"],
        priority=row["priority"],
        run_at=run_at,
        max_attempts=row["max_attempts"],
    )
    return job_object(ctx, spec)


def run_schedule_now(ctx: OpContext, name: str) -> Op[Enqueued]:
    """Enqueue one job of the schedule now; its fire times do not change."""
    return _run_now(ctx, schedule_name(name))


def _run_now(ctx: OpContext, name: str) -> Op[Enqueued]:
    for _ in range(_RETRIES):
        row = yield from _get(name)
        doc = encode_batch([_job(ctx, row, None)], ctx.max_payload_bytes)
        params = {"name": name, "revision": row["revision"], "jobs": doc}
        done = yield Execute("schedule_run_now", params, fetch="one")
        if done is not None:
            return Enqueued(done[0], done[1])
    raise ScheduleConflict(f"schedule {name!r} kept changing while being run; try again")


# --- the scheduler's step ----------------------------------------------------------


@dataclass(slots=True)
class Fired:
    """One schedule fired by this scheduler: its fire times and new job ids."""

    name: str
    fire_times: list[datetime]
    job_ids: list[int]


@dataclass(slots=True)
class Tick:
    """What one scheduler step did and when the next one is needed.

    ``now`` is the database clock the step used; ``next_due`` the earliest
    fire time still ahead (None: no enabled schedule); ``again`` asks for
    another step at once (more were due than one step takes, or another
    scheduler changed a schedule under this one).
    """

    now: datetime
    next_due: datetime | None
    fired: list[Fired] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    again: bool = False


_FIRE_COLUMNS = (
    "names", "due_at", "revisions", "created_at", "next_fire_at", "last_fire_at", "jobs"
)  # fmt: skip


def fire_due(ctx: OpContext, watched_since: datetime | None, limit: int = 100) -> Op[Tick]:
    """Fire every due schedule (up to ``limit``). ``watched_since``: the
    database time of this scheduler's previous step (None when starting)."""
    rows = yield Execute("schedule_due", {"now": ctx.clock(), "limit": limit}, rows="dict")
    now: datetime = rows[0]["now"]
    tick = Tick(now=now, next_due=rows[0]["next_due"])
    if watched_since is not None and now - watched_since > MAX_WATCH_GAP:
        watched_since = None
    due = [r for r in rows if r["name"] is not None]
    plans: dict[str, tuple[list[datetime], datetime]] = {}
    batch: list[tuple[Any, ...]] = []  # one _FIRE_COLUMNS tuple per schedule
    for row in due:
        try:
            cron = Cron.parse(row["cron"], row["timezone"])
            times, following = cron.plan(row["next_fire_at"], now, watched_since)
            doc = encode_batch([_job(ctx, row, t) for t in times], ctx.max_payload_bytes)
        except ValueError as exc:  # a row written by hand, or a time zone tzdata dropped
            tick.broken[row["name"]] = str(exc)
            continue
        plans[row["name"]] = (times, following)
        compare = (row["name"], row["next_fire_at"], row["revision"], row["created_at"])
        batch.append((*compare, following, times[-1], doc))
    if batch:
        columns = zip(*batch, strict=True)  # transposed: one array per statement parameter
        arrays = {name: list(values) for name, values in zip(_FIRE_COLUMNS, columns, strict=True)}
        fired = yield Execute("schedule_fire_many", arrays)
        for name, job_ids in fired:
            times, following = plans.pop(name)
            tick.fired.append(Fired(name, times, list(job_ids)))
            if tick.next_due is None or following < tick.next_due:
                tick.next_due = following
    # Look again at once when more were due than one step takes, or when
    # another scheduler fired or changed some of these under this one.
    tick.again = bool(plans) or (len(due) >= limit and bool(tick.fired))
    return tick
