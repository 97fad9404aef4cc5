"""Profile one pgqueue worker process draining no-op jobs.

``python -m benchmarks.profile_worker --jobs 50000 --svg out.svg`` creates a
fresh database, enqueues the jobs, then runs the worker (the benchmark's
settings: concurrency 500, batch 500, log level warning, no-op async task) in
a child interpreter under ``py-spy record`` until every job is finished, and
prints the child's CPU µs per job. Without ``--svg`` the child runs without a
profiler (a quick CPU-per-job figure; the real comparison is
``python -m benchmarks``). ``--metrics`` turns the worker's Prometheus
metrics on. The child is the same interpreter as this one; it picks its event
loop and JSON library as the benchmark's pgqueue workers do
(``PGQB_PGQUEUE_LOOP``, ``PGQUEUE_NO_ORJSON``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

DEFAULT_DSN = os.environ.get("PGQUEUE_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
CONCURRENCY = 500
BATCH_SIZE = 500


def _app(dsn: str) -> Any:
    import pgqueue

    app = pgqueue.App(dsn=dsn)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


async def _work(dsn: str, jobs: int, metrics: bool) -> None:
    import psycopg

    from benchmarks.adapters.pgqueue_sys import TUNE_GC

    app = _app(dsn)
    stop = asyncio.Event()
    cpu0 = time.process_time()
    worker = asyncio.create_task(
        app.run_worker_async(
            concurrency=CONCURRENCY,
            batch_size=BATCH_SIZE,
            stop=stop,
            log_level="warning",
            **({"metrics_port": 0} if metrics else {}),
            **({} if TUNE_GC else {"tune_gc": False}),
        )
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as mon:
        while True:
            await asyncio.sleep(0.05)
            if worker.done():
                worker.result()
                raise RuntimeError("the worker stopped early")
            cur = await mon.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE status IN ('queued', 'running')"
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 0:
                break
    stop.set()
    await worker
    cpu = time.process_time() - cpu0
    await app.close_async()
    print(
        f"python {sys.version.split()[0]}: worker CPU {cpu * 1e6 / jobs:.1f} µs/job "
        f"({jobs} jobs, start and stop of the worker included)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_worker")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--svg", help="write a py-spy flame graph here")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument(
        "--format", default="flamegraph", help="py-spy output format (flamegraph, raw, speedscope)"
    )
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from benchmarks.adapters.pgqueue_sys import _loop_factory

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_work(args.child, args.jobs, args.metrics))
        return

    import pgqueue
    from benchmarks.db import Server

    server = Server(args.dsn)
    name = f"pgqb_{os.getpid()}_profile"
    dsn = server.create_db(name)
    try:
        app = pgqueue.App(dsn=dsn)
        app.migrate()
        for start in range(0, args.jobs, 20_000):
            app.enqueue_many(
                [pgqueue.JobSpec("noop", {}) for _ in range(min(20_000, args.jobs - start))]
            )
        app.close()
        # PGQB_PROFILE_CHILD: another script for the child (e.g. one that instruments it).
        script = os.environ.get("PGQB_PROFILE_CHILD", "-m benchmarks.profile_worker").split()
        child = [sys.executable, *script, "--jobs", str(args.jobs)]
        child += ["--metrics"] if args.metrics else []
        child += ["--child", dsn]
        if args.svg:
            cmd = ["py-spy", "record", "-o", args.svg, "-r", str(args.rate), "--nonblocking"]
            cmd += ["--format", args.format, *os.environ.get("PGQB_PYSPY_ARGS", "").split()]
            cmd += ["--", *child]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            print(f"{args.jobs} jobs in {time.perf_counter() - t0:.2f}s (profiled)")
        else:
            subprocess.run(child, check=True)
    finally:
        server.drop_db(name)
        server.close()


if __name__ == "__main__":
    main()
