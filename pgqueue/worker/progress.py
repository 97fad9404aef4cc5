"""``context.set_progress`` in a worker: at most one write per job per second,
and the last value always written (at the latest when the attempt ends)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.ops import consume

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.worker.executor import RunningJob

log = structlog.get_logger("pgqueue.worker")

#: Seconds between two writes of one job's progress.
INTERVAL = 1.0


class ProgressWriter:
    """Turns progress values into throttled, fenced writes (``set_progress``)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.loop = asyncio.get_running_loop()
        self.writes: set[asyncio.Task[Any]] = set()

    def note(self, rj: RunningJob, text: str) -> None:
        """A task's new value (validated JSON text); callable from any thread."""
        self.loop.call_soon_threadsafe(self._note, rj, text)

    def _note(self, rj: RunningJob, text: str) -> None:
        rj.progress_pending = text
        if rj.progress_timer is not None:
            return  # a write is due: it takes the latest value
        wait = INTERVAL - (time.monotonic() - rj.progress_written)
        if wait <= 0:
            self._write(rj)
        else:
            rj.progress_timer = self.loop.call_later(wait, self._write, rj)

    def flush(self, rj: RunningJob) -> None:
        """The attempt ended: write a value still waiting for its turn now."""
        if rj.progress_timer is not None:
            rj.progress_timer.cancel()
            self._write(rj)

    def _write(self, rj: RunningJob) -> None:
        rj.progress_timer = None
        text = rj.progress_pending
        if text is None:
            return
        rj.progress_pending = None
        rj.progress_written = time.monotonic()
        job = rj.job
        write = self.loop.create_task(self._store(job.job_id, job.attempt_id, text))
        self.writes.add(write)
        write.add_done_callback(self.writes.discard)

    async def _store(self, job_id: int, attempt_id: int, text: str) -> None:
        try:
            await self.database.run_async(consume.set_progress(job_id, attempt_id, text))
        except Exception as exc:  # progress is advisory: never fail the job for it
            log.warning("could not store job progress", job_id=job_id, error=repr(exc))

    async def drain(self) -> None:
        """Wait for the writes in flight (worker shutdown)."""
        if self.writes:
            await asyncio.gather(*self.writes, return_exceptions=True)
