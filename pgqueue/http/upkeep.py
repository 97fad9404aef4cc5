"""The server's share of the fleet's upkeep: the reaper and the maintenance
election, as a ``pgqueue worker`` runs them.

A deployment whose only workers speak HTTP (a Node worker, say) runs no
Python worker, so without this nothing would reclaim the jobs of a worker
that died mid-lease, nor apply retention. ``pgqueue serve`` therefore reaps
every ``reap_interval`` seconds and asks for the maintenance turn like any
worker (``--no-reaper`` / ``--no-maintenance`` opt out, for a fleet whose
Python workers do it). Both run as the server's own database user, on its
pool. An error that escapes a loop is logged and the loop starts again
after a pause: upkeep never stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pgqueue.worker.maintenance import maintain_periodically
from pgqueue.worker.reaper import reap_periodically

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.ops import OpContext

log = logging.getLogger("pgqueue.http")

#: Seconds before a loop that failed starts again.
RESTART_PAUSE = 5.0


def server_id() -> str:
    """This server's name in the maintenance election (and the doctor)."""
    return f"http:{socket.gethostname()}:{os.getpid()}"


class Upkeep:
    """The reaper and maintenance loops of one server."""

    def __init__(self, *, reaper: bool, maintenance: bool, reap_interval: float) -> None:
        self.reaper = reaper
        self.maintenance = maintenance
        self.reap_interval = reap_interval
        self.worker_id = server_id()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, database: Database, ctx: OpContext) -> None:
        """Start the loops this server takes part in (on the running loop)."""
        self._stopped.clear()
        if self.reaper:
            self._run(
                "reaper",
                lambda: reap_periodically(database, ctx, self.reap_interval, self._stopped),
            )
        if self.maintenance:
            self._run(
                "maintenance",
                lambda: maintain_periodically(database, ctx, self.worker_id, self._stopped),
            )

    def _run(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        async def supervised() -> None:
            while not self._stopped.is_set():
                try:
                    await loop()
                except Exception:
                    log.exception("pgqueue serve: %s failed; starting it again", name)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopped.wait(), RESTART_PAUSE)

        self._tasks.append(asyncio.create_task(supervised(), name=f"pgqueue-http-{name}"))

    async def stop(self) -> None:
        """End the loops (maintenance hands its turn on) and wait for them."""
        self._stopped.set()
        tasks, self._tasks = self._tasks, []
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
