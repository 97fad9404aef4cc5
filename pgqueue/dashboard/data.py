"""Everything the dashboard reads, through its App's operations, cached.

The reads are operations like every other read: the job lists are
:func:`pgqueue.ops.inspect.job_page` (the statements of ``list_jobs``), the
dashboard's own reads are :mod:`pgqueue.ops.dashboard`, and App runs them
(``app.job_page()``, ``app.queue_rows()``, ``app.throughput()``, ...) beside
the public methods the pages use as they are (job detail, explain,
schedules, workers, the task registry and its statistics). Each is bounded
however large the jobs table grows (see those modules). :class:`Data` shares
what they return between the browsers that ask at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pgqueue.models import Job, JobStatus, TaskInfo, TaskStats, UnknownTaskJobs, WorkerInfo
from pgqueue.ops.dashboard import (
    COUNT_CAP,
    DEAD_GROUP_SAMPLE,
    THROUGHPUT_HOUR_CAP,
    THROUGHPUT_PER_MINUTE,
    Count,
    CountKind,
    DeadGroup,
    HourTotal,
    MinuteCount,
    QueueRow,
    Throughput,
    parse_group_key,
)
from pgqueue.ops.dashboard import throughput as throughput_op
from pgqueue.ops.inspect import SEARCH_WINDOW, JobFilter, JobPage

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.workflow import WorkflowInfo

__all__ = [
    "COUNT_CAP",
    "DEAD_GROUP_SAMPLE",
    "PAGE_SIZE",
    "SEARCH_WINDOW",
    "TASK_STATS_SAMPLE",
    "TASK_STATS_WINDOW",
    "THROUGHPUT_HOUR_CAP",
    "THROUGHPUT_PER_MINUTE",
    "Count",
    "CountKind",
    "Data",
    "DeadGroup",
    "HourTotal",
    "JobFilter",
    "JobPage",
    "MinuteCount",
    "QueueRow",
    "TaskOverview",
    "TaskRow",
    "Throughput",
    "parse_group_key",
    "throughput_op",
    "visible_statuses",
]

T = TypeVar("T")

TASK_STATS_WINDOW = "24h"
"""The window of the tasks page's statistics (``pgqueue task stats`` default)."""
TASK_STATS_SAMPLE = 2_000
"""At most this many of the newest finished jobs are in that window (the
window starts later on a busy system; the page says so)."""
PAGE_SIZE = 50


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


class Data:
    """The dashboard's reads for one App (async).

    Reads of the list pages are shared for ``ttl`` seconds and never run
    twice at once: when a live update makes a hundred browsers refresh the
    same page, the database answers once. Any action clears the cache
    (:meth:`invalidate`), so its effect shows on the next page.
    """

    def __init__(self, app: App, ttl: float = 1.0) -> None:
        self.app = app
        self.ttl = ttl
        self._cache: dict[Hashable, tuple[float, Any]] = {}
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self.reads = 0  # database reads done (cache misses), for tests

    def invalidate(self) -> None:
        self._cache.clear()

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
        return await self._cached(("queues", finished), lambda: self.app.queue_rows_async(finished))

    async def queue_names(self) -> list[str]:
        names = await self._cached("queue_names", self.app.list_queues_async)
        return names[:1000]

    async def throughput(self) -> Throughput:
        # (The caps are read here, at the call, so that a test may lower them.)
        per_minute, hour_cap = THROUGHPUT_PER_MINUTE, THROUGHPUT_HOUR_CAP
        return await self._cached(
            "throughput", lambda: self.app.throughput_async(per_minute, hour_cap)
        )

    async def jobs(self, flt: JobFilter, cursor: str | None, limit: int = PAGE_SIZE) -> JobPage:
        if flt.tag is not None:  # (uncached, as list_jobs' pages)
            return await self.app.job_page_async(flt, cursor, limit)
        return await self._cached(
            ("jobs", flt, cursor, limit), lambda: self.app.job_page_async(flt, cursor, limit)
        )

    async def workflows(self, status: str | None) -> list[WorkflowInfo]:
        return await self.app.list_workflows_async(status=status, limit=PAGE_SIZE)

    async def workflow(self, workflow_id: int) -> WorkflowInfo:
        return await self.app.get_workflow_async(workflow_id)

    async def job(self, job_id: int) -> tuple[Job, str]:
        job = await self.app.get_job_async(job_id, history=True)
        return job, await self.app.explain_async(job_id)

    async def dead_groups(self) -> tuple[list[DeadGroup], bool]:
        return await self._cached(
            "dead_groups", lambda: self.app.dead_groups_async(DEAD_GROUP_SAMPLE)
        )

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
        await self.app.close_async_pool()

    async def change_mark(self) -> tuple[Any, ...]:
        """A tuple that changes whenever jobs, queues or workers change (uncached)."""
        return await self.app.change_mark_async()

    async def jobs_batch(self, flt: JobFilter, cursor: str | None, limit: int) -> JobPage:
        """A page of the jobs a bulk action works through (uncached)."""
        return await self.app.job_page_async(flt, cursor, limit)

    async def dead_group_batch(
        self, group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
    ) -> tuple[list[int], tuple[datetime, int] | None]:
        """The next ids of one dead-letter group (see :meth:`pgqueue.App.dead_group_batch`)."""
        return await self.app.dead_group_batch_async(group, cursor, scan)


def visible_statuses() -> list[str]:
    """The statuses the jobs filter offers."""
    return [s.value for s in JobStatus]
