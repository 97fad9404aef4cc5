"""Revision 0017 (lean enqueue): the jobs CHECK constraints in cheaper forms
refuse exactly the rows their 0005 forms refused, and enqueue_job's two insert
paths (plain without a dedup key, ON CONFLICT with one) stay correct side by
side under concurrency, registering the queue and notifying as before."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

import pgqueue

# The 0005 forms, which the new constraints must match row for row.
OLD_BACKOFF = """
coalesce(coalesce(%(b)s::real BETWEEN 0 AND 31536000, true)
         AND coalesce(%(f)s::real BETWEEN 0 AND 1000, true)
         AND coalesce(%(m)s::real BETWEEN 0 AND 31536000, true)
         AND coalesce(%(j)s::real BETWEEN 0 AND 1, true), true)
"""
OLD_RUN_AT = (
    "%(t)s::timestamptz >= '1970-01-01 00:00:00+00'"
    " AND %(t)s::timestamptz < '2500-01-01 00:00:00+00'"
)

EDGES = [
    None, "-Infinity", "-1", "-1e-45", "-0", "0", "1e-45", "1", "1.0000001", "999.99994",
    "1000", "1000.0001", "31535998", "31536000", "31536002", "3.4e38", "Infinity", "NaN",
]  # fmt: skip


def _accepted(conn: psycopg.Connection, statement: str, params: dict[str, object]) -> bool:
    try:
        with conn.transaction():
            conn.execute(statement, params)
    except psycopg.errors.CheckViolation:
        return False
    return True


def test_backoff_constraint_refuses_what_it_refused(db_dsn: str) -> None:
    insert = (
        "INSERT INTO pgqueue.jobs (status, run_at, queue, task, payload,"
        " backoff_base, backoff_factor, backoff_max, backoff_jitter)"
        " VALUES ('queued', now(), 'q', 't', '{}', %(b)s, %(f)s, %(m)s, %(j)s)"
    )
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        checked = Counter[bool]()
        # Each edge value in each column, the others NULL or in range.
        for column in "bfmj":
            for other in (None, "0.5"):
                for value in EDGES:
                    params: dict[str, object] = dict.fromkeys("bfmj", other)
                    params[column] = value
                    row = conn.execute("SELECT " + OLD_BACKOFF, params).fetchone()
                    assert row is not None
                    expected = bool(row[0])
                    assert _accepted(conn, insert, params) is expected, params
                    checked[expected] += 1
        assert checked[True]
        assert checked[False]


def test_run_at_constraint_refuses_what_it_refused(db_dsn: str) -> None:
    insert = (
        "INSERT INTO pgqueue.jobs (status, run_at, queue, task, payload)"
        " VALUES ('queued', %(t)s, 'q', 't', '{}')"
    )
    times = [
        "-infinity", "1969-12-31 23:59:59.999999+00", "1970-01-01 00:00:00+00", "2026-01-01+00",
        "2499-12-31 23:59:59.999999+00", "2500-01-01 00:00:00+00", "infinity",
    ]  # fmt: skip
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in times:
            row = conn.execute("SELECT " + OLD_RUN_AT, {"t": t}).fetchone()
            assert row is not None
            assert _accepted(conn, insert, {"t": t}) is bool(row[0]), t


def test_plain_and_dedup_enqueues_side_by_side(db_dsn: str) -> None:
    """Threads enqueue with and without a dedup key at once: every plain
    enqueue creates its own job, each key gets exactly one live job that every
    caller of that key is told about."""
    threads, rounds, keys = 6, 15, 3
    plain: list[int] = []
    dedup: list[tuple[str, int, bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        app = pgqueue.App(dsn=db_dsn)
        try:
            start.wait()
            for i in range(rounds):
                if (n + i) % 2:
                    r = app.enqueue("t", {"n": n, "i": i}, queue="side")
                    assert r.created
                    with lock:
                        plain.append(r.job_id)
                else:
                    key = f"k{i % keys}"
                    r = app.enqueue("t", {"n": n}, queue="side", dedup_key=key)
                    with lock:
                        dedup.append((key, r.job_id, r.created))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            app.close()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors

    assert len(set(plain)) == len(plain) == threads * rounds // 2
    by_key: dict[str, set[int]] = {}
    for key, job_id, _ in dedup:
        by_key.setdefault(key, set()).add(job_id)
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    assert Counter(key for key, _, created in dedup if created) == dict.fromkeys(by_key, 1)
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT dedup_key, count(*) FROM pgqueue.jobs WHERE queue = 'side' GROUP BY 1"
        ).fetchall()
        assert dict(rows) == {None: len(plain), **dict.fromkeys(by_key, 1)}
        assert conn.execute(
            "SELECT count(*) FROM pgqueue.queues WHERE name = 'side'"
        ).fetchone() == (1,)


@pytest.mark.parametrize("dedup_key", [None, "k"])
def test_enqueue_job_registers_the_queue_and_notifies(db_dsn: str, dedup_key: str | None) -> None:
    """A job to a queue never seen registers it, once, and each created job
    sends the notification workers wait for (the job's id the first time in a
    transaction); a deduplicated enqueue sends none."""
    from pgqueue.queries import channel_for

    channel = channel_for("pgqueue")
    with (
        psycopg.connect(db_dsn, autocommit=True) as listener,
        psycopg.connect(db_dsn, autocommit=True) as conn,
    ):
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        call = (
            "SELECT job_id, created FROM pgqueue.enqueue_job(%s, '{}'::jsonb, 'fresh',"
            " p_dedup_key => %s)"
        )
        first = conn.execute(call, ("t", dedup_key)).fetchone()
        second = conn.execute(call, ("t", dedup_key)).fetchone()
        assert first is not None
        assert second is not None
        assert first[1]
        assert second[1] is (dedup_key is None)
        assert conn.execute(
            "SELECT count(*) FROM pgqueue.queues WHERE name = 'fresh'"
        ).fetchone() == (1,)
        got = [n.payload for n in listener.notifies(timeout=1.0, stop_after=2)]
    expected = [f"j:fresh#{first[0]}"]
    if dedup_key is None:
        expected.append(f"j:fresh#{second[0]}")
    assert got == expected
