"""``python -m benchmarks.prune``: prune a big archive, plain table vs partitions.

Fills ``jobs_archive`` with ``--rows`` archived jobs spread evenly over
``--days`` days, once as a plain table and once partitioned by day (as after
``--days`` days of running partitioned), then times ``prune`` of everything
older than half that span and measures the WAL it wrote. Each layout gets its
own database on the server at ``--dsn`` (dropped afterwards).

    python -m benchmarks.prune --rows 5000000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from typing import Any

import pgqueue
from benchmarks.common import DEFAULT_DSN
from benchmarks.db import Server

FILL = """
INSERT INTO pgqueue.jobs_archive (id, task, queue, payload, status, attempts, run_at,
                                  finished_at, archived_at)
SELECT i, 'bench_task', 'bench', '{"order_id": 42}', 'succeeded', 1, f, f, f
FROM (SELECT i, now() - %(span)s::interval * i / %(rows)s AS f
      FROM generate_series(1, %(rows)s) AS i) s
"""


def measure(server: Server, layout: str, rows: int, days: int) -> dict[str, Any]:
    # not DB_PREFIX: `python -m benchmarks` drops stale databases of that prefix
    name = f"pgqprune_{layout}"
    dsn = server.create_db(name)
    try:
        with pgqueue.App(dsn=dsn) as app:
            app.migrate()
            if layout == "partitioned":
                app.partition_archive("day")
                with app._database.connect() as conn:
                    # As after `days` days of running partitioned: the (empty)
                    # partition of what came before is gone, day partitions hold
                    # the history.
                    conn.execute(
                        "SELECT pgqueue.archive_partitions_drop(now() + interval '1 year')"
                    )
                    conn.execute(
                        "SELECT pgqueue.archive_partitions_ensure(now() - %s::interval, now())",
                        (timedelta(days=days + 1),),
                    )
            started = time.perf_counter()
            with app._database.connect() as conn:
                conn.execute(FILL, {"span": timedelta(days=days), "rows": rows})
                conn.execute("VACUUM ANALYZE pgqueue.jobs_archive")
            fill_seconds = time.perf_counter() - started
            server.checkpoint()
            wal_before = server.wal_lsn()
            started = time.perf_counter()
            pruned = app.prune(f"{days // 2}d", batch_size=10_000)
            seconds = time.perf_counter() - started
            wal_bytes = server.wal_lsn() - wal_before
            left = app.archive_layout()
            with app._database.connect() as conn:
                row = conn.execute("SELECT count(*) FROM pgqueue.jobs_archive").fetchone()
            remaining = int(row[0]) if row else -1
    finally:
        server.drop_db(name)
    return {
        "layout": layout,
        "rows": rows,
        "fill_seconds": round(fill_seconds, 1),
        "pruned_rows": pruned["archived_jobs"],
        "remaining_rows": remaining,
        "partitions_left": left.partitions,
        "prune_seconds": round(seconds, 3),
        "prune_wal_bytes": wal_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prune", description=__doc__)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="maintenance-database DSN")
    parser.add_argument("--rows", type=int, default=5_000_000, help="archived jobs (5M)")
    parser.add_argument("--days", type=int, default=30, help="days they span (30)")
    args = parser.parse_args(argv)
    server = Server(args.dsn)
    try:
        results = [
            measure(server, layout, args.rows, args.days) for layout in ("plain", "partitioned")
        ]
    finally:
        server.close()
    print(json.dumps(results, indent=2))
    plain, parts = results
    print(
        f"\nprune of {plain['pruned_rows']:,} of {args.rows:,} archived jobs (older than "
        f"{args.days // 2}d of {args.days}d):\n"
        f"  plain table  {plain['prune_seconds']:>9.3f} s  {plain['prune_wal_bytes']:>14,} WAL B\n"
        f"  partitioned  {parts['prune_seconds']:>9.3f} s  {parts['prune_wal_bytes']:>14,} WAL B\n"
        f"  ratio        {plain['prune_seconds'] / max(parts['prune_seconds'], 1e-9):>9.0f}x"
        f"  {plain['prune_wal_bytes'] / max(parts['prune_wal_bytes'], 1):>14,.0f}x",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
