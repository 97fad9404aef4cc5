"""Chaos: real workers over a stream of 5,000 jobs while the test kills them,
kills their connections and crashes the server; then nothing may be lost,
and the attempt records must show that fencing held throughout.

Four ``pgqueue worker`` processes serve :mod:`tests.apps.chaos`, whose tasks
(2 s lease) randomly succeed, raise, raise ``Retry`` or ``Permanent``,
oversleep their lease (the heartbeat must keep it) or block their worker's
event loop past it (the lease expires, another worker reaps and re-runs the
job while the first run goes on). Meanwhile, from one seeded random
generator, the test:

- SIGKILLs a random worker every few seconds (now and then a SIGTERM
  instead, whose shutdown hands unfinished jobs back) and starts a
  replacement, so that four keep running;
- ``pg_terminate_backend``s random connections of workers and tasks;
- crashes the server once (``pg_ctl stop -m immediate``, then start) on a
  private throwaway cluster;
- holds ACCESS EXCLUSIVE locks on random queue tables every few seconds (the
  workers' DSN sets ``lock_timeout`` and ``statement_timeout``, as production
  databases do), makes one worker statement a deadlock victim, and turns the
  database read-only once for a moment (sessions reset, as in a failover).

The invariants are in :mod:`tests.chaos.invariants`. The seed comes from
``PGQUEUE_CHAOS_SEED`` (default below) and is printed; failures repeat it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue.errors import DatabaseError
from tests.apps.chaos import TASK_APPLICATION_NAME, build_app, create_effects_table
from tests.chaos import invariants
from tests.fault_support import (
    QUEUE_TABLES,
    deadlock_with_a_worker,
    locked,
    set_read_only,
    terminate_sessions,
)
from tests.fixtures.cluster import ThrowawayCluster
from tests.fixtures.workers import WorkerProcess, Workers

SEED = int(os.environ.get("PGQUEUE_CHAOS_SEED", "20240611"))
JOBS = 5_000
WORKERS = 4
STALL_SHARE = 0.012  # jobs of the event-loop-blocking task
ENQUEUE_SECONDS = 40.0  # the stream's length; faults go on a little longer
ENQUEUE_BATCHES = 100
FAULTS_AFTER_STREAM = 8.0
DRAIN_TIMEOUT = 120.0
KILL_EVERY = (2.5, 4.5)  # seconds between worker kills
SIGTERM_SHARE = 0.2
TERMINATE_EVERY = (0.5, 1.5)  # seconds between backend terminations
HISTORY_SAMPLE = 150  # jobs whose merged history is compared with App.get_job
LOCK_EVERY = (3.0, 6.0)  # seconds between table locks
LOCK_HOLD = (0.3, 1.0)  # seconds each lock is held
READ_ONLY_SECONDS = 1.5
WORKER_OPTIONS = "-c lock_timeout=300ms -c statement_timeout=5s -c deadlock_timeout=1s"

WORKER_APP = "tests.apps.chaos:app"
WORKER_ARGS = (
    "--concurrency", "12",
    "--poll-interval", "0.5s",
    "--reap-interval", "0.5s",
    "--shutdown-timeout", "1s",
    "--no-scheduler",
    "--log-level", "warning",
)  # fmt: skip
if os.environ.get("PGQUEUE_CHAOS_POOL") == "process":  # the same chaos, sync tasks in children
    WORKER_ARGS = (*WORKER_ARGS, "--pool", "process", "--kill-grace", "1s")
TEST_APPLICATION_NAME = "chaos-test"  # never terminated by the chaos
VICTIM_APPLICATIONS = ("pgqueue", TASK_APPLICATION_NAME)

T = TypeVar("T")


def with_application_name(dsn: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, application_name=name)


def retrying(action: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """Run ``action`` until it gets through the outage the chaos caused."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except (psycopg.OperationalError, DatabaseError) as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: the database stayed unreachable: {error}") from None
            time.sleep(0.2)


@pytest.fixture
def chaos_db(cluster: ThrowawayCluster) -> str:
    """A migrated database on the test's private server, with the side-effect table."""
    dsn = cluster.fresh_db_dsn()
    create_effects_table(dsn)
    # The throwaway cluster runs with synchronous_commit=off, whose commits a
    # crash may lose; this database keeps every commit it acknowledged.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
                sql.Identifier(conn.info.dbname)
            )
        )
    return dsn


@dataclass
class Chaos:
    """Keeps WORKERS workers running and injects the faults."""

    workers: Workers
    cluster: ThrowawayCluster
    dsn: str  # the test's own connections, which the chaos spares
    worker_dsn: str
    rng: random.Random
    serving: list[WorkerProcess] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    kills: int = 0
    sigterms: int = 0
    terminated: int = 0
    restarts: int = 0
    locks: int = 0
    deadlocks: int = 0
    read_only_episodes: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def log(self, message: str) -> None:
        self.events.append(f"{time.monotonic() - self.started_at:7.2f}s {message}")

    def keep_workers(self) -> None:
        """Replace the workers that died (or never got going while the server was down)."""
        for worker in [w for w in self.serving if not w.alive()]:
            self.serving.remove(worker)
            self.log(f"worker {worker.pid} exited {worker.proc.returncode}; replacing it")
        while len(self.serving) < WORKERS:
            worker = self.workers.spawn(*WORKER_ARGS, app=WORKER_APP, dsn=self.worker_dsn)
            self.serving.append(worker)

    def kill_one(self) -> None:
        victim = self.rng.choice(self.serving)
        self.serving.remove(victim)  # a SIGTERMed worker winds down on its own
        if self.rng.random() < SIGTERM_SHARE:
            victim.send(signal.SIGTERM)
            self.sigterms += 1
            self.log(f"SIGTERM worker {victim.pid}")
        else:
            victim.send(signal.SIGKILL)
            self.kills += 1
            self.log(f"SIGKILL worker {victim.pid}")
        self.keep_workers()

    def terminate_backends(self) -> None:
        def terminate() -> int:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                pids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name = ANY(%s) AND pid <> pg_backend_pid()"
                        " ORDER BY pid",
                        (list(VICTIM_APPLICATIONS),),
                    )
                ]
                chosen = self.rng.sample(pids, min(len(pids), self.rng.randint(1, 3)))
                for pid in chosen:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                return len(chosen)

        count = retrying(terminate, "terminating backends")
        self.terminated += count
        self.log(f"terminated {count} backends")

    def lock_table(self) -> None:
        table = self.rng.choice(QUEUE_TABLES)
        hold = self.rng.uniform(*LOCK_HOLD)

        def lock() -> None:
            with locked(self.dsn, table):
                time.sleep(hold)

        retrying(lock, f"locking {table}")
        self.locks += 1
        self.log(f"held ACCESS EXCLUSIVE on {table} for {hold:.2f}s")

    def deadlock(self) -> None:
        won = deadlock_with_a_worker(self.dsn, time.monotonic() + 5.0)
        self.deadlocks += won
        self.log("deadlocked a worker statement" if won else "no deadlock came about")

    def read_only_episode(self) -> None:
        self.log("database read-only (sessions reset), as after a failover to a standby")
        retrying(lambda: set_read_only(self.dsn, True), "turning the database read-only")
        try:
            terminate_sessions(self.dsn, *VICTIM_APPLICATIONS)
            time.sleep(READ_ONLY_SECONDS)
        finally:
            retrying(lambda: set_read_only(self.dsn, False), "turning the database writable")
        self.read_only_episodes += 1
        self.log("database writable again")

    def restart_server(self) -> None:
        self.log("crashing the server (immediate stop), then starting it")
        self.cluster.restart(mode="immediate")
        self.restarts += 1
        self.log("server is back")


def enqueue_batch(
    producer: pgqueue.App, dsn: str, specs: list[pgqueue.JobSpec], log: Callable[[str], None]
) -> None:
    """Enqueue one batch exactly once, through outages: a batch is one
    transaction, so after an error either all its keys exist or none does."""
    keys = [spec.payload["key"] for spec in specs if spec.payload is not None]

    def stored() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE (payload->>'key')::int = ANY(%s)",
                (keys,),
            ).fetchone()
        assert row is not None
        count: int = row[0]
        return count

    deadline = time.monotonic() + 60
    while True:
        try:
            producer.enqueue_many(specs)
            return
        except DatabaseError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"could not enqueue during the chaos: {error}") from None
            log(f"enqueue failed ({type(error).__name__}: {error}); retrying")
            time.sleep(0.2)
            found = retrying(stored, "checking an interrupted enqueue")
            if found == len(keys):
                return
            assert found == 0, f"half of an enqueue batch was stored ({found}/{len(keys)})"


def progress(dsn: str) -> tuple[int, int]:
    """(finished jobs, all jobs)."""

    def count() -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'dead')), count(*)"
                " FROM pgqueue.jobs"
            ).fetchone()
        assert row is not None
        return row[0], row[1]

    return retrying(count, "reading progress")


def unfinished(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cur.execute(
            "SELECT id, task, status::text, attempts, run_at, lease_expires_at, worker_id, now()"
            " FROM pgqueue.jobs WHERE status NOT IN ('succeeded', 'dead') ORDER BY id LIMIT 20"
        ).fetchall()
    return [dict(r) for r in rows]


def job_specs(rng: random.Random) -> list[pgqueue.JobSpec]:
    return [
        pgqueue.JobSpec(
            "chaos_stall" if rng.random() < STALL_SHARE else "chaos_work",
            {"seed": SEED, "key": key},
            priority=rng.choice((0, 0, 0, 1, 2)),
        )
        for key in range(JOBS)
    ]


def compare_with_api(
    app: pgqueue.App,
    jobs: list[invariants.JobRow],
    attempts: list[invariants.AttemptRow],
    rng: random.Random,
) -> list[str]:
    """The merged histories the invariants used equal App.get_job(history=True)
    on a sample: the busiest jobs and random others."""
    by_job: dict[int, list[invariants.AttemptRow]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    busiest = sorted(jobs, key=lambda j: len(by_job.get(j.id, [])), reverse=True)[:30]
    sample = {j.id: j for j in busiest + rng.sample(jobs, min(len(jobs), HISTORY_SAMPLE))}
    mismatches = []
    for job in sample.values():
        ours = [
            (a.attempt_id, a.attempt, a.outcome, a.started_at, a.finished_at, a.worker_id)
            for a in invariants.merged_history(job, by_job.get(job.id, []))
        ]
        history = app.get_job(job.id, history=True).attempt_history or []
        theirs = [
            (a.attempt_id, a.attempt, a.outcome.value, a.started_at, a.finished_at, a.worker_id)
            for a in history
        ]
        if ours != theirs:
            mismatches.append(f"job {job.id}: tables say {ours}, get_job says {theirs}")
    return mismatches


@pytest.mark.chaos
@pytest.mark.slow
def test_nothing_is_lost_and_fencing_holds_under_chaos(
    cluster: ThrowawayCluster, chaos_db: str, tmp_path: Path
) -> None:
    print(f"chaos seed: {SEED} (set PGQUEUE_CHAOS_SEED to change it)")
    rng = random.Random(SEED)
    test_dsn = with_application_name(chaos_db, TEST_APPLICATION_NAME)
    specs = job_specs(rng)
    batch_size = -(-JOBS // ENQUEUE_BATCHES)
    batches = [specs[i : i + batch_size] for i in range(0, JOBS, batch_size)]
    interval = ENQUEUE_SECONDS / len(batches)

    workers = Workers(chaos_db, tmp_path)
    worker_dsn = psycopg.conninfo.make_conninfo(chaos_db, options=WORKER_OPTIONS)
    chaos = Chaos(workers, cluster, test_dsn, worker_dsn, rng)
    producer = build_app(test_dsn)
    try:
        chaos.keep_workers()
        start = time.monotonic()
        restart_at = start + rng.uniform(0.3, 0.6) * ENQUEUE_SECONDS
        deadlock_at = start + rng.uniform(0.1, 0.25) * ENQUEUE_SECONDS
        read_only_at = start + rng.uniform(0.7, 0.85) * ENQUEUE_SECONDS
        next_lock = start + rng.uniform(*LOCK_EVERY)
        next_kill = start + rng.uniform(*KILL_EVERY)
        next_terminate = start + rng.uniform(*TERMINATE_EVERY)
        faults_end = start + ENQUEUE_SECONDS + FAULTS_AFTER_STREAM
        sent = 0
        while sent < len(batches) or time.monotonic() < faults_end:
            now = time.monotonic()
            if sent < len(batches) and now >= start + sent * interval:
                enqueue_batch(producer, test_dsn, batches[sent], chaos.log)
                sent += 1
            if chaos.restarts == 0 and now >= restart_at:
                chaos.restart_server()
            if chaos.deadlocks == 0 and now >= deadlock_at and now < deadlock_at + 10:
                chaos.deadlock()
            if chaos.read_only_episodes == 0 and now >= read_only_at:
                chaos.read_only_episode()
            if now >= next_lock:
                chaos.lock_table()
                next_lock = time.monotonic() + rng.uniform(*LOCK_EVERY)
            if now >= next_kill:
                chaos.kill_one()
                next_kill = now + rng.uniform(*KILL_EVERY)
            if now >= next_terminate:
                chaos.terminate_backends()
                next_terminate = now + rng.uniform(*TERMINATE_EVERY)
            chaos.keep_workers()
            time.sleep(0.02)
        chaos.log("faults stop; draining")

        drain_deadline = time.monotonic() + DRAIN_TIMEOUT
        while (done := progress(test_dsn))[0] < JOBS:
            if time.monotonic() > drain_deadline:
                pytest.fail(
                    f"seed {SEED}: {done[1]} of {JOBS} jobs stored, {JOBS - done[0]} not "
                    f"finished {DRAIN_TIMEOUT}s after the faults stopped, e.g. "
                    f"{unfinished(test_dsn)}\n"
                    + "\n".join(chaos.events[-30:])
                    + "\n"
                    + "\n".join(w.describe() for w in chaos.serving)
                )
            chaos.keep_workers()
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        chaos.log("all jobs finished")
    finally:
        producer.close()
        workers.cleanup()

    jobs, attempts, effects = invariants.load(test_dsn)
    report = invariants.check(jobs, attempts, effects, range(JOBS))
    with build_app(test_dsn) as reader:
        report.violations += compare_with_api(reader, jobs, attempts, rng)

    stats = dict(sorted(report.stats.items()))
    print(
        f"chaos seed {SEED}: {JOBS} jobs in {elapsed:.1f}s; {len(workers.started)} worker "
        f"processes, {chaos.kills} SIGKILLs, {chaos.sigterms} SIGTERMs, {chaos.terminated} "
        f"backends terminated, {chaos.restarts} server crash+restart, {chaos.locks} table "
        f"locks, {chaos.deadlocks} deadlocks, {chaos.read_only_episodes} read-only "
        f"episodes; {stats}"
    )
    print("\n".join(chaos.events))
    assert chaos.restarts == 1
    assert chaos.kills > 0
    assert chaos.terminated > 0
    assert chaos.locks > 0
    assert chaos.read_only_episodes == 1
    # Otherwise the fencing checks below would have had nothing to catch.
    assert report.stats["runs_outliving_their_lease"] > 0, "no run outlived its lease"
    assert not report.violations, (
        f"seed {SEED}: {len(report.violations)} violations\n{report.describe()}"
    )
