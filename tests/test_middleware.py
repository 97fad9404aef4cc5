"""Middleware around task runs (sync and async, order, timeout, exceptions) and
enqueues (change or refuse), and the Sentry middleware against the real SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

import pgqueue
from pgqueue import JobContext, JobSpec, Middleware
from tests.inprocess_worker import finished, quiet_structlog, run_until

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


class Recorder(Middleware):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def process(self, context: JobContext, call_next: Callable[[], Any]) -> Any:
        self.calls.append(f"{self.name}>{context.task}")
        try:
            return call_next()
        finally:
            self.calls.append(f"{self.name}<")

    async def process_async(
        self, context: JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        self.calls.append(f"{self.name}>{context.task}")
        try:
            return await call_next()
        finally:
            self.calls.append(f"{self.name}<")


def test_middleware_wraps_sync_and_async_tasks_first_outermost(app: pgqueue.App) -> None:
    calls: list[str] = []
    app.add_middleware(Recorder("outer", calls))
    app.add_middleware(Recorder("inner", calls))

    @app.task(name="sync_task")
    def sync_task() -> str:
        calls.append("sync")
        return "s"

    @app.task(name="async_task")
    async def async_task() -> str:
        calls.append("async")
        return "a"

    first = app.enqueue("sync_task").job_id
    run_until(app, finished(app, first), concurrency=1)
    second = app.enqueue("async_task").job_id
    run_until(app, finished(app, second), concurrency=1)

    assert calls == [
        "outer>sync_task", "inner>sync_task", "sync", "inner<", "outer<",
        "outer>async_task", "inner>async_task", "async", "inner<", "outer<",
    ]  # fmt: skip
    assert (app.get_job(first).result, app.get_job(second).result) == ("s", "a")


class Exploding(Middleware):
    def process(self, context: JobContext, call_next: Callable[[], Any]) -> Any:
        raise RuntimeError("middleware says no")


def test_an_exception_in_middleware_counts_as_the_tasks(app: pgqueue.App) -> None:
    app.add_middleware(Exploding())
    ran: list[bool] = []

    @app.task(name="never", max_attempts=2)
    def never() -> None:
        ran.append(True)

    job_id = app.enqueue("never").job_id
    run_until(app, finished(app, job_id), poll_interval=0.05)

    job = app.get_job(job_id, history=True)
    assert (job.status, job.attempts) == (pgqueue.JobStatus.DEAD, 2)
    assert job.last_error is not None
    assert "middleware says no" in job.last_error
    assert ran == []


class Slow(Middleware):
    async def process_async(
        self, context: JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        await asyncio.sleep(30)
        return await call_next()


def test_a_tasks_timeout_covers_its_middleware(app: pgqueue.App) -> None:
    app.add_middleware(Slow())

    @app.task(name="quick", timeout=0.3, max_attempts=1)
    async def quick() -> None:
        return None

    job_id = app.enqueue("quick").job_id
    run_until(app, finished(app, job_id))

    job = app.get_job(job_id, history=True)
    assert job.status is pgqueue.JobStatus.DEAD
    assert job.attempt_history is not None
    # Not covered, the middleware would call the task after 30 s: succeeded.
    assert job.attempt_history[-1].outcome is pgqueue.AttemptOutcome.TIMEOUT


class Labels(Middleware):
    def before_enqueue(self, spec: JobSpec) -> JobSpec:
        if spec.task == "forbidden":
            raise pgqueue.InvalidOption("forbidden is not enqueued here")
        return spec._replace(tags=[*(spec.tags or []), "via-middleware"], meta={"seen": True})


def test_before_enqueue_changes_or_refuses_on_every_path(app: pgqueue.App, db_dsn: str) -> None:
    app.add_middleware(Labels())
    one = app.enqueue("t", tags=["mine"]).job_id
    many = app.enqueue_many([JobSpec("t"), JobSpec("u")])

    assert app.get_job(one).tags == ["mine", "via-middleware"]
    assert app.get_job(one).meta == {"seen": True}
    assert [app.get_job(e.job_id).tags for e in many] == [["via-middleware"]] * 2
    with pytest.raises(pgqueue.InvalidOption, match="forbidden"):
        app.enqueue("forbidden")
    with pytest.raises(pgqueue.InvalidOption, match="forbidden"):
        app.enqueue_many([JobSpec("t"), JobSpec("forbidden")])
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    assert row == (3,)


def test_app_takes_middleware_and_refuses_what_is_not_one(db_dsn: str) -> None:
    calls: list[str] = []
    with pgqueue.App(db_dsn, middleware=[Recorder("a", calls)]) as queue_app:
        assert [type(m).__name__ for m in queue_app.middleware] == ["Recorder"]
    with pytest.raises(pgqueue.InvalidOption, match=r"pgqueue\.Middleware"):
        pgqueue.App(db_dsn, middleware=[object()])  # type: ignore[list-item]


class Captured(Transport):
    """sentry-sdk's own transport interface, keeping envelopes in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type == "event":
                self.events.append(item.payload.json)


@pytest.fixture
def sentry_events() -> Any:
    transport = Captured()
    # No default integrations: they patch threads and asyncio for the whole
    # test process (and stay patched), which hung unrelated tests later on.
    sentry_sdk.init(
        dsn="https://public@sentry.example/1", transport=transport, default_integrations=False
    )
    try:
        yield transport.events
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init(default_integrations=False)  # a client that sends nothing


def test_sentry_gets_each_failed_attempt_once_with_the_jobs_tags(
    app: pgqueue.App, sentry_events: list[dict[str, Any]]
) -> None:
    from pgqueue.contrib.sentry import SentryMiddleware

    app.add_middleware(SentryMiddleware())

    @app.task(name="flaky", max_attempts=2, queue="payments")
    def flaky() -> None:
        raise ValueError("card declined")

    job_id = app.enqueue("flaky").job_id
    run_until(app, finished(app, job_id), queues=["payments"], poll_interval=0.05)
    sentry_sdk.flush()

    assert app.get_job(job_id).status is pgqueue.JobStatus.DEAD
    assert len(sentry_events) == 2  # once per attempt
    for attempt, event in enumerate(sentry_events, start=1):
        tags = event["tags"]
        assert tags["pgqueue.job_id"] == str(job_id)
        assert (tags["pgqueue.task"], tags["pgqueue.queue"]) == ("flaky", "payments")
        assert tags["pgqueue.attempt"] == str(attempt)
        assert event["exception"]["values"][-1]["type"] == "ValueError"
