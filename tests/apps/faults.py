"""The App of the database-fault tests: ``pgqueue worker --app tests.apps.faults:app``.

Its tasks write one side effect per run into ``public.fault_effects`` through
a connection of their own (``FAULTS_EFFECTS_DSN``: without the timeouts the
worker's DSN may carry). A write that meets the fault being injected (a
read-only database, no free connection) is retried until it gets through, so
that a run's side effect is written exactly once; the test then checks from
the database that every job succeeded once and wrote one effect.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

import pgqueue

EFFECTS_DSN_ENV = "FAULTS_EFFECTS_DSN"
EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS public.fault_effects (
    id         bigserial PRIMARY KEY,
    key        integer NOT NULL,
    job_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    pid        integer NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)"""
_INSERT = "INSERT INTO public.fault_effects (key, job_id, attempt_id, pid) VALUES (%s, %s, %s, %s)"
WRITE_DEADLINE = 90.0  # seconds a task keeps trying to write its effect


def create_effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)


def _params(key: int, context: pgqueue.JobContext) -> tuple[Any, ...]:
    return (key, context.job_id, context.attempt_id, os.getpid())


def _write(params: tuple[Any, ...]) -> None:
    deadline = time.monotonic() + WRITE_DEADLINE
    while True:
        try:
            with psycopg.connect(os.environ[EFFECTS_DSN_ENV], autocommit=True) as conn:
                conn.execute(_INSERT, params)
            return
        except psycopg.OperationalError:
            # Connection refused/lost: the insert did not commit (autocommit,
            # one statement), or the connection never opened.
            if time.monotonic() > deadline:
                raise
        except psycopg.errors.ReadOnlySqlTransaction:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def fault_work(key: int, seconds: float, context: pgqueue.JobContext) -> int:
    """Runs in a worker thread: sleeps, then writes its side effect."""
    time.sleep(seconds)
    _write(_params(key, context))
    return key


async def fault_work_async(key: int, seconds: float, context: pgqueue.JobContext) -> int:
    """Runs on the worker's event loop: sleeps, then writes its side effect."""
    await asyncio.sleep(seconds)
    await asyncio.to_thread(_write, _params(key, context))
    return key


def fault_long(key: int, seconds: float, context: pgqueue.JobContext) -> int:
    """Outlives its short lease (LONG_LEASE) unless the heartbeat extends it."""
    return fault_work(key, seconds, context)


#: fault_long's lease: longer than any fault episode of the tests, shorter
#: than its run, so that the heartbeat must extend it through the faults.
LONG_LEASE = 8


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with the tasks above (the test enqueues through one, so that
    the tasks' defaults apply)."""
    built = pgqueue.App(dsn)
    built.task(pass_context=True, max_attempts=20)(fault_work)
    built.task(pass_context=True, max_attempts=20)(fault_work_async)
    built.task(pass_context=True, max_attempts=20, lease_seconds=LONG_LEASE)(fault_long)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
