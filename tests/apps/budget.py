"""The App of the connection-budget test: ``pgqueue worker --app tests.apps.budget:app``.

Its pool size comes from ``PGQUEUE_TEST_POOL_MAX`` and its DSN (which names
an ``application_name`` the test counts in ``pg_stat_activity``) from
``PGQUEUE_DSN``.
"""

from __future__ import annotations

import asyncio
import os
import time

import pgqueue

app = pgqueue.App(pool_max_size=int(os.environ.get("PGQUEUE_TEST_POOL_MAX", "4")))


@app.task(queue="budget")
async def async_noop(n: int) -> int:
    await asyncio.sleep(0.001)
    return n


@app.task(queue="budget")
def sync_noop(n: int) -> int:
    time.sleep(0.001)
    return n


@app.task(queue="budget")
def sync_enqueue(n: int) -> int:
    """A sync task that uses the App itself: it draws on the sync pool."""
    return app.enqueue("async_noop", {"n": n}, queue="budget-children").job_id
