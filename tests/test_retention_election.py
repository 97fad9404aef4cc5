"""The fleet's maintenance with real worker processes: one worker at a time
holds the turn; a SIGKILLed holder is replaced within a minute; a worker
that stops hands its turn on; --no-maintenance workers never take it; the
holder's passes delete finished jobs past their retention."""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.fixtures.factory import JobFactory
from tests.fixtures.workers import Workers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TAKEOVER = 75.0  # a lapsed turn (45 s) plus a claim interval, with room for a loaded machine


def turn(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT holder, held_until, last_run_at, last_run_by, last_error"
            " FROM pgqueue.maintenance"
        ).fetchone()
    assert row is not None
    return dict(
        zip(("holder", "held_until", "last_run_at", "last_run_by", "last_error"), row, strict=True)
    )


def worker_ids(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[1]: r[0] for r in conn.execute("SELECT id, pid FROM pgqueue.workers")}


def test_one_holder_a_killed_one_is_replaced_and_a_stopping_one_hands_on(
    workers: Workers, tasks_app: pgqueue.App, db_dsn: str
) -> None:
    first = workers.spawn()
    second = workers.spawn()
    first.wait_registered()
    second.wait_registered()
    ids = worker_ids(db_dsn)
    wait_until(
        lambda: turn(db_dsn)["last_run_at"] is not None,
        60,
        "a first maintenance pass",
        [first, second],
    )
    holder = turn(db_dsn)["holder"]
    assert holder in (ids[first.pid], ids[second.pid])
    killed, survivor = (first, second) if holder == ids[first.pid] else (second, first)

    killed.send(signal.SIGKILL)
    killed.wait_exit()
    wait_until(
        lambda: turn(db_dsn)["holder"] == ids[survivor.pid],
        TAKEOVER,
        "the surviving worker to take the maintenance turn",
        [survivor],
    )
    after = datetime.now(turn(db_dsn)["held_until"].tzinfo)
    wait_until(
        lambda: (turn(db_dsn)["last_run_at"] or after) > after,
        30,
        "a pass of the new holder",
        [survivor],
    )
    assert turn(db_dsn)["last_run_by"] == ids[survivor.pid]

    survivor.send(signal.SIGTERM)
    assert survivor.wait_exit() == 0
    assert turn(db_dsn)["holder"] is None  # handed on at once, not left to lapse


def test_workers_without_maintenance_never_take_the_turn(
    workers: Workers, tasks_app: pgqueue.App, db_dsn: str
) -> None:
    quiet = workers.spawn("--no-maintenance")
    active = workers.spawn()
    quiet.wait_registered()
    active.wait_registered()
    ids = worker_ids(db_dsn)
    wait_until(lambda: turn(db_dsn)["holder"] == ids[active.pid], 60, "the turn", [active])
    active.send(signal.SIGTERM)
    active.wait_exit()
    # The other worker keeps leasing and asks for nothing: the turn stays free.
    job = tasks_app.enqueue("echo", {"value": 1}).job_id
    workers.wait_statuses([job], ["succeeded"], timeout=30)
    wait_until(lambda: quiet.logged("job succeeded"), 30, "the job's log line", [quiet])
    assert turn(db_dsn)["holder"] is None


def test_the_holder_makes_leaves_and_deletes_finished_jobs_past_their_retention(
    workers: Workers, tasks_app: pgqueue.App, db_dsn: str, job_factory: JobFactory
) -> None:
    old = [job_factory.insert(status="succeeded", finished_at=-3 * 86400.0) for _ in range(3)]
    kept = job_factory.insert(status="dead", finished_at=-3 * 86400.0)  # dead: 30 days
    worker = workers.spawn()
    worker.wait_registered()

    def gone() -> bool:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s)", (old,)
            ).fetchone()
        return bool(row and row[0] == 0)

    wait_until(gone, 60, "the old succeeded jobs to be deleted", [worker])
    assert tasks_app.get_job(kept).status == pgqueue.JobStatus.DEAD

    def leaves() -> int:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_inherits"
                " WHERE inhparent = 'pgqueue.jobs_succeeded'::regclass"
            ).fetchone()
        return int(row[0]) if row else 0

    # The default leaf and three leaves of the coming finish times.
    wait_until(lambda: leaves() == 4, 60, "the leaves of the coming finish times", [worker])
