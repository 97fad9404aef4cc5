"""Batched completion: acks, failures and hand-backs written in one round trip each.

A completion schedules a flush on the next loop iteration, so everything that
finishes in the same iteration (or while a flush is in flight) is written by
one statement; a lone job is written at once, without a timer. Writes that
fail on a transient database error are retried with backoff until they are
recorded or the database says the lease is gone: the fencing rules make a late
or repeated write harmless. A non-transient error stops the worker; the jobs
of that batch are then no longer extended, so the reaper reclaims them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.errors import LeaseLost
from pgqueue.ops import Op, OpContext, consume
from pgqueue.ops.consume import Failure
from pgqueue.worker.faults import Episodes

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.worker.executor import RunningJob

log = structlog.get_logger("pgqueue.worker")

MAX_STATEMENT_ROWS = 2000
RETRY_BACKOFF = (0.05, 5.0)


class Completer:
    """Buffers outcomes and writes them in batches. ``running`` is the
    executor's table of jobs whose attempt is not yet recorded: a job leaves
    it once its write went through (or was given up). ``on_fatal`` is told of
    a non-transient error (the worker then stops)."""

    def __init__(
        self,
        database: Database,
        ctx: OpContext,
        running: dict[int, RunningJob],
        on_fatal: Callable[[str, BaseException], None],
    ) -> None:
        self.database = database
        self.ctx = ctx
        self.running = running
        self.on_fatal = on_fatal
        self.episodes = Episodes("completer", *RETRY_BACKOFF)
        self.ack_ids: list[int] = []
        self.ack_attempts: list[int] = []
        self.ack_results: list[str | None] = []
        self.failures: list[Failure] = []
        self.failed_jobs: dict[int, tuple[str, str, int]] = {}  # for the "job is dead" line
        self.nacks: list[RunningJob] = []
        self._flushing = False
        self._scheduled = False
        self._task: asyncio.Task[None] | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self.loop = asyncio.get_running_loop()

    def ack(self, rj: RunningJob, result: str | None) -> None:
        job = rj.job
        self.ack_ids.append(job.job_id)
        self.ack_attempts.append(job.attempt_id)
        self.ack_results.append(result)
        self._kick()

    def fail(self, rj: RunningJob, failure: Failure) -> None:
        self.failures.append(failure)
        self.failed_jobs[failure.job_id] = (rj.job.task, rj.job.queue, rj.job.attempt)
        self._kick()

    def nack(self, rjs: list[RunningJob]) -> None:
        self.nacks.extend(rjs)
        self._kick()

    def pending(self) -> bool:
        return bool(self.ack_ids or self.failures or self.nacks)

    def _kick(self) -> None:
        # drained stays clear from here until a flush finds nothing pending.
        if not self._scheduled and not self._flushing:
            self.drained.clear()
            self._scheduled = True
            self.loop.call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if not self._flushing:
            self._flushing = True
            self._task = self.loop.create_task(self._flush_all())

    async def _flush_all(self) -> None:
        try:
            while self.pending():
                ids, attempts, results = self.ack_ids, self.ack_attempts, self.ack_results
                self.ack_ids, self.ack_attempts, self.ack_results = [], [], []
                failures, self.failures = self.failures, []
                nacks, self.nacks = self.nacks, []
                for start in range(0, len(ids), MAX_STATEMENT_ROWS):
                    end = start + MAX_STATEMENT_ROWS
                    await self._write_acks(ids[start:end], attempts[start:end], results[start:end])
                for start in range(0, len(failures), MAX_STATEMENT_ROWS):
                    await self._write_failures(failures[start : start + MAX_STATEMENT_ROWS])
                if nacks:
                    await self._write_nacks(nacks)
        finally:
            self._flushing = False
            if self.pending():
                self._kick()
            else:
                self.drained.set()

    async def _write_acks(
        self, ids: list[int], attempts: list[int], results: list[str | None]
    ) -> None:
        ctx = self.ctx
        await self._write(lambda: consume.ack_ids(ctx, ids, attempts, results), ids, "ack")

    async def _write_failures(self, failures: list[Failure]) -> None:
        ctx = self.ctx
        statuses = await self._write(
            lambda: consume.fail_many(ctx, failures), [f.job_id for f in failures], "fail"
        )
        for f in failures:
            task, queue, attempt = self.failed_jobs.pop(f.job_id, ("", "", 0))
            if (statuses or {}).get(f.job_id) == "dead":
                log.error(
                    "job is dead: " + ("permanent failure" if f.permanent else "no attempts left"),
                    job_id=f.job_id,
                    task=task,
                    queue=queue,
                    attempt=attempt,
                    error_code=f.error_code,
                )

    async def _write_nacks(self, rjs: list[RunningJob]) -> None:
        jobs = [rj.job for rj in rjs]
        ctx = self.ctx
        await self._write(lambda: consume.nack_many(ctx, jobs), [j.job_id for j in jobs], "nack")

    async def _write(self, make_op: Callable[[], Op[Any]], job_ids: list[int], what: str) -> Any:
        """Run a completion statement until it gets through and return what it
        returned (None after a LeaseLost, which names the jobs it could not
        record; the rest were)."""
        lost: list[int] = []
        result: Any = None
        while True:
            try:
                result = await self.database.run_async(make_op())
            except LeaseLost as exc:
                lost = exc.job_ids
            except Exception as exc:
                try:
                    delay = self.episodes.failed(exc)
                except Exception:
                    # Stop extending these leases: the reaper reclaims the jobs.
                    self._forget(job_ids)
                    self.on_fatal("completer", exc)
                    return
                await asyncio.sleep(delay)
                continue
            self.episodes.succeeded()
            break
        self._done(job_ids, lost, what)
        return result

    def _done(self, job_ids: list[int], lost: list[int], what: str) -> None:
        if lost:
            log.warning(
                "outcome not recorded: lease lost (reaped, or already recorded before a "
                "connection dropped)",
                job_ids=lost,
                write=what,
            )
        self._forget(job_ids)

    def _forget(self, job_ids: list[int]) -> None:
        pop = self.running.pop
        for job_id in job_ids:
            pop(job_id, None)

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything buffered is written; False on timeout."""
        try:
            await asyncio.wait_for(self.drained.wait(), timeout)
        except TimeoutError:
            return False
        return True
