"""The lease's scan must keep using the partial index over ready jobs (jobs_ready_idx).

With many finished and scheduled rows around a few thousand ready ones, a
sequential scan or another index would make every lease read the whole table.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
import pytest

from tests.fixtures.factory import JobFactory
from tests.fixtures.postgres import is_ci

LEASE_SCAN = """
EXPLAIN (FORMAT JSON)
SELECT j.id FROM pgqueue.jobs j
WHERE j.queue = %(queue)s AND j.status = 'queued' AND j.run_at <= now()
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT 10
FOR UPDATE SKIP LOCKED
"""


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


@pytest.fixture
def busy_table(job_factory: JobFactory) -> JobFactory:
    """A jobs table shaped like production: mostly finished, some scheduled,
    ready jobs spread over several queues and priorities; analyzed."""
    job_factory.insert_many(60_000, queue="mail", status="succeeded", finished=True)
    job_factory.insert_many(5_000, queue="mail", status="dead", finished=True)
    job_factory.insert_many(5_000, queue="mail", status="scheduled", run_at_offset=3600.0)
    for queue in ("mail", "reports", "default"):
        job_factory.insert_many(2_000, queue=queue, status="queued", priority_modulo=5)
    job_factory.insert_many(500, queue="mail", status="running")
    job_factory.conn.execute("ANALYZE pgqueue.jobs")
    return job_factory


def test_lease_scan_uses_the_ready_index(busy_table: JobFactory) -> None:
    row = busy_table.conn.execute(LEASE_SCAN, {"queue": "mail"}).fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    nodes = plan_nodes(document[0]["Plan"])

    indexes = {n.get("Index Name") for n in nodes if "Index Name" in n}
    assert indexes == {"jobs_ready_idx"}, json.dumps(document, indent=1)
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes)
    # The index gives the order: no sort of the ready jobs.
    assert not any(n["Node Type"] == "Sort" for n in nodes), json.dumps(document, indent=1)


def test_lease_function_uses_the_ready_index(busy_table: JobFactory, db_dsn: str) -> None:
    """The real lease_jobs(), whose plans auto_explain reports from inside plpgsql."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as error:
            if is_ci(os.environ):
                pytest.fail(f"CI=true but auto_explain cannot be loaded: {error}")
            pytest.skip(f"auto_explain is not available: {error}")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET auto_explain.log_format = 'json'")
        conn.execute("SET auto_explain.log_level = 'notice'")
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))

        leased = conn.execute(
            "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'explain-worker', 10)"
        ).fetchall()

    assert len(leased) == 10
    plans = []
    for message in notices:
        _, _, text = message.partition("\n")
        if '"Query Text"' in text:
            plans.append(json.loads(text))
    # The pick filters on ready jobs; staging only *sets* status = 'queued'.
    picking = [p for p in plans if "status = 'queued' AND" in p["Query Text"]]
    assert picking, f"no plan of the lease's pick in {len(plans)} plans"
    for plan in picking:
        nodes = plan_nodes(plan["Plan"])
        scanned = {n.get("Relation Name") for n in nodes if "Scan" in n["Node Type"]}
        used = {n.get("Index Name") for n in nodes if "Index Name" in n}
        assert "jobs_ready_idx" in used, json.dumps(plan, indent=1)
        seq_scans_of_jobs = [
            n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
        ]
        assert seq_scans_of_jobs == [], json.dumps(plan, indent=1)
        assert "jobs" in scanned
