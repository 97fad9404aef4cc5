"""Server CPU per job of the hot path, phase by phase, variants side by side.

``python -m benchmarks.drain_cpu --variant before=old_bodies.sql`` creates one
database per variant on the server at ``--dsn`` (``drcpu_<pid>_<name>``,
dropped at the end), migrates pgqueue to head in each and runs the variant's
SQL file on top (``{schema}`` and ``{channel}`` rendered as in a migration;
``head`` is always measured, with nothing on top). Then, round by round and
variant by variant (interleaved, so the drifts of a shared machine spread
over all of them), from one connection with the App's session settings:

* ``enqueue``: one ``enqueue_payloads`` call of ``--jobs`` ``{}`` payloads
  (App.enqueue_many's statement);
* ``lease``: ``lease_jobs`` of 500 (the worker's job_lease) until the queue is
  empty;
* ``ack``: ``ack_jobs`` of each leased batch with no results (the worker's
  job_ack_many);
* ``idle``: ``--idle`` cycles of enqueue one job (``enqueue_job``), lease it,
  ack it: the path of an idle worker woken for one job (lease and ack only).

Reported: the backend's CPU time (``/proc/<pid>/schedstat``, so the server
must run on this machine; other sessions do not count) per job, median over
``--rounds``, and the raw-SQL floor's (the benchmark's floor table: COPY,
``SKIP LOCKED`` lease of 500, ``DELETE``) beside it. Commits are asynchronous
(``synchronous_commit = off``) so that WAL flushes do not blur the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import pgqueue
from benchmarks.common import DEFAULT_DSN, with_dbname
from pgqueue.queries import render

SESSION = "SET plan_cache_mode = force_custom_plan; SET jit = off; SET synchronous_commit = off"
ENQUEUE = "SELECT pgqueue.enqueue_payloads(%s::jsonb, %s::jsonb)"
ENQUEUE_ONE = """
SELECT job_id, created FROM pgqueue.enqueue_job(
    %s::text, %s::jsonb, NULL::text, NULL::integer, NULL::timestamptz, NULL::float8,
    NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::real[], true, NULL::integer)
"""
LEASE = """
SELECT job_id, attempt_id, attempt, task, queue, payload, lease_expires_at, lease_seconds,
       tags, meta
FROM pgqueue.lease_jobs(NULL::text[], 'bench', 500, NULL::integer, NULL::timestamptz)
"""
ACK = """
SELECT job_id, attempt_id
FROM pgqueue.ack_jobs(%s::bigint[], %s::bigint[], %s::jsonb[], NULL::timestamptz, %s::text[])
"""
FLOOR_SETUP = """
CREATE TABLE floor_jobs (
    id       bigserial PRIMARY KEY,
    queue    text        NOT NULL DEFAULT 'default',
    payload  jsonb       NOT NULL DEFAULT '{}',
    priority smallint    NOT NULL DEFAULT 0,
    run_at   timestamptz NOT NULL DEFAULT now(),
    status   smallint    NOT NULL DEFAULT 0
);
CREATE INDEX floor_jobs_ready ON floor_jobs (queue, priority DESC, run_at, id) WHERE status = 0;
"""
FLOOR_LEASE = """
WITH c AS MATERIALIZED (
    SELECT id FROM floor_jobs
    WHERE queue = 'default' AND status = 0 AND run_at <= now()
    ORDER BY priority DESC, run_at, id LIMIT 500 FOR UPDATE SKIP LOCKED)
UPDATE floor_jobs j SET status = 1 FROM c WHERE j.id = c.id RETURNING j.id, j.payload
"""
FLOOR_DELETE = "DELETE FROM floor_jobs WHERE id = ANY(%s)"
FLOOR_ONE = "INSERT INTO floor_jobs (payload) VALUES (%s::jsonb) RETURNING id"
PHASES = ("enqueue", "lease", "ack", "idle lease", "idle ack")


def _cpu(conn: psycopg.Connection[Any]) -> float:
    """Seconds on CPU of the session's backend."""
    pid = conn.info.backend_pid
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def _timed(
    conn: psycopg.Connection[Any], query: str, params: Any = None, fetch: bool = True
) -> tuple[float, list[Any]]:
    """Run one prepared statement; its backend's CPU seconds and its rows."""
    t = _cpu(conn)
    cur = conn.execute(query, params, prepare=True)
    rows = cur.fetchall() if fetch else []
    return _cpu(conn) - t, rows


def _round_pgqueue(conn: psycopg.Connection[Any], jobs: int, idle: int) -> dict[str, float]:
    doc = "[" + ",".join(["{}"] * jobs) + "]"
    enq, _ = _timed(conn, ENQUEUE, ('{"task":"noop"}', doc))
    lease = ack = 0.0
    done = 0
    while True:
        dt, rows = _timed(conn, LEASE)
        lease += dt
        if not rows:
            break
        ids = "{" + ",".join(str(r[0]) for r in rows) + "}"
        aids = "{" + ",".join(str(r[1]) for r in rows) + "}"
        nulls = "{" + ",".join(["NULL"] * len(rows)) + "}"
        dt, acked = _timed(conn, ACK, (ids, aids, nulls, nulls))
        ack += dt
        assert len(acked) == len(rows)
        done += len(rows)
    assert done == jobs, (done, jobs)
    idle_lease = idle_ack = 0.0
    for _ in range(idle):
        conn.execute(ENQUEUE_ONE, ("noop", "{}"), prepare=True).fetchall()
        dt, rows = _timed(conn, LEASE)
        idle_lease += dt
        dt, _ = _timed(conn, ACK, (f"{{{rows[0][0]}}}", f"{{{rows[0][1]}}}", "{NULL}", "{NULL}"))
        idle_ack += dt
    conn.execute("DELETE FROM pgqueue.jobs; DELETE FROM pgqueue.job_attempts")
    conn.execute("VACUUM pgqueue.jobs")
    return {
        "enqueue": enq / jobs,
        "lease": lease / jobs,
        "ack": ack / jobs,
        "idle lease": idle_lease / max(idle, 1),
        "idle ack": idle_ack / max(idle, 1),
    }


def _round_floor(conn: psycopg.Connection[Any], jobs: int, idle: int) -> dict[str, float]:
    t = _cpu(conn)
    with conn.transaction(), conn.cursor().copy("COPY floor_jobs (payload) FROM STDIN") as copy:
        for _ in range(jobs):
            copy.write_row(("{}",))
    enq = _cpu(conn) - t
    lease = ack = 0.0
    while True:
        dt, rows = _timed(conn, FLOOR_LEASE)
        lease += dt
        if not rows:
            break
        ids = [r[0] for r in rows]
        dt, _ = _timed(conn, FLOOR_DELETE, (ids,), fetch=False)
        ack += dt
    idle_lease = idle_ack = 0.0
    for _ in range(idle):
        conn.execute(FLOOR_ONE, ("{}",), prepare=True).fetchall()
        dt, rows = _timed(conn, FLOOR_LEASE)
        idle_lease += dt
        one = [rows[0][0]]
        dt, _ = _timed(conn, FLOOR_DELETE, (one,), fetch=False)
        idle_ack += dt
    conn.execute("VACUUM floor_jobs")
    return {
        "enqueue": enq / jobs,
        "lease": lease / jobs,
        "ack": ack / jobs,
        "idle lease": idle_lease / max(idle, 1),
        "idle ack": idle_ack / max(idle, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.drain_cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="maintenance-database DSN")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FILE.sql")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per round (20000)")
    parser.add_argument("--idle", type=int, default=200, help="one-job cycles per round (200)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    args = parser.parse_args(argv)

    variants: list[tuple[str, str | None]] = [("head", None)]
    for spec in args.variant:
        name, _, path = spec.partition("=")
        variants.append((name, path))
    admin = psycopg.connect(args.dsn, autocommit=True)
    dbs: list[str] = []
    conns: dict[str, psycopg.Connection[Any]] = {}
    try:
        for name, path in [("floor", None), *variants]:
            db = f"drcpu_{os.getpid()}_{name}"
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
            dbs.append(db)
            dsn = with_dbname(args.dsn, db)
            conn = psycopg.connect(dsn, autocommit=True)
            if name == "floor":
                conn.execute(FLOOR_SETUP)
            else:
                with pgqueue.App(dsn=dsn, schema="pgqueue") as app:
                    app.migrate()
                if path:
                    text = render(Path(path).read_text(encoding="utf-8"), "pgqueue")
                    conn.execute(text.encode())
            conn.execute(SESSION)
            conns[name] = conn
        samples: dict[str, dict[str, list[float]]] = {
            name: {p: [] for p in PHASES} for name in conns
        }
        for rnd in range(args.rounds):
            for name, conn in conns.items():
                fn = _round_floor if name == "floor" else _round_pgqueue
                for phase, value in fn(conn, args.jobs, args.idle).items():
                    samples[name][phase].append(value * 1e6)
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    finally:
        for conn in conns.values():
            conn.close()
        for db in dbs:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )
        admin.close()

    med = {n: {p: statistics.median(v) for p, v in s.items()} for n, s in samples.items()}
    print(
        f"server CPU µs per job, median of {args.rounds} rounds ({args.jobs} jobs; "
        f"idle: per one-job cycle, {args.idle} a round)"
    )
    print(f"{'variant':12s}" + "".join(f"{p:>12s}" for p in (*PHASES, "drain total")))
    for name, m in med.items():
        total = m["enqueue"] + m["lease"] + m["ack"]
        ratio = total / (med["floor"]["enqueue"] + med["floor"]["lease"] + med["floor"]["ack"])
        print(
            f"{name:12s}" + "".join(f"{m[p]:12.2f}" for p in PHASES) + f"{total:8.2f} x{ratio:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
