"""A worker of another tenant's schema (tests/test_security_separation.py):
``pgqueue worker --app tests.apps.tenant_tasks:app`` serves schema ``tenant_b``."""

from __future__ import annotations

import os
import time

import pgqueue
from tests.apps.tasks import record

SCHEMA = "tenant_b"

app = pgqueue.App(os.environ.get("PGQUEUE_DSN"), schema=SCHEMA)


@app.task(pass_context=True)
def until_stopped(key: str, context: pgqueue.JobContext) -> str:
    """Runs until asked to stop (at most 60 s)."""
    record("start", key, context.job_id)
    deadline = time.monotonic() + 60
    while not context.should_stop() and time.monotonic() < deadline:
        time.sleep(0.05)
    record("stopped", key, context.job_id, should_stop=context.should_stop())
    return "stopped"
