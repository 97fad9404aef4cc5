"""The public API as a user's type-checked project sees it.

CI runs ``mypy --strict examples/typed_usage.py`` (see .ci/run and
tests/test_typed_api.py): pgqueue ships ``py.typed``, so a mistake below —
a wrong option type, a misspelt field — fails that check.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg

import pgqueue

app = pgqueue.App(schema="pgqueue", max_payload_bytes=1 << 20)


@app.task(queue="mail", max_attempts=3, retry=pgqueue.Backoff(base=2.0), pass_context=True)
def send_receipt(order_id: int, context: pgqueue.JobContext) -> None:
    with context.transaction() as conn:
        conn.execute("UPDATE orders SET receipt_sent = true WHERE id = %s", (order_id,))
    if context.should_stop():
        return


@app.task
async def reindex(document_id: int) -> int:
    await asyncio.sleep(0)
    return document_id


@app.periodic(cron="0 3 * * *", timezone="Europe/Berlin")
@app.task(name="nightly")
def nightly() -> None: ...


def produce(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    first: pgqueue.Enqueued = send_receipt.enqueue(order_id=1)
    windowed = send_receipt.with_options(
        dedup_key="receipt:1", dedup_window=timedelta(hours=1), conn=conn
    ).enqueue(order_id=1)
    debounced = app.enqueue("reindex", {"document_id": 7}, dedup_key="doc:7", debounce=30.0)
    many: list[pgqueue.Enqueued] = app.enqueue_many(
        [pgqueue.JobSpec("reindex", {"document_id": n}, priority=1) for n in range(3)],
        conn=conn,
    )
    created: bool = windowed.created
    assert created or not debounced.created
    return [first.job_id, windowed.job_id, *(e.job_id for e in many)]


async def produce_async(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
    result = await app.enqueue_async("reindex", {"document_id": 1}, conn=conn, delay=5)
    job: pgqueue.Job = await app.get_job_async(result.job_id)
    status: pgqueue.JobStatus = job.status
    return job.id if status is not pgqueue.JobStatus.DEAD else -1


def operate() -> None:
    page: pgqueue.Page = app.list_jobs(queue="mail", status="dead", limit=10)
    for job in page.jobs:
        app.requeue_dead(job.id)
    metrics: dict[str, pgqueue.QueueMetrics] = app.metrics()
    ready_age: float | None = metrics["mail"].oldest_ready_age_seconds if metrics else None
    print(ready_age, page.next_cursor)
    leased: list[pgqueue.LeasedJob] = app.lease("mail", "my-consumer", max=5)
    for item in leased:
        try:
            app.ack(item, result={"ok": True})
        except pgqueue.LeaseLost:
            pass


if __name__ == "__main__":
    app.run_worker(queues=["mail"], concurrency=4)
