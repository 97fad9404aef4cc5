"""The SQL API: ``<schema>.enqueue(...)`` called from any client inside its own transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
import pytest

import pgqueue
from tests.fixtures.cluster import create_database, drop_database, unique_db_name
from tests.fixtures.dbstate import Listener, snapshot
from tests.fixtures.factory import JobFactory


@pytest.fixture(scope="module")
def shared_db_dsn(
    pg_server_dsn: str, template_db: str, clone_strategy: Literal["FILE_COPY"] | None
) -> Iterator[str]:
    """One migrated database for the bad-input cases of this module (each compares
    the database before and after its own call, so they need not each clone one)."""
    name = unique_db_name("pgq_sqlapi")
    dsn = create_database(pg_server_dsn, name, template=template_db, strategy=clone_strategy)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)


def sql_enqueue(conn: psycopg.Connection[Any], call: str, params: Any = None) -> int:
    row = conn.execute(f"SELECT {call}", params).fetchone()
    assert row is not None
    job_id: int = row[0]
    return job_id


def test_sql_enqueue_inside_a_transaction(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as caller:
        job_id = sql_enqueue(caller, """pgqueue.enqueue('t', '{"a":1}', queue => 'mail')""")
        assert app.lease("mail", "w1") == []
        assert [p for p in listener.drain() if p.startswith("j:")] == []
        caller.commit()

    row = job_factory.row(job_id)
    assert (row["task"], row["payload"], row["queue"], row["status"]) == (
        "t",
        {"a": 1},
        "mail",
        "queued",
    )
    assert (row["priority"], row["max_attempts"], row["attempts"]) == (0, 5, 0)
    assert [p for p in listener.drain() if p.startswith("j:")] == [f"j:mail#{job_id}"]
    (leased,) = app.lease("mail", "w1")
    assert (leased.job_id, leased.task, leased.payload) == (job_id, "t", {"a": 1})
    app.ack(leased)
    assert app.get_job(job_id).status is pgqueue.JobStatus.SUCCEEDED


def test_sql_enqueue_with_only_a_task_name(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = sql_enqueue(job_factory.conn, "pgqueue.enqueue('bare')")
    row = job_factory.row(job_id)
    assert (row["queue"], row["payload"], row["status"]) == ("default", {}, "queued")


def test_sql_enqueue_rolled_back_leaves_nothing(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as caller:
        sql_enqueue(caller, "pgqueue.enqueue('t', queue => 'mail')")
        caller.rollback()

    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)
    assert [p for p in listener.drain() if p.startswith("j:")] == []


def test_sql_enqueue_every_option(app: pgqueue.App, job_factory: JobFactory) -> None:
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job_id = sql_enqueue(
        job_factory.conn,
        "pgqueue.enqueue(task => %(task)s, payload => %(payload)s::jsonb, queue => 'q',"
        " priority => 7, run_at => %(run_at)s, max_attempts => 2,"
        " dedup_key => 'd', serial_key => 's')",
        {"task": "full", "payload": '{"x": [1]}', "run_at": run_at},
    )

    row = job_factory.row(job_id)
    assert (row["task"], row["payload"], row["queue"], row["priority"]) == (
        "full",
        {"x": [1]},
        "q",
        7,
    )
    assert (row["run_at"], row["max_attempts"], row["dedup_key"], row["serial_key"]) == (
        run_at,
        2,
        "d",
        "s",
    )
    assert app.get_job(job_id).status is pgqueue.JobStatus.SCHEDULED


def test_sql_enqueued_priority_is_honoured(app: pgqueue.App, job_factory: JobFactory) -> None:
    low = app.enqueue("t").job_id
    high = sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', priority => 9)")
    assert [j.job_id for j in app.lease("default", "w1")] == [high]
    assert [j.job_id for j in app.lease("default", "w1")] == [low]


def test_sql_enqueue_dedups_with_python_enqueue(app: pgqueue.App, job_factory: JobFactory) -> None:
    first = sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', dedup_key => 'k')")
    second = sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', dedup_key => 'k')")
    from_python = app.enqueue("t", dedup_key="k")

    assert second == first
    assert from_python == pgqueue.Enqueued(first, False)
    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (1,)

    (leased,) = app.lease("default", "w1")
    app.ack(leased)
    assert sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', dedup_key => 'k')") != first


def test_sql_enqueued_serial_key_is_honoured(app: pgqueue.App, job_factory: JobFactory) -> None:
    first = sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', serial_key => 's')")
    sql_enqueue(job_factory.conn, "pgqueue.enqueue('t', serial_key => 's')")
    assert [j.job_id for j in app.lease("default", "w1", max=10)] == [first]


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ("pgqueue.enqueue('')", "task"),
        ("pgqueue.enqueue(NULL)", "task"),
        ("pgqueue.enqueue('t', queue => '')", "queue"),
        ("pgqueue.enqueue('t', queue => 'bad queue!')", "queue"),
        ("pgqueue.enqueue('t', queue => NULL)", "queue"),
        ("pgqueue.enqueue('t', '[1, 2]')", "payload"),
        ("pgqueue.enqueue('t', '\"text\"')", "payload"),
        ("pgqueue.enqueue('t', 'null'::jsonb)", "payload"),
        ("pgqueue.enqueue('t', max_attempts => -1)", "max_attempts"),
        ("pgqueue.enqueue('t', priority => 40000)", "priority"),
        pytest.param("pgqueue.enqueue('   ')", "task", id="blank-task"),
        pytest.param("pgqueue.enqueue(repeat('x', 256))", "task", id="long-task"),
        pytest.param("pgqueue.enqueue(E'tab\\there')", "task", id="control-task"),
    ],
)
def test_sql_enqueue_rejects_bad_input_clearly(shared_db_dsn: str, call: str, named: str) -> None:
    before = snapshot(shared_db_dsn)

    with (
        psycopg.connect(shared_db_dsn, autocommit=True) as caller,
        pytest.raises(psycopg.errors.InvalidParameterValue) as caught,
    ):
        sql_enqueue(caller, call)

    message = caught.value.diag.message_primary or ""
    assert message.startswith("pgqueue:")
    assert named in message
    assert snapshot(shared_db_dsn) == before


def test_sql_enqueue_is_picked_up_by_a_worker(app: pgqueue.App, job_factory: JobFactory) -> None:
    seen: list[dict[str, Any]] = []

    @app.task(name="from_sql")
    def handle(**payload: Any) -> str:
        seen.append(payload)
        return "handled"

    job_id = sql_enqueue(job_factory.conn, """pgqueue.enqueue('from_sql', '{"n": 5}')""")

    async def main() -> None:
        stop = asyncio.Event()
        worker = asyncio.create_task(
            app.run_worker_async(stop=stop, concurrency=1, scheduler=False, poll_interval=0.1)
        )
        try:
            async with asyncio.timeout(30):
                while (await app.get_job_async(job_id)).status is not pgqueue.JobStatus.SUCCEEDED:
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await worker
            await app.close_async()

    asyncio.run(main())

    assert seen == [{"n": 5}]
    assert app.get_job(job_id).result == "handled"
