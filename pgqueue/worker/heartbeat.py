"""Keeps leases alive and the worker registered.

Every tick it extends, in one statement, the leases of running jobs that are
past half their lease (or whose task asked via ``context.extend``), so a job
running longer than its lease is never reaped while this worker lives. A
refused extension means the lease was lost: the job is no longer ours.
Without a LISTEN connection it also polls for cancel requests.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.ops import Execute, Op, OpContext, consume
from pgqueue.version import __version__
from pgqueue.worker.faults import Episodes
from pgqueue.worker.wakeup import wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.worker.executor import Executor, RunningJob
    from pgqueue.worker.settings import WorkerSettings

log = structlog.get_logger("pgqueue.worker")

REGISTRY_INTERVAL = 5.0


def _upsert_worker(query: str, settings: WorkerSettings, token: str, tasks: list[str]) -> Op[bool]:
    """Register or heartbeat the worker's row (SECURITY DEFINER functions,
    0013); the database writes it only under this process's ``token``."""
    row = yield Execute(
        query,  # type: ignore[arg-type]
        {
            "worker_id": settings.worker_id,
            "token": token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(settings.queues) if settings.queues is not None else None,
            "concurrency": settings.concurrency,
            "tasks": tasks,
            "version": __version__,
            "pool": settings.pool,
        },
        fetch="one",
    )
    return row is None or row[0] is not False


def _deregister(worker_id: str, token: str) -> Op[None]:
    yield Execute("worker_deregister", {"worker_id": worker_id, "token": token}, fetch="none")


class Heartbeat:
    """Extends leases, polls cancels (without LISTEN) and refreshes the
    worker's registry row; rides out transient errors, raises the others.

    ``wake`` cuts a tick short: the executor sets it when a task calls
    ``context.extend``. ``listening`` says whether notifications arrive
    (else cancel requests are polled)."""

    def __init__(
        self,
        database: Database,
        ctx: OpContext,
        settings: WorkerSettings,
        executor: Executor,
        stopped: asyncio.Event,
        listening: Callable[[], bool],
        wake: asyncio.Event,
    ) -> None:
        self.database = database
        self.ctx = ctx
        self.settings = settings
        self.executor = executor
        self.stopped = stopped
        self.listening = listening
        self.wake = wake
        self.episodes = Episodes("heartbeat", first=0.05, cap=2.0)
        self.registry = Episodes("registry", first=0.5, cap=10.0)
        self.cancel_hints: set[int] = set()
        # Proves to the database that the worker row is this process's (0013).
        self.token = secrets.token_hex(24)

    def confirm_cancel(self, job_id: int) -> None:
        """A notification says ``job_id`` was asked to stop: check the
        database on the next tick (now) before stopping anything."""
        if job_id in self.executor.running:
            self.cancel_hints.add(job_id)
            self.wake.set()

    async def register(self) -> None:
        await self.database.run_async(
            _upsert_worker(
                "worker_register", self.settings, self.token, sorted(self.executor.tasks)
            )
        )

    async def deregister(self) -> None:
        try:
            await self.database.run_async(_deregister(self.settings.worker_id, self.token))
        except DatabaseError as exc:
            log.warning("could not deregister worker", error=str(exc))

    def _tick(self) -> float:
        leases = [rj.job.lease_seconds for rj in self.executor.running.values()]
        return max(0.05, min([self.settings.heartbeat_interval, *(s / 4 for s in leases)]))

    async def run(self) -> None:
        last_registry = time.monotonic()
        pause = 0.0
        while not self.stopped.is_set():
            await wait_any(self.wake, self.stopped, timeout=pause or self._tick())
            self.wake.clear()
            pause = 0.0
            try:
                await self._extend_due()
                if self.cancel_hints or not self.listening():
                    self.cancel_hints.clear()
                    await self._poll_cancels()
            except Exception as exc:
                # Never wait longer than a tick: leases must not run out meanwhile.
                pause = min(self.episodes.failed(exc), self._tick())
                continue
            self.episodes.succeeded()
            if time.monotonic() - last_registry >= REGISTRY_INTERVAL:
                try:
                    ours = await self.database.run_async(
                        _upsert_worker(
                            "worker_heartbeat",
                            self.settings,
                            self.token,
                            sorted(self.executor.tasks),
                        )
                    )
                    if not ours:
                        log.warning(
                            "worker row taken by another process with this worker_id",
                            worker_id=self.settings.worker_id,
                        )
                except Exception as exc:
                    pause = min(self.registry.failed(exc), self._tick())
                    continue
                self.registry.succeeded()
                last_registry = time.monotonic()

    async def _extend_due(self) -> None:
        now = time.monotonic()
        due: list[tuple[RunningJob, float, int]] = []
        for rj in self.executor.running.values():
            if rj.lost or rj.timed_out:
                continue
            if rj.extend_to is not None:
                due.append((rj, rj.extend_to, rj.extend_requests))
            elif rj.lease_deadline - now < rj.job.lease_seconds / 2:
                due.append((rj, float(rj.job.lease_seconds), rj.extend_requests))
        if not due:
            return
        sent_at = time.monotonic()
        held = await self.database.run_async(
            consume.extend_many(
                self.ctx, [(rj.job.job_id, rj.job.attempt_id, s) for rj, s, _ in due]
            )
        )
        for rj, seconds, requests in due:
            job_id = rj.job.job_id
            if job_id in held:
                rj.lease_deadline = sent_at + seconds
                if rj.extend_requests == requests:
                    rj.extend_to = None
                else:  # context.extend() was called during the round trip: send it next
                    self.wake.set()
                if held[job_id]:
                    self.executor.cancel(job_id)
            elif rj.handle is not None and not rj.handle.done():
                # Still executing, yet the database refused: the lease was reaped.
                self.executor.lose(job_id, rj.job.attempt_id)

    async def _poll_cancels(self) -> None:
        executing = [
            (rj.job.job_id, rj.job.attempt_id)
            for rj in self.executor.running.values()
            if rj.handle is not None and not rj.handle.done() and not rj.cancel_requested
        ]
        if not executing:
            return
        flags = await self.database.run_async(consume.cancel_flags(self.ctx, executing))
        for job_id, cancel, _held in flags:
            if cancel:
                self.executor.cancel(job_id)
