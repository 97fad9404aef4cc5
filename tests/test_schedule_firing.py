"""Firing schedules: exactly once per fire time with racing schedulers, missed
slots once, late slots one by one, disabled never, DST nights. The database
clock is frozen through the App's ``clock`` so nothing here waits."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue
from pgqueue.ops import Execute, Op, schedules
from pgqueue.ops.schedules import Tick
from pgqueue.queries import queries_for

SECOND = timedelta(seconds=1)
T0 = datetime(2030, 3, 1, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def __call__(self) -> datetime | None:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 - timedelta(milliseconds=500))


@pytest.fixture
def frozen(db_dsn: str, clock: Clock) -> Iterator[pgqueue.App]:
    with pgqueue.App(dsn=db_dsn, clock=clock) as frozen_app:
        yield frozen_app


def fire(app: pgqueue.App, watched_since: datetime | None = None) -> Tick:
    return app._database.run(schedules.fire_due(app.op_context, watched_since))


def run_ats(dsn: str, task: str | None = None) -> list[datetime]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT run_at FROM pgqueue.jobs WHERE %(task)s::text IS NULL OR task = %(task)s"
            " ORDER BY run_at",
            {"task": task},
        ).fetchall()
    return [r[0] for r in rows]


def execute(dsn: str, step: Execute) -> Any:
    """Run one step of an operation on a connection of our own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row) if step.rows == "dict" else conn.cursor()
        cur.execute(queries_for("pgqueue")[step.query], step.params)
        return cur.fetchall()


def finish(op: Op[Tick], step: Execute, dsn: str) -> Tick:
    try:
        op.send(execute(dsn, step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise AssertionError("fire_due takes two steps")


# --- what fires ---------------------------------------------------------------------------


def test_missed_slots_fire_once_as_the_latest(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("s", "*/5 * * * *", "t")  # first slot: T0
    clock.now = T0 + timedelta(hours=2, minutes=7)  # 25 slots passed, no scheduler ran
    tick = fire(frozen, None)
    assert [f.fire_times for f in tick.fired] == [[T0 + timedelta(hours=2, minutes=5)]]
    assert run_ats(db_dsn) == [T0 + timedelta(hours=2, minutes=5)]
    schedule = frozen.get_schedule("s")
    assert schedule.last_fire_at == T0 + timedelta(hours=2, minutes=5)
    assert schedule.next_fire_at == T0 + timedelta(hours=2, minutes=10)
    assert schedule.last_job_id == tick.fired[0].job_ids[0]
    assert tick.next_due == schedule.next_fire_at
    assert fire(frozen, tick.now).fired == []  # nothing left to fire


def test_a_late_running_scheduler_fires_every_slot_it_was_late_for(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("s", "* * * * * *", "t")
    clock.now = T0 + timedelta(milliseconds=10)
    first = fire(frozen, None)
    clock.now = T0 + timedelta(seconds=4, milliseconds=200)  # this scheduler stalled 4 s
    fire(frozen, first.now)
    assert run_ats(db_dsn) == [T0 + i * SECOND for i in range(5)]


def test_jobs_carry_their_fire_time_and_the_schedules_options(
    frozen: pgqueue.App, clock: Clock
) -> None:
    frozen.add_schedule(
        "s", "0 * * * *", "report", {"a": 1}, queue="reports", priority=3, max_attempts=7
    )
    clock.now = T0 + timedelta(minutes=1)
    (fired,) = fire(frozen).fired
    job = frozen.get_job(fired.job_ids[0])
    assert (job.task, job.queue, job.payload, job.priority, job.max_attempts, job.run_at) == (
        "report",
        "reports",
        {"a": 1},
        3,
        7,
        T0,
    )


def test_a_disabled_schedule_never_fires(frozen: pgqueue.App, clock: Clock, db_dsn: str) -> None:
    frozen.add_schedule("off", "* * * * * *", "t", enabled=False)
    frozen.add_schedule("paused", "* * * * * *", "t")
    frozen.disable_schedule("paused")
    since = None
    for step in range(1, 6):
        clock.now = T0 + step * timedelta(hours=5)
        tick = fire(frozen, since)
        since = tick.now
        assert (tick.fired, tick.next_due) == ([], None)
    assert run_ats(db_dsn) == []


def test_the_berlin_fall_back_night_fires_0230_once(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    clock.now = datetime(2024, 10, 26, 20, tzinfo=UTC)
    frozen.add_schedule("nightly", "30 2 * * *", "t", timezone="Europe/Berlin")
    frozen.add_schedule("hourly", "0 * * * *", "h", timezone="Europe/Berlin")
    since = None
    while clock.now < datetime(2024, 10, 27, 6, tzinfo=UTC):  # a scheduler looking every 10 min
        clock.now += timedelta(minutes=10)
        since = fire(frozen, since).now
    assert run_ats(db_dsn, "t") == [datetime(2024, 10, 27, 0, 30, tzinfo=UTC)]  # 02:30 CEST
    hourly = run_ats(db_dsn, "h")
    assert len(hourly) == 10  # 21:00Z..06:00Z: both 02:00s (CEST and CET) included
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(hourly))


def test_the_berlin_spring_forward_night_fires_0230_at_0300(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    clock.now = datetime(2024, 3, 30, 20, tzinfo=UTC)
    frozen.add_schedule("nightly", "30 2 * * *", "t", timezone="Europe/Berlin")
    since = None
    while clock.now < datetime(2024, 3, 31, 6, tzinfo=UTC):
        clock.now += timedelta(minutes=10)
        since = fire(frozen, since).now
    assert run_ats(db_dsn, "t") == [datetime(2024, 3, 31, 1, 0, tzinfo=UTC)]  # 03:00 CEST


# --- exactly once with racing schedulers ------------------------------------------------------


def test_racing_schedulers_enqueue_each_fire_time_once(db_dsn: str, clock: Clock) -> None:
    racers, rounds = 6, 12
    apps = [pgqueue.App(dsn=db_dsn, clock=clock, pool_min_size=0) for _ in range(racers)]
    try:
        apps[0].add_schedule("s", "* * * * * *", "t")
        apps[0].add_schedule("slow", "* * * * * */3", "u")  # seconds last
        barrier = threading.Barrier(racers)
        watched: list[datetime | None] = [None] * racers

        def race(i: int) -> list[str]:
            barrier.wait(timeout=60)
            tick = fire(apps[i], watched[i])
            watched[i] = tick.now
            return [f.name for f in tick.fired]

        with ThreadPoolExecutor(racers) as pool:
            for step in range(rounds):
                clock.now = T0 + step * SECOND + timedelta(milliseconds=300)
                winners = [name for names in pool.map(race, range(racers)) for name in names]
                # Each due schedule was fired by exactly one of the racers.
                assert sorted(winners) == (["s", "slow"] if step % 3 == 0 else ["s"])
    finally:
        for app in apps:
            app.close()
    assert run_ats(db_dsn, "t") == [T0 + i * SECOND for i in range(rounds)]
    assert run_ats(db_dsn, "u") == [T0 + i * SECOND for i in range(0, rounds, 3)]


def test_a_scheduler_that_read_before_another_fired_enqueues_nothing(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("s", "* * * * * *", "t")
    clock.now = T0 + timedelta(milliseconds=100)
    late = schedules.fire_due(frozen.op_context, None)
    read = next(late)
    stale_fire = late.send(execute(db_dsn, read))  # planned from the row as it was
    assert isinstance(stale_fire, Execute)
    assert stale_fire.query == "schedule_fire_many"
    winner = fire(frozen, None)  # another scheduler fires the same slot first
    assert [f.fire_times for f in winner.fired] == [[T0]]
    loser = finish(late, stale_fire, db_dsn)
    assert (loser.fired, loser.again) == ([], True)
    assert run_ats(db_dsn) == [T0]


def test_a_schedule_being_fired_elsewhere_is_skipped_not_waited_for(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("s", "* * * * * *", "t")
    clock.now = T0 + timedelta(milliseconds=100)
    with psycopg.connect(db_dsn) as holder:  # another scheduler's open transaction
        holder.execute("SELECT 1 FROM pgqueue.schedules WHERE name = 's' FOR UPDATE")
        skipped = fire(frozen, None)
        assert (skipped.fired, skipped.again) == ([], True)
        holder.rollback()  # that scheduler failed: its slot is still due
    fired = fire(frozen, None)
    assert [f.fire_times for f in fired.fired] == [[T0]]
    assert run_ats(db_dsn) == [T0]


def test_a_fire_planned_from_an_old_definition_is_redone_with_the_new_one(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("s", "* * * * * *", "t", {"v": 1})
    clock.now = T0 + timedelta(milliseconds=100)
    op = schedules.fire_due(frozen.op_context, None)
    planned = next(op)
    stale = op.send(execute(db_dsn, planned))
    frozen.add_schedule("s", "* * * * * *", "t", {"v": 2})  # changed meanwhile
    assert finish(op, stale, db_dsn).fired == []
    (redone,) = fire(frozen, None).fired
    assert frozen.get_job(redone.job_ids[0]).payload == {"v": 2}


def test_a_broken_row_does_not_stop_the_others(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    frozen.add_schedule("bad", "* * * * * *", "t")
    frozen.add_schedule("good", "* * * * * *", "t")
    with psycopg.connect(db_dsn) as conn:  # e.g. edited by hand
        conn.execute("UPDATE pgqueue.schedules SET timezone = 'Mars/Base' WHERE name = 'bad'")
    clock.now = T0 + timedelta(milliseconds=100)
    tick = fire(frozen, None)
    assert [f.name for f in tick.fired] == ["good"]
    assert "Mars/Base" in tick.broken["bad"]
    assert tick.again is False


def test_more_due_than_one_step_takes_asks_for_another_step(
    frozen: pgqueue.App, clock: Clock, db_dsn: str
) -> None:
    for i in range(5):
        frozen.add_schedule(f"s{i}", "* * * * * *", "t")
    clock.now = T0 + timedelta(milliseconds=100)
    first = frozen._database.run(schedules.fire_due(frozen.op_context, None, limit=3))
    assert (len(first.fired), first.again) == (3, True)
    second = frozen._database.run(schedules.fire_due(frozen.op_context, None, limit=3))
    assert (len(second.fired), second.again) == (2, False)
    assert run_ats(db_dsn) == [T0] * 5
