"""Concurrency on a real server: racing dedup enqueues, serial keys across
consumers, and four OS processes draining 20,000 jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.fixtures.factory import JobFactory

THREAD_TIMEOUT = 120.0


def run_threads(count: int, target: Callable[[int], None]) -> list[BaseException]:
    """Run ``target(i)`` in ``count`` threads; return the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=THREAD_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in time"
    return errors


# --- dedup races -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["pool", "caller_transaction", "sql_function"])
def test_twenty_concurrent_enqueues_of_one_dedup_key_make_one_job(
    db_dsn: str, job_factory: JobFactory, path: str
) -> None:
    start = threading.Barrier(20)
    results: list[tuple[int, bool | None]] = []
    lock = threading.Lock()

    with pgqueue.App(dsn=db_dsn, pool_max_size=20, pool_min_size=20) as app:

        def enqueue(i: int) -> None:
            if path == "pool":
                start.wait(timeout=30)
                r = app.enqueue("t", {"i": i}, dedup_key="the-key")
                outcome: tuple[int, bool | None] = (r.job_id, r.created)
            else:
                with psycopg.connect(db_dsn) as caller:
                    caller.execute("SELECT 1")  # the transaction is open before the race
                    start.wait(timeout=30)
                    if path == "caller_transaction":
                        r = app.enqueue("t", {"i": i}, dedup_key="the-key", conn=caller)
                        outcome = (r.job_id, r.created)
                    else:
                        row = caller.execute(
                            "SELECT pgqueue.enqueue('t', jsonb_build_object('i', %s::int),"
                            " dedup_key => 'the-key')",
                            (i,),
                        ).fetchone()
                        assert row is not None
                        outcome = (row[0], None)
            with lock:
                results.append(outcome)

        assert run_threads(20, enqueue) == []

    rows = job_factory.conn.execute("SELECT id FROM pgqueue.jobs").fetchall()
    assert len(rows) == 1
    (job_id,) = rows[0]
    assert len(results) == 20
    assert {r[0] for r in results} == {job_id}
    if path != "sql_function":
        assert sorted(r[1] for r in results if r[1] is not None) == [False] * 19 + [True]


# --- serial keys across consumers ---------------------------------------------------------


def test_serial_keys_hold_across_concurrent_consumers(db_dsn: str, job_factory: JobFactory) -> None:
    keys = [f"user:{k}" for k in range(8)]
    with pgqueue.App(dsn=db_dsn) as producer:
        results = producer.enqueue_many(
            [pgqueue.JobSpec("t", {"n": n}, serial_key=keys[n % 8]) for n in range(240)]
        )
    key_of = {r.job_id: keys[n % 8] for n, r in enumerate(results)}

    lock = threading.Lock()
    running: set[str] = set()
    started: dict[str, list[int]] = defaultdict(list)
    overlaps: list[tuple[str, int]] = []
    done = threading.Event()

    def consume(i: int) -> None:
        with pgqueue.App(dsn=db_dsn, pool_max_size=2) as app:
            idle = 0
            while not done.is_set() and idle < 2000:
                batch = app.lease("default", f"consumer-{i}", max=3)
                if not batch:
                    idle += 1
                    continue
                idle = 0
                with lock:
                    for job in batch:
                        key = key_of[job.job_id]
                        if key in running:
                            overlaps.append((key, job.job_id))
                        running.add(key)
                        started[key].append(job.job_id)
                for job in batch:
                    with lock:
                        running.discard(key_of[job.job_id])
                    app.ack(job)
                with lock:
                    if sum(len(v) for v in started.values()) >= len(key_of):
                        done.set()

    assert run_threads(6, consume) == []

    assert overlaps == []
    for key in keys:
        ids = sorted(job_id for job_id, k in key_of.items() if k == key)
        assert started[key] == ids, f"{key} did not run in id order"
    rows = job_factory.conn.execute(
        "SELECT status::text, attempts, count(*) FROM pgqueue.jobs GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("succeeded", 1, 240)]


# --- four processes, 20,000 jobs -------------------------------------------------------------

CONSUMER = """
import json, sys
import pgqueue

dsn, worker_id, out_path, mode = sys.argv[1:5]
leased = []
with pgqueue.App(dsn=dsn, pool_max_size=2) as app:
    app.metrics()                        # connect before the start signal
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    sys.stdin.readline()                 # the start signal
    empty = 0
    while empty < 3:
        batch = app.lease("default", worker_id, max=50, lease_seconds=600)
        if not batch:
            empty += 1
            continue
        empty = 0
        leased += [[j.job_id, j.attempt_id, j.attempt] for j in batch]
        if mode == "many":
            app.ack_many(batch)
        else:
            for job in batch:
                app.ack(job, result=job.job_id)
with open(out_path, "w") as out:
    json.dump(leased, out)
"""

JOBS = 20_000
PROCESSES = 4


@pytest.mark.slow
def test_four_processes_lease_every_job_exactly_once(
    db_dsn: str, job_factory: JobFactory, tmp_path: Path
) -> None:
    with pgqueue.App(dsn=db_dsn) as producer:
        results = producer.enqueue_many([pgqueue.JobSpec("t", {"n": n}) for n in range(JOBS)])
    all_ids = {r.job_id for r in results}
    assert len(all_ids) == JOBS

    outputs = [tmp_path / f"consumer-{i}.json" for i in range(PROCESSES)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CONSUMER,
                db_dsn,
                f"proc-{i}",
                str(outputs[i]),
                "many" if i % 2 == 0 else "one",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    failures: list[str] = []
    try:
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline()  # blocks until connected (or dead)
            if line.strip() != "ready":
                failures.append(
                    f"not ready: {line!r} {process.stderr.read() if process.stderr else ''}"
                )
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            _, stderr = process.communicate(timeout=240)
            if process.returncode != 0:
                failures.append(stderr)
    finally:
        for process in processes:
            process.kill()
    assert failures == []

    leased: list[tuple[int, int, int, str]] = []
    for i, output in enumerate(outputs):
        leased += [
            (job_id, attempt_id, attempt, f"proc-{i}")
            for job_id, attempt_id, attempt in json.loads(output.read_text())
        ]

    counts = Counter(job_id for job_id, *_ in leased)
    assert len(leased) == JOBS
    assert set(counts) == all_ids
    assert max(counts.values()) == 1
    assert {attempt for _, _, attempt, _ in leased} == {1}
    assert len({attempt_id for _, attempt_id, _, _ in leased}) == JOBS
    per_process = Counter(worker for *_, worker in leased)
    assert len(per_process) == PROCESSES  # every process got work

    rows = job_factory.conn.execute(
        "SELECT status::text, attempts, count(*) FROM pgqueue.jobs GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("succeeded", 1, JOBS)]
    assert job_factory.conn.execute("SELECT count(*) FROM pgqueue.job_attempts").fetchone() == (0,)
    holders: dict[int, Any] = dict(
        job_factory.conn.execute("SELECT id, worker_id FROM pgqueue.jobs").fetchall()
    )
    assert {job_id: holders[job_id] for job_id, *_ in leased} == {
        job_id: worker for job_id, _, _, worker in leased
    }
