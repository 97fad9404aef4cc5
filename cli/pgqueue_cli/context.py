"""What every command shares: the global options and the App they open."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pgqueue


@dataclass
class State:
    """Global options, set by the root callback before any command runs."""

    dsn: str | None = None
    schema: str = "pgqueue"
    pooler: str | None = None


state = State()


@contextmanager
def open_app() -> Iterator[pgqueue.App]:
    """An App on the global --dsn/--schema, closed when the command ends.

    A command runs a handful of statements one after another, so the pool
    holds at most two connections and opens none ahead of need.
    """
    app = pgqueue.App(
        dsn=state.dsn,
        schema=state.schema,
        pool_min_size=0,
        pool_max_size=2,
        pooler=state.pooler,
    )
    try:
        yield app
    finally:
        app.close()
