"""How a dependency's end reaches its dependents: noted per row by the
triggers' WHEN, counted off once per statement and dependent
(``jobs_release_dependents``), in the transaction that ends it; concurrent
acks of siblings, rolled back subtransactions and requeued dependencies."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobStatus

LEASE = "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY[%s]::text[], 'w', %s)"
ACK = "SELECT count(*) FROM pgqueue.ack_jobs(%s::bigint[], %s::bigint[], NULL)"


def fan_in(app: pgqueue.App, leaves: int, queue: str = "leaves") -> tuple[list[int], int]:
    wf = app.workflow(f"fan-in-{queue}")
    steps = [wf.add("leaf", {}, queue=queue, name=f"leaf-{n}") for n in range(leaves)]
    wf.add("callback", {}, after=steps, queue="callbacks")
    run = wf.enqueue()
    return [run.jobs[f"leaf-{n}"] for n in range(leaves)], run.jobs["callback"]


def lease(conn: psycopg.Connection[Any], queue: str, n: int) -> list[tuple[int, int]]:
    return [tuple(r) for r in conn.execute(LEASE, (queue, n)).fetchall()]  # type: ignore[misc]


def ack(conn: psycopg.Connection[Any], jobs: list[tuple[int, int]]) -> None:
    conn.execute(ACK, ([j[0] for j in jobs], [j[1] for j in jobs]))


def waits(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, int]:
    row = conn.execute(
        "SELECT j.status::text, w.pending FROM pgqueue.jobs j"
        " JOIN pgqueue.job_waits w ON w.job_id = j.id WHERE j.id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_one_statement_acking_many_leaves_counts_them_off_at_once(
    app: pgqueue.App, db_dsn: str
) -> None:
    _, callback = fan_in(app, 300)
    with psycopg.connect(db_dsn, autocommit=True) as setup, psycopg.connect(db_dsn) as conn:
        jobs = lease(setup, "leaves", 300)
        ack(conn, jobs[:299])
        # One counter update per dependent and statement, not one per leaf.
        updates = conn.execute(
            "SELECT n_tup_upd FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'pgqueue' AND relname = 'job_waits'"
        ).fetchone()
        assert updates == (1,)
        assert waits(conn, callback) == ("waiting", 1)
        conn.commit()
        ack(setup, jobs[299:])
        assert waits(setup, callback) == ("queued", 0)
        notes = setup.execute("SELECT current_setting('pgqueue.ended_dependencies', true)")
        assert notes.fetchone() in ((None,), ("",))


def test_siblings_acked_concurrently_release_the_callback_exactly_once(
    app: pgqueue.App, db_dsn: str
) -> None:
    _, callback = fan_in(app, 2)
    with (
        psycopg.connect(db_dsn, autocommit=True) as setup,
        psycopg.connect(db_dsn) as first,
        psycopg.connect(db_dsn) as second,
    ):
        one, two = lease(setup, "leaves", 2)
        ack(first, [one])  # not committed: holds the callback's counter
        done = threading.Event()

        def ack_second() -> None:
            ack(second, [two])
            second.commit()
            done.set()

        thread = threading.Thread(target=ack_second)
        thread.start()
        time.sleep(0.3)
        assert not done.is_set()  # waits for the first, then counts from its result
        assert waits(setup, callback) == ("waiting", 2)
        first.commit()
        thread.join(10)
        assert done.is_set()
        assert waits(setup, callback) == ("queued", 0)


def test_an_ack_rolled_back_with_its_savepoint_counts_nothing(
    app: pgqueue.App, db_dsn: str
) -> None:
    _, callback = fan_in(app, 2)
    with psycopg.connect(db_dsn, autocommit=True) as setup, psycopg.connect(db_dsn) as conn:
        one, two = lease(setup, "leaves", 2)
        ack(conn, [one])
        conn.execute("SAVEPOINT s")
        ack(conn, [two])
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.commit()
        assert waits(setup, callback) == ("waiting", 1)
        ack(setup, [two])
        assert waits(setup, callback) == ("queued", 0)


def test_a_statement_ending_dependencies_of_several_dependents_counts_each(
    app: pgqueue.App, db_dsn: str
) -> None:
    _, a_callback = fan_in(app, 3, "qa")
    _, b_callback = fan_in(app, 2, "qb")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        jobs = lease(conn, "qa", 3) + lease(conn, "qb", 2)
        ack(conn, jobs[:2] + jobs[3:])
        assert waits(conn, a_callback) == ("waiting", 1)
        assert waits(conn, b_callback) == ("queued", 0)
        ack(conn, jobs[2:3])
        assert waits(conn, a_callback) == ("queued", 0)


def test_a_cancellation_cascades_through_the_graph_in_one_statement(
    app: pgqueue.App, db_dsn: str
) -> None:
    wf = app.workflow("chain")
    first = wf.add("a", {}, queue="q")
    second = wf.add("b", {}, after=first)
    third = wf.add("c", {}, after=second)
    wf.add("d", {}, after=third, allow_failed=True)
    run = wf.enqueue()
    app.cancel(run.jobs["a"])
    assert [app.get_job(run.jobs[n]).status for n in "abc"] == [JobStatus.CANCELLED] * 3
    assert app.get_job(run.jobs["c"]).last_error == f"dependency {run.jobs['b']} ended cancelled"
    assert app.get_job(run.jobs["d"]).status is JobStatus.QUEUED
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert waits(conn, run.jobs["d"]) == ("queued", 0)


def test_a_requeued_dependency_is_waited_for_again(app: pgqueue.App, db_dsn: str) -> None:
    wf = app.workflow("requeued")
    a = wf.add("a", {}, queue="qa")
    b = wf.add("b", {}, queue="qb")
    wf.add("c", {}, after=[a, b], allow_failed=True, queue="qc")
    run = wf.enqueue()
    c = run.jobs["c"]

    (first,) = app.lease("qa", "w1")
    app.fail(first, "boom", permanent=True)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert waits(conn, c) == ("waiting", 1)
        app.requeue_dead(run.jobs["a"])
        assert waits(conn, c) == ("waiting", 2)  # a has not ended any more
        (b_job,) = app.lease("qb", "w1")
        app.ack(b_job)
        assert waits(conn, c) == ("waiting", 1)  # still waits for a
        (again,) = app.lease("qa", "w1")
        app.ack(again)
        assert waits(conn, c) == ("queued", 0)


@pytest.mark.parametrize("end", ["ack", "delete"])
def test_a_dependency_ended_in_a_longer_transaction_releases_at_its_statement(
    app: pgqueue.App, db_dsn: str, end: str
) -> None:
    leaves, callback = fan_in(app, 1)
    with psycopg.connect(db_dsn) as conn:
        jobs = lease(conn, "leaves", 1)
        if end == "ack":
            ack(conn, jobs)
            assert waits(conn, callback) == ("queued", 0)
        else:
            conn.execute("DELETE FROM pgqueue.jobs WHERE id = %s", (leaves[0],))
            assert waits(conn, callback)[0] == "cancelled"
        conn.rollback()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert waits(conn, callback) == ("waiting", 1)
