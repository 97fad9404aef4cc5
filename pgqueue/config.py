"""Where settings come from: the DSN (argument, then PGQUEUE_DSN, then
DATABASE_URL, then libpq's own defaults)."""

from __future__ import annotations

import os


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use; ``""`` lets libpq use PGHOST, PGUSER, ... and its defaults."""
    if dsn:
        return dsn
    return os.environ.get("PGQUEUE_DSN") or os.environ.get("DATABASE_URL") or ""
