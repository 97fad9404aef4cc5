"""Enqueue inside the caller's transaction (``conn=``), and the NOTIFY that wakes workers.

"No notification" is proven without waiting for a timeout: the listener sends
its own sentinel after the act and reads up to it (see ``Listener.drain``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.fixtures.dbstate import Listener
from tests.fixtures.factory import JobFactory


def job_count(job_factory: JobFactory) -> int:
    row = job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    assert row is not None
    count: int = row[0]
    return count


def wakeups(payloads: list[str]) -> list[str]:
    """The enqueue notifications ("j:<queue>", or "j:<queue>#<job id>" for
    one job: shown without the id) among the payloads."""
    return [p.partition("#")[0] for p in payloads if p.startswith("j:")]


def test_enqueue_with_conn_commits_with_the_callers_transaction(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as caller:
        caller.execute("CREATE TABLE public.orders (id int)")
        caller.execute("INSERT INTO public.orders VALUES (1)")
        result = app.enqueue("ship", {"order": 1}, queue="shipping", conn=caller)
        assert result.created is True

        # Not visible (and not leasable) before the caller commits.
        assert job_count(job_factory) == 0
        assert app.lease("shipping", "w1") == []
        assert wakeups(listener.drain()) == []

        caller.commit()

    assert job_factory.row(result.job_id)["payload"] == {"order": 1}
    assert wakeups(listener.drain()) == ["j:shipping"]
    assert [j.job_id for j in app.lease("shipping", "w1")] == [result.job_id]


def test_rolled_back_enqueue_leaves_no_job_and_wakes_nobody(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    @app.task(queue="mail")
    def send(to: str) -> None: ...

    with psycopg.connect(db_dsn) as caller:
        app.enqueue("t", {"a": 1}, conn=caller)
        send.with_options(conn=caller).enqueue(to="x")
        app.enqueue_many([pgqueue.JobSpec("t", {"i": i}) for i in range(100)], conn=caller)
        caller.rollback()

    assert job_count(job_factory) == 0
    assert wakeups(listener.drain()) == []
    assert app.lease(None, "w1", max=10) == []


def test_enqueue_with_conn_takes_part_in_a_failing_transaction(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    def place_order() -> None:
        with psycopg.connect(db_dsn) as caller:
            app.enqueue("t", conn=caller)
            caller.execute("SELECT 1 / 0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        place_order()

    assert job_count(job_factory) == 0
    assert wakeups(listener.drain()) == []


def test_task_with_options_conn_commits(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    @app.task
    def send(to: str) -> None: ...

    with psycopg.connect(db_dsn) as caller:
        result = send.with_options(conn=caller, priority=3).enqueue(to="x")
        assert job_count(job_factory) == 0
    # The connection's context manager commits on a clean exit.
    assert job_factory.row(result.job_id)["priority"] == 3


def test_enqueue_with_conn_in_autocommit_is_visible_at_once(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as caller:
        result = app.enqueue("t", conn=caller)
        assert job_count(job_factory) == 1
    assert job_factory.row(result.job_id)["status"] == "queued"


def test_async_enqueue_with_an_async_connection(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener, db_dsn: str
) -> None:
    @app.task(queue="mail")
    def send(to: str) -> None: ...

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            async with await psycopg.AsyncConnection.connect(db_dsn) as caller:
                await app.enqueue_async("t", {"rolled": "back"}, conn=caller)
                await app.enqueue_many_async([pgqueue.JobSpec("t")] * 3, conn=caller)
                await caller.rollback()
                out["after_rollback"] = job_count(job_factory)
                out["notes_after_rollback"] = wakeups(listener.drain())

                kept = await app.enqueue_async("t", {"kept": True}, conn=caller)
                by_task = await send.with_options(conn=caller).enqueue_async(to="y")
                many = await app.enqueue_many_async(
                    [pgqueue.JobSpec("t", {"i": 1}, queue="bulk")], conn=caller
                )
                out["before_commit"] = job_count(job_factory)
                await caller.commit()
                out["ids"] = [kept.job_id, by_task.job_id, many[0].job_id]
        finally:
            await app.close_async()
        return out

    out = asyncio.run(main())

    assert out["after_rollback"] == 0
    assert out["notes_after_rollback"] == []
    assert out["before_commit"] == 0
    rows = [job_factory.row(job_id) for job_id in out["ids"]]
    assert [(r["queue"], r["payload"]) for r in rows] == [
        ("default", {"kept": True}),
        ("mail", {"to": "y"}),
        ("bulk", {"i": 1}),
    ]
    assert sorted(wakeups(listener.drain())) == ["j:bulk", "j:default", "j:mail"]


# --- notifications ------------------------------------------------------------------------


def test_enqueue_many_of_ten_thousand_jobs_notifies_once_per_queue(
    app: pgqueue.App, job_factory: JobFactory, listener: Listener
) -> None:
    queues = ["q0", "q1", "q2"]
    specs = [pgqueue.JobSpec("bulk", {"i": i}, queue=queues[i % 3]) for i in range(10_000)]

    app.enqueue_many(specs)

    assert job_count(job_factory) == 10_000
    assert sorted(wakeups(listener.drain())) == ["j:q0", "j:q1", "j:q2"]


def test_every_ready_enqueue_notifies_its_queue(app: pgqueue.App, listener: Listener) -> None:
    app.enqueue("t", queue="a")
    app.enqueue("t", queue="b")
    assert wakeups(listener.drain()) == ["j:a", "j:b"]


def test_dedup_hit_sends_no_notification(app: pgqueue.App, listener: Listener) -> None:
    app.enqueue("t", dedup_key="k")
    assert wakeups(listener.drain()) == ["j:default"]
    app.enqueue("t", dedup_key="k")
    assert wakeups(listener.drain()) == []


def test_other_schema_uses_its_own_channel(
    app: pgqueue.App, listener: Listener, db_dsn: str
) -> None:
    pgqueue.App(dsn=db_dsn, schema="other").migrate()
    other = Listener(db_dsn, channel="pgqueue.other")
    try:
        with pgqueue.App(dsn=db_dsn, schema="other") as other_app:
            other_app.enqueue("t", queue="x")
        assert wakeups(other.drain()) == ["j:x"]
        assert wakeups(listener.drain()) == []
    finally:
        other.close()


# --- dedup inside a caller's transaction --------------------------------------------------


def test_dedup_inside_one_transaction(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn) as caller:
        first = app.enqueue("t", dedup_key="k", conn=caller)
        again = app.enqueue("t", dedup_key="k", conn=caller)
        in_batch = app.enqueue_many([pgqueue.JobSpec("t", dedup_key="k")], conn=caller)
    assert first.created is True
    assert again == pgqueue.Enqueued(first.job_id, False)
    assert in_batch == [pgqueue.Enqueued(first.job_id, False)]
    assert job_count(job_factory) == 1


def test_a_dedup_hit_in_an_open_transaction_does_not_hold_back_the_live_job(
    app: pgqueue.App, db_dsn: str
) -> None:
    live = app.enqueue("t", dedup_key="k").job_id
    with psycopg.connect(db_dsn) as caller:
        assert app.enqueue("t", dedup_key="k", conn=caller) == pgqueue.Enqueued(live, False)
        # The caller's transaction is still open (say, a long request).
        leased = app.lease("default", "w1")
        caller.rollback()
    assert [j.job_id for j in leased] == [live]


def test_a_dedup_hit_in_an_open_transaction_does_not_block_the_running_job(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    live = app.enqueue("t", dedup_key="k").job_id
    (leased,) = app.lease("default", "w1")
    # The worker gives up waiting for a row lock after 2 s instead of hanging the test.
    worker_dsn = f"{db_dsn}?options=-c%20lock_timeout%3D2000"
    with psycopg.connect(db_dsn) as caller, pgqueue.App(dsn=worker_dsn) as worker:
        app.enqueue("t", dedup_key="k", conn=caller)
        try:
            assert worker.extend(leased, 60) is True
            worker.ack(leased)
        finally:
            caller.rollback()
    assert job_factory.row(live)["status"] == "succeeded"
