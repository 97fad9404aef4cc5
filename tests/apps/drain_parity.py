"""The App that ``tests/test_drain_parity.py`` runs both under ``pgqueue worker
--app tests.apps.drain_parity:app`` and under ``pgqueue.testing.drain``.

Its middleware tags every job ``svc:orders`` when it is enqueued, records
``wrapper-in`` and ``wrapper-out`` around each run (the task records
``process`` in between) and stores ``{"wrapped": result}`` instead of the
task's result. The steps of its checkout workflow read their dependencies'
(wrapped) results; ``charge_card`` is async and asks for one retry. Records
go to ``public.task_events`` (:func:`tests.apps.tasks.create_events_table`)
with the job id, so that a test compares what each job left behind.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgqueue

_INSERT = (
    "INSERT INTO public.task_events (kind, key, job_id, pid, data) VALUES (%s, %s, %s, %s, %s)"
)


def _row(kind: str, context: pgqueue.JobContext, data: dict[str, Any]) -> tuple[Any, ...]:
    return (kind, context.task, context.job_id, os.getpid(), Jsonb(data))


def record(dsn: str, kind: str, context: pgqueue.JobContext, **data: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_INSERT, _row(kind, context, data))


async def record_async(dsn: str, kind: str, context: pgqueue.JobContext, **data: Any) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(_INSERT, _row(kind, context, data))


class Wrapping(pgqueue.Middleware):
    """Tags, records around each run, and wraps each result."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def before_enqueue(self, spec: pgqueue.JobSpec) -> pgqueue.JobSpec:
        return spec._replace(tags=[*(spec.tags or []), "svc:orders"])

    def process(self, context: pgqueue.JobContext, call_next: Callable[[], Any]) -> Any:
        record(self.dsn, "wrapper-in", context, attempt=context.attempt, tags=context.tags)
        try:
            return {"wrapped": call_next()}
        finally:
            record(self.dsn, "wrapper-out", context, attempt=context.attempt)

    async def process_async(
        self, context: pgqueue.JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        await record_async(
            self.dsn, "wrapper-in", context, attempt=context.attempt, tags=context.tags
        )
        try:
            return {"wrapped": await call_next()}
        finally:
            await record_async(self.dsn, "wrapper-out", context, attempt=context.attempt)


def build_app(dsn: str | None = None) -> pgqueue.App:
    """The App with its middleware and the checkout steps registered."""
    built = pgqueue.App(dsn)
    built.add_middleware(Wrapping(built.dsn))

    @built.task(pass_context=True, queue="orders")
    def fetch_order(order_id: int, context: pgqueue.JobContext) -> dict[str, int]:
        record(built.dsn, "process", context)
        return {"order_id": order_id, "total_cents": 1999}

    @built.task(pass_context=True, queue="payments", retry=pgqueue.Backoff(base=0.2, jitter=0))
    async def charge_card(context: pgqueue.JobContext) -> dict[str, Any]:
        seen = context.dependency_results()
        await record_async(built.dsn, "process", context, seen=seen)
        if context.attempt == 1:
            raise pgqueue.Retry(delay=0.2, reason="card network busy")
        order = seen["fetch_order"]["wrapped"]
        return {"charged_cents": order["total_cents"], "order_id": order["order_id"]}

    @built.task(pass_context=True, queue="orders")
    def ship_order(context: pgqueue.JobContext) -> str:
        seen = context.dependency_results()
        record(built.dsn, "process", context, seen=seen)
        charge = seen["charge_card"]["wrapped"]
        return f"shipped order {charge['order_id']} ({charge['charged_cents']} cents)"

    return built


def checkout(app: pgqueue.App, order_id: int, name: str) -> pgqueue.Workflow:
    """fetch_order, then charge_card, then ship_order (after both)."""
    wf = app.workflow(name)
    fetch = wf.add("fetch_order", {"order_id": order_id})
    charge = wf.add("charge_card", {}, after=fetch)
    wf.add("ship_order", {}, after=[fetch, charge])
    return wf


app = build_app(os.environ.get("PGQUEUE_DSN"))
