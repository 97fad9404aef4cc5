"""Failover: a synchronous standby is promoted under two running workers;
nothing committed may be lost, and no job may take effect twice.

Two throwaway clusters, a primary and a streaming standby made with
``pg_basebackup --write-recovery-conf``, the primary committing only once the
standby has the WAL (``synchronous_commit = on``, the standby named in
``synchronous_standby_names``). 1,700 jobs of :mod:`tests.apps.in_transaction`
(each writes one ``public.tx_effects`` row in ``context.transaction()``, the
job's own success in the same transaction; 2 s lease) are enqueued, two
``pgqueue worker`` processes start on the multi-host DSN
``postgresql://postgres@primary,standby/db?target_session_attrs=read-write``
(their pool, their LISTEN connection and the tasks' transactions alike), and
part way through the test crashes the primary (``pg_ctl stop -m immediate``)
and, ``OUTAGE`` seconds later (a failover manager making up its mind), promotes
the standby (``pg_ctl promote``). Nobody restarts or reconfigures the workers:
they must find the new primary by themselves.

Then the old primary's acknowledged commits are all on the new one, every job
succeeded with exactly one effect row (none lost, none run twice), nothing is
left queued or running, the jobs that were running at the crash ran again
(their attempt recorded failed, or reaped when its lease expired), and both
workers LISTEN on the new primary. The time from the promotion to the first
job acknowledged on the new primary is printed, never asserted; README.md
("Running in production", "Failover") quotes it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.apps.in_transaction import EFFECTS_TABLE
from tests.apps.in_transaction import app as tasks_app
from tests.cli_support import run_cli
from tests.fixtures.cluster import SERVER_OS_USER, ThrowawayCluster, unique_db_name
from tests.fixtures.workers import Workers, wait_until

JOBS = 1_700
FAILOVER_AFTER = 500  # succeeded jobs before the primary crashes
OUTAGE = 2.0  # seconds without a primary (a failover manager deciding) before the promotion
STANDBY_NAME = "failover_standby"
SYNC_TIMEOUT = 30.0
RECOVERY_TIMEOUT = 30.0
DRAIN_TIMEOUT = 45.0
TASKS = ("tx_insert", "tx_insert_async")
WORKER_APP = "tests.apps.in_transaction:app"
# Quick polls and reaper runs: the 2 s leases of interrupted jobs expire during the test.
WORKER_ARGS = ("--concurrency", "8", "--poll-interval", "0.5s", "--reap-interval", "0.5s",
               "--no-scheduler", "--log-level", "warning")  # fmt: skip

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def standby(cluster: ThrowawayCluster) -> Iterator[ThrowawayCluster]:
    """A streaming standby of ``cluster``, made with ``pg_basebackup -R`` and
    named ``STANDBY_NAME`` in its primary_conninfo, on a port of its own."""
    replica = ThrowawayCluster(cluster.bindir)  # start() would initdb: the backup comes first
    try:
        replica._run(
            str(replica.bindir / "pg_basebackup"),
            "--pgdata", str(replica.datadir),
            "--dbname", f"host=127.0.0.1 port={cluster.port} user=postgres"
            f" application_name={STANDBY_NAME}",
            "--write-recovery-conf",
            "--checkpoint", "fast",
            "--wal-method", "stream",
            "--no-sync",
        )  # fmt: skip
        # The copied settings name the primary's socket directory: this one has its own.
        replica.socket_dir.mkdir()
        if replica._as_server_user:
            shutil.chown(replica.socket_dir, SERVER_OS_USER, SERVER_OS_USER)
        with (replica.datadir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"unix_socket_directories = '{replica.socket_dir}'\n")
        replica.start()
        yield replica
    finally:
        replica.destroy()


def replicate_synchronously(primary: ThrowawayCluster) -> None:
    """Make every commit on ``primary`` wait for the standby's flush; return
    once the standby streams as the synchronous one."""
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = on")
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        conn.execute("SELECT pg_reload_conf()")

        def synchronous() -> bool:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
            return row is not None and row[0] == "sync"

        wait_until(synchronous, SYNC_TIMEOUT, "the standby to replicate synchronously")


def promote(standby: ThrowawayCluster) -> None:
    standby._run(
        str(standby.bindir / "pg_ctl"), "promote", "--wait", "--timeout", "60",
        "--pgdata", str(standby.datadir),
    )  # fmt: skip


def one_row(dsn: str, query: str, *params: object) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row


def succeeded(dsn: str) -> int:
    done: int = one_row(dsn, "SELECT count(*) FROM pgqueue.jobs WHERE status = 'succeeded'")[0]
    return done


def listening(dsn: str) -> int:
    """Sessions of pgqueue LISTENing on ``dsn``'s database."""
    sessions: int = one_row(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgqueue' AND query LIKE 'LISTEN %'",
    )[0]
    return sessions


def test_a_promoted_synchronous_standby_loses_nothing_and_runs_nothing_twice(
    cluster: ThrowawayCluster, standby: ThrowawayCluster, tmp_path: Path
) -> None:
    primary = cluster
    replicate_synchronously(primary)
    dbname = unique_db_name("pgq_failover")
    primary.create_database(dbname)
    failover_dsn = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{dbname}"
        "?target_session_attrs=read-write"
    )
    migrated = run_cli(failover_dsn, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with psycopg.connect(failover_dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    with pgqueue.App(dsn=failover_dsn) as producer:
        for name in TASKS:
            producer.tasks[name] = tasks_app.tasks[name]
        enqueued = producer.enqueue_many([pgqueue.JobSpec(TASKS[i % 2]) for i in range(JOBS)])
    ids = [job.job_id for job in enqueued]
    old_primary_dsn, new_primary_dsn = primary.dsn_for(dbname), standby.dsn_for(dbname)

    workers = Workers(failover_dsn, tmp_path)
    try:
        serving = [workers.spawn(*WORKER_ARGS, app=WORKER_APP) for _ in range(2)]
        for worker in serving:
            worker.wait_registered()
        wait_until(
            lambda: succeeded(old_primary_dsn) >= FAILOVER_AFTER,
            60.0,
            f"{FAILOVER_AFTER} jobs to succeed before the failover",
            serving,
            interval=0.02,
        )
        acknowledged = succeeded(old_primary_dsn)  # reported to a client: committed
        crashed = time.monotonic()
        primary.stop("immediate")
        time.sleep(OUTAGE)  # meanwhile the workers find a dead primary and a read-only standby
        promote(standby)
        promoted = time.monotonic()
        promoted_at, done_at_promotion, running_at_promotion = one_row(
            new_primary_dsn,
            "SELECT clock_timestamp(), count(*) FILTER (WHERE status = 'succeeded'),"
            " count(*) FILTER (WHERE status = 'running') FROM pgqueue.jobs",
        )
        # Synchronous replication: whatever the old primary acknowledged is here.
        assert done_at_promotion >= acknowledged

        def first_ack() -> float | None:
            """Seconds from the promotion to the first job acknowledged on the
            new primary (both on the server's clock)."""
            (seconds,) = one_row(
                new_primary_dsn,
                "SELECT extract(epoch FROM min(finished_at) - %s) FROM pgqueue.jobs"
                " WHERE status = 'succeeded' AND finished_at > %s",
                promoted_at,
                promoted_at,
            )
            return None if seconds is None else float(seconds)

        recovery = wait_until(
            first_ack, RECOVERY_TIMEOUT, "a job acknowledged on the new primary", serving
        )
        wait_until(
            lambda: listening(new_primary_dsn) == len(serving),
            RECOVERY_TIMEOUT,
            "both workers to LISTEN on the new primary",
            serving,
        )
        relistened = time.monotonic()
        statuses = workers.wait_statuses(
            ids, ("succeeded",), timeout=DRAIN_TIMEOUT, dsn=new_primary_dsn
        )
        drained = time.monotonic()
    finally:
        workers.cleanup()

    with psycopg.connect(new_primary_dsn, autocommit=True) as conn:
        effects: dict[int, int] = dict(
            conn.execute("SELECT job_id, count(*) FROM public.tx_effects GROUP BY job_id")
        )
        unfinished = conn.execute(
            "SELECT status::text, count(*) FROM pgqueue.jobs WHERE status <> 'succeeded' GROUP BY 1"
        ).fetchall()
        earlier_attempts: dict[str, int] = dict(
            conn.execute("SELECT outcome::text, count(*) FROM pgqueue.job_attempts GROUP BY 1")
        )
    print(
        f"failover: {JOBS} jobs, 2 workers; the primary crashed after {done_at_promotion} "
        f"succeeded ({running_at_promotion} running), the standby was promoted "
        f"{promoted - crashed:.2f}s later; first ack on the new primary {recovery:.2f}s after "
        f"the promotion, all done {drained - promoted:.1f}s after it, both LISTENing again "
        f"{relistened - promoted:.1f}s after it; attempts before the "
        f"last: {earlier_attempts}"
    )
    assert len(statuses) == JOBS
    assert set(statuses.values()) == {"succeeded"}
    assert unfinished == []
    lost = sorted(set(ids) - set(effects))
    assert not lost, f"succeeded jobs without their effect: {lost[:20]} ({len(lost)})"
    twice = {job: n for job, n in effects.items() if n != 1}
    assert not twice, f"jobs whose effect happened more than once: {twice}"
    # The crash interrupted running jobs: they ran again instead of being lost.
    assert running_at_promotion > 0
    assert earlier_attempts
