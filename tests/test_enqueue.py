"""Enqueue: stored fields, task defaults, scheduling, dedup, enqueue_many, async twins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgqueue
from tests.fixtures.factory import JobFactory


def clocks_now(job_factory: JobFactory, pick: Callable[[datetime, datetime], datetime]) -> datetime:
    """The earlier (``min``) or later (``max``) of this process's and the database's
    clock, so a time window holds wherever the library computes "now"."""
    return pick(datetime.now(UTC), job_factory.db_now())


def test_enqueue_by_name_stores_the_job_with_default_options(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    before = job_factory.db_now()

    result = app.enqueue("send_email", {"to": "a@b.c", "n": [1, 2]})

    assert isinstance(result, pgqueue.Enqueued)
    assert result.created is True
    row = job_factory.row(result.job_id)
    assert row["task"] == "send_email"
    assert row["queue"] == "default"
    assert row["payload"] == {"to": "a@b.c", "n": [1, 2]}
    assert row["priority"] == 0
    assert row["status"] == "queued"
    assert row["attempts"] == 0
    assert row["max_attempts"] == 5
    assert row["dedup_key"] is None
    assert row["serial_key"] is None
    assert before <= row["run_at"] <= job_factory.db_now()

    job = app.get_job(result.job_id)
    assert job.id == result.job_id
    assert job.status is pgqueue.JobStatus.QUEUED
    assert isinstance(job.status, str)  # a str-valued enum
    assert str.__eq__(job.status, "queued")
    assert job.payload == {"to": "a@b.c", "n": [1, 2]}
    assert (job.queue, job.task, job.priority, job.attempts, job.max_attempts) == (
        "default",
        "send_email",
        0,
        0,
        5,
    )
    assert job.finished_at is None
    assert job.last_error is None


def test_enqueue_without_payload_stores_an_empty_object(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("noop").job_id
    assert job_factory.row(job_id)["payload"] == {}


def test_job_ids_increase(app: pgqueue.App) -> None:
    ids = [app.enqueue("t", {"i": i}).job_id for i in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5


def test_task_enqueue_turns_keyword_arguments_into_the_payload(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    @app.task
    def send_email(to: str, subject: str) -> None: ...

    result = send_email.enqueue(to="a@b.c", subject="hi")

    row = job_factory.row(result.job_id)
    assert row["task"] == "send_email"
    assert row["payload"] == {"to": "a@b.c", "subject": "hi"}
    assert row["queue"] == "default"


def test_task_defaults_are_stored_with_each_job(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task(
        name="mailer.send",
        queue="mail",
        priority=3,
        max_attempts=7,
        lease_seconds=120,
        retry=pgqueue.Backoff(base=5.0, factor=3.0, max=60.0, jitter=0.0),
    )
    def send(to: str) -> None: ...

    by_task = send.enqueue(to="x").job_id
    by_name = app.enqueue("mailer.send", {"to": "y"}).job_id

    for job_id in (by_task, by_name):
        row = job_factory.row(job_id)
        assert row["task"] == "mailer.send"
        assert row["queue"] == "mail"
        assert row["priority"] == 3
        assert row["max_attempts"] == 7
        assert row["lease_seconds"] == 120
        assert (
            row["backoff_base"],
            row["backoff_factor"],
            row["backoff_max"],
            row["backoff_jitter"],
        ) == (5.0, 3.0, 60.0, 0.0)


def test_explicit_options_override_task_defaults(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task(queue="mail", priority=3, max_attempts=7)
    def send(to: str) -> None: ...

    by_name = app.enqueue("send", {"to": "y"}, queue="bulk", priority=-2, max_attempts=1)
    by_options = send.with_options(queue="bulk", priority=9, max_attempts=2).enqueue(to="z")

    row = job_factory.row(by_name.job_id)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("bulk", -2, 1)
    row = job_factory.row(by_options.job_id)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("bulk", 9, 2)


def test_with_options_stores_every_option(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task
    def send(to: str) -> None: ...

    before = clocks_now(job_factory, min)
    result = send.with_options(
        priority=9, delay=30, dedup_key="mail:1", serial_key="user:7"
    ).enqueue(to="a@b.c")
    after = clocks_now(job_factory, max)

    row = job_factory.row(result.job_id)
    assert row["priority"] == 9
    assert row["dedup_key"] == "mail:1"
    assert row["serial_key"] == "user:7"
    assert row["payload"] == {"to": "a@b.c"}
    assert before + timedelta(seconds=30) <= row["run_at"] <= after + timedelta(seconds=30)
    assert app.get_job(result.job_id).status is pgqueue.JobStatus.SCHEDULED


def test_unregistered_task_name_gets_library_defaults(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    @app.task(queue="mail", max_attempts=9)
    def other(x: int) -> None: ...

    row = job_factory.row(app.enqueue("not.registered.here", {"x": 1}).job_id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["lease_seconds"]) == (
        "default",
        0,
        5,
        60,
    )
    assert row["backoff_base"] is None


# --- scheduling ---------------------------------------------------------------


def test_run_at_in_the_future_is_scheduled_and_not_leased(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job_id = app.enqueue("t", run_at=run_at).job_id

    assert job_factory.row(job_id)["run_at"] == run_at
    assert app.get_job(job_id).status is pgqueue.JobStatus.SCHEDULED
    assert app.lease("default", "w1", max=10) == []
    assert job_factory.row(job_id)["attempts"] == 0

    job_factory.make_due(job_id)

    leased = app.lease("default", "w1", max=10)
    assert [j.job_id for j in leased] == [job_id]
    assert job_factory.row(job_id)["status"] == "running"


def test_delay_schedules_relative_to_now(app: pgqueue.App, job_factory: JobFactory) -> None:
    before = clocks_now(job_factory, min)
    job_id = app.enqueue("t", delay=timedelta(minutes=10)).job_id
    after = clocks_now(job_factory, max)

    run_at = job_factory.row(job_id)["run_at"]
    assert before + timedelta(minutes=10) <= run_at <= after + timedelta(minutes=10)
    assert app.get_job(job_id).status is pgqueue.JobStatus.SCHEDULED


def test_run_at_in_the_past_and_zero_delay_are_ready_now(app: pgqueue.App) -> None:
    past = app.enqueue("t", run_at=datetime.now(UTC) - timedelta(hours=1)).job_id
    zero = app.enqueue("t", delay=0).job_id

    assert app.get_job(past).status is pgqueue.JobStatus.QUEUED
    assert app.get_job(zero).status is pgqueue.JobStatus.QUEUED
    assert {j.job_id for j in app.lease("default", "w1", max=10)} == {past, zero}


def test_naive_run_at_is_taken_as_utc(app: pgqueue.App, job_factory: JobFactory) -> None:
    naive = datetime(2031, 5, 6, 7, 8, 9)
    job_id = app.enqueue("t", run_at=naive).job_id
    assert job_factory.row(job_id)["run_at"] == naive.replace(tzinfo=UTC)


def test_run_at_in_another_time_zone_is_the_same_instant(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    tokyo = datetime(2031, 1, 2, 9, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    job_id = app.enqueue("t", run_at=tokyo).job_id
    assert job_factory.row(job_id)["run_at"] == datetime(2031, 1, 2, 0, 0, tzinfo=UTC)


def test_scheduled_job_becomes_leasable_when_its_time_comes(app: pgqueue.App) -> None:
    job_id = app.enqueue("t", delay=0.3).job_id
    assert app.lease("default", "w1") == []

    deadline = time.monotonic() + 15
    leased: list[pgqueue.LeasedJob] = []
    while not leased and time.monotonic() < deadline:
        time.sleep(0.05)
        leased = app.lease("default", "w1")
    assert [j.job_id for j in leased] == [job_id]


def test_due_scheduled_row_shows_queued_and_is_staged_by_lease(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    # Stored as 'scheduled' with a run_at that has passed: nobody has staged it yet.
    job_id = job_factory.insert(status="scheduled", run_at=-5.0)

    assert app.get_job(job_id).status is pgqueue.JobStatus.QUEUED
    assert [j.id for j in app.list_jobs(status="queued").jobs] == [job_id]
    assert app.metrics()["default"].queued == 1

    assert [j.job_id for j in app.lease("default", "w1")] == [job_id]
    assert job_factory.row(job_id)["status"] == "running"


# --- dedup ------------------------------------------------------------------------


def test_dedup_returns_the_live_job_and_writes_nothing(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    first = app.enqueue("t", {"v": 1}, dedup_key="k")
    second = app.enqueue("t", {"v": 2}, dedup_key="k", priority=5)

    assert first.created is True
    assert second == pgqueue.Enqueued(first.job_id, False)
    rows = job_factory.conn.execute("SELECT id, payload, priority FROM pgqueue.jobs").fetchall()
    assert rows == [(first.job_id, {"v": 1}, 0)]


@pytest.mark.parametrize("stored_status", ["queued", "scheduled", "running"])
def test_dedup_hits_every_live_status(
    app: pgqueue.App, job_factory: JobFactory, stored_status: str
) -> None:
    run_at = 3600.0 if stored_status == "scheduled" else -1.0
    live = job_factory.insert(status=stored_status, run_at=run_at, dedup_key="k")

    assert app.enqueue("t", dedup_key="k") == pgqueue.Enqueued(live, False)
    count = job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    assert count == (1,)


@pytest.mark.parametrize("final_status", ["succeeded", "dead", "cancelled"])
def test_dedup_key_is_free_again_after_the_job_ends(
    app: pgqueue.App, job_factory: JobFactory, final_status: str
) -> None:
    ended = job_factory.insert(status=final_status, dedup_key="k")

    again = app.enqueue("t", dedup_key="k")

    assert again.created is True
    assert again.job_id != ended
    assert job_factory.row(ended)["status"] == final_status


def test_dedup_key_is_free_after_ack_through_the_api(app: pgqueue.App) -> None:
    first = app.enqueue("t", dedup_key="k")
    (leased,) = app.lease("default", "w1")
    assert app.enqueue("t", dedup_key="k") == pgqueue.Enqueued(first.job_id, False)
    app.ack(leased)

    again = app.enqueue("t", dedup_key="k")
    assert again.created is True
    assert again.job_id > first.job_id


def test_dedup_is_per_queue(app: pgqueue.App) -> None:
    a = app.enqueue("t", dedup_key="k", queue="a")
    b = app.enqueue("t", dedup_key="k", queue="b")
    assert a.created
    assert b.created
    assert a.job_id != b.job_id


def test_enqueue_many_dedups_within_the_batch_and_against_live_jobs(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    live = app.enqueue("t", dedup_key="live").job_id

    results = app.enqueue_many(
        [
            pgqueue.JobSpec("t", {"n": 0}, dedup_key="k1"),
            pgqueue.JobSpec("t", {"n": 1}, dedup_key="k1"),
            pgqueue.JobSpec("t", {"n": 2}),
            pgqueue.JobSpec("t", {"n": 3}, dedup_key="live"),
            pgqueue.JobSpec("t", {"n": 4}, dedup_key="k2"),
            pgqueue.JobSpec("t", {"n": 5}, dedup_key="k1"),
            pgqueue.JobSpec("t", {"n": 6}, dedup_key="k1", queue="other"),
        ]
    )

    created = [r.created for r in results]
    assert created == [True, False, True, False, True, False, True]
    ids = [r.job_id for r in results]
    assert ids[1] == ids[5] == ids[0]
    assert ids[3] == live
    assert len({ids[0], ids[2], ids[4], ids[6], live}) == 5
    rows = job_factory.conn.execute(
        "SELECT id, payload->>'n' FROM pgqueue.jobs WHERE id <> %s ORDER BY id", (live,)
    ).fetchall()
    assert rows == [(ids[0], "0"), (ids[2], "2"), (ids[4], "4"), (ids[6], "6")]


# --- enqueue_many -------------------------------------------------------------------


def test_enqueue_many_returns_ids_in_input_order(app: pgqueue.App, job_factory: JobFactory) -> None:
    specs = [pgqueue.JobSpec("t", {"i": i}, queue=f"q{i % 3}", priority=i % 5) for i in range(50)]
    results = app.enqueue_many(specs)

    assert all(r.created for r in results)
    ids = [r.job_id for r in results]
    assert ids == sorted(ids)
    for spec, job_id in zip(specs, ids, strict=True):
        row = job_factory.row(job_id)
        assert (row["payload"], row["queue"], row["priority"]) == (
            spec.payload,
            spec.queue,
            spec.priority,
        )


def test_enqueue_many_of_nothing_returns_nothing(app: pgqueue.App) -> None:
    assert app.enqueue_many([]) == []


def test_enqueue_many_ten_thousand_jobs(app: pgqueue.App, job_factory: JobFactory) -> None:
    results = app.enqueue_many([pgqueue.JobSpec("bulk", {"i": i}) for i in range(10_000)])

    assert len(results) == 10_000
    assert all(r.created for r in results)
    ids = [r.job_id for r in results]
    assert len(set(ids)) == 10_000
    rows = job_factory.conn.execute(
        "SELECT id, (payload->>'i')::int FROM pgqueue.jobs ORDER BY id"
    ).fetchall()
    assert rows == [(job_id, i) for i, job_id in enumerate(ids)]


def test_enqueue_many_of_one_task_stores_the_shared_options_with_every_job(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    """Jobs that differ only in their payload go through enqueue_payloads
    (0012): every shared option and default lands on every job, in order."""

    @app.task(name="shared", queue="qs", max_attempts=7, lease_seconds=90)
    def shared(**_: Any) -> None: ...

    specs = [
        pgqueue.JobSpec("shared", {"i": i}, priority=4, delay=3600, serial_key="s")
        for i in range(300)
    ]
    specs[5] = specs[5]._replace(payload=None)
    results = app.enqueue_many(specs)

    ids = [r.job_id for r in results]
    assert all(r.created for r in results)
    assert ids == sorted(ids)
    assert len(set(ids)) == 300
    for i, job_id in enumerate(ids):
        row = job_factory.row(job_id)
        assert row["payload"] == ({} if i == 5 else {"i": i})
        assert (row["task"], row["queue"], row["priority"], row["status"]) == (
            "shared", "qs", 4, "scheduled",
        )  # fmt: skip
        assert (row["max_attempts"], row["lease_seconds"], row["serial_key"]) == (7, 90, "s")


def test_enqueue_many_refuses_a_bad_payload_among_shared_options(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    specs = [pgqueue.JobSpec("t", {"i": i}) for i in range(10)]
    specs[7] = pgqueue.JobSpec("t", {"big": "x" * (2 << 20)})
    with pytest.raises(pgqueue.PayloadTooLarge, match="job #7"):
        app.enqueue_many(specs)
    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements sent through the caller's connection."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.statements += 1
        return super().execute(*args, **kwargs)


def test_enqueue_many_is_one_statement(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    specs = [pgqueue.JobSpec("t", {"i": i}, queue=f"q{i % 4}") for i in range(10_000)]
    with psycopg.connect(db_dsn, cursor_factory=CountingCursor) as caller:
        CountingCursor.statements = 0
        results = app.enqueue_many(specs, conn=caller)
        assert CountingCursor.statements == 1
    assert len(results) == 10_000
    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (10_000,)


def test_enqueue_many_is_all_or_nothing_in_the_database(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    # A trigger rejects one row in the middle of the batch, after the earlier rows
    # were inserted by the same statement: none of them may survive.
    job_factory.conn.execute(
        """
        CREATE FUNCTION public.reject_boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.payload ? 'boom' THEN RAISE EXCEPTION 'boom rejected'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER reject_boom BEFORE INSERT ON pgqueue.jobs
            FOR EACH ROW EXECUTE FUNCTION public.reject_boom();
        """
    )
    specs = [pgqueue.JobSpec("t", {"i": i}) for i in range(100)]
    specs.insert(60, pgqueue.JobSpec("t", {"boom": True}))

    with pytest.raises(pgqueue.QueryFailed, match="boom rejected") as caught:
        app.enqueue_many(specs)
    assert (caught.value.sqlstate, caught.value.transient) == ("P0001", False)

    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_enqueue_many_applies_task_defaults_per_spec(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    @app.task(queue="mail", max_attempts=2)
    def send(to: str) -> None: ...

    run_at = datetime.now(UTC) + timedelta(hours=2)
    results = app.enqueue_many(
        [
            pgqueue.JobSpec("send", {"to": "a"}),
            pgqueue.JobSpec("other", {"x": 1}),
            pgqueue.JobSpec("send", {"to": "b"}, queue="q2", run_at=run_at, serial_key="s"),
        ]
    )

    rows = [job_factory.row(r.job_id) for r in results]
    assert [(r["queue"], r["max_attempts"]) for r in rows] == [
        ("mail", 2),
        ("default", 5),
        ("q2", 2),
    ]
    assert rows[2]["run_at"] == run_at
    assert rows[2]["serial_key"] == "s"
    assert app.get_job(results[2].job_id).status is pgqueue.JobStatus.SCHEDULED


# --- async twins ---------------------------------------------------------------------


def test_async_enqueue_twins(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task(queue="mail")
    async def send(to: str) -> None: ...

    async def main() -> list[Any]:
        try:
            one = await app.enqueue_async("t", {"a": 1}, priority=2, dedup_key="k")
            dup = await app.enqueue_async("t", {"a": 2}, dedup_key="k")
            many = await app.enqueue_many_async(
                [pgqueue.JobSpec("t", {"b": 1}), pgqueue.JobSpec("t", {"b": 2})]
            )
            by_task = await send.enqueue_async(to="x")
            with_options = await send.with_options(delay=60).enqueue_async(to="y")
            return [one, dup, many, by_task, with_options]
        finally:
            await app.close_async()

    one, dup, many, by_task, with_options = asyncio.run(main())

    assert one.created
    assert dup == pgqueue.Enqueued(one.job_id, False)
    assert job_factory.row(one.job_id)["priority"] == 2
    assert [job_factory.row(r.job_id)["payload"] for r in many] == [{"b": 1}, {"b": 2}]
    assert job_factory.row(by_task.job_id)["queue"] == "mail"
    assert job_factory.row(by_task.job_id)["payload"] == {"to": "x"}
    assert job_factory.row(with_options.job_id)["status"] == "scheduled"
    count = job_factory.conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    assert count == (5,)
