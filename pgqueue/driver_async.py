"""The drivers: run :mod:`pgqueue.ops` operations on psycopg connections.

This module is the one source of both: ``tools/async_to_sync.py`` writes
the sync driver from it (a name ending in ``_async`` loses that suffix). Together
they are where the library executes its SQL; :class:`pgqueue.database.Database`
holds the pools they draw from.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgqueue.connection import (
    SESSION_SETUP,
    UNLISTEN,
    ErrorTranslator,
    is_stale_session,
    listen_sql,
    one_statement,
    payload_matches,
    raw_json,
    socket_alive,
)
from pgqueue.errors import DatabaseError
from pgqueue.ops import Execute, Listen, Op, Step
from pgqueue.payloads import loads_stored
from pgqueue.queries import Queries

T = TypeVar("T")


class PooledAsyncConnection(psycopg.AsyncConnection[Any]):
    """A pooled connection keeping the cursor of each hot statement
    (``Execute.hot``) between checkouts: a cursor made anew per call costs a
    new adapters map and transformer, whose dumper/loader caches are then
    rebuilt for every parameter and column (~30 us of a ~140 us single
    enqueue's client CPU, measured on a 2-core test machine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hot_cursors: dict[str, psycopg.AsyncCursor[Any]] = {}

    async def close(self) -> None:
        self.hot_cursors.clear()  # they refer to the connection: no cycle to collect
        await super().close()


async def configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set up a new pooled connection."""
    set_json_loads(loads_stored, conn)
    await conn.execute(SESSION_SETUP)


# Behind a transaction pooler each transaction may run on another server
# session: nothing may outlive it. No SET (and none needed: unprepared
# statements get a custom plan every time anyway).
async def configure_pooled_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set up a new connection behind a transaction pooler."""
    set_json_loads(loads_stored, conn)


# A rejected connection must be closed here: the pool takes a connection back
# as healthy unless it is broken, and would offer the same one again.
async def check_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check before handing out an idle connection."""
    if not socket_alive(conn):
        await conn.close()
        raise psycopg.OperationalError("connection closed by the server")


async def wait_for_async(conn: psycopg.AsyncConnection[Any], payload: str, timeout: float) -> bool:
    """Whether the notification ``payload`` arrives on ``conn`` within ``timeout``."""
    async for note in conn.notifies(timeout=timeout):
        if payload_matches(note, payload):
            return True
    return False


async def schema_revision_async(conn: psycopg.AsyncConnection[Any], schema: str) -> str | None:
    """The Alembic revision of ``schema``, None when it was never migrated."""
    query = sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
    try:
        cur = await conn.execute(query)
        row = await cur.fetchone()
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return None
    return row[0] if row else None


async def _fetch_async(cur: psycopg.AsyncCursor[Any], step: Execute) -> Any:
    if step.fetch == "all":
        return await cur.fetchall()
    if step.fetch == "one":
        return await cur.fetchone()
    return cur.rowcount


class AsyncDriver(ABC):
    """Runs operations on a caller's connection or one of the pool's."""

    dsn: str
    schema: str
    queries: Queries
    translate: ErrorTranslator
    connect_kwargs: dict[str, Any]

    @abstractmethod
    async def pool_async(self) -> AsyncConnectionPool[PooledAsyncConnection]:
        """The pool, opened on first use."""

    @abstractmethod
    def diagnose(self, timeout: PoolTimeout, failure: psycopg.Error | None) -> BaseException:
        """The error for a pool timeout, given whether a direct connection failed."""

    async def connect_async(self, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        """A new dedicated connection (not from the pool), autocommit."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.dsn, **{**self.connect_kwargs, **kwargs}
            )
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    # The revision check is the first statement a role runs: without USAGE on
    # the schema it is where a missing grant shows, as PermissionDenied.
    async def revision_async(self, conn: psycopg.AsyncConnection[Any]) -> str | None:
        """The schema's revision, read on ``conn``."""
        try:
            return await schema_revision_async(conn, self.schema)
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    async def run_async(self, op: Op[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        """Drive ``op`` on ``conn`` (the caller's transaction) or a pooled connection."""
        if conn is not None:
            return await self._drive_async(op, conn)
        pool = await self.pool_async()
        try:
            async with pool.connection() as pooled:
                try:
                    return await self._drive_async(op, pooled)
                except DatabaseError as exc:
                    if is_stale_session(exc):
                        await pooled.close()
                    raise
        except PoolTimeout as exc:
            raise self.diagnose(exc, await self._probe_async()) from None

    async def run_released_async(self, op: Op[T]) -> T:
        """Drive a long-waiting ``op`` without holding a pooled connection while
        it waits: each statement borrows one; LISTEN (and the wait for a
        notification) uses a dedicated connection; a wait without LISTEN sleeps."""
        listener: psycopg.AsyncConnection[Any] | None = None
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = await self.run_async(one_statement(step))
                    elif isinstance(step, Listen):
                        listener = await self.connect_async()
                        await listener.execute(listen_sql(self.schema))
                        result = None
                    elif listener is not None:
                        result = await wait_for_async(listener, step.payload, step.timeout)
                    else:
                        await asyncio.sleep(step.timeout)
                        result = False
                except (psycopg.Error, DatabaseError) as exc:
                    step = op.throw(self.translate(exc))
                else:
                    step = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            if listener is not None:
                await listener.close()

    # A pool timeout says nothing of why: a direct connection attempt tells an
    # unreachable server (with libpq's reason) from a pool that is all busy.
    async def _probe_async(self) -> psycopg.Error | None:
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, connect_timeout=3)
            await conn.close()
        except psycopg.Error as exc:
            return exc
        return None

    async def _drive_async(self, op: Op[T], conn: psycopg.AsyncConnection[Any]) -> T:
        listening = False
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = await self._execute_async(conn, step)
                    elif isinstance(step, Listen):
                        await conn.execute(listen_sql(self.schema))
                        listening, result = True, None
                    else:
                        result = await wait_for_async(conn, step.payload, step.timeout)
                except psycopg.Error as exc:
                    step = op.throw(self.translate(exc))
                else:
                    step = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            if listening and not conn.closed:
                try:
                    await conn.execute(UNLISTEN)
                except psycopg.Error:
                    await conn.close()  # a pooled connection still listening must not be reused

    async def _execute_async(self, conn: psycopg.AsyncConnection[Any], step: Execute) -> Any:
        statement = (
            self.queries.positional(step.query)
            if type(step.params) is tuple
            else self.queries[step.query]
        )
        if step.hot and isinstance(conn, PooledAsyncConnection):
            hot = conn.hot_cursors.get(step.query)
            if hot is None:
                hot = conn.hot_cursors[step.query] = conn.cursor()
            await hot.execute(statement, step.params)
            return await _fetch_async(hot, step)
        cur = conn.cursor(row_factory=dict_row) if step.rows == "dict" else conn.cursor()
        if step.raw_json:
            raw_json(cur)
        async with cur:
            await cur.execute(statement, step.params)
            return await _fetch_async(cur, step)
