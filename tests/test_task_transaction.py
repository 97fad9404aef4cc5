"""context.transaction(): the task's writes and its job's success commit
together — exactly once, even while workers are SIGKILLed at random points."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable

import psycopg
import pytest
import structlog
import structlog.testing

import pgqueue
from tests.apps.in_transaction import EFFECTS_TABLE
from tests.fixtures.workers import Workers


@pytest.fixture
def effects(db_dsn: str) -> Callable[[], dict[int, int]]:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)

    def rows_per_job() -> dict[int, int]:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            return dict(
                conn.execute(
                    "SELECT job_id, count(*) FROM public.tx_effects GROUP BY job_id"
                ).fetchall()
            )

    return rows_per_job


def _run_until(app: pgqueue.App, done: Callable[[], bool], timeout: float = 60) -> None:
    """Run an in-process worker until ``done()`` (bounded)."""

    async def run() -> None:
        stop = asyncio.Event()
        worker = asyncio.create_task(
            app.run_worker_async(stop=stop, reap_interval=0.2, install_signal_handlers=False)
        )
        deadline = time.monotonic() + timeout
        try:
            while not done():
                assert time.monotonic() < deadline, "the jobs did not finish in time"
                assert not worker.done(), "the worker stopped"
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await worker
            await app.close_async()

    asyncio.run(run())


def _status(app: pgqueue.App, job_id: int) -> str:
    return app.get_job(job_id).status.value


def test_sync_and_async_complete_in_their_transaction(
    app: pgqueue.App, effects: Callable[[], dict[int, int]]
) -> None:
    returned: list[str] = []

    @app.task(pass_context=True)
    def sync_task(context: pgqueue.JobContext) -> str:
        with context.transaction() as conn:
            conn.execute("INSERT INTO public.tx_effects (job_id) VALUES (%s)", (context.job_id,))
        returned.append("sync")
        return "ignored"

    @app.task(pass_context=True)
    async def async_task(context: pgqueue.JobContext) -> None:
        async with context.transaction() as conn:
            await conn.execute(
                "INSERT INTO public.tx_effects (job_id) VALUES (%s)", (context.job_id,)
            )
        returned.append("async")

    a = sync_task.enqueue().job_id
    b = async_task.enqueue().job_id
    with structlog.testing.capture_logs() as logs:
        _run_until(
            app, lambda: len(returned) == 2 and {_status(app, a), _status(app, b)} == {"succeeded"}
        )
    events = [str(e["event"]) for e in logs]
    assert events.count("job succeeded in its transaction") == 2
    # The worker recorded nothing a second time (a late ack would be refused and logged).
    assert not [e for e in events if "lease lost" in e or "not recorded" in e], events
    assert effects() == {a: 1, b: 1}
    for job_id in (a, b):
        job = app.get_job(job_id, history=True)
        assert job.attempts == 1
        assert [x.outcome.value for x in job.attempt_history or []] == ["succeeded"]
        assert job.result is None


def test_exception_rolls_back_and_retries(
    app: pgqueue.App, effects: Callable[[], dict[int, int]]
) -> None:
    @app.task(pass_context=True, retry=pgqueue.Backoff(base=0.1, factor=1, max=0.1, jitter=0))
    def flaky(context: pgqueue.JobContext) -> None:
        with context.transaction() as conn:
            conn.execute("INSERT INTO public.tx_effects (job_id) VALUES (%s)", (context.job_id,))
            if context.attempt == 1:
                raise RuntimeError("first attempt fails after writing")

    @app.task(pass_context=True, retry=pgqueue.Backoff(base=0.1, factor=1, max=0.1, jitter=0))
    def fails_after_block(context: pgqueue.JobContext) -> None:
        if context.attempt == 1:
            raise RuntimeError("before the block")
        with context.transaction() as conn:
            conn.execute("INSERT INTO public.tx_effects (job_id) VALUES (%s)", (context.job_id,))

    a = flaky.enqueue().job_id
    b = fails_after_block.enqueue().job_id
    _run_until(app, lambda: {_status(app, a), _status(app, b)} == {"succeeded"})
    assert effects() == {a: 1, b: 1}
    job = app.get_job(a, history=True)
    assert [x.outcome.value for x in job.attempt_history or []] == ["failed", "succeeded"]
    assert "first attempt fails" in (job.attempt_history or [])[0].error_message


def test_lost_lease_raises_and_rolls_back(
    app: pgqueue.App, db_dsn: str, effects: Callable[[], dict[int, int]]
) -> None:
    seen: list[str] = []

    @app.task(pass_context=True, retry=pgqueue.Backoff(base=0.1, factor=1, max=0.1, jitter=0))
    def reaped(context: pgqueue.JobContext) -> None:
        try:
            with context.transaction() as conn:
                conn.execute(
                    "INSERT INTO public.tx_effects (job_id) VALUES (%s)", (context.job_id,)
                )
                if context.attempt == 1:
                    # The lease runs out and another process reaps the job meanwhile.
                    with psycopg.connect(db_dsn, autocommit=True) as other:
                        other.execute(
                            "UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 s'"
                            " WHERE id = %s",
                            (context.job_id,),
                        )
                    with pgqueue.App(dsn=db_dsn) as reaper:
                        reaper.reap()  # or the worker's own reaper got there first
                    _wait_reaped(db_dsn, context.job_id, context.attempt_id)
        except pgqueue.LeaseLost:
            seen.append("lease lost")
            raise

    job_id = reaped.enqueue().job_id
    _run_until(app, lambda: _status(app, job_id) == "succeeded")
    assert seen == ["lease lost"]
    assert effects() == {job_id: 1}  # the first attempt's insert rolled back
    job = app.get_job(job_id, history=True)
    assert [x.outcome.value for x in job.attempt_history or []] == ["lease_expired", "succeeded"]


def _wait_reaped(dsn: str, job_id: int, attempt_id: int) -> None:
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT status::text, attempt_id FROM pgqueue.jobs WHERE id = %s", (job_id,)
            ).fetchone()
            if row is not None and (row[0] != "running" or row[1] != attempt_id):
                return
            assert time.monotonic() < deadline, "the job was never reaped"
            time.sleep(0.05)


def test_one_block_per_attempt_and_only_in_a_worker(app: pgqueue.App) -> None:
    errors: list[str] = []

    @app.task(pass_context=True)
    def twice(context: pgqueue.JobContext) -> None:
        with context.transaction():
            pass
        try:
            context.transaction()
        except pgqueue.errors.InvalidOption as exc:
            errors.append(str(exc))

    job_id = twice.enqueue().job_id
    _run_until(app, lambda: bool(errors) and _status(app, job_id) == "succeeded")
    assert "once per attempt" in errors[0]
    context = pgqueue.JobContext(1, 1, 1, "default", "t")
    with pytest.raises(pgqueue.errors.InvalidOption, match="only available in a worker"):
        context.transaction()


# --- crash test: real worker processes SIGKILLed at random points ------------------

JOBS = 40
KILLS = 5


@pytest.mark.slow
def test_sigkilled_workers_leave_each_effect_exactly_once(
    db_dsn: str, workers: Workers, effects: Callable[[], dict[int, int]]
) -> None:
    from tests.apps.in_transaction import app as tasks_app

    rng = random.Random()
    with pgqueue.App(dsn=db_dsn) as producer:
        for name in ("tx_insert", "tx_insert_async"):
            producer.tasks[name] = tasks_app.tasks[name]
        ids = [
            producer.enqueue(name, {"pause": 0.2}).job_id
            for _ in range(JOBS // 2)
            for name in ("tx_insert", "tx_insert_async")
        ]
        args = ("--concurrency", "4", "--reap-interval", "0.3s")
        app_path = "tests.apps.in_transaction:app"
        kills = 0
        while kills < KILLS:
            worker = workers.spawn(*args, app=app_path)
            worker.wait_registered()
            time.sleep(rng.uniform(0.05, 1.0))
            worker.send(signal.SIGKILL)
            worker.wait_exit()
            kills += 1
        finisher = workers.spawn(*args, app=app_path)
        statuses = workers.wait_statuses(ids, timeout=120, require_alive=[finisher])

    assert set(statuses.values()) == {"succeeded"}
    per_job = effects()
    assert per_job == dict.fromkeys(ids, 1), {
        i: per_job.get(i, 0) for i in ids if per_job.get(i, 0) != 1
    }
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        reaped = conn.execute(
            "SELECT count(*) FROM pgqueue.job_attempts WHERE outcome = 'lease_expired'"
        ).fetchone()
    assert reaped is not None
    assert reaped[0] >= 1  # the kills did interrupt running attempts
