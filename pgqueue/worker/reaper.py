"""Periodic maintenance inside every worker: the reaper, and forgetting
workers that have been silent for long. Safe with any number of workers
(the reap statement uses SKIP LOCKED)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.ops import Execute, Op
from pgqueue.telemetry.errors import count_database_error
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.worker")

STALE_WORKER_SECONDS = 3600.0
STALE_WORKER_CHECK = 300.0


def _prune_stale_workers(seconds: float) -> Op[list[str]]:
    rows = yield Execute("worker_prune_stale", {"seconds": seconds})
    return [r[0] for r in rows]


async def reap_periodically(app: App, interval: float, stopped: asyncio.Event) -> None:
    last_prune = 0.0
    while not stopped.is_set():
        await wait_any(stopped, timeout=jittered(interval, 0.2))
        if stopped.is_set():
            return
        try:
            reaped = await app.reap_async()
            if reaped:
                log.warning("reaped jobs whose lease expired", count=reaped)
            if time.monotonic() - last_prune > STALE_WORKER_CHECK:
                gone = await app.database.run_async(_prune_stale_workers(STALE_WORKER_SECONDS))
                if gone:
                    log.info("forgot workers silent for over an hour", workers=gone)
                last_prune = time.monotonic()
        except DatabaseError as exc:
            count_database_error(exc)
            log.warning("reaper failed; retrying next round", error=str(exc))
