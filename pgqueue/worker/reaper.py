"""Periodic maintenance inside every worker: the reaper, and forgetting
workers that have been silent for long. Safe with any number of workers
(the reap statement uses SKIP LOCKED)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from pgqueue.ops import Execute, Op, OpContext, maintenance
from pgqueue.worker.faults import Episodes
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database

log = structlog.get_logger("pgqueue.worker")

STALE_WORKER_SECONDS = 3600.0
STALE_WORKER_CHECK = 300.0


def _prune_stale_workers(seconds: float) -> Op[list[str]]:
    rows = yield Execute("worker_prune_stale", {"seconds": seconds})
    return [r[0] for r in rows]


async def reap_periodically(
    database: Database, ctx: OpContext, interval: float, stopped: asyncio.Event
) -> None:
    """Reap every ``interval`` seconds (jittered) until ``stopped``; transient
    errors wait for the next round (sooner after a failure), others propagate."""
    episodes = Episodes("reaper", first=min(interval, 0.5), cap=max(interval, 5.0))
    last_prune = 0.0
    pause = jittered(interval, 0.2)
    while not stopped.is_set():
        await wait_any(stopped, timeout=pause)
        if stopped.is_set():
            return
        pause = jittered(interval, 0.2)
        try:
            reaped = await database.run_async(maintenance.reap(ctx))
            if reaped:
                log.warning("reaped jobs whose lease expired", count=reaped)
            if time.monotonic() - last_prune > STALE_WORKER_CHECK:
                gone = await database.run_async(_prune_stale_workers(STALE_WORKER_SECONDS))
                if gone:
                    log.info("forgot workers silent for over an hour", workers=gone)
                last_prune = time.monotonic()
        except Exception as exc:
            pause = min(pause, episodes.failed(exc))
            continue
        episodes.succeeded()
