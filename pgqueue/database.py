"""Connection pools and the two drivers (sync, async) of :mod:`pgqueue.ops`.

This is the only module that executes SQL for the library. It also turns
psycopg's errors into pgqueue's: connection trouble, an unmigrated schema, and
input errors raised by the SQL functions.
"""

from __future__ import annotations

import asyncio
import re
import select
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ConnStatus, Format
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from pgqueue.errors import (
    ConnectionFailed,
    DatabaseError,
    DuplicateJob,
    InvalidInput,
    PermissionDenied,
    PgQueueError,
    PoolExhausted,
    QueryFailed,
    SchemaNotMigrated,
)
from pgqueue.ops import Execute, Listen, Op, Step
from pgqueue.payloads import loads_stored
from pgqueue.queries import Queries, channel_for
from pgqueue.version import SCHEMA_REVISION

T = TypeVar("T")

_SCHEMA_ERRORS = (
    pg_errors.UndefinedTable,
    pg_errors.UndefinedFunction,
    pg_errors.InvalidSchemaName,
    pg_errors.UndefinedObject,
    pg_errors.UndefinedColumn,
)


def connection_params(dsn: str, application_name: str = "pgqueue") -> str:
    """The DSN with pgqueue's defaults added where the DSN says nothing."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConnectionFailed(f"invalid DSN: {dsn_error(exc)}") from None
    extra: dict[str, Any] = {}
    if "application_name" not in given:
        extra["application_name"] = application_name
    if "connect_timeout" not in given:
        extra["connect_timeout"] = 10
    return make_conninfo(dsn, **extra)


def dsn_error(exc: BaseException) -> str:
    """Why a DSN did not parse, without the DSN's parts: the driver quotes the
    offending token, which may be (part of) the password."""
    reason = re.sub(r'"[^"]*"', "…", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    reason = reason.rstrip(": ") or "cannot be parsed"
    return f"{reason} (the DSN is not shown: it may hold a password)"


def describe_target(dsn: str) -> str:
    """``host:port/dbname`` for messages (never the password); what the DSN
    leaves out is filled in as libpq would (PGHOST, ..., else its defaults)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the given DSN"
    defaults = _libpq_defaults()
    host = info.get("host") or info.get("hostaddr") or defaults.get("host") or "local socket"
    port = info.get("port") or defaults.get("port") or 5432
    user = info.get("user") or defaults.get("user") or ""
    dbname = info.get("dbname") or defaults.get("dbname") or user
    return f"{host}:{port}/{dbname}"


def _libpq_defaults() -> dict[str, str]:
    """libpq's value for each connection option a DSN leaves out."""
    try:
        return {
            o.keyword.decode(): o.val.decode()
            for o in psycopg.pq.Conninfo.get_defaults()
            if o.val is not None
        }
    except (psycopg.Error, UnicodeDecodeError):  # pragma: no cover - libpq without defaults
        return {}


def migrate_command(schema: str) -> str:
    """The command that migrates ``schema`` (global options go before the command)."""
    return "pgqueue migrate" if schema == "pgqueue" else f"pgqueue --schema {schema} migrate"


def grant_command(schema: str, role: str | None) -> str:
    """The command that grants ``role`` its privileges on ``schema``."""
    prefix = "pgqueue grant" if schema == "pgqueue" else f"pgqueue --schema {schema} grant"
    return f"{prefix} --role {role or 'ROLE'} --producer|--worker|--admin"


def dsn_role(dsn: str) -> str | None:
    """The role a DSN logs in as, when it names one."""
    try:
        user = conninfo_to_dict(dsn).get("user")
    except psycopg.ProgrammingError:
        return None
    return str(user) if user else None


# SQLSTATEs after which the same statement may well succeed if tried again
# later: nothing is wrong with the call, the server was busy or changing.
TRANSIENT_SQLSTATES = frozenset(
    {
        "55P03",  # lock_not_available (lock_timeout, NOWAIT)
        "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
        "40P01",  # deadlock_detected
        "40001",  # serialization_failure
        "40003",  # statement_completion_unknown
        "25006",  # read_only_sql_transaction (a standby, or default_transaction_read_only)
        "25P03",  # idle_in_transaction_session_timeout
        "53000",  # insufficient_resources
        "53100",  # disk_full
        "53200",  # out_of_memory
        "53300",  # too_many_connections
        "53400",  # configuration_limit_exceeded
        "57P01",  # admin_shutdown (pg_terminate_backend, fast shutdown)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovery)
        "57P05",  # idle_session_timeout
        "58000",  # system_error
        "58030",  # io_error
        "55006",  # object_in_use
        "55000",  # object_not_in_prerequisite_state (e.g. recovery in progress)
    }
)
TRANSIENT_CLASSES = ("08",)  # connection_exception


def is_transient_sqlstate(state: str | None) -> bool:
    """Whether an error with this SQLSTATE (None: the connection was lost) may pass."""
    return state is None or state in TRANSIENT_SQLSTATES or state.startswith(TRANSIENT_CLASSES)


class ErrorTranslator:
    """Maps psycopg exceptions to pgqueue exceptions for one schema and DSN.

    Every ``psycopg.Error`` becomes a :class:`~pgqueue.errors.PgQueueError`:
    the known input and schema errors their own class, connection trouble
    :class:`ConnectionFailed`, anything else the server said
    :class:`QueryFailed` (with ``sqlstate`` and ``transient``).
    """

    def __init__(self, schema: str, dsn: str, permission_hint: str | None = None) -> None:
        self.schema = schema
        self.target = describe_target(dsn)
        self.role = dsn_role(dsn)
        self.permission_hint = permission_hint

    def __call__(self, exc: BaseException) -> BaseException:
        if isinstance(exc, PgQueueError):
            return exc
        if isinstance(exc, _SCHEMA_ERRORS):
            return SchemaNotMigrated(
                f'schema "{self.schema}" in {self.target} is not migrated or is older than '
                f"this pgqueue ({exc.diag.message_primary}): run `{migrate_command(self.schema)}`",
                sqlstate=exc.sqlstate,
            )
        if isinstance(exc, pg_errors.UniqueViolation) and exc.diag.constraint_name == (
            "jobs_dedup_key_idx"
        ):
            return DuplicateJob(
                "a live job with the same queue and dedup key already exists "
                f"({exc.diag.message_detail or ''})".rstrip(" ()")
            )
        if isinstance(exc, pg_errors.InvalidParameterValue) and (
            exc.diag.message_primary or ""
        ).startswith("pgqueue:"):
            return InvalidInput((exc.diag.message_primary or "")[len("pgqueue: ") :])
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            if self.permission_hint is not None:
                return PermissionDenied(
                    f"{exc.diag.message_primary}: {self.permission_hint}", sqlstate=exc.sqlstate
                )
            # The role was not granted what this call needs: say which command does.
            return PermissionDenied(
                f"{exc.diag.message_primary or 'permission denied'}"
                f"{f' (role {self.role})' if self.role else ''}: grant the role what it needs "
                f"with `{grant_command(self.schema, self.role)}`",
                sqlstate=exc.sqlstate,
            )
        if isinstance(exc, PoolTimeout):
            return PoolExhausted(
                f"no database connection to {self.target} became free in time: {exc}"
            )
        if isinstance(exc, psycopg.Error):
            state = exc.sqlstate or _refusal_sqlstate(exc)
            message = f"PostgreSQL at {self.target}: {_one_line(exc)}"
            if _is_connection_error(exc):
                return ConnectionFailed(
                    message,
                    sqlstate=state,
                    # Wrong credentials, a dropped database or a bad DSN stay wrong.
                    transient=not ((state or "").startswith(("28", "3D")) or state == "57P04"),
                )
            return QueryFailed(
                f"{message} (SQLSTATE {state})" if state else message,
                sqlstate=state,
                # No SQLSTATE here: the client refused the call (e.g. bad parameters).
                transient=state is not None and is_transient_sqlstate(state),
            )
        return exc


@contextmanager
def translated(translate: ErrorTranslator) -> Iterator[None]:
    """Raise psycopg errors of the block as pgqueue errors. A driver error
    wrapped by SQLAlchemy (Alembic's migrations) is unwrapped first."""
    try:
        yield
    except Exception as exc:
        cause = getattr(exc, "orig", exc)
        if isinstance(cause, psycopg.Error):
            raise translate(cause) from None
        raise


def read_revision(dsn: str, schema: str) -> str | None:
    """The Alembic revision of ``schema`` at ``dsn``, None when never migrated."""
    with (
        translated(ErrorTranslator(schema, dsn)),
        psycopg.connect(connection_params(dsn), autocommit=True) as conn,
    ):
        return _read_revision(conn, schema)


# libpq reports why the server refused a new connection only as text: the
# SQLSTATEs of the refusals a worker must tell apart (server messages in English).
_REFUSALS = (
    ("too many clients", "53300"),
    ("remaining connection slots are reserved", "53300"),
    ("too many connections for", "53300"),
    ("the database system is starting up", "57P03"),
    ("the database system is shutting down", "57P03"),
    ("the database system is in recovery mode", "57P03"),
    ("the database system is not yet accepting connections", "57P03"),
    ("the database system is not accepting connections", "57P03"),
    ("password authentication failed", "28P01"),
    ("no pg_hba.conf entry", "28000"),
    ("is not permitted to log in", "28000"),
)


def _refusal_sqlstate(exc: psycopg.Error) -> str | None:
    """The SQLSTATE of a refused connection attempt, read from its message."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text = str(exc)
    if "FATAL" not in text:
        return None
    if "does not exist" in text:
        if 'role "' in text:
            return "28000"
        if 'database "' in text:
            return "3D000"
    for marker, state in _REFUSALS:
        if marker in text:
            return state
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _is_connection_error(exc: psycopg.Error) -> bool:
    """Connection trouble, as opposed to e.g. a lock or statement timeout on a
    healthy connection: no SQLSTATE from an OperationalError or InterfaceError
    (the client lost the server), class 08 (connection exception), 57P0x
    (shutdown, crash, starting up, database dropped, idle timeout), 53300 (too
    many connections), 28xxx (credentials), 3D000 (no such database)."""
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return state.startswith(("08", "57P", "28")) or state in ("53300", "3D000", "25P03")


def _configure_sync(conn: psycopg.Connection[Any]) -> None:
    set_json_loads(loads_stored, conn)
    conn.execute(_SESSION_SETUP)


async def _configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(loads_stored, conn)
    await conn.execute(_SESSION_SETUP)


# Behind a transaction pooler each transaction may run on another server
# session: nothing may outlive it. No SET (and none needed: unprepared
# statements get a custom plan every time anyway).
def _configure_pooled_sync(conn: psycopg.Connection[Any]) -> None:
    set_json_loads(loads_stored, conn)


async def _configure_pooled_async(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(loads_stored, conn)


# psycopg prepares a statement after a few executions; the server would then
# reuse a generic plan made when the table had other statistics (empty, or
# before autovacuum saw a sudden backlog) and scan the whole table. Custom
# plans cost 0.02-0.3 ms per statement; the two functions on the latency path
# (lease_jobs, enqueue_batch) cache plans whose shape they pin (migration 0004).
_SESSION_SETUP = "SET plan_cache_mode = force_custom_plan; SET jit = off"


class _RepeatedTimestamptzLoader(Loader):
    """timestamptz as the connection's own loader reads it, each run of
    equal texts decoded once. The rows of a lease share their
    lease_expires_at (the statement's time plus the lease), and converting
    every value to the session's time zone (a zoneinfo zone unless the
    server says exactly ``UTC``) was the costliest part of a leased row.
    The datetime returned again is immutable: sharing it changes nothing."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._decode = _default_loader(oid)(oid, context).load
        self._text: bytes | None = None
        self._value: Any = None

    def load(self, data: Any) -> Any:
        text = bytes(data)
        if text != self._text:
            self._value = self._decode(data)
            self._text = text
        return self._value


@cache
def _default_loader(oid: int) -> type[Loader]:
    return psycopg.adapters.get_loader(oid, Format.TEXT)  # type: ignore[return-value]


def _raw_json(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """This cursor (only) leaves json and jsonb values undecoded (their text),
    and reads runs of equal timestamptz values once (see
    _RepeatedTimestamptzLoader)."""
    # psycopg's own (C) text loader: the JSON text as the server sent it (a
    # str on these UTF-8 connections), with no Python call per value.
    text = _default_loader(psycopg.adapters.types["text"].oid)
    cur.adapters.register_loader("jsonb", text)
    cur.adapters.register_loader("json", text)
    cur.adapters.register_loader("timestamptz", _RepeatedTimestamptzLoader)


def _socket_alive(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle pooled connection may be handed out. It listens to
    nothing, so a readable socket means the server sent a termination notice
    or closed it (the EOF may trail the notice): drop it. One poll, no round trip."""
    if conn.closed or conn.pgconn.status != ConnStatus.OK:
        return False
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, psycopg.OperationalError):
        return False
    return not readable


# A rejected connection must be closed here: the pool takes a connection back
# as healthy unless it is broken, and would offer the same one again.


class _PooledConnection(psycopg.Connection[Any]):
    """A connection of the sync pool, keeping the cursor of each hot statement
    (``Execute.hot``) between checkouts: a cursor made anew per call costs a
    new adapters map and transformer, whose dumper/loader caches are then
    rebuilt for every parameter and column (~30 us of a ~140 us single
    enqueue's client CPU, measured on a 2-core test machine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hot_cursors: dict[str, psycopg.Cursor[Any]] = {}

    def close(self) -> None:
        self.hot_cursors.clear()  # they refer to the connection: no cycle to collect
        super().close()


class _PooledAsyncConnection(psycopg.AsyncConnection[Any]):
    """The async twin of :class:`_PooledConnection`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hot_cursors: dict[str, psycopg.AsyncCursor[Any]] = {}

    async def close(self) -> None:
        self.hot_cursors.clear()
        await super().close()


def _check_sync(conn: psycopg.Connection[Any]) -> None:
    if not _socket_alive(conn):
        conn.close()
        raise psycopg.OperationalError("connection closed by the server")


async def _check_async(conn: psycopg.AsyncConnection[Any]) -> None:
    if not _socket_alive(conn):
        await conn.close()
        raise psycopg.OperationalError("connection closed by the server")


def _listen_sql(schema: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(schema)))


_UNLISTEN = "UNLISTEN *"


def _matches(note: psycopg.Notify, payload: str) -> bool:
    # 'f:<id>' is followed by ':<status>:<queue>' (see pgqueue.events).
    return note.payload == payload or note.payload.startswith(payload + ":")


def _wait_for(conn: psycopg.Connection[Any], payload: str, timeout: float) -> bool:
    return any(_matches(note, payload) for note in conn.notifies(timeout=timeout))


async def _wait_for_async(conn: psycopg.AsyncConnection[Any], payload: str, timeout: float) -> bool:
    async for note in conn.notifies(timeout=timeout):
        if _matches(note, payload):
            return True
    return False


def _read_revision(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The Alembic revision of ``schema``, None when it was never migrated."""
    query = sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
    try:
        row = conn.execute(query).fetchone()
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return None
    return row[0] if row else None


async def _read_revision_async(conn: psycopg.AsyncConnection[Any], schema: str) -> str | None:
    query = sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
    try:
        row = await (await conn.execute(query)).fetchone()
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return None
    return row[0] if row else None


def _one(step: Execute) -> Op[Any]:
    """An operation of the single statement ``step``."""
    result = yield step
    return result


# After these the session itself is unusable for writes (it was opened read-only,
# e.g. on a standby after a failover): the pool must not hand it out again.
_STALE_SESSION_STATES = frozenset({"25006"})


def _is_stale(exc: DatabaseError) -> bool:
    return exc.sqlstate in _STALE_SESSION_STATES


def _drop_if_stale(conn: psycopg.Connection[Any], exc: DatabaseError) -> None:
    if _is_stale(exc):
        conn.close()


def _discard_async_pool(
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


class Database:
    """The sync and async pools of one App, created on first use."""

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
        self.connect_kwargs: dict[str, Any] = {"autocommit": True}
        if transaction_pooler:
            self.connect_kwargs["prepare_threshold"] = None
        self._configure_sync = _configure_pooled_sync if transaction_pooler else _configure_sync
        self._configure_async = _configure_pooled_async if transaction_pooler else _configure_async
        self.queries = queries
        self.schema = queries.schema
        self.translate = ErrorTranslator(self.schema, dsn)
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self._sync_pool: ConnectionPool[_PooledConnection] | None = None
        self._async_pool: AsyncConnectionPool[_PooledAsyncConnection] | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._async_lock: asyncio.Lock | None = None

    # --- connections -------------------------------------------------------

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new dedicated connection (not from the pool), autocommit."""
        try:
            return psycopg.connect(self.dsn, **{**self.connect_kwargs, **kwargs})
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    async def connect_async(self, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        """A new dedicated async connection (not from the pool), autocommit."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.dsn, **{**self.connect_kwargs, **kwargs}
            )
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    @asynccontextmanager
    async def listening_async(self, **kwargs: Any) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing on the schema's channel; yields an
        iterator of notification payloads. Errors come translated."""
        conn = await self.connect_async(**kwargs)
        try:
            try:
                await conn.execute(_listen_sql(self.schema))
            except psycopg.Error as exc:
                raise self.translate(exc) from None
            yield self._payloads(conn)
        finally:
            await conn.close()

    async def _payloads(self, conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
        try:
            async for note in conn.notifies():
                yield note.payload
        except psycopg.Error as exc:
            raise self.translate(exc) from None
        # notifies() ends only when the connection is closed under it.
        raise ConnectionFailed(f"PostgreSQL at {self.translate.target}: connection closed")

    def _schema_problem(self, revision: str | None) -> SchemaNotMigrated | None:
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

    # The revision check is the first statement a role runs: without USAGE on
    # the schema it is where a missing grant shows, as PermissionDenied.

    def _revision(self, conn: psycopg.Connection[Any]) -> str | None:
        try:
            return _read_revision(conn, self.schema)
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    async def _revision_async(self, conn: psycopg.AsyncConnection[Any]) -> str | None:
        try:
            return await _read_revision_async(conn, self.schema)
        except psycopg.Error as exc:
            raise self.translate(exc) from None

    def sync_pool(self) -> ConnectionPool[_PooledConnection]:
        if self._sync_pool is None:
            with self._lock:
                if self._sync_pool is None:
                    # A direct first connection gives libpq's own reason on a bad
                    # DSN instead of a pool timeout, and checks the schema once.
                    with self.connect() as probe:
                        if problem := self._schema_problem(self._revision(probe)):
                            raise problem
                    self._sync_pool = ConnectionPool(
                        self.dsn,
                        connection_class=_PooledConnection,
                        kwargs=self.connect_kwargs,
                        min_size=self.min_size,
                        max_size=self.max_size,
                        timeout=self.timeout,
                        check=_check_sync,
                        configure=self._configure_sync,
                        name=f"pgqueue-{self.schema}",
                        open=True,
                    )
        return self._sync_pool

    async def async_pool(self) -> AsyncConnectionPool[_PooledAsyncConnection]:
        loop = asyncio.get_running_loop()
        if self._async_pool is not None and self._async_loop is not loop:
            # Created under another event loop (e.g. a previous asyncio.run):
            # unusable here; close it rather than leak its connections.
            _discard_async_pool(self._async_pool, self._async_loop)
            self._async_pool = self._async_loop = None
            self._async_lock = None
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            if self._async_pool is None:
                probe = await self.connect_async()
                try:
                    if problem := self._schema_problem(await self._revision_async(probe)):
                        raise problem
                finally:
                    await probe.close()
                pool = AsyncConnectionPool(
                    self.dsn,
                    connection_class=_PooledAsyncConnection,
                    kwargs=self.connect_kwargs,
                    min_size=self.min_size,
                    max_size=self.max_size,
                    timeout=self.timeout,
                    check=_check_async,
                    configure=self._configure_async,
                    name=f"pgqueue-{self.schema}-async",
                    open=False,
                )
                await pool.open()
                self._async_pool, self._async_loop = pool, loop
        return self._async_pool

    def close(self) -> None:
        if self._sync_pool is not None:
            self._sync_pool.close()
            self._sync_pool = None
        pool, loop = self._async_pool, self._async_loop
        self._async_pool = self._async_loop = None
        if pool is not None:
            _discard_async_pool(pool, loop)

    async def close_async_pool(self) -> None:
        """Close the async pool only (e.g. before its event loop ends)."""
        if self._async_pool is not None:
            await self._async_pool.close()
            self._async_pool = self._async_loop = None

    async def close_async(self) -> None:
        await self.close_async_pool()
        if self._sync_pool is not None:
            await asyncio.to_thread(self._sync_pool.close)
            self._sync_pool = None

    # --- drivers -----------------------------------------------------------

    def run(self, op: Op[T], conn: psycopg.Connection[Any] | None = None) -> T:
        """Drive ``op`` on ``conn`` (the caller's transaction) or a pooled connection."""
        if conn is not None:
            return self._drive(op, conn)
        try:
            with self.sync_pool().connection() as pooled:
                try:
                    return self._drive(op, pooled)
                except DatabaseError as exc:
                    _drop_if_stale(pooled, exc)
                    raise
        except PoolTimeout as exc:
            raise self._diagnose(exc, self._probe()) from None

    async def run_async(self, op: Op[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        """Async twin of :meth:`run`."""
        if conn is not None:
            return await self._drive_async(op, conn)
        pool = await self.async_pool()
        try:
            async with pool.connection() as pooled:
                try:
                    return await self._drive_async(op, pooled)
                except DatabaseError as exc:
                    if _is_stale(exc):
                        await pooled.close()
                    raise
        except PoolTimeout as exc:
            raise self._diagnose(exc, await self._probe_async()) from None

    def run_released(self, op: Op[T]) -> T:
        """Drive a long-waiting ``op`` without holding a pooled connection while
        it waits: each statement borrows one; LISTEN (and the wait for a
        notification) uses a dedicated connection; a wait without LISTEN sleeps."""
        listener: psycopg.Connection[Any] | None = None
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = self.run(_one(step))
                    elif isinstance(step, Listen):
                        listener = self.connect()
                        listener.execute(_listen_sql(self.schema))
                        result = None
                    elif listener is not None:
                        result = _wait_for(listener, step.payload, step.timeout)
                    else:
                        time.sleep(step.timeout)
                        result = False
                except (psycopg.Error, DatabaseError) as exc:
                    step = op.throw(self.translate(exc))
                else:
                    step = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            if listener is not None:
                listener.close()

    async def run_released_async(self, op: Op[T]) -> T:
        """Async twin of :meth:`run_released`."""
        listener: psycopg.AsyncConnection[Any] | None = None
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = await self.run_async(_one(step))
                    elif isinstance(step, Listen):
                        listener = await self.connect_async()
                        await listener.execute(_listen_sql(self.schema))
                        result = None
                    elif listener is not None:
                        result = await _wait_for_async(listener, step.payload, step.timeout)
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

    def _probe(self) -> psycopg.Error | None:
        try:
            psycopg.connect(self.dsn, connect_timeout=3).close()
        except psycopg.Error as exc:
            return exc
        return None

    async def _probe_async(self) -> psycopg.Error | None:
        try:
            await (await psycopg.AsyncConnection.connect(self.dsn, connect_timeout=3)).close()
        except psycopg.Error as exc:
            return exc
        return None

    def _diagnose(self, timeout: PoolTimeout, failure: psycopg.Error | None) -> BaseException:
        if failure is None:  # the server answers: every pooled connection is busy
            return PoolExhausted(
                f"all {self.max_size} pooled connection(s) to {self.translate.target} stayed "
                f"busy for {self.timeout:g}s (pool_timeout): raise the App's pool_max_size or "
                "hold connections for less time"
            )
        return self.translate(failure)

    def _drive(self, op: Op[T], conn: psycopg.Connection[Any]) -> T:
        listening = False
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = self._execute(conn, step)
                    elif isinstance(step, Listen):
                        conn.execute(_listen_sql(self.schema))
                        listening, result = True, None
                    else:
                        result = _wait_for(conn, step.payload, step.timeout)
                except psycopg.Error as exc:
                    step = op.throw(self.translate(exc))
                else:
                    step = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            if listening and not conn.closed:
                try:
                    conn.execute(_UNLISTEN)
                except psycopg.Error:
                    conn.close()  # a pooled connection still listening must not be reused

    async def _drive_async(self, op: Op[T], conn: psycopg.AsyncConnection[Any]) -> T:
        listening = False
        try:
            step: Step = next(op)
            while True:
                try:
                    if isinstance(step, Execute):
                        result: Any = await self._execute_async(conn, step)
                    elif isinstance(step, Listen):
                        await conn.execute(_listen_sql(self.schema))
                        listening, result = True, None
                    else:
                        result = await _wait_for_async(conn, step.payload, step.timeout)
                except psycopg.Error as exc:
                    step = op.throw(self.translate(exc))
                else:
                    step = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            if listening and not conn.closed:
                try:
                    await conn.execute(_UNLISTEN)
                except psycopg.Error:
                    await conn.close()

    def _statement(self, step: Execute) -> str:
        if type(step.params) is tuple:
            return self.queries.positional(step.query)
        return self.queries[step.query]

    def _execute(self, conn: psycopg.Connection[Any], step: Execute) -> Any:
        if step.hot and isinstance(conn, _PooledConnection):
            cur = conn.hot_cursors.get(step.query)
            if cur is None:
                cur = conn.hot_cursors[step.query] = conn.cursor()
            cur.execute(self._statement(step), step.params)
            return _fetch(cur, step)
        cur = conn.cursor(row_factory=dict_row) if step.rows == "dict" else conn.cursor()
        if step.raw_json:
            _raw_json(cur)
        with cur:
            cur.execute(self._statement(step), step.params)
            return _fetch(cur, step)

    async def _execute_async(self, conn: psycopg.AsyncConnection[Any], step: Execute) -> Any:
        if step.hot and isinstance(conn, _PooledAsyncConnection):
            hot = conn.hot_cursors.get(step.query)
            if hot is None:
                hot = conn.hot_cursors[step.query] = conn.cursor()
            await hot.execute(self._statement(step), step.params)
            return await _fetch_async(hot, step)
        cur = conn.cursor(row_factory=dict_row) if step.rows == "dict" else conn.cursor()
        if step.raw_json:
            _raw_json(cur)
        async with cur:
            await cur.execute(self._statement(step), step.params)
            return await _fetch_async(cur, step)


def _fetch(cur: psycopg.Cursor[Any], step: Execute) -> Any:
    if step.fetch == "all":
        return cur.fetchall()
    if step.fetch == "one":
        return cur.fetchone()
    return cur.rowcount


async def _fetch_async(cur: psycopg.AsyncCursor[Any], step: Execute) -> Any:
    if step.fetch == "all":
        return await cur.fetchall()
    if step.fetch == "one":
        return await cur.fetchone()
    return cur.rowcount
