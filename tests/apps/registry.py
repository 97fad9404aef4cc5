"""Apps for the task registry tests (``tests.apps.registry:app`` and
``:app_without_mail``).

``reg_hold`` records its start and end in ``public.task_events`` and runs
``seconds``; ``reg_mail`` declares non-default options so that a producer
that never imported it can be checked against them.
"""

from __future__ import annotations

import os
import time

import pgqueue
from tests.apps.tasks import record


def reg_hold(seconds: float, context: pgqueue.JobContext) -> int:
    record("start", context.task, context.job_id)
    time.sleep(seconds)
    record("end", context.task, context.job_id)
    return context.job_id


def reg_mail(to: str) -> str:
    return f"sent to {to}"


def reg_fail(message: str) -> None:
    raise RuntimeError(message)


def reg_slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def build_app(dsn: str | None = None, *, with_mail: bool = True) -> pgqueue.App:
    built = pgqueue.App(dsn)
    built.task(pass_context=True)(reg_hold)
    built.task(name="reg_hold_other", pass_context=True)(reg_hold)
    built.task(pass_context=True, name="reg_hold_third")(reg_hold)
    if with_mail:
        built.task(queue="mail", priority=3, max_attempts=2, lease_seconds=120)(reg_mail)
    built.task(max_attempts=0, retry=pgqueue.Backoff(base=0.05, factor=1.0, max=0.05, jitter=0))(
        reg_fail
    )
    built.task(timeout=30)(reg_slow)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
app_without_mail = build_app(os.environ.get("PGQUEUE_DSN"), with_mail=False)
