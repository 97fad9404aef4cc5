"""The lease of a worker keeping metrics or traces (0016): lease_jobs returns
each job's run_at and trace context, so the observed lease is the same single
statement as the plain one; upgrades and downgrades keep who may lease."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.ops import consume
from tests.test_security_grants import Roles

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def db_roles(pg_server_dsn: str) -> Iterator[Roles]:
    made = Roles(pg_server_dsn)
    try:
        yield made
    finally:
        made.drop_all()


def _stored_wait(dsn: str, job_id: int) -> float:
    """Seconds from the job's run_at to its attempt's start, as stored in its row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM attempt_started_at - run_at)::float8"
            " FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def test_lease_jobs_returns_run_at_and_trace_context(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        traced = conn.execute(
            "SELECT pgqueue.enqueue('t', '{}', run_at => now() - interval '90 seconds',"
            " traceparent => %s)",
            (TRACEPARENT,),
        ).fetchone()
        plain = conn.execute("SELECT pgqueue.enqueue('t', '{}')").fetchone()
        assert traced is not None
        assert plain is not None
        stored = dict(conn.execute("SELECT id, run_at FROM pgqueue.jobs").fetchall())
        rows = conn.execute(
            "SELECT job_id, run_at, trace_context, lease_expires_at, lease_seconds"
            " FROM pgqueue.lease_jobs(ARRAY['default'], 'w', 10)"
        ).fetchall()
    by_id = {r[0]: r for r in rows}
    assert set(by_id) == {traced[0], plain[0]}
    assert by_id[traced[0]][1] == stored[traced[0]]
    assert by_id[traced[0]][2] == {"traceparent": TRACEPARENT}
    assert by_id[plain[0]][2] is None
    # The attempt's start, as the lease stored it, follows from the returned columns.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT attempt_started_at FROM pgqueue.jobs WHERE id = %s", (traced[0],)
        ).fetchone()
    assert row is not None
    assert by_id[traced[0]][3] - timedelta(seconds=by_id[traced[0]][4]) == row[0]


def test_observed_lease_reads_wait_and_trace_from_the_one_call(app: pgqueue.App) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pgqueue.enqueue('t', '{\"n\": 1}', run_at => now() - interval '90 seconds',"
            " traceparent => %s)",
            (TRACEPARENT,),
        )
    [job] = app._database.run(consume.lease(app.op_context, "default", "w", 5, details=True))
    assert job.payload == {"n": 1}
    assert job.wait_seconds == pytest.approx(_stored_wait(app.dsn, job.job_id), abs=1e-6)
    assert job.wait_seconds >= 90.0
    assert job.trace_context == {"traceparent": TRACEPARENT}
    assert "lease_jobs_observed" not in app._queries["job_lease_observed"]


def test_previous_workers_lease_through_lease_jobs_observed(db_dsn: str) -> None:
    """Workers of the previous release call lease_jobs_observed during a rolling upgrade."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pgqueue.enqueue('t', run_at => now() - interval '1 minute')")
        rows = conn.execute(
            "SELECT job_id, wait_seconds, trace_context"
            " FROM pgqueue.lease_jobs_observed(ARRAY['default'], 'old-worker', 5)"
        ).fetchall()
        status = conn.execute("SELECT status::text, worker_id FROM pgqueue.jobs").fetchall()
    assert len(rows) == 1
    assert rows[0][1] == pytest.approx(_stored_wait(db_dsn, rows[0][0]), abs=1e-6)
    assert rows[0][1] >= 60.0
    assert rows[0][2] is None
    assert status == [("running", "old-worker")]
