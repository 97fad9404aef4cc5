"""Where settings come from: the DSN (argument, then PGQUEUE_DSN, then
DATABASE_URL, then libpq's environment (PGHOST, ...) when set, else
:data:`DEFAULT_DSN`)."""

from __future__ import annotations

import os

#: The DSN used when nothing names a database: what README states and what a
#: fresh PostgreSQL (or ``pgqueue dev``) answers on.
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

#: libpq environment variables that say where to connect: when any is set,
#: libpq's own resolution (``""``) is used instead of DEFAULT_DSN.
LIBPQ_TARGET_ENV = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def configured_dsn() -> str | None:
    """The DSN the environment names (PGQUEUE_DSN, DATABASE_URL), if any."""
    return os.environ.get("PGQUEUE_DSN") or os.environ.get("DATABASE_URL") or None


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: ``dsn``, PGQUEUE_DSN, DATABASE_URL, ``""`` (libpq's
    resolution) when a PG* variable says where, else :data:`DEFAULT_DSN`."""
    if dsn:
        return dsn
    if found := configured_dsn():
        return found
    if any(os.environ.get(name) for name in LIBPQ_TARGET_ENV):
        return ""
    return DEFAULT_DSN


POOLERS = ("session", "transaction")


def resolve_pooler(pooler: str | None) -> str | None:
    """The connection pooler in front of PostgreSQL: argument, else
    ``PGQUEUE_POOLER``; None (or ``"none"``) for a direct connection."""
    from pgqueue.errors import InvalidOption

    value = pooler if pooler is not None else os.environ.get("PGQUEUE_POOLER") or None
    if value is None or value == "none":
        return None
    if value not in POOLERS:
        source = "pooler" if pooler is not None else "PGQUEUE_POOLER"
        raise InvalidOption(f"{source} must be None, 'session' or 'transaction', got {value!r}")
    return value


def resolve_listen_dsn(listen_dsn: str | None) -> str | None:
    """A DSN for LISTEN connections that bypass a transaction pooler:
    argument, else ``PGQUEUE_LISTEN_DSN``."""
    return listen_dsn or os.environ.get("PGQUEUE_LISTEN_DSN") or None
