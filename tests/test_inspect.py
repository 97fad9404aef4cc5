"""Inspection: get_job, list_jobs (keyset pages, filters), metrics, explain."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import pgqueue
from tests.fixtures.factory import JobFactory


def test_get_job_of_a_missing_job_is_not_found(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.JobNotFound) as caught:
        app.get_job(123_456)
    assert caught.value.job_id == 123_456


def test_get_job_reads_every_public_field(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = job_factory.insert(
        task="report",
        queue="reports",
        payload={"k": [1, "x"]},
        status="dead",
        priority=-3,
        attempts=4,
        max_attempts=4,
        dedup_key="d",
        serial_key="s",
        last_error="ValueError: nope",
    )
    row = job_factory.row(job_id)

    job = app.get_job(job_id)

    assert job == pgqueue.Job(
        id=job_id,
        queue="reports",
        task="report",
        payload={"k": [1, "x"]},
        priority=-3,
        status=pgqueue.JobStatus.DEAD,
        run_at=row["run_at"],
        attempts=4,
        max_attempts=4,
        dedup_key="d",
        serial_key="s",
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        last_error="ValueError: nope",
        result=None,
        attempt_history=None,
    )


# --- list_jobs -------------------------------------------------------------------------


def test_list_jobs_pages_newest_first_until_the_last_page(app: pgqueue.App) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(25)]

    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = app.list_jobs(limit=10, cursor=cursor)
        pages += 1
        seen += [j.id for j in page.jobs]
        if page.next_cursor is None:
            break
        assert isinstance(page.next_cursor, str)
        cursor = page.next_cursor
        assert pages < 10

    assert pages == 3
    assert seen == sorted(ids, reverse=True)


def test_a_page_of_jobs_iterates_over_its_jobs_and_has_a_length(app: pgqueue.App) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(3)]
    page = app.list_jobs(limit=2)
    assert [job.id for job in page] == [j.id for j in page.jobs] == ids[:0:-1]
    assert len(page) == 2
    assert page.next_cursor is not None
    [last] = app.list_jobs(limit=2, cursor=page.next_cursor)
    assert last.id == ids[0]
    assert len(app.list_jobs(status="dead")) == 0


def test_list_jobs_cursor_is_stable_while_jobs_are_added(app: pgqueue.App) -> None:
    ids = [app.enqueue("t").job_id for _ in range(6)]
    first = app.list_jobs(limit=3)
    for _ in range(4):
        app.enqueue("t")  # newer jobs must not shift the next page

    second = app.list_jobs(limit=3, cursor=first.next_cursor)

    assert [j.id for j in first.jobs] == ids[:2:-1]
    assert [j.id for j in second.jobs] == ids[2::-1]
    assert second.next_cursor is None


def test_list_jobs_exact_multiple_of_the_limit_ends_with_no_cursor(app: pgqueue.App) -> None:
    for _ in range(4):
        app.enqueue("t")
    first = app.list_jobs(limit=2)
    second = app.list_jobs(limit=2, cursor=first.next_cursor)
    assert len(second.jobs) == 2
    # Either the second page says it is the last, or a third page is empty and last.
    if second.next_cursor is not None:
        third = app.list_jobs(limit=2, cursor=second.next_cursor)
        assert third.jobs == []
        assert third.next_cursor is None


def test_list_jobs_filters(app: pgqueue.App, job_factory: JobFactory) -> None:
    queued = job_factory.insert(queue="a", task="x", status="queued", run_at=-1.0)
    scheduled = job_factory.insert(queue="a", task="x", status="scheduled", run_at=600.0)
    running = job_factory.insert(queue="a", task="y", status="running")
    succeeded = job_factory.insert(queue="b", task="x", status="succeeded")
    dead = job_factory.insert(queue="b", task="y", status="dead")
    cancelled = job_factory.insert(queue="b", task="x", status="cancelled")

    def ids(**filters: Any) -> set[int]:
        return {j.id for j in app.list_jobs(**filters).jobs}

    assert ids() == {queued, scheduled, running, succeeded, dead, cancelled}
    assert ids(queue="a") == {queued, scheduled, running}
    assert ids(task="y") == {running, dead}
    assert ids(status="queued") == {queued}
    assert ids(status="scheduled") == {scheduled}
    assert ids(status=pgqueue.JobStatus.RUNNING) == {running}
    assert ids(status="succeeded") == {succeeded}
    assert ids(status="dead") == {dead}
    assert ids(status="cancelled") == {cancelled}
    assert ids(queue="b", task="x", status="cancelled") == {cancelled}
    assert ids(queue="nowhere") == set()
    statuses = {j.id: j.status for j in app.list_jobs().jobs}
    assert statuses[scheduled] is pgqueue.JobStatus.SCHEDULED
    assert statuses[queued] is pgqueue.JobStatus.QUEUED


def test_list_jobs_rejects_a_forged_cursor(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidOption):
        app.list_jobs(cursor="not-a-cursor!")


def test_list_jobs_rejects_an_unknown_status(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidOption):
        app.list_jobs(status="sleeping")


# --- metrics ------------------------------------------------------------------------------


def test_metrics_count_each_status_per_queue(app: pgqueue.App, job_factory: JobFactory) -> None:
    for _ in range(3):
        job_factory.insert(queue="mail", status="queued", run_at=-120.0)
    job_factory.insert(queue="mail", status="scheduled", run_at=600.0)
    job_factory.insert(queue="mail", status="scheduled", run_at=-30.0)  # due: counts as queued
    job_factory.insert(queue="mail", status="running")
    job_factory.insert(queue="mail", status="running")
    job_factory.insert(queue="mail", status="succeeded")
    job_factory.insert(queue="mail", status="dead")
    job_factory.insert(queue="mail", status="cancelled")
    job_factory.insert(queue="mail", status="cancelled")
    job_factory.insert(queue="other", status="dead")

    metrics = app.metrics()

    mail = metrics["mail"]
    assert isinstance(mail, pgqueue.QueueMetrics)
    assert (
        mail.queued,
        mail.scheduled,
        mail.running,
        mail.succeeded,
        mail.dead,
        mail.cancelled,
    ) == (4, 1, 2, 1, 1, 2)
    assert mail.paused is False
    assert mail.oldest_ready_age_seconds is not None
    assert mail.oldest_ready_age_seconds >= 120.0
    other = metrics["other"]
    assert (other.queued, other.dead) == (0, 1)
    assert other.oldest_ready_age_seconds is None
    assert set(app.metrics(queue="other")) == {"other"}


def test_metrics_follow_the_api(app: pgqueue.App) -> None:
    app.enqueue("t", queue="q")
    app.enqueue("t", queue="q")
    app.enqueue("t", queue="q", delay=3600)
    first, second = app.lease("q", "w1", max=2)
    app.ack(first)
    app.fail(second, "x", permanent=True)

    q = app.metrics()["q"]
    assert (q.queued, q.scheduled, q.running, q.succeeded, q.dead, q.cancelled) == (
        0,
        1,
        0,
        1,
        1,
        0,
    )


def test_metrics_show_a_paused_queue(app: pgqueue.App) -> None:
    app.enqueue("t", queue="q")
    app.pause_queue("q")
    assert app.metrics()["q"].paused is True
    app.resume_queue("q")
    assert app.metrics()["q"].paused is False


# --- explain ---------------------------------------------------------------------------------


def test_explain_names_the_facts_of_each_state(app: pgqueue.App, job_factory: JobFactory) -> None:
    scheduled = app.enqueue("t", delay=3600).job_id
    text = app.explain(scheduled)
    assert "scheduled" in text
    assert str(scheduled) in text

    blocker = app.enqueue("t", serial_key="user:7").job_id
    waiting = app.enqueue("t", serial_key="user:7").job_id
    text = app.explain(waiting)
    assert f"job {blocker}" in text
    assert "serial" in text

    (running,) = app.lease("default", "worker-zeta", max=1)
    assert running.job_id == blocker
    text = app.explain(blocker)
    assert "running" in text
    assert "worker-zeta" in text

    dead = job_factory.insert(
        status="dead", attempts=5, max_attempts=5, last_error="ValueError: quota exceeded"
    )
    text = app.explain(dead)
    assert "dead" in text
    assert "5 attempts" in text
    assert "quota exceeded" in text


def test_explain_of_a_cancelled_job_says_why(app: pgqueue.App) -> None:
    # Cancelled because a dependency was: the reason is the job's last_error.
    first = app.enqueue("t").job_id
    after = app.enqueue("t", depends_on=[first]).job_id
    assert app.cancel(first) == "cancelled"
    assert app.get_job(after).last_error == f"dependency {first} ended cancelled"
    text = app.explain(after)
    assert "was cancelled at" in text
    assert text.endswith(f"UTC: dependency {first} ended cancelled"), text
    # Cancelled by hand, without a reason: none is made up.
    assert app.explain(first).endswith("UTC"), app.explain(first)

    wf = app.workflow("nightly")
    wf.add("extract")
    run = wf.enqueue()
    app.cancel_workflow(run.workflow_id)
    assert app.explain(run.jobs["extract"]).endswith("UTC: workflow cancelled")

    # A failed attempt's error is not the reason it was cancelled: said as what it is.
    retried = app.enqueue("t", queue="retried", max_attempts=3).job_id
    [leased] = app.lease("retried", "w1")
    app.fail(leased, ValueError("boom"))
    assert app.cancel(retried) == "cancelled"
    text = app.explain(retried)
    assert text.endswith("UTC, after attempt 1 failed: ValueError: boom"), text

    # Asked to stop while running; the attempt then failed: its error, as the attempt's.
    stopped = app.enqueue("t", queue="stopped").job_id
    [running] = app.lease("stopped", "w2")
    assert app.cancel(stopped) == "running"
    app.fail(running, KeyError("interrupted"))
    text = app.explain(stopped)
    assert "while attempt 1 ran on worker w2; the attempt ended with KeyError" in text, text


def test_explain_of_a_missing_job_is_not_found(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.JobNotFound):
        app.explain(777_777)


# --- result -----------------------------------------------------------------------------------


def test_result_of_an_acked_job(app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")
    app.ack(leased, result={"total": 42})
    assert app.result(job_id) == {"total": 42}
    assert app.result(job_id, timeout=0) == {"total": 42}


def test_result_waits_until_the_job_is_acked(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")
    waiting: list[Any] = []
    waiter = threading.Thread(target=lambda: waiting.append(app.result(job_id, timeout=60)))
    waiter.start()
    # Ack only once the waiter is registered (it flags the job to be told when it ends).
    deadline = time.monotonic() + 30
    while not job_factory.row(job_id)["notify_finish"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiter.is_alive()
    assert waiting == []
    with pgqueue.App(dsn=db_dsn) as other:
        other.ack(leased, result="done")
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert waiting == ["done"]


def test_result_of_a_dead_job_carries_its_last_error(app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")
    app.fail(leased, "disk full", permanent=True)
    with pytest.raises(pgqueue.JobFailed, match="disk full"):
        app.result(job_id)


def test_result_of_a_cancelled_job(app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    app.cancel(job_id)
    with pytest.raises(pgqueue.JobCancelled):
        app.result(job_id)


def test_result_gives_up_after_its_timeout(app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    with pytest.raises(pgqueue.ResultTimeout):
        app.result(job_id, timeout=0.2)


def test_async_inspect_twins(app: pgqueue.App) -> None:
    ids = [app.enqueue("t", queue="q").job_id for _ in range(3)]

    async def main() -> dict[str, Any]:
        try:
            return {
                "job": await app.get_job_async(ids[0], history=True),
                "page": await app.list_jobs_async(queue="q", limit=2),
                "metrics": await app.metrics_async(),
                "explain": await app.explain_async(ids[1]),
            }
        finally:
            await app.close_async()

    out = asyncio.run(main())

    assert out["job"].id == ids[0]
    assert out["job"].attempt_history == []
    assert [j.id for j in out["page"].jobs] == [ids[2], ids[1]]
    assert out["page"].next_cursor is not None
    assert out["metrics"]["q"].queued == 3
    assert str(ids[1]) in out["explain"]
