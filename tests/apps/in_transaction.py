"""Tasks that complete in their own transaction, for the crash test:
``pgqueue worker --app tests.apps.in_transaction:app`` (DSN from PGQUEUE_DSN).

Each job inserts one row into ``public.tx_effects`` inside
``context.transaction()``; short random pauses before, inside and after the
block spread a SIGKILL over every phase (before the write, between the
write and the commit, after the commit)."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pgqueue

EFFECTS_TABLE = "CREATE TABLE IF NOT EXISTS public.tx_effects (job_id bigint NOT NULL, pid int)"
LEASE_SECONDS = 2
QUICK = pgqueue.Backoff(base=0.1, factor=1.0, max=0.5, jitter=0.0)

app = pgqueue.App(dsn=os.environ.get("PGQUEUE_DSN"), pool_min_size=0)


@app.task(pass_context=True, lease_seconds=LEASE_SECONDS, max_attempts=100, retry=QUICK)
def tx_insert(context: pgqueue.JobContext, pause: float = 0.05) -> None:
    time.sleep(random.uniform(0, pause))
    with context.transaction() as conn:
        conn.execute(
            "INSERT INTO public.tx_effects (job_id, pid) VALUES (%s, %s)",
            (context.job_id, os.getpid()),
        )
        time.sleep(random.uniform(0, pause))
    time.sleep(random.uniform(0, pause))


@app.task(pass_context=True, lease_seconds=LEASE_SECONDS, max_attempts=100, retry=QUICK)
async def tx_insert_async(context: pgqueue.JobContext, pause: float = 0.05) -> None:
    await asyncio.sleep(random.uniform(0, pause))
    async with context.transaction() as conn:
        await conn.execute(
            "INSERT INTO public.tx_effects (job_id, pid) VALUES (%s, %s)",
            (context.job_id, os.getpid()),
        )
        await asyncio.sleep(random.uniform(0, pause))
    await asyncio.sleep(random.uniform(0, pause))
