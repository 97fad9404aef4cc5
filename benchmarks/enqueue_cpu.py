"""Server CPU and WAL of one enqueue call, pgqueue revision beside revision.

``python -m benchmarks.enqueue_cpu --revisions 0015,head`` creates a throwaway
database ``enqcpu_<pid>`` (dropped at the end), installs pgqueue at each given
revision in its own schema (``r0015``, ``rhead``; ``--variant NAME=FILE.sql``
adds a schema at head with FILE run on top, ``{schema}`` and ``{channel}``
rendered as in a migration: for trying a function body before it becomes a
migration) and the benchmark's raw-SQL floor table in schema ``floor``.
Then, interleaved round by round so that drifts of a shared machine spread
over all of them, it measures:

* ``single``: N calls, one per transaction (autocommit, prepared statement),
  of App.enqueue's statement (``job_enqueue_one``: ``enqueue_job('noop',
  '{}', NULL...)``), and of the floor's ``INSERT ... RETURNING id`` +
  ``pg_notify``;
* ``bulk``: one ``enqueue_payloads`` call of ``--bulk`` ``{}`` payloads
  (App.enqueue_many's statement), and the floor's COPY + one NOTIFY;
* ``batch``: one ``enqueue_batch`` call of ``--batch`` job objects that
  differ in more than their payload (App.enqueue_many's statement then: each
  job its own priority), and the floor's COPY + one NOTIFY;
* ``dedup``: the same with a dedup key per job (``enqueue_batch``'s
  ``ON CONFLICT`` insert).

Server CPU is the backend's own time on CPU from /proc (so the server must run
on this machine): other sessions on the server do not count, unlike wall time
or the cluster-wide WAL position. WAL is attributed by transaction id with
pg_walinspect (the xmin of the rows inserted): bytes of the records of the
measured transactions only, whatever else writes meanwhile. Reported: the
median over rounds per call (single) or per job (bulk), and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.common import DEFAULT_DSN, with_dbname
from benchmarks.cpu import process_seconds

FLOOR_SETUP = """
CREATE SCHEMA floor;
CREATE TABLE floor.jobs (
    id       bigserial PRIMARY KEY,
    queue    text        NOT NULL DEFAULT 'default',
    payload  jsonb       NOT NULL DEFAULT '{}',
    priority smallint    NOT NULL DEFAULT 0,
    run_at   timestamptz NOT NULL DEFAULT now(),
    status   smallint    NOT NULL DEFAULT 0
);
CREATE INDEX jobs_ready ON floor.jobs (queue, priority DESC, run_at, id) WHERE status = 0;
"""
FLOOR_ONE = (
    "WITH j AS (INSERT INTO floor.jobs (payload) VALUES (%s::jsonb) RETURNING id)"
    " SELECT id, pg_notify('floor_jobs', '') FROM j"
)
# App.enqueue('noop', {}) of a registered task with default options sends
# exactly this (sql/queries/jobs.sql, job_enqueue_one).
PGQUEUE_ONE = """
SELECT job_id, created FROM {schema}.enqueue_job(
    %s::text, %s::jsonb, %s::text, %s::integer, %s::timestamptz, %s::float8, %s::integer,
    %s::integer, %s::text, %s::text, %s::real[], %s::boolean, %s::integer)
"""
PGQUEUE_ONE_PARAMS = ("noop", "{}", *[None] * 9, False, None)
PGQUEUE_MANY = "SELECT {schema}.enqueue_payloads(%s::jsonb, %s::jsonb)"
PGQUEUE_BATCH = "SELECT count(*) FROM {schema}.enqueue_batch(%s::jsonb)"

WAL_OF_XIDS = """
SELECT coalesce(sum(r.record_length), 0), count(*)
FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) r
WHERE r.xid = ANY (%s::xid[])
"""
WAL_BREAKDOWN = """
SELECT r.resource_manager || ' ' || split_part(r.record_type, ' ', 1),
       count(*), sum(r.record_length)
FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) r
WHERE r.xid = ANY (%s::xid[])
GROUP BY 1 ORDER BY 3 DESC
"""


@dataclass
class Target:
    name: str
    schema: str
    single: Callable[[psycopg.Connection[Any], int], None]
    bulk: Callable[[psycopg.Connection[Any], int], None]
    batch: Callable[..., None] | None = None
    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)


def _backend_cpu(conn: psycopg.Connection[Any]) -> float:
    """Seconds on CPU of the session's backend: /proc/<pid>/schedstat (ns,
    where the kernel keeps it), else utime+stime (10 ms ticks)."""
    pid = conn.info.backend_pid
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return process_seconds(pid)


def _lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _pgqueue_target(name: str, schema: str) -> Target:
    one = sql.SQL(PGQUEUE_ONE).format(schema=sql.Identifier(schema))
    many = sql.SQL(PGQUEUE_MANY).format(schema=sql.Identifier(schema))

    def single(conn: psycopg.Connection[Any], n: int) -> None:
        for _ in range(n):
            conn.execute(one, PGQUEUE_ONE_PARAMS, prepare=True).fetchall()

    def bulk(conn: psycopg.Connection[Any], n: int) -> None:
        doc = "[" + ",".join(["{}"] * n) + "]"
        conn.execute(many, ('{"task":"noop"}', doc), prepare=True).fetchall()

    batch_sql = sql.SQL(PGQUEUE_BATCH).format(schema=sql.Identifier(schema))

    def batch(conn: psycopg.Connection[Any], n: int, dedup: bool) -> None:
        # The document App.enqueue_many sends (encode_batch): the jobs, and
        # whether any has a dedup key.
        key = f',"dedup_key":"k{time.monotonic_ns()}-%d"' if dedup else ""
        jobs = ",".join(
            f'{{"task":"noop","payload":{{}},"priority":{i % 7}{key % i if dedup else ""}}}'
            for i in range(n)
        )
        doc = f'{{"jobs":[{jobs}],"dedup":{"true" if dedup else "false"}}}'
        conn.execute(batch_sql, (doc,), prepare=True).fetchall()

    return Target(name, schema, single, bulk, batch)


def _floor_target() -> Target:
    def single(conn: psycopg.Connection[Any], n: int) -> None:
        for _ in range(n):
            conn.execute(FLOOR_ONE, ("{}",), prepare=True).fetchall()

    def bulk(conn: psycopg.Connection[Any], n: int) -> None:
        with conn.transaction():
            with conn.cursor().copy("COPY floor.jobs (payload) FROM STDIN") as copy:
                for _ in range(n):
                    copy.write_row(("{}",))
            conn.execute("SELECT pg_notify('floor_jobs', '')")

    return Target("floor", "floor", single, bulk)


def _measure(
    dsn: str, target: Target, workload: str, n: int, warmup: int
) -> tuple[float, float, float]:
    """(server CPU µs, wall µs, WAL bytes) per call (single) or per job (bulk)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        if target.schema != "floor":
            # As the App's sessions (pgqueue.database): statements are planned per call.
            conn.execute("SET plan_cache_mode = force_custom_plan")
        table = sql.Identifier(target.schema, "jobs")
        run = target.single if workload == "single" else target.bulk
        if workload in ("batch", "dedup") and target.batch is not None:
            run = functools.partial(target.batch, dedup=workload == "dedup")
        if warmup:
            run(conn, warmup)
        row = conn.execute(sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(table)).fetchone()
        assert row is not None
        last_id = int(row[0])
        start_lsn = _lsn(conn)
        cpu0, t0 = _backend_cpu(conn), time.perf_counter()
        run(conn, n)
        wall, cpu = time.perf_counter() - t0, _backend_cpu(conn) - cpu0
        end_lsn = _lsn(conn)
        xids = [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT DISTINCT xmin::text FROM {} WHERE id > %s").format(table),
                (last_id,),
            )
        ]
        row = conn.execute(WAL_OF_XIDS, (start_lsn, end_lsn, xids)).fetchone()
        assert row is not None
        wal = float(row[0])
        if os.environ.get("ENQCPU_WAL_BREAKDOWN"):
            print(f"  WAL of {target.name} {workload}:", file=sys.stderr)
            for kind, count, size in conn.execute(WAL_BREAKDOWN, (start_lsn, end_lsn, xids)):
                print(f"    {kind:40s} {count / n:6.2f}/job {size / n:8.1f} B/job", file=sys.stderr)
        # Keep the tables small between rounds; a truncate costs this session, not the next.
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
    return cpu / n * 1e6, wall / n * 1e6, wal / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_cpu", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--revisions", default="head", help="comma list of pgqueue revisions")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FILE.sql")
    parser.add_argument("--workloads", default="single,bulk")
    parser.add_argument("--single", type=int, default=3000, help="calls per single round")
    parser.add_argument("--bulk", type=int, default=20000, help="jobs per bulk call")
    parser.add_argument("--batch", type=int, default=5000, help="jobs per batch/dedup call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from pgqueue import migrate
    from pgqueue.queries import render

    dbname = f"enqcpu_{os.getpid()}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = with_dbname(args.dsn, dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_walinspect")
            conn.execute(FLOOR_SETUP)
        targets = [_floor_target()]
        for rev in filter(None, args.revisions.split(",")):
            schema = "r" + rev
            migrate.upgrade(dsn, schema, rev)
            targets.append(_pgqueue_target(schema, schema))
        for spec in args.variant:
            name, _, path = spec.partition("=")
            migrate.upgrade(dsn, name, "head")
            text = render(Path(path).read_text(encoding="utf-8"), name)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(text)  # type: ignore[call-overload]
            targets.append(_pgqueue_target(name, name))
        workloads = args.workloads.split(",")
        for rnd in range(args.rounds):
            for workload in workloads:
                n = {"single": args.single, "bulk": args.bulk}.get(workload, args.batch)
                warmup = {"single": 300, "bulk": 0}.get(workload, 10)
                for target in targets:
                    sample = _measure(dsn, target, workload, n, warmup)
                    target.samples.setdefault(workload, []).append(sample)
                    print(
                        f"round {rnd + 1} {workload:6s} {target.name:12s} cpu {sample[0]:7.1f} us"
                        f"  wall {sample[1]:7.1f} us  WAL {sample[2]:6.0f} B",
                        file=sys.stderr,
                    )
        print(
            f"median of {args.rounds} rounds; single: per call, bulk: per job ({args.bulk} a call),"
            f" batch and dedup: per job ({args.batch} a call)"
        )
        print(f"{'workload':8s} {'system':12s} {'cpu us':>8s} {'x floor':>8s} {'wall us':>8s} "
              f"{'WAL B':>7s} {'x floor':>8s}")  # fmt: skip
        for workload in workloads:
            base = targets[0].samples[workload]
            fcpu = statistics.median(s[0] for s in base)
            fwal = statistics.median(s[2] for s in base)
            for target in targets:
                s = target.samples[workload]
                cpu = statistics.median(x[0] for x in s)
                wall = statistics.median(x[1] for x in s)
                wal = statistics.median(x[2] for x in s)
                print(
                    f"{workload:8s} {target.name:12s} {cpu:8.1f} {cpu / fcpu:8.2f} {wall:8.1f} "
                    f"{wal:7.0f} {wal / fwal if fwal else 0:8.2f}"
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
