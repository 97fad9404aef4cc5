"""conn= with real SQLAlchemy 2 (psycopg driver): the job shares the
session's transaction — commit → it exists (and runs), rollback → it does
not, savepoints roll back with their jobs; NOTIFY fires at commit."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.errors import InvalidOption
from tests.fixtures.dbstate import row_counts

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


def _url(dsn: str, driver: str = "psycopg") -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = info.get("user", "")
    if info.get("password"):
        auth += f":{info['password']}"
    return (
        f"postgresql+{driver}://{auth}@{info.get('host', 'localhost')}:{info.get('port', 5432)}"
        f"/{info['dbname']}"
    )


@pytest.fixture
def engine(db_dsn: str) -> Any:
    eng = create_engine(_url(db_dsn))
    with eng.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, job_id bigint)"))
    yield eng
    eng.dispose()


def _jobs(dsn: str) -> int:
    return row_counts(dsn)["jobs"]


def test_session_commit_and_rollback(app: pgqueue.App, engine: Any, db_dsn: str) -> None:
    with Session(engine) as session:
        job = app.enqueue("ship", {"order": 1}, conn=session)
        session.execute(text("INSERT INTO orders (job_id) VALUES (:j)"), {"j": job.job_id})
        assert _jobs(db_dsn) == 0  # not visible outside the open transaction
        session.commit()
    assert _jobs(db_dsn) == 1
    with Session(engine) as session:
        app.enqueue("ship", {"order": 2}, conn=session)
        session.execute(text("INSERT INTO orders (job_id) VALUES (0)"))
        session.rollback()
    assert _jobs(db_dsn) == 1
    with Session(engine) as session, session.begin():
        # Session.begin(): the context manager commits.
        app.enqueue_many([pgqueue.JobSpec("ship"), pgqueue.JobSpec("ship")], conn=session)
    assert _jobs(db_dsn) == 3


def test_connection_commit_rollback_and_savepoint(
    app: pgqueue.App, engine: Any, db_dsn: str
) -> None:
    with engine.connect() as conn:
        app.enqueue("ship", {}, conn=conn)  # autobegins like conn.execute()
        conn.rollback()
        app.enqueue("ship", {"kept": True}, conn=conn)
        savepoint = conn.begin_nested()
        app.enqueue("ship", {"kept": False}, conn=conn)
        savepoint.rollback()
        conn.commit()
    with psycopg.connect(db_dsn) as check:
        payloads = [r[0] for r in check.execute("SELECT payload FROM pgqueue.jobs")]
    assert payloads == [{"kept": True}]
    with engine.begin() as conn:
        task = app.task(name="ship")(lambda **_: None)
        task.with_options(conn=conn).enqueue(n=1)
    assert _jobs(db_dsn) == 2


def test_session_savepoint(app: pgqueue.App, engine: Any, db_dsn: str) -> None:
    with Session(engine) as session:
        app.enqueue("ship", {"n": 1}, conn=session)
        with session.begin_nested() as nested:
            app.enqueue("ship", {"n": 2}, conn=session)
            nested.rollback()
        with session.begin_nested():
            app.enqueue("ship", {"n": 3}, conn=session)
        session.commit()
    with psycopg.connect(db_dsn) as check:
        payloads = sorted(r[0]["n"] for r in check.execute("SELECT payload FROM pgqueue.jobs"))
    assert payloads == [1, 3]


def test_committed_job_runs_and_notify_waits_for_commit(
    app: pgqueue.App, engine: Any, db_dsn: str
) -> None:
    ran: list[int] = []

    @app.task(name="record")
    def record(n: int) -> None:
        ran.append(n)

    listener = psycopg.connect(db_dsn, autocommit=True)
    listener.execute('LISTEN "pgqueue.pgqueue"')
    try:
        with Session(engine) as session:
            app.enqueue("record", {"n": 7}, conn=session)
            assert list(listener.notifies(timeout=0.3)) == []  # nothing before commit
            session.commit()
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert notes
        assert notes[0].payload.split("#")[0] == "j:default"  # "#<id>" when one job
    finally:
        listener.close()

    async def run() -> None:
        stop = asyncio.Event()
        worker = asyncio.create_task(app.run_worker_async(stop=stop, install_signal_handlers=False))
        for _ in range(200):
            if ran:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await worker
        await app.close_async()

    asyncio.run(run())
    assert ran == [7]


def test_async_session_and_connection(app: pgqueue.App, db_dsn: str) -> None:
    async def run() -> None:
        engine = create_async_engine(_url(db_dsn))
        try:
            async with AsyncSession(engine) as session:
                await app.enqueue_async("ship", {"n": 1}, conn=session)
                await session.commit()
            async with AsyncSession(engine) as session:
                await app.enqueue_async("ship", {"n": 2}, conn=session)
                async with session.begin_nested() as nested:
                    await app.enqueue_async("ship", {"n": 3}, conn=session)
                    await nested.rollback()
                await session.rollback()
            async with engine.begin() as conn:
                await app.enqueue_many_async([pgqueue.JobSpec("ship", {"n": 4})], conn=conn)
            async with engine.connect() as conn:
                await app.enqueue_async("ship", {"n": 5}, conn=conn)
                await conn.rollback()
            async with AsyncSession(engine) as session:
                with pytest.raises(InvalidOption, match="_async"):
                    app.enqueue("ship", {}, conn=session)
        finally:
            await engine.dispose()
            await app.close_async()

    asyncio.run(run())
    with psycopg.connect(db_dsn) as check:
        payloads = sorted(r[0]["n"] for r in check.execute("SELECT payload FROM pgqueue.jobs"))
    assert payloads == [1, 4]


def test_sync_connection_refused_by_async_twin(app: pgqueue.App, engine: Any) -> None:
    async def run() -> None:
        with Session(engine) as session, pytest.raises(InvalidOption, match="without _async"):
            await app.enqueue_async("ship", {}, conn=session)

    asyncio.run(run())


def test_unsupported_driver_says_what_to_do(app: pgqueue.App, db_dsn: str) -> None:
    pytest.importorskip("psycopg2")
    engine = create_engine(_url(db_dsn, "psycopg2"))
    try:
        with (
            Session(engine) as session,
            pytest.raises(InvalidOption, match=r"psycopg2.*postgresql\+psycopg://"),
        ):
            app.enqueue("ship", {}, conn=session)
    finally:
        engine.dispose()


def test_asyncpg_says_what_to_do(app: pgqueue.App, db_dsn: str) -> None:
    pytest.importorskip("asyncpg")

    async def run() -> None:
        engine = create_async_engine(_url(db_dsn, "asyncpg"))
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(InvalidOption, match=r"asyncpg.*postgresql\+psycopg://"):
                    await app.enqueue_async("ship", {}, conn=session)
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_other_objects_are_refused(app: pgqueue.App, db_dsn: str) -> None:
    with pytest.raises(InvalidOption, match=r"conn= got a builtins\.str"):
        app.enqueue("ship", {}, conn="postgresql://")
    assert _jobs(db_dsn) == 0
