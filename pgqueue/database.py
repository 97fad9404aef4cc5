"""The database of one App: its two connection pools and the drivers over them.

This module, the drivers (:mod:`pgqueue.driver_async`, and
:mod:`pgqueue.driver_sync` generated from it) and :mod:`pgqueue.connection`
(error translation) are the database layer: the library's SQL executes here
and nowhere else, and only here are psycopg's errors seen; everything above
gets :mod:`pgqueue.errors` (``tests/unit/test_layers.py`` holds it). A part
that needs a connection of its own gets it from a :class:`Database` too and
runs named statements on it through the driver:

- the HTTP API (``pgqueue serve``) has a Database per kind of token, whose
  sessions start as that kind's database role: each request runs on one of
  its connections (:meth:`Database.connection_async`, a statement that
  commits on its own, or :meth:`Database.transaction_async`), driving the
  SQL worker API's operations (:mod:`pgqueue.ops.worker_api`) so that the
  database checks each role's privileges;
- :mod:`pgqueue.subscribe`: the App's one LISTEN connection for
  ``app.subscribe()``, held by a thread of its own across event loops
  (:meth:`Database.listen`, :meth:`Database.notifications`);
- :mod:`pgqueue.grants`: its reads are named statements; the GRANTs it
  composes for one role and kind (shown to an operator first with
  ``--dry-run``) run through :meth:`Database.run_composed`;
- :mod:`pgqueue.migrate`: Alembic runs the schema's migrations on its own
  connection; the shipped SQL files they apply run through :func:`run_script`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from pgqueue.connection import (
    ErrorTranslator,
    connection_params,
    is_stale_session,
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
from pgqueue.errors import ConnectionFailed, DatabaseError, PoolExhausted, SchemaNotMigrated
from pgqueue.queries import Queries, channel_for
from pgqueue.version import SCHEMA_REVISION


def read_revision(dsn: str, schema: str) -> str | None:
    """The Alembic revision of ``schema`` at ``dsn``, None when never migrated."""
    with (
        translated(ErrorTranslator(schema, dsn)),
        psycopg.connect(connection_params(dsn), autocommit=True) as conn,
    ):
        return schema_revision(conn, schema)


def run_script(conn: psycopg.Connection[Any], text: str | bytes) -> None:
    """Run a shipped SQL file's text (the schema, a revision's SQL) on
    ``conn`` as it is, in one round trip: it holds many statements, and
    ``%`` in plpgsql format strings that a parameter parser would mangle.
    Errors are the caller's to translate (a migration's, under Alembic)."""
    conn.execute(text)


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
        permission_hint: str | None = None,
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
        self.translate = ErrorTranslator(self.schema, dsn, permission_hint)
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

    # --- SQL that no named statement can hold (sync: grant, migrate, schema dump) ---

    def run_composed(
        self, conn: psycopg.Connection[Any], statements: Sequence[sql.Composed]
    ) -> list[str]:
        """Run ``statements`` on ``conn`` in order: statements composed for
        one case with their identifiers quoted by psycopg (the GRANTs of
        ``pgqueue grant`` for one role and kind). Returns the WARNINGs the
        server sent meanwhile (a GRANT the role may not pass on only warns)."""
        warnings: list[str] = []

        def collect(diagnostic: psycopg.errors.Diagnostic) -> None:
            if diagnostic.severity_nonlocalized == "WARNING":
                warnings.append(diagnostic.message_primary or "")

        conn.add_notice_handler(collect)
        try:
            for statement in statements:
                conn.execute(statement)
        except psycopg.Error as exc:
            raise self.translate(exc) from None
        finally:
            conn.remove_notice_handler(collect)
        return warnings

    # --- LISTEN on a thread of its own (sync: app.subscribe()'s event stream) -----

    def listen(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN on the schema's channel on ``conn``, a dedicated connection
        (until it closes)."""
        try:
            conn.execute(listen_sql(self.schema))
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    def notifications(
        self, conn: psycopg.Connection[Any], timeout: float, stop_after: int | None = None
    ) -> Iterator[str]:
        """The payloads of the notifications that arrive on ``conn`` within
        ``timeout`` seconds (ending after the batch that holds the
        ``stop_after``-th, as psycopg's ``notifies``). Errors come translated."""
        try:
            for note in conn.notifies(timeout=timeout, stop_after=stop_after):
                yield note.payload
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    # --- a connection or a transaction to hold (async only: the HTTP API) --------

    @asynccontextmanager
    async def connection_async(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection to hand to :meth:`run_async` (autocommit: each
        statement commits on its own). Errors come translated; a connection
        that broke is closed rather than pooled again."""
        pool = await self.pool_async()
        try:
            conn = await pool.getconn()
        except PoolTimeout as exc:
            raise self.diagnose(exc, await self._probe_async()) from None
        try:
            try:
                yield conn
            except psycopg.Error as exc:  # a commit, or the block's own statements
                raise self.translate(exc) from None
        except DatabaseError as exc:
            if is_stale_session(exc):
                await conn.close()
            raise
        finally:
            await pool.putconn(conn)

    @asynccontextmanager
    async def transaction_async(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction: it commits when the block
        ends, and rolls back on an error. Errors come translated."""
        async with self.connection_async() as conn, conn.transaction():
            yield conn

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

    @asynccontextmanager
    async def notification_batches_async(
        self, window: float, **kwargs: Any
    ) -> AsyncIterator[AsyncIterator[list[str]]]:
        """A dedicated connection LISTENing on the schema's channel; yields an
        iterator of batches of payloads: after the first notification of a
        batch it waits ``window`` seconds and takes every one that came
        meanwhile, so a burst costs one wake-up, not one per notification."""
        conn = await self.connect_async(**kwargs)
        try:
            try:
                await conn.execute(listen_sql(self.schema, announcements=False))
            except psycopg.Error as exc:
                raise self.translate(exc) from None
            yield self._batches(conn, window)
        finally:
            await conn.close()

    async def _batches(
        self, conn: psycopg.AsyncConnection[Any], window: float
    ) -> AsyncIterator[list[str]]:
        try:
            while not conn.closed:
                batch = [n.payload async for n in conn.notifies(stop_after=1)]
                await asyncio.sleep(window)
                batch += [n.payload async for n in conn.notifies(timeout=0.0)]
                yield batch
        except psycopg.Error as exc:
            raise self.translate(exc) from None
        raise ConnectionFailed(f"PostgreSQL at {self.translate.target}: connection closed")

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
    that makes a loop of its own (``run_worker``, ``Router.run_worker``,
    ``drain``) runs its work inside one; a server on a loop it does not own
    (the dashboard) closes its App's at the end of its lifespan with
    ``App.close_async_pool``."""
    try:
        yield
    finally:
        for database in databases:
            await database.close_async_pool()
