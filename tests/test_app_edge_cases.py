"""Edge cases of the App and the worker parts, on a real database: an extend
during a heartbeat, result() waiters and the pool, empty queue lists, pools of
an earlier event loop, schedules that keep changing, code that must stay gone."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.database import Database
from pgqueue.errors import InvalidName, PoolExhausted, ScheduleConflict, ScheduleNotFound
from pgqueue.ops import Op
from pgqueue.worker.completer import Completer
from pgqueue.worker.executor import Executor, RunningJob
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.settings import WorkerSettings
from tests.fixtures.workers import wait_until

# --- context.extend() during a heartbeat round trip ------------------------------


class ExtendDuringRoundTrip:
    """The App's real database; ``during`` runs while a statement is in flight."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.during: list[Any] = []

    async def run_async(self, op: Op[Any], conn: Any = None) -> Any:
        task = asyncio.ensure_future(self.database.run_async(op, conn))
        await asyncio.sleep(0)  # the statement is on its way
        while self.during:
            self.during.pop(0)()
        return await task


def lease_expires_in(app: pgqueue.App, job_id: int) -> float:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM lease_expires_at - now()) FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def test_an_extend_requested_while_the_heartbeat_extends_is_not_lost(app: pgqueue.App) -> None:
    job_id = app.enqueue("t", {}).job_id

    async def scenario() -> None:
        [leased] = await app.lease_async("default", "w", lease_seconds=30)
        database = ExtendDuringRoundTrip(app._database)
        running: dict[int, RunningJob] = {}
        wake = asyncio.Event()
        completer = Completer(app._database, app.op_context, running, lambda loop, exc: None)
        executor = Executor({}, 1, completer, 1 << 20, running=running, heartbeat_wake=wake.set)
        heartbeat = Heartbeat(
            database,  # type: ignore[arg-type]
            app.op_context,
            WorkerSettings.build(worker_id="w"),
            executor,
            asyncio.Event(),
            lambda: True,
            wake,
        )
        rj = RunningJob(leased, None, time.monotonic())
        executor.running[job_id] = rj
        executor._request_extend(rj, 60)  # what context.extend(60) does
        await asyncio.sleep(0)
        # The task asks for more while the heartbeat's extension is in flight.
        database.during.append(lambda: executor._request_extend(rj, 600))
        await heartbeat._extend_due()
        assert rj.extend_to == 600
        await heartbeat._extend_due()
        assert rj.extend_to is None
        executor.close()
        await app._database.close_async_pool()  # before asyncio.run ends its loop

    asyncio.run(scenario())
    app._database.close()
    assert lease_expires_in(app, job_id) > 300


# --- result() -----------------------------------------------------------------------


def listening_sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("listen", [True, False])
def test_result_waits_without_holding_a_pooled_connection(db_dsn: str, listen: bool) -> None:
    with pgqueue.App(db_dsn, pool_max_size=1, pool_timeout=1, listen=listen) as app:
        job_id = app.enqueue("t", {}).job_id
        outcome: list[Any] = []
        waiter = threading.Thread(target=lambda: outcome.append(app.result(job_id, timeout=30)))
        waiter.start()
        try:
            # The one pooled connection stays usable while result() waits.
            for _ in range(5):
                assert app.get_job(job_id).status == pgqueue.JobStatus.QUEUED
                time.sleep(0.1)
            assert (listening_sessions(db_dsn) > 0) is listen
            [leased] = app.lease("default", "w")
            app.ack(leased, {"done": True})
        finally:
            waiter.join(timeout=30)
        assert outcome == [{"done": True}]


def test_ten_waiters_do_not_starve_the_default_pool(db_dsn: str) -> None:
    with pgqueue.App(db_dsn, pool_max_size=2, pool_timeout=2) as app:
        job_id = app.enqueue("t", {}).job_id
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                app.result(job_id, timeout=1.5)
            except pgqueue.ResultTimeout:
                pass
            except BaseException as exc:
                errors.append(exc)

        waiters = [threading.Thread(target=wait) for _ in range(10)]
        for w in waiters:
            w.start()
        try:
            assert app.get_job(job_id).status == pgqueue.JobStatus.QUEUED
        finally:
            for w in waiters:
                w.join(timeout=30)
        assert not [e for e in errors if isinstance(e, PoolExhausted)], errors
        assert errors == []


# --- queues=[] ----------------------------------------------------------------------


def test_an_empty_queue_list_is_refused_by_lease_and_by_the_worker(app: pgqueue.App) -> None:
    app.enqueue("t", {})
    with pytest.raises(InvalidName, match="empty"):
        app.lease([], "w")
    with pytest.raises(InvalidName, match="empty"):
        WorkerSettings.build(queues=[])
    with pytest.raises(InvalidName, match="empty"):
        app.run_worker(queues=[])
    assert app.metrics()["default"].queued == 1  # nothing was leased
    assert len(app.lease(None, "w")) == 1  # None still means every queue


# --- an async pool of an earlier event loop -------------------------------------------


def pool_sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'pgqueue'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_async_pool_from_an_earlier_event_loop_is_closed(db_dsn: str) -> None:
    with pgqueue.App(db_dsn, pool_min_size=3, pool_max_size=3) as app:
        job_id = app.enqueue("t", {}).job_id
        app.close()  # only the async pool from here on

        async def read() -> None:
            await app.get_job_async(job_id)
            pool = await app._database.pool_async()
            await pool.wait()  # all three connections open

        asyncio.run(read())
        wait_until(lambda: pool_sessions(db_dsn) == 3, 15, "only the async pool's sessions")
        asyncio.run(read())  # a new loop: a new pool; the old one's sessions end
        wait_until(lambda: pool_sessions(db_dsn) == 3, 15, "the old pool's sessions to end")
        app.close()
        wait_until(lambda: pool_sessions(db_dsn) == 0, 15, "the pool's sessions to end")


# --- a schedule that keeps changing is not "not found" -----------------------------


def test_a_schedule_that_keeps_changing_raises_schedule_conflict(app: pgqueue.App) -> None:
    app.add_schedule("nightly", "0 3 * * *", "t", enabled=False)
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        # Every update of the row loses, as against a writer that always wins.
        conn.execute(
            "CREATE FUNCTION public.skip_update() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE TRIGGER always_changed BEFORE UPDATE ON pgqueue.schedules"
            " FOR EACH ROW EXECUTE FUNCTION public.skip_update()"
        )
    with pytest.raises(ScheduleConflict, match="kept changing") as caught:
        app.enable_schedule("nightly")
    assert not isinstance(caught.value, ScheduleNotFound)
    with pytest.raises(ScheduleNotFound):
        app.enable_schedule("no-such-schedule")


# --- dead code --------------------------------------------------------------------------


def test_the_dead_code_is_gone() -> None:
    from pgqueue import ops
    from pgqueue.ops import maintenance
    from pgqueue.worker.worker import Worker

    assert not hasattr(ops, "no_defaults")
    assert not hasattr(maintenance, "workers")
    assert "raw_dsn" not in inspect.getsource(Database)
    assert "check_schema" not in inspect.getsource(Database)
    assert "_producer" not in inspect.getsource(Worker)
