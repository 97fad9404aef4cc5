"""The scheduler in real workers: three worker processes on an every-second
schedule, a schedule missed while no worker ran, and the NOTIFY wake-up.

Waits poll the database against generous deadlines (they turn a hang into a
failure, never a pass); every assertion is on the jobs' run_at values.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.ops import Op, schedules
from pgqueue.worker import scheduler
from tests.apps.scheduled import EVERY_SECOND
from tests.fixtures.workers import Workers, wait_until

SCHEDULED_APP = "tests.apps.scheduled:app"
SECOND = timedelta(seconds=1)
DEADLINE = 90.0  # seconds; only a hang gets near it


def db_now(dsn: str) -> datetime:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index,no-any-return]


def run_ats(dsn: str, task: str) -> list[datetime]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT run_at FROM pgqueue.jobs WHERE task = %s ORDER BY run_at", (task,)
        ).fetchall()
    return [r[0] for r in rows]


def assert_one_job_per_second(times: list[datetime]) -> None:
    assert len(set(times)) == len(times), f"a fire time was enqueued twice: {times}"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap == SECOND for gap in gaps), f"a fire time was skipped: {times}"
    assert all(t.microsecond == 0 for t in times)


@pytest.mark.slow
def test_three_schedulers_enqueue_every_second_exactly_once(workers: Workers, db_dsn: str) -> None:
    with pgqueue.App(dsn=db_dsn) as app:
        app.add_schedule("never", "* * * * * *", "disabled_probe", enabled=False)
    procs = [workers.spawn("--concurrency", "2", app=SCHEDULED_APP) for _ in range(3)]
    for proc in procs:
        proc.wait_registered()
    all_running = db_now(db_dsn)
    wanted = 6  # fire times while all three schedulers run

    def enough() -> bool:
        return sum(t > all_running for t in run_ats(db_dsn, "tick")) >= wanted

    wait_until(enough, DEADLINE, f"{wanted} fire times with three schedulers", procs)
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait_exit() for proc in procs] == [0, 0, 0]

    times = run_ats(db_dsn, "tick")
    assert len(times) >= wanted
    assert_one_job_per_second(times)
    with pgqueue.App(dsn=db_dsn) as app:
        schedule = app.get_schedule(EVERY_SECOND)
        assert schedule.last_fire_at == times[-1]
        assert {j.queue for j in app.list_jobs(task="tick", limit=1000).jobs} == {"ticks"}
    assert run_ats(db_dsn, "disabled_probe") == []
    firing = [p for p in procs if p.logged("schedule fired")]
    assert firing, "no scheduler logged a fire"


@pytest.mark.slow
def test_slots_missed_while_no_scheduler_ran_fire_once(workers: Workers, db_dsn: str) -> None:
    with pgqueue.App(dsn=db_dsn) as app:
        # The same definition the workers' @app.periodic registers: registering
        # it again at start must keep this next fire time, not skip the missed slots.
        first_slot = app.add_schedule(EVERY_SECOND, "* * * * * *", "tick").next_fire_at
    assert first_slot is not None
    wait_until(lambda: db_now(db_dsn) >= first_slot + 3 * SECOND, DEADLINE, "3 missed slots")
    started = db_now(db_dsn).replace(microsecond=0)
    proc = workers.spawn(app=SCHEDULED_APP)
    wait_until(lambda: len(run_ats(db_dsn, "tick")) >= 3, DEADLINE, "three jobs", [proc])
    proc.send(signal.SIGTERM)
    assert proc.wait_exit() == 0

    times = run_ats(db_dsn, "tick")
    assert_one_job_per_second(times)
    # The slots from first_slot to before the worker started fired as one job
    # (the latest of them, or the first one after the start): none one by one.
    assert times[0] >= started
    assert times[0] - first_slot >= 3 * SECOND


def wait_for_listen(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        ).fetchone()
    return bool(row and row[0])


def test_a_new_schedule_wakes_a_sleeping_scheduler(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the NOTIFY the scheduler would sleep for an hour: the job can
    # only appear before the deadline if the notification woke it.
    monkeypatch.setattr(scheduler, "MAX_SLEEP", 3600.0)
    stepped = asyncio.Event()
    original = schedules.fire_due

    def counting(*args: object, **kwargs: object) -> Op[schedules.Tick]:
        tick = yield from original(*args, **kwargs)  # type: ignore[arg-type]
        stepped.set()
        return tick

    monkeypatch.setattr(schedules, "fire_due", counting)

    async def main() -> None:
        async with pgqueue.App(dsn=db_dsn) as app:
            stop = asyncio.Event()
            worker = asyncio.create_task(
                app.run_worker_async(
                    stop=stop, concurrency=1, poll_interval=60, install_signal_handlers=False
                )
            )
            await asyncio.wait_for(stepped.wait(), DEADLINE)  # first step: nothing due
            await asyncio.wait_for(_until(lambda: wait_for_listen(db_dsn)), DEADLINE)
            await app.add_schedule_async("soon", "* * * * * *", "noop")
            await asyncio.wait_for(_until(lambda: bool(run_ats(db_dsn, "noop"))), DEADLINE)
            stop.set()
            await asyncio.wait_for(worker, DEADLINE)

    asyncio.run(main())


async def _until(probe: Callable[[], bool]) -> None:
    while not await asyncio.to_thread(probe):
        await asyncio.sleep(0.05)


def test_no_scheduler_option_fires_nothing(db_dsn: str) -> None:
    async def main() -> None:
        async with pgqueue.App(dsn=db_dsn) as app:
            await app.add_schedule_async("s", "* * * * * *", "noop")
            stop = asyncio.Event()
            worker = asyncio.create_task(
                app.run_worker_async(
                    stop=stop, scheduler=False, concurrency=1, install_signal_handlers=False
                )
            )
            # Wait for a fire time to pass with the worker running, then stop it.
            due = (await app.get_schedule_async("s")).next_fire_at
            assert due is not None
            await asyncio.wait_for(_until(lambda: db_now(db_dsn) > due + SECOND), DEADLINE)
            stop.set()
            await asyncio.wait_for(worker, DEADLINE)
            assert run_ats(db_dsn, "noop") == []

    asyncio.run(main())
