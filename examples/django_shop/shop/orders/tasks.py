"""Discovered by pgqueue.contrib.django when Django starts."""

from pgqueue import JobContext
from pgqueue.contrib.django import app


@app.task(pass_context=True, max_attempts=3)
def ship_order(order_id: int, context: JobContext) -> None:
    # The order is marked shipped in the transaction that records this job
    # succeeded: a worker killed half-way leaves neither, never just one.
    with context.transaction() as conn:
        conn.execute("UPDATE orders_order SET shipped = true WHERE id = %s", (order_id,))
