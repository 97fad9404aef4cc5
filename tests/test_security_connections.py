"""Connection budget (docs/connections.md): a worker holds at most its App's
``pool_max_size`` pooled connections plus one LISTEN connection, and an
exhausted pool is a bounded wait ending in PoolExhausted, never a hang.

The worker's connections are told apart by the ``application_name`` its DSN
sets; a sampler counts them in ``pg_stat_activity`` every few milliseconds
while the worker runs through thousands of jobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgqueue
from tests.fixtures.workers import Workers


class ConnectionSampler:
    """Counts the client connections of one application_name, continuously."""

    def __init__(self, dsn: str, application_name: str) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name="pgq_sampler") as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = %s AND backend_type = 'client backend'",
                    (self.application_name,),
                ).fetchone()
                assert row is not None
                self.samples.append(row[0])
                time.sleep(0.005)

    @contextmanager
    def running(self) -> Iterator[ConnectionSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=10)

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)


def worker_dsn(db_dsn: str) -> tuple[str, str]:
    name = f"pgq_budget_{uuid.uuid4().hex[:8]}"
    return make_conninfo(db_dsn, application_name=name), name


def spawn_budget_worker(workers: Workers, dsn: str, pool_max: int) -> None:
    workers.spawn(
        "--concurrency", "50", "--log-level", "warning",
        app="tests.apps.budget:app", dsn=dsn, env={"PGQUEUE_TEST_POOL_MAX": str(pool_max)},
    )  # fmt: skip


# With 2 the pool is usually saturated (the peak reaches the bound); 4 is a typical size.
@pytest.mark.slow
@pytest.mark.parametrize("pool_max", [2, 4])
def test_a_worker_under_load_stays_within_its_pool_plus_one(
    db_dsn: str, workers: Workers, pool_max: int
) -> None:
    dsn, name = worker_dsn(db_dsn)
    with pgqueue.App(db_dsn) as app:
        ids = [
            r.job_id
            for r in app.enqueue_many(
                [
                    pgqueue.JobSpec("async_noop" if n % 4 else "sync_noop", {"n": n}, "budget")
                    for n in range(2000)
                ]
            )
        ]
    with ConnectionSampler(db_dsn, name).running() as sampler:
        spawn_budget_worker(workers, dsn, pool_max)
        statuses = workers.wait_statuses(ids, timeout=180)
    assert set(statuses.values()) == {"succeeded"}
    assert len(sampler.samples) > 50, "the sampler barely ran"
    # Its async pool (at most pool_max_size) plus the LISTEN connection.
    print(f"peak {sampler.peak} connections over {len(sampler.samples)} samples")
    assert 2 <= sampler.peak <= pool_max + 1, sampler.peak


@pytest.mark.slow
@pytest.mark.parametrize("pool_max", [2, 4])
def test_sync_tasks_that_call_the_app_add_its_sync_pool(
    db_dsn: str, workers: Workers, pool_max: int
) -> None:
    dsn, name = worker_dsn(db_dsn)
    with pgqueue.App(db_dsn) as app:
        parents = [
            r.job_id
            for r in app.enqueue_many(
                [pgqueue.JobSpec("sync_enqueue", {"n": n}, "budget") for n in range(400)]
            )
        ]
    with ConnectionSampler(db_dsn, name).running() as sampler:
        spawn_budget_worker(workers, dsn, pool_max)
        workers.wait_statuses(parents, timeout=180)
        with pgqueue.App(db_dsn) as app:
            children = [job.result for job in (app.get_job(i) for i in parents)]
        workers.wait_statuses(children, timeout=180)
    # The async pool, the sync pool (tasks in threads enqueue through it), the listener.
    print(f"peak {sampler.peak} connections over {len(sampler.samples)} samples")
    assert sampler.peak <= 2 * pool_max + 1, sampler.peak


@contextmanager
def holding_the_only_connection(app: pgqueue.App) -> Iterator[None]:
    """Another thread holds the App's one pooled connection meanwhile."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with app._database.pool().connection():
            taken.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(30)
    try:
        yield
    finally:
        release.set()
        holder.join(30)


def test_an_exhausted_pool_waits_pool_timeout_then_raises(db_dsn: str) -> None:
    with pgqueue.App(db_dsn) as owner:
        job_id = owner.enqueue("t").job_id
    with pgqueue.App(db_dsn, pool_min_size=0, pool_max_size=1, pool_timeout=1) as app:
        with holding_the_only_connection(app):
            started = time.monotonic()
            with pytest.raises(pgqueue.PoolExhausted) as caught:
                app.get_job(job_id)
            waited = time.monotonic() - started
        assert 0.9 <= waited < 5, waited  # the pool timeout, plus one probe connection
        message = str(caught.value)
        assert "all 1 pooled connection(s)" in message
        assert "busy for 1s" in message
        assert "pool_max_size" in message
        assert isinstance(caught.value, pgqueue.ConnectionFailed)
        # Once the connection is back, the same App works again.
        assert app.get_job(job_id).id == job_id


def test_an_exhausted_async_pool_waits_pool_timeout_then_raises(db_dsn: str) -> None:
    with pgqueue.App(db_dsn) as owner:
        job_id = owner.enqueue("t").job_id

    async def main() -> float:
        async with pgqueue.App(db_dsn, pool_min_size=0, pool_max_size=1, pool_timeout=1) as app:
            pool = await app._database.pool_async()
            async with pool.connection():
                started = time.monotonic()
                with pytest.raises(pgqueue.PoolExhausted, match="pool_max_size"):
                    await app.get_job_async(job_id)
                waited = time.monotonic() - started
            assert (await app.get_job_async(job_id)).id == job_id
            return waited

    waited = asyncio.run(main())
    assert 0.9 <= waited < 5, waited
