"""The worker's side of the task registry: publish its tasks at start-up,
and keep the operators' live task settings (``pgqueue task set``) cached in
a :class:`LiveTaskSettings` of its own, refreshed on NOTIFY ``t:`` and every
``REFRESH_INTERVAL`` seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.ops import tasks as task_ops
from pgqueue.worker.wakeup import wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.models import TaskSettings
    from pgqueue.ops.tasks import PublishedTask

log = structlog.get_logger("pgqueue.worker")

#: Seconds between reloads of the live task settings.
REFRESH_INTERVAL = 5.0


class LiveTaskSettings:
    """The operators' live task settings, as this worker last read them.

    ``current`` maps a task name to its settings; it is one dict for the
    worker's whole life, updated in place (the executor holds it)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.current: dict[str, TaskSettings] = {}
        self.refreshing: set[asyncio.Task[bool]] = set()

    async def publish(self, tasks: Iterable[PublishedTask], worker_id: str) -> None:
        """Publish ``tasks`` as ``worker_id``'s and load the live settings."""
        await self.database.run_async(task_ops.publish(list(tasks), worker_id))
        await self.refresh()

    async def refresh(self) -> bool:
        """Reload every task's live settings into ``current``. False when the
        database refused (the previous settings stay)."""
        try:
            fresh = await self.database.run_async(task_ops.all_settings())
        except DatabaseError as exc:
            log.debug(
                "could not load live task settings; keeping the previous ones", error=str(exc)
            )
            return False
        self.current.clear()
        self.current.update(fresh)
        return True

    async def refresh_periodically(self, stopped: asyncio.Event) -> None:
        """Reload every REFRESH_INTERVAL seconds until ``stopped``: the NOTIFY
        ``t:`` refresh covers changes at once, this covers a worker without LISTEN."""
        failing = False
        while not stopped.is_set():
            await wait_any(stopped, timeout=REFRESH_INTERVAL)
            if stopped.is_set():
                return
            ok = await self.refresh()
            if not ok and not failing:
                log.warning("could not load live task settings; keeping the previous ones")
            failing = not ok

    def refresh_soon(self) -> None:
        """Schedule a refresh (from a NOTIFY callback)."""
        task = asyncio.get_running_loop().create_task(self.refresh())
        self.refreshing.add(task)
        task.add_done_callback(self.refreshing.discard)

    async def settled(self) -> None:
        """Wait for refreshes in flight, so that a lease right after a settings
        change (NOTIFY ``t:`` comes before the jobs' ``j:``) runs with them."""
        if self.refreshing:
            await asyncio.gather(*list(self.refreshing), return_exceptions=True)
