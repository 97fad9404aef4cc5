"""What a workflow's graph costs the server, per step, against plain jobs.

``python -m benchmarks.workflows`` (a full table) or ``python -m benchmarks
--systems pgqueue --workloads workflows`` (the headline ratios, next to the
other workloads). Each repetition gets a throwaway database and measures,
after a ``CHECKPOINT`` before each phase (full-page images count alike):

**enqueue**: ``App.enqueue_many`` of ``steps + 1`` plain jobs vs a workflow
of ``steps`` independent steps and one callback ``after=`` all of them (one
``enqueue_graph`` statement each, one round trip): client wall time, WAL
bytes (``pg_current_wal_insert_lsn``) and server CPU (``/proc``, when the
server runs on this machine) per job.

**leaf acks**: every job of a fresh fan-in (``steps`` leaves, one callback)
and of ``steps`` plain jobs is leased first; then 1 and 2 processes ack
them concurrently through ``ack_jobs``, ``--ack-batch`` jobs per
statement (each statement its own transaction, like a worker's completer),
all but the last ``PROBES + 1`` (with one ack per statement, every ack is a
commit: the last ``SINGLE_ACKS`` before those are timed, the others acked
first untimed). Per ack: wall time, server CPU (``/proc``: nanoseconds of
the live server processes), WAL; a leaf's against a plain job's, same run.
Each leaf's ack counts itself off the callback's ``job_waits`` row, the
cost this measures; two processes acking leaves of one callback also
contend for that row.

**releasing ack**: the last ``PROBES`` leaves and plain jobs are acked one
by one, measured alone (``EXPLAIN ANALYZE``'s execution time, WAL without
full-page images by ``pg_walinspect``, client wall time), then the last
leaf, whose ack releases the callback: the releasing ack against an
ordinary one and against a leaf's.

Prints tables (medians over ``--reps``); no assertions beyond the callback
being released exactly once::

    python -m benchmarks.workflows --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from benchmarks.common import DB_PREFIX, DEFAULT_DSN
from benchmarks.cpu import TICKS, postmaster_pid
from benchmarks.db import Server

PROBES = 25  # single acks measured alone, per kind and run
RELEASES = 25  # small fan-ins (two leaves) per run, each release measured alone
SINGLE_ACKS = 2000  # acks timed per kind in a run of one ack per statement (commit-bound)
LEASE = "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY[%s]::text[], 'bench', %s)"
ACK = "SELECT count(*) FROM pgqueue.ack_jobs(%s::bigint[], %s::bigint[], NULL)"
EXPLAIN_ACK = "EXPLAIN (ANALYZE, FORMAT JSON) " + ACK
# WAL between two LSNs without full-page images: a page's first change after
# a checkpoint logs the whole page, whichever statement happens to touch it.
WAL_NO_FPI = (
    "SELECT coalesce(sum(record_length - fpi_length), 0)::bigint"
    " FROM pg_get_wal_records_info(%s::pg_lsn, least(%s::pg_lsn, pg_current_wal_flush_lsn()))"
)


def server_seconds(postmaster: int) -> float:
    """CPU seconds of the server: its live processes (nanoseconds, from
    ``/proc/<pid>/schedstat``) plus the processes it reaped (clock ticks)."""
    total = 0.0
    try:
        fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / TICKS  # cutime, cstime
    except (OSError, ValueError, IndexError):
        return 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) != postmaster and entry.name != str(postmaster):
                continue
            total += int((entry / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class Cost:
    """One measured phase: jobs, wall seconds, WAL bytes, server CPU seconds."""

    jobs: int
    seconds: float
    wal: int
    cpu: float | None

    def us(self) -> float:
        return self.seconds / self.jobs * 1e6

    def wal_per_job(self) -> float:
        return self.wal / self.jobs

    def cpu_us(self) -> float | None:
        return None if self.cpu is None else self.cpu / self.jobs * 1e6


@dataclass
class Probe:
    """One statement measured alone: server execution µs, WAL bytes without
    full-page images, wall µs."""

    server_us: float
    wal: int
    wall_us: float


class Meter:
    """Wall time, WAL and server CPU around a block of statements."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.postmaster = postmaster_pid(conn)

    def lsn(self) -> int:
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        value: int = row[0]
        return value

    def cpu(self) -> float | None:
        return None if self.postmaster is None else server_seconds(self.postmaster)

    def measure(self, jobs: int, action: Callable[[], Any]) -> Cost:
        wal, cpu = self.lsn(), self.cpu()
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
        cpu_after = self.cpu()
        return Cost(
            jobs,
            seconds,
            self.lsn() - wal,
            None if cpu is None or cpu_after is None else cpu_after - cpu,
        )


def enqueue_plain(app: pgqueue.App, n: int, queue: str) -> None:
    app.enqueue_many([pgqueue.JobSpec("noop", {}, queue=queue) for _ in range(n)])


def enqueue_fan_in(app: pgqueue.App, steps: int, queue: str) -> int:
    """A workflow of ``steps`` leaves and a callback after all: the callback's id."""
    wf = app.workflow("fan-in")
    leaves = [wf.add("noop", {}, queue=queue, name=f"leaf-{i}") for i in range(steps)]
    wf.add("callback", {}, after=leaves, queue=queue)
    return wf.enqueue().jobs["callback"]


def lease_all(conn: psycopg.Connection[Any], queue: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    while batch := conn.execute(LEASE, (queue, 1000)).fetchall():
        out.extend(batch)
    return sorted(out)


def ack(conn: psycopg.Connection[Any], jobs: list[tuple[int, int]]) -> None:
    conn.execute(ACK, ([j[0] for j in jobs], [j[1] for j in jobs]))


def _ack_process(
    dsn: str,
    chunks: list[list[tuple[int, int]]],
    barrier: Any,
    measured: Any,
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        for chunk in chunks[:2]:  # warm: the prepared plan, the function cache
            conn.execute(ACK, ([c[0] for c in chunk], [c[1] for c in chunk]))
        barrier.wait()
        barrier.wait()
        for chunk in chunks[2:]:
            conn.execute(ACK, ([c[0] for c in chunk], [c[1] for c in chunk]))
        barrier.wait()
        measured.wait()  # the backend's CPU is read while it lives


def ack_concurrently(
    dsn: str, meter: Meter, jobs: list[tuple[int, int]], procs: int, batch: int
) -> Cost:
    """Ack ``jobs`` from ``procs`` processes, ``batch`` per statement; the cost
    of all but each process's two warm-up statements."""
    chunks = [jobs[i : i + batch] for i in range(0, len(jobs), batch)]
    shares = [chunks[p::procs] for p in range(procs)]  # interleaved, like leases
    measured = sum(len(c) for share in shares for c in share[2:])
    mp = multiprocessing.get_context("spawn")
    barrier, done = mp.Barrier(procs + 1), mp.Event()
    workers = [mp.Process(target=_ack_process, args=(dsn, s, barrier, done)) for s in shares]
    for w in workers:
        w.start()
    barrier.wait()  # connected and warm
    cost = meter.measure(measured, lambda: (barrier.wait(), barrier.wait()))  # start, end
    done.set()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"an ack process exited with {w.exitcode}")
    return cost


def probe_ack(conn: psycopg.Connection[Any], job: tuple[int, int]) -> Probe:
    lsn = "SELECT pg_current_wal_insert_lsn()::text"
    before = conn.execute(lsn).fetchone()
    started = time.perf_counter()
    row = conn.execute(EXPLAIN_ACK, ([job[0]], [job[1]])).fetchone()
    wall = time.perf_counter() - started
    after = conn.execute(lsn).fetchone()
    assert row is not None
    assert before is not None
    assert after is not None
    wal = conn.execute(WAL_NO_FPI, (before[0], after[0])).fetchone()
    assert wal is not None
    return Probe(row[0][0]["Execution Time"] * 1000, wal[0], wall * 1e6)


def ack_run(
    server: Server, dsn: str, app: pgqueue.App, steps: int, procs: int, batch: int, tag: str
) -> dict[str, Any]:
    """One fan-in and as many plain jobs, leased, then acked by ``procs``
    processes; the last ones probed one by one, the last leaf releasing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        meter = Meter(conn)
        # The probes' session releases a small fan-in first: plpgsql compiles
        # and plans each function once per session, not once per release.
        enqueue_fan_in(app, 2, f"warm-{tag}")
        ack(conn, lease_all(conn, f"warm-{tag}"))
        ack(conn, lease_all(conn, f"warm-{tag}"))
        enqueue_plain(app, steps, f"plain-{tag}")
        callback = enqueue_fan_in(app, steps, f"wf-{tag}")
        plain = lease_all(conn, f"plain-{tag}")
        leaves = lease_all(conn, f"wf-{tag}")
        assert len(leaves) == steps, "the callback was leased before its leaves ended"
        out: dict[str, Any] = {}
        keep = PROBES + 1
        # One ack per statement is one commit per ack: time a share of them,
        # ack the others first untimed (the callback's counter sees them all).
        timed = steps - keep if batch >= 100 else min(steps - keep, SINGLE_ACKS)
        for jobs in (plain, leaves):
            untimed = jobs[: steps - keep - timed]
            for i in range(0, len(untimed), 500):
                chunk = untimed[i : i + 500]
                conn.execute(ACK, ([c[0] for c in chunk], [c[1] for c in chunk]))
        server.conn.execute("CHECKPOINT")
        out["plain"] = ack_concurrently(dsn, meter, plain[-keep - timed : -keep], procs, batch)
        server.conn.execute("CHECKPOINT")
        out["leaf"] = ack_concurrently(dsn, meter, leaves[-keep - timed : -keep], procs, batch)
        probes: dict[str, list[Probe]] = {"plain": [], "leaf": []}
        for p, leaf in zip(plain[-keep:-1], leaves[-keep:-1], strict=True):
            probes["plain"].append(probe_ack(conn, p))
            probes["leaf"].append(probe_ack(conn, leaf))
        out["probe plain"] = probes["plain"]
        out["probe leaf"] = probes["leaf"]
        state = conn.execute(
            "SELECT j.status::text, w.pending FROM pgqueue.jobs j"
            " JOIN pgqueue.job_waits w ON w.job_id = j.id WHERE j.id = %s",
            (callback,),
        ).fetchone()
        assert state == ("waiting", 1), f"callback before its last leaf: {state}"
        out["releasing"] = probe_ack(conn, leaves[-1])
        out["plain last"] = probe_ack(conn, plain[-1])
        state = conn.execute(
            "SELECT j.status::text, w.pending FROM pgqueue.jobs j"
            " JOIN pgqueue.job_waits w ON w.job_id = j.id WHERE j.id = %s",
            (callback,),
        ).fetchone()
        assert state == ("queued", 0), f"callback after its last leaf: {state}"
        # Many releases, each alone: fan-ins of two leaves; the first leaf's
        # ack counts off, the second's releases; a plain ack beside each.
        enqueue_plain(app, RELEASES, f"release-plain-{tag}")
        plain_jobs = lease_all(conn, f"release-plain-{tag}")
        for kind in ("release leaf", "releases", "release plain"):
            out[kind] = []
        for i in range(RELEASES):
            enqueue_fan_in(app, 2, f"release-{tag}-{i}")
            first, last = lease_all(conn, f"release-{tag}-{i}")
            out["release leaf"].append(probe_ack(conn, first))
            out["releases"].append(probe_ack(conn, last))
            out["release plain"].append(probe_ack(conn, plain_jobs[i]))
    return out


def measure(
    server: Server, dsn: str, steps: int, procs_list: Iterable[int], batches: Iterable[int]
) -> dict[str, Any]:
    """Every phase on the migrated database at ``dsn``."""
    out: dict[str, Any] = {}
    with pgqueue.App(dsn=dsn) as app, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        meter = Meter(conn)
        enqueue_plain(app, 100, "warm")  # the pool, prepared statements, queue rows
        enqueue_fan_in(app, 10, "warm")
        conn.execute("DELETE FROM pgqueue.jobs")
        server.conn.execute("CHECKPOINT")
        out["enqueue plain"] = meter.measure(
            steps + 1, lambda: enqueue_plain(app, steps + 1, "plain")
        )
        server.conn.execute("CHECKPOINT")
        out["enqueue fan-in"] = meter.measure(steps + 1, lambda: enqueue_fan_in(app, steps, "wf"))
        conn.execute("DELETE FROM pgqueue.jobs")
        for batch in batches:
            for procs in procs_list:
                run = ack_run(server, dsn, app, steps, procs, batch, f"{batch}-{procs}")
                out[f"ack batch {batch}, {procs}p"] = run
    return out


def one_rep(server: Server, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    name = f"{DB_PREFIX}{os.getpid()}_wf_{rep}"
    dsn = server.create_db(name)
    try:
        with pgqueue.App(dsn=dsn) as app:
            app.migrate()
        return measure(server, dsn, args.steps, args.procs, args.ack_batch)
    finally:
        server.drop_db(name)


def _med(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def headline(reps: list[dict[str, Any]]) -> dict[str, float | None]:
    """The ratios that matter, medians over repetitions."""
    out: dict[str, float | None] = {}
    enq_p = [r["enqueue plain"] for r in reps]
    enq_w = [r["enqueue fan-in"] for r in reps]
    out["enqueue_us_per_step"] = _med(c.us() for c in enq_w)
    out["enqueue_ratio"] = _med(w.us() / p.us() for w, p in zip(enq_w, enq_p, strict=True))
    out["enqueue_cpu_ratio"] = _med(
        w.cpu_us() / pc
        for w, p in zip(enq_w, enq_p, strict=True)
        if (pc := p.cpu_us()) and w.cpu_us() is not None
    )
    out["enqueue_wal_ratio"] = _med(
        w.wal_per_job() / p.wal_per_job() for w, p in zip(enq_w, enq_p, strict=True)
    )
    for key in reps[0]:
        if not key.startswith("ack batch"):
            continue
        slug = key.removeprefix("ack ").replace(", ", "_").replace(" ", "")
        runs = [r[key] for r in reps]
        out[f"leaf_ack_{slug}_cpu_ratio"] = _med(
            lc / pc for r in runs if (lc := r["leaf"].cpu_us()) and (pc := r["plain"].cpu_us())
        )
        out[f"leaf_ack_{slug}_wal_ratio"] = _med(
            r["leaf"].wal_per_job() / r["plain"].wal_per_job() for r in runs
        )
        out[f"leaf_ack_{slug}_time_ratio"] = _med(r["leaf"].us() / r["plain"].us() for r in runs)
    single = [r[k] for r in reps for k in r if k.startswith("ack batch")]
    ordinary = _med(p.server_us for r in single for p in r["probe plain"])
    out["releasing_ack_server_us"] = _med(r["releasing"].server_us for r in single)
    out["ordinary_ack_server_us"] = ordinary
    out["releasing_ack_ratio"] = _med(
        r["releasing"].server_us / statistics.median(p.server_us for p in r["probe plain"])
        for r in single
    )
    # The release proper: a releasing ack less a leaf's ack that releases
    # nothing, against an ordinary ack (medians of many small fan-ins).
    releasing = _med(p.server_us for r in single for p in r["releases"])
    leaf = _med(p.server_us for r in single for p in r["release leaf"])
    plain = _med(p.server_us for r in single for p in r["release plain"])
    out["releases_server_us"] = releasing
    out["release_proper_ratio"] = (
        None if None in (releasing, leaf) or not plain else (releasing - leaf) / plain  # type: ignore[operator]
    )
    return out


def report(reps: list[dict[str, Any]], steps: int) -> str:
    lines = [
        f"enqueue, one statement each: {steps + 1} plain jobs vs {steps} steps + a callback",
        f"  {'':<22} {'µs/job':>8} {'WAL B/job':>10} {'srv CPU µs/job':>15}",
    ]
    for key in ("enqueue plain", "enqueue fan-in"):
        costs: list[Cost] = [r[key] for r in reps]
        lines.append(
            f"  {key:<22} {_fmt(_med(c.us() for c in costs)):>8}"
            f" {_fmt(_med(c.wal_per_job() for c in costs)):>10}"
            f" {_fmt(_med(c.cpu_us() for c in costs)):>15}"
        )
    head = headline(reps)
    lines.append(
        f"  fan-in / plain: time {_fmt(head['enqueue_ratio'], 2)},"
        f" WAL {_fmt(head['enqueue_wal_ratio'], 2)}, CPU {_fmt(head['enqueue_cpu_ratio'], 2)}"
    )
    lines += [
        "",
        "ack of a fan-in's leaf vs a plain job's (every job leased first; autocommit statements)",
        f"  {'run':<20} {'kind':<6} {'µs/ack':>8} {'srv CPU µs/ack':>15} {'WAL B/ack':>10}"
        f" {'time x':>7} {'CPU x':>6} {'WAL x':>6}",
    ]
    for key in reps[0]:
        if not key.startswith("ack batch"):
            continue
        runs = [r[key] for r in reps]
        for kind in ("plain", "leaf"):
            costs = [r[kind] for r in runs]
            us = _med(c.us() for c in costs)
            cpu = _med(c.cpu_us() for c in costs)
            wal = _med(c.wal_per_job() for c in costs)
            ratios = ""
            if kind == "leaf":
                slug = key.removeprefix("ack ").replace(", ", "_").replace(" ", "")
                ratios = (
                    f" {_fmt(head[f'leaf_ack_{slug}_time_ratio'], 2):>7}"
                    f" {_fmt(head[f'leaf_ack_{slug}_cpu_ratio'], 2):>6}"
                    f" {_fmt(head[f'leaf_ack_{slug}_wal_ratio'], 2):>6}"
                )
            label = key.removeprefix("ack ") if kind == "plain" else ""
            lines.append(
                f"  {label:<20} {kind:<6} {_fmt(us):>8} {_fmt(cpu):>15} {_fmt(wal):>10}{ratios}"
            )
    single = [r[k] for r in reps for k in r if k.startswith("ack batch")]
    lines += [
        "",
        f"single acks measured alone (medians; {PROBES} of each kind per run, one releasing ack"
        " per run)",
        f"  {'ack':<36} {'server µs':>10} {'WAL B*':>7} {'wall µs':>8}",
    ]
    rows: list[tuple[str, list[Probe]]] = [
        ("ordinary (plain job)", [p for r in single for p in r["probe plain"]]),
        ("a leaf of the fan-in", [p for r in single for p in r["probe leaf"]]),
        ("the last leaf: releases the callback", [r["releasing"] for r in single]),
    ]
    for label, probes in rows:
        lines.append(
            f"  {label:<36} {_fmt(_med(p.server_us for p in probes)):>10}"
            f" {_fmt(_med(p.wal for p in probes), 0):>7} {_fmt(_med(p.wall_us for p in probes)):>8}"
        )
    lines.append(
        f"  releasing / ordinary (server µs, per run): {_fmt(head['releasing_ack_ratio'], 2)}"
        "   (* WAL without full-page images)"
    )
    lines += [
        "",
        f"many releases ({RELEASES} fan-ins of two leaves per run, each ack alone; medians)",
        f"  {'ack':<36} {'server µs':>10} {'WAL B*':>7} {'wall µs':>8}",
    ]
    for label, key in (
        ("ordinary (plain job)", "release plain"),
        ("first leaf (counts off)", "release leaf"),
        ("second leaf (releases)", "releases"),
    ):
        probes = [p for r in single for p in r[key]]
        lines.append(
            f"  {label:<36} {_fmt(_med(p.server_us for p in probes)):>10}"
            f" {_fmt(_med(p.wal for p in probes), 0):>7} {_fmt(_med(p.wall_us for p in probes)):>8}"
        )
    lines.append(
        "  the release proper (releasing - first leaf) / ordinary:"
        f" {_fmt(head['release_proper_ratio'], 2)}"
    )
    return "\n".join(lines)


def w_workflows(ctx: Any) -> dict[str, Any]:
    """The ``workflows`` workload of ``python -m benchmarks`` (pgqueue only)."""
    if ctx.system.name != "pgqueue":
        return {"skipped": "workflows are pgqueue's"}
    steps = max(ctx.sizes.bulk // 2, 1000)
    result = measure(ctx.server, ctx.dsn, steps, (1, 2), (1, 100))
    ctx.log(report([result], steps))
    return {"steps": steps, **headline([result])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--steps", type=int, default=10_000, help="fan-in width (10000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions, fresh database each (3)")
    parser.add_argument(
        "--procs",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2],
        help="ack processes, comma list (1,2)",
    )
    parser.add_argument(
        "--ack-batch",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 100],
        help="jobs per ack statement, comma list (1,100)",
    )
    args = parser.parse_args(argv)
    server = Server(args.dsn)
    try:
        results = [one_rep(server, args, rep) for rep in range(args.reps)]
    finally:
        server.close()
    print(f"workflows benchmark: {args.steps} steps, median of {args.reps} reps")
    print(report(results, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
