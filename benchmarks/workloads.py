"""The workloads. Each runs against one system bound to one fresh database."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks import cpu
from benchmarks.adapters.base import System
from benchmarks.common import percentile
from benchmarks.dashboard import w_dashboard
from benchmarks.db import MonitorConnection, Server, table_stats
from benchmarks.durable import w_durable
from benchmarks.http import w_http
from benchmarks.life import w_life
from benchmarks.process_pool import w_pool
from benchmarks.soak import w_soak
from benchmarks.workers import WorkerGroup
from benchmarks.workflows import w_workflows


@dataclass
class Sizes:
    bulk: int = 20_000
    single: int = 2_000
    single_warmup: int = 50
    drain_small: int = 20_000
    drain_large: int = 100_000
    chunk: int = 20_000  # bulk-enqueue call size when a workload needs more jobs
    latency_interval: float = 0.020
    latency_seconds: float = 10.0
    latency_warmup: int = 10  # first probes excluded
    backlog: int = 1_000_000
    backlog_front: int = 20_000
    xmin_round: int = 20_000
    xmin_rounds: int = 3
    held_backlog: int = 200_000  # xmin-200k: the backlog drained with and without a snapshot held
    life: int = 20_000  # life: jobs enqueued, drained and cleaned up in one window
    soak: int = 500_000  # 0: no job cap, only soak_max_seconds
    soak_chunk: int = 10_000
    soak_max_seconds: float = 300.0
    soak_sample_seconds: float = 30.0  # table and index sizes every this often
    soak_maintenance_seconds: float = 60.0  # the system's periodic maintenance (cron)
    drain_timeout: float = 900.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            bulk=2_000,
            single=200,
            single_warmup=10,
            drain_small=2_000,
            drain_large=10_000,
            chunk=2_000,
            latency_seconds=2.0,
            latency_warmup=5,
            backlog=100_000,
            backlog_front=2_000,
            xmin_round=2_000,
            xmin_rounds=2,
            held_backlog=20_000,
            life=2_000,
            soak=50_000,
            soak_chunk=5_000,
            soak_max_seconds=60.0,
            soak_sample_seconds=10.0,
            soak_maintenance_seconds=20.0,
            drain_timeout=300.0,
        )


@dataclass
class Ctx:
    server: Server
    system: System
    dbname: str
    dsn: str
    sizes: Sizes
    log: Callable[[str], None]


# ---------------------------------------------------------------------------
# building blocks


def enqueue_in_chunks(ctx: Ctx, n: int) -> float:
    """Bulk-enqueue ``n`` jobs in calls of at most ``sizes.chunk``; return seconds."""
    t0 = time.perf_counter()
    left = n
    while left > 0:
        k = min(left, ctx.sizes.chunk)
        ctx.system.bulk_enqueue(k)
        left -= k
    return time.perf_counter() - t0


def drain(
    ctx: Ctx,
    mon: psycopg.Connection[Any],
    procs: int,
    target: int,
    upto_id: int | None,
    after_id: int = 0,
    marks: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Start ``procs`` worker processes and measure until ``target`` more jobs
    (among ``after_id < id <= upto_id``) are committed as completed. ``marks``:
    called right before *go* and right after the last completion is seen
    (before the workers stop); its results are ``mark_go`` and ``mark_done``."""
    system = ctx.system
    initial = system.remaining(mon, upto_id, after_id)
    # A previous drain's workers may already have taken a few of these jobs.
    target = min(target, initial)
    group = WorkerGroup(system.name, ctx.dsn, procs)
    group.start()
    notes: list[str] = []
    done = 0
    elapsed = 0.0
    polls = 0
    t_first: float | None = None
    postmaster = cpu.postmaster_pid(mon)
    worker_pids = group.pids()
    cpu0 = cpu1 = cpu.snapshot(postmaster, worker_pids)
    mark_go = mark_done = marks() if marks is not None else None
    try:
        t0 = group.go()
        interval = 0.002
        deadline = t0 + ctx.sizes.drain_timeout
        while True:
            time.sleep(interval)
            group.check_alive()
            t_q = time.perf_counter()
            rem = system.remaining(mon, upto_id, after_id)
            polls += 1
            done = initial - rem
            elapsed = t_q - t0
            if done > 0 and t_first is None:
                t_first = elapsed
            if done >= target:
                break
            if t_q > deadline:
                notes.append(
                    f"cut short at {ctx.sizes.drain_timeout:.0f}s with {done}/{target} done; "
                    "rate is the partial rate"
                )
                break
            # Poll rarely while far from the end, often near it.
            if done > 0:
                eta = (target - done) / (done / elapsed)
                interval = min(0.25, max(0.003, eta / 3))
            else:
                interval = min(0.01, interval * 1.5)
        # before the workers stop: their shutdown is not per-job work
        cpu1 = (
            cpu.server_seconds(postmaster) if postmaster else 0.0,
            cpu.tree_seconds(worker_pids),
        )
        if marks is not None:
            mark_done = marks()
    finally:
        group.stop()
        notes.extend(group.notes)
        group.cleanup()
    rate = min(done, target) / elapsed if elapsed > 0 else 0.0
    jobs = min(done, target)
    # The monitor's own polls (a few per second) are in the server's figure.
    cpu_us = cpu.per_job_us(cpu0, cpu1, jobs)
    return {
        **cpu_us,
        "jobs": min(done, target),
        "seconds": elapsed,
        "rate": rate,
        # from go to the first poll that saw a completion (worker reaction + first batch)
        "first_completion_seconds": t_first,
        "polls": polls,
        "notes": notes,
        **({"mark_go": mark_go, "mark_done": mark_done} if marks is not None else {}),
    }


def _quiesce(ctx: Ctx, mon: psycopg.Connection[Any] | None = None) -> None:
    """Close every producer-side connection and wait for their backends to go:
    a backend flushes its pending statistics when it exits."""
    ctx.system.close()
    if mon is not None:
        mon.close()
    if not ctx.server.wait_no_clients(ctx.dbname):
        ctx.log(f"  ! clients still connected to {ctx.dbname}; statistics may lag")


# ---------------------------------------------------------------------------
# workloads


def w_bulk(ctx: Ctx) -> dict[str, Any]:
    n = ctx.sizes.bulk
    # As in w_single: a small batch first opens the connection, loads types
    # and prepares statements, which the rate of a bulk call should not include.
    warmup = min(100, n)
    ctx.system.bulk_enqueue(warmup)
    t0 = time.perf_counter()
    ctx.system.bulk_enqueue(n)
    dt = time.perf_counter() - t0
    with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
        queued = ctx.system.remaining(mon, None)
    expected = n + warmup
    notes = [] if queued == expected else [f"expected {expected} queued jobs, found {queued}"]
    return {"jobs": n, "seconds": dt, "rate": n / dt, "notes": notes}


def w_single(ctx: Ctx) -> dict[str, Any]:
    ctx.system.single_enqueue(ctx.sizes.single_warmup)
    n = ctx.sizes.single
    t0 = time.perf_counter()
    ctx.system.single_enqueue(n)
    dt = time.perf_counter() - t0
    out: dict[str, Any] = {"jobs": n, "seconds": dt, "rate": n / dt}
    for name, fn in ctx.system.single_enqueue_variants().items():
        fn(ctx.sizes.single_warmup)
        t0 = time.perf_counter()
        fn(n)
        out[f"rate_{name}"] = n / (time.perf_counter() - t0)
    return out


def make_drain(n_attr: str, procs: int) -> Callable[[Ctx], dict[str, Any]]:
    def w_drain(ctx: Ctx) -> dict[str, Any]:
        n = int(getattr(ctx.sizes, n_attr))
        server = ctx.server
        # The schema is installed; measure enqueue + drain from here.
        _quiesce(ctx)
        server.checkpoint()
        tab0 = table_stats(ctx.dsn)
        server.wait_no_clients(ctx.dbname)
        db0 = server.db_stats(ctx.dbname)
        wal0 = server.wal_stats()
        lsn0 = server.wal_lsn()

        mon = MonitorConnection.connect(ctx.dsn, autocommit=True)
        enq_s = enqueue_in_chunks(ctx, n)
        upto = ctx.system.max_job_id(mon)
        res = drain(ctx, mon, procs, n, upto if ctx.system.supports_id_range else None)
        mon_statements = mon.statements
        _quiesce(ctx, mon)

        lsn1 = server.wal_lsn()
        wal1 = server.wal_stats()
        db1 = server.db_stats(ctx.dbname)
        tab1 = table_stats(ctx.dsn)

        d_db = {k: db1[k] - db0[k] for k in db0}
        d_tab = {
            k: tab1["total"][k] - tab0["total"][k]
            for k in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
        }
        commits = d_db["xact_commit"] - mon_statements
        wal_bytes = lsn1 - lsn0
        res.update({"enqueue_seconds": enq_s, "enqueue_rate": n / enq_s})
        if res["jobs"] < n:
            # Per-job figures need the whole enqueue + drain cycle.
            res["cost"] = {
                "skipped": f"drain cut short ({res['jobs']}/{n} done)",
                "xact_commit": commits,
                "wal_bytes": wal_bytes,
            }
            return res
        res.update(
            {
                "cost": {
                    "jobs": n,
                    "commits_per_job": commits / n,
                    "rollbacks_per_job": d_db["xact_rollback"] / n,
                    "rows_inserted_per_job": d_tab["n_tup_ins"] / n,
                    "rows_updated_per_job": d_tab["n_tup_upd"] / n,
                    "rows_hot_updated_per_job": d_tab["n_tup_hot_upd"] / n,
                    "hot_update_ratio": (
                        d_tab["n_tup_hot_upd"] / d_tab["n_tup_upd"] if d_tab["n_tup_upd"] else None
                    ),
                    "rows_deleted_per_job": d_tab["n_tup_del"] / n,
                    "db_tup_inserted_per_job": d_db["tup_inserted"] / n,
                    "db_tup_updated_per_job": d_db["tup_updated"] / n,
                    "db_tup_deleted_per_job": d_db["tup_deleted"] / n,
                    "wal_bytes_per_job": wal_bytes / n,
                    "wal_records_per_job": (wal1["wal_records"] - wal0["wal_records"]) / n,
                    "wal_fpi": wal1["wal_fpi"] - wal0["wal_fpi"],
                    "monitor_statements_subtracted": mon_statements,
                    "size_after_bytes": tab1["total"]["table_bytes"] + tab1["total"]["index_bytes"],
                    "table_bytes_after": tab1["total"]["table_bytes"],
                    "index_bytes_after": tab1["total"]["index_bytes"],
                    "dead_tuples_after": tab1["total"]["n_dead_tup"],
                    "live_tuples_after": tab1["total"]["n_live_tup"],
                    "tables_after": tab1["tables"],
                },
            }
        )
        return res

    return w_drain


def w_latency(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    group = WorkerGroup(ctx.system.name, ctx.dsn, 1, record=True, profile="latency")
    group.start()
    probes: list[tuple[int, float, float]] = []
    notes: list[str] = []
    try:
        group.go()
        time.sleep(1.0)  # let the worker reach its idle wait (LISTEN)
        count = round(s.latency_seconds / s.latency_interval)
        t_start = time.perf_counter() + 0.05
        for i in range(count):
            wait = t_start + i * s.latency_interval - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            tb = time.time()
            job_id = ctx.system.enqueue_one()
            ta = time.time()
            probes.append((job_id, tb, ta))
            group.check_alive()
        with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
            deadline = time.monotonic() + 10
            while ctx.system.remaining(mon, None) > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.1)
    finally:
        group.stop()
        notes.extend(group.notes)
    starts = group.starts()
    group.cleanup()
    measured = probes[s.latency_warmup :]
    lat = [(starts[j] - tb) * 1000 for j, tb, _ in measured if j in starts]
    enq = [(ta - tb) * 1000 for _, tb, ta in measured]
    missing = sum(1 for j, _, _ in measured if j not in starts)
    if missing:
        notes.append(f"{missing} probe jobs never started")
    return {
        "probes": len(measured),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
        "enqueue_call_p50_ms": percentile(enq, 50),
        "missing": missing,
        "notes": notes,
    }


def w_backlog(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    front = s.backlog_front
    with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
        # Empty table: enqueue `front` jobs and drain them all.
        enqueue_in_chunks(ctx, front)
        upto = ctx.system.max_job_id(mon)
        empty = drain(ctx, mon, 1, front, upto if ctx.system.supports_id_range else None)
        # Deep backlog: enqueue `backlog` more and drain `front` of them from the front,
        # twice: right after loading (the planner may still see the table as small:
        # autovacuum has not analyzed it yet), then after an explicit ANALYZE (the
        # steady state of a queue that has had a backlog for a while).
        m0 = ctx.system.max_job_id(mon)
        enq_s = enqueue_in_chunks(ctx, s.backlog)
        deep_fresh = _drain_front(ctx, mon, m0, front)
        mon.execute("ANALYZE")
        # The workers of that drain went on leasing while they stopped: start
        # after the jobs they took (else a quick run's window can be all done).
        deep_after = _untouched_after(ctx, mon, m0 + front, front)
        deep = _drain_front(ctx, mon, deep_after, front)
    notes = [*empty.pop("notes"), *deep_fresh.pop("notes"), *deep.pop("notes")]
    return {
        "rate_empty": empty["rate"],
        "rate_backlog": deep["rate"],
        "rate_backlog_unanalyzed": deep_fresh["rate"],
        "ratio": deep["rate"] / empty["rate"] if empty["rate"] else float("nan"),
        "ratio_unanalyzed": deep_fresh["rate"] / empty["rate"] if empty["rate"] else float("nan"),
        "backlog": s.backlog,
        "backlog_enqueue_rate": s.backlog / enq_s,
        "empty": empty,
        "deep_unanalyzed": deep_fresh,
        "deep": deep,
        # jobs past the first window that its drain's workers took while stopping
        "deep_window_skipped": deep_after - (m0 + front),
        "notes": notes,
    }


def _drain_front(ctx: Ctx, mon: psycopg.Connection[Any], after_id: int, n: int) -> dict[str, Any]:
    if ctx.system.supports_id_range:
        return drain(ctx, mon, 1, n, after_id + n, after_id=after_id)
    return drain(ctx, mon, 1, n, None)


def _untouched_after(ctx: Ctx, mon: psycopg.Connection[Any], after_id: int, n: int) -> int:
    """The first id window ``(a, a + n]`` from ``after_id`` on in which no job
    is done yet (workers take jobs from the front, lowest ids first)."""
    if not ctx.system.supports_id_range:
        return after_id
    start = after_id
    for _ in range(1000):
        done = n - ctx.system.remaining(mon, start + n, start)
        if done <= 0:
            break
        start += done
    return start


def _round(ctx: Ctx, mon: psycopg.Connection[Any], n: int) -> dict[str, Any]:
    m0 = ctx.system.max_job_id(mon)
    enqueue_in_chunks(ctx, n)
    upto = ctx.system.max_job_id(mon)
    if ctx.system.supports_id_range:
        return drain(ctx, mon, 1, n, upto, after_id=m0)
    return drain(ctx, mon, 1, n, None)


def _rate(rounds: list[dict[str, Any]]) -> float:
    secs = sum(r["seconds"] for r in rounds)
    return sum(r["jobs"] for r in rounds) / secs if secs else float("nan")


def w_xmin(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    notes: list[str] = []
    with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
        clean = [_round(ctx, mon, s.xmin_round)]
        holder = psycopg.connect(ctx.dsn)
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM pg_class").fetchone()  # takes the snapshot
        xmin_row = mon.execute(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
            (holder.info.backend_pid,),
        ).fetchone()
        if not xmin_row or xmin_row[0] is None:
            notes.append("holder session shows no backend_xmin")
        try:
            held = [_round(ctx, mon, s.xmin_round) for _ in range(s.xmin_rounds)]
            dead_held = table_stats(ctx.dsn)["total"]["n_dead_tup"]
        finally:
            holder.rollback()
            holder.close()
        after = [_round(ctx, mon, s.xmin_round) for _ in range(s.xmin_rounds)]
        dead_after = table_stats(ctx.dsn)["total"]["n_dead_tup"]
    for r in (*clean, *held, *after):
        notes.extend(r.pop("notes"))
    rate_clean = _rate(clean)
    return {
        "rate_clean": rate_clean,
        "rate_held": _rate(held),
        "rate_held_last": held[-1]["rate"],
        "rate_after": after[-1]["rate"],
        "held_ratio": _rate(held) / rate_clean,
        "after_ratio": after[-1]["rate"] / rate_clean,
        "dead_tuples_end_of_hold": dead_held,
        "dead_tuples_end": dead_after,
        "rounds": {"clean": clean, "held": held, "after": after},
        "notes": notes,
    }


def _held_drain(ctx: Ctx, mon: psycopg.Connection[Any], n: int, hold: bool) -> dict[str, Any]:
    """Enqueue a backlog of ``n``, then (``hold``) take a REPEATABLE READ snapshot
    in another session, and drain the whole backlog with 1 worker process."""
    m0 = ctx.system.max_job_id(mon)
    enq_s = enqueue_in_chunks(ctx, n)
    upto = ctx.system.max_job_id(mon)
    holder: psycopg.Connection[Any] | None = None
    notes: list[str] = []
    xmin = None
    if hold:
        holder = psycopg.connect(ctx.dsn)
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM pg_class").fetchone()  # takes the snapshot
        row = mon.execute(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
            (holder.info.backend_pid,),
        ).fetchone()
        xmin = row[0] if row else None
        if xmin is None:
            notes.append("holder session shows no backend_xmin")
    try:
        if ctx.system.supports_id_range:
            res = drain(ctx, mon, 1, n, upto, after_id=m0)
        else:
            res = drain(ctx, mon, 1, n, None)
        # Before the snapshot goes: the dead versions it kept (the workers'
        # backends have exited, so their statistics are in).
        tab = table_stats(ctx.dsn)
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    res["notes"] = [*notes, *res["notes"]]
    res.update(
        enqueue_seconds=enq_s,
        holder_backend_xmin=xmin,
        dead_tuples_end=tab["total"]["n_dead_tup"],
        size_after_bytes=tab["total"]["table_bytes"] + tab["total"]["index_bytes"],
    )
    return res


def w_xmin_backlog(ctx: Ctx) -> dict[str, Any]:
    """The drain rate of a backlog while a REPEATABLE READ snapshot is held over
    the whole drain, against the same drain with nothing held (issue #37)."""
    s = ctx.sizes
    if ctx.system.slow_drain:
        return {"skipped": ctx.system.slow_drain}
    with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
        clean = _held_drain(ctx, mon, s.held_backlog, hold=False)
        # Both drains start from vacuumed tables: what the clean drain left
        # dead is gone before the second backlog is enqueued.
        mon.execute("VACUUM")
        held = _held_drain(ctx, mon, s.held_backlog, hold=True)
    notes = [*clean.pop("notes"), *held.pop("notes")]
    return {
        "backlog": s.held_backlog,
        "rate_clean": clean["rate"],
        "rate_held": held["rate"],
        "held_ratio": held["rate"] / clean["rate"] if clean["rate"] else float("nan"),
        "server_cpu_us_clean": clean["server_cpu_us_per_job"],
        "server_cpu_us_held": held["server_cpu_us_per_job"],
        # steadier than the rates on a shared machine: what the held snapshot
        # costs the server per job
        "cpu_held_ratio": (
            held["server_cpu_us_per_job"] / clean["server_cpu_us_per_job"]
            if held["server_cpu_us_per_job"] and clean["server_cpu_us_per_job"]
            else None
        ),
        "dead_tuples_end_of_hold": held["dead_tuples_end"],
        "clean": clean,
        "held": held,
        "notes": notes,
    }


WORKLOADS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "bulk": w_bulk,
    "single": w_single,
    "drain-20k-1p": make_drain("drain_small", 1),
    "drain-20k-2p": make_drain("drain_small", 2),
    "drain-100k-1p": make_drain("drain_large", 1),
    "drain-100k-2p": make_drain("drain_large", 2),
    "latency": w_latency,
    "backlog": w_backlog,
    "xmin": w_xmin,
    "xmin-200k": w_xmin_backlog,
    "life": w_life,
    "soak": w_soak,
    "dashboard": w_dashboard,
    "http": w_http,
    "workflows": w_workflows,
    "pool": w_pool,
    "durable": w_durable,
}

ALIASES: dict[str, list[str]] = {
    "drain": ["drain-20k-1p", "drain-20k-2p", "drain-100k-1p", "drain-100k-2p"],
    "enqueue": ["bulk", "single"],
    "all": list(WORKLOADS),
}
