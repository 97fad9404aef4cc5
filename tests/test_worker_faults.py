"""Real ``pgqueue worker`` processes ride out database faults while jobs run.

Each test starts a worker (``tests.apps.faults``) whose DSN carries the
settings production databases use (``lock_timeout``, ``statement_timeout``,
``deadlock_timeout``), injects a fault from another session while jobs are
leased, run, completed and their leases extended, then enqueues more work
and checks from the database: every job succeeded exactly once (one attempt,
one side effect, written by that attempt), none is left running, and the
worker never exited. The worker's log must show the fault it rode out, so a
fault that never reached the worker fails the test instead of passing it.

The non-transient case checks the other half of the contract: the worker
stops gracefully (running jobs handed back), exits non-zero and says why once.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgqueue
from tests.apps.faults import EFFECTS_DSN_ENV, LONG_LEASE, build_app, create_effects_table
from tests.fault_support import (
    QUEUE_TABLES,
    deadlock_with_a_worker,
    locked,
    set_read_only,
    terminate_sessions,
)
from tests.fixtures.cluster import ThrowawayCluster
from tests.fixtures.workers import Workers, wait_until

pytestmark = pytest.mark.slow

FAULTS_APP = "tests.apps.faults:app"
WORKER_ARGS = (
    "--concurrency", "6",
    "--poll-interval", "0.5s",
    "--reap-interval", "0.5s",
    "--shutdown-timeout", "2s",
)  # fmt: skip
EPISODE = "database error; retrying until it clears"
DRAIN_TIMEOUT = 90.0


class FaultRun:
    """One worker on a database, the jobs the test enqueued, and the checks."""

    def __init__(self, workers: Workers, dsn: str, worker_options: str = "") -> None:
        create_effects_table(dsn)
        self.dsn = dsn
        self.workers = workers
        self.producer = build_app(make_conninfo(dsn, application_name="fault-test"))
        worker_dsn = make_conninfo(dsn, options=worker_options) if worker_options else dsn
        self.worker = workers.spawn(
            *WORKER_ARGS,
            app=FAULTS_APP,
            dsn=worker_dsn,
            env={EFFECTS_DSN_ENV: make_conninfo(dsn, application_name="fault-effects")},
        )
        self.job_ids: list[int] = []
        self.next_key = 0
        self.worker.wait_registered()

    def enqueue(self, count: int, long: int = 0) -> None:
        """``count`` short jobs (half sync, half async) and ``long`` jobs that
        need their lease extended."""
        specs = []
        for i in range(count + long):
            task = "fault_long" if i >= count else ("fault_work", "fault_work_async")[i % 2]
            seconds = LONG_LEASE * 0.7 if i >= count else 0.2
            specs.append(pgqueue.JobSpec(task, {"key": self.next_key, "seconds": seconds}))
            self.next_key += 1
        self.job_ids += [e.job_id for e in self.producer.enqueue_many(specs)]

    def wait_some_running(self) -> None:
        wait_until(
            lambda: scalar(self.dsn, "SELECT count(*) FROM pgqueue.jobs WHERE status = 'running'"),
            30,
            "jobs to be running",
            [self.worker],
        )

    def check(self, *markers: str) -> None:
        """More work after the fault, then the invariants. ``markers``: a
        SQLSTATE or message part each, that the worker's log must show it met."""
        self.enqueue(12)
        self.workers.wait_statuses(
            self.job_ids,
            ["succeeded"],
            timeout=DRAIN_TIMEOUT,
            dsn=self.dsn,
            require_alive=[self.worker],
        )
        assert self.worker.alive(), self.worker.describe()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            jobs = conn.execute(
                "SELECT id, (payload->>'key')::int, status::text, attempts, attempt_id"
                " FROM pgqueue.jobs WHERE id = ANY(%s)",
                (self.job_ids,),
            ).fetchall()
            extra_attempts = conn.execute(
                "SELECT job_id, outcome::text FROM pgqueue.job_attempts WHERE job_id = ANY(%s)",
                (self.job_ids,),
            ).fetchall()
            effects = conn.execute(
                "SELECT key, job_id, attempt_id FROM public.fault_effects ORDER BY id"
            ).fetchall()
            running = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE status = 'running'"
            ).fetchone()
        assert len(jobs) == self.next_key
        assert {j[2] for j in jobs} == {"succeeded"}
        # Exactly once: one attempt per job, none failed, released or reaped...
        assert [j for j in jobs if j[3] != 1] == []
        assert extra_attempts == []
        # ... and one side effect per job, written by its recorded attempt.
        by_key = {}
        for key, job_id, attempt_id in effects:
            assert key not in by_key, f"key {key} ran twice: {effects}"
            by_key[key] = (job_id, attempt_id)
        assert by_key == {j[1]: (j[0], j[4]) for j in jobs}
        assert running == (0,)
        assert self.worker.registration() is not None
        # Each episode logs its first error, and when it ends every SQLSTATE
        # met and the last error.
        episodes = [
            *self.worker.logged(EPISODE),
            *self.worker.logged("notification connection lost"),
            *self.worker.logged("database usable again"),
        ]
        for marker in markers:
            assert any(
                marker == e.get("sqlstate")
                or marker in e.get("sqlstates", ())
                or marker in str(e.get("error", e.get("last_error")))
                for e in episodes
            ), f"the worker never met {marker}; it logged {episodes}"
        assert self.worker.logged("stopping the worker") == []

    def close(self) -> None:
        self.producer.close()


def scalar(dsn: str, query: str, params: tuple[object, ...] = ()) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    value: int = row[0]
    return value


@pytest.mark.parametrize(
    ("setting", "sqlstate"),
    [("lock_timeout=200ms", "55P03"), ("statement_timeout=300ms", "57014")],
)
def test_the_worker_rides_out_lock_and_statement_timeouts_on_every_queue_table(
    workers: Workers, db_dsn: str, setting: str, sqlstate: str
) -> None:
    run = FaultRun(workers, db_dsn, f"-c {setting}")
    try:
        run.enqueue(24, long=3)
        run.wait_some_running()
        for table in QUEUE_TABLES:
            with locked(db_dsn, table):
                time.sleep(1.0)
            run.enqueue(6)
        run.check(sqlstate)
    finally:
        run.close()


def test_the_worker_rides_out_a_deadlock(workers: Workers, db_dsn: str) -> None:
    run = FaultRun(workers, db_dsn, "-c deadlock_timeout=1s")
    try:
        run.enqueue(40, long=2)
        run.wait_some_running()
        deadline = time.monotonic() + 40
        deadlocks = 0
        while deadlocks < 2 and time.monotonic() < deadline:
            run.enqueue(8)
            deadlocks += deadlock_with_a_worker(db_dsn, deadline)
        assert deadlocks, "no worker statement could be made part of a deadlock"
        run.check("40P01")
    finally:
        run.close()


def test_the_worker_rides_out_a_read_only_episode_like_a_failover(
    workers: Workers, db_dsn: str
) -> None:
    run = FaultRun(workers, db_dsn)
    try:
        run.enqueue(24, long=3)
        run.wait_some_running()
        # A failover to a standby: every session breaks, the new ones are read-only...
        set_read_only(db_dsn, True)
        try:
            assert terminate_sessions(db_dsn, "pgqueue", "fault-effects") > 0
            run.worker.wait_logged(EPISODE, timeout=30)
            time.sleep(2.5)
        finally:
            # ... until the standby is promoted. The sessions opened meanwhile
            # stay read-only: the worker must drop them by itself.
            set_read_only(db_dsn, False)
        run.check("25006")
    finally:
        run.close()


def test_the_worker_rides_out_max_connections_exhausted(
    workers: Workers, cluster: ThrowawayCluster
) -> None:
    with psycopg.connect(cluster.dsn, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET max_connections = 40")
    cluster.restart()
    dsn = cluster.fresh_db_dsn()
    run = FaultRun(workers, dsn)
    try:
        run.enqueue(24, long=3)
        run.wait_some_running()
        with psycopg.connect(dsn, autocommit=True) as admin, ExitStack() as hogs:

            def hog_every_free_slot() -> int:
                taken = 0
                while True:
                    try:
                        hogs.enter_context(psycopg.connect(dsn, connect_timeout=5))
                    except psycopg.OperationalError as exc:
                        refusal = str(exc)
                        break
                    taken += 1
                assert "too many clients" in refusal, refusal
                return taken

            assert hog_every_free_slot() > 0
            # The worker must open new connections now, and finds none free.
            stop = threading.Event()

            def keep_terminating() -> None:
                while not stop.is_set():
                    admin_rows = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database()"
                        " AND application_name IN ('pgqueue', 'fault-effects')"
                    ).fetchall()
                    if admin_rows:
                        hog_every_free_slot()
                    stop.wait(0.2)

            terminator = threading.Thread(target=keep_terminating)
            terminator.start()
            try:
                run.worker.wait_logged("notification connection lost", timeout=30)
                time.sleep(3.0)
            finally:
                stop.set()
                terminator.join()
        run.check("53300")
    finally:
        run.close()


def test_a_non_transient_error_stops_the_worker_gracefully_and_says_why_once(
    workers: Workers, db_dsn: str
) -> None:
    run = FaultRun(workers, db_dsn)
    try:
        run.enqueue(0, long=2)
        wait_until(
            lambda: scalar(
                db_dsn, "SELECT count(*) = 2 FROM pgqueue.jobs WHERE status = 'running'"
            ),
            30,
            "both long jobs to run",
            [run.worker],
        )
        # A botched migration: the lease function is gone (not a passing fault).
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("ALTER FUNCTION pgqueue.lease_jobs RENAME TO lease_jobs_gone")
        try:
            run.enqueue(1)  # the notification wakes the producer at once
            code = run.worker.wait_exit(timeout=60)
        finally:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                conn.execute("ALTER FUNCTION pgqueue.lease_jobs_gone RENAME TO lease_jobs")
        assert code != 0, run.worker.describe()
        stops = run.worker.logged("stopping the worker")
        assert len(stops) == 1, run.worker.describe()
        assert stops[0]["loop"] == "producer"
        assert "lease_jobs" in stops[0]["error"]
        assert "error: " in run.worker.log_text()  # the CLI's one line on stderr
        # The running jobs were handed back, not left running under a dead lease.
        statuses = scalar(
            db_dsn,
            "SELECT count(*) FROM pgqueue.jobs WHERE status = 'running' AND id = ANY(%s)",
            (run.job_ids,),
        )
        assert statuses == 0
        assert scalar(db_dsn, "SELECT count(*) FROM pgqueue.workers") == 0
        released = scalar(
            db_dsn,
            "SELECT count(*) FROM pgqueue.job_attempts WHERE outcome = 'released'"
            " AND job_id = ANY(%s)",
            (run.job_ids,),
        )
        assert released == 2
        # A new worker (the function restored) finishes everything.
        replacement = workers.spawn(
            *WORKER_ARGS,
            app=FAULTS_APP,
            env={EFFECTS_DSN_ENV: db_dsn},
        )
        workers.wait_statuses(run.job_ids, ["succeeded"], require_alive=[replacement])
    finally:
        run.close()


def test_an_outcome_the_database_refuses_stops_the_worker_and_the_reaper_recovers_the_job(
    workers: Workers, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # Acks fail with an error no retry can fix (a broken trigger, say): an
        # ack moves the job's row into jobs_succeeded.
        conn.execute(
            "CREATE FUNCTION public.refuse_ack() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'acks are refused today'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_ack BEFORE INSERT ON pgqueue.jobs FOR EACH ROW"
            " WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION public.refuse_ack()"
        )
    run = FaultRun(workers, db_dsn)
    try:
        run.producer.enqueue("fault_long", {"key": 0, "seconds": 0.2})
        code = run.worker.wait_exit(timeout=60)
        assert code != 0, run.worker.describe()
        stops = run.worker.logged("stopping the worker")
        assert [(s["loop"], s["sqlstate"]) for s in stops] == [("completer", "P0001")]
        assert "acks are refused today" in stops[0]["error"]
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER refuse_ack ON pgqueue.jobs")
        # Not handed back (its outcome was known but unrecordable) and no longer
        # extended: the reaper of the next worker reclaims it when the lease ends.
        job_id = scalar(db_dsn, "SELECT id FROM pgqueue.jobs")
        replacement = workers.spawn(*WORKER_ARGS, app=FAULTS_APP, env={EFFECTS_DSN_ENV: db_dsn})
        workers.wait_statuses([job_id], ["succeeded"], require_alive=[replacement])
        history = run.producer.get_job(job_id, history=True).attempt_history or []
        assert [a.outcome.value for a in history] == ["lease_expired", "succeeded"]
    finally:
        run.close()
