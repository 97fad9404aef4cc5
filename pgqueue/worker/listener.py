"""The worker's LISTEN connection: wakes the producer, forwards cancels.

It has a connection of its own (not from the pool), so that waiting for
notifications never holds up leasing or completing. When the connection
drops (or LISTEN fails on a transient error) it reconnects with backoff and
wakes the producer, which may have missed notifications meanwhile (it also
polls, so nothing waits forever). A non-transient error propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from pgqueue.worker.faults import Episodes

if TYPE_CHECKING:
    from pgqueue.database import Database

log = structlog.get_logger("pgqueue.worker")

RECONNECT_BACKOFF = (0.2, 10.0)
KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class Listener:
    """LISTENs through ``database``: ``on_message`` gets each payload,
    ``on_connected`` runs after each (re)connection; ``connected`` is set
    while the connection is up."""

    def __init__(
        self,
        database: Database,
        on_message: Callable[[str], None],
        on_connected: Callable[[], None],
        connected: asyncio.Event,
    ) -> None:
        self.database = database
        self.on_message = on_message
        self.on_connected = on_connected
        self.connected = connected
        self.episodes = Episodes(
            "listener",
            *RECONNECT_BACKOFF,
            message="notification connection lost; polling until it is back",
        )

    async def run(self) -> None:
        while True:
            try:
                async with self.database.listening_async(**KEEPALIVE) as payloads:
                    self.connected.set()
                    self.episodes.succeeded()
                    self.on_connected()
                    async for payload in payloads:
                        self.on_message(payload)
            except Exception as exc:
                self.connected.clear()
                await asyncio.sleep(self.episodes.failed(exc))
