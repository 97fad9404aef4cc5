"""Testing the orders app with pgqueue.testing and the pgqueue pytest plugin.

Run with a PostgreSQL: ``PGQUEUE_TEST_DSN=postgresql://... pytest`` (or
install ``pgqueue[embedded]`` and one is started for the session).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import orders
import pytest

import pgqueue
from pgqueue.testing import DrainResult, assert_enqueued, drain, perform, refute_enqueued


@pytest.fixture
def app(pgqueue_isolated: Callable[[pgqueue.App], pgqueue.App]) -> pgqueue.App:
    orders.OUTBOX.clear()
    orders.AUDIT.clear()
    return pgqueue_isolated(orders.app)  # a fresh migrated schema, dropped after the test


def test_checkout_is_enqueued_not_run(app: pgqueue.App) -> None:
    orders.checkout.enqueue(order_id=42, total_cents=1999)
    [job] = assert_enqueued(app, orders.checkout, payload={"order_id": 42}, count=1)
    assert job.queue == "orders"
    refute_enqueued(app, orders.send_receipt)
    assert orders.OUTBOX == []


def test_checkout_sends_a_receipt(app: pgqueue.App) -> None:
    job_id = orders.checkout.enqueue(order_id=42, total_cents=1999).job_id
    assert drain(app) == DrainResult(succeeded=2)  # checkout, then the receipt it enqueued
    assert app.result(job_id) == {"order_id": 42, "charged_cents": 1999}
    assert orders.OUTBOX == ["receipt for order 42 to customer-42@example.com"]


def test_nothing_to_charge_is_dead_at_once(app: pgqueue.App) -> None:
    job_id = orders.checkout.enqueue(order_id=7, total_cents=0).job_id
    assert drain(app) == DrainResult(dead=1)
    assert app.get_job(job_id).last_error == "Permanent: order 7: nothing to charge"
    refute_enqueued(app, orders.send_receipt)


def test_a_failed_receipt_is_retried_later(app: pgqueue.App) -> None:
    orders.send_receipt.enqueue(order_id=9, email="x@flaky.example")
    assert drain(app) == DrainResult(failed=1)  # its retry is a minute away
    assert_enqueued(app, orders.send_receipt, payload={"order_id": 9})
    assert drain(app, with_scheduled=True) == DrainResult(succeeded=1)
    assert orders.OUTBOX == ["receipt for order 9 to x@flaky.example"]


def test_a_reminder_for_tomorrow_waits(app: pgqueue.App) -> None:
    orders.remind.with_options(delay=timedelta(days=1)).enqueue(order_id=3)
    assert drain(app) == DrainResult()
    [job] = assert_enqueued(app, "remind")
    assert job.status == "scheduled"
    assert drain(app, "mail", with_scheduled=True) == DrainResult(succeeded=1)


def test_every_job_is_tagged_and_every_run_audited(app: pgqueue.App) -> None:
    orders.checkout.enqueue(order_id=42, total_cents=1999)
    [job] = assert_enqueued(app, orders.checkout)
    assert job.tags == ["svc:orders"]  # the app's before_enqueue ran
    assert drain(app) == DrainResult(succeeded=2)
    assert orders.AUDIT == [
        "start checkout",
        "end checkout",
        "start send_receipt",
        "end send_receipt",
    ]
    assert [j.tags for j in app.list_jobs()] == [["svc:orders"], ["svc:orders"]]


def test_fulfilment_ships_what_was_reserved(app: pgqueue.App) -> None:
    run = orders.fulfil(7)
    [waiting] = assert_enqueued(app, orders.ship)
    assert waiting.status == "waiting"  # until reserve_stock succeeded
    assert drain(app) == DrainResult(succeeded=2)
    assert app.result(run.jobs["ship"]) == "shipped 2 items of order 7"
    assert app.get_workflow(run.workflow_id).status == "succeeded"


def test_perform_needs_no_database() -> None:
    orders.OUTBOX.clear()
    assert perform(orders.send_receipt, {"order_id": 1, "email": "a@b.c"}) == "sent"
    with pytest.raises(ConnectionError):
        perform(orders.send_receipt, {"order_id": 1, "email": "a@flaky.example"})
    assert perform(orders.send_receipt, {"order_id": 1, "email": "a@flaky.example"}, attempt=2)
    assert perform(orders.remind, {"order_id": 5}) is None
    assert orders.OUTBOX[-1] == "reminder for order 5"
    assert orders.AUDIT[-2:] == ["start remind", "end remind"]  # perform runs the middleware
