"""The lease's scan must keep using the partial index over live jobs (jobs_ready_idx,
``stage = 'queued'``: queued and running, so that the lease is a HOT update).

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
WHERE j.queue = %(queue)s AND j.stage = 'queued' AND j.status = 'queued' AND NOT j.serial_held
  AND j.run_at <= now()
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


def _load_auto_explain(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error as error:
        if is_ci(os.environ):
            pytest.fail(f"CI=true but auto_explain cannot be loaded: {error}")
        pytest.skip(f"auto_explain is not available: {error}")


def _explained(
    conn: psycopg.Connection[Any], statement: str
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Run ``statement`` with auto_explain (loaded) on: its rows, and the plans
    of the statements it ran, nested ones included."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_format = 'json'")
    conn.execute("SET auto_explain.log_level = 'notice'")
    rows = conn.execute(statement).fetchall()
    conn.execute("SET auto_explain.log_min_duration = -1")
    plans = []
    for message in notices:
        _, _, text = message.partition("\n")
        if '"Query Text"' in text:
            plans.append(json.loads(text))
    return rows, plans


def test_lease_function_uses_the_ready_index(busy_table: JobFactory, db_dsn: str) -> None:
    """The real lease_jobs(), whose plans auto_explain reports from inside plpgsql."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _load_auto_explain(conn)
        leased, plans = _explained(
            conn, "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'explain-worker', 10)"
        )

    assert len(leased) == 10
    # The pick filters on ready jobs; staging only *sets* status = 'queued'.
    picking = [p for p in plans if "status = 'queued' AND" in p["Query Text"]]
    assert picking, f"no plan of the lease's pick in {len(plans)} plans"
    for plan in picking:
        nodes = plan_nodes(plan["Plan"])
        scanned = {n.get("Relation Name") for n in nodes if "Scan" in n["Node Type"]}
        used = {n.get("Index Name") for n in nodes if "Index Name" in n}
        assert "jobs_ready_idx" in used, json.dumps(plan, indent=1)
        seq_scans_of_jobs = [
            n
            for n in nodes
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs_live"
        ]
        assert seq_scans_of_jobs == [], json.dumps(plan, indent=1)
        assert "jobs_live" in scanned


def test_cached_lease_plan_survives_a_bulk_load(job_factory: JobFactory, db_dsn: str) -> None:
    """lease_jobs keeps its plans across calls (migration 0004). A plan cached
    while the table was tiny must not turn into a scan of the whole table once
    a backlog arrives, before autovacuum has analyzed it: the plan's shape is
    pinned to the partial indexes, whatever the statistics say."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _load_auto_explain(conn)
        # A long-lived worker session on an almost empty table: after five
        # custom plans the server may switch to cached generic ones.
        for _ in range(12):
            job_factory.insert_many(1, queue="mail", status="queued")
            assert conn.execute(
                "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'w', 5)"
            ).fetchall()
        job_factory.insert_many(100_000, queue="mail", status="succeeded", finished=True)
        job_factory.insert_many(20_000, queue="mail", status="queued", priority_modulo=5)

        _, plans = _explained(conn, "SELECT * FROM pgqueue.lease_jobs(ARRAY['mail'], 'w', 5)")

    assert plans, "auto_explain reported no plans"
    for plan in plans:
        nodes = plan_nodes(plan["Plan"])
        seq_scans = [
            n
            for n in nodes
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs_live"
        ]
        assert seq_scans == [], json.dumps(plan, indent=1)
    picking = [p for p in plans if "status = 'queued' AND" in p["Query Text"]]
    assert picking, f"no plan of the lease's pick in {len(plans)} plans"
    for plan in picking:
        nodes = plan_nodes(plan["Plan"])
        assert "jobs_ready_idx" in {n.get("Index Name") for n in nodes}, json.dumps(plan, indent=1)
        # The ready index gives the order: no sort of the scanned jobs (the
        # one sort left orders the returned batch, keyed on the CTE's rows).
        pick_sorts = [
            n
            for n in nodes
            if n["Node Type"] == "Sort" and any(k.startswith("j.") for k in n["Sort Key"])
        ]
        assert pick_sorts == [], json.dumps(plan, indent=1)


def test_lease_updates_the_rows_it_locked_by_tid(busy_table: JobFactory, db_dsn: str) -> None:
    """The lease's update fetches the row versions its pick locked by ctid (a
    TID scan, 0011), not by one primary-key descent per job."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _load_auto_explain(conn)
        leased, plans = _explained(
            conn, "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'explain-worker', 50)"
        )
        running = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s) AND status = 'running'"
            " AND worker_id = 'explain-worker'",
            ([r[0] for r in leased],),
        ).fetchone()

    assert len(leased) == 50
    assert running == (50,)
    picking = [p for p in plans if "status = 'queued' AND" in p["Query Text"]]
    assert picking, f"no plan of the lease's pick in {len(plans)} plans"
    for plan in picking:
        nodes = plan_nodes(plan["Plan"])
        updates = [n for n in nodes if n["Node Type"] == "ModifyTable"]
        assert updates, json.dumps(plan, indent=1)
        assert any(n["Node Type"] == "Tid Scan" for n in nodes), json.dumps(plan, indent=1)
        assert "jobs_pkey" not in {n.get("Index Name") for n in nodes}, json.dumps(plan, indent=1)


def test_ack_probes_the_primary_key_once_per_job(job_factory: JobFactory, db_dsn: str) -> None:
    """ack_jobs keeps one generic plan per session (0011). Planned while few
    jobs ran, it must still find each acked job by its primary key once
    thousands run: a scan of every running job per ack (or per acked job)
    would make completions slower the bigger the fleet."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _load_auto_explain(conn)
        # A long-lived worker session acking small batches on a tiny table.
        for _ in range(8):
            job_factory.insert_many(2, queue="mail", status="queued")
            leased = conn.execute(
                "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'w', 2)"
            ).fetchall()
            acked = conn.execute(
                "SELECT job_id FROM pgqueue.ack_jobs(%s, %s, NULL)",
                ([r[0] for r in leased], [r[1] for r in leased]),
            ).fetchall()
            assert len(acked) == len(leased) == 2
        job_factory.insert_many(3_000, queue="mail", status="running")
        job_factory.insert_many(50_000, queue="mail", status="succeeded", finished=True)
        job_factory.insert_many(20, queue="mail", status="queued")
        conn.execute("ANALYZE pgqueue.jobs")
        leased = conn.execute(
            "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'w', 20)"
        ).fetchall()
        assert len(leased) == 20
        # A stale attempt id is refused in the same batch.
        job_ids = [r[0] for r in leased] + [leased[0][0]]
        attempt_ids = [r[1] for r in leased] + [leased[0][1] - 1_000_000]
        acked, plans = _explained(
            conn,
            conn.execute(
                "SELECT format('SELECT job_id, attempt_id FROM pgqueue.ack_jobs(%%L, %%L, NULL)',"
                " %s::bigint[], %s::bigint[])",
                (job_ids, attempt_ids),
            ).fetchone()[0],
        )
        states = conn.execute(
            "SELECT status::text, count(*) FROM pgqueue.jobs WHERE id = ANY(%s) GROUP BY 1",
            (job_ids,),
        ).fetchall()

    assert sorted(acked) == sorted(leased)
    assert states == [("succeeded", 20)]
    # The ack moves each row (finish_jobs: DELETE from jobs_live, INSERT into jobs).
    updating = [
        p for p in plans if "DELETE FROM" in p["Query Text"] and "jobs_live" in p["Query Text"]
    ]
    assert updating, f"no plan of the ack's move in {len(plans)} plans"
    for plan in updating:
        nodes = plan_nodes(plan["Plan"])
        used = {n.get("Index Name") for n in nodes if "Index Name" in n}
        assert "jobs_pkey" in used, json.dumps(plan, indent=1)
        assert "jobs_running_idx" not in used, json.dumps(plan, indent=1)
        assert not any(
            n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")
            and n.get("Relation Name") == "jobs_live"
            for n in nodes
        ), json.dumps(plan, indent=1)
