"""Durable tasks, steps: ``context.step`` runs its function once per job, its
result stored before it returns and given back to every later run; fenced by
the attempt id; run by a real (in-process) worker."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobContext
from tests.inprocess_worker import finished, quiet_structlog, run_until

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


def _fast_retries(app: pgqueue.App) -> dict[str, Any]:
    return {"max_attempts": 5, "retry": pgqueue.Backoff(base=0.01, factor=1, max=0.01, jitter=0)}


def test_a_sync_task_runs_each_step_once_across_retries(app: pgqueue.App) -> None:
    calls: list[str] = []
    runs: list[int] = []

    def charge(order: int) -> dict[str, Any]:
        calls.append("charge")
        return {"charged": order * 10}

    def ship(charged: dict[str, Any]) -> str:
        calls.append("ship")
        return f"shipped {charged['charged']}"

    @app.task(name="order", pass_context=True, **_fast_retries(app))
    def order(order_id: int, context: JobContext) -> str:
        runs.append(context.attempt)
        charged = context.step("charge", charge, order_id)
        if len(runs) == 1:
            raise RuntimeError("crash after the charge")
        shipped = context.step("ship", ship, charged)
        if len(runs) == 2:
            raise RuntimeError("crash after shipping")
        return shipped

    job_id = app.enqueue("order", {"order_id": 7}).job_id
    run_until(app, finished(app, job_id))

    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.SUCCEEDED
    assert job.result == "shipped 70"
    assert calls == ["charge", "ship"]  # each once, though the task ran three times
    assert runs == [1, 2, 3]
    assert [(s.name, s.status, s.result) for s in job.steps] == [
        ("charge", "succeeded", {"charged": 70}),
        ("ship", "succeeded", "shipped 70"),
    ]
    assert all(s.kind == "step" and s.finished_at is not None for s in job.steps)
    assert isinstance(job.steps[0], pgqueue.StepRecord)


def test_an_async_task_awaits_steps_sync_and_async_functions(app: pgqueue.App) -> None:
    calls: list[str] = []
    runs: list[int] = []

    async def fetch(n: int) -> list[int]:
        calls.append("fetch")
        await asyncio.sleep(0)
        return list(range(n))

    def total(values: list[int]) -> int:
        calls.append("total")
        return sum(values)

    @app.task(name="pipeline", pass_context=True, **_fast_retries(app))
    async def pipeline(n: int, context: JobContext) -> int:
        runs.append(1)
        values = await context.step("fetch", fetch, n)
        result = await context.step("total", total, values=values)
        if len(runs) == 1:
            raise RuntimeError("crash after both steps")
        return int(result)

    job_id = app.enqueue("pipeline", {"n": 5}).job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert (job.status, job.result) == (pgqueue.JobStatus.SUCCEEDED, 10)
    assert calls == ["fetch", "total"]
    assert len(runs) == 2
    assert [s.result for s in job.steps] == [[0, 1, 2, 3, 4], 10]


def test_a_step_that_raises_is_not_stored_and_runs_again(app: pgqueue.App) -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    @app.task(name="flaky_step", pass_context=True, **_fast_retries(app))
    def flaky_step(context: JobContext) -> str:
        return str(context.step("call", flaky))

    job_id = app.enqueue("flaky_step").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id, history=True)
    assert (job.status, job.result, job.attempts) == (pgqueue.JobStatus.SUCCEEDED, "ok", 3)
    assert len(calls) == 3
    assert [(s.name, s.result) for s in job.steps] == [("call", "ok")]
    assert job.attempt_history is not None
    assert [a.error_code for a in job.attempt_history[:2]] == ["ConnectionError"] * 2


def test_a_duplicate_step_name_in_one_run_is_invalid_input(app: pgqueue.App) -> None:
    calls: list[int] = []

    @app.task(name="dup", pass_context=True, max_attempts=1)
    def dup(context: JobContext) -> None:
        context.step("same", lambda: calls.append(1))
        context.step("same", lambda: calls.append(2))

    job_id = app.enqueue("dup").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.DEAD
    assert job.last_error is not None
    assert job.last_error.startswith("InvalidInput: step name 'same' is used twice")
    assert calls == [1]
    assert [s.name for s in job.steps] == ["same"]


def test_a_result_that_is_not_json_is_a_clear_error_and_not_stored(app: pgqueue.App) -> None:
    @app.task(name="not_json", pass_context=True, max_attempts=1)
    def not_json(context: JobContext) -> None:
        context.step("when", lambda: {1, 2})

    job_id = app.enqueue("not_json").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.DEAD
    assert job.last_error is not None
    assert job.last_error.startswith("InvalidPayload: the result of step 'when' must be JSON")
    assert job.steps == []


def test_bad_step_names_are_refused_before_fn_runs(app: pgqueue.App) -> None:
    calls: list[int] = []

    @app.task(name="bad_name", pass_context=True, max_attempts=1)
    def bad_name(context: JobContext) -> None:
        context.step("", lambda: calls.append(1))

    job_id = app.enqueue("bad_name").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.DEAD
    assert (job.last_error or "").startswith("InvalidInput: a step's name must be")
    assert calls == []


def test_a_stale_attempt_cannot_store_a_step(app: pgqueue.App, db_dsn: str) -> None:
    """The lease of the running attempt is reaped (and the job leased again)
    while its step function runs: storing the step raises LeaseLost, as a
    completion would, and nothing is stored for the stale attempt."""
    seen: list[BaseException] = []
    calls: list[int] = []

    def steal() -> str:
        calls.append(1)
        if len(calls) == 1:
            # Another holder takes the job: the reaper's requeue, then a new
            # lease (one transaction: no heartbeat extends the lease between).
            with psycopg.connect(db_dsn) as conn, conn.transaction():
                conn.execute(
                    "UPDATE pgqueue.jobs_live SET lease_expires_at = now() - interval '1 s'"
                )
                conn.execute("SELECT * FROM pgqueue.reap_jobs(10)")
                conn.execute("UPDATE pgqueue.jobs_live SET run_at = now(), status = 'queued'")
        return "value"

    @app.task(name="stale", pass_context=True, **_fast_retries(app))
    def stale(context: JobContext) -> str:
        try:
            return str(context.step("s", steal))
        except pgqueue.LeaseLost as exc:
            seen.append(exc)
            raise

    job_id = app.enqueue("stale").job_id
    # One slot: the next attempt starts once the stale one has ended.
    run_until(app, finished(app, job_id), concurrency=1)
    job = app.get_job(job_id, history=True)
    assert len(seen) == 1
    assert seen[0].job_ids == [job_id]
    assert job.status is pgqueue.JobStatus.SUCCEEDED
    assert len(calls) == 2  # the stale attempt's result was not stored; the next ran it
    assert job.attempt_history is not None
    assert job.attempt_history[0].outcome is pgqueue.AttemptOutcome.LEASE_EXPIRED
    assert [(s.name, s.result) for s in job.steps] == [("s", "value")]
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT attempt_id FROM pgqueue.job_steps WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    assert row[0] == job.attempt_history[-1].attempt_id


def test_steps_outside_a_worker_say_so(app: pgqueue.App) -> None:
    context = JobContext(1, 1, 1, "default", "t")
    with pytest.raises(pgqueue.InvalidOption, match="only available in a worker"):
        context.step("x", lambda: 1)


def test_retention_deletes_steps_with_their_job(app: pgqueue.App, db_dsn: str) -> None:
    @app.task(name="kept", pass_context=True)
    def kept(context: JobContext) -> None:
        context.step("a", lambda: 1)

    app.set_retention(succeeded=0)
    job_id = app.enqueue("kept").job_id
    run_until(app, lambda: _gone(db_dsn, job_id))
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.job_steps WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row == (0,)


def _gone(dsn: str, job_id: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE id = %s", (job_id,)).fetchone()
    return row == (0,)


def test_drain_runs_durable_tasks_and_counts_sleeps_and_waits(app: pgqueue.App) -> None:
    from pgqueue.testing import drain

    calls: list[str] = []

    @app.task(name="flow", pass_context=True, max_attempts=1)
    def flow(context: JobContext) -> str:
        context.step("a", lambda: calls.append("a"))
        context.sleep("2h")
        context.step("b", lambda: calls.append("b"))
        paid = context.wait_for_event("paid")
        return f"paid {paid}"

    job_id = app.enqueue("flow").job_id
    assert drain(app) == pgqueue.testing.DrainResult(slept=1)
    # The clock jumps to the wake-up: the sleep is over, the wait begins.
    assert drain(app, with_scheduled=True) == pgqueue.testing.DrainResult(waited=1)
    assert app.get_job(job_id).status is pgqueue.JobStatus.WAITING
    app.send_event("paid", "pro")
    # Released now: a new drain starts on the real clock, two hours before the
    # wake-up, so the job sleeps again first (nothing stored anew), then runs
    # to its end once the drain's clock jumped.
    assert drain(app, with_scheduled=True) == pgqueue.testing.DrainResult(succeeded=1, slept=1)
    assert app.get_job(job_id).result == "paid pro"
    assert calls == ["a", "b"]
