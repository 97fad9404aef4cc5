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
    while the connection is up. With ``on_announce``, it also LISTENs on the
    announcement channel (pgqueue.worker.cursors) and hands its payloads
    there; ``on_lost`` runs when the connection drops."""

    def __init__(
        self,
        database: Database,
        on_message: Callable[[str], None],
        on_connected: Callable[[], None],
        connected: asyncio.Event,
        *,
        on_announce: Callable[[str], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.database = database
        self.on_message = on_message
        self.on_connected = on_connected
        self.connected = connected
        self.on_announce = on_announce
        self.on_lost = on_lost
        self.episodes = Episodes(
            "listener",
            *RECONNECT_BACKOFF,
            message="notification connection lost; polling until it is back",
        )

    async def run(self) -> None:
        while True:
            try:
                async with self.database.listening_async(
                    announcements=self.on_announce is not None, **KEEPALIVE
                ) as payloads:
                    self.connected.set()
                    self.episodes.succeeded()
                    self.on_connected()
                    async for announcement, payload in payloads:
                        if announcement:
                            if self.on_announce is not None:
                                self.on_announce(payload)
                        else:
                            self.on_message(payload)
            except Exception as exc:
                self.connected.clear()
                if self.on_lost is not None:
                    self.on_lost()
                await asyncio.sleep(self.episodes.failed(exc))
