"""Connections: DSNs, session setup, notification payloads, and psycopg's
errors turned into pgqueue's (connection trouble, an unmigrated schema, input
errors raised by the SQL functions).

Nothing here executes SQL: the drivers (:mod:`pgqueue.driver_async` and its
generated twin :mod:`pgqueue.driver_sync`) do, for :class:`pgqueue.database.Database`.
"""

from __future__ import annotations

import re
import select
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ConnStatus, Format
from psycopg_pool import PoolTimeout

from pgqueue.commands import command
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
from pgqueue.ops import Execute, Op
from pgqueue.queries import announce_channel_for, channel_for

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
    default_port = defaults.get("port") or "5432"
    user = info.get("user") or defaults.get("user") or ""
    dbname = info.get("dbname") or defaults.get("dbname") or user
    # A multi-host DSN (failover): libpq pairs the n-th host with the n-th
    # port, one port serves every host, an empty entry is the default port.
    hosts = str(host).split(",")
    ports = str(info.get("port") or default_port).split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    targets = ",".join(
        f"{h or 'local socket'}:{p or default_port}" for h, p in zip(hosts, ports, strict=False)
    )
    return f"{targets}/{dbname}"


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
    return command("migrate", schema)


def grant_command(schema: str, role: str | None) -> str:
    """The command that grants ``role`` its privileges on ``schema``."""
    return command(f"grant --role {role or 'ROLE'} --producer|--worker|--admin", schema)


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


# psycopg prepares a statement after a few executions; the server would then
# reuse a generic plan made when the table had other statistics (empty, or
# before autovacuum saw a sudden backlog) and scan the whole table. Custom
# plans cost 0.02-0.3 ms per statement; the two functions on the latency path
# (lease_jobs, enqueue_batch) cache plans whose shape they pin (sql/schema.sql).
SESSION_SETUP = "SET plan_cache_mode = force_custom_plan; SET jit = off"


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


def raw_json(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """This cursor (only) leaves json and jsonb values undecoded (their text),
    and reads runs of equal timestamptz values once (see
    _RepeatedTimestamptzLoader)."""
    # psycopg's own (C) text loader: the JSON text as the server sent it (a
    # str on these UTF-8 connections), with no Python call per value.
    text = _default_loader(psycopg.adapters.types["text"].oid)
    cur.adapters.register_loader("jsonb", text)
    cur.adapters.register_loader("json", text)
    cur.adapters.register_loader("timestamptz", _RepeatedTimestamptzLoader)


def socket_alive(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
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


def listen_sql(schema: str, *, announcements: bool = False) -> sql.Composed:
    """LISTEN on the schema's channel (and its announcement channel)."""
    listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(schema)))
    if not announcements:
        return listen
    return sql.SQL("{}; LISTEN {}").format(listen, sql.Identifier(announce_channel_for(schema)))


UNLISTEN = "UNLISTEN *"


def payload_matches(note: psycopg.Notify, payload: str) -> bool:
    # 'f:<id>' is followed by ':<status>:<queue>' (see pgqueue.events).
    return note.payload == payload or note.payload.startswith(payload + ":")


def one_statement(step: Execute) -> Op[Any]:
    """An operation of the single statement ``step``."""
    result = yield step
    return result


# After these the session itself is unusable for writes (it was opened read-only,
# e.g. on a standby after a failover): the pool must not hand it out again.
_STALE_SESSION_STATES = frozenset({"25006"})


def is_stale_session(exc: DatabaseError) -> bool:
    return exc.sqlstate in _STALE_SESSION_STATES
