"""Where settings come from: the DSN (argument, then PGQUEUE_DSN, then
DATABASE_URL, then libpq's own defaults)."""

from __future__ import annotations

import os


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use; ``""`` lets libpq use PGHOST, PGUSER, ... and its defaults."""
    if dsn:
        return dsn
    return os.environ.get("PGQUEUE_DSN") or os.environ.get("DATABASE_URL") or ""


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
