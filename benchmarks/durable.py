"""What a durable task's step costs the server, against an ordinary ack.

``python -m benchmarks.durable`` (a table). Each repetition gets a throwaway
database; ``PROBES`` jobs are leased, then for each, measured alone:

- **ack**: the worker's ack of a plain job (``ack_jobs``, one job);
- **step**: storing a step's result for a running job (``store_step``, the
  statement ``context.step`` runs once its function returned), the job's
  first step (it also marks the job ``has_records``) and a later one;
- **load**: reading a job's stored steps (``step_list``, once per run of a
  durable task, on its first durable call), with ``STEPS`` steps stored.

Per statement: server execution time (``EXPLAIN ANALYZE``), client wall time
and WAL bytes without full-page images (``pg_walinspect``). Medians over
``--reps``. The plain job path is untouched by durable tasks (no statement
is added to its enqueue, lease or ack), so the ack here is also what a plain
job pays, before and after the feature::

    python -m benchmarks.durable --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

import pgqueue
from benchmarks.common import DB_PREFIX, DEFAULT_DSN
from benchmarks.db import Server

PROBES = 200
FIGURES = ("server_ms", "wall_ms", "wal_bytes")
STEPS = 20
LEASE = "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY[%s]::text[], 'bench', %s)"
ACK = "SELECT count(*) FROM pgqueue.ack_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], NULL)"
STEP = (
    "SELECT pgqueue.store_step(%s, %s, %s, 'step', 'succeeded',"
    ' \'{"charged": 1234, "id": "ch_0123456789"}\'::jsonb, now())'
)
LOAD = (
    "SELECT s.name, s.kind, s.status, s.result, s.started_at, s.finished_at, s.wake_at,"
    " s.event_key FROM pgqueue.job_steps s WHERE s.job_id = %s ORDER BY s.started_at, s.name"
)
WAL_NO_FPI = (
    "SELECT CASE WHEN pg_current_wal_flush_lsn() > %(lsn)s::pg_lsn THEN ("
    " SELECT coalesce(sum(record_length - fpi_length), 0)::bigint"
    " FROM pg_get_wal_records_info(%(lsn)s::pg_lsn, pg_current_wal_flush_lsn())) ELSE 0 END"
)


def _probe(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> dict[str, float]:
    """One statement measured alone: server ms (EXPLAIN ANALYZE), then the same
    kind of statement again for wall time and WAL (on a fresh row)."""
    lsn = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]  # type: ignore[index]
    started = time.perf_counter()
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()[0]  # type: ignore[index]
    wall = (time.perf_counter() - started) * 1000
    wal = conn.execute(WAL_NO_FPI, {"lsn": lsn}).fetchone()[0]  # type: ignore[index]
    doc = plan if isinstance(plan, list) else json.loads(plan)
    return {"server_ms": doc[0]["Execution Time"], "wall_ms": wall, "wal_bytes": float(wal)}


def measure(server: Server, dsn: str) -> dict[str, list[dict[str, float]]]:
    """Every probe on the migrated database at ``dsn``."""
    with pgqueue.App(dsn=dsn) as app:
        app.enqueue_many([pgqueue.JobSpec("t", {"n": i}, queue="b") for i in range(PROBES * 2)])
    out: dict[str, list[dict[str, float]]] = {
        "ack": [],
        "first step": [],
        "later step": [],
        "load 20": [],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        leased = conn.execute(LEASE, ("b", PROBES * 2)).fetchall()
        plain, durable = leased[:PROBES], leased[PROBES:]
        server.conn.execute("CHECKPOINT")
        for job_id, attempt_id in plain:
            out["ack"].append(_probe(conn, ACK, (job_id, attempt_id)))
        for job_id, attempt_id in durable:
            out["first step"].append(_probe(conn, STEP, (job_id, attempt_id, "s0")))
            out["later step"].append(_probe(conn, STEP, (job_id, attempt_id, "s1")))
        for job_id, attempt_id in durable[:50]:
            for i in range(2, STEPS):
                conn.execute(STEP, (job_id, attempt_id, f"s{i}"))
            out["load 20"].append(_probe(conn, LOAD, (job_id,)))
        conn.execute("DELETE FROM pgqueue.job_steps")
        conn.execute("DELETE FROM pgqueue.jobs")
    return out


def one_rep(server: Server, rep: int) -> dict[str, list[dict[str, float]]]:
    name = f"{DB_PREFIX}{os.getpid()}_durable_{rep}"
    dsn = server.create_db(name)
    try:
        with pgqueue.App(dsn=dsn) as app:
            app.migrate()
        return measure(server, dsn)
    finally:
        server.drop_db(name)


def medians(reps: list[dict[str, list[dict[str, float]]]]) -> dict[str, dict[str, float]]:
    """Per statement kind, the median of each figure over every probe of every rep."""
    out = {}
    for kind in reps[0]:
        rows = [r for rep in reps for r in rep[kind]]
        out[kind] = {k: statistics.median(r[k] for r in rows) for k in FIGURES}
    return out


def w_durable(ctx: Any) -> dict[str, Any]:
    """The ``durable`` workload of ``python -m benchmarks`` (pgqueue only): a
    step's server time against an ordinary ack's."""
    if ctx.system.name != "pgqueue":
        return {"skipped": "durable tasks are pgqueue's"}
    med = medians([measure(ctx.server, ctx.dsn)])
    ack = med["ack"]["server_ms"]
    ctx.log(table(med, 1))
    return {
        "ack_server_ms": ack,
        "first_step_ratio": med["first step"]["server_ms"] / ack,
        "later_step_ratio": med["later step"]["server_ms"] / ack,
        "load_20_ratio": med["load 20"]["server_ms"] / ack,
        "step_wal_bytes": med["later step"]["wal_bytes"],
    }


def table(med: dict[str, dict[str, float]], reps: int) -> str:
    head = f"{'statement':<12} {'server ms':>10} {'wall ms':>9} {'WAL B':>7}"
    lines = [f"{head}  (medians, {reps} reps x {PROBES})"]
    base = med["ack"]["server_ms"]
    for kind, m in med.items():
        figures = f"{m['server_ms']:>10.4f} {m['wall_ms']:>9.3f} {m['wal_bytes']:>7.0f}"
        lines.append(f"{kind:<12} {figures}  {m['server_ms'] / base:.2f}x ack")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.durable", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    server = Server(args.dsn)
    try:
        reps = [one_rep(server, rep) for rep in range(args.reps)]
    finally:
        server.close()
    print(table(medians(reps), args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
