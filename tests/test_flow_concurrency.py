"""Global concurrency limits with real worker processes:
at most N jobs of a queue run at once across all workers, and a slot frees as
soon as a job ends or its lease expires.

The database is sampled while the workers run, and the tasks record their own
start and end (``clock_timestamp()``), so the limit is checked three ways: the
running count polled every 20 ms, the overlap of the tasks' recorded
intervals, and the overlap of the attempts' stored lease intervals.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import pgqueue
from pgqueue import JobSpec, JobStatus
from tests.apps.flow import build_app
from tests.cli_support import run_json
from tests.fixtures.workers import Workers, task_events
from tests.flow_support import (
    FLOW_APP,
    LONG_POLL,
    PROMPT,
    RunningSampler,
    attempt_rows,
    gate,
    max_overlap,
    race_leases,
    running_count,
    sample_for,
    scalar,
    spawn_flow_workers,
    started_jobs,
    wait_started,
)

QUEUE = "limited"
LEASE_CLOCK_SLACK = timedelta(milliseconds=10)


@pytest.fixture
def flow_app(db_dsn: str) -> Iterator[pgqueue.App]:
    """An App with the tasks of :mod:`tests.apps.flow` registered."""
    with build_app(db_dsn) as built:
        yield built


@pytest.mark.slow
def test_three_workers_never_run_more_than_the_limit_of_two(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str
) -> None:
    # Short polls: the three workers try to lease often, racing for the slots.
    spawn_flow_workers(workers, 3, "--concurrency", "5", "--poll-interval", "0.1s")
    flow_app.set_queue_limit(QUEUE, concurrency=2)

    with RunningSampler(db_dsn, QUEUE, interval=0.02) as sampler:
        ids = [
            e.job_id
            for e in flow_app.enqueue_many(
                [JobSpec("flow_sleep", {"seconds": 0.3}, queue=QUEUE) for _ in range(30)]
            )
        ]
        jobs = workers.wait_finished(flow_app, ids, timeout=120)

    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    assert {job.attempts for job in jobs.values()} == {1}

    # 1. The running count, sampled from the database while the workers ran.
    assert len(sampler.samples) > 50, "the sampler barely ran"
    assert sampler.maximum <= 2, f"sampled running counts: {sorted(set(sampler.samples))}"

    # 2. What the tasks recorded: their [start, end) intervals, on the database clock.
    events = task_events(db_dsn)
    starts = {e["job_id"]: e["at"] for e in events if e["kind"] == "start"}
    ends = {e["job_id"]: e["at"] for e in events if e["kind"] == "end"}
    assert set(starts) == set(ends) == set(ids)
    assert max_overlap((starts[i], ends[i]) for i in ids) <= 2

    # 3. The leases as stored: from lease start to finish, at most 2 at any instant,
    # and the limit was reached (two jobs did run side by side). A lease's start
    # is read from the clock just before the count that saw a slot free, so it
    # may precede the finish it followed by a hair: allow LEASE_CLOCK_SLACK
    # (a real excess would overlap for a whole 0.3 s job).
    attempts = attempt_rows(db_dsn, QUEUE)
    assert len(attempts) == 30
    leases = [(a["started_at"] + LEASE_CLOCK_SLACK, a["finished_at"]) for a in attempts]
    assert max_overlap(leases) == 2


@pytest.mark.slow
def test_lifting_the_limit_lets_more_run_and_explain_names_the_limit(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    # Long polls: only notifications wake these workers promptly.
    spawn_flow_workers(workers, 3, "--concurrency", "5", "--poll-interval", LONG_POLL)
    flow_app.set_queue_limit(QUEUE, concurrency=2)
    release = gate(tmp_path, "release")
    ids = [
        e.job_id
        for e in flow_app.enqueue_many(
            [JobSpec("flow_hold", release.payload, queue=QUEUE) for _ in range(8)]
        )
    ]
    running = wait_started(workers, ids, count=2)

    # Two run; the others wait, and keep waiting while every worker has room.
    assert max(sample_for(db_dsn, QUEUE, 1.0)) == 2
    assert started_jobs(db_dsn, ids) == running
    waiting = min(set(ids) - running)
    assert flow_app.get_job(waiting).status is JobStatus.QUEUED
    explanation = flow_app.explain(waiting)
    assert "queue at its concurrency limit 2/2" in explanation, explanation
    metrics = flow_app.metrics(QUEUE)[QUEUE]
    assert (metrics.concurrency_limit, metrics.running, metrics.queued) == (2, 2, 6)

    # Lifted through the installed console script: every worker is told.
    settings = run_json(db_dsn, "queue", "limit", QUEUE, "--clear")
    assert settings == {
        "queue": QUEUE,
        "paused": False,
        "concurrency_limit": None,
        "rate_limit": None,
    }
    wait_started(workers, ids, timeout=PROMPT)
    assert running_count(db_dsn, QUEUE) == 8

    release.open()
    jobs = workers.wait_finished(flow_app, ids)
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}


@pytest.mark.slow
@pytest.mark.parametrize(
    "poll",
    [
        pytest.param("0.5s", id="short-poll"),
        pytest.param(LONG_POLL, id="long-poll"),
    ],
)
def test_a_slot_frees_as_soon_as_a_job_ends(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path, poll: str
) -> None:
    """Limit 1: the waiting job starts once the running one ends, never before.

    With long polls, only a wake-up on the job's end (a notification, or the
    worker that finished it leasing again) can start the next job promptly;
    polling is only the fallback for lost notifications, not the way work
    moves on.
    """
    spawn_flow_workers(workers, 3, "--concurrency", "5", "--poll-interval", poll)
    flow_app.set_queue_limit(QUEUE, concurrency=1)
    first_gate, second_gate = gate(tmp_path, "first"), gate(tmp_path, "second")
    first = flow_app.enqueue("flow_hold", first_gate.payload, queue=QUEUE).job_id
    wait_started(workers, [first])
    second = flow_app.enqueue("flow_hold", second_gate.payload, queue=QUEUE).job_id
    assert max(sample_for(db_dsn, QUEUE, 0.5)) == 1
    assert flow_app.get_job(second).status is JobStatus.QUEUED

    first_gate.open()
    workers.wait_statuses([first], ["succeeded"])
    wait_started(workers, [second], timeout=PROMPT)

    # As the tasks recorded it: the second began after the first had ended.
    [first_end] = [e["at"] for e in task_events(db_dsn, "end") if e["job_id"] == first]
    [second_start] = [e["at"] for e in task_events(db_dsn, "start") if e["job_id"] == second]
    assert second_start > first_end
    second_gate.open()
    workers.wait_statuses([second], ["succeeded"])


@pytest.mark.slow
def test_a_slot_frees_when_the_lease_of_a_killed_worker_expires(
    workers: Workers, flow_app: pgqueue.App, db_dsn: str, tmp_path: Path
) -> None:
    # The reaper runs rarely here: the slot must free by lease expiry alone.
    no_reaping = ("--no-scheduler", "--poll-interval", "0.2s", "--reap-interval", "600s")
    doomed = workers.spawn(*no_reaping, app=FLOW_APP)
    doomed.wait_registered()
    flow_app.set_queue_limit(QUEUE, concurrency=1)
    hung = flow_app.enqueue("flow_hang", queue=QUEUE).job_id  # lease_seconds=2
    wait_started(workers, [hung])
    survivor = workers.spawn(*no_reaping, app=FLOW_APP)
    survivor.wait_registered()
    after = gate(tmp_path, "after")
    waiting = flow_app.enqueue("flow_hold", after.payload, queue=QUEUE).job_id
    assert max(sample_for(db_dsn, QUEUE, 0.5)) == 1
    assert started_jobs(db_dsn, [waiting]) == set()

    doomed.send(signal.SIGKILL)
    doomed.wait_exit()

    wait_started(workers, [waiting], timeout=PROMPT)
    # The dead worker's lease as it was last extended (nobody touches it since):
    # the lease statement counts leases that expire after its own start time.
    expired_at = scalar(db_dsn, "SELECT lease_expires_at FROM pgqueue.jobs WHERE id = %s", (hung,))
    began = scalar(db_dsn, "SELECT attempt_started_at FROM pgqueue.jobs WHERE id = %s", (waiting,))
    assert began >= expired_at
    # Not reaped in between: the expired lease alone stopped counting.
    hung_job = flow_app.get_job(hung, history=True)
    assert hung_job.status is JobStatus.RUNNING
    assert hung_job.attempts == 1
    assert not [e for e in task_events(db_dsn, "start") if e["job_id"] == hung][1:]

    after.open()
    workers.wait_statuses([waiting], ["succeeded"], require_alive=[survivor])


# --- the lease statement itself, raced by threads (no worker processes) ----------


def test_racing_lease_calls_never_exceed_the_limit(flow_app: pgqueue.App, db_dsn: str) -> None:
    flow_app.set_queue_limit(QUEUE, concurrency=3)
    flow_app.enqueue_many([JobSpec("flow_tick", {"n": n}, queue=QUEUE) for n in range(40)])

    held = race_leases(flow_app, QUEUE)
    assert len(held) == 3
    for _ in range(5):
        flow_app.ack(held.pop(0))  # one slot frees, and only one
        held.extend(race_leases(flow_app, QUEUE))
        assert len(held) == 3
        assert running_count(db_dsn, QUEUE) == 3


def test_lowering_the_limit_below_the_running_count_stops_leases_until_it_drains(
    flow_app: pgqueue.App, db_dsn: str
) -> None:
    flow_app.set_queue_limit(QUEUE, concurrency=3)
    flow_app.enqueue_many([JobSpec("flow_tick", {"n": n}, queue=QUEUE) for n in range(6)])
    held = flow_app.lease(QUEUE, "w", max=10)
    assert len(held) == 3

    flow_app.set_queue_limit(QUEUE, concurrency=1)
    flow_app.ack(held.pop())
    assert flow_app.lease(QUEUE, "w", max=10) == []  # 2 running, limit 1
    flow_app.ack(held.pop())
    assert flow_app.lease(QUEUE, "w", max=10) == []  # 1 running, limit 1
    flow_app.ack(held.pop())
    assert len(flow_app.lease(QUEUE, "w", max=10)) == 1
    assert running_count(db_dsn, QUEUE) == 1


def test_concurrency_rate_and_pause_together(flow_app: pgqueue.App) -> None:
    flow_app.set_queue_limit(QUEUE, concurrency=2, rate="3/1m")
    ids = [flow_app.enqueue("flow_tick", {"n": n}, queue=QUEUE).job_id for n in range(5)]

    first = flow_app.lease(QUEUE, "w", max=10)
    assert [j.job_id for j in first] == ids[:2]  # the concurrency limit
    assert flow_app.lease(QUEUE, "w", max=10) == []
    flow_app.ack(first[0])
    flow_app.pause_queue(QUEUE)
    assert flow_app.lease(QUEUE, "w", max=10) == []  # a free slot, but paused
    flow_app.resume_queue(QUEUE)
    third = flow_app.lease(QUEUE, "w", max=10)
    assert [j.job_id for j in third] == [ids[2]]
    flow_app.ack(first[1])
    flow_app.ack(third[0])
    assert flow_app.lease(QUEUE, "w", max=10) == []  # nothing running, but 3 leases this minute
    explanation = flow_app.explain(ids[3])
    assert "rate limit: 3/3" in explanation, explanation
    assert "concurrency limit" not in explanation, explanation
