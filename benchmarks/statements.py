"""Where pgqueue's server time goes, statement by statement.

``python -m benchmarks.statements`` starts a throwaway PostgreSQL cluster with
``pg_stat_statements`` preloaded (``track = all``, so the statements run
inside pgqueue's plpgsql functions are counted too), installs pgqueue
(``pgqueue migrate``), bulk-enqueues N no-op jobs, drains them with one
worker process (the benchmark's own worker spawner, as in the ``drain``
workloads), and prints the top statements of each phase by total execution
time. The cluster is stopped and removed at the end, also on an error or
Ctrl-C. ``--dsn`` uses an existing server instead (it must preload
pg_stat_statements); a database ``pgqb_<pid>_statements`` is created there
and dropped afterwards.

Run as root, the cluster runs as the ``postgres`` OS user (``runuser``);
otherwise as the current user. Binaries come from ``pg_config --bindir``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.common import DB_PREFIX, with_dbname

#: A comment the tool's own polling statements carry, so that they can be
#: left out of the breakdown (pg_stat_statements keeps the first text it saw).
MONITOR_MARK = "pgqb-statements-monitor"
REMAINING = (
    f"/* {MONITOR_MARK} */ SELECT count(*) FROM pgqueue.jobs"
    " WHERE status IN ('queued', 'scheduled', 'running')"
)
SNAPSHOT = f"""
/* {MONITOR_MARK} */
SELECT s.userid, s.queryid, s.toplevel, s.query, s.calls, s.total_exec_time, s.rows,
       s.shared_blks_hit, s.shared_blks_dirtied, s.wal_bytes
FROM pg_stat_statements s WHERE s.dbid = %s
"""
COUNTERS = ("calls", "total_exec_time", "rows", "shared_blks_hit", "shared_blks_dirtied",
            "wal_bytes")  # fmt: skip
ENQUEUE_CALL = 20_000  # jobs per bulk enqueue call, as in the drain workloads


def log(message: str) -> None:
    print(f"[statements] {message}", file=sys.stderr, flush=True)


# --- the server -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A throwaway cluster in a temporary directory; :meth:`remove` stops it
    and deletes every file."""

    root: Path
    port: int
    bindir: Path
    as_postgres: bool
    started: bool = False

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        return subprocess.run(
            [*prefix, *argv], text=True, check=False, stdin=subprocess.DEVNULL, **kwargs
        )

    @classmethod
    def create(cls) -> Cluster:
        bindir = Path(
            subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (bindir / tool).exists():
                raise SystemExit(
                    f"error: {bindir / tool} not found: install the PostgreSQL server "
                    "binaries, or pass --dsn of a server that preloads pg_stat_statements"
                )
        as_postgres = os.geteuid() == 0
        root = Path(tempfile.mkdtemp(prefix="pgqb-statements-"))
        cluster = cls(root, free_port(), bindir, as_postgres)
        if as_postgres:  # initdb refuses root; the server's files belong to postgres
            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
        root.chmod(0o700)
        return cluster

    def start(self) -> None:
        log(f"initdb in {self.data} ({self.bindir})")
        done = self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions",
            capture_output=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        options = " ".join(
            f"-c {setting}"
            for setting in (
                f"port={self.port}",
                "listen_addresses=127.0.0.1",
                f"unix_socket_directories={self.root}",
                "shared_preload_libraries=pg_stat_statements",
                "pg_stat_statements.track=all",
                "pg_stat_statements.max=10000",
            )
        )
        log(f"starting PostgreSQL on 127.0.0.1:{self.port}")
        done = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "-t", "60", "start",
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            # Its own session: a Ctrl-C of this tool must not reach the
            # postmaster before the tool stops it (with the worker gone).
            start_new_session=True,
        )  # fmt: skip
        self.started = True
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()}\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.root / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def remove(self) -> None:
        if self.started:
            for mode in ("fast", "immediate"):
                done = self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                    "-t", "60", "stop", capture_output=True,
                )  # fmt: skip
                if done.returncode == 0 or "PID file" in done.stderr:
                    break
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)
        log("cluster stopped and removed")


def check_server(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The server's version and pg_stat_statements settings; refuses a server
    that does not preload it."""
    preload = str(conn.execute("SHOW shared_preload_libraries").fetchone()[0])  # type: ignore[index]
    if "pg_stat_statements" not in [p.strip() for p in preload.split(",")]:
        raise SystemExit(
            "error: this server does not preload pg_stat_statements: set "
            "shared_preload_libraries = 'pg_stat_statements' (and pg_stat_statements.track = "
            "all) and restart it, or run without --dsn for a throwaway cluster"
        )
    info = {
        "version": str(conn.execute("SHOW server_version").fetchone()[0]),  # type: ignore[index]
        "track": str(conn.execute("SHOW pg_stat_statements.track").fetchone()[0]),  # type: ignore[index]
    }
    if info["track"] != "all":
        log(
            f"note: pg_stat_statements.track = {info['track']}: statements inside pgqueue's "
            "functions are not counted separately"
        )
    return info


# --- measuring --------------------------------------------------------------------------

Key = tuple[int, int, bool]  # userid, queryid, toplevel


@dataclass
class Statement:
    query: str
    toplevel: bool
    calls: float = 0
    total_exec_time: float = 0.0  # ms
    rows: float = 0
    shared_blks_hit: float = 0
    shared_blks_dirtied: float = 0
    wal_bytes: float = 0

    def as_json(self, jobs: int) -> dict[str, Any]:
        return {
            "query": self.query,
            "level": "top" if self.toplevel else "nested",
            "calls": int(self.calls),
            "total_ms": round(self.total_exec_time, 3),
            "ms_per_call": round(self.total_exec_time / self.calls, 4) if self.calls else None,
            "us_per_job": round(self.total_exec_time * 1000 / jobs, 3),
            "rows": int(self.rows),
            "shared_blks_hit": int(self.shared_blks_hit),
            "shared_blks_dirtied": int(self.shared_blks_dirtied),
            "wal_bytes": int(self.wal_bytes),
        }


def snapshot(conn: psycopg.Connection[Any], dbid: int) -> dict[Key, Statement]:
    out: dict[Key, Statement] = {}
    for userid, queryid, toplevel, query, *values in conn.execute(SNAPSHOT, (dbid,)):
        if MONITOR_MARK in (query or ""):
            continue
        out[(userid, queryid, toplevel)] = Statement(
            query or "", toplevel, *(float(v or 0) for v in values)
        )
    return out


def difference(after: dict[Key, Statement], before: dict[Key, Statement]) -> list[Statement]:
    """What ran between two snapshots, busiest first."""
    out: list[Statement] = []
    for key, stat in after.items():
        prior = before.get(key)
        delta = Statement(stat.query, stat.toplevel)
        for name in COUNTERS:
            setattr(delta, name, getattr(stat, name) - (getattr(prior, name) if prior else 0))
        if delta.calls > 0:
            out.append(delta)
    return sorted(out, key=lambda s: s.total_exec_time, reverse=True)


@dataclass
class Phase:
    name: str
    jobs: int
    seconds: float
    statements: list[Statement] = field(default_factory=list)
    #: CPU µs per job from /proc (benchmarks.cpu): server, worker processes
    cpu: dict[str, float | None] = field(default_factory=dict)

    def totals(self) -> dict[str, Any]:
        """Sums over top-level statements only: a nested statement's time,
        blocks and WAL are part of the function call that ran it."""
        top = [s for s in self.statements if s.toplevel]
        total = {name: sum(getattr(s, name) for s in top) for name in COUNTERS}
        return {
            "statements": len(top),
            "calls": int(total["calls"]),
            "calls_per_job": round(total["calls"] / self.jobs, 4),
            "total_ms": round(total["total_exec_time"], 3),
            "us_per_job": round(total["total_exec_time"] * 1000 / self.jobs, 3),
            "rows": int(total["rows"]),
            "shared_blks_hit": int(total["shared_blks_hit"]),
            "shared_blks_dirtied": int(total["shared_blks_dirtied"]),
            "wal_bytes": int(total["wal_bytes"]),
            "wal_bytes_per_job": round(total["wal_bytes"] / self.jobs, 1),
        }

    def as_json(self, top: int) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "cpu_us_per_job": {
                k: round(v, 2) if v is not None else None for k, v in self.cpu.items()
            },
            "totals": self.totals(),
            "statements": [s.as_json(self.jobs) for s in self.statements[:top]],
            "statements_left_out": max(0, len(self.statements) - top),
        }


def migrate(dsn: str) -> None:
    """``pgqueue migrate``, the command a user runs."""
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue_cli", "--dsn", dsn, "migrate"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgqueue migrate failed: {done.stderr.strip()}")


def measure(dsn: str, jobs: int, procs: int, timeout: float) -> list[Phase]:
    """Enqueue ``jobs`` and drain them; the statements of each phase."""
    with psycopg.connect(dsn, autocommit=True) as monitor:
        # The extension lives in the benchmark's database, so that nothing
        # stays behind on a server given by --dsn. This connection's own
        # statements carry MONITOR_MARK and are left out.
        monitor.execute(f"/* {MONITOR_MARK} */ CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        row = monitor.execute(
            f"/* {MONITOR_MARK} */ SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return _enqueue_and_drain(monitor, int(row[0]), dsn, jobs, procs, timeout)


def _enqueue_and_drain(
    monitor: psycopg.Connection[Any], dbid: int, dsn: str, jobs: int, procs: int, timeout: float
) -> list[Phase]:
    from benchmarks import cpu
    from benchmarks.adapters.pgqueue_sys import PgQueue
    from benchmarks.workers import WorkerGroup

    postmaster = cpu.postmaster_pid(monitor)  # None: the server's processes are not visible
    system = PgQueue(dsn)
    phases: list[Phase] = []
    try:
        log(f"enqueueing {jobs:,} jobs (enqueue_many, {ENQUEUE_CALL:,} per call)")
        before = snapshot(monitor, dbid)
        cpu_before = cpu.snapshot(postmaster, [os.getpid()])
        started = time.perf_counter()
        left = jobs
        while left > 0:
            system.bulk_enqueue(min(left, ENQUEUE_CALL))
            left -= ENQUEUE_CALL
        seconds = time.perf_counter() - started
        cpu_after = cpu.snapshot(postmaster, [os.getpid()])
        phase = Phase("enqueue", jobs, seconds, difference(snapshot(monitor, dbid), before))
        phase.cpu = _cpu(cpu.per_job_us(cpu_before, cpu_after, jobs), "producer")
        phases.append(phase)
    finally:
        system.close()

    group = WorkerGroup("pgqueue", dsn, procs)
    try:
        group.start()
        log(f"draining with {procs} worker process{'es' if procs > 1 else ''}")
        # Imports and connecting happen before "go" and are left out; the
        # worker's own start (registration, publishing its task) is in.
        before = snapshot(monitor, dbid)
        cpu_before = cpu.snapshot(postmaster, group.pids())
        started = group.go()
        deadline = time.monotonic() + timeout
        while True:
            remaining = int(monitor.execute(REMAINING).fetchone()[0])  # type: ignore[index]
            if remaining == 0:
                break
            group.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{remaining:,} jobs still unfinished after {timeout:g}s")
            time.sleep(0.02 if remaining < 2000 else 0.2)
        seconds = time.perf_counter() - started
        cpu_after = cpu.snapshot(postmaster, group.pids())
        phase = Phase("drain", jobs, seconds, difference(snapshot(monitor, dbid), before))
        phase.cpu = _cpu(cpu.per_job_us(cpu_before, cpu_after, jobs), "worker")
        phases.append(phase)
    finally:
        group.stop()
        for note in group.notes:
            log(note)
        group.cleanup()
    return phases


def _cpu(per_job: dict[str, float | None], client: str) -> dict[str, float | None]:
    return {
        "postgresql": per_job["server_cpu_us_per_job"],
        client: per_job["worker_cpu_us_per_job"],
    }


# --- output -----------------------------------------------------------------------------


def one_line(query: str, width: int) -> str:
    text = re.sub(r"\s+", " ", query).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def render(phases: list[Phase], info: dict[str, Any], top: int, width: int = 90) -> str:
    lines = [
        f"pgqueue: server time per statement (pg_stat_statements), PostgreSQL {info['version']}, "
        f"track = {info['track']}, {info['where']}",
        f"{info['jobs']:,} no-op jobs, payload {{}}; drain with {info['procs']} worker "
        f"process{'es' if info['procs'] > 1 else ''} "
        "(the benchmark's worker: concurrency 500, batch 500); 1-minute load average "
        f"{info['loadavg_before']} before, {info['loadavg_after']} after ({os.cpu_count()} CPUs).",
        "Times are execution times inside the server (no planning, no network; on a busy",
        "machine they include waiting for a CPU: the CPU µs per job from /proc, beside each",
        "phase, do not). A nested statement (run by a plpgsql function) is part of the",
        "top-level call that ran it: totals count top-level statements only.",
    ]
    header = (
        f"{'#':>3} {'level':<6} {'calls':>8} {'total ms':>10} {'ms/call':>9} {'µs/job':>8} "
        f"{'rows':>9} {'blks hit':>10} {'dirtied':>8} {'WAL bytes':>12}  statement"
    )
    for phase in phases:
        totals = phase.totals()
        lines += [
            "",
            f"== {phase.name}: {phase.jobs:,} jobs in {phase.seconds:.2f} s "
            f"({phase.jobs / phase.seconds:,.0f} jobs/s); CPU µs per job: "
            + ", ".join(
                f"{who} {value:.1f}" if value is not None else f"{who} -"
                for who, value in phase.cpu.items()
            )
            + " ==",
            header,
        ]
        for i, s in enumerate(phase.statements[:top], 1):
            lines.append(
                f"{i:>3} {'top' if s.toplevel else 'nested':<6} {int(s.calls):>8,} "
                f"{s.total_exec_time:>10,.1f} {s.total_exec_time / s.calls:>9.3f} "
                f"{s.total_exec_time * 1000 / phase.jobs:>8.2f} {int(s.rows):>9,} "
                f"{int(s.shared_blks_hit):>10,} {int(s.shared_blks_dirtied):>8,} "
                f"{int(s.wal_bytes):>12,}  {one_line(s.query, width)}"
            )
        left = len(phase.statements) - top
        if left > 0:
            lines.append(f"    ... {left} more statements (--top to show them)")
        lines.append(
            f"{'':>3} {'TOTAL':<6} {totals['calls']:>8,} {totals['total_ms']:>10,.1f} "
            f"{'':>9} {totals['us_per_job']:>8.2f} {totals['rows']:>9,} "
            f"{totals['shared_blks_hit']:>10,} {totals['shared_blks_dirtied']:>8,} "
            f"{totals['wal_bytes']:>12,}  {totals['statements']} top-level statements, "
            f"{totals['calls_per_job']:.4f} calls and {totals['wal_bytes_per_job']:,.0f} "
            "WAL bytes per job"
        )
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM cleans up like Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.statements",
        description="pg_stat_statements breakdown of pgqueue's server time per statement "
        "(bulk enqueue, then a drain with one worker process).",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to enqueue and drain")
    parser.add_argument("--procs", type=int, default=1, help="worker processes for the drain")
    parser.add_argument("--top", type=int, default=15, help="statements shown per phase")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--dsn",
        help="an existing server (superuser) that preloads pg_stat_statements, instead of a "
        "throwaway cluster",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the drain may take")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.procs < 1 or args.top < 1:
        parser.error("--jobs, --procs and --top must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster: Cluster | None = None
    server: psycopg.Connection[Any] | None = None
    dbname = f"{DB_PREFIX}{os.getpid()}_statements"
    created = False
    try:
        with terminate_as_interrupt():
            if args.dsn is None:
                cluster = Cluster.create()
                cluster.start()
            server_dsn = args.dsn or (cluster.dsn if cluster else "")
            server = psycopg.connect(server_dsn, autocommit=True)
            info: dict[str, Any] = check_server(server)
            info |= {
                "jobs": args.jobs,
                "procs": args.procs,
                "where": "throwaway cluster" if cluster else "existing server (--dsn)",
                "loadavg_before": round(os.getloadavg()[0], 2),
            }
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            created = True
            dsn = with_dbname(server_dsn, dbname)
            log("pgqueue migrate")
            migrate(dsn)
            phases = measure(dsn, args.jobs, args.procs, args.timeout)
            info["loadavg_after"] = round(os.getloadavg()[0], 2)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        if server is not None:
            if created:
                with contextlib.suppress(psycopg.Error):
                    server.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(dbname)
                        )
                    )
            server.close()
        if cluster is not None:
            cluster.remove()
    if args.json:
        print(json.dumps({**info, "phases": {p.name: p.as_json(args.top) for p in phases}},
                         indent=2))  # fmt: skip
    else:
        print(render(phases, info, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
