"""The App that flow-control tests serve: ``pgqueue worker --app tests.apps.flow:app``.

Like :mod:`tests.apps.tasks`, the worker process imports this module and
takes its DSN from ``PGQUEUE_DSN``; tasks write their start and end into
``public.task_events`` (see :func:`tests.apps.tasks.record`) with the
database's ``clock_timestamp()``, so that times of several worker processes
compare on one clock.

``flow_hold`` runs until a *gate file* exists, so a test decides when a job
ends without racing a sleep: the file lives on the test machine's disk (the
workers run there too) and waiting for it holds no database connection, so a
test can keep many jobs running without filling the server's connection slots.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pgqueue
from tests.apps.tasks import QUICK_RETRIES, async_until_cancelled, record, until_stopped

#: A held job gives up after this many seconds, so a failed test never leaves
#: a worker thread behind for long.
HOLD_LIMIT = 120.0


def flow_sleep(seconds: float, context: pgqueue.JobContext) -> int:
    """Sleep in a worker thread between a recorded start and end."""
    record("start", None, context.job_id, attempt_id=context.attempt_id)
    time.sleep(seconds)
    record("end", None, context.job_id, attempt_id=context.attempt_id)
    return context.job_id


def flow_hold(gate: str, context: pgqueue.JobContext) -> str:
    """Run until the file ``gate`` exists (at most HOLD_LIMIT seconds)."""
    record("start", gate, context.job_id, attempt_id=context.attempt_id)
    path = Path(gate)
    deadline = time.monotonic() + HOLD_LIMIT
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    released = path.exists()
    record("end", gate, context.job_id, attempt_id=context.attempt_id, released=released)
    return "released" if released else "gave up"


def flow_nap(seconds: float) -> float:
    """Sleep in a worker thread without touching the database (a busy stream of jobs)."""
    time.sleep(seconds)
    return seconds


def flow_tick(n: int) -> int:
    """A job that ends at once (rate-limit tests count its lease starts)."""
    return n


def flow_hang(context: pgqueue.JobContext) -> None:
    """Never ends by itself (its worker is SIGKILLed); its lease is 2 s."""
    record("start", None, context.job_id, attempt_id=context.attempt_id)
    time.sleep(HOLD_LIMIT)


TASKS: dict[Callable[..., Any], dict[str, Any]] = {
    flow_sleep: {"pass_context": True},
    flow_hold: {"pass_context": True},
    flow_nap: {},
    flow_tick: {},
    flow_hang: {"pass_context": True, "lease_seconds": 2},
    # Quick retries: were a cancelled attempt recorded as a plain failure, the
    # retry would come within a fraction of a second, where a test sees it.
    until_stopped: {"pass_context": True, "max_attempts": 3, "retry": QUICK_RETRIES},
    async_until_cancelled: {"pass_context": True, "max_attempts": 3, "retry": QUICK_RETRIES},
}


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with every task above registered (tests enqueue through one, so
    that the tasks' defaults apply)."""
    built = pgqueue.App(dsn)
    for func, options in TASKS.items():
        built.task(**options)(func)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
