"""The ``dashboard`` workload: page times of ``pgqueue dashboard`` over a big
hot table, and what 100 browsers on the live stream cost.

Fills the jobs table straight in SQL (``backlog`` jobs, 1M by default:
mostly succeeded, some dead with a handful of error shapes, a ready backlog
over five queues, scheduled and running jobs), ANALYZEs it, starts
``pgqueue dashboard`` as a user would (read-only; ``--cache-ttl 0`` so
that every request reads the database) and requests every page
``PAGE_REPS`` times, timing each response at the client (an upper bound on
the server's time). Then it connects ``SSE_CLIENTS`` event streams, enqueues
for a few seconds and reports the page times again, the refresh events each
browser received per second (coalescing) and how many database sessions the
dashboard held (one listener however many browsers).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from benchmarks.common import percentile

PAGE_REPS = 30
SSE_CLIENTS = 100
LOAD_SECONDS = 5.0


def _pages(job_id: int) -> list[str]:
    return [
        "/",
        "/jobs",
        "/jobs?status=dead",
        "/jobs?status=queued&queue=q3",
        "/jobs?queue=q4",
        "/jobs?q=needle",
        f"/jobs/{job_id}",
        "/dead",
        "/queues",
        "/schedules",
        "/workers",
        "/tasks",
        "/metrics",
        "/api/jobs?status=succeeded",
    ]


def _fill(dsn: str, total: int) -> int:
    """Insert ``total`` jobs in the shapes of a busy system; return a dead job's id."""
    shares = {"succeeded": 0.90, "dead": 0.05, "queued": 0.04, "scheduled": 0.009}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.queues (name) SELECT 'q' || i FROM generate_series(0, 4) i "
            "ON CONFLICT DO NOTHING"
        )
        for status, share in shares.items():
            n = int(total * share)
            finished = status in ("succeeded", "dead")
            conn.execute(
                """
                INSERT INTO pgqueue.jobs (task, queue, payload, status, run_at, attempts,
                    attempt_started_at, finished_at, last_error)
                SELECT 'task' || (i %% 12), 'q' || (i %% 5),
                       jsonb_build_object('i', i, 'user', i %% 977),
                       %(status)s::pgqueue.job_status,
                       now() - make_interval(secs => i * 7200.0 / %(n)s)
                           + CASE WHEN %(status)s = 'scheduled' THEN interval '2 hours'
                                  ELSE interval '0' END,
                       CASE WHEN %(finished)s THEN 1 ELSE 0 END,
                       CASE WHEN %(finished)s
                            THEN now() - make_interval(secs => i * 7200.0 / %(n)s) END,
                       CASE WHEN %(finished)s
                            THEN now() - make_interval(secs => i * 7200.0 / %(n)s)
                                 + interval '40 milliseconds' END,
                       CASE WHEN %(status)s = 'dead'
                            THEN (ARRAY['KeyError: user ' || i || ' not found',
                                        'TimeoutError: query took ' || (i %% 60) || 's',
                                        'ValueError: bad row ''' || i || '''',
                                        'ConnectionError: host 10.0.' || (i %% 255)
                                        || '.1 down'])[i %% 4 + 1]
                       END
                FROM generate_series(1, %(n)s) i
                """,
                {"status": status, "n": n, "finished": finished},
            )
        conn.execute(
            "INSERT INTO pgqueue.jobs (task, queue, payload, status, run_at, attempts,"
            " attempt_id, attempt_started_at, lease_expires_at, worker_id)"
            " SELECT 'task1', 'q' || (i %% 5), '{}', 'running', now(), 1,"
            " nextval('pgqueue.attempt_id_seq'), now(), now() + interval '1 minute', 'bench'"
            " FROM generate_series(1, %(n)s) i",
            {"n": max(1, total // 1000)},
        )
        conn.execute("VACUUM ANALYZE pgqueue.jobs")
        row = conn.execute("SELECT max(id) FROM pgqueue.jobs WHERE status = 'dead'").fetchone()
        return int(row[0]) if row and row[0] else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time_pages(base: str, pages: list[str], reps: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for path in pages:
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            with urllib.request.urlopen(base + path, timeout=30) as response:
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: HTTP {response.status}")
            samples.append((time.perf_counter() - t0) * 1000)
        out[path] = {"p50_ms": percentile(samples, 50), "p95_ms": percentile(samples, 95)}
    return out


async def _sse_clients(
    host: str, port: int, path: str, n: int, stop: asyncio.Event, counts: list[int]
) -> None:
    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        try:
            while not stop.is_set():
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout=0.5)
                except TimeoutError:
                    continue
                if not line:
                    return
                if line.startswith(b"event: refresh"):
                    counts[i] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))


def w_dashboard(ctx: Any) -> dict[str, Any]:
    if ctx.system.name != "pgqueue":
        return {"skipped": "the dashboard is pgqueue's"}
    total = ctx.sizes.backlog
    t0 = time.perf_counter()
    job_id = _fill(ctx.dsn, total)
    ctx.log(f"    filled {total:,} jobs in {time.perf_counter() - t0:.0f}s")
    port = _free_port()
    app_name = f"pgqueue-dashboard-bench-{port}"
    dsn = make_conninfo(ctx.dsn, application_name=app_name)
    env = {**os.environ, "PGQUEUE_DSN": dsn}
    env.pop("PGQUEUE_DASHBOARD_TOKEN", None)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgqueue_cli",
            "dashboard",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--cache-ttl",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        pages = _pages(job_id)
        _time_pages(base, pages, 2)  # warm caches and pools
        quiet = _time_pages(base, pages, PAGE_REPS)

        counts = [0] * SSE_CLIENTS
        stop = asyncio.Event()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_until_complete,
            args=(_sse_clients("127.0.0.1", port, "/events", SSE_CLIENTS, stop, counts),),
            daemon=True,
        )
        thread.start()
        time.sleep(2.0)
        with psycopg.connect(ctx.dsn, autocommit=True) as mon:
            sessions = mon.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s",
                (app_name,),
            ).fetchone()
            before = list(counts)
            t_load = time.perf_counter()
            enqueued = 0
            while time.perf_counter() - t_load < LOAD_SECONDS:
                mon.execute("SELECT pgqueue.enqueue('bench.live', '{}'::jsonb, 'q1')")
                enqueued += 1
                time.sleep(0.002)
            seconds = time.perf_counter() - t_load
            busy = _time_pages(base, pages, max(5, PAGE_REPS // 3))
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        refreshes = [c - b for c, b in zip(counts, before, strict=True)]
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    worst_quiet = max(v["p95_ms"] for v in quiet.values())
    worst_busy = max(v["p95_ms"] for v in busy.values())
    return {
        "jobs": total,
        "pages": quiet,
        "pages_with_sse": busy,
        "max_page_p95_ms": worst_quiet,
        "max_page_p95_ms_with_sse": worst_busy,
        "sse_clients": SSE_CLIENTS,
        "sse_enqueues_per_s": enqueued / seconds,
        "sse_refreshes_per_client_per_s": sum(refreshes) / len(refreshes) / seconds,
        "dashboard_db_sessions": int(sessions[0]) if sessions else None,
    }
