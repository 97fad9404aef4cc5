"""``python -m benchmarks.lease_cost``: what one lease costs beside what a queue holds.

A producer must not be able to slow every worker down .
Each scenario gets its own database on the server at ``--dsn`` (dropped
afterwards) and times ``lease_jobs`` of one job, median of ``--reps`` calls
(each leased job is handed back, so every call sees the same table):

* ``empty``: one ready job, nothing else (the baseline);
* ``idle-queues``: the same, plus ``--queues`` queues that exist but hold no
  ready job (each one a queue name a producer made up), leased with no queue
  list (every queue);
* ``serial-blocked``: the same one ready job, plus ``--blocked`` ready jobs
  of one serial key queued behind a job of that key scheduled a year ahead,
  all in the leased queue and ahead of the ready job in lease order. Since
  0015 they are held (jobs.serial_held) and the lease skips them in the
  ready index without reading them: the lease costs what ``empty`` costs.

    python -m benchmarks.lease_cost --queues 3000 --blocked 3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import psycopg

import pgqueue
from benchmarks.common import DEFAULT_DSN
from benchmarks.db import Server

LEASE = "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(%(queues)s::text[], 'bench', 1)"
RELEASE = (
    "SELECT job_id FROM pgqueue.release_jobs(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[])"
)


def _fill(conn: psycopg.Connection[Any], scenario: str, queues: int, blocked: int) -> None:
    if scenario == "idle-queues":
        conn.execute(
            "INSERT INTO pgqueue.queues (name) SELECT 'idle-' || i FROM generate_series(1, %s) i",
            (queues,),
        )
    if scenario == "serial-blocked":
        # The blocker, then the blocked jobs: high priority, so that the lease
        # meets every one of them before the ready job.
        conn.execute(
            "SELECT pgqueue.enqueue('blocker', '{}', queue => 'bench', serial_key => 'k',"
            " run_at => now() + interval '1 year')"
        )
        conn.execute(
            "SELECT count(*) FROM pgqueue.enqueue_batch(%s::jsonb)",
            (
                json.dumps(
                    [
                        {"task": "blocked", "queue": "bench", "serial_key": "k", "priority": 5}
                        for _ in range(blocked)
                    ]
                ),
            ),
        )
    conn.execute("SELECT pgqueue.enqueue('ready', '{}', queue => 'bench')")
    conn.execute("ANALYZE pgqueue.jobs")
    conn.execute("ANALYZE pgqueue.queues")


def measure(server: Server, scenario: str, queues: int, blocked: int, reps: int) -> dict[str, Any]:
    name = "pgqleasecost_" + scenario.replace("-", "_")
    dsn = server.create_db(name)
    try:
        with pgqueue.App(dsn=dsn) as app:
            app.migrate()
        with psycopg.connect(dsn, autocommit=True) as conn:
            _fill(conn, scenario, queues, blocked)
            params = {"queues": None if scenario == "idle-queues" else ["bench"]}
            times: list[float] = []
            tasks: set[str] = set()
            for i in range(reps + 3):
                started = time.perf_counter()
                rows = conn.execute(LEASE, params).fetchall()
                elapsed = time.perf_counter() - started
                if i >= 3:  # the first calls plan and warm the cache
                    times.append(elapsed)
                if rows:
                    row = conn.execute(
                        "SELECT task FROM pgqueue.jobs WHERE id = %s", (rows[0][0],)
                    ).fetchone()
                    tasks.add(row[0] if row else "?")
                    conn.execute(RELEASE, {"job_ids": [rows[0][0]], "attempt_ids": [rows[0][1]]})
    finally:
        server.drop_db(name)
    return {
        "scenario": scenario,
        "lease_ms_median": round(statistics.median(times) * 1000, 3),
        "lease_ms_max": round(max(times) * 1000, 3),
        "leased_tasks": sorted(tasks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lease_cost", description=__doc__)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="maintenance-database DSN")
    parser.add_argument("--queues", type=int, default=3000, help="idle queues (3000)")
    parser.add_argument("--blocked", type=int, default=3000, help="serial-blocked jobs (3000)")
    parser.add_argument("--reps", type=int, default=50, help="timed leases per scenario (50)")
    args = parser.parse_args(argv)
    server = Server(args.dsn)
    try:
        results = [
            measure(server, scenario, args.queues, args.blocked, args.reps)
            for scenario in ("empty", "idle-queues", "serial-blocked")
        ]
    finally:
        server.close()
    print(json.dumps(results, indent=2))
    base = results[0]["lease_ms_median"]
    for r in results:
        print(
            f"  {r['scenario']:<15} {r['lease_ms_median']:>9.3f} ms"
            f"  x{r['lease_ms_median'] / max(base, 1e-9):>7.1f}  leased {r['leased_tasks']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
