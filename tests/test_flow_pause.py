"""Pausing and resuming queues with real worker
processes: a paused queue leases nothing on any worker, enqueue still works,
running jobs finish; resume restarts every worker at once.

The workers poll only every LONG_POLL seconds, so what happens within a few
seconds of a pause or resume was brought about by a notification.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import pgqueue
from pgqueue import JobSpec, JobStatus
from tests.apps.flow import build_app
from tests.cli_support import run_cli, run_json
from tests.fixtures.workers import Workers, wait_until
from tests.flow_support import (
    LONG_POLL,
    PROMPT,
    gate,
    running_count,
    sample_for,
    scalar,
    spawn_flow_workers,
    started_jobs,
    wait_started,
)

QUEUE = "pausable"


@pytest.fixture
def flow_app(db_dsn: str) -> Iterator[pgqueue.App]:
    """An App with the tasks of :mod:`tests.apps.flow` registered."""
    with build_app(db_dsn) as built:
        yield built


def worker_ids(dsn: str, job_ids: list[int]) -> set[str]:
    """The workers that leased the jobs (their current or final attempt)."""
    ids: list[str] = scalar(
        dsn, "SELECT array_agg(DISTINCT worker_id) FROM pgqueue.jobs WHERE id = ANY(%s)", (job_ids,)
    )
    return set(ids)


def hold_jobs(app: pgqueue.App, payload: dict[str, str], count: int) -> list[int]:
    specs = [JobSpec("flow_hold", payload, queue=QUEUE) for _ in range(count)]
    return [e.job_id for e in app.enqueue_many(specs)]


@pytest.mark.slow
def test_pause_stops_leasing_on_every_worker_and_resume_restarts_them(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    # Two slots per worker: six jobs keep all three workers busy.
    spawn_flow_workers(workers, 3, "--concurrency", "2", "--poll-interval", LONG_POLL)
    before, after = gate(tmp_path, "before"), gate(tmp_path, "after")
    first = hold_jobs(flow_app, before.payload, 6)
    wait_started(workers, first, timeout=PROMPT)
    assert len(worker_ids(db_dsn, first)) == 3

    flow_app.pause_queue(QUEUE)

    # Enqueue still works; the jobs wait.
    second = hold_jobs(flow_app, after.payload, 6)
    assert {flow_app.get_job(i).status for i in second} == {JobStatus.QUEUED}
    # Running jobs finish, and free a slot on every worker: each leases again
    # at once (and was woken by the enqueue), and gets nothing.
    before.open()
    jobs = workers.wait_finished(flow_app, first)
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    # Another queue still flows: the workers are leasing, only this queue is held.
    other = flow_app.enqueue("flow_tick", {"n": 1}, queue="other").job_id
    workers.wait_statuses([other], ["succeeded"], timeout=PROMPT)
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 0
    assert started_jobs(db_dsn, second) == set()
    assert (
        scalar(db_dsn, "SELECT max(attempts) FROM pgqueue.jobs WHERE id = ANY(%s)", (second,)) == 0
    )
    metrics = flow_app.metrics(QUEUE)[QUEUE]
    assert (metrics.paused, metrics.queued, metrics.running) == (True, 6, 0)
    explanation = flow_app.explain(second[0])
    assert f"queue {QUEUE!r} is paused" in explanation, explanation

    flow_app.resume_queue(QUEUE)

    # Told by NOTIFY, not by a poll: all six start, on all three workers.
    wait_started(workers, second, timeout=PROMPT)
    assert running_count(db_dsn, QUEUE) == 6
    assert len(worker_ids(db_dsn, second)) == 3
    assert flow_app.metrics(QUEUE)[QUEUE].paused is False
    after.open()
    jobs = workers.wait_finished(flow_app, second)
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    assert {job.attempts for job in jobs.values()} == {1}


@pytest.mark.slow
def test_pausing_a_busy_queue_stops_every_worker_within_a_poll_interval(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str
) -> None:
    poll = 0.5
    spawn_flow_workers(workers, 3, "--concurrency", "2", "--poll-interval", f"{poll}s")
    specs = [JobSpec("flow_nap", {"seconds": 0.05}, queue=QUEUE) for _ in range(600)]
    ids = [e.job_id for e in flow_app.enqueue_many(specs)]

    def succeeded() -> int:
        done: int = scalar(
            db_dsn,
            "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s AND status = 'succeeded'",
            (QUEUE,),
        )
        return done

    wait_until(lambda: succeeded() >= 30, 60, "30 jobs to succeed", workers.started)
    flow_app.pause_queue(QUEUE)
    paused_at = scalar(db_dsn, "SELECT clock_timestamp()")

    # The jobs running at the pause finish; then nothing runs, on any worker.
    wait_until(lambda: running_count(db_dsn, QUEUE) == 0, 60, "running jobs to end")
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 0
    latest = scalar(
        db_dsn, "SELECT max(attempt_started_at) FROM pgqueue.jobs WHERE queue = %s", (QUEUE,)
    )
    assert latest <= paused_at + timedelta(seconds=poll)
    left = flow_app.metrics(QUEUE)[QUEUE].queued
    assert left > 0, "the queue drained before the pause"
    assert left == len(ids) - succeeded()
    assert (
        scalar(
            db_dsn,
            "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s AND status <> 'queued'"
            " AND status <> 'succeeded'",
            (QUEUE,),
        )
        == 0
    )

    flow_app.resume_queue(QUEUE)
    stopped_at = succeeded()
    wait_until(lambda: succeeded() > stopped_at, PROMPT, "jobs to run again", workers.started)


@pytest.mark.slow
def test_pause_and_resume_through_the_console_script(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    spawn_flow_workers(workers, 1, "--poll-interval", LONG_POLL)
    # A queue that has never had a job can be paused ahead of its first job.
    paused = run_json(db_dsn, "queue", "pause", QUEUE, "--create")
    assert paused == {"queue": QUEUE, "paused": True, "concurrency_limit": None, "rate_limit": None}
    limited = run_json(db_dsn, "queue", "limit", QUEUE, "--concurrency", "3", "--rate", "10/s")
    assert (limited["paused"], limited["concurrency_limit"], limited["rate_limit"]) == (
        True,
        3,
        "10/1s",
    )

    job_id = flow_app.enqueue("flow_tick", {"n": 1}, queue=QUEUE).job_id
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 0
    assert flow_app.get_job(job_id).status is JobStatus.QUEUED

    explained = run_json(db_dsn, "jobs", "explain", str(job_id))
    assert explained["job_id"] == job_id
    assert f"queue {QUEUE!r} is paused" in explained["explanation"]
    [row] = [m for m in run_json(db_dsn, "status") if m["queue"] == QUEUE]
    assert (row["paused"], row["concurrency_limit"], row["rate_limit"]) == (True, 3, "10/1s")
    assert (row["queued"], row["running"]) == (1, 0)
    table = run_cli(db_dsn, "status")
    assert table.returncode == 0, table.stderr
    [line] = [line for line in table.stdout.splitlines() if QUEUE in line]
    assert "PAUSED" in line, table.stdout
    assert "10/1s" in line, table.stdout

    resumed = run_cli(db_dsn, "queue", "resume", QUEUE)
    assert resumed.returncode == 0, resumed.stderr
    workers.wait_statuses([job_id], ["succeeded"], timeout=PROMPT)
    metrics = flow_app.metrics(QUEUE)[QUEUE]
    assert (metrics.paused, metrics.concurrency_limit, metrics.rate_limit) == (False, 3, "10/1s")
