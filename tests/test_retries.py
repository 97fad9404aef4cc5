"""fail(): retries with backoff or at a given time, dead letters, and the reaper."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

import pgqueue
from tests.fixtures.dbstate import snapshot
from tests.fixtures.factory import JobFactory

# Float rounding between Python, real columns and interval microseconds.
SLACK = 0.001


T = TypeVar("T")


def timed(job_factory: JobFactory, call: Callable[[], T]) -> tuple[datetime, T, datetime]:
    """The database clock just before and just after ``call``, and its result:
    whatever time the call took as "now" lies between the two."""
    before = job_factory.db_now()
    result = call()
    return before, result, job_factory.db_now()


def assert_retry_delay_within(
    job_factory: JobFactory,
    job_id: int,
    window: tuple[datetime, datetime],
    bounds: tuple[float, float],
) -> None:
    """The job's new run_at is the failure time (inside ``window``) plus a
    delay inside ``bounds`` (seconds)."""
    low, high = bounds
    run_at: datetime = job_factory.row(job_id)["run_at"]
    earliest = window[0] + timedelta(seconds=low - SLACK)
    latest = window[1] + timedelta(seconds=high + SLACK)
    assert earliest <= run_at <= latest, (earliest, run_at, latest)


def delay_after_failure(job_factory: JobFactory, job_id: int) -> float:
    """Seconds between the failed attempt's recorded end and the run_at it was given."""
    row = job_factory.conn.execute(
        "SELECT j.run_at - a.finished_at FROM pgqueue.jobs j"
        " JOIN pgqueue.job_attempts a ON a.job_id = j.id WHERE j.id = %s"
        " ORDER BY a.id DESC LIMIT 1",
        (job_id,),
    ).fetchone()
    assert row is not None
    delay: timedelta = row[0]
    return delay.total_seconds()


# --- Backoff itself -------------------------------------------------------------------


def test_backoff_bounds_follow_the_formula() -> None:
    backoff = pgqueue.Backoff(base=2.0, factor=3.0, max=100.0, jitter=0.25)
    assert backoff.bounds(1) == pytest.approx((1.5, 2.5))
    assert backoff.bounds(2) == pytest.approx((4.5, 7.5))
    assert backoff.bounds(3) == pytest.approx((13.5, 22.5))
    assert backoff.bounds(4) == pytest.approx((40.5, 67.5))
    assert backoff.bounds(5) == pytest.approx((75.0, 125.0))  # capped at max before jitter
    assert backoff.bounds(50) == pytest.approx((75.0, 125.0))


def test_default_backoff_matches_design() -> None:
    backoff = pgqueue.Backoff()
    assert (backoff.base, backoff.factor, backoff.max, backoff.jitter) == (1.0, 2.0, 3600.0, 0.1)
    assert backoff.bounds(1) == pytest.approx((0.9, 1.1))
    assert backoff.bounds(13) == pytest.approx((3240.0, 3960.0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1.0},
        {"max": -1.0},
        {"factor": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.5},
        # Values the database refuses (migration 0005): refused before they get there.
        {"base": 1e30},
        {"max": 1e38},
        {"factor": 1e6},
        {"base": float("nan")},
        {"jitter": float("nan")},
    ],
)
def test_backoff_rejects_impossible_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(pgqueue.InvalidOption):
        pgqueue.Backoff(**kwargs)


# --- retries --------------------------------------------------------------------------


def test_fail_retries_with_the_task_backoff_within_bounds(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    backoff = pgqueue.Backoff(base=10.0, factor=3.0, max=200.0, jitter=0.2)

    @app.task(max_attempts=7, retry=backoff)
    def flaky() -> None: ...

    job_id = flaky.enqueue().job_id
    for attempt in range(1, 7):
        job_factory.make_due(job_id)
        (leased,) = app.lease("default", "w1")
        assert leased.attempt == attempt

        error = RuntimeError(f"failure {attempt}")
        before, status, after = timed(job_factory, lambda: app.fail(leased, error))  # noqa: B023

        assert status is pgqueue.JobStatus.SCHEDULED
        assert_retry_delay_within(job_factory, job_id, (before, after), backoff.bounds(attempt))
        row = job_factory.row(job_id)
        assert row["status"] == "scheduled"
        assert row["attempts"] == attempt
        assert row["finished_at"] is None
        assert row["last_error"] is not None
        assert f"failure {attempt}" in row["last_error"]
        assert app.get_job(job_id).status is pgqueue.JobStatus.SCHEDULED
        assert app.lease("default", "w1") == []


def test_unregistered_task_retries_with_the_default_backoff(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("unknown.elsewhere").job_id
    for attempt in range(1, 4):
        job_factory.make_due(job_id)
        (leased,) = app.lease("default", "w1")
        before, _, after = timed(job_factory, lambda: app.fail(leased, "boom"))  # noqa: B023
        bounds = pgqueue.Backoff().bounds(attempt)
        assert_retry_delay_within(job_factory, job_id, (before, after), bounds)


def test_backoff_delays_are_jittered(app: pgqueue.App, job_factory: JobFactory) -> None:
    # Twenty first failures with 50% jitter: all within bounds, not all equal.
    backoff = pgqueue.Backoff(base=100.0, factor=2.0, max=1000.0, jitter=0.5)

    @app.task(retry=backoff)
    def jittery(i: int) -> None: ...

    ids = [jittery.enqueue(i=i).job_id for i in range(20)]
    leased = app.lease("default", "w1", max=20)
    before = job_factory.db_now()
    for job in leased:
        app.fail(job, "boom")
    after = job_factory.db_now()

    for job_id in ids:
        assert_retry_delay_within(job_factory, job_id, (before, after), (50.0, 150.0))
    delays = [delay_after_failure(job_factory, job_id) for job_id in ids]
    assert len({round(d, 3) for d in delays}) > 1


def test_zero_backoff_requeues_at_once(app: pgqueue.App, job_factory: JobFactory) -> None:
    @app.task(retry=pgqueue.Backoff(base=0.0, jitter=0.0))
    def eager() -> None: ...

    job_id = eager.enqueue().job_id
    (leased,) = app.lease("default", "w1")
    assert app.fail(leased, "boom") is pgqueue.JobStatus.QUEUED
    (again,) = app.lease("default", "w1")
    assert (again.job_id, again.attempt) == (job_id, 2)


def test_fail_with_retry_at_uses_that_time(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")
    retry_at = datetime.now(UTC) + timedelta(hours=3)

    assert app.fail(leased, "later", retry_at=retry_at) is pgqueue.JobStatus.SCHEDULED

    assert job_factory.row(job_id)["run_at"] == retry_at


def test_fail_with_retry_at_in_the_past_is_ready_now(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t").job_id
    (leased,) = app.lease("default", "w1")

    status = app.fail(leased, "now", retry_at=datetime.now(UTC) - timedelta(minutes=1))

    assert status is pgqueue.JobStatus.QUEUED
    assert job_factory.row(job_id)["status"] == "queued"
    assert [j.job_id for j in app.lease("default", "w1")] == [job_id]


# --- dead letters -------------------------------------------------------------------------


def test_job_is_dead_when_its_attempts_are_exhausted(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t", max_attempts=3).job_id
    statuses = []
    for _ in range(3):
        job_factory.make_due(job_id)
        (leased,) = app.lease("default", "w1")
        statuses.append(app.fail(leased, ValueError("still broken")))

    assert statuses == [
        pgqueue.JobStatus.SCHEDULED,
        pgqueue.JobStatus.SCHEDULED,
        pgqueue.JobStatus.DEAD,
    ]
    row = job_factory.row(job_id)
    assert row["status"] == "dead"
    assert row["attempts"] == 3
    assert row["finished_at"] is not None
    assert "still broken" in row["last_error"]
    job = app.get_job(job_id, history=True)
    assert job.status is pgqueue.JobStatus.DEAD
    assert job.last_error is not None
    assert "still broken" in job.last_error
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [pgqueue.AttemptOutcome.FAILED] * 3
    job_factory.make_due(job_id)
    assert app.lease("default", "w1") == []


def test_permanent_failure_is_dead_at_once(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = app.enqueue("t", max_attempts=5).job_id
    (leased,) = app.lease("default", "w1")

    assert app.fail(leased, "bad data", permanent=True) is pgqueue.JobStatus.DEAD

    row = job_factory.row(job_id)
    assert (row["status"], row["attempts"]) == ("dead", 1)
    assert "bad data" in row["last_error"]
    assert app.lease("default", "w1") == []


def test_retry_at_does_not_save_a_job_out_of_attempts(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = app.enqueue("t", max_attempts=1).job_id
    (leased,) = app.lease("default", "w1")
    status = app.fail(leased, "x", retry_at=datetime.now(UTC) + timedelta(seconds=5))
    assert status is pgqueue.JobStatus.DEAD
    assert job_factory.row(job_id)["status"] == "dead"


# --- reaper ---------------------------------------------------------------------------------


def test_reaper_counts_an_expired_lease_as_a_failed_attempt(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    backoff = pgqueue.Backoff(base=30.0, factor=2.0, max=600.0, jitter=0.1)

    @app.task(retry=backoff)
    def slow() -> None: ...

    job_id = slow.enqueue().job_id
    (leased,) = app.lease("default", "lost-worker")
    job_factory.expire_lease(job_id)

    before, reaped, after = timed(job_factory, app.reap)

    assert reaped == 1
    row = job_factory.row(job_id)
    assert row["status"] == "scheduled"
    assert row["attempts"] == 1
    assert row["lease_expires_at"] is None
    assert_retry_delay_within(job_factory, job_id, (before, after), backoff.bounds(1))
    history = app.get_job(job_id, history=True).attempt_history
    assert history is not None
    (expired,) = history
    assert expired.outcome is pgqueue.AttemptOutcome.LEASE_EXPIRED
    assert expired.attempt_id == leased.attempt_id
    assert expired.worker_id == "lost-worker"
    assert expired.finished_at is not None
    assert app.reap() == 0


def test_reaper_dead_letters_a_job_out_of_attempts(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    job_id = job_factory.insert(
        status="running", attempts=3, max_attempts=3, lease_expires_at=-10.0
    )

    assert app.reap() == 1

    row = job_factory.row(job_id)
    assert (row["status"], row["attempts"]) == ("dead", 3)
    assert row["finished_at"] is not None


def test_reaper_leaves_valid_leases_alone(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    app.enqueue("t")
    app.lease("default", "w1")
    job_factory.insert(status="running", lease_expires_at=30.0)
    before = snapshot(db_dsn)

    assert app.reap() == 0
    assert snapshot(db_dsn) == before


def test_reaper_reclaims_many_expired_jobs(app: pgqueue.App, job_factory: JobFactory) -> None:
    ids = [job_factory.insert(status="running", lease_expires_at=-5.0) for _ in range(30)]
    assert app.reap() == 30
    statuses = job_factory.conn.execute(
        "SELECT DISTINCT status::text FROM pgqueue.jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert statuses == [("scheduled",)]


# --- many attempts ----------------------------------------------------------------------------

# The default Backoff after its cap: 3600 s +/- 10%.
CAPPED = (3600.0 * 0.9, 3600.0 * 1.1)


def test_backoff_bounds_stay_capped_after_many_attempts() -> None:
    assert pgqueue.Backoff().bounds(5000) == pytest.approx(CAPPED)


def test_fail_after_many_attempts_retries_at_the_capped_delay(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    # "Retry for weeks": a huge max_attempts with the default, capped backoff.
    job_id = job_factory.insert(status="queued", attempts=1999, max_attempts=1_000_000)
    (leased,) = app.lease("default", "w1")
    assert leased.attempt == 2000

    before, status, after = timed(job_factory, lambda: app.fail(leased, "still down"))

    assert status is pgqueue.JobStatus.SCHEDULED
    assert_retry_delay_within(job_factory, job_id, (before, after), CAPPED)


def test_reaper_handles_a_job_with_many_attempts(app: pgqueue.App, job_factory: JobFactory) -> None:
    many = job_factory.insert(
        status="running", attempts=2000, max_attempts=1_000_000, lease_expires_at=-5.0
    )
    few = job_factory.insert(status="running", attempts=1, lease_expires_at=-5.0)

    assert app.reap() == 2

    assert job_factory.row(many)["status"] == "scheduled"
    assert job_factory.row(few)["status"] == "scheduled"
