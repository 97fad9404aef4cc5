"""The layout that keeps a job's writes cheap (docs/storage-layout.md): the lease
is a HOT update of jobs_live, no index of it mentions a column the lease
writes, the completion moves the row once (a delete in jobs_live, an insert
in its status's partition), no BEFORE UPDATE row trigger locks every updated
row, and the lease/completion columns end the row."""

from __future__ import annotations

import psycopg

import pgqueue

#: What lease_jobs writes; an index on any of them makes every lease non-HOT.
LEASE_WRITES = {
    "status",
    "attempts",
    "attempt_id",
    "attempt_started_at",
    "lease_expires_at",
    "worker_id",
}


def test_no_index_of_jobs_mentions_a_column_the_lease_writes(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            """
            SELECT i.indexrelid::regclass::text, a.attname
            FROM pg_index i
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum > 0
            WHERE i.indrelid = 'pgqueue.jobs_live'::regclass
              AND (a.attnum = ANY (i.indkey)
                   OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M')
                   OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
            """
        ).fetchall()
    assert rows, "no index of pgqueue.jobs_live found"
    assert [r for r in rows if r[1] in LEASE_WRITES] == []


def test_the_lease_is_a_hot_update(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue_many([pgqueue.JobSpec("t", {"n": n}) for n in range(200)])
    # Lease and ack on this connection: it flushes its own table statistics.
    with psycopg.connect(db_dsn, autocommit=True) as conn:

        def counts() -> tuple[int, int, int, int]:
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd, n_tup_del,"
                " (SELECT sum(s.n_tup_ins) FROM pg_stat_user_tables s"
                "  WHERE s.relid IN (SELECT inhrelid FROM pg_inherits"
                "                    WHERE inhparent = 'pgqueue.jobs_succeeded'::regclass))"
                " FROM pg_stat_user_tables WHERE relid = 'pgqueue.jobs_live'::regclass"
            ).fetchone()
            assert row is not None
            return int(row[0]), int(row[1]), int(row[2]), int(row[3] or 0)

        before = counts()
        leased = conn.execute(
            "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(NULL, 'w1', 200)"
        ).fetchall()
        after_lease = counts()
        conn.execute(
            "SELECT * FROM pgqueue.ack_jobs(%s, %s, NULL)",
            ([r[0] for r in leased], [r[1] for r in leased]),
        )
        after_ack = counts()

    assert len(leased) == 200
    assert after_lease[0] - before[0] == 200
    assert after_lease[1] - before[1] == 200, "every lease must be a HOT update"
    # The completions: the row moves once, and is not updated on the way.
    assert after_ack[0] - after_lease[0] == 0
    assert after_ack[2] - after_lease[2] == 200
    assert after_ack[3] - after_lease[3] == 200
    assert {app.get_job(r[0]).status for r in leased} == {pgqueue.JobStatus.SUCCEEDED}


def test_jobs_has_no_before_update_row_trigger(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        names = conn.execute(
            # tgtype bits: 1 = row, 2 = before, 16 = update
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'pgqueue.jobs'::regclass"
            " AND NOT tgisinternal AND tgtype & 1 = 1 AND tgtype & 2 = 2 AND tgtype & 16 = 16"
        ).fetchall()
    assert names == []


def test_what_each_statement_prepares_calls_no_sql_function(db_dsn: str) -> None:
    # Trigger WHEN clauses, CHECK constraints and column expressions are
    # prepared again by every statement that writes their table; a LANGUAGE
    # sql function in one (text || bigint is textanycat) is parsed and inlined
    # each time: ~30 µs of a one-job lease or ack.
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            """
            WITH expr(rel, what, node) AS (
                SELECT tgrelid, 'trigger ' || tgname, tgqual::text FROM pg_trigger
                WHERE tgqual IS NOT NULL
                UNION ALL
                SELECT conrelid, 'constraint ' || conname, conbin::text FROM pg_constraint
                WHERE conbin IS NOT NULL
                UNION ALL
                SELECT adrelid, 'default of column ' || adnum, adbin::text FROM pg_attrdef
            )
            SELECT e.rel::regclass::text, e.what, p.oid::regprocedure::text
            FROM expr e
            JOIN pg_class c ON c.oid = e.rel AND c.relnamespace = 'pgqueue'::regnamespace
            CROSS JOIN LATERAL regexp_matches(e.node, ':(?:op)?funcid (\\d+)', 'g') AS m(id)
            JOIN pg_proc p ON p.oid = m.id[1]::oid
            JOIN pg_language l ON l.oid = p.prolang
            WHERE l.lanname = 'sql'
            """
        ).fetchall()
        checked = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgqueue.jobs_live'::regclass"
            " AND tgqual::text ~ ':funcid'"
        ).fetchone()
    assert checked is not None
    assert checked[0] > 0, "no trigger WHEN calling a function found"
    assert rows == []


def test_the_columns_a_lease_or_completion_writes_end_the_row(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'pgqueue.jobs'::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
            ).fetchall()
        ]
    tail = columns[columns.index("attempt_id") :]
    assert LEASE_WRITES | {"finished_at", "result"} <= set(tail)
    assert {"payload", "queue", "task"}.isdisjoint(tail)


def test_a_requeued_serial_job_behind_a_live_one_is_held(app: pgqueue.App, db_dsn: str) -> None:
    first = app.enqueue("t", serial_key="k").job_id
    (leased,) = app.lease("default", "w1", max=1)
    assert leased.job_id == first
    second = app.enqueue("t", serial_key="k").job_id
    app.nack(leased)  # the first is queued again: it stays ahead, not held
    with psycopg.connect(db_dsn) as conn:
        held = dict(
            conn.execute(
                "SELECT id, serial_held FROM pgqueue.jobs WHERE id = ANY(%s)", ([first, second],)
            ).fetchall()
        )
    assert held == {first: False, second: True}
    (again,) = app.lease("default", "w1", max=5)
    assert again.job_id == first


def _row(dsn: str, job_id: int) -> dict[str, object]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute("SELECT * FROM pgqueue.jobs WHERE id = %s", (job_id,))
        row = cur.fetchone()
        assert row is not None
        assert cur.description is not None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}


#: What a completion sets (has_records: a failure's attempt record); every
#: other column moves unchanged.
COMPLETION_WRITES = {
    "status",
    "stage",
    "finished_at",
    "lease_expires_at",
    "result",
    "last_error",
    "has_records",
}


def test_every_way_a_job_ends_moves_every_column(app: pgqueue.App, db_dsn: str) -> None:
    """The ack writes its move out (the hot path) and the other ends share
    finish_jobs: both carry every column of the row into the finished
    partition, so a column added to jobs and forgotten in one fails here."""
    spec = {
        "payload": {"n": 1},
        "queue": "carried",
        "priority": 3,
        "max_attempts": 4,
        "dedup_key": "d",
        "tags": ["a", "b"],
        "meta": {"m": 1},
    }
    acked = app.enqueue("t", **spec).job_id  # type: ignore[arg-type]
    failed = app.enqueue("t", **{**spec, "dedup_key": "e"}).job_id  # type: ignore[arg-type]
    leased = {j.job_id: j for j in app.lease(["carried"], "w1", max=2)}
    running = {job_id: _row(db_dsn, job_id) for job_id in (acked, failed)}
    app.ack(leased[acked], result={"ok": True})
    app.fail(leased[failed], "boom", permanent=True)
    for job_id in (acked, failed):
        ended = _row(db_dsn, job_id)
        assert ended.keys() == running[job_id].keys()
        changed = {k for k in ended if ended[k] != running[job_id][k]}
        assert changed <= COMPLETION_WRITES, changed - COMPLETION_WRITES
        assert ended["finished_at"] is not None
    assert _row(db_dsn, acked)["result"] == {"ok": True}
    assert _row(db_dsn, failed)["status"] == "dead"
