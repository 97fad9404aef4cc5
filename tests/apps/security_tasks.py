"""Tasks for the least-privilege attack tests (tests/test_security_least_privilege.py):
``pgqueue worker --app tests.apps.security_tasks:app``."""

from __future__ import annotations

import os
import time

import pgqueue
from tests.apps.tasks import record

app = pgqueue.App(os.environ.get("PGQUEUE_DSN"))


@app.task(lease_seconds=2, pass_context=True)
def extend_then_sleep(
    key: str, extend_to: float, seconds: float, context: pgqueue.JobContext
) -> int:
    """Asks for a lease far past its 2 s, then outlives the original expiry."""
    context.extend(extend_to)
    record("extended", key, context.job_id, attempt=context.attempt)
    time.sleep(seconds)
    record("end", key, context.job_id, attempt=context.attempt)
    return context.attempt


@app.task(pass_context=True)
def until_stopped(key: str, context: pgqueue.JobContext) -> str:
    """Runs until asked to stop (at most 60 s)."""
    record("start", key, context.job_id)
    deadline = time.monotonic() + 60
    while not context.should_stop() and time.monotonic() < deadline:
        time.sleep(0.05)
    record("stopped", key, context.job_id, should_stop=context.should_stop())
    return "stopped"


@app.task(queue="mail")
def echo(value: int) -> int:
    return value
