"""pgqueue through a real PgBouncer (tests/fixtures/pgbouncer.py).

Transaction mode with a server pool of 3 and round-robin server assignment:
consecutive transactions of one client land on different server sessions, so
a prepared statement, a session SET or a LISTEN through the pooler would
break. Producers, workers (LISTEN on a direct ``listen_dsn``, or polling),
``result()``, schedules, flow control and the CLI all run through it; session
mode needs nothing special.
"""

from __future__ import annotations

import time

import psycopg
import pytest

import pgqueue
from tests.cli_support import run_cli, run_json
from tests.fixtures.workers import Workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

POOLED = {"PGQUEUE_POOLER": "transaction"}


def test_a_declared_pooler_keeps_no_session_state(pgbouncer_dsn: str) -> None:
    with pgqueue.App(pgbouncer_dsn, pooler="transaction") as app:
        # far past psycopg's prepare threshold (5 executions of one statement)
        ids = [app.enqueue("echo", {"value": i}).job_id for i in range(40)]
        assert [app.get_job(i).payload for i in ids[:10]] == [{"value": i} for i in range(10)]
        batch = app.enqueue_many([pgqueue.JobSpec("echo", {"value": i}) for i in range(20)])
        assert len(batch) == 20
        assert app.metrics()["default"].queued == 60
        assert len(app.list_jobs(limit=100).jobs) == 60


def test_an_undeclared_pooler_breaks_on_prepared_statements(pgbouncer_dsn: str) -> None:
    """The control: without pooler="transaction", psycopg prepares a statement
    in one server session and later finds another one behind the pooler."""
    with pgqueue.App(pgbouncer_dsn) as app, pytest.raises(pgqueue.DatabaseError):  # noqa: PT012
        for i in range(60):
            app.get_job(app.enqueue("echo", {"value": i}).job_id)


def test_workers_through_the_pooler_listen_directly_and_results_arrive(
    pgbouncer_dsn: str, db_dsn: str, workers: Workers
) -> None:
    worker = workers.spawn(
        "--concurrency", "4", dsn=pgbouncer_dsn, env={**POOLED, "PGQUEUE_LISTEN_DSN": db_dsn}
    )
    worker.wait_registered()
    with pgqueue.App(pgbouncer_dsn, pooler="transaction", listen_dsn=db_dsn) as app:
        ids = [app.enqueue("echo", {"value": f"v{i}"}).job_id for i in range(30)]
        assert [app.result(i, timeout=60) for i in ids] == [f"v{i}" for i in range(30)]
    statuses = workers.wait_statuses(ids, dsn=db_dsn)
    assert set(statuses.values()) == {"succeeded"}
    assert worker.alive()


def test_workers_through_the_pooler_without_listen_dsn_poll(
    pgbouncer_dsn: str, db_dsn: str, workers: Workers
) -> None:
    worker = workers.spawn("--poll-interval", "0.2s", dsn=pgbouncer_dsn, env=POOLED)
    worker.wait_registered()
    with pgqueue.App(pgbouncer_dsn, pooler="transaction") as app:
        ids = [app.enqueue("echo", {"value": i}).job_id for i in range(20)]
        assert app.result(ids[-1], timeout=60) == 19  # result() polls too
    assert set(workers.wait_statuses(ids, dsn=db_dsn).values()) == {"succeeded"}
    assert worker.logged("poll")  # it says it polls instead of listening
    with (
        pgqueue.App(pgbouncer_dsn, pooler="transaction") as app,
        pytest.raises(pgqueue.ListenUnavailable, match="listen_dsn"),
    ):
        app.subscribe().__enter__()


def test_schedules_fire_through_the_pooler(
    pgbouncer_dsn: str, db_dsn: str, workers: Workers
) -> None:
    with pgqueue.App(pgbouncer_dsn, pooler="transaction") as app:
        app.add_schedule("every-second", "* * * * * *", "echo", {"value": "tick"})
    workers.spawn("--poll-interval", "0.2s", dsn=pgbouncer_dsn, env=POOLED).wait_registered()

    def fired() -> list[int]:
        with psycopg.connect(db_dsn) as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM pgqueue.jobs WHERE task = 'echo' AND status = 'succeeded'"
                )
            ]

    deadline = time.monotonic() + 60
    while len(fired()) < 3:
        assert time.monotonic() < deadline, "the schedule did not fire 3 times within 60s"
        time.sleep(0.2)


def test_flow_control_through_the_pooler(pgbouncer_dsn: str, db_dsn: str, workers: Workers) -> None:
    with pgqueue.App(pgbouncer_dsn, pooler="transaction", listen_dsn=db_dsn) as app:
        app.pause_queue("default")
        ids = [app.enqueue("echo", {"value": i}).job_id for i in range(5)]
        workers.spawn(
            "--poll-interval",
            "0.2s",
            dsn=pgbouncer_dsn,
            env={**POOLED, "PGQUEUE_LISTEN_DSN": db_dsn},
        ).wait_registered()
        time.sleep(1.0)
        assert {app.get_job(i).status for i in ids} == {"queued"}  # paused: nothing leased
        app.set_queue_limit("default", concurrency=1)
        app.resume_queue("default")
        assert set(workers.wait_statuses(ids, dsn=db_dsn).values()) == {"succeeded"}


def test_the_cli_through_the_pooler(pgbouncer_dsn: str) -> None:
    enqueued = run_json(pgbouncer_dsn, "--pooler", "transaction", "enqueue", "echo",
                        "--payload", '{"value": 1}')  # fmt: skip
    assert enqueued["created"] is True
    for _ in range(8):  # repeated statements: nothing prepared
        listed = run_json(pgbouncer_dsn, "--pooler", "transaction", "jobs", "list")
        assert [j["id"] for j in listed["jobs"]] == [enqueued["job_id"]]
    status = run_cli(pgbouncer_dsn, "--pooler", "transaction", "status")
    assert status.returncode == 0, status.stderr


def test_session_mode_needs_nothing_special(
    pgbouncer_session_dsn: str, db_dsn: str, workers: Workers
) -> None:
    workers.spawn("--concurrency", "4", dsn=pgbouncer_session_dsn).wait_registered()
    with pgqueue.App(pgbouncer_session_dsn, pooler="session") as app:
        ids = [app.enqueue("echo", {"value": i}).job_id for i in range(20)]
        assert app.result(ids[-1], timeout=60) == 19
    assert set(workers.wait_statuses(ids, dsn=db_dsn).values()) == {"succeeded"}
