"""Cancelling jobs with real worker processes: a running
async task is cancelled and a running sync task sees ``should_stop()``, both
end ``cancelled`` with the attempt recorded and are never retried; a queued
job is cancelled at once; a finished one cannot be.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.apps.flow import build_app
from tests.cli_support import assert_one_line_error, run_cli, run_json
from tests.fixtures.dbstate import snapshot
from tests.fixtures.workers import Workers, task_events
from tests.flow_support import (
    LONG_POLL,
    PROMPT,
    gate,
    job_attempt_count,
    job_snapshot,
    outcomes,
    sample_for,
    spawn_flow_workers,
    started_jobs,
    wait_started,
)

QUEUE = "cancellable"


@pytest.fixture
def flow_app(db_dsn: str) -> Iterator[pgqueue.App]:
    """An App with the tasks of :mod:`tests.apps.flow` registered."""
    with build_app(db_dsn) as built:
        yield built


def assert_cancelled_once(app: pgqueue.App, dsn: str, job_id: int) -> None:
    """Ended cancelled after exactly one attempt, recorded as cancelled."""
    job = app.get_job(job_id, history=True)
    assert job.status is JobStatus.CANCELLED
    assert job.attempts == 1
    assert job.finished_at is not None
    assert outcomes(app, job_id) == [AttemptOutcome.CANCELLED]
    assert job_attempt_count(dsn, job_id) == 1
    assert len([e for e in task_events(dsn, "start") if e["job_id"] == job_id]) == 1


@pytest.mark.slow
def test_cancel_running_async_and_sync_jobs_on_several_workers(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str
) -> None:
    # Long polls: the cancel reaches the tasks by NOTIFY ('c:<id>').
    spawn_flow_workers(workers, 3, "--concurrency", "1", "--poll-interval", LONG_POLL)
    async_job = flow_app.enqueue("async_until_cancelled", {"key": "async"}, queue=QUEUE).job_id
    sync_job = flow_app.enqueue("until_stopped", {"key": "sync"}, queue=QUEUE).job_id
    wait_started(workers, [async_job, sync_job], timeout=PROMPT)

    assert flow_app.cancel(async_job) is JobStatus.RUNNING  # asked to stop
    assert flow_app.cancel(sync_job) is JobStatus.RUNNING

    workers.wait_statuses([async_job, sync_job], ["cancelled"], timeout=PROMPT)
    [cancelled] = task_events(db_dsn, "cancelled", "async")
    assert cancelled["data"] == {"should_stop": True}
    [stopped] = task_events(db_dsn, "stopped", "sync")
    assert stopped["data"] == {"should_stop": True}

    # Never retried: both tasks allow 3 attempts with 0.2 s backoff, so a
    # wrongly recorded attempt would have been retried by the time later jobs ran.
    markers = [flow_app.enqueue("flow_tick", {"n": n}, queue=QUEUE).job_id for n in range(3)]
    workers.wait_statuses(markers, ["succeeded"], timeout=PROMPT)
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 0
    for job_id in (async_job, sync_job):
        assert_cancelled_once(flow_app, db_dsn, job_id)
        with pytest.raises(pgqueue.JobCancelled):
            flow_app.result(job_id, timeout=5)
        explanation = flow_app.explain(job_id)
        assert "was cancelled" in explanation, explanation
        assert "while attempt 1 ran" in explanation, explanation


@pytest.mark.slow
def test_cancel_of_a_queued_job_is_immediate_and_a_running_one_ends_cancelled_when_it_ends(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    spawn_flow_workers(workers, 2, "--poll-interval", "0.2s")
    flow_app.set_queue_limit(QUEUE, concurrency=1)
    release = gate(tmp_path, "release")
    running = flow_app.enqueue("flow_hold", release.payload, queue=QUEUE).job_id
    wait_started(workers, [running])
    waiting = flow_app.enqueue("flow_hold", release.payload, queue=QUEUE).job_id
    assert flow_app.get_job(waiting).status is JobStatus.QUEUED

    assert flow_app.cancel(waiting) is JobStatus.CANCELLED
    job = flow_app.get_job(waiting, history=True)
    assert job.status is JobStatus.CANCELLED
    assert (job.attempts, job.attempt_history) == (0, [])

    # The running one ignores should_stop() (a sync task that cannot be
    # interrupted): it returns normally, and still ends cancelled, without its result.
    assert flow_app.cancel(running) is JobStatus.RUNNING
    release.open()
    workers.wait_statuses([running], ["cancelled"])
    assert_cancelled_once(flow_app, db_dsn, running)
    assert flow_app.get_job(running).result is None
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 0
    assert started_jobs(db_dsn, [waiting]) == set()
    assert flow_app.get_job(waiting).status is JobStatus.CANCELLED
    assert job_attempt_count(db_dsn, waiting) == 0


@pytest.mark.parametrize("ending", ["succeeded", "dead", "cancelled"])
def test_cancel_of_a_finished_job_is_an_error_and_changes_nothing(
    flow_app: pgqueue.App, db_dsn: str, ending: str
) -> None:
    job_id = flow_app.enqueue("flow_tick", {"n": 1}, queue=QUEUE).job_id
    if ending == "cancelled":
        flow_app.cancel(job_id)
    else:
        [leased] = flow_app.lease(QUEUE, "test-worker")
        if ending == "succeeded":
            flow_app.ack(leased)
        else:
            flow_app.fail(leased, "broken", permanent=True)
    assert flow_app.get_job(job_id).status == ending
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.InvalidJobState, match=ending):
        flow_app.cancel(job_id)

    assert snapshot(db_dsn) == before


@pytest.mark.slow
def test_cancel_through_the_console_script(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    spawn_flow_workers(workers, 2, "--poll-interval", LONG_POLL)
    release = gate(tmp_path, "release")
    running = flow_app.enqueue("until_stopped", {"key": "cli"}, queue=QUEUE).job_id
    wait_started(workers, [running], timeout=PROMPT)
    flow_app.pause_queue("held")
    queued = flow_app.enqueue("flow_hold", release.payload, queue="held").job_id
    assert flow_app.get_job(queued).status is JobStatus.QUEUED

    assert run_json(db_dsn, "jobs", "cancel", str(running)) == {
        "job_id": running,
        "status": "running",
    }
    assert run_json(db_dsn, "jobs", "cancel", str(queued)) == {
        "job_id": queued,
        "status": "cancelled",
    }
    assert flow_app.get_job(queued).status is JobStatus.CANCELLED
    workers.wait_statuses([running], ["cancelled"], timeout=PROMPT)
    assert_cancelled_once(flow_app, db_dsn, running)

    before = job_snapshot(db_dsn)
    refused = run_cli(db_dsn, "jobs", "cancel", str(running))
    assert_one_line_error(refused, str(running))
    assert job_snapshot(db_dsn) == before
    assert run_json(db_dsn, "jobs", "show", str(running))["status"] == "cancelled"
