"""Crashes and database trouble with real processes: a SIGKILLed worker's jobs
are reclaimed by another worker's reaper; heartbeats keep long jobs leased; a
stale holder cannot finish a job; a worker rides out a server restart and
killed connections without losing a job."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.apps.tasks import build_app, create_events_table
from tests.fixtures.cluster import ThrowawayCluster
from tests.fixtures.workers import WorkerProcess, Workers, outcomes, task_events, wait_until


def running_on(dsn: str, job_ids: list[int], worker_id: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs"
            " WHERE id = ANY(%s) AND status = 'running' AND worker_id = %s",
            (job_ids, worker_id),
        ).fetchone()
    return row is not None and row[0] == len(job_ids)


@pytest.mark.slow
def test_jobs_of_a_sigkilled_worker_are_finished_by_another_after_lease_expiry(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    victim = workers.spawn("--concurrency", "4")
    victim_id = victim.wait_registered()["id"]
    job_ids = [
        tasks_app.enqueue("short_lease_nap", {"key": f"k{i}", "seconds": 3}).job_id
        for i in range(4)
    ]
    wait_until(lambda: running_on(workers.dsn, job_ids, victim_id), 30, "the leases", [victim])

    victim.proc.send_signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL
    rescuer = workers.spawn("--concurrency", "4", "--reap-interval", "0.5s")
    rescuer_id = rescuer.wait_registered()["id"]

    jobs = workers.wait_finished(tasks_app, job_ids)

    for job in jobs.values():
        assert job.status is JobStatus.SUCCEEDED
        assert job.attempts == 2
        assert job.attempt_history is not None
        expired, succeeded = job.attempt_history
        assert expired.outcome is AttemptOutcome.LEASE_EXPIRED
        assert expired.worker_id == victim_id
        assert succeeded.outcome is AttemptOutcome.SUCCEEDED
        assert succeeded.worker_id == rescuer_id
        assert job.result == 2  # the task returns context.attempt
    # Every job's second run completed; none was lost or run a third time.
    ends = task_events(workers.dsn, "end")
    assert sorted(e["key"] for e in ends) == [f"k{i}" for i in range(4)]


@pytest.mark.slow
def test_a_job_longer_than_its_lease_survives_thanks_to_the_heartbeat(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    # Its own worker reaps every half second: without heartbeats the 2 s lease
    # would expire twice over during the 5 s run.
    workers.spawn("--reap-interval", "0.5s").wait_registered()
    job_id = tasks_app.enqueue("short_lease_nap", {"key": "long", "seconds": 5}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.SUCCEEDED
    assert job.attempts == 1
    assert outcomes(tasks_app, job_id) == ["succeeded"]
    assert [e["kind"] for e in task_events(workers.dsn, key="long")] == ["start", "end"]


@pytest.mark.slow
def test_a_worker_whose_lease_was_stolen_cannot_finish_the_job(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    # One slot: the worker cannot lease the job again while its first run goes on.
    worker = workers.spawn("--concurrency", "1", "--reap-interval", "3600s")
    worker.wait_registered()
    job_id = tasks_app.enqueue("short_lease_nap", {"key": "stolen", "seconds": 4}).job_id
    wait_until(lambda: task_events(workers.dsn, "start", "stolen"), 30, "the start", [worker])

    # Expire the lease behind the worker's back and reap it (retrying if a
    # heartbeat extended it between the two statements).
    def reaped() -> bool:
        with psycopg.connect(workers.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 minute'"
                " WHERE id = %s AND status = 'running'",
                (job_id,),
            )
        return tasks_app.reap() == 1

    wait_until(reaped, 15, "the reaper to reclaim the job", [worker])
    with psycopg.connect(workers.dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET run_at = now() WHERE id = %s", (job_id,))
    [thief] = tasks_app.lease("default", "thief", max=1, lease_seconds=60)
    assert thief.job_id == job_id
    assert thief.attempt == 2

    # The original run ends; its outcome must not land.
    wait_until(lambda: task_events(workers.dsn, "end", "stolen"), 30, "the first run to end", [])
    wait_until(
        lambda: [e for e in worker.logged("lease lost") if e.get("job_id") == job_id],
        15,
        "the worker to log the lost lease",
        [worker],
    )
    job = tasks_app.get_job(job_id, history=True)
    assert job.status is JobStatus.RUNNING  # still the thief's
    assert job.attempt_history is not None
    assert [(a.attempt_id, a.outcome) for a in job.attempt_history][-1] == (
        thief.attempt_id,
        AttemptOutcome.RUNNING,
    )

    tasks_app.ack(thief, result="thief")

    job = tasks_app.get_job(job_id, history=True)
    assert job.status is JobStatus.SUCCEEDED
    assert job.result == "thief"
    assert job.attempts == 2
    assert outcomes(tasks_app, job_id) == ["lease_expired", "succeeded"]
    assert job.attempt_history is not None
    assert job.attempt_history[-1].worker_id == "thief"
    assert worker.alive()


# --- database trouble -----------------------------------------------------------


@pytest.fixture
def cluster_db(cluster: ThrowawayCluster) -> str:
    """A migrated database on the test's private server (which it may restart)."""
    dsn = cluster.fresh_db_dsn()
    create_events_table(dsn)
    # The cluster runs with synchronous_commit=off, whose commits a crash
    # (immediate stop) may lose; this database keeps what it acknowledged.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
                psycopg.sql.Identifier(conn.info.dbname)
            )
        )
    return dsn


def terminate_worker_backends(dsn: str) -> int:
    """pg_terminate_backend every connection the workers hold (application_name
    'pgqueue'; the test's own connections are named otherwise)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pgqueue'"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def enqueue_batch(app: pgqueue.App, start: int, count: int) -> list[int]:
    specs = [
        pgqueue.JobSpec("async_doze" if i % 2 else "doze", {"seconds": 0.3})
        for i in range(start, start + count)
    ]
    return [e.job_id for e in app.enqueue_many(specs)]


def progress(dsn: str, job_ids: list[int]) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s) AND status = 'succeeded'",
            (job_ids,),
        ).fetchone()
    assert row is not None
    done: int = row[0]
    return done


def nearly_done(dsn: str, job_ids: list[int], left: int) -> Callable[[], bool]:
    """A probe: at most ``left`` of the jobs are not yet succeeded."""
    return lambda: progress(dsn, job_ids) >= len(job_ids) - left


@pytest.mark.slow
def test_the_worker_resumes_by_itself_after_its_connections_are_killed(
    workers: Workers, db_dsn: str
) -> None:
    # Runs on any server (no local binaries needed); the cluster test below
    # adds restarts and crashes.
    producer = build_app(make_conninfo(db_dsn, application_name="test-producer"))
    try:
        worker = workers.spawn("--concurrency", "4", "--poll-interval", "0.5s")
        worker.wait_registered()
        job_ids: list[int] = []
        for round_ in range(3):
            job_ids += enqueue_batch(producer, round_ * 12, 12)
            wait_until(nearly_done(db_dsn, list(job_ids), 8), 30, "processing to go on", [worker])
            assert terminate_worker_backends(db_dsn) > 0
        workers.wait_statuses(job_ids, ["succeeded"], timeout=60, require_alive=[worker])
        assert worker.logged("notification connection lost")
    finally:
        producer.close()


@pytest.mark.slow
def test_the_worker_resumes_by_itself_after_a_server_restart_and_killed_connections(
    workers: Workers, cluster: ThrowawayCluster, cluster_db: str
) -> None:
    producer = build_app(cluster_db + "?application_name=test-producer")
    try:
        worker: WorkerProcess = workers.spawn(
            "--concurrency", "4", "--poll-interval", "0.5s", "--reap-interval", "1s", dsn=cluster_db
        )
        worker.wait_registered()
        job_ids = enqueue_batch(producer, 0, 24)
        wait_until(lambda: progress(cluster_db, job_ids) >= 4, 30, "some jobs to finish", [worker])

        # 1. Restart the server while jobs run (every connection breaks).
        cluster.restart()
        producer.close()  # its pooled connections died with the server
        job_ids += enqueue_batch(producer, 24, 8)
        wait_until(
            lambda: progress(cluster_db, job_ids) >= len(job_ids) - 8,
            60,
            "processing to resume after the restart",
            [worker],
        )

        # 2. Kill every connection the worker holds, while it works.
        job_ids += enqueue_batch(producer, 32, 8)
        assert terminate_worker_backends(cluster_db) > 0
        job_ids += enqueue_batch(producer, 40, 8)
        workers.wait_statuses(
            job_ids, ["succeeded"], timeout=60, dsn=cluster_db, require_alive=[worker]
        )

        # 3. A crash, then connections refused for a while, while jobs run.
        job_ids += enqueue_batch(producer, 48, 8)
        cluster.stop(mode="immediate")
        time.sleep(3)
        cluster.start()
        producer.close()
        job_ids += enqueue_batch(producer, 56, 8)
        workers.wait_statuses(
            job_ids, ["succeeded"], timeout=90, dsn=cluster_db, require_alive=[worker]
        )
        assert worker.alive()
        # Processing resumed in the same process: it leases new work after all that.
        late = enqueue_batch(producer, 64, 2)
        workers.wait_statuses(late, ["succeeded"], timeout=30, dsn=cluster_db)
    finally:
        producer.close()

    with psycopg.connect(cluster_db, autocommit=True) as conn:
        rows = conn.execute("SELECT status::text, count(*) FROM pgqueue.jobs GROUP BY 1").fetchall()
    assert dict(rows) == {"succeeded": 66}  # none lost, none stuck

    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
