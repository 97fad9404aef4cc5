"""The fleet's maintenance: one worker at a time applies retention.

Every worker that runs maintenance (the default; ``pgqueue worker
--no-maintenance`` opts out) asks the database for the maintenance turn
every :data:`INTERVAL` seconds (``maintenance_claim``). The holder renews
its turn with each ask and runs a pass (:func:`pgqueue.ops.retention.run_pass`);
the others do nothing. A turn not renewed for :data:`TURN_SECONDS` lapses,
so when the holder dies another worker takes over within a minute; a worker
that stops hands its turn on at once. The election is a row of the
database, so any number of workers on any number of hosts agree.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from pgqueue.ops import OpContext, retention
from pgqueue.worker.faults import Episodes
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database

log = structlog.get_logger("pgqueue.worker")

#: Seconds between two asks for the turn (and two passes of its holder).
INTERVAL = 10.0
#: A turn lapses this long after its last renewal: another worker takes over.
TURN_SECONDS = 45.0


async def maintain_periodically(
    database: Database,
    ctx: OpContext,
    worker_id: str,
    stopped: asyncio.Event,
    first_ask: float = 1.0,
) -> None:
    """Ask for the turn and, holding it, run a pass, until ``stopped``; the
    first ask ``first_ask`` seconds after start (jittered). Errors (a lock,
    a lost connection, missing grants) are logged and tried again later:
    maintenance never stops the worker."""
    episodes = Episodes("maintenance", first=1.0, cap=60.0)
    holding = False
    pause = jittered(first_ask, 0.5)  # a worker asks soon: a fresh fleet needs leaves
    try:
        while not stopped.is_set():
            await wait_any(stopped, timeout=pause)
            if stopped.is_set():
                return
            pause = jittered(INTERVAL, 0.2)
            try:
                holding = await database.run_async(retention.claim(worker_id, TURN_SECONDS))
                if not holding:
                    continue
                done = await database.run_async(retention.run_pass(ctx))
                await database.run_async(retention.done(worker_id))
            except Exception as exc:
                pause = min(max(pause, episodes.failed(exc)), 60.0)
                if holding:
                    await _record_failure(database, worker_id, exc)
                continue
            episodes.succeeded()
            if done.leaves_dropped or done.jobs or done.archived_jobs or done.skipped:
                log.info(
                    "maintenance pass",
                    jobs_deleted=done.jobs,
                    archived_jobs_deleted=done.archived_jobs,
                    leaves_created=done.leaves_created,
                    leaves_dropped=done.leaves_dropped,
                    steps_skipped=done.skipped,
                )
    finally:
        if holding:
            try:
                await database.run_async(retention.release(worker_id))
            except Exception:  # the next holder takes the lapsed turn
                pass


async def _record_failure(database: Database, worker_id: str, exc: BaseException) -> None:
    try:
        await database.run_async(retention.done(worker_id, f"{type(exc).__name__}: {exc}"))
    except Exception:
        pass
