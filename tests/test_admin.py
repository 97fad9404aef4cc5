"""Job administration: cancel, replay, requeue_dead (and their async twins)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import pgqueue
from tests.fixtures.dbstate import snapshot
from tests.fixtures.factory import JobFactory

# --- cancel -----------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [None, 3600.0], ids=["queued", "scheduled"])
def test_cancel_of_a_waiting_job_is_immediate(
    app: pgqueue.App, job_factory: JobFactory, delay: float | None
) -> None:
    job_id = app.enqueue("t", delay=delay, dedup_key="k").job_id

    assert app.cancel(job_id) is pgqueue.JobStatus.CANCELLED

    row = job_factory.row(job_id)
    assert row["status"] == "cancelled"
    assert row["finished_at"] is not None
    assert app.get_job(job_id).status is pgqueue.JobStatus.CANCELLED
    job_factory.make_due(job_id)
    assert app.lease("default", "w1", max=10) == []
    # A cancelled job frees its dedup key.
    again = app.enqueue("t", dedup_key="k")
    assert again.created is True
    assert again.job_id != job_id


def test_cancel_of_a_running_job_asks_it_to_stop_and_ack_ends_it_cancelled(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")

    assert app.cancel(job_id) is pgqueue.JobStatus.RUNNING

    row = job_factory.row(job_id)
    assert row["status"] == "running"
    assert row["cancel_requested"] is True
    assert app.get_job(job_id).status is pgqueue.JobStatus.RUNNING
    assert app.extend(leased, 60) is True  # the attempt still holds its lease

    app.ack(leased, result={"done": True})

    job = app.get_job(job_id, history=True)
    assert job.status is pgqueue.JobStatus.CANCELLED
    assert job.result is None
    assert job.finished_at is not None
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [pgqueue.AttemptOutcome.CANCELLED]


def test_a_running_job_cancelled_then_failed_is_not_retried(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t", max_attempts=5).job_id
    (leased,) = app.lease("default", "w1")
    app.cancel(job_id)

    status = app.fail(leased, "interrupted", retry_at=datetime.now(UTC))

    assert status is pgqueue.JobStatus.CANCELLED
    assert job_factory.row(job_id)["status"] == "cancelled"
    job_factory.make_due(job_id)
    assert app.lease("default", "w1") == []


def test_a_running_job_cancelled_then_nacked_ends_cancelled(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")
    app.cancel(job_id)

    app.nack(leased)

    assert job_factory.row(job_id)["status"] == "cancelled"
    assert app.lease("default", "w1") == []


def test_a_running_job_cancelled_then_reaped_ends_cancelled(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    app.lease("default", "w1")
    app.cancel(job_id)
    job_factory.expire_lease(job_id)

    assert app.reap() == 1

    assert job_factory.row(job_id)["status"] == "cancelled"
    job_factory.make_due(job_id)
    assert app.lease("default", "w1") == []


@pytest.mark.parametrize("final_status", ["succeeded", "dead", "cancelled"])
def test_cancel_of_a_finished_job_is_an_error_and_changes_nothing(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str, final_status: str
) -> None:
    job_id = job_factory.insert(status=final_status)
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.InvalidJobState, match=str(job_id)):
        app.cancel(job_id)

    assert snapshot(db_dsn) == before


def test_cancel_of_a_missing_job_is_not_found(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.JobNotFound):
        app.cancel(999_999)


# --- replay -------------------------------------------------------------------------------


def test_replay_enqueues_a_copy_with_a_new_id(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task(queue="mail", priority=4, max_attempts=2)
    def send(to: str) -> None: ...

    original = send.enqueue(to="a@b.c").job_id
    (leased,) = app.lease("mail", "w1")
    app.ack(leased, result="sent")
    original_row = job_factory.row(original)

    copy = app.replay(original)

    assert copy > original
    row = job_factory.row(copy)
    assert row["task"] == "send"
    assert row["queue"] == "mail"
    assert row["payload"] == {"to": "a@b.c"}
    assert row["priority"] == 4
    assert row["max_attempts"] == 2
    assert row["attempts"] == 0
    assert row["status"] == "queued"
    assert row["result"] is None
    assert job_factory.row(original) == original_row
    assert [j.job_id for j in app.lease("mail", "w2")] == [copy]


def test_replay_into_another_queue_at_another_time(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    original = job_factory.insert(status="dead", queue="mail", payload={"x": 1}, attempts=5)
    run_at = datetime.now(UTC) + timedelta(days=1)

    copy = app.replay(original, queue="mail-retry", run_at=run_at)

    row = job_factory.row(copy)
    assert (row["queue"], row["run_at"], row["payload"], row["attempts"]) == (
        "mail-retry",
        run_at,
        {"x": 1},
        0,
    )
    assert app.get_job(copy).status is pgqueue.JobStatus.SCHEDULED
    assert job_factory.row(original)["status"] == "dead"


def test_replay_of_a_missing_job_is_not_found(app: pgqueue.App, db_dsn: str) -> None:
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.JobNotFound):
        app.replay(424_242)
    assert snapshot(db_dsn) == before


# --- requeue_dead --------------------------------------------------------------------------


def test_requeue_dead_puts_the_job_back_with_one_more_attempt(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t", max_attempts=2).job_id
    for _ in range(2):
        job_factory.make_due(job_id)
        (leased,) = app.lease("default", "w1")
        app.fail(leased, "broken")
    assert job_factory.row(job_id)["status"] == "dead"

    app.requeue_dead(job_id)

    row = job_factory.row(job_id)
    assert row["status"] == "queued"
    assert row["finished_at"] is None
    assert app.get_job(job_id).status is pgqueue.JobStatus.QUEUED
    (again,) = app.lease("default", "w1")
    assert (again.job_id, again.attempt) == (job_id, 3)
    assert app.fail(again, "still broken") is pgqueue.JobStatus.DEAD


def test_requeue_dead_of_a_permanent_failure_keeps_its_attempt_budget(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t", max_attempts=5).job_id
    (leased,) = app.lease("default", "w1")
    app.fail(leased, "bad", permanent=True)

    app.requeue_dead(job_id)

    (again,) = app.lease("default", "w1")
    assert again.attempt == 2
    assert app.fail(again, "x") is pgqueue.JobStatus.SCHEDULED


@pytest.mark.parametrize("stored_status", ["queued", "running", "succeeded", "cancelled"])
def test_requeue_dead_of_a_job_that_is_not_dead_changes_nothing(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str, stored_status: str
) -> None:
    job_id = job_factory.insert(status=stored_status)
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.InvalidJobState):
        app.requeue_dead(job_id)

    assert snapshot(db_dsn) == before


def test_requeue_dead_is_refused_while_its_dedup_key_is_live_again(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    dead = job_factory.insert(status="dead", dedup_key="k")
    app.enqueue("t", dedup_key="k")
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.DuplicateJob):
        app.requeue_dead(dead)

    assert snapshot(db_dsn) == before


def test_requeue_dead_of_a_missing_job_is_not_found(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.JobNotFound):
        app.requeue_dead(31_337)


# --- async twins ----------------------------------------------------------------------------


def test_async_admin_twins(app: pgqueue.App, job_factory: JobFactory) -> None:
    waiting = app.enqueue("t").job_id
    dead = job_factory.insert(status="dead", payload={"d": 1})

    async def main() -> dict[str, Any]:
        try:
            out: dict[str, Any] = {
                "cancel": await app.cancel_async(waiting),
                "replay": await app.replay_async(dead, queue="again"),
            }
            await app.requeue_dead_async(dead)
            return out
        finally:
            await app.close_async()

    out = asyncio.run(main())

    assert out["cancel"] is pgqueue.JobStatus.CANCELLED
    assert job_factory.row(waiting)["status"] == "cancelled"
    assert job_factory.row(out["replay"])["queue"] == "again"
    assert job_factory.row(out["replay"])["payload"] == {"d": 1}
    assert job_factory.row(dead)["status"] == "queued"
