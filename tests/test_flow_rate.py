"""Rate limits with real worker processes: no more than N
leases start in any window of the limit's period, across all workers.

The lease start times are read back from the database (each attempt's
``started_at``: the jobs row holds the current one, ``job_attempts`` the
earlier ones), all on the server's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import pgqueue
from pgqueue import JobSpec, JobStatus
from tests.apps.flow import build_app
from tests.cli_support import run_json
from tests.fixtures.workers import Workers
from tests.flow_support import attempt_rows, max_in_window, race_leases, spawn_flow_workers

QUEUE = "throttled"


@pytest.fixture
def flow_app(db_dsn: str) -> Iterator[pgqueue.App]:
    """An App with the tasks of :mod:`tests.apps.flow` registered."""
    with build_app(db_dsn) as built:
        yield built


def test_max_in_window_counts_half_open_windows() -> None:
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    second = timedelta(seconds=1)
    assert max_in_window([], second) == 0
    assert max_in_window([t0, t0, t0], second) == 3
    # [t, t + 1s) does not hold t + 1s.
    assert max_in_window([t0, t0 + second], second) == 1
    assert max_in_window([t0, t0 + second / 2, t0 + second, t0 + 1.4 * second], second) == 3


@pytest.mark.slow
def test_at_most_10_leases_start_in_any_1_second_window_across_three_workers(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str
) -> None:
    spawn_flow_workers(workers, 3, "--concurrency", "5", "--poll-interval", "0.2s")
    flow_app.set_queue_limit(QUEUE, rate="10/1s")
    assert flow_app.metrics(QUEUE)[QUEUE].rate_limit == "10/1s"

    ids = [
        e.job_id
        for e in flow_app.enqueue_many(
            [JobSpec("flow_tick", {"n": n}, queue=QUEUE) for n in range(50)]
        )
    ]
    jobs = workers.wait_finished(flow_app, ids, timeout=120)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    starts: list[datetime] = []
    for job in jobs.values():
        assert job.attempt_history is not None
        starts.extend(attempt.started_at for attempt in job.attempt_history)
    # The same starts as stored rows, job_attempts included.
    assert sorted(starts) == [row["started_at"] for row in attempt_rows(db_dsn, QUEUE)]
    assert len(starts) == 50

    # At most 10 per window, and the limiter was reached (10 did start together).
    assert max_in_window(starts, timedelta(seconds=1)) == 10
    # A consequence, not a speed check: with at most 10 per second, the 41st
    # lease starts at least 4 s after the first.
    ordered = sorted(starts)
    assert ordered[40] - ordered[0] >= timedelta(seconds=4)


def test_explain_names_the_rate_limit_and_its_next_slot(flow_app: pgqueue.App, db_dsn: str) -> None:
    flow_app.set_queue_limit(QUEUE, rate="2/1m")
    ids = [flow_app.enqueue("flow_tick", {"n": n}, queue=QUEUE).job_id for n in range(3)]

    leased = flow_app.lease(QUEUE, "test-worker", max=3)

    assert [j.job_id for j in leased] == ids[:2]
    assert flow_app.lease(QUEUE, "test-worker", max=3) == []
    history = flow_app.get_job(ids[0], history=True).attempt_history
    assert history is not None
    next_slot = (history[0].started_at + timedelta(minutes=1)).astimezone(UTC)
    explanation = flow_app.explain(ids[2])
    assert "rate limit:" in explanation, explanation
    assert "2/2" in explanation, explanation
    assert f"next slot at {next_slot:%Y-%m-%d %H:%M:%S}" in explanation, explanation
    # The installed console script says the same.
    assert run_json(db_dsn, "jobs", "explain", str(ids[2]))["explanation"] == explanation
    metrics = flow_app.metrics(QUEUE)[QUEUE]
    assert (metrics.rate_limit, metrics.concurrency_limit) == ("2/1m", None)


def test_racing_lease_calls_never_exceed_the_rate(flow_app: pgqueue.App, db_dsn: str) -> None:
    flow_app.set_queue_limit(QUEUE, rate="5/1m")
    flow_app.enqueue_many([JobSpec("flow_tick", {"n": n}, queue=QUEUE) for n in range(20)])

    leased = race_leases(flow_app, QUEUE)
    assert len(leased) == 5
    flow_app.ack_many(leased)  # finishing frees no rate slot: the window counts lease starts
    assert race_leases(flow_app, QUEUE) == []
    assert len(attempt_rows(db_dsn, QUEUE)) == 5
