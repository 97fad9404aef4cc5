"""The worker's side of the task registry: publish its tasks at start-up,
and keep the operators' live task settings (``pgqueue task set``) cached on
the App, refreshed on NOTIFY ``t:`` and with every registry heartbeat."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.ops import tasks as task_ops
from pgqueue.worker.wakeup import wait_any

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.worker")

_refreshing: set[asyncio.Task[bool]] = set()

#: Seconds between reloads of the live task settings.
REFRESH_INTERVAL = 5.0


async def publish(app: App, worker_id: str) -> None:
    """Publish the App's tasks and load the live settings."""
    await app.database.run_async(task_ops.publish(list(app.tasks.values()), worker_id))
    await refresh_settings(app)


async def refresh_settings(app: App) -> bool:
    """Reload every task's live settings into ``app.live_task_settings`` (in
    place: the executor holds that dict). False when the database refused."""
    try:
        fresh = await app.database.run_async(task_ops.all_settings())
    except DatabaseError as exc:
        log.debug("could not load live task settings; keeping the previous ones", error=str(exc))
        return False
    app.live_task_settings.clear()
    app.live_task_settings.update(fresh)
    return True


async def refresh_periodically(app: App, stopped: asyncio.Event) -> None:
    """Reload the live settings every REFRESH_INTERVAL seconds: the NOTIFY
    ``t:`` refresh covers changes at once, this covers a worker without LISTEN."""
    failing = False
    while not stopped.is_set():
        await wait_any(stopped, timeout=REFRESH_INTERVAL)
        if stopped.is_set():
            return
        ok = await refresh_settings(app)
        if not ok and not failing:
            log.warning("could not load live task settings; keeping the previous ones")
        failing = not ok


def refresh_soon(app: App) -> None:
    """Schedule a refresh (from a NOTIFY callback)."""
    task = asyncio.get_running_loop().create_task(refresh_settings(app))
    _refreshing.add(task)
    task.add_done_callback(_refreshing.discard)


async def settled() -> None:
    """Wait for refreshes in flight, so that a lease right after a settings
    change (NOTIFY ``t:`` comes before the jobs' ``j:``) runs with them."""
    if _refreshing:
        await asyncio.gather(*list(_refreshing), return_exceptions=True)
