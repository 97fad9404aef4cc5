"""One shared LISTEN connection per App vs one connection per subscription.

``python -m benchmarks.subscriptions [--dsn DSN] [--subscriptions 1,10,100]``
(without --dsn it starts a throwaway cluster from the local server binaries).
Per-connection subscriptions are what N Apps with one subscription each do:
every App has its own listener. For each N it reports: server connections
held, milliseconds to open one subscription, the wall time and this
process's CPU until every subscription has received every event of 200
single-job enqueues, and the CPU the listening backends spent meanwhile.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

import pgqueue
from pgqueue.subscribe import APPLICATION_NAME, EventStream

EVENTS = 200
TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu(pids: list[int]) -> float:
    """Seconds of CPU (user + system) the server processes ``pids`` used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def listener_pids(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchall()
    return [r[0] for r in rows]


def deliver(dsn: str, producer: pgqueue.App, streams: list[EventStream]) -> dict[str, float]:
    pids = listener_pids(dsn)
    cpu0, server0, wall0 = time.process_time(), backend_cpu(pids), time.perf_counter()
    jobs = {producer.enqueue("t", queue="bench").job_id for _ in range(EVENTS)}
    for stream in streams:
        seen: set[int] = set()
        while seen != jobs:
            event = stream.get(timeout=60)
            if event is None:
                raise RuntimeError("events stopped arriving")
            if event.job_id is not None:
                seen.add(event.job_id)
    return {
        "connections": len(pids),
        "deliver_ms": (time.perf_counter() - wall0) * 1000,
        "client_cpu_ms": (time.process_time() - cpu0) * 1000,
        "server_cpu_ms": (backend_cpu(pids) - server0) * 1000,
    }


def run_shared(dsn: str, n: int) -> dict[str, float]:
    with pgqueue.App(dsn) as app:
        t0 = time.perf_counter()
        streams = [app.subscribe(queues=["bench"], buffer=10 * EVENTS).open() for _ in range(n)]
        open_ms = (time.perf_counter() - t0) * 1000 / n
        try:
            return {"open_ms": open_ms, **deliver(dsn, app, streams)}
        finally:
            for stream in streams:
                stream.close()


def run_per_connection(dsn: str, n: int) -> dict[str, float]:
    apps = [pgqueue.App(dsn, pool_min_size=0) for _ in range(n)]
    try:
        t0 = time.perf_counter()
        streams = [a.subscribe(queues=["bench"], buffer=10 * EVENTS).open() for a in apps]
        open_ms = (time.perf_counter() - t0) * 1000 / n
        with pgqueue.App(dsn) as producer:
            return {"open_ms": open_ms, **deliver(dsn, producer, streams)}
    finally:
        for a in apps:
            a.close()


@contextmanager
def database(dsn: str | None) -> Iterator[str]:
    if dsn is not None:
        yield dsn
        return
    from tests.fixtures.cluster import ThrowawayCluster

    with ThrowawayCluster() as cluster:
        yield cluster.dsn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dsn", help="a database to migrate and use (default: a throwaway cluster)"
    )
    parser.add_argument("--subscriptions", default="1,10,100")
    args = parser.parse_args(argv)
    with database(args.dsn) as dsn:
        pgqueue.App(dsn).migrate()
        rows: list[tuple[str, int, dict[str, Any]]] = []
        for n in (int(x) for x in args.subscriptions.split(",")):
            for name, run in (("shared", run_shared), ("per-connection", run_per_connection)):
                rows.append((name, n, run(dsn, n)))
        print(
            f"{'design':<15}{'subs':>6}{'conns':>7}{'open ms/sub':>13}"
            f"{'deliver ms':>12}{'client CPU ms':>15}{'server CPU ms':>15}"
        )
        for name, n, r in rows:
            print(
                f"{name:<15}{n:>6}{r['connections']:>7.0f}{r['open_ms']:>13.2f}"
                f"{r['deliver_ms']:>12.0f}{r['client_cpu_ms']:>15.0f}{r['server_cpu_ms']:>15.0f}"
            )


if __name__ == "__main__":
    main()
