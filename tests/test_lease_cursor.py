"""Lease cursors: a worker's lease starts where its last one stopped, and a
job that becomes ready behind that position is still leased at once.

The SQL half: ``lease_jobs``' ``p_after`` starts the scan after a key, and
every write that makes a job ready announces its key once per queue and
transaction (``announce_ready``, on the schema's ``:k`` channel). The worker
half: real worker processes with a 30 s poll, so that a job they run within
the bound was found through its announcement, not by polling or by the
cursors' periodic reset (pgqueue.worker.cursors.RESET_SECONDS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.queries import announce_channel_for
from pgqueue.worker.cursors import LeaseCursors, LeaseKey, parse_announcement
from tests.fixtures.workers import WorkerProcess, Workers, wait_until

LONG_POLL = "30s"
PROMPT = 15.0  # far below the poll interval and the cursors' reset


# --- the cursors, without a database --------------------------------------------------


def key(priority: int, second: int, job_id: int) -> LeaseKey:
    return LeaseKey(priority, datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC), job_id)


def test_a_lease_moves_the_cursor_to_its_last_job() -> None:
    cursors = LeaseCursors(["mail"])
    cursors.activate()
    assert cursors.request() == {}  # nothing leased yet: from the head
    cursors.advance([("mail", key(0, 1, 1), True), ("mail", key(0, 2, 2), True)])
    assert cursors.request() == {"mail": [0, "2026-01-01T00:00:02+00:00", 2]}


def test_an_announcement_moves_the_cursor_back_to_just_before_the_job() -> None:
    cursors = LeaseCursors(["mail"])
    cursors.activate()
    cursors.request()
    cursors.advance([("mail", key(0, 5, 5), True)])
    cursors.rewind("mail", key(0, 9, 9))  # ahead: nothing to do
    assert cursors.keys["mail"] == key(0, 5, 5)
    cursors.rewind("mail", key(3, 9, 9))  # a higher priority is earlier in lease order
    assert cursors.keys["mail"] == key(3, 9, 8)
    cursors.rewind("other", key(0, 1, 1))  # not served: ignored
    assert "other" not in cursors.keys


def test_an_announcement_during_a_lease_wins_over_its_result() -> None:
    cursors = LeaseCursors(["mail"])
    cursors.activate()
    cursors.request()
    cursors.advance([("mail", key(0, 5, 5), True)])
    cursors.request()  # a lease in flight
    cursors.rewind("mail", key(0, 3, 3))  # committed after the lease's snapshot
    cursors.advance([("mail", key(0, 7, 7), True)])
    assert cursors.keys["mail"] == key(0, 3, 2)


def test_task_limits_keep_a_queue_at_its_head() -> None:
    cursors = LeaseCursors(["mail"])
    cursors.activate()
    cursors.request()
    cursors.advance([("mail", key(0, 5, 5), True), ("mail", key(0, 6, 6), False)])
    assert cursors.request() == {"mail": None}


def test_without_the_listener_or_after_a_reset_there_are_no_cursors() -> None:
    clock = [0.0]
    cursors = LeaseCursors(["mail"], clock=lambda: clock[0])
    assert cursors.request() is None  # not activated: announcements are not heard
    cursors.activate()
    cursors.request()
    cursors.advance([("mail", key(0, 5, 5), True)])
    clock[0] = 10_000.0
    cursors.maybe_reset()
    assert cursors.request() == {}
    cursors.advance([])
    cursors.deactivate()
    assert cursors.request() is None


def test_an_every_queue_worker_learns_its_queues() -> None:
    cursors = LeaseCursors(None)
    cursors.activate()
    assert cursors.needs_discovery()
    assert cursors.request() is None
    cursors.rewind("b", key(0, 4, 4))  # announced while discovering
    cursors.discovered_queues(["a", "b"])
    assert cursors.request() == {"a": None, "b": None}  # b's older jobs come first
    cursors.advance([("a", key(0, 1, 1), True)])
    cursors.know("c")
    cursors.rewind("d", key(0, 2, 2))
    assert cursors.keys == {"a": key(0, 1, 1), "b": None, "c": None, "d": key(0, 2, 1)}


def test_announcements_are_parsed_strictly() -> None:
    parsed = parse_announcement("mail 5 1767225600000001 42")
    assert parsed == ("mail", LeaseKey(5, datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC), 42))
    for junk in ("", "mail", "mail 1 2", "mail x 1 2", "mail 1 2 3 4", " 1 2 3"):
        assert parse_announcement(junk) is None


# --- the SQL half ---------------------------------------------------------------------


@pytest.fixture
def announcements(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(db_dsn, autocommit=True)
    conn.execute(f'LISTEN "{announce_channel_for("pgqueue")}"')
    yield conn
    conn.close()


def received(conn: psycopg.Connection[Any]) -> list[tuple[str, LeaseKey]]:
    out = []
    for note in conn.notifies(timeout=0.5, stop_after=50):
        parsed = parse_announcement(note.payload)
        assert parsed is not None, note.payload
        out.append(parsed)
    return out


def lease_after(dsn: str, after: dict[str, Any] | None, limit: int = 10) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT job_id, priority, run_at, ordered FROM pgqueue.lease_jobs("
            "ARRAY['mail'], 'w1', %s, NULL, NULL, %s::jsonb)",
            (limit, json.dumps(after) if after is not None else None),
        ).fetchall()


def test_the_lease_starts_after_its_cursor(app: pgqueue.App, db_dsn: str) -> None:
    ids = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("t", queue="mail")] * 5)]
    third = app.get_job(ids[2])
    rows = lease_after(db_dsn, {"mail": [0, third.run_at.isoformat(), ids[2]]})
    assert [r[0] for r in rows] == ids[3:]  # not the three before it, though they are ready
    assert all(r[3] for r in rows)
    assert {app.get_job(i).status for i in ids[:3]} == {pgqueue.JobStatus.QUEUED}
    # A cursor in a higher priority than any job: the lower priorities follow in order.
    assert [r[0] for r in lease_after(db_dsn, {"mail": [9, third.run_at.isoformat(), 0]})] == ids[
        :3
    ]


def test_a_malformed_cursor_is_the_head(app: pgqueue.App, db_dsn: str) -> None:
    ids = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("t", queue="mail")] * 2)]
    for after in ({"mail": None}, {"mail": [1, 2]}, {"mail": ["a", "b", "c"]}, {"mail": 5}):
        with psycopg.connect(db_dsn) as conn:
            rows = conn.execute(
                "SELECT job_id FROM pgqueue.lease_jobs(ARRAY['mail'], 'w1', 10, NULL, NULL, %s)",
                (json.dumps(after),),
            ).fetchall()
            conn.rollback()
        assert [r[0] for r in rows] == ids, after


def test_enqueues_announce_their_first_key_once_per_transaction(
    app: pgqueue.App, db_dsn: str, announcements: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_dsn) as conn:
        first = app.enqueue("t", queue="mail", conn=conn).job_id
        app.enqueue("t", queue="mail", conn=conn)  # later in lease order: not announced
        urgent = app.enqueue("t", queue="mail", priority=5, conn=conn).job_id  # earlier
        app.enqueue("t", queue="other", conn=conn)
        app.enqueue("t", queue="mail", delay=3600, conn=conn)  # not ready: not announced
    got = received(announcements)
    assert [(q, k.priority, k.job_id) for q, k in got] == [
        ("mail", 0, first),
        ("mail", 5, urgent),
        ("other", 0, urgent + 1),
    ]
    assert got[0][1].run_at == app.get_job(first).run_at  # to the microsecond

    bulk = app.enqueue_many([pgqueue.JobSpec("t", queue="mail")] * 3)
    assert [(q, k.job_id) for q, k in received(announcements)] == [("mail", bulk[0].job_id)]


def test_jobs_ready_again_announce_their_key(
    app: pgqueue.App, db_dsn: str, announcements: psycopg.Connection[Any]
) -> None:
    nacked, failed = (app.enqueue("t", queue="mail").job_id for _ in range(2))
    received(announcements)
    leased = {j.job_id: j for j in app.lease("mail", "w1", max=2)}
    app.nack(leased[nacked])
    app.fail(leased[failed], "boom", retry_at=datetime.now(UTC) - timedelta(seconds=1))
    assert sorted(k.job_id for _, k in received(announcements)) == [nacked, failed]


# --- real workers ---------------------------------------------------------------------


def spawn_listening(workers: Workers, *args: str) -> WorkerProcess:
    worker = workers.spawn("--poll-interval", LONG_POLL, "--concurrency", "4", *args)
    worker.wait_registered()
    wait_until(lambda: _listening(worker.dsn), 30, "the worker's LISTEN connection", [worker])
    return worker


def _listening(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
        ).fetchone()
    return bool(row and row[0])


def run_and_wait(workers: Workers, app: pgqueue.App, count: int) -> None:
    """Enqueue ``count`` jobs and wait for them: the worker's cursor moves past them."""
    ids = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("echo", {"value": 1})] * count)]
    workers.wait_statuses(ids, ["succeeded"], timeout=60)


@pytest.mark.parametrize("queues", [("--queue", "default"), ()], ids=["given-queue", "every-queue"])
def test_a_job_committed_late_behind_the_cursor_runs_at_once(
    workers: Workers, tasks_app: pgqueue.App, db_dsn: str, queues: tuple[str, ...]
) -> None:
    spawn_listening(workers, *queues)
    with psycopg.connect(db_dsn) as late:
        late.execute("SELECT now()")  # its run_at: this transaction's start
        run_and_wait(workers, tasks_app, 20)  # jobs with a later run_at, all leased
        job_id = tasks_app.enqueue("echo", {"value": 2}, conn=late).job_id
    workers.wait_statuses([job_id], ["succeeded"], timeout=PROMPT)


def test_a_higher_priority_job_runs_at_once(workers: Workers, tasks_app: pgqueue.App) -> None:
    spawn_listening(workers)
    run_and_wait(workers, tasks_app, 20)
    job_id = tasks_app.enqueue("echo", {"value": 2}, priority=9).job_id
    workers.wait_statuses([job_id], ["succeeded"], timeout=PROMPT)


def test_a_job_handed_back_behind_the_cursor_runs_at_once(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    held = tasks_app.enqueue("echo", {"value": 1}, queue="q1").job_id
    [leased] = tasks_app.lease("q1", "someone-else")
    spawn_listening(workers, "--queue", "q1")
    after = [
        r.job_id
        for r in tasks_app.enqueue_many([pgqueue.JobSpec("echo", {"value": 3}, queue="q1")] * 5)
    ]
    workers.wait_statuses(after, ["succeeded"], timeout=60)  # the cursor is past `held`
    tasks_app.nack(leased)
    workers.wait_statuses([held], ["succeeded"], timeout=PROMPT)


def test_a_released_serial_job_and_workflow_step_run_at_once(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    spawn_listening(workers)
    first = tasks_app.enqueue("nap", {"key": "s1", "seconds": 1}, serial_key="k").job_id
    second = tasks_app.enqueue("echo", {"value": 2}, serial_key="k").job_id
    wf = tasks_app.workflow("cursor")
    step1 = wf.add("nap", {"key": "w1", "seconds": 1})
    step2 = wf.add("echo", {"value": 3}, after=step1)
    run = wf.enqueue()
    run_and_wait(workers, tasks_app, 20)  # the cursor moves past the held jobs' keys
    workers.wait_statuses(
        [first, second, run.jobs[step1.name], run.jobs[step2.name]], ["succeeded"], timeout=PROMPT
    )
