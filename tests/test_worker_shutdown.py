"""Stopping a worker: SIGTERM lets running jobs finish within the shutdown
timeout and hands the rest back; a second signal exits at once; the
in-process entry points stop on their event or on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.fixtures.workers import WorkerProcess, Workers, outcomes, task_events, wait_until


def wait_starts(workers: Workers, keys: list[str], worker: WorkerProcess) -> None:
    def started() -> bool:
        return {e["key"] for e in task_events(workers.dsn, "start")} >= set(keys)

    wait_until(started, 30, f"tasks {keys} to start", [worker])


@pytest.mark.slow
def test_sigterm_lets_running_jobs_finish_and_leases_no_more(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--concurrency", "3", "--shutdown-timeout", "20s")
    worker.wait_registered()
    keys = ["a", "b", "c"]
    running = [
        tasks_app.enqueue(task, {"key": key, "seconds": 2.0}).job_id
        for task, key in zip(["nap", "async_nap", "nap"], keys, strict=True)
    ]
    wait_starts(workers, keys, worker)
    waiting = tasks_app.enqueue("nap", {"key": "d", "seconds": 0}).job_id

    worker.send(signal.SIGTERM)

    assert worker.wait_exit() == 0
    for job_id in running:
        job = tasks_app.get_job(job_id, history=True)
        assert job.status is JobStatus.SUCCEEDED
        assert job.attempts == 1
        assert outcomes(tasks_app, job_id) == ["succeeded"]
    # Once told to stop, the worker took nothing new.
    assert tasks_app.get_job(waiting).status is JobStatus.QUEUED
    assert outcomes(tasks_app, waiting) == []
    assert task_events(workers.dsn, key="d") == []
    assert worker.registration() is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "task",
    [
        "async_nap",
        "nap",
    ],
)
def test_sigterm_hands_back_jobs_that_outlast_the_shutdown_timeout(
    workers: Workers, tasks_app: pgqueue.App, task: str
) -> None:
    worker = workers.spawn("--concurrency", "2", "--shutdown-timeout", "1s")
    worker.wait_registered()
    job_ids = [tasks_app.enqueue(task, {"key": key, "seconds": 120}).job_id for key in ("x", "y")]
    wait_starts(workers, ["x", "y"], worker)

    sent = time.monotonic()
    worker.send(signal.SIGTERM)

    # Exits soon after its 1 s shutdown timeout, not when the tasks would end.
    assert worker.wait_exit(timeout=15) == 0
    assert time.monotonic() - sent < 15
    for job_id in job_ids:
        job = tasks_app.get_job(job_id, history=True)
        assert job.status is JobStatus.QUEUED  # handed back, ready for another worker
        assert job.attempts == 0  # a released attempt does not count
        assert job.attempt_history is not None
        assert [a.outcome for a in job.attempt_history] == [AttemptOutcome.RELEASED]
    assert task_events(workers.dsn, "end") == []


@pytest.mark.slow
def test_a_handed_back_job_runs_again_on_the_next_worker(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    first = workers.spawn("--shutdown-timeout", "0.5s")
    first.wait_registered()
    job_id = tasks_app.enqueue("async_nap", {"key": "again", "seconds": 3}).job_id
    wait_starts(workers, ["again"], first)
    first.send(signal.SIGTERM)
    assert first.wait_exit() == 0

    workers.spawn().wait_registered()

    job = workers.wait_finished(tasks_app, [job_id])[job_id]
    assert job.status is JobStatus.SUCCEEDED
    assert job.attempts == 1
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [
        AttemptOutcome.RELEASED,
        AttemptOutcome.SUCCEEDED,
    ]
    assert [a.attempt for a in job.attempt_history] == [1, 1]


def test_sigint_stops_an_idle_worker_gracefully(workers: Workers, tasks_app: pgqueue.App) -> None:
    worker = workers.spawn()
    worker.wait_registered()

    worker.send(signal.SIGINT)

    assert worker.wait_exit() == 0
    assert worker.registration() is None
    assert worker.logged("worker stopped")


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once_with_a_non_zero_code(
    workers: Workers, tasks_app: pgqueue.App, second: signal.Signals
) -> None:
    worker = workers.spawn("--shutdown-timeout", "60s")
    worker.wait_registered()
    job_id = tasks_app.enqueue("nap", {"key": "long", "seconds": 120}).job_id
    wait_starts(workers, ["long"], worker)
    worker.send(signal.SIGTERM)
    worker.wait_logged("shutting down", timeout=15)

    worker.send(second)

    assert worker.wait_exit(timeout=15) != 0
    # Nothing was handed back: the reaper reclaims the lease later.
    assert tasks_app.get_job(job_id).status is JobStatus.RUNNING


@pytest.fixture
def own_structlog_setup() -> Iterator[None]:
    """Stand for a service that set up structlog itself: the in-process worker
    then leaves logging alone (and this test process's logging stays as it was)."""
    structlog.configure(
        processors=[structlog.processors.KeyValueRenderer()],
        logger_factory=structlog.PrintLoggerFactory(),
    )
    try:
        yield
    finally:
        structlog.reset_defaults()


@pytest.mark.usefixtures("own_structlog_setup")
def test_run_worker_async_returns_after_its_stop_event_is_set(tasks_app: pgqueue.App) -> None:
    async def scenario() -> dict[str, Any]:
        stop = asyncio.Event()
        job_id = (await tasks_app.enqueue_async("async_echo", {"value": "in-process"})).job_id
        running = asyncio.create_task(
            tasks_app.run_worker_async(stop=stop, concurrency=2, poll_interval=0.2)
        )
        try:
            result = await asyncio.wait_for(tasks_app.result_async(job_id, timeout=30), 40)
        finally:
            stop.set()
        await asyncio.wait_for(running, timeout=30)  # returns, without a signal
        status = (await tasks_app.get_job_async(job_id)).status
        await tasks_app.close_async()
        return {"result": result, "status": status, "done": running.done()}

    outcome = asyncio.run(scenario())

    assert outcome == {"result": {"async": "in-process"}, "status": "succeeded", "done": True}


@pytest.mark.usefixtures("own_structlog_setup")
def test_run_worker_async_hands_back_a_running_job_when_stopped(tasks_app: pgqueue.App) -> None:
    async def scenario() -> pgqueue.Job:
        stop = asyncio.Event()
        job_id = (await tasks_app.enqueue_async("async_doze", {"seconds": 120})).job_id
        running = asyncio.create_task(
            tasks_app.run_worker_async(stop=stop, poll_interval=0.2, shutdown_timeout=0.5)
        )
        deadline = time.monotonic() + 30
        while (await tasks_app.get_job_async(job_id)).status is not JobStatus.RUNNING:
            assert time.monotonic() < deadline, "the in-process worker did not lease the job"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(running, timeout=30)
        job = await tasks_app.get_job_async(job_id, history=True)
        await tasks_app.close_async()
        return job

    job = asyncio.run(scenario())

    assert job.status is JobStatus.QUEUED
    assert job.attempts == 0
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [AttemptOutcome.RELEASED]


def test_embedded_run_worker_stops_on_sigterm_with_exit_code_zero(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn(command=[sys.executable, "-m", "tests.apps.embedded"])
    worker.wait_registered()
    job_id = tasks_app.enqueue("echo", {"value": "embedded"}).job_id
    assert tasks_app.result(job_id, timeout=30) == "embedded"

    worker.send(signal.SIGTERM)

    assert worker.wait_exit() == 0
    assert worker.registration() is None


@pytest.mark.slow
def test_a_router_worker_exits_after_its_shutdown_timeout_with_sync_tasks_still_running(
    workers: Workers, db_dsn: str
) -> None:
    """One process serving two Apps stops as one App's worker does: sync tasks
    still running in threads after the shutdown timeout are handed back and
    the process exits at once (Router.run_worker had its own copy of the
    runner without that, and waited for the threads)."""
    from tests.apps.routed import build_router

    with build_router(db_dsn) as router:
        for app in router.apps.values():
            app.migrate()
        jobs = {
            key: app.enqueue("nap", {"key": key, "seconds": 120}).job_id
            for key, app in router.apps.items()
        }
        worker = workers.spawn(
            "--concurrency", "2", "--shutdown-timeout", "1s", app="tests.apps.routed:router"
        )
        wait_starts(workers, list(jobs), worker)

        sent = time.monotonic()
        worker.send(signal.SIGTERM)

        assert worker.wait_exit(timeout=20) == 0
        assert time.monotonic() - sent < 20
        for key, job_id in jobs.items():
            job = router.get_job(key, job_id, history=True)
            assert job.status is JobStatus.QUEUED  # handed back on both shards
            assert [a.outcome for a in job.attempt_history or []] == [AttemptOutcome.RELEASED]
