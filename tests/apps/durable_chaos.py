"""The App of the durable-task fault test: ``pgqueue worker --app tests.apps.durable_chaos:app``.

Two tasks, ``chain`` (sync) and ``async_chain``, with a 3 s lease and no
limit on attempts. Each runs ``steps`` steps; every step's function inserts
a row into ``public.durable_effects`` (job id, step, the attempt id that ran
it, pid) in an autocommit write of its own before it returns, so the rows
count how often each step's function really ran. Halfway the task sleeps
briefly (``context.sleep``) and waits for the event ``go:<job id>``, which
the test sends (some before the job runs, most while it waits).

The DSN comes from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import psycopg

import pgqueue

LEASE_SECONDS = 3
QUICK_RETRIES = pgqueue.Backoff(base=0.1, factor=1.5, max=0.5, jitter=0.1)
TASK_APPLICATION_NAME = "durable-chaos-task"

TABLES = """
CREATE TABLE IF NOT EXISTS public.durable_effects (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    step       text NOT NULL,
    attempt_id bigint NOT NULL,
    pid        integer NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

_EFFECT = (
    "INSERT INTO public.durable_effects (job_id, step, attempt_id, pid) VALUES (%s, %s, %s, %s)"
)


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)


def _connect() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        os.environ["PGQUEUE_DSN"], autocommit=True, application_name=TASK_APPLICATION_NAME
    )


def effect(job_id: int, step: str, attempt_id: int) -> str:
    """A step's side effect: counted by its row, which commits before it returns."""
    time.sleep(random.uniform(0.0, 0.15))
    with _connect() as conn:
        conn.execute(_EFFECT, (job_id, step, attempt_id, os.getpid()))
    return f"{step}@{attempt_id}"


async def async_effect(job_id: int, step: str, attempt_id: int) -> str:
    await asyncio.sleep(random.uniform(0.0, 0.15))
    return await asyncio.to_thread(_insert, job_id, step, attempt_id)


def _insert(job_id: int, step: str, attempt_id: int) -> str:
    with _connect() as conn:
        conn.execute(_EFFECT, (job_id, step, attempt_id, os.getpid()))
    return f"{step}@{attempt_id}"


def chain(steps: int, context: pgqueue.JobContext) -> list[str]:
    done = []
    for i in range(steps):
        done.append(context.step(f"s{i}", effect, context.job_id, f"s{i}", context.attempt_id))
        if i == steps // 2:
            context.sleep(0.2)
            context.wait_for_event(f"go:{context.job_id}")
    return done


async def async_chain(steps: int, context: pgqueue.JobContext) -> list[str]:
    done = []
    for i in range(steps):
        done.append(
            await context.step(f"s{i}", async_effect, context.job_id, f"s{i}", context.attempt_id)
        )
        if i == steps // 2:
            await context.sleep(0.2)
            await context.wait_for_event(f"go:{context.job_id}")
    return done


def build_app(dsn: str | None = None) -> pgqueue.App:
    built = pgqueue.App(dsn)
    options = {
        "pass_context": True,
        "lease_seconds": LEASE_SECONDS,
        "max_attempts": 0,
        "retry": QUICK_RETRIES,
    }
    built.task(**options)(chain)
    built.task(**options)(async_chain)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
