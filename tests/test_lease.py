"""The low-level consumer API: lease order, ack, ack_many, nack, extend, serial
keys, fencing of stale holders, attempt history, and the async twins."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import pgqueue
from tests.fixtures.dbstate import snapshot
from tests.fixtures.factory import JobFactory


def leased_ids(jobs: list[pgqueue.LeasedJob]) -> list[int]:
    return [j.job_id for j in jobs]


# --- ordering -------------------------------------------------------------------


@pytest.fixture
def ordered_jobs(app: pgqueue.App) -> dict[str, int]:
    """Five ready jobs whose lease order (priority desc, run_at, id) is C, D, B, A, E."""
    now = datetime.now(UTC)
    return {
        "A": app.enqueue("t", {"n": "A"}, priority=0, run_at=now - timedelta(seconds=50)).job_id,
        "B": app.enqueue("t", {"n": "B"}, priority=5, run_at=now - timedelta(seconds=10)).job_id,
        "C": app.enqueue("t", {"n": "C"}, priority=5, run_at=now - timedelta(seconds=30)).job_id,
        # Same priority and run_at as C, later id.
        "D": app.enqueue("t", {"n": "D"}, priority=5, run_at=now - timedelta(seconds=30)).job_id,
        "E": app.enqueue("t", {"n": "E"}, priority=-1, run_at=now - timedelta(seconds=90)).job_id,
    }


def test_lease_order_is_priority_desc_then_run_at_then_id(
    app: pgqueue.App, ordered_jobs: dict[str, int]
) -> None:
    order = [leased_ids(app.lease("default", "w1", max=1)) for _ in range(6)]
    expected = [[ordered_jobs[name]] for name in "CDBAE"] + [[]]
    assert order == expected


def test_batch_lease_takes_the_first_jobs_in_order(
    app: pgqueue.App, ordered_jobs: dict[str, int]
) -> None:
    first = app.lease("default", "w1", max=3)
    assert set(leased_ids(first)) == {ordered_jobs["C"], ordered_jobs["D"], ordered_jobs["B"]}
    rest = app.lease("default", "w1", max=10)
    assert set(leased_ids(rest)) == {ordered_jobs["A"], ordered_jobs["E"]}


def test_batch_lease_returns_its_jobs_in_order(
    app: pgqueue.App, ordered_jobs: dict[str, int]
) -> None:
    batch = app.lease("default", "w1", max=5)
    assert leased_ids(batch) == [ordered_jobs[name] for name in "CDBAE"]


def test_lease_serves_only_the_queues_asked_for(app: pgqueue.App) -> None:
    a = app.enqueue("t", queue="a").job_id
    b = app.enqueue("t", queue="b").job_id
    c = app.enqueue("t", queue="c").job_id

    assert leased_ids(app.lease("a", "w1", max=10)) == [a]
    assert leased_ids(app.lease(["zzz", "b"], "w1", max=10)) == [b]
    assert leased_ids(app.lease(None, "w1", max=10)) == [c]
    assert app.lease(None, "w1", max=10) == []


def test_lease_returns_the_job_and_records_the_attempt(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    @app.task(queue="mail", lease_seconds=120)
    def send(to: str) -> None: ...

    job_id = send.enqueue(to="a@b.c").job_id

    (leased,) = app.lease("mail", "worker-1", max=10)

    assert leased.job_id == job_id
    assert leased.attempt == 1
    assert leased.task == "send"
    assert leased.queue == "mail"
    assert leased.payload == {"to": "a@b.c"}
    row = job_factory.row(job_id)
    assert row["status"] == "running"
    assert row["attempts"] == 1
    assert row["worker_id"] == "worker-1"
    assert row["attempt_id"] == leased.attempt_id
    assert row["lease_expires_at"] == leased.lease_expires_at
    # The task's lease_seconds was stored with the job at enqueue.
    assert leased.lease_expires_at - row["attempt_started_at"] == timedelta(seconds=120)
    assert app.get_job(job_id).status is pgqueue.JobStatus.RUNNING


def test_lease_seconds_argument_overrides_the_jobs_own(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1", lease_seconds=7)
    row = job_factory.row(job_id)
    assert leased.lease_expires_at - row["attempt_started_at"] == timedelta(seconds=7)


def test_a_leased_job_is_not_leased_again(app: pgqueue.App) -> None:
    app.enqueue("t")
    assert len(app.lease("default", "w1", max=10)) == 1
    assert app.lease("default", "w2", max=10) == []


def test_each_lease_has_a_new_attempt_id(app: pgqueue.App) -> None:
    app.enqueue("t")
    app.enqueue("t")
    first, second = app.lease("default", "w1", max=2)
    assert first.attempt_id != second.attempt_id


# --- ack, ack_many ----------------------------------------------------------------------


def test_ack_marks_succeeded_and_stores_the_result(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")

    app.ack(leased, result={"sent": 3})

    row = job_factory.row(job_id)
    assert row["status"] == "succeeded"
    assert row["finished_at"] is not None
    assert row["result"] == {"sent": 3}
    job = app.get_job(job_id)
    assert job.status is pgqueue.JobStatus.SUCCEEDED
    assert job.result == {"sent": 3}
    assert job.attempts == 1
    # The successful first attempt is kept in the job row itself.
    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.job_attempts").fetchone() == (0,)
    assert app.lease("default", "w1") == []


def test_ack_many_finishes_every_job(app: pgqueue.App, job_factory: JobFactory) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(5)]
    leased = app.lease("default", "w1", max=5)

    app.ack_many(leased)

    statuses = job_factory.conn.execute(
        "SELECT id, status::text FROM pgqueue.jobs ORDER BY id"
    ).fetchall()
    assert statuses == [(i, "succeeded") for i in ids]


def test_ack_many_with_a_stale_lease_acks_the_others_and_names_the_stale_one(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(3)]
    leased = app.lease("default", "w1", max=3)
    stale = next(j for j in leased if j.job_id == ids[1])
    job_factory.expire_lease(stale.job_id)
    assert app.reap() == 1
    reaped_row = job_factory.row(stale.job_id)

    with pytest.raises(pgqueue.LeaseLost) as caught:
        app.ack_many(leased)

    assert caught.value.job_ids == [stale.job_id]
    assert job_factory.row(stale.job_id) == reaped_row
    for job_id in (ids[0], ids[2]):
        assert job_factory.row(job_id)["status"] == "succeeded"


def test_ack_twice_is_refused(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t")
    (leased,) = app.lease("default", "w1")
    app.ack(leased, result=1)
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.LeaseLost):
        app.ack(leased, result=2)

    assert snapshot(db_dsn) == before


# --- nack ------------------------------------------------------------------------------


def test_nack_hands_the_job_back_unrun(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t", run_at=datetime.now(UTC) - timedelta(minutes=5)).job_id
    run_at = job_factory.row(job_id)["run_at"]
    (leased,) = app.lease("default", "w1")

    app.nack(leased)

    row = job_factory.row(job_id)
    assert row["status"] == "queued"
    assert row["attempts"] == 0
    assert row["run_at"] == run_at  # keeps its place in the queue
    assert row["lease_expires_at"] is None
    outcomes = job_factory.conn.execute(
        "SELECT attempt, outcome::text, worker_id FROM pgqueue.job_attempts WHERE job_id = %s",
        (job_id,),
    ).fetchall()
    assert outcomes == [(1, "released", "w1")]

    (again,) = app.lease("default", "w2")
    assert again.job_id == job_id
    assert again.attempt == 1
    assert again.attempt_id != leased.attempt_id


def test_nack_does_not_count_toward_max_attempts(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t", max_attempts=1).job_id
    for _ in range(3):
        (leased,) = app.lease("default", "w1")
        app.nack(leased)
    assert job_factory.row(job_id)["status"] == "queued"

    (leased,) = app.lease("default", "w1")
    assert leased.attempt == 1
    assert app.fail(leased, "boom") is pgqueue.JobStatus.DEAD

    job = app.get_job(job_id, history=True)
    assert job.attempts == 1
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [
        pgqueue.AttemptOutcome.RELEASED,
        pgqueue.AttemptOutcome.RELEASED,
        pgqueue.AttemptOutcome.RELEASED,
        pgqueue.AttemptOutcome.FAILED,
    ]


# --- extend -------------------------------------------------------------------------------


def test_extend_pushes_the_lease(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1", lease_seconds=10)
    before = job_factory.db_now()

    assert app.extend(leased, 600) is True

    expires = job_factory.row(job_id)["lease_expires_at"]
    assert (
        before + timedelta(seconds=600) <= expires <= job_factory.db_now() + timedelta(seconds=600)
    )
    assert job_factory.row(job_id)["status"] == "running"


def test_extend_after_ack_returns_false(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t")
    (leased,) = app.lease("default", "w1")
    app.ack(leased)
    before = snapshot(db_dsn)

    assert app.extend(leased, 60) is False
    assert snapshot(db_dsn) == before


# --- fencing ---------------------------------------------------------------------------------


def test_stale_holder_after_reap_is_refused_and_changes_nothing(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    job_id = app.enqueue("t").job_id
    (stale,) = app.lease("default", "old-worker")
    job_factory.expire_lease(job_id)
    assert app.reap() == 1
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.LeaseLost) as caught:
        app.ack(stale, result="late")
    assert caught.value.job_ids == [job_id]
    with pytest.raises(pgqueue.LeaseLost):
        app.fail(stale, "late failure")
    with pytest.raises(pgqueue.LeaseLost):
        app.nack(stale)
    assert app.extend(stale, 60) is False

    assert snapshot(db_dsn) == before


def test_stale_holder_after_re_lease_is_refused_and_the_new_holder_wins(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    job_id = app.enqueue("t").job_id
    (stale,) = app.lease("default", "old-worker")
    job_factory.expire_lease(job_id)
    assert app.reap() == 1
    job_factory.make_due(job_id)
    (fresh,) = app.lease("default", "new-worker")
    assert fresh.job_id == job_id
    assert fresh.attempt == 2
    assert fresh.attempt_id != stale.attempt_id
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.LeaseLost):
        app.ack(stale, result="late")
    with pytest.raises(pgqueue.LeaseLost):
        app.fail(stale, "late failure", permanent=True)
    with pytest.raises(pgqueue.LeaseLost):
        app.nack(stale)
    with pytest.raises(pgqueue.LeaseLost):
        app.ack_many([stale])
    assert app.extend(stale, 3600) is False

    assert snapshot(db_dsn) == before
    row = job_factory.row(job_id)
    assert (row["status"], row["worker_id"], row["attempt_id"]) == (
        "running",
        "new-worker",
        fresh.attempt_id,
    )

    assert app.extend(fresh, 60) is True
    app.ack(fresh, result="on time")
    assert app.get_job(job_id).result == "on time"


def test_a_holder_that_nacked_can_no_longer_finish_the_job(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t")
    (leased,) = app.lease("default", "w1")
    app.nack(leased)
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.LeaseLost):
        app.ack(leased)
    with pytest.raises(pgqueue.LeaseLost):
        app.nack(leased)
    assert app.extend(leased, 60) is False
    assert snapshot(db_dsn) == before


def test_a_forged_attempt_id_is_refused(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    app.enqueue("t")
    (leased,) = app.lease("default", "w1")
    forged = pgqueue.LeasedJob(
        job_id=leased.job_id,
        attempt_id=leased.attempt_id + 1000,
        attempt=leased.attempt,
        task=leased.task,
        queue=leased.queue,
        payload=leased.payload,
        lease_expires_at=leased.lease_expires_at,
    )
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.LeaseLost):
        app.ack(forged)
    with pytest.raises(pgqueue.LeaseLost):
        app.fail(forged, "x")
    with pytest.raises(pgqueue.LeaseLost):
        app.nack(forged)
    assert app.extend(forged, 60) is False
    assert snapshot(db_dsn) == before


# --- serial keys ----------------------------------------------------------------------------


def test_serial_key_jobs_run_one_at_a_time_in_id_order(app: pgqueue.App) -> None:
    first = app.enqueue("t", serial_key="user:7").job_id
    # A higher priority does not let a later job of the same key jump ahead.
    second = app.enqueue("t", serial_key="user:7", priority=10).job_id
    third = app.enqueue("t", serial_key="user:7", priority=20).job_id
    other = app.enqueue("t", serial_key="user:8").job_id
    free = app.enqueue("t").job_id

    batch = app.lease("default", "w1", max=10)
    assert set(leased_ids(batch)) == {first, other, free}
    assert app.lease("default", "w2", max=10) == []

    by_id = {j.job_id: j for j in batch}
    app.ack(by_id[first])
    (next_job,) = app.lease("default", "w2", max=10)
    assert next_job.job_id == second
    assert app.lease("default", "w3", max=10) == []

    retry_at = datetime.now(UTC) - timedelta(seconds=1)
    assert app.fail(next_job, "boom", retry_at=retry_at) is pgqueue.JobStatus.QUEUED
    # The failed job is retried before the later job of its key.
    (retried,) = app.lease("default", "w3", max=10)
    assert retried.job_id == second
    app.ack(retried)
    assert leased_ids(app.lease("default", "w3", max=10)) == [third]


def test_a_running_serial_job_blocks_an_earlier_requeued_one(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    earlier = job_factory.insert(status="dead", serial_key="k")
    running = job_factory.insert(status="running", serial_key="k")
    assert running > earlier

    app.requeue_dead(earlier)

    assert app.lease("default", "w1", max=10) == []
    assert job_factory.row(running)["status"] == "running"


def test_an_earlier_scheduled_serial_job_holds_back_later_ones(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    scheduled = app.enqueue("t", serial_key="k", delay=3600).job_id
    later = app.enqueue("t", serial_key="k").job_id

    assert app.lease("default", "w1", max=10) == []

    job_factory.make_due(scheduled)
    assert leased_ids(app.lease("default", "w1", max=10)) == [scheduled]
    assert job_factory.row(later)["status"] == "queued"


# --- attempt history ----------------------------------------------------------------------------


def raise_and_catch() -> ValueError:
    try:
        raise ValueError("smtp said no")
    except ValueError as error:
        return error


def test_every_attempt_is_recorded(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t", max_attempts=5).job_id

    (first,) = app.lease("default", "w-a")
    assert app.fail(first, raise_and_catch(), retry_at=datetime.now(UTC)) in (
        pgqueue.JobStatus.QUEUED,
        pgqueue.JobStatus.SCHEDULED,
    )
    job_factory.make_due(job_id)
    (second,) = app.lease("default", "w-b")
    app.nack(second)
    (third,) = app.lease("default", "w-c")
    app.fail(third, "plain message", retry_at=datetime.now(UTC))
    job_factory.make_due(job_id)
    (fourth,) = app.lease("default", "w-d")
    app.ack(fourth)

    job = app.get_job(job_id, history=True)
    history = job.attempt_history
    assert history is not None
    assert job.attempts == 3  # the released attempt did not count
    assert [a.attempt for a in history] == [
        first.attempt,
        second.attempt,
        third.attempt,
        fourth.attempt,
    ]
    assert [a.attempt for a in history] == [1, 2, 2, 3]
    assert [a.attempt_id for a in history] == [
        first.attempt_id,
        second.attempt_id,
        third.attempt_id,
        fourth.attempt_id,
    ]
    assert [a.worker_id for a in history] == ["w-a", "w-b", "w-c", "w-d"]
    assert [a.outcome for a in history] == [
        pgqueue.AttemptOutcome.FAILED,
        pgqueue.AttemptOutcome.RELEASED,
        pgqueue.AttemptOutcome.FAILED,
        pgqueue.AttemptOutcome.SUCCEEDED,
    ]
    failed = history[0]
    assert failed.error_code == "ValueError"
    assert failed.error_message == "smtp said no"
    assert failed.traceback is not None
    assert "ValueError: smtp said no" in failed.traceback
    assert "raise_and_catch" in failed.traceback
    assert history[2].error_message == "plain message"
    assert history[2].traceback is None
    for attempt in history:
        assert attempt.finished_at is not None
        assert attempt.started_at <= attempt.finished_at
        assert attempt.latency_ms is not None
        expected_ms = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
        assert attempt.latency_ms == pytest.approx(expected_ms, abs=0.01)
    starts = [a.started_at for a in history]
    assert starts == sorted(starts)
    assert app.get_job(job_id).attempt_history is None


def test_running_attempt_shows_in_history(app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")

    history = app.get_job(job_id, history=True).attempt_history

    assert history is not None
    (running,) = history
    assert running.outcome is pgqueue.AttemptOutcome.RUNNING
    assert running.attempt_id == leased.attempt_id
    assert running.worker_id == "w1"
    assert running.finished_at is None


# --- async twins ---------------------------------------------------------------------------------


def test_async_consumer_twins(app: pgqueue.App, job_factory: JobFactory, db_dsn: str) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(5)]

    async def main() -> dict[str, Any]:
        try:
            a, b, c, d, e = await app.lease_async("default", "aw", max=5)
            out: dict[str, Any] = {"leased": {a.job_id, b.job_id, c.job_id, d.job_id, e.job_id}}
            out["extended"] = await app.extend_async(a, 300)
            await app.ack_async(a, result={"ok": True})
            await app.ack_many_async([b, c])
            out["failed"] = await app.fail_async(d, "nope", permanent=True)
            await app.nack_async(e)
            out["extend_after_ack"] = await app.extend_async(a, 300)
            with pytest.raises(pgqueue.LeaseLost):
                await app.ack_async(a)
            out["job"] = await app.get_job_async(a.job_id)
            return out
        finally:
            await app.close_async()

    out = asyncio.run(main())

    assert out["leased"] == set(ids)
    assert out["extended"] is True
    assert out["extend_after_ack"] is False
    assert out["failed"] is pgqueue.JobStatus.DEAD
    assert out["job"].result == {"ok": True}
    statuses = dict(
        job_factory.conn.execute("SELECT id, status::text FROM pgqueue.jobs").fetchall()
    )
    assert sorted(statuses.values()) == ["dead", "queued", "succeeded", "succeeded", "succeeded"]
