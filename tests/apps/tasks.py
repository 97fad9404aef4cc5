"""The App that worker tests serve: ``pgqueue worker --app tests.apps.tasks:app``.

The worker process imports this module, so the DSN comes from the
environment (``PGQUEUE_DSN``, set by the test for each worker). Tasks that
the tests need to observe write a row into ``public.task_events`` (created by
:func:`create_events_table`) with the database's ``clock_timestamp()``, so
times of different processes compare on one clock.

Tasks are plain functions registered by :func:`build_app` (with the options in
``TASKS``), so that a test can enqueue through an App of its own that knows the
same tasks: a task's defaults (max_attempts, backoff, lease_seconds) apply only
when the enqueuing App has it registered.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgqueue

QUICK_RETRIES = pgqueue.Backoff(base=0.2, factor=2.0, max=5.0, jitter=0.0)

EVENTS_TABLE = """
CREATE TABLE IF NOT EXISTS public.task_events (
    id     bigserial PRIMARY KEY,
    kind   text NOT NULL,
    key    text,
    job_id bigint,
    pid    integer NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    data   jsonb NOT NULL DEFAULT '{}'
)"""

_INSERT = (
    "INSERT INTO public.task_events (kind, key, job_id, pid, data) VALUES (%s, %s, %s, %s, %s)"
)


def create_events_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EVENTS_TABLE)


def _dsn() -> str:
    return os.environ["PGQUEUE_DSN"]


def record(kind: str, key: str | None = None, job_id: int | None = None, **data: Any) -> None:
    """Write one event row (from a sync task's thread)."""
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(_INSERT, (kind, key, job_id, os.getpid(), Jsonb(data)))


async def record_async(
    kind: str, key: str | None = None, job_id: int | None = None, **data: Any
) -> None:
    """Write one event row without blocking the worker's event loop."""
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await conn.execute(_INSERT, (kind, key, job_id, os.getpid(), Jsonb(data)))


# --- plain outcomes -----------------------------------------------------------


def echo(value: Any) -> Any:
    return value


async def async_echo(value: Any) -> Any:
    await asyncio.sleep(0)
    return {"async": value}


def nap(key: str, seconds: float) -> str:
    """Sleep in a worker thread, recording start and end."""
    record("start", key)
    time.sleep(seconds)
    record("end", key)
    return key


async def async_nap(key: str, seconds: float) -> str:
    """Sleep on the worker's event loop, recording start and end."""
    await record_async("start", key)
    await asyncio.sleep(seconds)
    await record_async("end", key)
    return key


def doze(seconds: float) -> float:
    """Sleep in a thread without touching the database (database-outage tests)."""
    time.sleep(seconds)
    return seconds


async def async_doze(seconds: float) -> float:
    """Sleep on the loop without touching the database (database-outage tests)."""
    await asyncio.sleep(seconds)
    return seconds


def short_lease_nap(key: str, seconds: float, context: pgqueue.JobContext) -> int:
    """Outlives its 2 s lease unless the heartbeat extends it."""
    record("start", key, context.job_id, attempt=context.attempt, attempt_id=context.attempt_id)
    time.sleep(seconds)
    record("end", key, context.job_id, attempt=context.attempt, attempt_id=context.attempt_id)
    return context.attempt


# --- failures -------------------------------------------------------------------


def boom(message: str) -> None:
    raise ValueError(message)


def type_error_inside(value: int) -> None:
    raise TypeError(f"bad value {value}")


def give_up(message: str) -> None:
    raise pgqueue.Permanent(message)


def retry_once(delay: float, context: pgqueue.JobContext) -> int:
    if context.attempt == 1:
        raise pgqueue.Retry(delay=delay)
    return context.attempt


async def async_too_slow(key: str) -> None:
    await record_async("start", key)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await record_async("cancelled", key)
        raise


def sync_too_slow(key: str, seconds: float) -> None:
    record("start", key)
    time.sleep(seconds)
    record("end", key)


# --- context --------------------------------------------------------------------


def context_probe(context: pgqueue.JobContext) -> dict[str, Any]:
    seen = {
        "job_id": context.job_id,
        "attempt": context.attempt,
        "attempt_id": context.attempt_id,
        "queue": context.queue,
        "task": context.task,
        "should_stop": context.should_stop(),
    }
    record("context", None, context.job_id, seen=seen)
    return seen


def until_stopped(key: str, context: pgqueue.JobContext) -> str:
    """Cooperative sync task: runs until should_stop() (at most 60 s)."""
    record("start", key, context.job_id)
    deadline = time.monotonic() + 60
    while not context.should_stop() and time.monotonic() < deadline:
        time.sleep(0.05)
    record("stopped", key, context.job_id, should_stop=context.should_stop())
    return "stopped"


async def async_until_cancelled(key: str, context: pgqueue.JobContext) -> str:
    await record_async("start", key, context.job_id)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await record_async("cancelled", key, context.job_id, should_stop=context.should_stop())
        raise
    return "not cancelled"


# --- the App ----------------------------------------------------------------------

TASKS: dict[Callable[..., Any], dict[str, Any]] = {
    echo: {},
    async_echo: {},
    nap: {},
    async_nap: {},
    doze: {},
    async_doze: {},
    short_lease_nap: {"lease_seconds": 2, "pass_context": True},
    boom: {"max_attempts": 3, "retry": QUICK_RETRIES},
    type_error_inside: {"max_attempts": 2, "retry": QUICK_RETRIES},
    give_up: {},
    retry_once: {"pass_context": True},
    async_too_slow: {"timeout": 0.5, "max_attempts": 1},
    sync_too_slow: {"timeout": 0.5, "max_attempts": 1},
    context_probe: {"queue": "ctx", "pass_context": True},
    until_stopped: {"pass_context": True},
    async_until_cancelled: {"pass_context": True},
}


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with every task above registered (tests enqueue through one, so
    that the tasks' defaults apply)."""
    built = pgqueue.App(dsn)
    for func, options in TASKS.items():
        built.task(**options)(func)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
