"""An in-process worker for tests of execution hooks: run ``app``'s worker on
this thread's event loop until ``done(app)`` holds (bounded), then stop it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

import pgqueue

DEADLINE = 60.0


def run_until(app: pgqueue.App, done: Callable[[], bool], **options: Any) -> None:
    """Run a worker of ``app`` until ``done()`` (polled in a thread) is true."""

    async def scenario() -> None:
        stop = asyncio.Event()
        options.setdefault("poll_interval", 0.1)
        running = asyncio.create_task(app.run_worker_async(stop=stop, **options))
        deadline = time.monotonic() + DEADLINE
        try:
            while not await asyncio.to_thread(done):
                assert time.monotonic() < deadline, "the in-process worker did not finish in time"
                assert not running.done(), running.exception()
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(running, timeout=30)
            await app.close_async()

    asyncio.run(scenario())


def finished(app: pgqueue.App, *job_ids: int) -> Callable[[], bool]:
    """``done`` for :func:`run_until`: every job ended."""
    ends = {pgqueue.JobStatus.SUCCEEDED, pgqueue.JobStatus.DEAD, pgqueue.JobStatus.CANCELLED}
    return lambda: all(app.get_job(j).status in ends for j in job_ids)


@pytest.fixture
def quiet_structlog() -> Iterator[None]:
    """Stand for a service that set up structlog itself: the in-process worker
    leaves logging alone, and this process's logging stays as it was."""
    structlog.configure(
        processors=[structlog.processors.KeyValueRenderer()],
        logger_factory=structlog.PrintLoggerFactory(),
    )
    try:
        yield
    finally:
        structlog.reset_defaults()
