"""The worker's LISTEN connection: wakes the producer, forwards cancels.

It has a connection of its own (not from the pool), so that waiting for
notifications never holds up leasing or completing. When the connection
drops it reconnects with backoff and wakes the producer, which may have
missed notifications meanwhile (it also polls, so nothing waits forever).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg
import structlog
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.database import connection_params
from pgqueue.errors import DatabaseError
from pgqueue.queries import channel_for

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.worker")

RECONNECT_BACKOFF = (0.2, 10.0)
KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class Listener:
    def __init__(
        self, app: App, on_message: Callable[[str], None], on_connected: Callable[[], None]
    ) -> None:
        self.app = app
        self.on_message = on_message
        self.on_connected = on_connected
        self.connected = asyncio.Event()

    async def run(self) -> None:
        delay = RECONNECT_BACKOFF[0]
        channel = sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(self.app.schema)))
        while True:
            conn: psycopg.AsyncConnection[object] | None = None
            try:
                # listen_dsn: a direct connection when a transaction pooler is in the path.
                conn = await psycopg.AsyncConnection.connect(
                    make_conninfo(
                        connection_params(self.app.listen_dsn or self.app.dsn), **KEEPALIVE
                    ),
                    autocommit=True,
                )
                await conn.execute(channel)
                self.connected.set()
                if delay > RECONNECT_BACKOFF[0]:
                    log.info("listening again for notifications")
                delay = RECONNECT_BACKOFF[0]
                self.on_connected()
                async for note in conn.notifies():
                    self.on_message(note.payload)
            except (psycopg.Error, DatabaseError, OSError) as exc:
                self.connected.clear()
                log.warning(
                    "notification connection lost; polling until it is back",
                    error=str(exc).strip(),
                    retry_in=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_BACKOFF[1])
            finally:
                if conn is not None:
                    await conn.close()
