"""The cron scheduler that runs inside every worker (unless ``--no-scheduler``).

It registers the App's ``@app.periodic`` schedules, then repeats: fire what is
due, sleep until the earliest next fire time. Any number of workers may run
it at once: who fires a slot is decided by the database (see
``schedule_fire_many``), never by state held here. The only state kept here
is when this scheduler last looked, so that slots it was merely late for fire
one by one while slots missed before it ran fire once.

A NOTIFY ``s:<name>`` (sent by a trigger when a schedule is added, changed or
removed) wakes it early; ``MAX_SLEEP`` bounds the sleep for setups without
LISTEN and for notifications lost while reconnecting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from pgqueue.ops import OpContext, schedules
from pgqueue.worker.faults import Episodes
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database

log = structlog.get_logger("pgqueue.scheduler")

MAX_SLEEP = 30.0  # seconds, when notifications wake the scheduler
MAX_SLEEP_POLLING = 5.0  # seconds, when the App does not LISTEN
# Asyncio may wake a hair early; the step after that would find nothing due.
OVERSLEEP = 0.002
AGAIN_PAUSE = 0.02  # before looking again after losing a schedule to another scheduler
ERROR_BACKOFF = (0.5, 10.0)


async def run_scheduler(
    database: Database,
    ctx: OpContext,
    periodic: Sequence[schedules.ScheduleSpec],
    stopped: asyncio.Event,
    wake: asyncio.Event | None = None,
) -> None:
    """Register the ``periodic`` schedules, then fire due schedules until
    ``stopped`` is set. ``wake``, set when a notification says a schedule
    changed, cuts a sleep short; without it (no LISTEN) sleeps are shorter, so
    that changes are still seen soon. Transient database errors are ridden
    out; others propagate."""
    longest = MAX_SLEEP if wake is not None else MAX_SLEEP_POLLING
    wake = wake if wake is not None else asyncio.Event()
    if not await _register(database, ctx, periodic, stopped):
        return
    watched_since: datetime | None = None
    reported: dict[str, str] = {}
    episodes = Episodes("scheduler", *ERROR_BACKOFF)
    while not stopped.is_set():
        wake.clear()  # a change notified while this step runs wakes the next sleep
        try:
            tick = await database.run_async(schedules.fire_due(ctx, watched_since))
        except Exception as exc:
            await wait_any(stopped, timeout=episodes.failed(exc))
            continue
        episodes.succeeded()
        watched_since = tick.now
        _report(tick, reported)
        if tick.again:
            pause = jittered(AGAIN_PAUSE, 0.5)
        elif tick.next_due is None:
            pause = longest
        else:
            pause = min(longest, (tick.next_due - tick.now).total_seconds() + OVERSLEEP)
        await wait_any(stopped, wake, timeout=max(0.0, pause))


async def _register(
    database: Database,
    ctx: OpContext,
    periodic: Sequence[schedules.ScheduleSpec],
    stopped: asyncio.Event,
) -> bool:
    """Create or update the ``@app.periodic`` schedules; False when stopped first."""
    if not periodic:
        return True
    episodes = Episodes("scheduler", *ERROR_BACKOFF)
    while not stopped.is_set():
        try:
            registered = await database.run_async(schedules.register_periodic(ctx, periodic))
        except Exception as exc:
            await wait_any(stopped, timeout=episodes.failed(exc))
            continue
        episodes.succeeded()
        log.info("periodic schedules registered", schedules=[s.name for s in registered])
        return True
    return False


def _report(tick: schedules.Tick, reported: dict[str, str]) -> None:
    for fired in tick.fired:
        log.info(
            "schedule fired",
            schedule=fired.name,
            fire_times=[t.isoformat() for t in fired.fire_times],
            job_ids=fired.job_ids,
        )
    for name, error in tick.broken.items():
        if reported.get(name) != error:  # once per schedule and problem, not every step
            log.error("schedule cannot fire; fix or remove it", schedule=name, error=error)
            reported[name] = error
