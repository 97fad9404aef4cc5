"""Every dashboard statement reads finished jobs through an index, never a
sequential scan, on a table shaped like production (mostly finished jobs).
jobs_live holds only the live jobs: a capped count over it may read it
whole (the planner's choice when most of its rows match), which is bounded
by the backlog, not by the jobs that ever ran."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgqueue.queries import queries_for
from tests.fixtures.factory import JobFactory
from tests.test_query_plan import plan_nodes

NOW = datetime.now(UTC)
#: Stands for "just after the newest finish of the busy table".
LATEST = datetime(1, 1, 1, tzinfo=UTC)

CASES: list[tuple[str, dict[str, Any], set[str]]] = [
    # Overview and queues: app.metrics()'s statements.
    ("queue_metrics", {"cap": 10_000, "queue": None}, set()),
    (
        "queue_status_sample",
        {
            "cap_scheduled": 10_000,
            "cap_dead": 10_000,
            "cap_cancelled": 1_000,
            "cap_succeeded": 1_000,
        },
        {"jobs_finished_idx"},
    ),
    (
        "job_list_finished",
        {
            "status": "succeeded",
            "queue": "reports",
            "task": None,
            "before_finished": NOW,
            "before_id": 10,
            "limit": 51,
        },
        {"jobs_finished_idx"},
    ),
    ("dashboard_throughput", {"per_minute": 250, "hour_cap": 10_000}, {"jobs_finished_idx"}),
    # The job lists (list_jobs, `pgqueue jobs list`, the dashboard's pages):
    # one status, ...
    (
        "job_list",
        {
            "stored_statuses": ["dead"],
            "stored_stages": ["dead"],
            "due": None,
            "queue": "mail",
            "task": None,
            "tags": None,
            "group_key": None,
            "pattern": None,
            "before_id": None,
            "min_id": None,
            "limit": 51,
        },
        set(),
    ),
    # ... a search: free text over the window of ids job_list_window found.
    (
        "job_list",
        {
            "stored_statuses": None,
            "stored_stages": None,
            "due": None,
            "queue": None,
            "task": None,
            "tags": None,
            "group_key": None,
            "pattern": "%needle%",
            "before_id": 50_000,
            "min_id": 45_000,
            "limit": 51,
        },
        {"jobs_pkey"},
    ),
    ("job_list_window", {"before_id": None, "window": 20_000}, {"jobs_pkey"}),
    ("dashboard_dead_groups", {"cap": 10_000}, {"jobs_finished_idx"}),
    (
        "dashboard_dead_group_ids",
        {"task": "factory_task", "after_finished": NOW, "after_id": 10, "limit": 500},
        {"jobs_finished_idx"},
    ),
    # The tasks page: task_stats(sample=) (the registry's statistics).
    ("task_stats_window", {"since": NOW, "sample": 5_000}, {"jobs_finished_idx"}),
    # ... then over the narrow window that task_stats_window found: just
    # after the newest finish (LATEST), in the leaves that hold the jobs (an
    # hour ahead would cross into tomorrow's empty leaves near midnight).
    ("task_stats", {"since": LATEST, "task": None}, {"jobs_finished_idx"}),
    ("dashboard_change_mark", {}, set()),
    (
        "job_cancel",
        {
            "job_ids": [1, 2, 3],
            "queue": None,
            "task": None,
            "statuses": ["queued", "scheduled", "running", "waiting"],
            "limit": 3,
            "reask": False,
            "workflow_id": None,
            "reason": None,
        },
        {"jobs_pkey"},
    ),
]


@pytest.fixture
def busy_table(job_factory: JobFactory) -> JobFactory:
    job_factory.insert_many(60_000, queue="mail", status="succeeded", finished=True)
    job_factory.insert_many(5_000, queue="mail", status="dead", finished=True)
    job_factory.insert_many(3_000, queue="mail", status="cancelled", finished=True)
    job_factory.insert_many(3_000, queue="mail", status="scheduled", run_at_offset=3600.0)
    for queue in ("mail", "reports"):
        job_factory.insert_many(2_000, queue=queue, status="queued")
    job_factory.insert_many(300, queue="mail", status="running")
    job_factory.conn.execute("ANALYZE pgqueue.jobs")
    return job_factory


def test_every_dashboard_statement_uses_an_index(busy_table: JobFactory) -> None:
    queries = queries_for("pgqueue")
    # The leaves made ahead for finish times still to come hold nothing:
    # reading them whole is reading nothing.
    empty = {
        r[0]
        for r in busy_table.conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid"
            " WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind = 'r'"
            " AND c.reltuples = 0"
        )
    }
    [(newest,)] = busy_table.conn.execute("SELECT max(finished_at) FROM pgqueue.jobs")
    just_after = newest + timedelta(microseconds=1)
    for name, given, expected in CASES:
        params = {k: just_after if v is LATEST else v for k, v in given.items()}
        statement = queries[name]  # type: ignore[index]
        conn = busy_table.conn
        # A rolled-back transaction: EXPLAIN ANALYZE would run the cancel.
        with conn.transaction(force_rollback=True):
            row = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
        assert row is not None
        document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        nodes = plan_nodes(document[0]["Plan"])
        for sub in document[0]["Plan"].get("Plans", []):
            nodes += plan_nodes(sub)
        scans = [n for n in nodes if _of_jobs(n.get("Relation Name"))]
        assert scans, name
        seq = [
            n
            for n in scans
            if n["Node Type"] == "Seq Scan"
            and n.get("Relation Name") != "jobs_live"
            and n.get("Relation Name") not in empty
        ]
        assert not seq, (name, json.dumps(document, indent=1)[:3000])
        used = {_kind(n["Index Name"]) for n in nodes if "Index Name" in n}
        assert expected <= used, (name, used)


def _of_jobs(relation: str | None) -> bool:
    """jobs_live, or a leaf of a finished partition (jobs_succeeded_default, ...)."""
    return bool(relation) and relation.startswith("jobs") and relation != "jobs_archive"


def _kind(index: str) -> str:
    """The index of sql/schema.sql a partition's index comes from: a leaf's
    indexes are named after the leaf (jobs_dead_default_finished_at_queue_idx)."""
    if "finished_at" in index:
        return "jobs_finished_idx"
    if index == "jobs_pkey" or index.endswith("_id_idx"):
        return "jobs_pkey"
    return index
