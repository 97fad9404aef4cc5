"""The App itself: where its DSN comes from, DSN parameters, closing, and recovery
after its connections die or the server restarts."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

import pgqueue
from tests.fixtures.cluster import ThrowawayCluster
from tests.fixtures.factory import JobFactory

UNREACHABLE_DSN = "postgresql://postgres@127.0.0.1:1/x"


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.05)


def backends(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (application_name,),
        ).fetchone()
    assert row is not None
    count: int = row[0]
    return count


def with_query(dsn: str, query: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


# --- DSN resolution --------------------------------------------------------------------


def test_dsn_argument_wins_over_the_environment(
    db_dsn: str, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", UNREACHABLE_DSN)
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE_DSN)
    with pgqueue.App(dsn=db_dsn) as app:
        job_id = app.enqueue("t").job_id
    assert job_factory.row(job_id)["task"] == "t"


def test_pgqueue_dsn_wins_over_database_url(
    db_dsn: str, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", db_dsn)
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE_DSN)
    with pgqueue.App() as app:
        job_id = app.enqueue("t").job_id
    assert job_factory.row(job_id)["task"] == "t"


def test_database_url_is_used_without_pgqueue_dsn(
    db_dsn: str, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQUEUE_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", db_dsn)
    with pgqueue.App() as app:
        job_id = app.enqueue("t").job_id
    assert job_factory.row(job_id)["task"] == "t"


def test_dsn_query_parameters_are_passed_through(db_dsn: str) -> None:
    name = "billing-service-7"
    with pgqueue.App(dsn=with_query(db_dsn, f"application_name={name}")) as app:
        app.enqueue("t")
        assert backends(db_dsn, name) >= 1
    wait_until(lambda: backends(db_dsn, name) == 0)


def test_close_releases_connections_and_the_app_reopens_on_use(db_dsn: str) -> None:
    name = "pgqueue-close-probe"
    app = pgqueue.App(dsn=with_query(db_dsn, f"application_name={name}"))
    app.enqueue("t")
    assert backends(db_dsn, name) >= 1

    app.close()
    wait_until(lambda: backends(db_dsn, name) == 0)

    app.enqueue("t")  # pools reopen on next use
    assert backends(db_dsn, name) >= 1
    app.close()


# --- recovery -----------------------------------------------------------------------------


def test_app_recovers_after_its_connections_are_killed(db_dsn: str) -> None:
    name = "pgqueue-kill-probe"
    with pgqueue.App(dsn=with_query(db_dsn, f"application_name={name}"), pool_timeout=5) as app:
        first = app.enqueue("t").job_id
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            )
        wait_until(lambda: backends(db_dsn, name) == 0)

        second = app.enqueue("t").job_id

        assert second > first
        assert app.get_job(second).status is pgqueue.JobStatus.QUEUED


@pytest.mark.slow
def test_app_fails_clearly_during_an_outage_and_recovers_after_a_restart(
    cluster: ThrowawayCluster,
) -> None:
    dsn = cluster.fresh_db_dsn()
    with pgqueue.App(dsn=dsn) as app:
        before = app.enqueue("t").job_id

        cluster.stop()
        with pytest.raises(pgqueue.ConnectionFailed):
            app.enqueue("t")
        cluster.start()

        after = app.enqueue("t").job_id
        assert after > before
        assert {j.job_id for j in app.lease("default", "w1", max=10)} == {before, after}


def test_a_lock_timeout_is_not_a_connection_failure(db_dsn: str, app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (job_id,))
        impatient_dsn = with_query(db_dsn, "options=-c%20lock_timeout%3D100")
        with (
            pgqueue.App(dsn=impatient_dsn) as impatient,
            pytest.raises(Exception) as caught,  # the type is the question
        ):
            impatient.cancel(job_id)
        holder.rollback()
    assert "lock timeout" in str(caught.value)
    assert not isinstance(caught.value, pgqueue.ConnectionFailed)
