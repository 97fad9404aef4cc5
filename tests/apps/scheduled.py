"""The App of the scheduler tests: ``pgqueue worker --app tests.apps.scheduled:app``.

Its one task is periodic, every second; each worker running the scheduler
registers that schedule when it starts. The DSN comes from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import pgqueue

app = pgqueue.App(pool_max_size=4)

EVERY_SECOND = "every-second"


@app.periodic(cron="* * * * * *", name=EVERY_SECOND)
@app.task(queue="ticks")
def tick() -> None:
    """Does nothing: the tests count the jobs the schedule enqueued, by run_at."""
