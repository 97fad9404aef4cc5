"""The worker's side of the task registry: publish its tasks at start-up,
and keep the operators' live task settings (``pgqueue task set``) cached on
the App, refreshed on NOTIFY ``t:`` and with every registry heartbeat."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.ops import tasks as task_ops

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.worker")

_refreshing: set[asyncio.Task[None]] = set()


async def publish(app: App, worker_id: str) -> None:
    """Publish the App's tasks and load the live settings."""
    await app.database.run_async(task_ops.publish(list(app.tasks.values()), worker_id))
    await refresh_settings(app)


async def refresh_settings(app: App) -> None:
    """Reload every task's live settings into ``app.live_task_settings``."""
    try:
        app.live_task_settings = await app.database.run_async(task_ops.all_settings())
    except DatabaseError as exc:
        log.warning("could not load live task settings; keeping the previous ones", error=str(exc))


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
