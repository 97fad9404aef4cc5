"""Helpers of the flow-control suite (tests/test_flow_*.py): workers serving
:mod:`tests.apps.flow`, gate files that end held jobs, a sampler that counts a
queue's running jobs while workers run, and interval arithmetic.

Every wait is bounded (see :func:`tests.fixtures.workers.wait_until`): the
bounds are liveness limits that turn a hang into a failure, never speed checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from tests.fixtures.dbstate import Snapshot, snapshot
from tests.fixtures.workers import WorkerProcess, Workers, task_events, wait_until

FLOW_APP = "tests.apps.flow:app"

#: Long enough that a worker which leases within a few seconds was woken by a
#: notification, not by its poll (jittered by at most 10%).
LONG_POLL = "60s"

#: Liveness bound for "promptly": far below LONG_POLL, far above any real wake-up.
PROMPT = 15.0


def spawn_flow_workers(workers: Workers, count: int, *args: str) -> list[WorkerProcess]:
    """Start ``count`` workers serving the flow app with ``args``; wait until
    every one has registered (it is then listening and leasing)."""
    started = [workers.spawn("--no-scheduler", *args, app=FLOW_APP) for _ in range(count)]
    for worker in started:
        worker.wait_registered()
    return started


@dataclass
class Gate:
    """A file that ends every ``flow_hold`` job given its path once it exists."""

    path: Path

    def open(self) -> None:
        self.path.touch()

    @property
    def payload(self) -> dict[str, Any]:
        return {"gate": str(self.path)}


def gate(tmp_path: Path, name: str) -> Gate:
    return Gate(tmp_path / f"gate-{name}")


def scalar(dsn: str, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
    """The single value of a one-row, one-column query (autocommit)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def running_count(dsn: str, queue: str) -> int:
    """Jobs of ``queue`` whose stored status is running."""
    value: int = scalar(
        dsn,
        "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s AND status = 'running'",
        (queue,),
    )
    return value


def started_jobs(dsn: str, job_ids: Iterable[int] | None = None) -> set[int]:
    """Ids of the jobs whose task recorded a start (any attempt)."""
    wanted = set(job_ids) if job_ids is not None else None
    return {
        e["job_id"]
        for e in task_events(dsn, "start")
        if e["job_id"] is not None and (wanted is None or e["job_id"] in wanted)
    }


def wait_started(
    workers: Workers, job_ids: Sequence[int], count: int | None = None, timeout: float = 60.0
) -> set[int]:
    """Wait until ``count`` (default: all) of ``job_ids`` have recorded a start."""
    need = len(job_ids) if count is None else count

    def probe() -> set[int] | None:
        started = started_jobs(workers.dsn, job_ids)
        return started if len(started) >= need else None

    alive = [w for w in workers.started if w.alive()]
    return wait_until(probe, timeout, f"{need} of jobs {list(job_ids)} to start", alive)


def attempt_rows(dsn: str, queue: str) -> list[dict[str, Any]]:
    """Every attempt of the queue's jobs: the current/final one kept in the
    jobs row (attempt_started_at) and the earlier ones in job_attempts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cur.execute(
            """
            SELECT j.id AS job_id, j.attempt_id, j.worker_id, j.attempt_started_at AS started_at,
                   j.finished_at, j.status::text AS status
            FROM pgqueue.jobs j
            WHERE j.queue = %(queue)s AND j.attempt_id IS NOT NULL
            UNION
            SELECT a.job_id, a.id, a.worker_id, a.started_at, a.finished_at, a.outcome::text
            FROM pgqueue.job_attempts a JOIN pgqueue.jobs j ON j.id = a.job_id
            WHERE j.queue = %(queue)s
            ORDER BY started_at
            """,
            {"queue": queue},
        ).fetchall()
    return [dict(r) for r in rows]


def max_overlap(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """Most half-open intervals [start, end) covering one instant."""
    points: list[tuple[datetime, int]] = []
    for start, end in intervals:
        assert start <= end, (start, end)
        points.append((start, 1))
        points.append((end, -1))
    # At one instant an interval that ends is out before one that starts is in.
    points.sort(key=lambda p: (p[0], p[1]))
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def max_in_window(starts: Sequence[datetime], window: timedelta) -> int:
    """Most of ``starts`` inside one half-open window [t, t + window), over every t."""
    ordered = sorted(starts)
    best = 0
    right = 0
    for left, first in enumerate(ordered):
        right = max(right, left)
        while right < len(ordered) and ordered[right] < first + window:
            right += 1
        best = max(best, right - left)
    return best


@dataclass
class RunningSampler:
    """Counts a queue's running jobs every ``interval`` seconds in a thread,
    on a connection of its own, until stopped; keeps the maximum."""

    dsn: str
    queue: str
    interval: float = 0.02
    samples: list[int] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RunningSampler:
        self._thread = threading.Thread(target=self._run, name="running-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the sampler failed: {self.error!r}") from self.error

    @property
    def maximum(self) -> int:
        return max(self.samples, default=0)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    row = conn.execute(
                        "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s AND status = 'running'",
                        (self.queue,),
                    ).fetchone()
                    assert row is not None
                    self.samples.append(int(row[0]))
                    self._stop.wait(self.interval)
        except BaseException as exc:  # reported by stop()
            self.error = exc


def sample_for(dsn: str, queue: str, seconds: float, interval: float = 0.02) -> list[int]:
    """Running counts of ``queue`` sampled for ``seconds`` (an observation
    window for "nothing more starts", not a speed check)."""
    with RunningSampler(dsn, queue, interval) as sampler:
        time.sleep(seconds)
    return sampler.samples


def job_snapshot(dsn: str) -> Snapshot:
    """:func:`tests.fixtures.dbstate.snapshot` without the workers' registry,
    which live workers keep updating with heartbeats."""
    state = snapshot(dsn)
    state.pop("workers", None)
    return state


def job_attempt_count(dsn: str, job_id: int) -> int:
    """Rows in job_attempts for the job (attempts that did not end it successfully)."""
    value: int = scalar(
        dsn, "SELECT count(*) FROM pgqueue.job_attempts WHERE job_id = %s", (job_id,)
    )
    return value


def outcomes(app: pgqueue.App, job_id: int) -> list[pgqueue.AttemptOutcome]:
    history = app.get_job(job_id, history=True).attempt_history
    assert history is not None
    return [a.outcome for a in history]


def race_leases(app: pgqueue.App, queue: str, racers: int = 8) -> list[pgqueue.LeasedJob]:
    """``racers`` threads call lease(max=5) at the same moment; all they got."""
    barrier = threading.Barrier(racers)

    def lease(n: int) -> list[pgqueue.LeasedJob]:
        barrier.wait(timeout=30)
        return app.lease(queue, f"racer-{n}", max=5)

    with ThreadPoolExecutor(racers) as pool:
        return [job for batch in pool.map(lease, range(racers)) for job in batch]
