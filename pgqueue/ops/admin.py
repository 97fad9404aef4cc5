"""Changing jobs and queues: replay, requeue dead jobs, queue pause and limits
(cancels are in :mod:`pgqueue.ops.operator`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgqueue import validation
from pgqueue.commands import command
from pgqueue.durations import parse_duration
from pgqueue.errors import (
    DuplicateJob,
    InvalidDuration,
    InvalidJobState,
    InvalidOption,
    JobNotFound,
    PermissionDenied,
)
from pgqueue.ops import Execute, Op
from pgqueue.ops.inspect import _job_id
from pgqueue.queries import QueryName


def replay(
    job_id: int,
    queue: str | None = None,
    run_at: datetime | None = None,
    *,
    schema: str = "pgqueue",
) -> Op[int]:
    """Enqueue a copy of a job (any state) through the admin-only SQL function
    ``replay_job``; returns the new job's id (or the live duplicate's id when
    the copy's dedup key is taken). ``schema`` only words the refusal."""
    params = {
        "job_id": _job_id(job_id),
        "queue": validation.queue_name(queue) if queue is not None else None,
        "run_at": validation.aware("run_at", run_at) if run_at is not None else None,
    }
    return _replay(params, schema)


def _replay(params: dict[str, Any], schema: str) -> Op[int]:
    try:
        row = yield Execute("job_replay", params, fetch="one")
    except PermissionDenied as exc:
        raise PermissionDenied(_replay_refused(str(exc), schema), sqlstate=exc.sqlstate) from None
    if row is None:
        raise JobNotFound(params["job_id"])
    return int(row[0])


def _replay_refused(refusal: str, schema: str) -> str:
    """Why a producer or worker may not replay, and who may."""
    # The translated refusal ends in advice to grant the connected role its
    # kind again, which would not help here: keep only what the server said.
    said = refusal.split(": grant the role", 1)[0]
    return (
        f"replay is an admin action ({said}): producers and workers may not copy jobs; "
        f'replay as the owner of schema "{schema}" or as a role given '
        f"`{command('grant --role ROLE --admin', schema)}`"
    )


def requeue_dead(job_id: int) -> Op[None]:
    """Put one dead job back in its queue (one more attempt if its attempts ran out)."""
    return _requeue_one(_job_id(job_id))


def _requeue_one(job_id: int) -> Op[None]:
    rows = yield Execute(
        "job_requeue_dead", {"job_ids": [job_id], "queue": None, "task": None, "limit": 1}
    )
    if rows:
        return
    current = yield Execute("job_get", {"job_id": job_id}, fetch="one", rows="dict")
    if current is None:
        raise JobNotFound(job_id)
    if current["status"] != "dead" or current["archived"]:
        where = "archived " if current["archived"] else ""
        raise InvalidJobState(
            f"job {job_id} is {where}{current['status']}, not dead: nothing to requeue"
        )
    raise DuplicateJob(
        f"job {job_id} cannot be requeued: a live job in queue {current['queue']!r} "
        f"has the same dedup key {current['dedup_key']!r}"
    )


def requeue_dead_batch(
    job_ids: Sequence[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    limit: int = 1000,
) -> Op[list[int]]:
    """Requeue up to ``limit`` dead jobs, by ids or by queue/task filters;
    returns the ids requeued (call again until it returns fewer than ``limit``)."""
    params = {
        "job_ids": [_job_id(i) for i in job_ids] if job_ids is not None else None,
        "queue": validation.queue_name(queue) if queue is not None else None,
        "task": validation.task_name(task) if task is not None else None,
        "limit": validation.positive_int("limit", limit, 100_000),
    }
    return _requeue_batch(params)


def _requeue_batch(params: dict[str, Any]) -> Op[list[int]]:
    rows = yield Execute("job_requeue_dead", params)
    return [r[0] for r in rows]


def count_dead(queue: str | None = None, task: str | None = None) -> Op[int]:
    """How many dead jobs match the filters (what a bulk requeue would consider)."""
    params = {
        "queue": validation.queue_name(queue) if queue is not None else None,
        "task": validation.task_name(task) if task is not None else None,
    }
    return _count_dead(params)


def _count_dead(params: dict[str, Any]) -> Op[int]:
    row = yield Execute("job_dead_count", params, fetch="one")
    return int(row[0]) if row else 0


def set_paused(queue: str, paused: bool) -> Op[None]:
    """Pause or resume a queue on every worker."""
    return _execute_one(
        "queue_set_paused", {"queue": validation.queue_name(queue), "paused": paused}
    )


_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")


def parse_rate(rate: str) -> tuple[int, float]:
    """``"100/1m"`` -> (100, 60.0); ``"5/s"`` means per one second."""
    m = _RATE.match(rate) if isinstance(rate, str) else None
    if not m:
        raise InvalidOption(f"invalid rate {rate!r}: use COUNT/PERIOD, e.g. 100/1m or 10/s")
    count = validation.positive_int("rate count", int(m.group(1)))
    period_text = m.group(2)
    try:
        period = parse_duration("1" + period_text if period_text.isalpha() else period_text)
    except InvalidDuration as exc:
        raise InvalidOption(f"invalid rate {rate!r}: {exc}") from None
    if period.total_seconds() <= 0:
        raise InvalidOption(f"invalid rate {rate!r}: the period must be longer than zero")
    return count, period.total_seconds()


def set_limits(queue: str, concurrency: int | None = None, rate: str | None = None) -> Op[None]:
    """Set (or with None, lift) a queue's global concurrency and rate limits."""
    rate_limit, rate_period = parse_rate(rate) if rate is not None else (None, None)
    params = {
        "queue": validation.queue_name(queue),
        "concurrency": validation.positive_int("concurrency", concurrency)
        if concurrency is not None
        else None,
        "rate_limit": rate_limit,
        "rate_period": rate_period,
    }
    return _execute_one("queue_set_limits", params)


def _execute_one(query: QueryName, params: dict[str, Any]) -> Op[None]:
    yield Execute(query, params)
