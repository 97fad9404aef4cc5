"""The App of the hostile-input worker test: ``pgqueue worker --app tests.apps.hostile:app``.

``raise_hostile`` fails with a message and traceback PostgreSQL cannot store
as is (a NUL, a lone surrogate); ``fine`` succeeds. Both run in the same
lease batch: one bad error text must not take the other job's outcome with it.
The DSN comes from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import pgqueue

app = pgqueue.App(pool_max_size=4)

HOSTILE_MESSAGE = "nul \x00 here; surrogate \udc80 there; quote ' and \"; semicolon;"


class HostileError(Exception):
    pass


@app.task(queue="hostile", max_attempts=1)
def raise_hostile() -> None:
    raise HostileError(HOSTILE_MESSAGE)


@app.task(queue="hostile", max_attempts=2, retry=pgqueue.Backoff(base=0.1, jitter=0.0))
def retry_hostile() -> None:
    raise pgqueue.Retry(delay=0.1, reason=HOSTILE_MESSAGE)


@app.task(queue="hostile")
def fine(n: int) -> int:
    return n
