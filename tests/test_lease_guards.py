"""What the lease may never hand out, through each way ``lease_jobs`` scans a queue.

``lease_jobs`` has three scans, each with its own copy of the checks:

- ``head``: no lease cursor, every queue's ready index from its head (the
  low-level ``app.lease`` and SQL ``lease``);
- ``cursor``: the worker's lease cursor (``p_after``), the rest of the
  cursor's priority after it;
- ``task-limited``: some task has a concurrency or rate limit, so each batch
  is picked, counted per task, then leased.

Every check below runs through all three: a job not yet due, a serial key
whose earlier job is live or running, and the ``counted`` flag that a
concurrency limit counts running jobs by. Each check of each scan is the
only thing that stops the bug it guards against in that scan
(tools/mutations.py removes them one at a time and runs this file).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.fixtures.factory import JobFactory

BRANCHES = ["head", "cursor", "task-limited"]
#: A cursor before every job of priority 0: the cursor scan serves them all.
CURSOR = [0, "1970-01-01T00:00:00+00:00", 0]


class Lease:
    """``lease_jobs`` through one scan, called as the owner (it may pass a clock)."""

    def __init__(self, app: pgqueue.App, dsn: str, branch: str) -> None:
        self.dsn = dsn
        self.branch = branch
        self.attempts: dict[int, int] = {}  # job id -> attempt id of its lease
        if branch == "task-limited":
            # A limit on a task nobody enqueues: every lease takes the limited scan.
            app.set_task_limit("elsewhere", concurrency=100)

    def __call__(self, queue: str = "default", now: datetime | None = None) -> list[int]:
        after = json.dumps({queue: CURSOR}) if self.branch == "cursor" else None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT job_id, attempt_id, ordered FROM pgqueue.lease_jobs("
                " ARRAY[%s], 'guard-worker', 10, NULL, %s, %s::jsonb)",
                (queue, now, after),
            ).fetchall()
        # ordered: true from the plain scans, false from the limited one (a check
        # that the branch asked for is the one that ran).
        assert {ordered for _, _, ordered in rows} <= {self.branch != "task-limited"}
        self.attempts.update({job_id: attempt_id for job_id, attempt_id, _ in rows})
        return sorted(job_id for job_id, _, _ in rows)

    def ack(self, job_id: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            done = conn.execute(
                "SELECT job_id FROM pgqueue.ack_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[],"
                " ARRAY[NULL]::jsonb[])",
                (job_id, self.attempts[job_id]),
            ).fetchall()
        assert done == [(job_id,)]


@pytest.fixture(params=BRANCHES)
def lease(request: pytest.FixtureRequest, app: pgqueue.App, db_dsn: str) -> Lease:
    return Lease(app, db_dsn, request.param)


def status(job_factory: JobFactory, job_id: int) -> Any:
    return job_factory.row(job_id)["status"]


# --- run_at ----------------------------------------------------------------------------


def test_a_job_due_in_an_hour_is_not_leased(
    app: pgqueue.App, lease: Lease, job_factory: JobFactory
) -> None:
    due = app.enqueue("t", {"n": 1}).job_id
    later = app.enqueue("t", {"n": 2}, delay=3600).job_id
    assert status(job_factory, later) == "scheduled"

    assert lease() == [due]
    assert status(job_factory, later) == "scheduled"  # not staged either
    assert lease() == []
    assert status(job_factory, later) == "scheduled"


def test_a_queued_job_after_the_lease_clock_is_not_leased(
    app: pgqueue.App, lease: Lease, job_factory: JobFactory
) -> None:
    """Each scan checks run_at itself, not only the staging of scheduled
    jobs: with a clock an hour back, a job queued a minute ago is not due."""
    now = job_factory.db_now()
    early = app.enqueue("t", {"n": 1}, run_at=now - timedelta(hours=2)).job_id
    recent = app.enqueue("t", {"n": 2}, run_at=now - timedelta(minutes=1)).job_id
    assert status(job_factory, recent) == "queued"

    assert lease(now=now - timedelta(hours=1)) == [early]
    assert status(job_factory, recent) == "queued"
    assert lease(now=now - timedelta(hours=1)) == []
    assert lease() == [recent]


# --- serial keys -------------------------------------------------------------------------


def test_serial_jobs_of_concurrent_producers_run_one_at_a_time(
    app: pgqueue.App, db_dsn: str, lease: Lease, job_factory: JobFactory
) -> None:
    """Two producers enqueue the same serial key at once: neither sees the
    other's job, so neither is held back when stored (serial_held is a hint).
    The lease's own check must still let only the earlier one run."""
    free = app.enqueue("t", {"n": 3}).job_id  # (the queue's row exists: no lock on it)
    with psycopg.connect(db_dsn) as one, psycopg.connect(db_dsn) as two:
        two.execute("SET lock_timeout = '10s'")
        first = app.enqueue("t", {"n": 1}, serial_key="k", conn=one).job_id
        second = app.enqueue("t", {"n": 2}, serial_key="k", conn=two).job_id
        one.commit()
        two.commit()
    held = [job_factory.row(j)["serial_held"] for j in (first, second)]
    assert held == [False, False]  # the case under test: no hint holds the second back

    assert lease() == sorted([first, free])
    assert lease() == []  # the earlier job runs: the later waits
    lease.ack(first)
    assert lease() == [second]


def test_a_running_serial_job_blocks_an_earlier_requeued_one(
    app: pgqueue.App, lease: Lease, job_factory: JobFactory
) -> None:
    earlier = job_factory.insert(task="t", status="dead", serial_key="k")
    job_factory.insert(task="t", status="running", serial_key="k")  # later id, running
    app.requeue_dead(earlier)
    assert job_factory.row(earlier)["serial_held"] is False  # first of its key by id

    assert lease() == []
    assert status(job_factory, earlier) == "queued"


# --- the counted flag of concurrency limits -------------------------------------------------


def test_a_queue_limit_counts_the_jobs_it_leased(
    app: pgqueue.App, lease: Lease, job_factory: JobFactory
) -> None:
    app.set_queue_limit("default", concurrency=1)
    ids = [app.enqueue("t", {"n": n}).job_id for n in range(3)]

    (first,) = lease()
    assert job_factory.row(first)["counted"] is True
    assert lease() == []  # the running job fills the limit
    lease.ack(first)
    (second,) = lease()
    assert second in ids
    assert second != first
    assert lease() == []


def test_a_task_limit_counts_the_jobs_it_leased(
    app: pgqueue.App, db_dsn: str, job_factory: JobFactory
) -> None:
    lease = Lease(app, db_dsn, "task-limited")
    app.set_task_limit("t", concurrency=1)
    ids = [app.enqueue("t", {"n": n}).job_id for n in range(3)]
    other = app.enqueue("u").job_id

    got = lease()
    assert len(got) == 2
    assert other in got
    (first,) = set(got) - {other}
    assert job_factory.row(first)["counted"] is True
    assert lease() == []  # the running job of t fills its limit
    lease.ack(first)
    (second,) = lease()
    assert second in ids
    assert second != first
    assert lease() == []
