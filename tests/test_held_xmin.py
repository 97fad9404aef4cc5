"""A long-open snapshot must not stop the queue.

While a worker processes a steady stream of jobs, another session opens a
REPEATABLE READ transaction, takes its snapshot with a SELECT and sits idle
in it for a few seconds. That pins the database's xmin horizon: no dead row
version of the queue tables can be vacuumed or pruned meanwhile, so every
scan wades through more of them. Processing must go on (it may slow down),
and once the transaction ends, every job must still succeed.

The slowdown is printed (throughput and enqueue-to-finish latency before,
during and after the hold), never asserted: it depends on the machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgqueue
from tests.apps.tasks import build_app
from tests.fixtures.workers import Workers, wait_until

STREAM_RATE = 400  # jobs enqueued per second
STREAM_BATCH = 20
BASELINE_SECONDS = 3.0
HOLD_SECONDS = 5.0  # at least; longer if processing has not yet shown progress
HOLD_PROGRESS = 200  # jobs that must succeed while the snapshot is held
AFTER_SECONDS = 3.0
LIVENESS_TIMEOUT = 60.0  # turns a stall into a failure; never a performance bound
DRAIN_TIMEOUT = 120.0


def db_clock(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def succeeded(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE status = 'succeeded'").fetchone()
    assert row is not None
    count: int = row[0]
    return count


@dataclass
class Window:
    """One phase of the run: jobs finished per second, and the latency of the
    jobs enqueued during it."""

    name: str
    started: datetime
    ended: datetime
    finished: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.finished / self.seconds if self.seconds else 0.0


class Stream:
    """Enqueues ``echo`` jobs at a steady rate from a thread until stopped."""

    def __init__(self, dsn: str) -> None:
        self.app = build_app(make_conninfo(dsn, application_name="xmin-producer"))
        self.job_ids: list[int] = []
        self.errors: list[BaseException] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="xmin-producer", daemon=True)

    def run(self) -> None:
        interval = STREAM_BATCH / STREAM_RATE
        next_at = time.monotonic()
        try:
            while not self.stopped.is_set():
                specs = [
                    pgqueue.JobSpec("echo", {"value": len(self.job_ids) + i})
                    for i in range(STREAM_BATCH)
                ]
                self.job_ids += [e.job_id for e in self.app.enqueue_many(specs)]
                next_at += interval
                self.stopped.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as error:
            self.errors.append(error)

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)
        self.app.close()
        assert not self.thread.is_alive(), "the producer thread did not stop"
        assert not self.errors, f"the producer failed: {self.errors[0]!r}"


@pytest.fixture
def monitor(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_dsn, autocommit=True, application_name="xmin-monitor") as conn:
        yield conn


def measure(name: str, conn: psycopg.Connection[Any], seconds: float, until: Any = None) -> Window:
    """Watch processing for ``seconds`` (and, with ``until``, until it returns true)."""
    started, count = db_clock(conn), succeeded(conn)
    t0 = time.monotonic()
    deadline = t0 + max(seconds, LIVENESS_TIMEOUT)
    while time.monotonic() - t0 < seconds or (until is not None and not until(count)):
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: processing stalled ({succeeded(conn) - count} jobs finished)")
        time.sleep(0.1)
    return Window(name, started, db_clock(conn), succeeded(conn) - count, time.monotonic() - t0)


def latencies(conn: psycopg.Connection[Any], window: Window) -> tuple[float, float]:
    """Mean and 95th percentile of enqueue-to-finish seconds of the jobs enqueued in it."""
    row = conn.execute(
        "SELECT avg(s), percentile_cont(0.95) WITHIN GROUP (ORDER BY s)"
        " FROM (SELECT extract(epoch FROM finished_at - created_at) AS s FROM pgqueue.jobs"
        "       WHERE created_at >= %s AND created_at < %s AND status = 'succeeded') j",
        (window.started, window.ended),
    ).fetchone()
    assert row is not None
    return float(row[0] or 0.0), float(row[1] or 0.0)


def dead_tuples(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'pgqueue'"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_processing_goes_on_while_an_idle_transaction_holds_back_xmin(
    workers: Workers, db_dsn: str, monitor: psycopg.Connection[Any]
) -> None:
    worker = workers.spawn("--concurrency", "8", "--poll-interval", "0.5s")
    worker.wait_registered()
    holder = psycopg.connect(db_dsn, application_name="xmin-holder")
    try:
        with Stream(db_dsn) as stream:
            wait_until(lambda: succeeded(monitor) > 0, 30, "the first jobs to finish", [worker])
            before = measure("before", monitor, BASELINE_SECONDS)

            # The snapshot: REPEATABLE READ takes it at the first statement
            # and keeps it (and the xmin horizon) until the transaction ends.
            holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            seen_at_start = holder.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
            pinned = monitor.execute(
                "SELECT state, backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                (holder.info.backend_pid,),
            ).fetchone()
            assert pinned == ("idle in transaction", True), pinned
            dead_at_start = dead_tuples(monitor)

            during = measure(
                "during",
                monitor,
                HOLD_SECONDS,
                until=lambda start: succeeded(monitor) - start >= HOLD_PROGRESS,
            )
            assert worker.alive(), worker.describe()
            # Still the same snapshot: the jobs enqueued since are invisible to it.
            assert holder.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == seen_at_start
            dead_at_end = dead_tuples(monitor)
            holder.rollback()

            after = measure("after", monitor, AFTER_SECONDS)
        job_ids = stream.job_ids
    finally:
        holder.close()

    statuses = workers.wait_statuses(job_ids, ("succeeded", "dead", "cancelled"), DRAIN_TIMEOUT)
    assert set(statuses.values()) == {"succeeded"}, {
        s: sum(1 for v in statuses.values() if v == s) for s in set(statuses.values())
    }
    assert len(statuses) == len(job_ids)

    lines, means = [], {}
    for window in (before, during, after):
        mean, p95 = latencies(monitor, window)
        means[window.name] = mean
        lines.append(
            f"  {window.name:>6}: {window.rate:7.1f} jobs/s over {window.seconds:4.1f}s;"
            f" latency mean {mean * 1000:7.1f} ms, p95 {p95 * 1000:7.1f} ms"
        )
    throughput = during.rate / before.rate if before.rate else 0.0
    latency = means["during"] / means["before"] if means["before"] else 0.0
    print(
        f"held xmin: {len(job_ids)} jobs streamed at {STREAM_RATE}/s, all succeeded. "
        f"While the snapshot was held: throughput x{throughput:.2f}, mean latency "
        f"x{latency:.2f} of before; dead tuples in pgqueue {dead_at_start} -> {dead_at_end}\n"
        + "\n".join(lines)
    )
