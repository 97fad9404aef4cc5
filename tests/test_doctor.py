"""The doctor finds each problem for real: every test creates it in a real
database (an idle transaction, a prepared transaction, a replication slot, a
SIGSTOPped worker, ...) and checks the finding, its severity, its evidence
and the CLI's exit code."""

from __future__ import annotations

import signal
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.telemetry.doctor import DoctorSettings, diagnose, exit_code
from tests.fixtures.cluster import create_database, drop_database, unique_db_name
from tests.fixtures.factory import JobFactory
from tests.fixtures.workers import Workers, pgqueue_command, subprocess_env, wait_until


def by_check(findings: list[pgqueue.Finding]) -> dict[str, pgqueue.Finding]:
    return {f.check: f for f in findings}


def cli_doctor(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*pgqueue_command(), "doctor", *args],
        env=subprocess_env(dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_healthy_database_is_all_ok(app: pgqueue.App, db_dsn: str) -> None:
    findings = app.doctor()
    checks = by_check(findings)
    assert {
        "connection", "clock_skew", "pooler", "migrations", "xmin_horizon",
        "prepared_transactions", "replication_slots", "notify_queue", "connections",
        "dead_tuples", "workers", "expired_leases", "backlog", "archive",
    } <= set(checks)  # fmt: skip
    assert [f for f in findings if f.severity != "ok"] == []
    assert exit_code(findings) == 0
    assert checks["pooler"].summary == "direct connection to the server"
    result = cli_doctor(db_dsn)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok    migrations" in result.stdout


def test_idle_in_transaction_session_holding_xmin(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, application_name="forgotten-tx") as idle:
        idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        idle.execute("SELECT count(*) FROM pgqueue.jobs")  # a snapshot: xmin held
        pid = idle.info.backend_pid
        finding = by_check(app.doctor(max_transaction_age=0.0))["xmin_horizon"]
        assert finding.severity == "warn"
        assert "idle in transaction" in finding.summary
        assert f"pid {pid} (forgotten-tx" in finding.detail
        assert str(pid) in finding.fix
        assert "pg_terminate_backend" in finding.fix
        assert finding.evidence["sessions"][0]["pid"] == pid
        assert finding.evidence["sessions"][0]["xmin"] is not None
        result = cli_doctor(db_dsn, "--max-transaction-age", "1ms", "--json")
        assert result.returncode == 1, result.stdout + result.stderr
        assert '"check": "xmin_horizon"' in result.stdout
    # Over the error age it is an error.
    with psycopg.connect(db_dsn) as idle:
        idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        idle.execute("SELECT 1")
        findings = app.doctor(max_transaction_age=0.0, error_transaction_age=0.0)
        assert by_check(findings)["xmin_horizon"].severity == "error"
        assert exit_code(findings) == 2
    assert by_check(app.doctor())["xmin_horizon"].severity == "ok"


def test_prepared_transaction(app: pgqueue.App, db_dsn: str) -> None:
    gid = f"pgqueue-doctor-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn) as conn:
        allowed = conn.execute("SHOW max_prepared_transactions").fetchone()
        if allowed is None or int(allowed[0]) == 0:
            pytest.skip("this server has max_prepared_transactions = 0 (the test clusters set it)")
        conn.execute("CREATE TABLE twophase (id int)")
        conn.commit()
        conn.execute("INSERT INTO twophase VALUES (1)")
        conn.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        findings = app.doctor(max_transaction_age=0.0)
        finding = by_check(findings)["prepared_transactions"]
        assert finding.severity == "error"
        assert gid in finding.detail
        assert f"ROLLBACK PREPARED '{gid}'" in finding.fix
        assert exit_code(findings) == 2
        assert cli_doctor(db_dsn, "--max-transaction-age", "1ms").returncode == 2
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    assert by_check(app.doctor(max_transaction_age=0.0))["prepared_transactions"].severity == "ok"


def test_inactive_replication_slot(app: pgqueue.App, db_dsn: str) -> None:
    slot = f"pgqueue_doctor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
        try:
            finding = by_check(app.doctor())["replication_slots"]
            assert finding.severity == "warn"
            assert slot in finding.summary
            assert "retains" in finding.detail
            assert f"pg_drop_replication_slot('{slot}')" in finding.fix
            assert finding.evidence["slots"][0]["slot_name"] == slot
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    assert by_check(app.doctor())["replication_slots"].severity == "ok"


def test_worker_whose_heartbeat_stopped(
    workers: Workers, tasks_app: pgqueue.App, app: pgqueue.App
) -> None:
    worker = workers.spawn("--no-scheduler")
    worker.wait_registered()
    worker.send(signal.SIGSTOP)
    try:

        def stale() -> pgqueue.Finding | None:
            finding = by_check(app.doctor(worker_timeout=1.0))["workers"]
            return finding if finding.severity == "warn" else None

        finding = wait_until(stale, 30.0, "the doctor to see the stopped worker", [])
        assert f"pid {worker.pid}" in finding.detail
        assert finding.evidence["workers"][0]["pid"] == worker.pid
        assert "kill -CONT" in finding.fix
    finally:
        worker.send(signal.SIGCONT)


def test_running_job_past_its_lease(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = job_factory.insert(status="running", lease_expires_at=-30.0)
    findings = app.doctor()
    finding = by_check(findings)["expired_leases"]
    assert finding.severity == "error"
    assert str(job_id) in finding.detail
    assert finding.evidence["job_ids"] == [job_id]
    assert "pgqueue reap" in finding.fix
    assert exit_code(findings) == 2


def test_old_backlog(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert(queue="slow", status="queued", run_at=-3600.0)
    finding = by_check(app.doctor())["backlog"]
    assert finding.severity == "warn"
    assert "slow" in finding.summary
    assert finding.evidence["queues"]["slow"] >= 3600
    assert by_check(app.doctor(max_ready_age="2h"))["backlog"].severity == "ok"


def test_finished_jobs_waiting_for_archive(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert_many(30, status="succeeded", finished=True)
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET finished_at = now() - interval '8 days'")
    finding = by_check(app.doctor(archive_backlog=10))["archive"]
    assert finding.severity == "warn"
    assert finding.evidence["waiting"] == 30
    assert "pgqueue archive --older-than 7d" in finding.fix


def test_unmigrated_and_outdated_schema(pg_server_dsn: str, db_dsn: str) -> None:
    name = unique_db_name("pgq_doctor_empty")
    dsn = create_database(pg_server_dsn, name)
    try:
        with pgqueue.App(dsn) as empty:
            findings = empty.doctor()
        finding = by_check(findings)["migrations"]
        assert finding.severity == "error"
        assert "not migrated" in finding.summary
        assert "pgqueue migrate" in finding.fix
        assert exit_code(findings) == 2
        assert "expired_leases" not in by_check(findings)  # no tables to read
        result = cli_doctor(dsn)
        assert result.returncode == 2
        assert "pgqueue migrate" in result.stdout
    finally:
        drop_database(pg_server_dsn, name)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.alembic_version SET version_num = '0004'")
    with pgqueue.App(db_dsn) as outdated:
        finding = by_check(outdated.doctor())["migrations"]
    assert finding.severity == "error"
    assert "at revision 0004" in finding.summary
    assert "pgqueue migrate" in finding.fix


def test_notify_queue_filled_by_a_listener_that_never_reads(app: pgqueue.App, db_dsn: str) -> None:
    assert by_check(app.doctor(notify_queue_warn=0.0))["notify_queue"].severity == "ok"
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_doctor_test")
        # Inside a transaction a session receives no notifications: the queue
        # cannot move past it.
        listener.autocommit = False
        listener.execute("SELECT 1")
        with psycopg.connect(db_dsn, autocommit=True) as sender:
            for batch in range(4):  # bounded: 4 x 500 x 8 kB = 16 MB of the 8 GB queue
                sender.execute(
                    "SELECT count(pg_notify('pgqueue_doctor_test', %s || ':' || i || "
                    "repeat('x', 7900))) FROM generate_series(1, 500) i",
                    (str(batch),),
                )
        finding = by_check(app.doctor(notify_queue_warn=0.0))["notify_queue"]
        assert finding.severity == "warn"
        assert finding.evidence["usage"] > 0
        assert "pg_terminate_backend" in finding.fix
        listener.rollback()


# --- a real PgBouncer in transaction mode ------------------------------------------


def test_pgbouncer_in_transaction_mode(pgbouncer_dsn: str) -> None:
    with pgqueue.App(pgbouncer_dsn) as through:
        findings = through.doctor()
    finding = by_check(findings)["pooler"]
    assert finding.severity == "warn", finding
    assert "transaction-mode pooler" in finding.summary
    assert "listen=False" in finding.fix
    assert finding.evidence["same_backend"] is True
    assert finding.evidence["dsn_port"] != finding.evidence["server_port"]
    assert exit_code(findings) == 1
    # Declared (workers poll instead of LISTEN): no warning.
    with pgqueue.App(pgbouncer_dsn, listen=False) as declared:
        assert by_check(declared.doctor())["pooler"].severity == "ok"


def test_bad_threshold_is_refused(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidOption, match="unknown doctor threshold"):
        app.doctor(max_age=1)
    with pytest.raises(pgqueue.InvalidDuration):
        app.doctor(worker_timeout="soon")


def test_dead_tuples_vacuum_cannot_remove(
    app: pgqueue.App, db_dsn: str, job_factory: JobFactory
) -> None:
    job_factory.insert_many(3000, status="succeeded", finished=True)
    with psycopg.connect(db_dsn) as holder:
        # An open snapshot older than the deletes: vacuum must keep the rows.
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT 1 FROM pgqueue.jobs LIMIT 1")
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM pgqueue.jobs")

        def bloated() -> pgqueue.Finding | None:
            # Statistics reach the server within a second or so of the commit.
            finding = by_check(app.doctor(dead_tuples_min=1000))["dead_tuples"]
            return finding if finding.severity == "warn" else None

        finding = wait_until(bloated, 30.0, "the dead tuples to show", [])
        assert "jobs" in finding.summary
        assert "3000 dead" in finding.detail
        assert "pgqueue maintenance" in finding.fix
        assert by_check(app.doctor(max_transaction_age=0.0))["xmin_horizon"].severity == "warn"


def test_clock_skew(app: pgqueue.App) -> None:
    # The host's clock cannot be moved in a test: the operation takes the clock to compare.
    ahead = lambda: datetime.now(UTC) + timedelta(minutes=10)  # noqa: E731
    findings = app._database.run(diagnose(app.op_context, DoctorSettings(), None, wall_clock=ahead))
    finding = by_check(findings)["clock_skew"]
    assert finding.severity == "warn"
    assert "behind this machine's" in finding.summary
    assert finding.evidence["skew_seconds"] < -590
    assert "NTP" in finding.fix


def test_jobs_of_a_task_no_live_worker_has(app: pgqueue.App, db_dsn: str, workers: Workers) -> None:
    """A worker without the task hands its jobs back (within the grace):
    the doctor names the task, how many jobs and how old, and the fix."""
    assert by_check(app.doctor())["unknown_tasks"].severity == "ok"
    old = workers.spawn("--concurrency", "2", app="tests.apps.registry:app_without_mail")
    old.wait_registered()
    job_id = app.enqueue("reg_mail", {"to": "a@b.c"}).job_id

    def flagged() -> pgqueue.Finding | None:
        finding = by_check(app.doctor())["unknown_tasks"]
        return finding if finding.severity != "ok" else None

    finding = wait_until(flagged, 30.0, "the doctor to flag the unknown task", [old])
    assert finding.severity == "warn"
    assert "reg_mail" in finding.summary
    assert finding.evidence["tasks"][0]["task"] == "reg_mail"
    assert finding.evidence["tasks"][0]["jobs"] == 1
    assert "pgqueue jobs cancel --task reg_mail" in finding.fix
    assert app.get_job(job_id).status in ("queued", "scheduled", "running")
    # Past the grace it is an error.
    findings = app.doctor(unknown_task_grace="0s")
    assert by_check(findings)["unknown_tasks"].severity == "error"
    assert exit_code(findings) == 2
    result = cli_doctor(db_dsn, "--json")
    assert '"check": "unknown_tasks"' in result.stdout
    assert result.returncode >= 1, result.stdout + result.stderr


def test_connections_in_use_toward_max_connections(app: pgqueue.App, db_dsn: str) -> None:
    """Real sessions: a dozen idle connections of one application show up as
    the heaviest user; with the warn threshold under the share they now take
    (a throwaway setting: max_connections needs a restart), a warning."""
    hogs = [psycopg.connect(db_dsn, application_name="conn-hog") for _ in range(12)]
    try:
        relaxed = by_check(app.doctor(connections_warn=2.0, connections_error=2.0))
        assert relaxed["connections"].severity == "ok"
        usable = (
            relaxed["connections"].evidence["max_connections"]
            - relaxed["connections"].evidence["reserved"]
        )
        in_use = relaxed["connections"].evidence["in_use"]
        assert in_use >= 12
        share = in_use / usable
        finding = by_check(app.doctor(connections_warn=share * 0.5, connections_error=2.0))[
            "connections"
        ]
        assert finding.severity == "warn"
        heaviest = {t["application_name"]: t["connections"] for t in finding.evidence["top"]}
        assert heaviest.get("conn-hog") == 12
        assert "conn-hog" in finding.detail
        assert "max_connections" in finding.fix
        findings = app.doctor(connections_warn=share * 0.5, connections_error=share * 0.5)
        assert by_check(findings)["connections"].severity == "error"
        assert exit_code(findings) == 2
    finally:
        for conn in hogs:
            conn.close()
    after = by_check(app.doctor(connections_warn=2.0))["connections"]
    assert "conn-hog" not in {t["application_name"] for t in after.evidence["top"]}
