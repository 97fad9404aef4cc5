"""``context.transaction()``: a task's own writes and its job's success in one
transaction.

The block runs inside ``BEGIN`` on a connection of the worker's task pool
(:class:`TaskConnections`, apart from the pool the worker itself uses). When
it ends without an exception, the job is marked succeeded by the same fenced
statement the completer uses (``job_ack_many``: only while the job is still
``running`` under this attempt id) and then the transaction commits, so the
task's writes exist if and only if the job is recorded succeeded. A lost
lease makes that statement raise ``LeaseLost`` before the commit: the block's
writes roll back. An exception in the block rolls back; the task's exception
then takes the usual retry path.

After the commit the worker must not record the attempt again: ``completed``
tells the executor so, and ``committing`` keeps a heartbeat that saw the row
change under it from declaring the lease lost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue.errors import InvalidOption
from pgqueue.ops import consume

if TYPE_CHECKING:
    from types import TracebackType

    from pgqueue.database import Database
    from pgqueue.models import LeasedJob
    from pgqueue.ops import OpContext


class TaskConnections:
    """The connections of one worker's ``context.transaction()`` blocks: pools
    of their own (opened on first use, at most ``size`` connections each), so
    that tasks holding transactions never starve the worker's leasing,
    heartbeats and completions, which use the App's async pool."""

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn = dsn
        self.size = size
        self._sync: ConnectionPool | None = None
        self._async: AsyncConnectionPool | None = None
        self._lock = threading.Lock()

    def sync_pool(self) -> ConnectionPool:
        with self._lock:
            if self._sync is None:
                self._sync = ConnectionPool(
                    self.dsn,
                    kwargs={"autocommit": True},
                    min_size=0,
                    max_size=self.size,
                    check=ConnectionPool.check_connection,
                    name="pgqueue-task-transactions",
                    open=True,
                )
            return self._sync

    async def async_pool(self) -> AsyncConnectionPool:
        # Only the worker's event loop runs async tasks: no lock needed.
        if self._async is None:
            pool = AsyncConnectionPool(
                self.dsn,
                kwargs={"autocommit": True},
                min_size=0,
                max_size=self.size,
                check=AsyncConnectionPool.check_connection,
                name="pgqueue-task-transactions-async",
                open=False,
            )
            await pool.open()
            self._async = pool
        return self._async

    async def close(self) -> None:
        """Close both pools (the worker is stopping)."""
        pool, self._async = self._async, None
        if pool is not None:
            await pool.close()
        with self._lock:
            sync_pool, self._sync = self._sync, None
        if sync_pool is not None:
            await asyncio.to_thread(sync_pool.close)


class TaskTransactionSource:
    """What a worker's executor needs for ``context.transaction()``: the
    database driver, the op context and the task pools."""

    def __init__(self, database: Database, ctx: OpContext, size: int) -> None:
        self.database = database
        self.ctx = ctx
        self.connections = TaskConnections(database.dsn, size)

    def for_job(self, job: LeasedJob, on_completed: Callable[[], object]) -> TaskTransactions:
        """The block of one attempt; ``on_completed`` runs once it committed."""
        return TaskTransactions(self.database, self.connections, self.ctx, job, on_completed)

    async def close(self) -> None:
        await self.connections.close()


class TaskTransactions:
    """The in-transaction completion of one attempt (at most one block)."""

    def __init__(
        self,
        database: Database,
        connections: TaskConnections,
        ctx: OpContext,
        job: LeasedJob,
        on_completed: Callable[[], object],
    ) -> None:
        self.database = database
        self.connections = connections
        self.ctx = ctx
        self.job = job
        self.on_completed = on_completed
        self.opened = False
        self.committing = False  # the success is written; COMMIT is under way
        self.completed = False  # committed: the attempt is recorded

    def open(self) -> JobTransaction:
        if self.opened:
            raise InvalidOption("context.transaction() completes the job: use it once per attempt")
        self.opened = True
        return JobTransaction(self)

    def _ack(self) -> Any:
        return consume.ack_ids(self.ctx, [self.job.job_id], [self.job.attempt_id], [None])

    def _committed(self) -> None:
        self.completed = True
        self.on_completed()

    @contextmanager
    def sync(self) -> Iterator[psycopg.Connection[Any]]:
        with self.connections.sync_pool().connection() as conn:
            try:
                with conn.transaction():
                    yield conn
                    self.database.run(self._ack(), conn)  # LeaseLost: roll back
                    self.committing = True
            except BaseException:
                self.committing = False
                raise
        self._committed()

    @asynccontextmanager
    async def async_(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = await self.connections.async_pool()
        async with pool.connection() as conn:
            try:
                async with conn.transaction():
                    yield conn
                    await self.database.run_async(self._ack(), conn)
                    self.committing = True
            except BaseException:
                self.committing = False
                raise
        self._committed()


class JobTransaction:
    """What ``context.transaction()`` returns: use ``with`` in a sync task,
    ``async with`` in an async one; either yields a psycopg connection in a
    transaction that also records the job succeeded when it commits."""

    def __init__(self, owner: TaskTransactions) -> None:
        self._owner = owner
        self._sync: AbstractContextManager[psycopg.Connection[Any]] | None = None
        self._async: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] | None = None

    def __enter__(self) -> psycopg.Connection[Any]:
        self._sync = self._owner.sync()
        return self._sync.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._sync is not None
        return self._sync.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._async = self._owner.async_()
        return await self._async.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._async is not None
        return await self._async.__aexit__(exc_type, exc, tb)
