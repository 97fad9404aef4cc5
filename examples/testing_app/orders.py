"""A tiny application to test: checkout charges an order and enqueues its receipt."""

from __future__ import annotations

import pgqueue

app = pgqueue.App()  # PGQUEUE_DSN in production; the tests point it at a fresh schema

#: Stands in for an email provider.
OUTBOX: list[str] = []


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
