"""The App of the chaos suite: ``pgqueue worker --app tests.apps.chaos:app``.

Two tasks with a 2 s lease whose every attempt picks, from a seeded random
draw over (seed, key, attempt), whether it succeeds, raises, raises
``pgqueue.Retry``, raises ``pgqueue.Permanent``, or outlives its lease:

- ``chaos_work`` (sync, in the worker's thread pool) oversleeps its lease
  while the heartbeat keeps extending it;
- ``chaos_stall`` (async) blocks the worker's event loop with ``time.sleep``,
  so the heartbeat cannot run, the lease expires, another worker's reaper
  reclaims the job and leases it again while the first run still goes on.

Each run writes its side effect into ``public.chaos_effects`` (job id,
attempt id, worker pid, start and end on the database clock) in short
autocommit transactions of its own, so the test can compare what ran with
what the queue recorded. The DSN comes from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import psycopg

import pgqueue

LEASE_SECONDS = 2
MAX_ATTEMPTS = 5
QUICK_RETRIES = pgqueue.Backoff(base=0.1, factor=2.0, max=1.0, jitter=0.1)
RETRY_DELAY = 0.2
TASK_APPLICATION_NAME = "chaos-task"

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS public.chaos_effects (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    attempt    integer NOT NULL,
    pid        integer NOT NULL,
    behaviour  text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz,
    UNIQUE (attempt_id, pid)
)"""

# A write retried after its connection broke may already have committed:
# the (attempt_id, pid) key makes the retry a no-op instead of a duplicate.
_START = (
    "INSERT INTO public.chaos_effects (job_id, attempt_id, attempt, pid, behaviour)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (attempt_id, pid) DO NOTHING"
)
_END = (
    "UPDATE public.chaos_effects SET ended_at = clock_timestamp()"
    " WHERE attempt_id = %s AND pid = %s"
)

# Cumulative thresholds of each task's behaviours, drawn once per attempt.
WORK_BEHAVIOURS = (("ok", 0.74), ("raise", 0.86), ("retry", 0.94), ("permanent", 0.97))
WORK_DEFAULT = "oversleep"
STALL_BEHAVIOURS = (("ok", 0.55), ("raise", 0.65), ("retry", 0.75))
STALL_DEFAULT = "stall"


def create_effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)


def behaviour(
    seed: int, key: int, attempt: int, table: tuple[tuple[str, float], ...], default: str
) -> tuple[str, random.Random]:
    """This attempt's behaviour and a random source for its durations."""
    rng = random.Random(f"{seed}:{key}:{attempt}")
    draw = rng.random()
    for name, upto in table:
        if draw < upto:
            return name, rng
    return default, rng


def _dsn() -> str:
    return os.environ["PGQUEUE_DSN"]


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(
        _dsn(), autocommit=True, application_name=TASK_APPLICATION_NAME, connect_timeout=5
    )


_local = threading.local()


def _write(query: str, params: tuple[Any, ...]) -> None:
    """Run one side-effect statement on this thread's connection, reconnecting
    (a few times) when the chaos killed it or restarted the server."""
    for attempt in range(4):
        conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = _local.conn = _connect()
            conn.execute(query, params)
            return
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            _local.conn = None
            if attempt == 3:
                raise
            time.sleep(0.3 * (attempt + 1))


def _finish(name: str) -> None:
    if name == "raise":
        raise ValueError("chaos: the task failed")
    if name == "retry":
        raise pgqueue.Retry(delay=RETRY_DELAY)
    if name == "permanent":
        raise pgqueue.Permanent("chaos: the task gave up")


def chaos_work(seed: int, key: int, context: pgqueue.JobContext) -> int:
    name, rng = behaviour(seed, key, context.attempt, WORK_BEHAVIOURS, WORK_DEFAULT)
    pid = os.getpid()
    _write(_START, (context.job_id, context.attempt_id, context.attempt, pid, name))
    if name == "oversleep":
        time.sleep(rng.uniform(LEASE_SECONDS + 0.5, LEASE_SECONDS + 1.5))
    else:
        time.sleep(rng.uniform(0.002, 0.03))
    _write(_END, (context.attempt_id, pid))
    _finish(name)
    return key


async def _write_async(query: str, params: tuple[Any, ...]) -> None:
    for attempt in range(4):
        try:
            async with await psycopg.AsyncConnection.connect(
                _dsn(),
                autocommit=True,
                application_name=TASK_APPLICATION_NAME,
                connect_timeout=5,
            ) as conn:
                await conn.execute(query, params)
            return
        except psycopg.OperationalError:
            if attempt == 3:
                raise
            await asyncio.sleep(0.3 * (attempt + 1))


async def chaos_stall(seed: int, key: int, context: pgqueue.JobContext) -> int:
    name, rng = behaviour(seed, key, context.attempt, STALL_BEHAVIOURS, STALL_DEFAULT)
    pid = os.getpid()
    await _write_async(_START, (context.job_id, context.attempt_id, context.attempt, pid, name))
    if name == "stall":
        # Deliberately blocks the event loop: no heartbeat, no completion,
        # no reaper in this worker until it returns.
        time.sleep(rng.uniform(LEASE_SECONDS + 0.3, LEASE_SECONDS + 1.5))
    else:
        await asyncio.sleep(rng.uniform(0.002, 0.03))
    await _write_async(_END, (context.attempt_id, pid))
    _finish(name)
    return key


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with both chaos tasks registered (enqueue through one, so that
    the 2 s lease, max_attempts and quick backoff apply)."""
    built = pgqueue.App(dsn, pool_max_size=6, pool_timeout=5.0)
    for func in (chaos_work, chaos_stall):
        built.task(
            lease_seconds=LEASE_SECONDS,
            max_attempts=MAX_ATTEMPTS,
            retry=QUICK_RETRIES,
            pass_context=True,
        )(func)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
