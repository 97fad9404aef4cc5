"""Routing across two schemas (or two databases): one producer, one worker.

Customers are sharded by a stable hash of their id over two Apps, here two
schemas of one database (give each App its own DSN to use two servers)::

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres python examples/router.py

It migrates both schemas, enqueues one invoice job per customer through the
router, runs ``pgqueue worker --app examples.router:router`` (one process
serving both Apps) until every job ran, and shows where each one ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pgqueue  # noqa: E402

SCHEMAS = ("shard_us", "shard_eu")


def build_router(dsn: str | None = None) -> pgqueue.Router:
    """Two Apps, one per schema, behind a Router that shards by customer id."""
    router = pgqueue.Router({name: pgqueue.App(dsn, schema=name) for name in SCHEMAS})

    @router.task(queue="billing")
    def send_invoice(customer_id: int, amount_cents: int) -> dict[str, int]:
        return {"customer_id": customer_id, "amount_cents": amount_cents}

    return router


router = build_router(os.environ.get("PGQUEUE_DSN"))


def main() -> int:
    for app in router.apps.values():
        app.migrate()
    placed = []
    for customer_id in range(1, 11):
        key, job = (
            router.tasks["send_invoice"]
            .with_options(shard_key=f"customer:{customer_id}")
            .enqueue(customer_id=customer_id, amount_cents=100 * customer_id)
        )
        placed.append((customer_id, key, job.job_id))
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgqueue_cli", "worker", "--app", "examples.router:router"],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while any(router.get_job(k, j).status != "succeeded" for _, k, j in placed):
            if time.monotonic() > deadline or worker.poll() is not None:
                print("the worker did not finish the jobs", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    for customer_id, key, job_id in placed:
        print(
            f"customer {customer_id:2d} -> {key}: job {job_id}, "
            f"result {router.get_job(key, job_id).result}"
        )
    router.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
