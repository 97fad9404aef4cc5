"""The caller's connection behind ``conn=``: psycopg's own, or the psycopg
connection that SQLAlchemy or Django holds for the caller's transaction.

The job is written on that very connection, inside the transaction the
caller's framework has open, so it commits or rolls back with it (and its
NOTIFY, sent by PostgreSQL at commit, wakes workers only then). SQLAlchemy
and Django are never imported here: an object is recognised by the module
its class comes from, then used through its public API.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue.errors import InvalidOption

#: What ``conn=`` accepts: a psycopg ``Connection``/``AsyncConnection``, a
#: SQLAlchemy 2 ``Connection``/``Session``/``AsyncConnection``/``AsyncSession``
#: on the psycopg driver, or Django's ``django.db.connection`` (psycopg 3).
ConnectionLike = object

_PSYCOPG3 = "pgqueue needs the psycopg 3 driver for conn= (pip install 'psycopg[binary]'); "


def sync_connection(conn: object | None) -> psycopg.Connection[Any] | None:
    """The psycopg connection of ``conn`` for a sync call (None: use the pool)."""
    if conn is None or isinstance(conn, psycopg.Connection):
        return conn
    if isinstance(conn, psycopg.AsyncConnection):
        raise InvalidOption("conn= is an async psycopg connection: call the _async method")
    family = _family(conn)
    if family == "sqlalchemy":
        return _sqlalchemy_sync(conn)
    if family == "django":
        return _django(conn)
    raise InvalidOption(_unsupported(conn))


async def async_connection(conn: object | None) -> psycopg.AsyncConnection[Any] | None:
    """The psycopg async connection of ``conn`` for an ``_async`` call."""
    if conn is None or isinstance(conn, psycopg.AsyncConnection):
        return conn
    if isinstance(conn, psycopg.Connection):
        raise InvalidOption(
            "conn= is a sync psycopg connection: call the method without _async, "
            "or pass a psycopg.AsyncConnection"
        )
    family = _family(conn)
    if family == "sqlalchemy":
        return await _sqlalchemy_async(conn)
    if family == "django":
        raise InvalidOption(
            "Django's database connection is synchronous: call the sync method "
            "(from async code, through asgiref's sync_to_async)"
        )
    raise InvalidOption(_unsupported(conn))


def _family(conn: object) -> str:
    return type(conn).__module__.partition(".")[0]


def _unsupported(conn: object) -> str:
    kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
    return (
        f"conn= got a {kind}: pass a psycopg 3 connection, a SQLAlchemy 2 "
        "Connection/Session/AsyncConnection/AsyncSession on the psycopg driver, "
        "or Django's django.db.connection"
    )


# --- SQLAlchemy ---------------------------------------------------------------

_SQLALCHEMY_DRIVER = (
    "postgresql+psycopg:// in the engine URL, and for async engines too; "
    "psycopg2, asyncpg, pg8000 and others cannot share their transaction with pgqueue"
)


def _sqlalchemy_sync(conn: Any) -> psycopg.Connection[Any]:
    kind = type(conn).__name__
    if kind in ("AsyncSession", "AsyncConnection", "async_scoped_session"):
        raise InvalidOption(f"conn= is a SQLAlchemy {kind}: call the _async method")
    if kind == "scoped_session":
        conn = conn()
    if hasattr(conn, "get_bind") and not hasattr(conn, "dialect"):  # a Session
        conn = conn.connection()  # begins the session's transaction if none is open
    elif not conn.in_transaction():
        # Like the autobegin of conn.execute(): the job belongs to the transaction
        # that the caller's next conn.commit() or conn.rollback() ends.
        conn.begin()
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidOption(_sqlalchemy_wrong_driver(conn.dialect.driver))
    return raw


async def _sqlalchemy_async(conn: Any) -> psycopg.AsyncConnection[Any]:
    kind = type(conn).__name__
    if kind == "async_scoped_session":
        conn = conn()
        kind = type(conn).__name__
    if kind == "AsyncSession":
        conn = await conn.connection()
    elif kind != "AsyncConnection":
        raise InvalidOption(
            f"conn= is a sync SQLAlchemy {kind}: call the method without _async, "
            "or pass an AsyncConnection or AsyncSession"
        )
    if not conn.in_transaction():
        await conn.begin()
    raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise InvalidOption(_sqlalchemy_wrong_driver(conn.dialect.driver))
    return raw


def _sqlalchemy_wrong_driver(driver: str) -> str:
    return f"{_PSYCOPG3}this SQLAlchemy engine uses {driver!r}: use {_SQLALCHEMY_DRIVER}"


# --- Django -------------------------------------------------------------------


def _django(conn: Any) -> psycopg.Connection[Any]:
    vendor = getattr(conn, "vendor", None)
    if vendor != "postgresql":
        raise InvalidOption(f"conn= is a Django connection to {vendor!r}: pgqueue needs PostgreSQL")
    conn.ensure_connection()
    raw = conn.connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidOption(
            f"{_PSYCOPG3}Django uses {type(raw).__module__.partition('.')[0]}: install "
            "psycopg 3 (Django >= 4.2 prefers it over psycopg2 when both are installed)"
        )
    return raw
