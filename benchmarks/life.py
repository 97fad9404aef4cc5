"""The ``life`` workload: what a job costs PostgreSQL over its whole life.

Enqueue N, drain them with one worker process, then the system's own cleanup
of those finished jobs, then a VACUUM of the tables that were written (what
autovacuum does later anyway), all in ONE window: the server's CPU (every
process of the postmaster, autovacuum included, as :mod:`benchmarks.cpu`
reads it) and WAL (``pg_current_wal_lsn`` delta) from before the first
enqueue to the end of the VACUUM. The same readings at every phase boundary
split the window: enqueue, drain (go to the last completion), cleanup,
vacuum, and "other" (worker start-up and shut-down, connections, the
runner's polls). The runner's own inspections (which leaves hold the jobs,
which tables need a VACUUM) are bracketed by readings and taken out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from benchmarks import cpu
from benchmarks.db import MonitorConnection, Server


@dataclass(frozen=True)
class Reading:
    """Server CPU seconds (None when its processes are not visible), WAL
    position and wall time, at one moment."""

    cpu: float | None
    lsn: int
    t: float

    def __sub__(self, other: Reading) -> Span:
        return Span(
            None if self.cpu is None or other.cpu is None else self.cpu - other.cpu,
            self.lsn - other.lsn,
            self.t - other.t,
        )


@dataclass(frozen=True)
class Span:
    cpu: float | None
    wal: int
    seconds: float

    def __add__(self, other: Span) -> Span:
        return Span(
            None if self.cpu is None or other.cpu is None else self.cpu + other.cpu,
            self.wal + other.wal,
            self.seconds + other.seconds,
        )

    def __sub__(self, other: Span) -> Span:
        return self + Span(None if other.cpu is None else -other.cpu, -other.wal, -other.seconds)

    def per_job(self, n: int) -> dict[str, Any]:
        return {
            "cpu_us_per_job": None if self.cpu is None else self.cpu * 1e6 / n,
            "wal_bytes_per_job": self.wal / n,
            "cpu_seconds": self.cpu,
            "wal_bytes": self.wal,
            "seconds": self.seconds,
        }


ZERO = Span(0.0, 0, 0.0)


class Meter:
    """Readings of one server: CPU of its processes from /proc, WAL position
    through the runner's admin connection (cluster-wide, like the WAL)."""

    def __init__(self, server: Server, postmaster: int | None) -> None:
        self.server = server
        self.postmaster = postmaster

    def read(self) -> Reading:
        lsn = self.server.wal_lsn()
        seconds = cpu.server_seconds(self.postmaster) if self.postmaster else None
        return Reading(seconds, lsn, time.perf_counter())


def tables_to_vacuum(mon: psycopg.Connection[Any]) -> list[str]:
    """The user tables autovacuum would visit for this run's writes: dead rows,
    or rows inserted since their last vacuum."""
    mon.execute("SELECT pg_stat_clear_snapshot()")
    rows = mon.execute(
        "SELECT format('%I.%I', s.schemaname, s.relname) FROM pg_stat_user_tables s"
        " JOIN pg_class c ON c.oid = s.relid"
        " WHERE c.relkind = 'r' AND (n_dead_tup > 0 OR n_ins_since_vacuum > 0)"
        " ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows]


def vacuum(mon: psycopg.Connection[Any], tables: list[str]) -> None:
    if tables:
        mon.execute(
            sql.SQL("VACUUM {}").format(
                sql.SQL(", ").join(sql.SQL(t) for t in tables)  # already quoted by format()
            )
        )


def _wait_flushed(mon: psycopg.Connection[Any], lsn: int, timeout: float = 5.0) -> None:
    """Wait until the WAL up to ``lsn`` is flushed: pg_walinspect refuses an end
    past the flush position (the VACUUM's last records may not be yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = mon.execute("SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn").fetchone()
        if row is not None and int(row[0]) >= lsn:
            return
        time.sleep(0.02)


def wal_by_kind(mon: psycopg.Connection[Any], start: int, end: int) -> list[dict[str, Any]]:
    """WAL between two positions by record type (pg_walinspect), largest first."""
    if end <= start:
        return []
    # Columns by position: PostgreSQL 15 names the first one
    # "resource_manager/record_type", 16 and later "resource_manager".
    rows = mon.execute(
        "SELECT * FROM pg_get_wal_stats('0/0'::pg_lsn + %s::numeric,"
        " '0/0'::pg_lsn + %s::numeric, true)",
        (start, end),
    ).fetchall()
    rows = sorted((r for r in rows if r[1]), key=lambda r: -(r[3] + r[5]))
    return [
        {"kind": str(r[0]), "records": int(r[1]), "record_bytes": int(r[3]), "fpi_bytes": int(r[5])}
        for r in rows
    ]


def w_life(ctx: Any) -> dict[str, Any]:
    """Enqueue + drain with 1 process + the system's cleanup + VACUUM, one window."""
    # Imported here: workloads imports this module.
    from benchmarks.workloads import _quiesce, drain, enqueue_in_chunks

    n = int(ctx.sizes.life)
    system = ctx.system
    server: Server = ctx.server
    notes: list[str] = []
    # A database the system has been running in: for pgqueue, the workers'
    # maintenance has made the time-range leaves ahead of now.
    prepared = system.life_prepare()
    _quiesce(ctx)
    mon = MonitorConnection.connect(ctx.dsn, autocommit=True)
    try:  # read-only functions, for the WAL of each phase by kind
        mon.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        walinspect = True
    except psycopg.Error:
        walinspect = False
    meter = Meter(server, cpu.postmaster_pid(mon))
    if meter.postmaster is None:
        notes.append("server processes not visible here: no CPU figures")
    server.checkpoint()
    excluded = ZERO
    try:
        r0 = meter.read()
        enqueue_in_chunks(ctx, n)
        r1 = meter.read()
        upto = system.max_job_id(mon)
        res = drain(ctx, mon, 1, n, upto if system.supports_id_range else None, marks=meter.read)
        go: Reading = res.pop("mark_go")
        done: Reading = res.pop("mark_done")
        notes.extend(res.pop("notes"))
        if res["jobs"] < n:
            raise RuntimeError(f"drain cut short ({res['jobs']}/{n} done): no whole-life figure")
        # The system's cleanup of these finished jobs: what it holds first
        # (runner's inspection, taken out of the window).
        i0 = meter.read()
        plan = system.cleanup_plan(mon)
        before = system.finished_storage(mon)
        i1 = meter.read()
        excluded += i1 - i0
        c0 = meter.read()
        cleaned = system.cleanup(plan)
        c1 = meter.read()
        # What VACUUM has to visit, with every client but the monitor gone
        # (a backend flushes its table statistics when it exits).
        after = system.finished_storage(mon)
        system.close()
        server.wait_no_clients(ctx.dbname, but=mon.info.backend_pid)
        tables = tables_to_vacuum(mon)
        i2 = meter.read()
        excluded += i2 - c1
        vacuum(mon, tables)
        r_end = meter.read()
        bounds = {
            "enqueue": (r0, r1),
            "drain": (go, done),
            "cleanup": (c0, c1),
            "vacuum": (i2, r_end),
        }
        by_kind: dict[str, Any] = {}
        if walinspect:
            try:
                _wait_flushed(mon, r_end.lsn)
                by_kind = {k: wal_by_kind(mon, a.lsn, b.lsn) for k, (a, b) in bounds.items()}
            except psycopg.Error as e:
                # e.g. a busy server recycled the window's first WAL segments
                # already: the breakdown is lost, not the measurement.
                notes.append(f"no WAL breakdown by kind: {type(e).__name__}: {e}".strip())
    finally:
        mon.close()

    phases = {
        "enqueue": r1 - r0,
        "drain": done - go,
        "cleanup": c1 - c0,
        "vacuum": r_end - i2,
    }
    whole = (r_end - r0) - excluded
    other = whole
    for span in phases.values():
        other = other - span
    phases["other"] = other
    out: dict[str, Any] = {
        "jobs": n,
        "whole": whole.per_job(n),
        "phases": {k: v.per_job(n) for k, v in phases.items()},
        "rate": res["rate"],
        "drain": res,
        "prepared": prepared,
        "cleanup": cleaned,
        "finished_storage_before_cleanup": before,
        "finished_storage_after_cleanup": after,
        "removed_by_cleanup": sorted(set(before) - set(after)),
        "vacuumed": tables,
        "wal_by_kind": by_kind,
        "excluded_inspection": {"cpu_seconds": excluded.cpu, "wal_bytes": excluded.wal},
        "notes": notes,
    }
    if cleaned and cleaned.get("note"):
        notes.append(str(cleaned["note"]))
    return out
