"""The ``pool`` workload: ``pgqueue worker --pool process`` beside ``--pool thread``.

Two figures per pool, each from a real ``pgqueue worker`` process started as
a user would (the App in a scratch module, ``--app pgqb_pool_tasks:app``):

- ``cpu``: ``CPU_JOBS`` jobs of a pure-Python loop (about 20 ms each) with
  ``--concurrency 2``: the thread pool shares one GIL, two children use two
  cores. Target: process >= 1.7x thread on a 2-core machine.
- ``noop``: ``NOOP_JOBS`` sync jobs that do nothing, ``--concurrency 10``
  (the default): the process pool's price per job (JSON over a socket each
  way). Target: process >= 0.5x thread.

The clock starts once the worker has registered (its children are then
running) and the jobs were enqueued in one statement while the worker's
queue was paused; it stops at the first poll that sees every job finished.
Also reported: the worker process's own CPU per job (µs, from
``/proc/<pid>/stat``; the children's is not in it) for each pool, and the
process pool's overhead (process - thread) in µs of worker CPU per job.
Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

CPU_JOBS = 60
NOOP_JOBS = 4000
#: Iterations of the CPU-bound task (about 20 ms of one core here).
CPU_LOOP = 400_000

TASKS = f"""
import os
import pgqueue

app = pgqueue.App(os.environ["PGQUEUE_DSN"])


@app.task(queue="pool_bench")
def noop() -> None:
    pass


@app.task(queue="pool_bench")
def burn() -> int:
    total = 0
    for i in range({CPU_LOOP}):
        total += i * i % 7
    return total
"""

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of the process ``pid`` itself (not its children)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _unfinished(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE queue = 'pool_bench'"
        " AND status NOT IN ('succeeded', 'dead', 'cancelled')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _run(
    dsn: str, scratch: Path, pool: str, task: str, jobs: int, concurrency: int
) -> dict[str, float]:
    import pgqueue

    env = {**os.environ, "PGQUEUE_DSN": dsn, "PYTHONPATH": str(scratch)}
    with pgqueue.App(dsn) as app, psycopg.connect(dsn, autocommit=True) as conn:
        app.pause_queue("pool_bench")
        app.enqueue_many([pgqueue.JobSpec(task, {}, queue="pool_bench") for _ in range(jobs)])
        worker = subprocess.Popen(
            [sys.executable, "-m", "pgqueue_cli", "worker", "--app", "pgqb_pool_tasks:app",
             "--pool", pool, "--concurrency", str(concurrency), "--queue", "pool_bench",
             "--log-level", "error", "--no-scheduler", "--no-maintenance"],
            cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not conn.execute(
                "SELECT 1 FROM pgqueue.workers WHERE pid = %s", (worker.pid,)
            ).fetchone():
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {pool} worker did not start")
                time.sleep(0.05)
            cpu0 = _cpu_seconds(worker.pid)
            t0 = time.perf_counter()
            app.resume_queue("pool_bench")
            while _unfinished(conn):
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"the {pool} pool did not finish {jobs} {task} jobs")
                time.sleep(0.01)
            seconds = time.perf_counter() - t0
            cpu = _cpu_seconds(worker.pid) - cpu0
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        conn.execute("DELETE FROM pgqueue.jobs WHERE queue = 'pool_bench'")
    return {"rate": jobs / seconds, "worker_cpu_us": cpu / jobs * 1e6}


def measure(dsn: str, quick: bool = False) -> dict[str, Any]:
    """Every figure of the workload on a migrated database at ``dsn``."""
    cpu_jobs, noop_jobs = (CPU_JOBS // 3, NOOP_JOBS // 5) if quick else (CPU_JOBS, NOOP_JOBS)
    out: dict[str, Any] = {"cpu_jobs": cpu_jobs, "noop_jobs": noop_jobs}
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "pgqb_pool_tasks.py").write_text(TASKS)
        for pool in ("thread", "process"):
            cpu = _run(dsn, Path(scratch), pool, "burn", cpu_jobs, 2)
            noop = _run(dsn, Path(scratch), pool, "noop", noop_jobs, 10)
            out[f"cpu_{pool}"] = cpu["rate"]
            out[f"noop_{pool}"] = noop["rate"]
            out[f"noop_worker_cpu_us_{pool}"] = noop["worker_cpu_us"]
    out["cpu_ratio"] = out["cpu_process"] / out["cpu_thread"]
    out["noop_ratio"] = out["noop_process"] / out["noop_thread"]
    out["overhead_worker_cpu_us"] = (
        out["noop_worker_cpu_us_process"] - out["noop_worker_cpu_us_thread"]
    )
    return out


def w_pool(ctx: Any) -> dict[str, Any]:
    if ctx.system.name != "pgqueue":
        return {"skipped": "the process pool is pgqueue's"}
    out = measure(ctx.dsn, quick=ctx.sizes.drain_small < 20_000)
    ctx.log(
        "    pool: cpu-bound {cpu_thread:,.1f}/s thread, {cpu_process:,.1f}/s process "
        "({cpu_ratio:.2f}x, target >= 1.7x); no-op {noop_thread:,.0f}/s thread, "
        "{noop_process:,.0f}/s process ({noop_ratio:.2f}x, target >= 0.5x); worker CPU "
        "{noop_worker_cpu_us_thread:,.0f} us/job thread, {noop_worker_cpu_us_process:,.0f} "
        "us/job process (+{overhead_worker_cpu_us:,.0f})".format(**out)
    )
    return out
