"""``drain``: run the ready jobs in this process, as ``pgqueue worker`` would.

The jobs go through the worker's own parts, built by the worker's own
constructor from the same App (:meth:`pgqueue.worker.parts.JobParts.build`
of :meth:`~pgqueue.worker.parts.WorkerApp.of`): the executor (the App's
middleware around the task call, the timeout over both, dependency results,
Retry/Snooze/Permanent/exception classification, result encoding), the
completer (the same batched ack/fail statements, so retries, backoff,
dead-lettering and workflow releases are the database's), the heartbeat
(lease extension, ``context.extend``, cancel requests) and the progress
writer. Jobs are leased one at a time, so they run in queue order
(priority, run_at, id) and a test sees one outcome at a time.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pgqueue import validation
from pgqueue.errors import PgQueueError
from pgqueue.models import JobStatus
from pgqueue.ops import consume, operator
from pgqueue.worker.parts import JobParts, WorkerApp
from pgqueue.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from pgqueue.app import App

__all__ = ["DrainResult", "drain", "drain_async"]


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What one drain ran; every attempt it ran counts exactly once.

    - ``succeeded``: attempts that ended the job ``succeeded``.
    - ``failed``: attempts that failed and left the job to be retried
      (an exception with attempts left, ``Retry``, a timeout); the retries
      the drain ran count again.
    - ``dead``: attempts that dead-lettered the job (``Permanent``, no
      attempts left, a task this app does not know, a payload the task does
      not accept).
    - ``cancelled``: attempts that ended ``cancelled`` (cancel requested while
      they ran). Jobs cancelled before they ran are not counted.
    """

    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        """Attempts run."""
        return self.succeeded + self.failed + self.dead + self.cancelled


def drain(
    app: App,
    queue: str | Sequence[str] | None = None,
    *,
    with_scheduled: bool = False,
    max_jobs: int = 10_000,
) -> DrainResult:
    """Run ready jobs of ``queue`` (a name, names, or None: every queue) in
    this process until none is ready, and count their outcomes::

        checkout.enqueue(order_id=42)
        assert drain(app) == DrainResult(succeeded=2)   # checkout enqueued a receipt job

    The jobs run as under ``pgqueue worker``: the App's middleware wraps
    each task (its timeout covering both), ``context.dependency_results()``
    reads the results of a workflow step's dependencies, and the outcome is
    recorded by the worker's statements. Jobs that jobs enqueue run too,
    and so do retries that are due.
    ``with_scheduled=True`` also runs scheduled jobs and retries whose run_at
    is ahead: the drain's clock jumps to each next run_at (the database's
    clock override, which only the schema's owner may use); their attempts
    are then recorded at that time. (Leasing at that time also makes due the
    scheduled jobs of other queues, as any lease does.) At most ``max_jobs``
    attempts run (a
    job that enqueues itself forever stops there). Blocks; in async code
    use :func:`drain_async`.
    """
    coro = drain_async(app, queue, with_scheduled=with_scheduled, max_jobs=max_jobs)

    async def main() -> DrainResult:
        try:
            return await coro
        finally:
            await app.database.close_async_pool()  # its loop ends with asyncio.run

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    coro.close()
    raise RuntimeError("drain() blocks: in async code use `await drain_async(...)`")


async def drain_async(
    app: App,
    queue: str | Sequence[str] | None = None,
    *,
    with_scheduled: bool = False,
    max_jobs: int = 10_000,
) -> DrainResult:
    """Async twin of :func:`drain` (runs on the caller's event loop)."""
    queues = validation.queue_list([queue] if isinstance(queue, str) else queue)
    limit = validation.positive_int("max_jobs", max_jobs)
    clock = _JumpingClock() if with_scheduled else None
    worker_app = WorkerApp.of(app)  # what `pgqueue worker` reads of the App
    if clock is not None:
        worker_app = replace(worker_app, ctx=replace(worker_app.ctx, clock=clock))
    settings = WorkerSettings.build(
        queues,
        concurrency=1,
        listen=False,
        scheduler=False,
        install_signal_handlers=False,
        tune_gc=False,
        # A job of a task this app does not have cannot run here: dead, not handed back.
        unknown_task_grace=0.0,
        worker_id=f"drain:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}",
    )
    return await _Drain(worker_app, settings, clock).run(limit)


class _JumpingClock:
    """The drain's clock under ``with_scheduled``: the database's own until
    the first jump, then never behind the latest run_at jumped to."""

    def __init__(self) -> None:
        self.at: datetime | None = None

    def __call__(self) -> datetime | None:
        if self.at is None:
            return None
        return max(self.at, datetime.now(UTC))

    def jump(self, seconds_ahead: float) -> bool:
        """Move to now + ``seconds_ahead`` (+1 ms); False when that is not
        later than the last jump (the database ignored the clock)."""
        target = datetime.now(UTC) + timedelta(seconds=max(seconds_ahead, 0) + 0.001)
        if self.at is not None and target <= self.at:
            return False
        self.at = target
        return True


class _Drain:
    def __init__(
        self, app: WorkerApp, settings: WorkerSettings, clock: _JumpingClock | None
    ) -> None:
        self.app = app
        self.settings = settings
        self.queues = list(settings.queues) if settings.queues is not None else None
        self.clock = clock
        self.fatal: BaseException | None = None

    def _on_fatal(self, loop: str, exc: BaseException) -> None:
        self.fatal = self.fatal or exc

    async def run(self, limit: int) -> DrainResult:
        stopped = asyncio.Event()
        parts = JobParts.build(self.app, self.settings, on_fatal=self._on_fatal, stopped=stopped)
        heartbeat = parts.heartbeat
        await parts.live_settings.refresh()  # operators' task settings, as a worker's
        await heartbeat.register()
        beating = asyncio.create_task(heartbeat.run(), name="pgqueue-drain-heartbeat")
        try:
            counts = await self._loop(parts, limit, beating)
        finally:
            stopped.set()
            await asyncio.gather(beating, return_exceptions=True)
            await heartbeat.deregister()
            await parts.transactions.close()
            parts.executor.close()
            parts.observer.close()
        return counts

    async def _loop(self, parts: JobParts, limit: int, beating: asyncio.Task[None]) -> DrainResult:
        database, ctx = self.app.database, self.app.ctx
        executor, completer = parts.executor, parts.completer
        tally = dict.fromkeys(("succeeded", "failed", "dead", "cancelled"), 0)
        ran = 0
        while ran < limit:
            leased_at = time.monotonic()
            jobs = await database.run_async(
                consume.lease(ctx, self.queues, self.settings.worker_id, 1)
            )
            if not jobs:
                if await self._jump():
                    continue
                break
            executor.start_many(jobs, leased_at)
            await executor.idle.wait()
            await completer.drain()
            await parts.progress.drain()  # the last set_progress of the attempt
            if self.fatal is not None:
                raise self.fatal
            if beating.done() and beating.exception() is not None:
                raise beating.exception()  # type: ignore[misc]
            ids = [job.job_id for job in jobs]
            statuses = await database.run_async(operator.job_statuses(ids))
            for job_id in ids:
                tally[_outcome(statuses.get(job_id))] += 1
            ran += len(jobs)
        return DrainResult(**tally)

    async def _jump(self) -> bool:
        """with_scheduled: move the clock to the next scheduled job (or
        rate-limit slot); False when there is none."""
        if self.clock is None:
            return False
        due = await self.app.database.run_async(consume.next_due(self.queues))
        if due is None:
            return False
        if not self.clock.jump(due):
            raise PgQueueError(
                "drain(with_scheduled=True) could not make scheduled jobs due: the database "
                "ignores a client's clock unless the session's role owns the schema "
                f"{self.app.schema!r} (or the next one is in a paused, rate-limited queue)"
            )
        return True


def _outcome(status: str | None) -> str:
    if status in (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED):
        return str(status)
    # Queued or scheduled again: the attempt failed and the job will be retried.
    return "failed"
