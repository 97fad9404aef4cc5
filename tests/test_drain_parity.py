"""``pgqueue.testing.drain`` runs jobs as ``pgqueue worker`` does: the same
workflow, with a middleware that tags, records and wraps, and steps that read
their dependencies' results, run once by a real worker process and once by
``drain``, leaves the same things stored."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue
from pgqueue.testing import DrainResult, drain
from tests.apps import drain_parity
from tests.fixtures.workers import Workers
from tests.inprocess_worker import quiet_structlog

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]

PARITY_APP = "tests.apps.drain_parity:app"


def _events(dsn: str, job_id: int) -> list[tuple[str, dict[str, Any]]]:
    """What the middleware and the task recorded for one job, in order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT kind, data FROM public.task_events WHERE job_id = %s ORDER BY id", (job_id,)
            )
            .fetchall()
        )
    return [(row["kind"], row["data"]) for row in rows]


def _stored(app: pgqueue.App, dsn: str, run: pgqueue.WorkflowRun) -> dict[str, Any]:
    """Everything a run left behind, without ids and times."""
    found: dict[str, Any] = {"workflow": app.get_workflow(run.workflow_id).status}
    for step, job_id in sorted(run.jobs.items()):
        job = app.get_job(job_id, history=True)
        found[step] = {
            "status": job.status,
            "attempts": job.attempts,
            "result": job.result,
            "tags": job.tags,
            "meta": job.meta,
            "last_error": job.last_error,
            "outcomes": [a.outcome for a in job.attempt_history or []],
            "events": _events(dsn, job_id),
        }
    return found


def test_drain_stores_what_the_worker_stores_with_middleware_and_dependencies(
    workers: Workers, db_dsn: str
) -> None:
    with drain_parity.build_app(db_dsn) as app:
        worker = workers.spawn("--concurrency", "2", "--no-scheduler", app=PARITY_APP)
        worker.wait_registered()
        by_worker = drain_parity.checkout(app, 42, "checkout-worker").enqueue()
        workers.wait_statuses(list(by_worker.jobs.values()))
        worker.send(signal.SIGTERM)
        assert worker.wait_exit() == 0

        by_drain = drain_parity.checkout(app, 42, "checkout-drain").enqueue()
        # The retry of charge_card is not due when the drain begins: a second
        # drain with the clock moved on runs it, and the step released after it.
        assert drain(app) == DrainResult(succeeded=1, failed=1)
        assert drain(app, with_scheduled=True) == DrainResult(succeeded=2)

        expected = _stored(app, db_dsn, by_worker)
        assert _stored(app, db_dsn, by_drain) == expected

    # What both stored, spelled out: the middleware ran around every attempt,
    # its result replaced the task's, and each step saw its dependencies'.
    fetched = {"wrapped": {"order_id": 42, "total_cents": 1999}}
    charged = {"wrapped": {"charged_cents": 1999, "order_id": 42}}
    assert expected["workflow"] == "succeeded"
    assert expected["fetch_order"]["result"] == fetched
    assert expected["charge_card"]["result"] == charged
    assert expected["ship_order"]["result"] == {"wrapped": "shipped order 42 (1999 cents)"}
    assert [expected[step]["tags"] for step in by_drain.jobs] == [["svc:orders"]] * 3
    assert expected["charge_card"]["attempts"] == 2
    assert expected["charge_card"]["outcomes"] == ["retry", "succeeded"]
    tagged = {"attempt": 1, "tags": ["svc:orders"]}
    assert expected["charge_card"]["events"] == [
        ("wrapper-in", tagged),
        ("process", {"seen": {"fetch_order": fetched}}),
        ("wrapper-out", {"attempt": 1}),
        ("wrapper-in", {**tagged, "attempt": 2}),
        ("process", {"seen": {"fetch_order": fetched}}),
        ("wrapper-out", {"attempt": 2}),
    ]
    assert expected["ship_order"]["events"][1] == (
        "process",
        {"seen": {"fetch_order": fetched, "charge_card": charged}},
    )
