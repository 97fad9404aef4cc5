"""Faults over durable tasks: real workers run jobs of several steps each
(:mod:`tests.apps.durable_chaos`, sync and async, with a sleep and a wait for
an event halfway), while the test SIGKILLs workers at random moments,
``pg_terminate_backend``s their connections, starts replacements, and sends
the events of the jobs that wait (some before the job even ran).

Every step's function writes a row into ``public.durable_effects`` naming the
attempt that ran it, so the rows count the real runs. Afterwards:

- every job ended ``succeeded`` (no attempt limit), none is left ``waiting``,
  and every job whose event was sent got past its wait;
- every stored step (``job_steps``) ran exactly once in the attempt that
  stored it, and never again after: no run of it by a later attempt;
- each earlier run of a stored step belongs to an attempt that did not store
  it (it died with the step in flight), and such an attempt ran at most one
  step it did not store: the one in flight at the kill;
- each job's result is the stored results of its steps, in order.

The seed comes from ``PGQUEUE_CHAOS_SEED`` and is printed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.apps.durable_chaos import build_app, create_tables
from tests.fixtures.workers import WorkerProcess, Workers

SEED = int(os.environ.get("PGQUEUE_CHAOS_SEED", "20261207"))
JOBS = 24
STEPS = 6
WORKERS = 3
CHAOS_SECONDS = 15.0
DRAIN_TIMEOUT = 60.0
KILL_EVERY = (1.5, 3.0)
TERMINATE_EVERY = (0.5, 1.2)
EARLY_EVENTS = 6  # sent before their job runs: found at once

WORKER_APP = "tests.apps.durable_chaos:app"
WORKER_ARGS = (
    "--concurrency", "4",
    "--poll-interval", "0.5s",
    "--reap-interval", "0.5s",
    "--shutdown-timeout", "1s",
    "--no-scheduler",
    "--log-level", "warning",
)  # fmt: skip
TEST_APPLICATION_NAME = "durable-chaos-test"  # never terminated by the chaos

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(180)]


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name=TEST_APPLICATION_NAME)


def _terminate_worker_backends(dsn: str) -> int:
    with _connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name = 'pgqueue'"
        ).fetchall()
    return len(rows)


def _waiting_keys(dsn: str) -> list[str]:
    with _connect(dsn) as conn:
        rows = conn.execute(
            "SELECT event_key FROM pgqueue.job_steps WHERE status = 'waiting'"
        ).fetchall()
    return [r[0] for r in rows]


def _spawn(workers: Workers) -> WorkerProcess:
    return workers.spawn(*WORKER_ARGS, app=WORKER_APP)


def test_durable_steps_survive_killed_workers_and_terminated_backends(
    workers: Workers, db_dsn: str
) -> None:
    rng = random.Random(SEED)
    print(f"durable chaos seed {SEED}")
    create_tables(db_dsn)
    sent: set[str] = set()
    with build_app(db_dsn) as producer:
        ids = [
            producer.enqueue("chain" if n % 2 else "async_chain", {"steps": STEPS}).job_id
            for n in range(JOBS)
        ]
        for job_id in ids[:EARLY_EVENTS]:
            producer.send_event(f"go:{job_id}", {"early": True})
            sent.add(f"go:{job_id}")

        running = [_spawn(workers) for _ in range(WORKERS)]
        for worker in running:
            worker.wait_registered()
        kills = terminations = 0
        end = time.monotonic() + CHAOS_SECONDS
        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        next_terminate = time.monotonic() + rng.uniform(*TERMINATE_EVERY)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_kill:
                victim = rng.choice(running)
                victim.send(signal.SIGKILL)
                victim.proc.wait(timeout=10)
                running.remove(victim)
                running.append(_spawn(workers))
                kills += 1
                next_kill = now + rng.uniform(*KILL_EVERY)
            if now >= next_terminate:
                terminations += _terminate_worker_backends(db_dsn)
                next_terminate = now + rng.uniform(*TERMINATE_EVERY)
            # Release about half of the waiting jobs each round; the rest wait on.
            for key in _waiting_keys(db_dsn):
                if key not in sent and rng.random() < 0.5:
                    producer.send_event(key, {"late": True})
                    sent.add(key)
            time.sleep(0.1)

        # Calm: every event is sent now (again for some: a resend replaces it).
        for job_id in ids:
            producer.send_event(f"go:{job_id}", {"calm": True})
        statuses = workers.wait_statuses(ids, timeout=DRAIN_TIMEOUT, require_alive=running)
        jobs = {job_id: producer.get_job(job_id, history=True) for job_id in ids}
    print(f"kills {kills}, backend terminations {terminations}")
    assert kills >= 3

    # Every job ended, succeeded; none is left waiting.
    assert set(statuses.values()) == {"succeeded"}, statuses
    with _connect(db_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pgqueue.job_steps WHERE status = 'waiting'"
        ).fetchone()
        stored = conn.execute(
            "SELECT job_id, name, attempt_id FROM pgqueue.job_steps WHERE kind = 'step'"
        ).fetchall()
        effects = conn.execute(
            "SELECT job_id, step, attempt_id FROM public.durable_effects ORDER BY id"
        ).fetchall()
    assert left == (0,)

    stored_by = {(job_id, name): attempt for job_id, name, attempt in stored}
    assert len(stored_by) == JOBS * STEPS  # every step of every job is stored
    runs: dict[tuple[int, str], list[int]] = defaultdict(list)
    for job_id, step, attempt in effects:
        runs[(job_id, step)].append(attempt)
    unstored_per_attempt: Counter[int] = Counter()
    for key, attempt in stored_by.items():
        attempts = runs[key]
        # Exactly once in the attempt that stored it...
        assert attempts.count(attempt) == 1, (key, attempts)
        # ... never after it was stored, and every other run died unstored.
        for other in attempts:
            if other != attempt:
                assert other < attempt, (key, attempts)
                unstored_per_attempt[other] += 1
    # An attempt that died ran at most one step it did not store: the one in flight.
    assert all(n == 1 for n in unstored_per_attempt.values()), unstored_per_attempt
    reruns = sum(len(a) - 1 for a in runs.values())
    print(f"steps run again after a fault (in flight, never stored): {reruns}")

    for job_id, job in jobs.items():
        assert job.status is pgqueue.JobStatus.SUCCEEDED
        expected = [f"s{i}@{stored_by[(job_id, f's{i}')]}" for i in range(STEPS)]
        assert job.result == expected, (job_id, job.result)
        kinds = [s.kind for s in job.steps]
        assert kinds.count("sleep") == 1
        assert kinds.count("event") == 1
        event = next(s for s in job.steps if s.kind == "event")
        assert event.status == "received"
