"""Archive and prune under concurrency and crashes, through the console script.

Two archives at once move every row exactly once; a SIGKILL in the middle of
an archive loses nothing; live jobs are never touched. Where the test needs
the processes to overlap (or to be caught mid-batch), it holds a SHARE lock
on the jobs table and waits until the archive's backends queue behind it,
so the overlap is certain instead of a matter of timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.cli_support import rows, run_cli, start_cli, value
from tests.fixtures.factory import JobFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WAIT_TIMEOUT = 60.0
PROCESS_TIMEOUT = 180.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_TIMEOUT) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting until {what}")
        time.sleep(0.02)


def insert_finished(dsn: str, count: int, status: str = "succeeded", age: str = "8 days") -> None:
    """``count`` jobs that finished ``age`` ago, with an attempt id like real ones."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue.queues (name) VALUES ('bulk') ON CONFLICT DO NOTHING")
        conn.execute(
            "INSERT INTO pgqueue.jobs (task, queue, payload, status, attempts, run_at,"
            " attempt_id, worker_id, attempt_started_at, finished_at)"
            " SELECT 'bulk_task', 'bulk', jsonb_build_object('i', i),"
            " %(status)s::pgqueue.job_status, 1, now() - %(age)s::interval - interval '1 minute',"
            " nextval('pgqueue.attempt_id_seq'), 'w1', now() - %(age)s::interval - interval '1 s',"
            " now() - %(age)s::interval - i * interval '1 millisecond'"
            " FROM generate_series(1, %(count)s) AS i",
            {"status": status, "age": age, "count": count},
        )


def live_and_kept_jobs(job_factory: JobFactory) -> list[int]:
    """Jobs no archive of old succeeded jobs may touch."""
    old = -30 * 86400.0
    return [
        job_factory.insert(status="queued", run_at=old, created_at=old),
        job_factory.insert(status="scheduled", run_at=3600.0, created_at=old),
        job_factory.insert(status="running", run_at=old, attempt_started_at=old, created_at=old),
        job_factory.insert(status="succeeded", finished_at=-3600.0),  # too recent
        job_factory.insert(status="dead", finished_at=old),  # not asked for
        job_factory.insert(status="cancelled", finished_at=old),  # not asked for
    ]


def job_rows(dsn: str, ids: list[int]) -> list[str]:
    return [
        r[0]
        for r in rows(
            dsn,
            "SELECT row_to_json(j)::text FROM pgqueue.jobs j WHERE id = ANY(%s) ORDER BY id",
            (ids,),
        )
    ]


def pgqueue_backends(dsn: str, *, waiting: bool = False) -> int:
    """How many connections of the pgqueue command are open (or waiting on a lock)."""
    lock_filter = (
        " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted)"
        if waiting
        else ""
    )
    return int(
        value(
            dsn,
            "SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database()"
            " AND a.application_name = 'pgqueue' AND a.pid <> pg_backend_pid()" + lock_filter,
        )
    )


@pytest.fixture
def locker(db_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A connection whose transaction can hold a lock on the jobs table."""
    conn = psycopg.connect(db_dsn)
    try:
        yield conn
    finally:
        conn.close()


def still_running(process: subprocess.Popen[str]) -> bool:
    if process.poll() is not None:
        out, err = process.communicate()
        pytest.fail(f"pgqueue exited early ({process.returncode}): {out} {err}")
    return True


def test_two_archives_at_once_move_each_row_exactly_once(
    db_dsn: str, job_factory: JobFactory, locker: psycopg.Connection[tuple[object, ...]]
) -> None:
    total = 50_000
    insert_finished(db_dsn, total)
    kept = live_and_kept_jobs(job_factory)
    kept_before = job_rows(db_dsn, kept)
    old_ids = sorted(
        r[0] for r in rows(db_dsn, "SELECT id FROM pgqueue.jobs WHERE task = 'bulk_task'")
    )

    # Both archives must be running their first batch at the same time.
    locker.execute("LOCK TABLE pgqueue.jobs IN SHARE MODE")
    archives = [
        start_cli(db_dsn, "archive", "--older-than", "7d", "--batch-size", "500", "--json")
        for _ in range(2)
    ]
    try:
        wait_until(
            lambda: (
                all(still_running(p) for p in archives)
                and pgqueue_backends(db_dsn, waiting=True) == 2
            ),
            "both archives wait on the jobs table",
        )
    finally:
        locker.rollback()
    outputs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in archives]

    for process, (_out, err) in zip(archives, outputs, strict=True):
        assert process.returncode == 0, err
    moved = [json.loads(out)["archived"] for out, _ in outputs]
    assert sum(moved) == total
    assert all(m >= 500 for m in moved)  # both took part

    archived_ids = [r[0] for r in rows(db_dsn, "SELECT id FROM pgqueue.jobs_archive ORDER BY id")]
    assert archived_ids == old_ids  # each exactly once (and the primary key forbids twins)
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE task = 'bulk_task'") == 0
    assert job_rows(db_dsn, kept) == kept_before  # live and unrequested jobs untouched
    assert (
        value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive WHERE id = ANY(%s)", (kept,)) == 0
    )


def test_sigkill_mid_archive_loses_nothing(
    db_dsn: str, job_factory: JobFactory, locker: psycopg.Connection[tuple[object, ...]]
) -> None:
    total = 30_000
    insert_finished(db_dsn, total)
    kept = live_and_kept_jobs(job_factory)
    kept_before = job_rows(db_dsn, kept)

    archive = start_cli(db_dsn, "archive", "--older-than", "7d", "--batch-size", "20")
    try:
        wait_until(
            lambda: (
                still_running(archive)
                and value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") >= 500
            ),
            "the archive has moved some batches",
        )
        # Catch it with its next batch in flight, blocked behind our lock, and kill it there.
        locker.execute("LOCK TABLE pgqueue.jobs IN SHARE MODE")
        wait_until(
            lambda: still_running(archive) and pgqueue_backends(db_dsn, waiting=True) == 1,
            "the archive's next batch waits on the jobs table",
        )
        archive.send_signal(signal.SIGKILL)
        archive.wait(timeout=PROCESS_TIMEOUT)
    finally:
        locker.rollback()
        if archive.poll() is None:
            archive.kill()
    assert archive.returncode == -signal.SIGKILL
    # The orphaned statement runs to its end (or rolls back) once its client is gone.
    wait_until(lambda: pgqueue_backends(db_dsn) == 0, "the killed command's backend is gone")

    hot = {r[0] for r in rows(db_dsn, "SELECT id FROM pgqueue.jobs WHERE task = 'bulk_task'")}
    archived = {r[0] for r in rows(db_dsn, "SELECT id FROM pgqueue.jobs_archive")}
    assert 500 <= len(archived) < total  # killed in the middle
    assert not hot & archived
    assert len(hot) + len(archived) == total
    assert job_rows(db_dsn, kept) == kept_before

    # A second run finishes the job.
    rerun = run_cli(db_dsn, "archive", "--older-than", "7d", "--batch-size", "5000", "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {"archived": len(hot)}
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == total


def test_archive_limit_and_every_finished_status(db_dsn: str, job_factory: JobFactory) -> None:
    for status in ("succeeded", "dead", "cancelled"):
        insert_finished(db_dsn, 100, status=status)
    kept = live_and_kept_jobs(job_factory)[:4]  # the queued, scheduled, running, recent
    kept_before = job_rows(db_dsn, kept)

    limited = run_cli(
        db_dsn,
        "archive",
        "--older-than",
        "7d",
        "--status",
        "succeeded,dead,cancelled",
        "--limit",
        "250",
        "--batch-size",
        "40",
        "--json",
        "--progress",
    )
    assert limited.returncode == 0, limited.stderr
    assert json.loads(limited.stdout) == {"archived": 250}
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 250

    rest = run_cli(
        db_dsn,
        "archive",
        "--older-than",
        "7d",
        "--status",
        "succeeded,dead,cancelled",
        "--quiet",
    )
    assert (rest.returncode, rest.stdout) == (0, "")
    by_status = dict(
        rows(db_dsn, "SELECT status::text, count(*) FROM pgqueue.jobs_archive GROUP BY 1")
    )
    # 100 of each, plus the old dead and cancelled jobs of live_and_kept_jobs are not in `kept`.
    assert by_status == {"succeeded": 100, "dead": 101, "cancelled": 101}
    assert job_rows(db_dsn, kept) == kept_before


def test_two_prunes_at_once_delete_each_row_once(db_dsn: str, job_factory: JobFactory) -> None:
    insert_finished(db_dsn, 3000, age="40 days")
    assert run_cli(db_dsn, "archive", "--older-than", "30d", "--quiet").returncode == 0
    live = job_factory.insert(status="queued")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # Old attempt records: 2000 of archived jobs, 5 of a job still queued (kept).
        conn.execute(
            "INSERT INTO pgqueue.job_attempts (id, job_id, attempt, outcome, started_at,"
            " finished_at) SELECT nextval('pgqueue.attempt_id_seq'), a.id, 1, 'failed',"
            " now() - interval '41 days', now() - interval '41 days'"
            " FROM (SELECT id FROM pgqueue.jobs_archive ORDER BY id LIMIT 2000) a"
        )
        conn.execute(
            "INSERT INTO pgqueue.job_attempts (id, job_id, attempt, outcome, started_at,"
            " finished_at) SELECT nextval('pgqueue.attempt_id_seq'), %s, i, 'failed',"
            " now() - interval '41 days', now() - interval '41 days'"
            " FROM generate_series(1, 5) i",
            (live,),
        )

    prunes = [
        start_cli(db_dsn, "prune", "--older-than", "30d", "--batch-size", "100", "--json")
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in prunes]
    for process, (_, err) in zip(prunes, outputs, strict=True):
        assert process.returncode == 0, err
    results = [json.loads(out) for out, _ in outputs]
    assert sum(r["attempts"] for r in results) == 2000
    assert sum(r["archived_jobs"] for r in results) == 3000
    assert sum(r["pruned"] for r in results) == 5000
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 0
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.job_attempts") == 5  # the live job's
