"""The App of the workflow chaos test: ``pgqueue worker --app tests.apps.workflow_chaos:app``.

One task, ``wf_step(key, sleep, fail)``, with a 2 s lease. Every run:

1. records itself in ``public.wf_runs`` (job id, attempt id, pid, the
   database's ``clock_timestamp()`` and the dependency statuses the step
   saw) in an autocommit write of its own, before doing anything else;
2. sleeps ``sleep`` seconds (longer than the lease for some steps: the
   heartbeat must keep it);
3. raises :class:`pgqueue.Permanent` when ``fail`` (the job goes ``dead``), or
   completes inside ``context.transaction()`` inserting a row into
   ``public.wf_success``: that row commits if and only if the ack does, so
   the rows of a job count its successful completions exactly, whatever
   SIGKILLs and terminated backends did to the runs before.

The DSN comes from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgqueue

LEASE_SECONDS = 2
MAX_ATTEMPTS = 30  # kills and terminated backends cost attempts; none may run out
QUICK_RETRIES = pgqueue.Backoff(base=0.1, factor=1.5, max=0.5, jitter=0.1)
TASK_APPLICATION_NAME = "wf-chaos-task"

TABLES = """
CREATE TABLE IF NOT EXISTS public.wf_runs (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    attempt    integer NOT NULL,
    pid        integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    saw        jsonb NOT NULL,
    UNIQUE (attempt_id, pid)
);
CREATE TABLE IF NOT EXISTS public.wf_success (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    pid        integer NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

# A write retried after its connection broke may have committed already.
_RUN = (
    "INSERT INTO public.wf_runs (job_id, attempt_id, attempt, pid, saw)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (attempt_id, pid) DO NOTHING"
)
_SUCCESS = "INSERT INTO public.wf_success (job_id, attempt_id, pid) VALUES (%s, %s, %s)"


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)


_local = threading.local()


def _record_run(params: tuple[Any, ...]) -> None:
    """One autocommit insert on this thread's connection, reconnecting a few
    times when the chaos terminated it."""
    for attempt in range(4):
        conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = _local.conn = psycopg.connect(
                    os.environ["PGQUEUE_DSN"],
                    autocommit=True,
                    application_name=TASK_APPLICATION_NAME,
                    connect_timeout=5,
                )
            conn.execute(_RUN, params)
            return
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            _local.conn = None
            if attempt == 3:
                raise
            time.sleep(0.2 * (attempt + 1))


def wf_step(key: str, context: pgqueue.JobContext, sleep: float = 0.0, fail: bool = False) -> None:
    saw = {name: status.value for name, status in context.dependency_statuses().items()}
    _record_run((context.job_id, context.attempt_id, context.attempt, os.getpid(), Jsonb(saw)))
    if sleep:
        time.sleep(sleep)
    if fail:
        raise pgqueue.Permanent(f"{key}: fails by design")
    with context.transaction() as conn:
        conn.execute(_SUCCESS, (context.job_id, context.attempt_id, os.getpid()))


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with ``wf_step`` registered (enqueue through one so that its
    lease, attempts and backoff apply)."""
    built = pgqueue.App(dsn, pool_max_size=6, pool_timeout=5.0)
    built.task(
        lease_seconds=LEASE_SECONDS,
        max_attempts=MAX_ATTEMPTS,
        retry=QUICK_RETRIES,
        pass_context=True,
    )(wf_step)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
