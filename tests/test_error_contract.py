"""One error contract at the database boundary: whatever PostgreSQL raises
leaves pgqueue as a ``pgqueue.errors`` type that says whether it may pass
(``transient``) and which SQLSTATE it was. Faults are real: timeouts from
settings in the DSN, locks held by another session, a read-only database."""

from __future__ import annotations

import ast
import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.connection import ErrorTranslator, is_transient_sqlstate
from pgqueue.errors import ConnectionFailed, DatabaseError, QueryFailed, SchemaNotMigrated

PACKAGE = Path(pgqueue.__file__).parent
# The modules that may talk to psycopg's errors: the database boundary
# (tests/unit/test_layers.py holds the same list, for SQL too).
BOUNDARY = {"connection.py", "database.py", "driver_async.py", "driver_sync.py"}


@pytest.fixture
def jobs_locked(db_dsn: str) -> Iterator[None]:
    """Another session holds ACCESS EXCLUSIVE on pgqueue.jobs, as a migration would."""
    with psycopg.connect(db_dsn) as conn:
        conn.execute("LOCK TABLE pgqueue.jobs IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def test_a_lock_timeout_is_a_transient_query_failure(db_dsn: str, jobs_locked: None) -> None:
    with (
        pgqueue.App(make_conninfo(db_dsn, options="-c lock_timeout=100ms")) as app,
        pytest.raises(QueryFailed) as caught,
    ):
        app.enqueue("t", {})
    assert caught.value.sqlstate == "55P03"
    assert caught.value.transient
    assert isinstance(caught.value, DatabaseError)
    assert "lock timeout" in str(caught.value)


def test_a_statement_timeout_is_a_transient_query_failure_async(
    db_dsn: str, jobs_locked: None
) -> None:
    async def lease() -> None:
        async with pgqueue.App(make_conninfo(db_dsn, options="-c statement_timeout=100ms")) as app:
            await app.lease_async("default", "w")

    with pytest.raises(QueryFailed) as caught:
        asyncio.run(lease())
    assert (caught.value.sqlstate, caught.value.transient) == ("57014", True)


def test_a_read_only_session_is_transient_and_dropped_from_the_pool(db_dsn: str) -> None:
    with pgqueue.App(db_dsn, pool_min_size=1, pool_max_size=1) as app:
        # The pool's one session turns read-only, as a session to a server
        # that became a standby does; sessions opened later are writable.
        # (ALTER DATABASE ... SET default_transaction_read_only raced the
        # pool: a session it reopened before the setting was reset stayed
        # read-only, and the last enqueue failed.)
        with app._database.pool().connection() as conn:
            conn.execute("SET SESSION default_transaction_read_only = on")
        with pytest.raises(QueryFailed) as caught:
            app.enqueue("t", {})
        assert (caught.value.sqlstate, caught.value.transient) == ("25006", True)
        # As after a failover: the read-only session must not be handed out again.
        assert app.enqueue("t", {}).job_id > 0


def test_errors_nobody_can_wait_out_are_not_transient(db_dsn: str) -> None:
    translate = ErrorTranslator("pgqueue", db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as division:
            conn.execute("SELECT 1 / 0")
        with pytest.raises(psycopg.Error) as missing:
            conn.execute("SELECT * FROM pgqueue.no_such_table")
    error = translate(division.value)
    assert isinstance(error, QueryFailed)
    assert (error.sqlstate, error.transient) == ("22012", False)
    assert isinstance(translate(missing.value), SchemaNotMigrated)
    assert not translate(missing.value).transient  # type: ignore[attr-defined]


def test_a_lost_connection_is_transient_and_a_missing_database_is_not(db_dsn: str) -> None:
    with (
        psycopg.connect(db_dsn, autocommit=True) as admin,
        psycopg.connect(db_dsn, autocommit=True) as victim,
    ):
        admin.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(psycopg.Error) as lost:
            victim.execute("SELECT 1")
    error = ErrorTranslator("pgqueue", db_dsn)(lost.value)
    assert isinstance(error, ConnectionFailed)
    assert error.transient
    gone = make_conninfo(db_dsn, dbname="pgqueue_no_such_database")
    with pytest.raises(ConnectionFailed) as caught:
        pgqueue.App(gone).enqueue("t", {})
    assert not caught.value.transient
    assert caught.value.sqlstate == "3D000"


def test_migrate_version_reads_and_grants_go_through_the_boundary(db_dsn: str) -> None:
    from pgqueue.grants import grant
    from pgqueue.migrate import current

    gone = make_conninfo(db_dsn, dbname="pgqueue_no_such_database")
    with pytest.raises(ConnectionFailed):
        current(gone)
    with pytest.raises(ConnectionFailed):
        grant("someone", "worker", dsn=gone)
    assert current(db_dsn) is not None
    assert current(db_dsn, schema="never_migrated") is None


@pytest.mark.parametrize(
    ("state", "transient"),
    [
        ("55P03", True),
        ("57014", True),
        ("40P01", True),
        ("40001", True),
        ("25006", True),
        ("53300", True),
        ("53100", True),
        ("57P01", True),
        ("57P02", True),
        ("57P03", True),
        ("08006", True),
        (None, True),
        ("22012", False),
        ("23505", False),
        ("42501", False),
        ("42P01", False),
        ("XX000", False),
    ],
)
def test_the_transient_sqlstates(state: str | None, transient: bool) -> None:
    assert is_transient_sqlstate(state) is transient


def test_nothing_outside_the_database_layer_handles_psycopg_errors() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in BOUNDARY:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = ast.unparse(node.type)
                if "psycopg" in caught or "pg_errors" in caught:
                    offenders.append(f"{path.name}:{node.lineno}: except {caught}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "psycopg.errors"
            ):
                offenders.append(f"{path.name}:{node.lineno}: imports psycopg.errors")
    assert offenders == []


def _twins() -> list[tuple[str, str]]:
    names = [n for n, _ in inspect.getmembers(pgqueue.App, inspect.isfunction)]
    return [
        (name, f"{name}_async")
        for name in names
        if not name.startswith("_") and f"{name}_async" in names
    ]


def test_every_sync_app_method_has_an_async_twin_with_the_same_signature() -> None:
    twins = _twins()
    assert len(twins) > 30  # every public operation
    mismatched = []
    for sync_name, async_name in twins:
        sync_fn = getattr(pgqueue.App, sync_name)
        async_fn = getattr(pgqueue.App, async_name)
        sync_sig = inspect.signature(sync_fn)
        async_sig = inspect.signature(async_fn)
        if sync_name in ("subscribe", "transaction"):  # sync and async context managers
            async_sig = async_sig.replace(return_annotation=sync_sig.return_annotation)
        else:
            assert inspect.iscoroutinefunction(async_fn), async_name
        if sync_name == "run_worker":  # the async twin also takes the stop event
            async_sig = async_sig.replace(
                parameters=[p for n, p in async_sig.parameters.items() if n != "stop"]
            )
        # The only difference allowed: a caller's connection is async for the twin.
        sync_params = [
            (p.name, p.kind, p.default, str(p.annotation).replace("SyncConn", "Conn"))
            for p in sync_sig.parameters.values()
        ]
        async_params = [
            (p.name, p.kind, p.default, str(p.annotation).replace("AsyncConn", "Conn"))
            for p in async_sig.parameters.values()
        ]
        if sync_params != async_params or sync_sig.return_annotation != (
            async_sig.return_annotation
        ):
            mismatched.append(f"{sync_name}{sync_sig} vs {async_name}{async_sig}")
    assert mismatched == []
    public = {n for n in dir(pgqueue.App) if not n.startswith("_")}
    lonely = {n for n in public if n.endswith("_async") and n[: -len("_async")] not in public}
    assert lonely == set()
