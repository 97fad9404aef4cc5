"""Leases jobs up to the free capacity, in one statement per round.

It leases again at once while rounds come back full; otherwise it sleeps until
a notification for one of its queues, the poll interval, or the moment the
next scheduled job becomes due, whichever comes first.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from pgqueue.ops import OpContext, consume
from pgqueue.worker.cursors import LeaseCursors, LeaseKey, parse_announcement
from pgqueue.worker.faults import Episodes, is_transient
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.worker.executor import Executor
    from pgqueue.worker.settings import WorkerSettings
    from pgqueue.worker.task_settings import LiveTaskSettings

log = structlog.get_logger("pgqueue.worker")

ERROR_BACKOFF = (0.1, 5.0)


class Producer:
    """Leases for ``executor`` until ``stopping``; each lease waits for the
    refreshes of ``task_settings`` in flight."""

    def __init__(
        self,
        database: Database,
        ctx: OpContext,
        settings: WorkerSettings,
        executor: Executor,
        task_settings: LiveTaskSettings,
        stopping: asyncio.Event,
        lease_details: bool = False,
    ) -> None:
        self.database = database
        self.task_settings = task_settings
        self.lease_details = lease_details  # wait time and trace context, for metrics/tracing
        self.ctx = ctx
        self.episodes = Episodes("producer", *ERROR_BACKOFF)
        self.settings = settings
        self.executor = executor
        self.stopping = stopping
        self.wake = asyncio.Event()
        self.queues = list(settings.queues) if settings.queues is not None else None
        self._queue_set = set(settings.queues) if settings.queues is not None else None
        # Where each queue's next lease starts; active while the listener
        # hears the announcements of jobs that become ready behind them.
        self.cursors = LeaseCursors(self.queues)

    def notify(self, queue: str) -> None:
        """A notification said ``queue`` has new ready jobs (or changed settings)."""
        if self._queue_set is None or queue in self._queue_set:
            self.cursors.know(queue)
            self.wake.set()

    def announced(self, payload: str) -> None:
        """A job became ready at a lease order key (the announcement channel)."""
        parsed = parse_announcement(payload)
        if parsed is not None:
            self.cursors.rewind(*parsed)
            self.notify(parsed[0])  # a released serial job is announced only there

    async def run(self) -> None:
        ctx = self.ctx
        db = self.database
        executor = self.executor
        batch_size = self.settings.batch_size
        worker_id = self.settings.worker_id
        episodes = self.episodes
        settled = self.task_settings.settled
        cursors = self.cursors
        while not self.stopping.is_set():
            free = executor.free()
            if free <= 0:
                executor.capacity.clear()
                await wait_any(executor.capacity, self.stopping, timeout=None)
                continue
            want = min(free, batch_size)
            self.wake.clear()  # a notification during the lease makes the next wait return
            leased_at = time.monotonic()
            await settled()  # live task settings changed just now: apply them
            cursors.maybe_reset()
            try:
                if cursors.needs_discovery():
                    cursors.discovered_queues(await db.run_async(consume.ready_queues()))
                after = cursors.request()
                batch = await db.run_async(
                    consume.lease_batch(
                        ctx, self.queues, worker_id, want, details=self.lease_details, after=after
                    )
                )
            except Exception as exc:
                cursors.abandon()
                await wait_any(self.stopping, timeout=episodes.failed(exc))
                continue
            jobs = batch.jobs
            cursors.advance(
                (queue, LeaseKey.at(priority, run_at_us, job_id), ordered)
                for queue, priority, run_at_us, job_id, ordered in batch.keys
            )
            if episodes.failing:
                episodes.succeeded()
            if jobs:
                executor.start_many(jobs, leased_at)
                # Let the tasks just started run before this loop's next round trip.
                await asyncio.sleep(0)
            if len(jobs) == want:
                continue
            await wait_any(self.wake, self.stopping, timeout=await self._idle_timeout())

    async def _idle_timeout(self) -> float:
        """Poll interval, shortened to when the next scheduled job becomes due."""
        timeout = jittered(self.settings.poll_interval)
        try:
            due = await self.database.run_async(consume.next_due(self.queues))
        except Exception as exc:
            if not is_transient(exc):
                raise
            return timeout
        if due is not None:
            timeout = min(timeout, max(due, 0.001))
        return timeout
