"""The database of one App: its two connection pools and the drivers over them.

The library's SQL executes in the drivers (:mod:`pgqueue.driver_async`, and
:mod:`pgqueue.driver_sync` generated from it) and nowhere else but in four
modules, each on connections of its own:

- :mod:`pgqueue.migrate`: Alembic runs the schema's migrations (DDL in one
  transaction, under Alembic's own connection handling);
- :mod:`pgqueue.grants`: GRANT statements built for a role, shown to an
  operator (``--dry-run``) before they run;
- :mod:`pgqueue.subscribe`: the App's one LISTEN connection for
  ``app.subscribe()``, held by a thread of its own across event loops;
- :mod:`pgqueue.http.api`: ``pgqueue serve`` runs each request in a
  transaction as the caller's database role (``SET LOCAL ROLE``) on a pool
  of its own, calling the SQL worker API functions (``ack``, ``fail``, ...)
  so that the database checks each role's privileges.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from pgqueue.connection import (
    ErrorTranslator,
    connection_params,
    listen_sql,
    migrate_command,
    translated,
)
from pgqueue.driver_async import (
    AsyncDriver,
    PooledAsyncConnection,
    check_async,
    configure_async,
    configure_pooled_async,
)
from pgqueue.driver_sync import (
    Driver,
    PooledConnection,
    check,
    configure,
    configure_pooled,
    schema_revision,
)
from pgqueue.errors import ConnectionFailed, PoolExhausted, SchemaNotMigrated
from pgqueue.queries import Queries, channel_for
from pgqueue.version import SCHEMA_REVISION


def read_revision(dsn: str, schema: str) -> str | None:
    """The Alembic revision of ``schema`` at ``dsn``, None when never migrated."""
    with (
        translated(ErrorTranslator(schema, dsn)),
        psycopg.connect(connection_params(dsn), autocommit=True) as conn,
    ):
        return schema_revision(conn, schema)


def discard_async_pool(
    pool: AsyncConnectionPool[Any], loop: asyncio.AbstractEventLoop | None
) -> None:
    """Close an async pool from outside its event loop."""
    if loop is not None and not loop.is_closed():
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(pool.close(), loop)
        else:
            # This thread may be running another loop: close it on a thread of its own.
            closer = threading.Thread(target=loop.run_until_complete, args=(pool.close(),))
            closer.start()
            closer.join()
        return
    # Its loop is gone, and the pool's tasks with it: close the connections it
    # still holds so that their server sessions end now.
    for conn in list(getattr(pool, "_pool", ())):
        conn.pgconn.finish()
    getattr(pool, "_pool", []).clear()


class Database(Driver, AsyncDriver):
    """The sync and async pools of one App, created on first use, and the
    drivers (``run``, ``run_async``, ...) that use them."""

    def __init__(
        self,
        dsn: str,
        queries: Queries,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
        transaction_pooler: bool = False,
    ) -> None:
        self.dsn = connection_params(dsn)
        # Behind a transaction pooler a prepared statement would live in one
        # server session and be missing (or another one) in the next.
        self.connect_kwargs = {"autocommit": True}
        if transaction_pooler:
            self.connect_kwargs["prepare_threshold"] = None
        self.transaction_pooler = transaction_pooler
        self.queries = queries
        self.schema = queries.schema
        self.translate = ErrorTranslator(self.schema, dsn)
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self._sync_pool: ConnectionPool[PooledConnection] | None = None
        self._async_pool: AsyncConnectionPool[PooledAsyncConnection] | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._async_lock: asyncio.Lock | None = None

    # --- pools: written twice, since an async pool belongs to one event loop ---

    def pool(self) -> ConnectionPool[PooledConnection]:
        """The sync pool, opened on first use."""
        if self._sync_pool is None:
            with self._lock:
                if self._sync_pool is None:
                    # A direct first connection gives libpq's own reason on a bad
                    # DSN instead of a pool timeout, and checks the schema once.
                    with self.connect() as probe:
                        if problem := self.schema_problem(self.revision(probe)):
                            raise problem
                    self._sync_pool = ConnectionPool(
                        self.dsn,
                        connection_class=PooledConnection,
                        kwargs=self.connect_kwargs,
                        min_size=self.min_size,
                        max_size=self.max_size,
                        timeout=self.timeout,
                        check=check,
                        configure=configure_pooled if self.transaction_pooler else configure,
                        name=f"pgqueue-{self.schema}",
                        open=True,
                    )
        return self._sync_pool

    async def pool_async(self) -> AsyncConnectionPool[PooledAsyncConnection]:
        """The async pool of the running event loop, opened on first use."""
        loop = asyncio.get_running_loop()
        if self._async_pool is not None and self._async_loop is not loop:
            # Created under another event loop (e.g. a previous asyncio.run):
            # unusable here; close it rather than leak its connections.
            discard_async_pool(self._async_pool, self._async_loop)
            self._async_pool = self._async_loop = None
            self._async_lock = None
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            if self._async_pool is None:
                probe = await self.connect_async()
                try:
                    if problem := self.schema_problem(await self.revision_async(probe)):
                        raise problem
                finally:
                    await probe.close()
                pool = AsyncConnectionPool(
                    self.dsn,
                    connection_class=PooledAsyncConnection,
                    kwargs=self.connect_kwargs,
                    min_size=self.min_size,
                    max_size=self.max_size,
                    timeout=self.timeout,
                    check=check_async,
                    configure=configure_pooled_async
                    if self.transaction_pooler
                    else configure_async,
                    name=f"pgqueue-{self.schema}-async",
                    open=False,
                )
                # Wait for the first connections: a background connect still in
                # flight when a short-lived event loop ends (asyncio.run) is
                # cancelled with the loop's tasks, and psycopg_pool can hang there.
                await pool.open(wait=True, timeout=self.timeout)
                self._async_pool, self._async_loop = pool, loop
        return self._async_pool

    def close(self) -> None:
        """Close both pools (they reopen on next use)."""
        if self._sync_pool is not None:
            self._sync_pool.close()
            self._sync_pool = None
        pool, loop = self._async_pool, self._async_loop
        self._async_pool = self._async_loop = None
        if pool is not None:
            discard_async_pool(pool, loop)

    async def close_async_pool(self) -> None:
        """Close the async pool only (e.g. before its event loop ends; see
        :func:`async_pools`)."""
        if self._async_pool is not None:
            await self._async_pool.close()
            self._async_pool = self._async_loop = None

    async def close_async(self) -> None:
        """Close both pools from a coroutine."""
        await self.close_async_pool()
        if self._sync_pool is not None:
            await asyncio.to_thread(self._sync_pool.close)
            self._sync_pool = None

    # --- what both drivers share ---------------------------------------------

    def schema_problem(self, revision: str | None) -> SchemaNotMigrated | None:
        """Why the schema at ``revision`` cannot serve this pgqueue, if it cannot."""
        if revision is None:
            return SchemaNotMigrated(
                f'schema "{self.schema}" in {self.translate.target} is not migrated: '
                f"run `{migrate_command(self.schema)}`"
            )
        if revision != SCHEMA_REVISION:
            return SchemaNotMigrated(
                f'schema "{self.schema}" in {self.translate.target} is at revision {revision} '
                f"but this pgqueue needs {SCHEMA_REVISION}: run `{migrate_command(self.schema)}`"
            )
        return None

    def diagnose(self, timeout: PoolTimeout, failure: psycopg.Error | None) -> BaseException:
        """The error for a pool timeout, given whether a direct connection failed."""
        if failure is None:  # the server answers: every pooled connection is busy
            return PoolExhausted(
                f"all {self.max_size} pooled connection(s) to {self.translate.target} stayed "
                f"busy for {self.timeout:g}s (pool_timeout): raise the App's pool_max_size or "
                "hold connections for less time"
            )
        return self.translate(failure)

    # --- LISTEN (async only: the worker's listener and subscriptions) ------------

    @asynccontextmanager
    async def listening_async(
        self, *, announcements: bool = False, **kwargs: Any
    ) -> AsyncIterator[AsyncIterator[tuple[bool, str]]]:
        """A dedicated connection LISTENing on the schema's channel (and, with
        ``announcements``, on its announcement channel); yields an iterator of
        (announcement?, payload). Errors come translated."""
        conn = await self.connect_async(**kwargs)
        try:
            try:
                await conn.execute(listen_sql(self.schema, announcements=announcements))
            except psycopg.Error as exc:
                raise self.translate(exc) from None
            yield self._payloads(conn)
        finally:
            await conn.close()

    async def _payloads(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> AsyncIterator[tuple[bool, str]]:
        events = channel_for(self.schema)
        try:
            async for note in conn.notifies():
                yield note.channel != events, note.payload
        except psycopg.Error as exc:
            raise self.translate(exc) from None
        # notifies() ends only when the connection is closed under it.
        raise ConnectionFailed(f"PostgreSQL at {self.translate.target}: connection closed")


@asynccontextmanager
async def async_pools(*databases: Database) -> AsyncIterator[None]:
    """A block that ends before its event loop does: the async pools these
    databases open in it are closed at its end, on that loop (an async pool
    cannot be closed once its loop has ended). Every blocking entry point
    that makes a loop of its own (``run_worker``, ``drain``, the dashboard's
    thread) runs its work inside one."""
    try:
        yield
    finally:
        for database in databases:
            await database.close_async_pool()
