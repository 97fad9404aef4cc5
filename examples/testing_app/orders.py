"""A tiny application to test: checkout charges an order and enqueues its
receipt; fulfilment is a workflow whose shipping step reads what the stock
step reserved; a middleware tags every job and audits every run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pgqueue

#: Stands in for an email provider.
OUTBOX: list[str] = []
#: Stands in for an audit log: what the middleware saw run.
AUDIT: list[str] = []


class Audit(pgqueue.Middleware):
    """Tags every job of this service; records the start and end of each run."""

    def before_enqueue(self, spec: pgqueue.JobSpec) -> pgqueue.JobSpec:
        return spec._replace(tags=[*(spec.tags or []), "svc:orders"])

    def process(self, context: pgqueue.JobContext, call_next: Callable[[], Any]) -> Any:
        AUDIT.append(f"start {context.task}")
        try:
            return call_next()
        finally:
            AUDIT.append(f"end {context.task}")

    async def process_async(
        self, context: pgqueue.JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        AUDIT.append(f"start {context.task}")
        try:
            return await call_next()
        finally:
            AUDIT.append(f"end {context.task}")


# PGQUEUE_DSN in production; the tests point it at a fresh schema.
app = pgqueue.App(middleware=[Audit()])


@app.task(queue="orders", max_attempts=3)
def checkout(order_id: int, total_cents: int) -> dict[str, int]:
    if total_cents <= 0:
        raise pgqueue.Permanent(f"order {order_id}: nothing to charge")
    send_receipt.enqueue(order_id=order_id, email=f"customer-{order_id}@example.com")
    return {"order_id": order_id, "charged_cents": total_cents}


@app.task(queue="mail", pass_context=True, retry=pgqueue.Backoff(base=60))
def send_receipt(order_id: int, email: str, context: pgqueue.JobContext) -> str:
    if email.endswith("@flaky.example") and context.attempt == 1:
        raise ConnectionError("mail server did not answer")
    OUTBOX.append(f"receipt for order {order_id} to {email}")
    return "sent"


@app.task(queue="mail")
async def remind(order_id: int) -> None:
    OUTBOX.append(f"reminder for order {order_id}")


@app.task(queue="orders")
def reserve_stock(order_id: int) -> dict[str, int]:
    return {"order_id": order_id, "reserved": 2}


@app.task(queue="orders", pass_context=True)
def ship(order_id: int, context: pgqueue.JobContext) -> str:
    stock = context.dependency_results()["reserve_stock"]
    return f"shipped {stock['reserved']} items of order {order_id}"


def fulfil(order_id: int) -> pgqueue.WorkflowRun:
    """Reserve the stock, then ship what was reserved."""
    wf = app.workflow(f"fulfil-{order_id}")
    stock = wf.add(reserve_stock, {"order_id": order_id})
    wf.add(ship, {"order_id": order_id}, after=stock)
    return wf.enqueue()
