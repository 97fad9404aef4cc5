"""The App a worker serves as a role granted ``pgqueue grant --worker`` only:
``pgqueue worker --app tests.apps.least_privilege:app``.

Its tasks cover every write a worker makes: ack (``ok``), fail and retry
(``flaky``), dead-letter (``hopeless``), a job enqueued from inside a task
(``spawn``), and a periodic schedule the scheduler registers and fires. The
DSN comes from ``PGQUEUE_DSN`` (the worker role's).
"""

from __future__ import annotations

import pgqueue

app = pgqueue.App(pool_max_size=4)

QUICK = pgqueue.Backoff(base=0.1, factor=1.0, max=0.1, jitter=0.0)
PERIODIC = "least-privilege-tick"


@app.task(queue="lp")
def ok(n: int) -> int:
    return n


@app.task(queue="lp", max_attempts=3, retry=QUICK, pass_context=True)
def flaky(context: pgqueue.JobContext) -> str:
    if context.attempt < 2:
        raise RuntimeError("first attempt fails")
    return "second attempt"


@app.task(queue="lp", max_attempts=1)
def hopeless() -> None:
    raise pgqueue.Permanent("never works")


@app.task(queue="lp")
def spawn(n: int) -> int:
    """Enqueues a child job through the App's sync pool, as the worker role."""
    return app.enqueue("ok", {"n": n}).job_id


@app.periodic(cron="* * * * * *", name=PERIODIC)
@app.task(queue="lp-ticks")
def tick() -> None:
    """Fires every second: the scheduler upserts and fires its schedule as the worker role."""
