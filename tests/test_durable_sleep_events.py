"""Durable tasks, sleeps and events: ``context.sleep`` leaves the worker
without spending an attempt, ``context.wait_for_event`` waits with status
``waiting`` and no slot until ``send_event`` (Python or SQL, in the sender's
transaction) or its timeout; run by a real (in-process) worker."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobContext
from tests.inprocess_worker import finished, quiet_structlog, run_until

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


def _status(app: pgqueue.App, job_id: int) -> pgqueue.JobStatus:
    return app.get_job(job_id).status


# --- sleep -----------------------------------------------------------------------------


def test_a_sleep_frees_the_slot_and_does_not_spend_an_attempt(app: pgqueue.App) -> None:
    order: list[str] = []

    @app.task(name="sleeper", pass_context=True, max_attempts=1)
    def sleeper(context: JobContext) -> str:
        order.append("sleeper starts")
        context.step("before", lambda: order.append("before") or 1)
        context.sleep(2.0)  # the quick job, due in 0.3 s, runs meanwhile
        context.step("after", lambda: order.append("after") or 2)
        return "awake"

    @app.task(name="quick")
    def quick() -> None:
        order.append("quick")

    sleeper_id = app.enqueue("sleeper").job_id
    quick_id = app.enqueue("quick", run_at=datetime.now(UTC) + timedelta(seconds=0.3)).job_id
    # One slot: the quick job can only run while the sleeper is off the worker.
    run_until(app, finished(app, sleeper_id, quick_id), concurrency=1)

    job = app.get_job(sleeper_id, history=True)
    assert (job.status, job.result, job.attempts) == (pgqueue.JobStatus.SUCCEEDED, "awake", 1)
    assert order == ["sleeper starts", "before", "quick", "sleeper starts", "after"]
    assert job.attempt_history is not None
    assert [a.outcome.value for a in job.attempt_history] == ["slept", "succeeded"]
    assert [(s.name, s.kind, s.status) for s in job.steps] == [
        ("before", "step", "succeeded"),
        ("sleep#1", "sleep", "slept"),
        ("after", "step", "succeeded"),
    ]
    sleep = job.steps[1]
    assert sleep.wake_at is not None
    assert sleep.wake_at > sleep.started_at


def test_a_sleep_of_days_leaves_the_job_scheduled_and_passes_through_after(
    app: pgqueue.App, db_dsn: str
) -> None:
    runs: list[int] = []

    @app.task(name="reminder", pass_context=True, max_attempts=1)
    async def reminder(context: JobContext) -> str:
        runs.append(1)
        await context.sleep("3d")
        return "reminded"

    job_id = app.enqueue("reminder").job_id
    run_until(app, lambda: _status(app, job_id) is pgqueue.JobStatus.SCHEDULED)
    job = app.get_job(job_id)
    wake = job.run_at - datetime.now(UTC)
    assert timedelta(days=2, hours=23) < wake <= timedelta(days=3)
    assert job.attempts == 0
    assert [(s.kind, s.status, s.wake_at) for s in job.steps] == [("sleep", "sleeping", job.run_at)]
    assert "sleeps until" in app.explain(job_id)
    counts = app.metrics()["default"]
    assert (counts.scheduled, counts.sleeping, counts.event_waiting) == (1, 1, 0)

    # Three days later (a worker restarted meanwhile): the sleep is done.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.job_steps SET wake_at = now() - interval '1 s' WHERE job_id = %s",
            (job_id,),
        )
        conn.execute(
            "UPDATE pgqueue.jobs_live SET run_at = now(), status = 'queued' WHERE id = %s",
            (job_id,),
        )
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert (job.status, job.result) == (pgqueue.JobStatus.SUCCEEDED, "reminded")
    assert runs == [1, 1]


def test_sleep_until_a_time_already_past_runs_on_after_one_hop(app: pgqueue.App) -> None:
    @app.task(name="until", pass_context=True, max_attempts=1)
    def until(context: JobContext) -> str:
        context.sleep_until(datetime.now(UTC) - timedelta(seconds=1), name="nap")
        return "done"

    job_id = app.enqueue("until").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert (job.status, job.result) == (pgqueue.JobStatus.SUCCEEDED, "done")
    assert [s.name for s in job.steps] == ["nap"]


def test_a_bad_duration_fails_the_attempt_clearly(app: pgqueue.App) -> None:
    @app.task(name="bad_sleep", pass_context=True, max_attempts=1)
    def bad_sleep(context: JobContext) -> None:
        context.sleep("soon")

    job_id = app.enqueue("bad_sleep").job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.DEAD
    assert (job.last_error or "").startswith("InvalidDuration:")
    assert job.steps == []


# --- events ----------------------------------------------------------------------------


def _waiter(app: pgqueue.App, name: str = "onboard", timeout: Any = None) -> list[str]:
    runs: list[str] = []

    @app.task(name=name, pass_context=True, max_attempts=1)
    async def onboard(user: str, context: JobContext) -> Any:
        runs.append("run")
        account = await context.step("account", lambda: f"acc-{user}")
        try:
            paid = await context.wait_for_event(f"paid:{account}", timeout=timeout)
        except pgqueue.EventTimeout:
            return "not paid"
        return {"account": account, "plan": paid["plan"]}

    return runs


def _run_while(app: pgqueue.App, action: Any, done: Any, **options: Any) -> None:
    """Run a worker until ``done()``; ``action()`` once the job waits."""
    fired = threading.Event()

    def check() -> bool:
        if not fired.is_set():
            if action():
                fired.set()
            return False
        return bool(done())

    run_until(app, check, **options)


def test_a_job_waits_without_a_slot_until_the_event_is_sent(
    app: pgqueue.App, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _waiter(app)
    other: list[int] = []

    @app.task(name="other")
    def other_task() -> None:
        other.append(1)

    job_id = app.enqueue("onboard", {"user": "u1"}).job_id

    def send_once_waiting() -> bool:
        if _status(app, job_id) is not pgqueue.JobStatus.WAITING:
            return False
        # While it waits, the one slot serves other jobs.
        other_id = app.enqueue("other").job_id
        deadline = time.monotonic() + 30
        while _status(app, other_id) is not pgqueue.JobStatus.SUCCEEDED:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waiting = app.get_job(job_id)
        assert [(s.kind, s.status, s.event_key) for s in waiting.steps][-1] == (
            "event",
            "waiting",
            "paid:acc-u1",
        )
        assert "waits for event 'paid:acc-u1'" in app.explain(job_id)
        counts = app.metrics()["default"]
        assert (counts.waiting, counts.event_waiting, counts.sleeping) == (1, 1, 0)
        assert app.send_event("paid:acc-u1", {"plan": "pro"}) == 1
        return True

    _run_while(app, send_once_waiting, finished(app, job_id), concurrency=1)
    job = app.get_job(job_id, history=True)
    assert (job.status, job.result) == (
        pgqueue.JobStatus.SUCCEEDED,
        {"account": "acc-u1", "plan": "pro"},
    )
    assert job.attempts == 1
    assert job.attempt_history is not None
    assert [a.outcome.value for a in job.attempt_history] == ["waited", "succeeded"]
    assert runs == ["run", "run"]
    assert other == [1]
    event = job.steps[-1]
    assert (event.name, event.status, event.result) == (
        "event:paid:acc-u1",
        "received",
        {"plan": "pro"},
    )


def test_an_event_sent_before_the_wait_is_found_at_once(app: pgqueue.App) -> None:
    runs = _waiter(app)
    assert app.send_event("paid:acc-u2", {"plan": "team"}) == 0
    job_id = app.enqueue("onboard", {"user": "u2"}).job_id
    run_until(app, finished(app, job_id))
    job = app.get_job(job_id, history=True)
    assert job.result == {"account": "acc-u2", "plan": "team"}
    assert runs == ["run"]
    assert job.attempt_history is not None
    assert [a.outcome.value for a in job.attempt_history] == ["succeeded"]


def test_an_event_sent_from_sql_releases_only_when_its_transaction_commits(
    app: pgqueue.App, db_dsn: str
) -> None:
    _waiter(app)
    job_id = app.enqueue("onboard", {"user": "u3"}).job_id
    sent: list[str] = []

    def send_in_sql() -> bool:
        if _status(app, job_id) is not pgqueue.JobStatus.WAITING:
            return False
        with psycopg.connect(db_dsn) as conn:
            row = conn.execute(
                "SELECT pgqueue.send_event('paid:acc-u3', '{\"plan\": \"free\"}')"
            ).fetchone()
            assert row == (1,)
            conn.rollback()
        assert _status(app, job_id) is pgqueue.JobStatus.WAITING  # rolled back: still waiting
        with psycopg.connect(db_dsn) as conn:
            conn.execute(
                "SELECT pgqueue.send_event(key => 'paid:acc-u3', payload => %s)",
                ('{"plan": "pro"}',),
            )
            assert _status(app, job_id) is pgqueue.JobStatus.WAITING  # not yet committed
            conn.commit()
        sent.append("committed")
        return True

    _run_while(app, send_in_sql, finished(app, job_id))
    assert sent == ["committed"]
    assert app.get_job(job_id).result == {"account": "acc-u3", "plan": "pro"}


def test_a_timeout_raises_event_timeout_in_the_task(app: pgqueue.App) -> None:
    runs = _waiter(app, timeout=0.5)
    job_id = app.enqueue("onboard", {"user": "u4"}).job_id
    run_until(app, finished(app, job_id), reap_interval=0.2)
    job = app.get_job(job_id)
    assert (job.status, job.result) == (pgqueue.JobStatus.SUCCEEDED, "not paid")
    assert runs == ["run", "run"]
    assert [(s.kind, s.status) for s in job.steps][-1] == ("event", "timed_out")
    # An event sent later changes nothing for it.
    assert app.send_event("paid:acc-u4") == 0


def test_a_sync_task_waits_too_and_an_uncaught_timeout_fails_it(app: pgqueue.App) -> None:
    @app.task(name="sync_wait", pass_context=True, max_attempts=1)
    def sync_wait(context: JobContext) -> Any:
        return context.wait_for_event("never", timeout="200ms")

    job_id = app.enqueue("sync_wait").job_id
    run_until(app, finished(app, job_id), reap_interval=0.2)
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.DEAD
    assert (job.last_error or "").startswith("EventTimeout: event 'never' was not sent")


def test_cancelling_a_waiting_job_ends_it(app: pgqueue.App) -> None:
    _waiter(app)
    job_id = app.enqueue("onboard", {"user": "u5"}).job_id

    def cancel() -> bool:
        if _status(app, job_id) is not pgqueue.JobStatus.WAITING:
            return False
        app.cancel(job_id)
        return True

    _run_while(app, cancel, finished(app, job_id))
    assert _status(app, job_id) is pgqueue.JobStatus.CANCELLED
    assert app.send_event("paid:acc-u5") == 0


def test_bad_event_keys_and_payloads_are_refused(app: pgqueue.App, db_dsn: str) -> None:
    with pytest.raises(pgqueue.InvalidInput, match="event key"):
        app.send_event("")
    with pytest.raises(pgqueue.InvalidPayload, match="must be JSON"):
        app.send_event("k", {1, 2})
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.events").fetchone()
        assert row == (0,)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="event key"):
            conn.execute("SELECT pgqueue.send_event('')")


def test_events_are_kept_as_long_as_cancelled_jobs(app: pgqueue.App, db_dsn: str) -> None:
    app.send_event("old", 1)
    app.send_event("new", 2)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.events SET sent_at = now() - interval '8 days' WHERE key = 'old'"
        )
        conn.execute("SELECT * FROM pgqueue.reap_jobs(10)")
        rows = conn.execute("SELECT key FROM pgqueue.events ORDER BY key").fetchall()
    assert rows == [("new",)]


def test_a_released_job_whose_dedup_key_was_taken_meanwhile_still_runs(
    app: pgqueue.App,
) -> None:
    _waiter(app)
    job_id = app.enqueue("onboard", {"user": "u6"}, dedup_key="onboard:u6").job_id
    later: list[int] = []

    def send() -> bool:
        if _status(app, job_id) is not pgqueue.JobStatus.WAITING:
            return False
        # Waiting, the job is out of the dedup index: a new job takes the key.
        again = app.enqueue("onboard", {"user": "u7"}, dedup_key="onboard:u6")
        assert again.created
        later.append(again.job_id)
        app.send_event("paid:acc-u7", {"plan": "a"})
        assert app.send_event("paid:acc-u6", {"plan": "b"}) == 1  # no unique violation
        return True

    _run_while(app, send, lambda: bool(later) and finished(app, job_id, *later)())
    assert app.get_job(job_id).result == {"account": "acc-u6", "plan": "b"}
    assert app.get_job(later[0]).result == {"account": "acc-u7", "plan": "a"}


def test_send_event_with_conn_commits_with_the_callers_transaction(app: pgqueue.App) -> None:
    _waiter(app)
    job_id = app.enqueue("onboard", {"user": "u8"}).job_id

    class Rollback(Exception):
        pass

    def send() -> bool:
        if _status(app, job_id) is not pgqueue.JobStatus.WAITING:
            return False
        released: list[int] = []
        try:
            with app.transaction() as conn:
                released.append(app.send_event("paid:acc-u8", {"plan": "x"}, conn=conn))
                raise Rollback
        except Rollback:
            pass
        assert released == [1]
        assert _status(app, job_id) is pgqueue.JobStatus.WAITING
        with app.transaction() as conn:
            app.enqueue("other_side_effect", conn=conn)
            assert app.send_event("paid:acc-u8", {"plan": "y"}, conn=conn) == 1
        return True

    _run_while(app, send, finished(app, job_id))
    assert app.get_job(job_id).result == {"account": "acc-u8", "plan": "y"}
