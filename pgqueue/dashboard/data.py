"""Everything the dashboard reads from the database, in one place.

Each read is bounded however large the jobs table grows: counts stop at
:data:`COUNT_CAP` (beyond it an estimate is shown, marked approximate: the
counting of ``app.metrics()``, :func:`pgqueue.ops.inspect.queue_counts`),
lists are keyset pages through an index, aggregates sample the newest rows
of one partial index. The statements live in
``sql/queries/dashboard.sql``; the public App methods are used wherever one
already does the job (job detail, explain, schedules, workers, the task
registry and its statistics).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar, cast

from pgqueue import validation
from pgqueue.errors import InvalidOption
from pgqueue.models import Job, JobStatus, TaskInfo, TaskStats, UnknownTaskJobs, WorkerInfo
from pgqueue.ops import Execute, Op
from pgqueue.ops.inspect import (
    _STORED,
    QueueCounts,
    decode_cursor,
    encode_cursor,
    job_from_row,
    queue_counts,
    stages,
)

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.workflow import WorkflowInfo

T = TypeVar("T")

COUNT_CAP = 10_000
"""Counts stop here; past it the dashboard shows "10,000+" or an estimate."""
SEARCH_WINDOW = 5_000
"""Rows a free-text search page reads at most (newest ids first)."""
TASK_STATS_WINDOW = "24h"
"""The window of the tasks page's statistics (``pgqueue task stats`` default)."""
TASK_STATS_SAMPLE = 2_000
"""At most this many of the newest finished jobs are in that window (the
window starts later on a busy system; the page says so)."""
DEAD_GROUP_SAMPLE = 2_000
"""Newest dead jobs the dead-letter groups are computed over."""
PAGE_SIZE = 50

CountKind = Literal["exact", "capped", "estimate"]


@dataclass(frozen=True, slots=True)
class Count:
    """A count that may be capped or estimated (then shown as such)."""

    value: int
    kind: CountKind = "exact"

    def __str__(self) -> str:
        if self.kind == "capped":
            return f"{self.value:,}+"
        if self.kind == "estimate":
            return "≈" + _short(self.value)
        return f"{self.value:,}"


def _short(value: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if value >= size:
            return f"{value / size:.1f}{unit}".replace(".0", "")
    return str(value)


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue on the overview and the queues page (the shape of
    ``pgqueue status --json`` with counts that may be capped)."""

    queue: str
    queued: Count
    scheduled: Count
    running: Count
    succeeded: Count
    dead: Count
    cancelled: Count
    oldest_ready_age_seconds: float | None
    paused: bool
    concurrency_limit: int | None
    rate_limit: str | None

    def as_json(self) -> dict[str, Any]:
        """``pgqueue status --json`` fields, plus which counts are approximate."""
        counts = ("queued", "scheduled", "running", "succeeded", "dead", "cancelled")
        out: dict[str, Any] = {"queue": self.queue}
        out.update({name: getattr(self, name).value for name in counts})
        out["oldest_ready_age_seconds"] = self.oldest_ready_age_seconds
        out["paused"] = self.paused
        out["concurrency_limit"] = self.concurrency_limit
        out["rate_limit"] = self.rate_limit
        out["approximate"] = {
            name: getattr(self, name).kind for name in counts if getattr(self, name).kind != "exact"
        }
        return out


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of the jobs list; ``next_cursor`` continues it (None: the end).
    A search page also says how far down it looked (``searched_to_id``)."""

    jobs: list[Job]
    next_cursor: str | None
    searched_to_id: int | None = None


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead jobs sharing a task, an error code and a message fingerprint."""

    task: str
    error_code: str
    fingerprint: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample_job_id: int
    sample_message: str
    queues: list[str]

    @property
    def key(self) -> str:
        """The group's identity in URLs and forms."""
        return json.dumps([self.task, self.error_code, self.fingerprint], separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task on the tasks page: the registry's view of it
    (:meth:`pgqueue.App.list_tasks`: declared defaults, live settings,
    limits, live workers, running count), its run statistics
    (:meth:`pgqueue.App.task_stats`) and, when no live worker knows it, its
    waiting jobs (:meth:`pgqueue.App.unknown_tasks`)."""

    task: str
    stats: TaskStats | None
    info: TaskInfo | None
    unknown: UnknownTaskJobs | None
    registered_here: bool

    @property
    def success_rate(self) -> float | None:
        """Succeeded jobs over jobs that ended succeeded or dead."""
        if self.stats is None:
            return None
        ended = self.stats.succeeded + self.stats.dead
        return self.stats.succeeded / ended if ended else None


@dataclass(frozen=True, slots=True)
class TaskOverview:
    """The tasks page: a row per task, where the statistics window began and
    whether it was shortened to the newest :data:`TASK_STATS_SAMPLE` jobs."""

    rows: list[TaskRow]
    window_start: datetime | None
    sampled: bool

    def as_json(self) -> dict[str, Any]:
        """The CLI's ``--json`` shapes: ``task stats`` (a dict by task),
        ``task list`` (a list) and the unknown tasks of ``status``."""
        return {
            "stats": {r.task: r.stats for r in self.rows if r.stats is not None},
            "tasks": [r.info for r in self.rows if r.info is not None],
            "unknown_tasks": [r.unknown for r in self.rows if r.unknown is not None],
            "window_start": self.window_start,
            "sampled": self.sampled,
        }


# --- operations (driven by Data below) ------------------------------------------


def _rate_text(limit: int | None, period_seconds: float | None) -> str | None:
    if limit is None or period_seconds is None:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if period_seconds >= size and period_seconds % size == 0:
            return f"{limit}/{int(period_seconds // size)}{unit}"
    return f"{limit}/{period_seconds:g}s"


def queues_op(finished: bool = True) -> Op[list[QueueRow]]:
    """Every queue with its (capped or estimated) counts and controls, as
    ``app.metrics()`` counts them; ``finished=False`` leaves the scheduled
    and finished counts at zero (the queues page shows only what is live)."""
    found = yield from queue_counts(None, COUNT_CAP, finished)

    def count(q: QueueCounts, status: str) -> Count:
        if status in q.capped:
            return Count(COUNT_CAP, "capped")
        return Count(q.counts[status], "estimate" if status in q.estimated else "exact")

    return [
        QueueRow(
            queue=q.queue,
            queued=count(q, "queued"),
            scheduled=count(q, "scheduled"),
            running=count(q, "running"),
            succeeded=count(q, "succeeded"),
            dead=count(q, "dead"),
            cancelled=count(q, "cancelled"),
            oldest_ready_age_seconds=q.row["oldest_ready_age_seconds"],
            paused=q.row["paused"],
            concurrency_limit=q.row["concurrency_limit"],
            rate_limit=_rate_text(q.row["rate_limit"], q.row["rate_period_seconds"]),
        )
        for q in found[:1000]
    ]


THROUGHPUT_PER_MINUTE = 100
"""Finished jobs per minute and outcome the throughput chart counts exactly;
a busier minute is estimated from the rate of its first ones."""
THROUGHPUT_HOUR_CAP = COUNT_CAP
"""Finished jobs per outcome the hour's totals count exactly; past it the
total is an estimate (the sum of the minutes), never below the cap."""


class MinuteCount(NamedTuple):
    """Jobs finished in one minute; an outcome that reached
    :data:`THROUGHPUT_PER_MINUTE` is estimated (at least that many)."""

    minute: int  # epoch seconds of its start
    succeeded: int
    dead: int
    succeeded_estimated: bool = False
    dead_estimated: bool = False

    @property
    def estimated(self) -> bool:
        return self.succeeded_estimated or self.dead_estimated


@dataclass(frozen=True, slots=True)
class HourTotal:
    """Jobs of one outcome finished in the last hour: ``value`` is exact
    unless ``estimated``; ``at_least`` is always an exact lower bound."""

    value: int
    at_least: int
    estimated: bool = False

    def __str__(self) -> str:
        if not self.estimated:
            return f"{self.value:,}"
        return f"≈{self.value:,} (at least {self.at_least:,})"

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value, "at_least": self.at_least, "estimated": self.estimated}


@dataclass(frozen=True, slots=True)
class Throughput:
    """The overview's chart (one entry per minute, oldest first) and totals."""

    minutes: list[MinuteCount]
    succeeded: HourTotal
    dead: HourTotal
    hour_cap: int  # the totals are exact below it


def _per_minute(seen: int, span: float | None, seconds: float) -> tuple[int, bool]:
    if seen < THROUGHPUT_PER_MINUTE:
        return seen, False
    # The first THROUGHPUT_PER_MINUTE jobs of the minute took ``span`` seconds
    # from its start: a rough rate (bursts make it wrong either way), never
    # below what was seen.
    return max(seen, round(seen * seconds / max(span or 0.0, 0.001))), True


def _hour_total(counted: int, minutes: list[tuple[int, bool]]) -> HourTotal:
    """Exact when the hour's own count stayed below its cap (even if some
    minutes were estimated); else the sum of the minutes, at least the cap."""
    if counted < THROUGHPUT_HOUR_CAP:
        return HourTotal(counted, counted)
    seen = sum(min(n, THROUGHPUT_PER_MINUTE) if est else n for n, est in minutes)
    at_least = max(counted, seen)
    return HourTotal(max(at_least, sum(n for n, _ in minutes)), at_least, estimated=True)


def throughput_op() -> Op[Throughput]:
    """Each of the last 60 minutes (the current one so far) and the hour's totals."""
    rows = yield Execute(
        "dashboard_throughput",
        {"per_minute": THROUGHPUT_PER_MINUTE, "hour_cap": THROUGHPUT_HOUR_CAP},
        rows="dict",
    )
    minutes = []
    for r in rows:
        ok, ok_est = _per_minute(r["succeeded_seen"], r["succeeded_span"], r["seconds"])
        dead, dead_est = _per_minute(r["dead_seen"], r["dead_span"], r["seconds"])
        minutes.append(MinuteCount(int(r["minute"]), ok, dead, ok_est, dead_est))
    first = rows[0] if rows else {"hour_succeeded": 0, "hour_dead": 0}
    succeeded = [(m.succeeded, m.succeeded_estimated) for m in minutes]
    dead_minutes = [(m.dead, m.dead_estimated) for m in minutes]
    return Throughput(
        minutes,
        _hour_total(first["hour_succeeded"], succeeded),
        _hour_total(first["hour_dead"], dead_minutes),
        THROUGHPUT_HOUR_CAP,
    )


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The filters of the jobs list (and of bulk actions on what it matches)."""

    queue: str | None = None
    status: str | None = None
    task: str | None = None
    q: str | None = None
    tag: str | None = None

    @classmethod
    def parse(cls, values: Any) -> JobFilter:
        """From query or form values; empty strings mean "any". Raises
        InvalidOption naming a bad value."""

        def get(name: str) -> str | None:
            value = values.get(name)
            return value.strip() or None if isinstance(value, str) else None

        queue, status, task, q = get("queue"), get("status"), get("task"), get("q")
        tag = get("tag")
        if tag is not None:
            validation.tags([tag])
        if queue is not None:
            validation.queue_name(queue)
        if task is not None:
            validation.task_name(task)
        if status is not None and status not in _STORED:
            raise InvalidOption(f"unknown status {status!r}: one of {', '.join(_STORED)}")
        if q is not None and len(q) > 200:
            raise InvalidOption("search text is longer than 200 characters")
        return cls(queue, status, task, q, tag)

    def params(self) -> dict[str, str]:
        """The non-empty filters, for links and hidden form fields."""
        return {
            k: v
            for k, v in (
                ("queue", self.queue),
                ("status", self.status),
                ("task", self.task),
                ("q", self.q),
                ("tag", self.tag),
            )
            if v
        }


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


FINISHED = ("succeeded", "dead", "cancelled")


def _encode_finished_cursor(finished_at: datetime | None, job_id: int) -> str:
    text = f"f:{finished_at.isoformat() if finished_at else ''}|{job_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_finished_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, rest = text.partition(":")
        when, _, job_id = rest.partition("|")
        if kind != "f":
            raise ValueError(kind)
        return datetime.fromisoformat(when), int(job_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidOption(
            f"invalid cursor {cursor!r}: pass a next_cursor of the same listing"
        ) from None


def list_jobs_op(flt: JobFilter, cursor: str | None, limit: int = PAGE_SIZE) -> Op[JobPage]:
    """A keyset page of jobs, newest first (see dashboard.sql for the bounds)."""
    before_id = decode_cursor(cursor) if cursor and flt.status not in FINISHED else None
    stored, due = _STORED[flt.status] if flt.status else (None, None)
    params: dict[str, Any] = {
        "queue": flt.queue,
        "task": flt.task,
        "stored_statuses": stored,
        "stored_stages": stages(stored),
        "due": due,
        "before_id": before_id,
        "limit": limit + 1,
    }
    if flt.status in FINISHED and flt.q is None:
        after = _decode_finished_cursor(cursor) if cursor else None
        rows = yield Execute(
            "dashboard_job_list_finished",
            {
                "status": flt.status,
                "queue": flt.queue,
                "task": flt.task,
                "before_finished": after[0] if after else None,
                "before_id": after[1] if after else None,
                "limit": limit + 1,
            },
            rows="dict",
        )
        jobs = [job_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit and jobs[-1].finished_at is not None
        return JobPage(
            jobs, _encode_finished_cursor(jobs[-1].finished_at, jobs[-1].id) if more else None
        )
    if stored is not None and flt.q is None:
        rows = yield Execute("dashboard_job_list", params, rows="dict")
        jobs = [job_from_row(r) for r in rows[:limit]]
        return JobPage(jobs, encode_cursor(jobs[-1].id) if len(rows) > limit else None)
    params["pattern"] = _like(flt.q) if flt.q else None
    params["window"] = SEARCH_WINDOW
    rows = yield Execute("dashboard_job_search", params, rows="dict")
    jobs = [job_from_row(r) for r in rows[:limit]]
    if len(rows) > limit:
        return JobPage(jobs, encode_cursor(jobs[-1].id))
    floor = yield Execute(
        "dashboard_search_floor", {"before_id": before_id, "window": SEARCH_WINDOW}, fetch="one"
    )
    lowest, examined = floor if floor else (None, 0)
    if lowest is None or examined < SEARCH_WINDOW or lowest <= 1:
        return JobPage(jobs, None, lowest)
    return JobPage(jobs, encode_cursor(lowest), lowest)


def dead_groups_op() -> Op[tuple[list[DeadGroup], bool]]:
    """Dead-letter groups over the newest dead jobs; True when the sample was full."""
    rows = yield Execute("dashboard_dead_groups", {"cap": DEAD_GROUP_SAMPLE}, rows="dict")
    groups = [DeadGroup(**r) for r in rows]
    return groups, sum(g.count for g in groups) >= DEAD_GROUP_SAMPLE


def parse_group_key(key: str) -> tuple[str, str, str]:
    """(task, error code, fingerprint) from :attr:`DeadGroup.key`."""
    try:
        task, code, fingerprint = json.loads(key)
        if not all(isinstance(v, str) for v in (task, code, fingerprint)):
            raise ValueError(key)
    except (ValueError, TypeError):
        raise InvalidOption(f"invalid dead-letter group {key!r}") from None
    return task, code, fingerprint


def dead_group_batch_op(
    group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
) -> Op[tuple[list[int], tuple[datetime, int] | None]]:
    """The ids of one group among the next ``scan`` dead jobs of its task, and
    the cursor after them (None when the task has no more dead jobs)."""
    task, code, fingerprint = group
    rows = yield Execute(
        "dashboard_dead_group_ids",
        {
            "task": task,
            "after_finished": cursor[0] if cursor else None,
            "after_id": cursor[1] if cursor else None,
            "limit": scan,
        },
        rows="dict",
    )
    ids = [r["id"] for r in rows if r["error_code"] == code and r["fingerprint"] == fingerprint]
    after = (rows[-1]["finished_at"], rows[-1]["id"]) if len(rows) == scan else None
    return ids, after


def _rows_op(query: Any, params: dict[str, Any] | None = None) -> Op[list[Any]]:
    rows = yield Execute(query, params or {})
    return list(rows)


def change_mark_op() -> Op[tuple[Any, ...]]:
    """A tuple that changes whenever jobs, queues or workers change."""
    row = yield Execute("dashboard_change_mark", {}, fetch="one")
    return tuple(row or ())


# --- async facade --------------------------------------------------------------


class Data:
    """The dashboard's reads for one App (async).

    Reads of the list pages are shared for ``ttl`` seconds and never run
    twice at once: when a live update makes a hundred browsers refresh the
    same page, the database answers once. Any action clears the cache
    (:meth:`invalidate`), so its effect shows on the next page.
    """

    def __init__(self, app: App, ttl: float = 1.0) -> None:
        self.app = app
        # The dashboard's own statements (dashboard.sql) run here and nowhere
        # else in the dashboard, on the App's pools; everything else goes
        # through App's public methods.
        self._database = app.database
        self.ttl = ttl
        self._cache: dict[Hashable, tuple[float, Any]] = {}
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self.reads = 0  # database reads done (cache misses), for tests

    def invalidate(self) -> None:
        self._cache.clear()

    async def _shared(self, key: Hashable, op: Callable[[], Op[T]]) -> T:
        return await self._cached(key, lambda: self._database.run_async(op()))

    async def _cached(self, key: Hashable, fetch: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > loop.time():
            return cast(T, hit[1])
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > loop.time():
                return cast(T, hit[1])
            self.reads += 1
            value = await fetch()
            if len(self._cache) > 1000:  # many distinct filters: start over
                self._cache.clear()
            self._cache[key] = (loop.time() + self.ttl, value)
            return value

    async def queues(self, finished: bool = True) -> list[QueueRow]:
        return await self._shared(("queues", finished), lambda: queues_op(finished))

    async def queue_names(self) -> list[str]:
        rows = await self._shared("queue_names", lambda: _rows_op("dashboard_queue_names"))
        return [r[0] for r in rows]

    async def throughput(self) -> Throughput:
        return await self._shared("throughput", throughput_op)

    async def jobs(self, flt: JobFilter, cursor: str | None, limit: int = PAGE_SIZE) -> JobPage:
        if flt.tag is not None:
            # Jobs having the tag: list_jobs' keyset pages over the tag index.
            page = await self.app.list_jobs_async(
                flt.queue, flt.status, flt.task, limit, cursor, tags=[flt.tag]
            )
            return JobPage(page.jobs, page.next_cursor)
        return await self._shared(
            ("jobs", flt, cursor, limit), lambda: list_jobs_op(flt, cursor, limit)
        )

    async def workflows(self, status: str | None) -> list[WorkflowInfo]:
        return await self.app.list_workflows_async(status=status, limit=PAGE_SIZE)

    async def workflow(self, workflow_id: int) -> WorkflowInfo:
        return await self.app.get_workflow_async(workflow_id)

    async def job(self, job_id: int) -> tuple[Job, str]:
        job = await self.app.get_job_async(job_id, history=True)
        return job, await self.app.explain_async(job_id)

    async def dead_groups(self) -> tuple[list[DeadGroup], bool]:
        return await self._shared("dead_groups", dead_groups_op)

    async def tasks(self) -> TaskOverview:
        return await self._cached("tasks", self._tasks)

    async def _tasks(self) -> TaskOverview:
        app = self.app
        stats, infos, unknown = await asyncio.gather(
            app.task_stats_async(since=TASK_STATS_WINDOW, sample=TASK_STATS_SAMPLE),
            app.list_tasks_async(),
            app.unknown_tasks_async(),
        )
        by_info = {i.name: i for i in infos}
        by_unknown = {u.task: u for u in unknown}
        names = sorted(set(stats) | set(by_info) | set(by_unknown) | set(app.tasks))
        rows = [
            TaskRow(n, stats.get(n), by_info.get(n), by_unknown.get(n), n in app.tasks)
            for n in names
        ]
        starts = [s.window_start for s in stats.values() if s.window_start is not None]
        start = min(starts) if starts else None
        finished = sum(s.succeeded + s.dead + s.cancelled for s in stats.values())
        return TaskOverview(rows, start, finished >= TASK_STATS_SAMPLE)

    async def workers(self) -> list[WorkerInfo]:
        return await self._cached("workers", self.app.list_workers_async)

    async def close(self) -> None:
        """Close the App's async pool (it belongs to the event loop now ending)."""
        await self._database.close_async_pool()

    async def change_mark(self) -> tuple[Any, ...]:
        """A tuple that changes whenever jobs, queues or workers change (uncached)."""
        return await self._database.run_async(change_mark_op())

    async def jobs_batch(self, flt: JobFilter, cursor: str | None, limit: int) -> JobPage:
        """A page of the jobs a bulk action works through (uncached)."""
        return await self._database.run_async(list_jobs_op(flt, cursor, limit))

    async def dead_group_batch(
        self, group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
    ) -> tuple[list[int], tuple[datetime, int] | None]:
        """The next ids of one dead-letter group (see :func:`dead_group_batch_op`)."""
        return await self._database.run_async(dead_group_batch_op(group, cursor, scan))


def visible_statuses() -> list[str]:
    """The statuses the jobs filter offers."""
    return [s.value for s in JobStatus]
