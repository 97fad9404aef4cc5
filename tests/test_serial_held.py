"""Held serial-key jobs (0015): a queued job blocked by an earlier live job of
its key is marked ``serial_held`` whatever path enqueued it, the lease skips it
without visiting it, and it is un-held when its blocker finishes (or by the
reaper's sweep after a race), never before: per-key order holds throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.fixtures.factory import JobFactory
from tests.test_query_plan import _explained, _load_auto_explain, plan_nodes


def held(job_factory: JobFactory, job_id: int) -> bool:
    return bool(job_factory.row(job_id)["serial_held"])


def leased_ids(jobs: list[pgqueue.LeasedJob]) -> list[int]:
    return [j.job_id for j in jobs]


@pytest.fixture
def running_blocker(app: pgqueue.App) -> pgqueue.LeasedJob:
    app.enqueue("t", serial_key="k")
    (blocker,) = app.lease("default", "w", max=1)
    return blocker


# --- set on every enqueue path ---------------------------------------------------------------


def test_enqueue_of_a_blocked_job_holds_it_on_every_path(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    first = app.enqueue("t", serial_key="k").job_id
    by_enqueue = app.enqueue("t", serial_key="k").job_id
    many = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("t", serial_key="k")] * 3)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgqueue.enqueue('t', '{}', serial_key => 'k')").fetchone()
        assert row is not None
        by_sql = int(row[0])
        batch = conn.execute(
            "SELECT job_id FROM pgqueue.enqueue_batch(%s::jsonb)",
            (json.dumps([{"task": "t", "serial_key": "k"}, {"task": "t", "serial_key": "k"}]),),
        ).fetchall()
    free = app.enqueue("t", serial_key="other").job_id
    plain = app.enqueue("t").job_id

    assert not held(job_factory, first)
    for job_id in [by_enqueue, *many, by_sql, *(r[0] for r in batch)]:
        assert held(job_factory, job_id), job_id
    assert not held(job_factory, free)
    assert not held(job_factory, plain)


def test_a_batch_of_one_key_holds_all_but_its_first_job(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    ids = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("t", serial_key="k")] * 4)]
    assert [held(job_factory, i) for i in sorted(ids)] == [False, True, True, True]


def test_a_job_behind_a_scheduled_one_is_held_and_released_when_that_one_runs_and_ends(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    scheduled = app.enqueue("t", serial_key="k", delay=3600).job_id
    later = app.enqueue("t", serial_key="k").job_id
    assert held(job_factory, later)
    assert app.lease("default", "w", max=10) == []

    job_factory.make_due(scheduled)
    (job,) = app.lease("default", "w", max=10)
    assert job.job_id == scheduled
    assert held(job_factory, later)
    app.ack(job)
    assert not held(job_factory, later)
    assert leased_ids(app.lease("default", "w", max=10)) == [later]


# --- cleared when the blocker ends ------------------------------------------------------------


def test_ack_of_the_blocker_releases_only_the_next_job(
    app: pgqueue.App, job_factory: JobFactory, running_blocker: pgqueue.LeasedJob
) -> None:
    second = app.enqueue("t", serial_key="k").job_id
    third = app.enqueue("t", serial_key="k").job_id
    assert held(job_factory, second)
    assert held(job_factory, third)

    app.ack(running_blocker)

    assert not held(job_factory, second)
    assert held(job_factory, third)
    (job,) = app.lease("default", "w", max=10)
    assert job.job_id == second
    app.ack(job)
    assert not held(job_factory, third)
    assert leased_ids(app.lease("default", "w", max=10)) == [third]


def test_the_blocker_failing_to_dead_releases_the_next_job(
    app: pgqueue.App, job_factory: JobFactory, running_blocker: pgqueue.LeasedJob
) -> None:
    second = app.enqueue("t", serial_key="k").job_id
    assert app.fail(running_blocker, "boom", permanent=True) is pgqueue.JobStatus.DEAD
    assert not held(job_factory, second)
    assert leased_ids(app.lease("default", "w", max=10)) == [second]


def test_cancelling_a_queued_blocker_releases_the_next_job(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    blocker = app.enqueue("t", serial_key="k", delay=3600).job_id
    second = app.enqueue("t", serial_key="k").job_id
    assert held(job_factory, second)

    app.cancel(blocker)

    assert job_factory.row(blocker)["status"] == "cancelled"
    assert not held(job_factory, second)
    assert leased_ids(app.lease("default", "w", max=10)) == [second]


def test_deleting_a_live_blocker_releases_the_next_job(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    blocker = app.enqueue("t", serial_key="k", delay=3600).job_id
    second = app.enqueue("t", serial_key="k").job_id
    job_factory.conn.execute("DELETE FROM pgqueue.jobs WHERE id = %s", (blocker,))
    assert not held(job_factory, second)
    assert leased_ids(app.lease("default", "w", max=10)) == [second]


def test_archiving_the_finished_blocker_leaves_the_next_job_free(
    app: pgqueue.App, job_factory: JobFactory, running_blocker: pgqueue.LeasedJob
) -> None:
    second = app.enqueue("t", serial_key="k").job_id
    app.ack(running_blocker)
    job_factory.conn.execute(
        "UPDATE pgqueue.jobs SET finished_at = now() - interval '2 days' WHERE id = %s",
        (running_blocker.job_id,),
    )

    assert app.archive("1d") == 1

    assert job_factory.conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE id = %s", (running_blocker.job_id,)
    ).fetchone() == (0,)
    assert not held(job_factory, second)
    assert leased_ids(app.lease("default", "w", max=10)) == [second]


def test_a_retried_blocker_runs_again_before_the_held_job(
    app: pgqueue.App, job_factory: JobFactory, running_blocker: pgqueue.LeasedJob
) -> None:
    second = app.enqueue("t", serial_key="k", priority=50).job_id
    retry_at = datetime.now(UTC) - timedelta(seconds=1)
    assert app.fail(running_blocker, "boom", retry_at=retry_at) is pgqueue.JobStatus.QUEUED

    assert not held(job_factory, running_blocker.job_id)
    assert held(job_factory, second)
    (again,) = app.lease("default", "w", max=10)
    assert again.job_id == running_blocker.job_id
    app.nack(again)  # handed back unrun: still first of its key
    assert held(job_factory, second)
    (again,) = app.lease("default", "w", max=10)
    assert again.job_id == running_blocker.job_id
    app.ack(again)
    assert leased_ids(app.lease("default", "w", max=10)) == [second]


def test_a_requeued_dead_job_behind_a_live_one_is_held(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    earlier = job_factory.insert(status="dead", serial_key="k")
    live = app.enqueue("t", serial_key="k", delay=3600).job_id
    dead = job_factory.insert(status="dead", serial_key="k")
    assert earlier < live < dead

    app.requeue_dead(dead)
    app.requeue_dead(earlier)

    assert held(job_factory, dead)
    assert not held(job_factory, earlier)
    assert leased_ids(app.lease("default", "w", max=10)) == [earlier]


# --- the sweep -------------------------------------------------------------------------------


def test_reap_unholds_a_stale_held_job(app: pgqueue.App, job_factory: JobFactory) -> None:
    blocker = app.enqueue("t", serial_key="k", delay=3600).job_id
    blocked = app.enqueue("t", serial_key="k").job_id
    stale = app.enqueue("t", serial_key="lonely").job_id
    job_factory.conn.execute("UPDATE pgqueue.jobs SET serial_held = true WHERE id = %s", (stale,))
    assert app.lease("default", "w", max=10) == []

    app.reap()

    assert not held(job_factory, stale)
    assert held(job_factory, blocked)  # still blocked by the scheduled job
    assert job_factory.row(blocker)["status"] == "scheduled"
    assert leased_ids(app.lease("default", "w", max=10)) == [stale]


def test_an_enqueue_racing_its_blockers_ack_is_repaired_by_the_sweep(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str, running_blocker: pgqueue.LeasedJob
) -> None:
    """The enqueue sees the blocker running and holds its job; the ack, which
    commits first, cannot see the uncommitted job to release it."""
    with psycopg.connect(db_dsn) as producer:
        row = producer.execute("SELECT pgqueue.enqueue('t', '{}', serial_key => 'k')").fetchone()
        assert row is not None
        racing = int(row[0])
        app.ack(running_blocker)
        producer.commit()

    assert held(job_factory, racing)
    assert app.lease("default", "w", max=10) == []
    app.reap()
    assert not held(job_factory, racing)
    assert leased_ids(app.lease("default", "w", max=10)) == [racing]


def test_the_sweep_examines_one_job_per_key_and_wraps_around(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    stale = [app.enqueue("t", serial_key=f"k{i}").job_id for i in range(30)]
    job_factory.conn.execute(
        "UPDATE pgqueue.jobs SET serial_held = true WHERE id = ANY(%s)", (stale,)
    )
    freed = 0
    for _ in range(200):
        row = job_factory.conn.execute("SELECT pgqueue.serial_unhold_stale(7)").fetchone()
        assert row is not None
        freed += row[0]
        if freed == len(stale):
            break
    assert freed == len(stale)
    assert not any(held(job_factory, i) for i in stale)


# --- plans ----------------------------------------------------------------------------------


def test_the_lease_skips_held_jobs_through_the_ready_index(
    app: pgqueue.App, job_factory: JobFactory, db_dsn: str
) -> None:
    app.enqueue("blocker", serial_key="k", delay=3600)
    app.enqueue_many([pgqueue.JobSpec("blocked", serial_key="k", priority=5)] * 2000)
    ready = app.enqueue("ready").job_id
    job_factory.conn.execute("ANALYZE pgqueue.jobs")

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _load_auto_explain(conn)
        leased, plans = _explained(
            conn,
            "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['default'], 'w', 1)",
        )
    assert [r[0] for r in leased] == [ready]
    picking = [p for p in plans if "status = 'queued' AND" in p["Query Text"]]
    assert picking
    for plan in picking:
        nodes = plan_nodes(plan["Plan"])
        scans = [n for n in nodes if n.get("Index Name") == "jobs_ready_idx"]
        assert scans, json.dumps(plan, indent=1)
        # serial_held is an index condition: the held jobs are never read.
        assert any("serial_held" in n.get("Index Cond", "") for n in scans), json.dumps(plan)
        pick_sorts = [
            n
            for n in nodes
            if n["Node Type"] == "Sort" and any(k.startswith("j.") for k in n["Sort Key"])
        ]
        assert pick_sorts == [], json.dumps(plan, indent=1)


def test_oldest_ready_counts_held_jobs_too(app: pgqueue.App, job_factory: JobFactory) -> None:
    old = datetime.now(UTC) - timedelta(hours=1)
    app.enqueue("t", serial_key="k", delay=3600)
    held_job = app.enqueue("t", serial_key="k", run_at=old).job_id
    app.enqueue("t", priority=9)
    assert held(job_factory, held_job)
    row = job_factory.conn.execute(
        "SELECT pgqueue.queue_oldest_ready('default') = %s", (job_factory.row(held_job)["run_at"],)
    ).fetchone()
    assert row == (True,)


# --- processes enqueueing and draining many keys ------------------------------------------------

PRODUCER = """
import sys
import psycopg
import pgqueue

dsn, first_key, keys, per_key = sys.argv[1], *map(int, sys.argv[2:5])
with pgqueue.App(dsn=dsn, pool_max_size=1) as app, psycopg.connect(dsn, autocommit=True) as conn:
    for n in range(per_key):
        for k in range(first_key, first_key + keys):
            key = f"key-{k}"
            path = (n + k) % 3
            if path == 0:
                app.enqueue("t", {"key": key}, serial_key=key, priority=n % 4)
            elif path == 1:
                app.enqueue_many([pgqueue.JobSpec("t", {"key": key}, serial_key=key)])
            else:
                conn.execute(
                    "SELECT pgqueue.enqueue('t', jsonb_build_object('key', %s::text),"
                    " serial_key => %s)", (key, key))
"""

CONSUMER = """
import sys
from datetime import UTC, datetime, timedelta
import psycopg
import pgqueue

dsn, worker_id, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = psycopg.connect(dsn, autocommit=True)
with pgqueue.App(dsn=dsn, pool_max_size=2) as app:
    for _ in range(100_000):
        batch = app.lease("default", worker_id, max=5, lease_seconds=600)
        if not batch:
            done = log.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE status = 'succeeded'").fetchone()[0]
            if done >= total:
                break
            app.reap()
            continue
        for job in batch:
            key = job.payload["key"]
            log.execute("INSERT INTO serial_log (key, job_id, event) VALUES (%s, %s, 'start')",
                        (key, job.job_id))
            log.execute("INSERT INTO serial_log (key, job_id, event) VALUES (%s, %s, 'end')",
                        (key, job.job_id))
            if job.attempt == 1 and job.job_id % 5 == 0:
                app.fail(job, "again", retry_at=datetime.now(UTC) - timedelta(seconds=1))
            else:
                app.ack(job)
"""


@pytest.mark.slow
def test_processes_enqueueing_and_draining_many_keys_keep_each_keys_order(
    db_dsn: str, job_factory: JobFactory, tmp_path: Path
) -> None:
    keys_per_producer, per_key, producers, consumers = 15, 12, 2, 3
    total = keys_per_producer * per_key * producers
    job_factory.conn.execute(
        "CREATE TABLE serial_log (seq bigserial PRIMARY KEY, key text, job_id bigint, event text)"
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PRODUCER,
                db_dsn,
                str(p * keys_per_producer),
                str(keys_per_producer),
                str(per_key),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(producers)
    ] + [
        subprocess.Popen(
            [sys.executable, "-c", CONSUMER, db_dsn, f"w{c}", str(total)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in range(consumers)
    ]
    failures = []
    try:
        for proc in procs:
            _, stderr = proc.communicate(timeout=600)
            if proc.returncode != 0:
                failures.append(stderr)
    finally:
        for proc in procs:
            proc.kill()
    assert failures == []

    statuses = job_factory.conn.execute(
        "SELECT status::text, serial_held, count(*) FROM pgqueue.jobs GROUP BY 1, 2"
    ).fetchall()
    assert statuses == [("succeeded", False, total)]
    events: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for key, job_id, event in job_factory.conn.execute(
        "SELECT key, job_id, event FROM serial_log ORDER BY seq"
    ).fetchall():
        events[key].append((job_id, event))
    assert len(events) == keys_per_producer * producers
    for key, seen in events.items():
        # One job of the key at a time, in id order (a retried one again first).
        assert [e for _, e in seen] == ["start", "end"] * (len(seen) // 2), key
        ids = [job_id for job_id, e in seen if e == "start"]
        assert ids == sorted(ids), (key, ids)
        assert len(set(ids)) == per_key, key
