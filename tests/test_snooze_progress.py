"""pgqueue.Snooze (queued again, no attempt spent, recorded as snoozed) and
context.set_progress (stored on the job, throttled, last value kept), run by a
real worker."""

from __future__ import annotations

import threading

import psycopg
import pytest

import pgqueue
from pgqueue import JobContext
from tests.inprocess_worker import finished, quiet_structlog, run_until

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


def test_a_snoozed_job_runs_again_without_spending_attempts(app: pgqueue.App) -> None:
    runs: list[int] = []

    @app.task(name="wait_for_file", max_attempts=1, pass_context=True)
    def wait_for_file(context: JobContext) -> str:
        runs.append(context.attempt)
        if len(runs) <= 3:
            raise pgqueue.Snooze(0.05)
        return "found"

    job_id = app.enqueue("wait_for_file").job_id
    run_until(app, finished(app, job_id))

    job = app.get_job(job_id, history=True)
    assert job.status is pgqueue.JobStatus.SUCCEEDED
    assert job.result == "found"
    assert (job.attempts, job.snoozes) == (1, 3)  # max_attempts=1 and still it ran 4 times
    assert runs == [1, 1, 1, 1]
    assert job.attempt_history is not None
    outcomes = [a.outcome.value for a in job.attempt_history]
    assert outcomes == ["snoozed", "snoozed", "snoozed", "succeeded"]
    assert job.last_error is None
    assert "(and 3 snoozes)" in app.explain(job_id)


def test_a_job_snoozed_a_thousand_times_keeps_its_backoff(app: pgqueue.App, db_dsn: str) -> None:
    job_id = app.enqueue("t", max_attempts=3).job_id
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for _ in range(1000):
            leased = conn.execute(
                "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(NULL, 'w', 1)"
            ).fetchone()
            assert leased is not None
            assert leased[0] == job_id
            conn.execute(
                "SELECT * FROM pgqueue.fail_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[],"
                " ARRAY['snoozed'], ARRAY[NULL]::timestamptz[], ARRAY[0]::float8[],"
                " ARRAY[false], ARRAY['snoozed'], ARRAY['not now'], ARRAY[NULL])",
                (leased[0], leased[1]),
            )
        # Now a real failure: the first retry's delay (1 s +/- 10 %), not 2**1000 s.
        leased = conn.execute(
            "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(NULL, 'w', 1)"
        ).fetchone()
        assert leased is not None
        assert leased[0] == job_id
        conn.execute(
            "SELECT * FROM pgqueue.fail_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[],"
            " ARRAY['failed'], ARRAY[NULL]::timestamptz[], ARRAY[NULL]::float8[],"
            " ARRAY[false], ARRAY['ValueError'], ARRAY['boom'], ARRAY[NULL])",
            (leased[0], leased[1]),
        )
    job = app.get_job(job_id, history=True)
    assert (job.status, job.attempts, job.snoozes) == (pgqueue.JobStatus.SCHEDULED, 1, 1000)
    assert job.attempt_history is not None
    assert len(job.attempt_history) == 1001
    # Retried at the failure's time + the first attempt's delay (1 s +/- 10 %),
    # both from the database's clock.
    failed_at = job.attempt_history[-1].finished_at
    assert failed_at is not None
    assert 0.9 <= (job.run_at - failed_at).total_seconds() <= 1.1


def test_snooze_delay_is_validated() -> None:
    with pytest.raises(pgqueue.InvalidDuration):
        pgqueue.Snooze(-1)
    assert pgqueue.Snooze("5m").delay == 300


def test_progress_is_stored_while_running_and_its_last_value_at_the_end(
    app: pgqueue.App,
) -> None:
    release = threading.Event()

    @app.task(name="long", pass_context=True)
    def long(context: JobContext) -> None:
        context.set_progress({"done": 5, "of": 100})
        release.wait(30)
        for n in range(6, 101):
            context.set_progress(n)  # many calls, few writes

    job_id = app.enqueue("long").job_id
    seen: list[object] = []

    def progress_then_done() -> bool:
        job = app.get_job(job_id)
        if job.progress is not None and not seen:
            seen.append(job.progress)
            release.set()
        return job.status is pgqueue.JobStatus.SUCCEEDED

    run_until(app, progress_then_done)

    assert seen == [{"done": 5, "of": 100}]
    assert app.get_job(job_id).progress == 100


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("half", "progress must be a number or a JSON object"),
        (True, "progress must be a number or a JSON object"),
        (float("nan"), "finite"),
        ({"x": "y" * 5000}, "4096-byte limit"),
    ],
)
def test_bad_progress_values_are_refused(value: object, message: str) -> None:
    context = JobContext(1, 1, 1, "default", "t")
    with pytest.raises(pgqueue.InvalidOption, match=message):
        context.set_progress(value)  # type: ignore[arg-type]
    assert context.progress is None
