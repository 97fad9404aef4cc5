"""A fresh migrated schema per test, and a PostgreSQL to put it in."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.app import App

__all__ = ["TEST_DSN_ENV", "isolated", "server_for_tests"]

TEST_DSN_ENV = "PGQUEUE_TEST_DSN"

#: What an App derives from its DSN and schema (swapped, then put back).
_BOUND = (
    "schema",
    "dsn",
    "listen_dsn",
    "_queries",
    "_database",
    "_listen_database",
    "op_context",
    "_hub",
)


@contextmanager
def isolated(app: App, dsn: str | None = None, prefix: str = "pgqueue_test") -> Iterator[App]:
    """Point ``app`` (in place: its tasks keep working) at a new schema
    ``<prefix>_<random>`` in ``dsn`` (default: the app's own database),
    migrated to head; on exit drop the schema and point ``app`` back::

        with isolated(app, "postgresql://localhost/test"):
            send_receipt.enqueue(order_id=42)

    Only where the App points changes (its DSN and schema, and what derives
    from them: statements, pools, LISTEN target, subscriptions); its tasks,
    their defaults, its middleware (``before_enqueue`` included), clock and
    size limits stay the App's own.
    """
    from pgqueue.app import App

    saved = {name: getattr(app, name) for name in _BOUND}
    schema = f"{prefix}_{secrets.token_hex(5)}"
    # A fresh App only for what derives from the new DSN and schema.
    fresh = App(
        dsn or app.dsn,
        schema,
        max_payload_bytes=app.max_payload_bytes,
        max_result_bytes=app.max_result_bytes,
        pool_min_size=app._database.min_size,
        pool_max_size=app._database.max_size,
        pool_timeout=app._database.timeout,
        listen=app.listen,
        pooler=app.pooler,
    )
    bound = {name: getattr(fresh, name) for name in _BOUND}
    # LISTEN on the test database itself (never on a PGQUEUE_LISTEN_DSN of the environment).
    bound["listen_dsn"] = fresh.dsn if fresh.listen else None
    bound["_listen_database"] = fresh._database
    # The app's own operation context, pointed at the new schema: its task
    # defaults, clock and middleware list (the same list: add_middleware
    # during the test still counts) stay.
    bound["op_context"] = replace(app.op_context, schema=fresh.schema, queries=fresh._queries)
    app.close()  # the old schema's pools and subscriptions
    _bind(app, bound)
    try:
        app.migrate()
        yield app
    finally:
        try:
            app.uninstall()
        finally:
            app.close()
            _bind(app, saved)


def _bind(app: App, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(app, name, value)


@contextmanager
def server_for_tests() -> Iterator[str | None]:
    """A DSN for tests: ``PGQUEUE_TEST_DSN``, else a throwaway embedded
    PostgreSQL (``pgqueue[embedded]``) stopped on exit, else None."""
    if dsn := os.environ.get(TEST_DSN_ENV, "").strip():
        yield dsn
        return
    from pgqueue import embedded

    try:
        embedded.bindir()
    except embedded.EmbeddedUnavailable:
        yield None
        return
    base = Path(tempfile.mkdtemp(prefix="pgqueue-test-"))
    server = embedded.start(base / "data", embedded.free_port())
    try:
        yield server.dsn
    finally:
        embedded.stop(server.data_dir)
        shutil.rmtree(base, ignore_errors=True)
