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

Without ``with_scheduled`` a drain runs what was due when it began and what
is enqueued for now while it runs, never a job whose time came while it ran
(the retry or snooze of a job it ran, a job delayed a little): what it runs
does not depend on how long its jobs take. A job that is not the drain's but
stands in a queue before one that is (a retry due at once, ahead of a job
enqueued after it) is held leased, unrun, until the drain ends and then
handed back (its history shows a ``released`` attempt, not counted). The
cut-off is read, not the database's clock override: it works for any role
that may run a worker.
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
from pgqueue.database import async_pools
from pgqueue.errors import LeaseLost, PgQueueError
from pgqueue.models import AttemptOutcome, JobStatus, LeasedJob
from pgqueue.ops import consume, operator
from pgqueue.ops import drain as drain_ops
from pgqueue.worker.parts import JobParts, WorkerApp
from pgqueue.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from pgqueue.app import App

__all__ = ["DrainResult", "drain", "drain_async"]

#: Seconds a held job's lease is extended to: longer than any drain.
HOLD_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What one drain ran; every attempt it ran counts exactly once.

    - ``succeeded``: attempts that ended the job ``succeeded``.
    - ``failed``: attempts that failed and left the job to be retried
      (an exception with attempts left, ``Retry``, a timeout); with
      ``with_scheduled=True`` the retries the drain ran count again.
    - ``dead``: attempts that dead-lettered the job (``Permanent``, no
      attempts left, a task this app does not know, a payload the task does
      not accept).
    - ``cancelled``: attempts that ended ``cancelled`` (cancel requested while
      they ran). Jobs cancelled before they ran are not counted.
    - ``snoozed``: attempts that raised :class:`pgqueue.Snooze` and left the
      job queued again without spending an attempt.
    - ``slept``: attempts that ended in ``context.sleep`` (the job is
      scheduled for its wake-up; ``with_scheduled=True`` runs it then).
    - ``waited``: attempts that ended waiting for an event
      (``context.wait_for_event``; the job runs again once it is sent).
    """

    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    snoozed: int = 0
    slept: int = 0
    waited: int = 0

    @property
    def total(self) -> int:
        """Attempts run (each outcome above counts one)."""
        return (
            self.succeeded
            + self.failed
            + self.dead
            + self.cancelled
            + self.snoozed
            + self.slept
            + self.waited
        )


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
    recorded by the worker's statements.

    It runs the jobs that were due when it began, and the jobs enqueued for
    now while it runs (by the jobs it runs, or as workflow steps whose
    dependencies it ran), until none is left; not a retry or snooze of a job
    it ran, nor a job scheduled for later whose time comes while it runs, so
    what it runs does not depend on how long the jobs take. Call it again
    to run the retries that are due by then. ``with_scheduled=True`` runs
    those too, and every scheduled job and retry, however far ahead: the
    drain's clock jumps to each next run_at (the database's clock override,
    which only the schema's owner may use); their attempts are then recorded
    at that time. (Leasing at that time also makes due the scheduled jobs
    of other queues, as any lease does.) At most ``max_jobs`` attempts run
    (a job that enqueues itself forever stops there). Blocks; in async code
    use :func:`drain_async`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("drain() blocks: in async code use `await drain_async(...)`")
    drainer = _Drain.of(app, queue, with_scheduled=with_scheduled, max_jobs=max_jobs)

    async def main() -> DrainResult:
        async with async_pools(drainer.database):  # its loop ends with asyncio.run
            return await drainer.run()

    return asyncio.run(main())


async def drain_async(
    app: App,
    queue: str | Sequence[str] | None = None,
    *,
    with_scheduled: bool = False,
    max_jobs: int = 10_000,
) -> DrainResult:
    """Async twin of :func:`drain` (runs on the caller's event loop)."""
    return await _Drain.of(app, queue, with_scheduled=with_scheduled, max_jobs=max_jobs).run()


#: Attempt outcomes that leave the job to run again without spending an attempt.
_NOT_SPENT = (AttemptOutcome.SNOOZED, AttemptOutcome.SLEPT, AttemptOutcome.WAITED)


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
        self, app: WorkerApp, settings: WorkerSettings, clock: _JumpingClock | None, limit: int
    ) -> None:
        self.app = app
        #: The driver the drain's own reads go through (the parts get theirs from ``app``).
        self.database = app.database
        self.ctx = app.ctx
        self.limit = limit
        self.settings = settings
        self.queues = list(settings.queues) if settings.queues is not None else None
        self.clock = clock
        #: When the drain began (server clock); None under with_scheduled (no cut-off).
        self.since: datetime | None = None
        #: Leased to clear the way to a job of the drain's, never run; handed back at the end.
        self.held: list[LeasedJob] = []
        self.fatal: BaseException | None = None

    @classmethod
    def of(
        cls,
        app: App,
        queue: str | Sequence[str] | None,
        *,
        with_scheduled: bool,
        max_jobs: int,
    ) -> _Drain:
        """A drain of ``app`` (arguments checked here, before anything runs)."""
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
        return cls(worker_app, settings, clock, limit)

    def _on_fatal(self, loop: str, exc: BaseException) -> None:
        self.fatal = self.fatal or exc

    async def run(self) -> DrainResult:
        limit, database = self.limit, self.database
        if self.clock is None:
            self.since = await database.run_async(drain_ops.clock())
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
            try:
                await self._hand_back()
            finally:
                await heartbeat.deregister()
                await parts.transactions.close()
                parts.executor.close()
                parts.observer.close()
        return counts

    async def _loop(self, parts: JobParts, limit: int, beating: asyncio.Task[None]) -> DrainResult:
        executor, completer = parts.executor, parts.completer
        tally = dict.fromkeys(
            ("succeeded", "failed", "dead", "cancelled", "snoozed", "slept", "waited"), 0
        )
        ran = 0
        while ran < limit:
            jobs, leased_at = await self._lease()
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
            for outcome in await self._outcomes(jobs):
                tally[outcome] += 1
            ran += len(jobs)
        return DrainResult(**tally)

    async def _lease(self) -> tuple[list[LeasedJob], float]:
        """The next job to run (leased), and when its lease was asked for."""
        database, ctx, worker_id = self.database, self.ctx, self.settings.worker_id
        if self.since is None:  # with_scheduled: whatever is ready at the drain's clock
            leased_at = time.monotonic()
            jobs = await database.run_async(consume.lease(ctx, self.queues, worker_id, 1))
            return jobs, leased_at
        passed: set[str] = set()  # queues whose lease came back empty (a limit, a serial key)
        while True:
            heads = await database.run_async(drain_ops.queue_heads(self.queues, self.since))
            head = next((h for h in heads if h.queue not in passed), None)
            if head is None:
                return [], 0.0
            leased_at = time.monotonic()
            jobs = await database.run_async(consume.lease(ctx, [head.queue], worker_id, 1))
            if not jobs:
                passed.add(head.queue)
                continue
            [job] = jobs
            # The lease takes the head but for a serial key or a limit the read missed.
            if job.job_id == head.job_id:
                due = head.due
            else:
                due = await database.run_async(drain_ops.is_due(job.job_id, self.since))
            if due:
                return jobs, leased_at
            await self._hold(job)

    async def _hold(self, job: LeasedJob) -> None:
        """Keep a job that is not the drain's out of the way of those behind
        it: leased, unrun, until the drain ends."""
        self.held.append(job)
        lease = (job.job_id, job.attempt_id, HOLD_SECONDS)
        await self.database.run_async(consume.extend_many(self.ctx, [lease]))

    async def _hand_back(self) -> None:
        """Give the held jobs back to their queues, at their old place."""
        held, self.held = self.held, []
        if not held:
            return
        try:
            await self.database.run_async(consume.nack_many(self.ctx, held))
        except LeaseLost:
            pass  # reaped meanwhile: queued again already

    async def _outcomes(self, jobs: list[LeasedJob]) -> list[str]:
        """How each attempt ended, as DrainResult counts it."""
        database = self.database
        statuses = await database.run_async(operator.job_statuses([j.job_id for j in jobs]))
        final = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)
        again = [j.attempt_id for j in jobs if statuses.get(j.job_id) not in final]
        recorded = await database.run_async(drain_ops.attempt_outcomes(again)) if again else {}
        outcomes = []
        for job in jobs:
            status = statuses.get(job.job_id)
            if status in final:
                outcomes.append(str(status))
            elif recorded.get(job.attempt_id) in _NOT_SPENT:
                outcomes.append(str(recorded[job.attempt_id]))
            else:  # queued or scheduled again: the attempt failed, the job will be retried
                outcomes.append("failed")
        return outcomes

    async def _jump(self) -> bool:
        """with_scheduled: move the clock to the next scheduled job (or
        rate-limit slot); False when there is none."""
        if self.clock is None:
            return False
        due = await self.database.run_async(consume.next_due(self.queues))
        if due is None:
            return False
        if not self.clock.jump(due):
            raise PgQueueError(
                "drain(with_scheduled=True) could not make scheduled jobs due: the database "
                "ignores a client's clock unless the session's role owns the schema "
                f"{self.app.schema!r} (or the next one is in a paused, rate-limited queue)"
            )
        return True
