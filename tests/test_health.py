"""The library side of the operator commands: App.check() and the helpers the
CLI needs (counts, bulk requeue, vacuum), sync and async."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.health_report import HealthCheck, HealthReport
from pgqueue.ops.health import ServerClock, _clock_check, check
from pgqueue.ops.maintenance import VACUUM_TABLES
from pgqueue.queries import queries_for
from tests.fixtures.factory import JobFactory

pytestmark = pytest.mark.timeout(120)


def verdicts(report: HealthReport) -> dict[str, bool]:
    return {c.name: c.ok for c in report.checks}


def test_a_fresh_database_is_healthy(app: pgqueue.App) -> None:
    report = app.check()
    assert report.ok
    assert verdicts(report) == {
        "connection": True,
        "clock_skew": True,
        "schema": True,
        "stuck_jobs": True,
        "dead_workers": True,
        "queue_backlog": True,
    }
    assert report.schema_revision == report.expected_revision
    assert report.server_version
    assert report.clock_skew_seconds is not None
    assert abs(report.clock_skew_seconds) < 5
    assert report.failures == []


def test_check_finds_stuck_jobs_dead_workers_and_backlog(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    # A silent worker fails the check while it holds running jobs (not once reaped).
    stuck = [
        job_factory.insert(status="running", lease_expires_at=-60.0 * i, worker_id="gone")
        for i in (1, 2)
    ]
    job_factory.insert(status="running", lease_expires_at=60.0)  # alive
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.workers (id, host, pid, concurrency, last_heartbeat_at) VALUES"
            " ('gone', 'h', 1, 1, now() - interval '2 minutes'),"
            " ('slow', 'h', 2, 1, now() - interval '30 seconds')"
        )
    job_factory.insert(queue="late", run_at=-900.0)
    job_factory.insert(queue="due_scheduled", status="scheduled", run_at=-900.0)  # not staged yet
    job_factory.insert(queue="fresh", run_at=-10.0)
    job_factory.insert(queue="held", run_at=-900.0)
    app.pause_queue("held")  # an operator's pause is not a backlog

    report = app.check(max_ready_age="10m", worker_timeout=timedelta(seconds=60))
    assert not report.ok
    assert {c.name for c in report.failures} == {"stuck_jobs", "dead_workers", "queue_backlog"}
    assert report.stuck_jobs == 2
    assert report.stuck_job_ids == sorted(stuck, reverse=True)  # longest expired first
    assert [w.id for w in report.dead_workers] == ["gone"]
    assert report.dead_workers[0].heartbeat_age_seconds >= 120
    assert set(report.backlogged_queues) == {"late", "due_scheduled"}
    messages = " ".join(c.message for c in report.failures)
    assert "pgqueue reap" in messages
    assert "gone" in messages

    assert app.check(max_ready_age=3600, worker_timeout="5m").failures == [
        c for c in report.failures if c.name == "stuck_jobs"
    ]
    app.reap()
    assert app.check(max_ready_age="1h", worker_timeout="5m").ok


def test_an_unmigrated_schema_is_a_failed_check_not_an_exception(empty_db_dsn: str) -> None:
    with pgqueue.App(empty_db_dsn) as app:
        report = app.check()
    assert verdicts(report) == {"connection": True, "clock_skew": True, "schema": False}
    assert report.schema_revision is None
    assert "run `pgqueue migrate`" in report.failures[0].message


def test_another_schema_names_the_migrate_command_for_it(db_dsn: str) -> None:
    with pgqueue.App(db_dsn, schema="elsewhere") as app:
        report = app.check()
    assert "pgqueue --schema elsewhere migrate" in report.failures[0].message


def test_an_unreachable_server_is_a_failed_connection_check() -> None:
    with pgqueue.App("postgresql://postgres@127.0.0.1:1/x?connect_timeout=5") as app:
        report = app.check()
    assert not report.ok
    assert [c.name for c in report.checks] == ["connection"]
    assert "127.0.0.1:1" in report.checks[0].message


def test_check_async(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert(status="running", lease_expires_at=-5.0)

    async def main() -> HealthReport:
        try:
            return await app.check_async()
        finally:
            await app.close_async()

    report = asyncio.run(main())
    assert [c.name for c in report.failures] == ["stuck_jobs"]


def test_bad_thresholds_are_input_errors(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidDuration):
        app.check(max_ready_age="soon")
    with pytest.raises(pgqueue.InvalidDuration):
        app.check(worker_timeout=-1)


def test_clock_skew_forgives_half_the_round_trip() -> None:
    assert _clock_check(ServerClock("15", 6.0, 2.5), 5.0).ok  # 6s +- 1.25s may be under 5s
    assert not _clock_check(ServerClock("15", 6.0, 1.0), 5.0).ok
    assert not _clock_check(ServerClock("15", -7.0, 0.1), 5.0).ok
    assert "behind" in _clock_check(ServerClock("15", -7.0, 0.1), 5.0).message


def test_clock_skew_is_measured_against_the_midpoint_of_the_round_trip() -> None:
    # The op is I/O-free: drive it by hand with a server 30s ahead of a fake clock.
    sent = datetime(2026, 1, 1, tzinfo=UTC)
    clock = iter([sent, sent + timedelta(seconds=2)])
    app = pgqueue.App("postgresql://unused@127.0.0.1/x")
    op = check(app.op_context, pgqueue.health_report.HealthSettings(), lambda: next(clock))
    step = next(op)
    assert step.query == "health_server"
    step = op.send({"server_now": sent + timedelta(seconds=31), "server_version": "15"})
    assert step.query == "health_schema_revision"
    with pytest.raises(StopIteration) as stop:
        op.throw(pgqueue.SchemaNotMigrated("no schema"))
    report: HealthReport = stop.value.value
    assert report.clock_skew_seconds == 30.0
    assert verdicts(report)["clock_skew"] is False
    assert report.checks[-1] == HealthCheck(
        "schema", False, 'schema "pgqueue" is not migrated: run `pgqueue migrate`'
    )


# --- helpers the CLI needs ------------------------------------------------------------------


def test_count_and_requeue_dead_in_batches(app: pgqueue.App, job_factory: JobFactory) -> None:
    mail = [job_factory.insert(queue="mail", task="send", status="dead") for _ in range(5)]
    job_factory.insert(queue="sms", task="send", status="dead")
    assert app.count_dead() == 6
    assert app.count_dead(queue="mail", task="send") == 5
    assert app.count_dead(task="other") == 0

    first = app.requeue_dead_many(queue="mail", limit=3)
    second = app.requeue_dead_many(queue="mail", limit=3)
    assert sorted(first + second) == mail
    assert (len(first), len(second)) == (3, 2)
    assert app.count_dead(queue="mail") == 0
    assert app.requeue_dead_many([424242]) == []

    async def by_ids() -> list[int]:
        try:
            return await app.requeue_dead_many_async(queue="sms")
        finally:
            await app.close_async()

    assert len(asyncio.run(by_ids())) == 1


def test_archive_and_prune_counts(app: pgqueue.App, job_factory: JobFactory) -> None:
    for _ in range(3):
        job_factory.insert(status="succeeded", finished_at=-10 * 86400.0)
    job_factory.insert(status="dead", finished_at=-10 * 86400.0)
    job_factory.insert(status="succeeded")
    assert app.archive_count("7d") == 3
    assert app.archive_count("7d", ["succeeded", "dead"]) == 4
    with pytest.raises(pgqueue.InvalidOption, match="cannot archive status 'running'"):
        app.archive_count("7d", ["running"])
    assert app.archive("7d") == 3
    assert app.prune_count("7d") == 3
    assert app.prune_count("30d") == 0


def test_vacuum_covers_every_table_of_the_schema(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                # Partitions are vacuumed with their partitioned table.
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'pgqueue' AND c.relkind IN ('r', 'p')"
                " AND NOT c.relispartition"
            ).fetchall()
        }
    # A table added by a migration must be added to the VACUUM statement too.
    assert tables - {"alembic_version"} == set(VACUUM_TABLES)
    statement = queries_for("pgqueue")["table_vacuum_analyze"]
    assert set(re.findall(r'"pgqueue"\.(\w+)', statement)) == set(VACUUM_TABLES)

    report = app.vacuum()
    assert {t.table for t in report} == set(VACUUM_TABLES)
    assert all(t.dead_tuples_after >= 0 and t.total_bytes > 0 for t in report)

    async def again() -> list[pgqueue.TableVacuum]:
        return await app.vacuum_async()

    assert {t.table for t in asyncio.run(again())} == set(VACUUM_TABLES)
