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

The server reclaims a lease once it has been expired for
:data:`REAP_GRACE` seconds (by the database's clock), where a Python
worker's reaper takes it at once: an HTTP worker is a network away, and a
Python worker's reaper, when there is one, comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from pgqueue.ops import drain as drain_ops
from pgqueue.ops import maintenance as maintenance_ops
from pgqueue.worker.faults import Episodes
from pgqueue.worker.maintenance import INTERVAL as MAINTENANCE_INTERVAL
from pgqueue.worker.maintenance import maintain_periodically
from pgqueue.worker.wakeup import jittered, wait_any

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.ops import OpContext

log = logging.getLogger("pgqueue.http")

#: Seconds before a loop that failed starts again.
RESTART_PAUSE = 5.0
#: Seconds a lease stays expired before the server reclaims it.
REAP_GRACE = 5.0
GRACE = timedelta(seconds=REAP_GRACE)


def _at(moment: datetime) -> datetime:
    return moment


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
            self._run("reaper", lambda: self._reap_periodically(database, ctx))
        if self.maintenance:
            self._run(
                "maintenance",
                # Not in a hurry: the workers (or `pgqueue migrate`) made the leaves.
                lambda: maintain_periodically(
                    database, ctx, self.worker_id, self._stopped, first_ask=MAINTENANCE_INTERVAL
                ),
            )

    async def _reap_periodically(self, database: Database, ctx: OpContext) -> None:
        """Every ``reap_interval`` (jittered), reclaim the leases expired for
        :data:`REAP_GRACE` seconds; transient errors wait for the next round."""
        episodes = Episodes("reaper", first=min(self.reap_interval, 0.5), cap=60.0)
        pause = jittered(self.reap_interval, 0.2)
        while not self._stopped.is_set():
            await wait_any(self._stopped, timeout=pause)
            if self._stopped.is_set():
                return
            pause = jittered(self.reap_interval, 0.2)
            try:
                now = await database.run_async(drain_ops.clock())
                late = dataclasses.replace(ctx, clock=partial(_at, now - GRACE))
                reaped = await database.run_async(maintenance_ops.reap(late))
            except Exception as exc:
                pause = min(pause, episodes.failed(exc))
                continue
            episodes.succeeded()
            if reaped:
                log.warning("pgqueue serve: reclaimed %d jobs whose lease expired", reaped)

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
