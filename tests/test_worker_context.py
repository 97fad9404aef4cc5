"""``pass_context=True``: what a task learns about its job, and how
``should_stop()`` and cancellation reach a running task in a real worker."""

from __future__ import annotations

import signal

import psycopg
import pytest

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.fixtures.workers import Workers, task_events, wait_until


def test_context_describes_the_job_and_its_attempt(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("context_probe").job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.SUCCEEDED
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert job.result == {
        "job_id": job_id,
        "attempt": 1,
        "attempt_id": attempt.attempt_id,
        "queue": "ctx",
        "task": "context_probe",
        "should_stop": False,
    }


def test_context_attempt_counts_retries(workers: Workers, tasks_app: pgqueue.App) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("retry_once", {"delay": 0}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.result == 2  # the task returns context.attempt
    assert job.attempt_history is not None
    assert [a.attempt for a in job.attempt_history] == [1, 2]
    assert len({a.attempt_id for a in job.attempt_history}) == 2


def wait_started(workers: Workers, key: str) -> None:
    wait_until(
        lambda: task_events(workers.dsn, "start", key),
        30,
        f"task {key!r} to start",
        workers.started,
    )


@pytest.mark.parametrize("listen", ["--listen", "--no-listen"])
def test_cancel_turns_should_stop_true_and_a_cooperative_sync_task_ends_cancelled(
    workers: Workers, tasks_app: pgqueue.App, listen: str
) -> None:
    workers.spawn(listen, "--poll-interval", "0.5s").wait_registered()
    job_id = tasks_app.enqueue("until_stopped", {"key": "coop"}).job_id
    wait_started(workers, "coop")

    assert tasks_app.cancel(job_id) is JobStatus.RUNNING  # asked to stop

    job = workers.wait_finished(tasks_app, [job_id], timeout=30)[job_id]
    assert job.status is JobStatus.CANCELLED
    assert job.attempts == 1  # never retried
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [AttemptOutcome.CANCELLED]
    [stopped] = task_events(workers.dsn, "stopped", "coop")
    assert stopped["data"] == {"should_stop": True}
    with pytest.raises(pgqueue.JobCancelled):
        tasks_app.result(job_id, timeout=5)


@pytest.mark.parametrize("listen", ["--listen", "--no-listen"])
def test_cancel_cancels_a_running_async_task_and_the_job_ends_cancelled(
    workers: Workers, tasks_app: pgqueue.App, listen: str
) -> None:
    workers.spawn(listen, "--poll-interval", "0.5s").wait_registered()
    job_id = tasks_app.enqueue("async_until_cancelled", {"key": "acan"}).job_id
    wait_started(workers, "acan")

    tasks_app.cancel(job_id)

    job = workers.wait_finished(tasks_app, [job_id], timeout=30)[job_id]
    assert job.status is JobStatus.CANCELLED
    assert job.attempts == 1
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert attempt.outcome is AttemptOutcome.CANCELLED
    [cancelled] = task_events(workers.dsn, "cancelled", "acan")
    assert cancelled["data"] == {"should_stop": True}
    # Not retried later either: the worker stays idle and the job stays cancelled.
    assert tasks_app.get_job(job_id).status is JobStatus.CANCELLED


def test_a_cancelled_job_does_not_block_the_worker(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn("--concurrency", "1").wait_registered()
    job_id = tasks_app.enqueue("async_until_cancelled", {"key": "first"}).job_id
    wait_started(workers, "first")
    tasks_app.cancel(job_id)
    after = tasks_app.enqueue("echo", {"value": "after"}).job_id

    jobs = workers.wait_finished(tasks_app, [job_id, after], timeout=30)

    assert jobs[job_id].status is JobStatus.CANCELLED
    assert jobs[after].status is JobStatus.SUCCEEDED


def test_sigterm_turns_should_stop_true_for_running_tasks(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--shutdown-timeout", "30s")
    worker.wait_registered()
    job_id = tasks_app.enqueue("until_stopped", {"key": "term"}).job_id
    wait_started(workers, "term")

    worker.send(signal.SIGTERM)

    assert worker.wait_exit() == 0
    [stopped] = task_events(workers.dsn, "stopped", "term")
    assert stopped["data"] == {"should_stop": True}
    # The task returned normally once asked to stop: that is a success.
    job = tasks_app.get_job(job_id, history=True)
    assert job.status is JobStatus.SUCCEEDED
    assert job.result == "stopped"


def test_cancel_of_a_queued_job_means_no_worker_ever_runs_it(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    job_id = tasks_app.enqueue("nap", {"key": "never", "seconds": 0}).job_id
    assert tasks_app.cancel(job_id) is JobStatus.CANCELLED
    marker = tasks_app.enqueue("echo", {"value": 1}).job_id

    workers.spawn().wait_registered()
    workers.wait_statuses([marker], ["succeeded"])

    assert tasks_app.get_job(job_id).status is JobStatus.CANCELLED
    assert task_events(workers.dsn, key="never") == []
    with psycopg.connect(workers.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.job_attempts WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row == (0,)
