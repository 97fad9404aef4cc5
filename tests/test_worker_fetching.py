"""How a real worker finds work: NOTIFY wake-up, polling without LISTEN, waking
when a scheduled job becomes due, its concurrency limit, and its registration.

Time bounds here are liveness bounds, far above the real figures (those belong
to the benchmark): they tell "woken by the event" from "woken by a 30 s poll".
"""

from __future__ import annotations

import signal
import socket
import time
from datetime import datetime

import psycopg
import pytest

import pgqueue
from tests.fixtures.workers import WorkerProcess, Workers, pgqueue_command, task_events, wait_until

# Far longer than any bound below: a job that runs within a bound was not
# picked up by polling.
LONG_POLL = "30s"
PROMPT = 2.0


def listening_backends(dsn: str) -> int:
    """Connections of this database waiting in LISTEN (the workers' listeners)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    count: int = row[0]
    return count


def wait_listening(worker: WorkerProcess) -> None:
    wait_until(lambda: listening_backends(worker.dsn) > 0, 30, "the LISTEN connection", [worker])


def start_delay(dsn: str, key: str, since: datetime) -> float:
    """Seconds from ``since`` to the task's recorded start (database clock)."""
    [start] = task_events(dsn, "start", key)
    return float((start["at"] - since).total_seconds())


def test_an_idle_worker_starts_a_new_job_promptly_on_notify(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--poll-interval", LONG_POLL)
    worker.wait_registered()
    wait_listening(worker)

    for key in ("first", "second"):  # the second one finds the worker idle again
        job_id = tasks_app.enqueue("nap", {"key": key, "seconds": 0}).job_id
        workers.wait_statuses([job_id], ["succeeded"], timeout=15)
        created = tasks_app.get_job(job_id).created_at
        assert start_delay(workers.dsn, key, created) < PROMPT


def test_without_listen_the_worker_still_runs_jobs_by_polling(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--no-listen", "--poll-interval", "0.5s")
    worker.wait_registered()
    job_ids = [tasks_app.enqueue("echo", {"value": i}).job_id for i in range(5)]

    jobs = workers.wait_finished(tasks_app, job_ids, timeout=30)

    assert [jobs[i].result for i in job_ids] == list(range(5))
    assert all(job.status is pgqueue.JobStatus.SUCCEEDED for job in jobs.values())
    assert listening_backends(workers.dsn) == 0


@pytest.mark.parametrize("listen", ["--listen", "--no-listen"])
def test_a_scheduled_job_starts_when_due_not_at_the_next_poll(
    workers: Workers, tasks_app: pgqueue.App, listen: str
) -> None:
    # Enqueued before the worker starts: the worker knows of it from its first
    # look, and must wake for its run_at, not after a 30 s poll.
    job_id = tasks_app.tasks["nap"].with_options(delay=1.5).enqueue(key="due", seconds=0).job_id
    run_at = tasks_app.get_job(job_id).run_at
    worker = workers.spawn(listen, "--poll-interval", LONG_POLL)
    registered_at = worker.wait_registered()["started_at"]

    workers.wait_statuses([job_id], ["succeeded"], timeout=20)

    assert start_delay(workers.dsn, "due", run_at) >= 0  # never before it is due
    # Due, or (on a slow machine) the worker came up after it was due: it starts then.
    assert start_delay(workers.dsn, "due", max(run_at, registered_at)) < PROMPT


@pytest.mark.slow
def test_a_scheduled_job_enqueued_while_the_worker_idles_starts_when_due(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--poll-interval", LONG_POLL)
    worker.wait_registered()
    wait_listening(worker)

    job_id = tasks_app.tasks["nap"].with_options(delay=1.5).enqueue(key="due", seconds=0).job_id
    run_at = tasks_app.get_job(job_id).run_at
    workers.wait_statuses([job_id], ["succeeded"], timeout=1.5 + PROMPT + 5)

    late = start_delay(workers.dsn, "due", run_at)
    assert late >= 0
    assert late < PROMPT


@pytest.mark.slow
def test_a_retry_runs_when_its_delay_is_over_not_at_the_next_poll(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--poll-interval", LONG_POLL)
    worker.wait_registered()
    wait_listening(worker)
    job_id = tasks_app.enqueue("retry_once", {"delay": 0.5}).job_id

    workers.wait_statuses([job_id], ["succeeded"], timeout=0.5 + PROMPT + 5)

    history = tasks_app.get_job(job_id, history=True).attempt_history
    assert history is not None
    first, second = history
    assert first.finished_at is not None
    assert (second.started_at - first.finished_at).total_seconds() < 0.5 + PROMPT


@pytest.mark.slow
def test_one_worker_never_runs_more_jobs_at_once_than_its_concurrency(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    keys = [f"job{i}" for i in range(12)]
    job_ids = [
        tasks_app.enqueue("nap" if i % 2 else "async_nap", {"key": key, "seconds": 0.6}).job_id
        for i, key in enumerate(keys)
    ]
    workers.spawn("--concurrency", "3").wait_registered()

    jobs = workers.wait_finished(tasks_app, job_ids)

    assert all(job.status is pgqueue.JobStatus.SUCCEEDED for job in jobs.values())
    events = task_events(workers.dsn)
    points = sorted(
        (event["at"], 1 if event["kind"] == "start" else -1, event["id"]) for event in events
    )
    assert len(points) == 24
    running = peak = 0
    for _at, step, _id in points:  # an end at the same instant as a start comes first
        running += step
        peak = max(peak, running)
    assert peak <= 3
    assert peak == 3  # it did use its three slots


@pytest.mark.slow
def test_the_worker_registers_heartbeats_and_deregisters_on_a_clean_exit(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--queue", "mail", "--queue", "sms", "--concurrency", "4")
    row = worker.wait_registered()

    assert row["host"] == socket.gethostname()
    assert row["pid"] == worker.pid
    assert sorted(row["queues"]) == ["mail", "sms"]
    assert row["concurrency"] == 4
    assert row["started_at"] <= row["last_heartbeat_at"]
    first_beat = row["last_heartbeat_at"]

    def advanced() -> bool:
        current = worker.registration()
        return current is not None and current["last_heartbeat_at"] > first_beat

    wait_until(advanced, 20, "the worker's heartbeat to advance", [worker], interval=0.25)
    current = worker.registration()
    assert current is not None
    assert current["started_at"] == row["started_at"]

    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
    assert worker.registration() is None


def test_a_worker_serves_only_its_queues(workers: Workers, tasks_app: pgqueue.App) -> None:
    worker = workers.spawn("--queue", "ctx", "--poll-interval", "0.5s")
    worker.wait_registered()
    other = tasks_app.enqueue("echo", {"value": 1}).job_id  # queue "default"
    mine = tasks_app.enqueue("context_probe").job_id  # queue "ctx"

    workers.wait_statuses([mine], ["succeeded"], timeout=20)
    time.sleep(1.5)  # three more polls: the default-queue job stays where it is

    assert tasks_app.get_job(other).status is pgqueue.JobStatus.QUEUED
    assert worker.alive()


def test_several_workers_share_the_jobs_and_run_each_exactly_once(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    started = [workers.spawn("--concurrency", "4") for _ in range(3)]
    for worker in started:
        worker.wait_registered()
    specs = [pgqueue.JobSpec("nap", {"key": f"k{i}", "seconds": 0.05}) for i in range(60)]
    job_ids = [e.job_id for e in tasks_app.enqueue_many(specs)]

    jobs = workers.wait_finished(tasks_app, job_ids)

    assert all(job.status is pgqueue.JobStatus.SUCCEEDED for job in jobs.values())
    assert all(job.attempts == 1 for job in jobs.values())
    starts = task_events(workers.dsn, "start")
    assert sorted(e["key"] for e in starts) == sorted(f"k{i}" for i in range(60))
    assert len({e["pid"] for e in starts}) > 1  # the work was shared


def test_the_app_may_come_from_pgqueue_app(workers: Workers, tasks_app: pgqueue.App) -> None:
    worker = workers.spawn(
        command=[*pgqueue_command(), "worker", "--log-format", "json"],
        env={"PGQUEUE_APP": "tests.apps.tasks:app"},
    )
    worker.wait_registered()
    job_id = tasks_app.enqueue("echo", {"value": "env"}).job_id

    assert tasks_app.result(job_id, timeout=30) == "env"
