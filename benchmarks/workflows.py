"""``python -m benchmarks.workflows``: what a workflow's graph costs.

Each repetition gets a throwaway database on the server at ``--dsn``
(``pgqb_<pid>_wf_<rep>``, dropped afterwards) and measures, after a
``CHECKPOINT`` before each phase (so full-page images count alike):

(a) **enqueue**: ``App.enqueue_many`` of ``--steps`` plain jobs (queue
    ``plain``) vs a workflow of ``--steps`` independent steps and one
    callback ``after=`` all of them (queue ``wf``: one ``enqueue_graph``
    statement): client wall time, WAL bytes (``pg_current_wal_insert_lsn``)
    and server CPU (``/proc``, when the server runs on this machine) per job;

(b) **release**: ``lease_jobs(..., 500)`` + ``ack_jobs`` batches through the
    SQL functions, one transaction per statement, until the queue is empty:
    the plain jobs vs the fan-out's leaves (each leaf's ack counts itself off
    the callback; the batch holding the last leaf releases it). Per job time
    and WAL of the ack statements, the median ack batch, and the ack batch
    that released the callback.

Prints a table (medians over ``--reps``); no assertions::

    python -m benchmarks.workflows --steps 10000 --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

import pgqueue
from benchmarks.common import DB_PREFIX, DEFAULT_DSN
from benchmarks.cpu import postmaster_pid, server_seconds
from benchmarks.db import Server

BATCH = 500
LEASE = "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(ARRAY[%s]::text[], 'bench', %s)"
ACK = (
    "SELECT count(*) FROM pgqueue.ack_jobs(%(ids)s::bigint[], %(attempts)s::bigint[],"
    " array_fill(NULL::jsonb, ARRAY[cardinality(%(ids)s::bigint[])]))"
)


@dataclass
class Cost:
    """One measured phase: wall seconds, WAL bytes and server CPU seconds."""

    jobs: int
    seconds: float
    wal: int
    cpu: float | None

    def per_job(self) -> tuple[float, float, float | None]:
        """(µs, WAL bytes, server CPU µs) per job."""
        cpu = None if self.cpu is None else self.cpu / self.jobs * 1e6
        return self.seconds / self.jobs * 1e6, self.wal / self.jobs, cpu


@dataclass
class Drain:
    """Ack statements of a lease+ack drain: totals and each batch."""

    acks: Cost
    leases: Cost
    batches: list[Cost] = field(default_factory=list)
    releasing: Cost | None = None  # the ack batch that released the callback


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


def enqueue_plain(app: pgqueue.App, steps: int) -> None:
    app.enqueue_many([pgqueue.JobSpec("noop", {}, queue="plain") for _ in range(steps)])


def enqueue_workflow(app: pgqueue.App, steps: int) -> None:
    wf = app.workflow("fan-out")
    leaves = [wf.add("noop", {}, queue="wf", name=f"leaf-{i}") for i in range(steps)]
    wf.add("callback", {}, after=leaves, queue="wf")
    wf.enqueue()


def lease(conn: psycopg.Connection[Any], queue: str) -> list[tuple[int, int]]:
    return conn.execute(LEASE, (queue, BATCH)).fetchall()


def drain(conn: psycopg.Connection[Any], meter: Meter, queue: str, callback: int | None) -> Drain:
    """Lease and ack ``queue`` in batches until nothing is left to lease."""
    batches: list[Cost] = []
    leases: list[Cost] = []
    releasing: Cost | None = None
    while True:
        leased: list[tuple[int, int]] = []
        lease_cost = meter.measure(1, lambda out=leased: out.extend(lease(conn, queue)))
        if not leased:
            break
        leases.append(Cost(len(leased), lease_cost.seconds, lease_cost.wal, lease_cost.cpu))
        params = {"ids": [r[0] for r in leased], "attempts": [r[1] for r in leased]}
        cost = meter.measure(len(leased), lambda params=params: conn.execute(ACK, params))
        if callback is not None and callback not in params["ids"] and releasing is None:
            row = conn.execute("SELECT status::text FROM pgqueue.jobs WHERE id = %s", (callback,))
            status = row.fetchone()
            if status is not None and status[0] != "waiting":
                releasing = cost
                continue
        batches.append(cost)
    return Drain(
        total(batches + ([releasing] if releasing else [])), total(leases), batches, releasing
    )


def total(costs: list[Cost]) -> Cost:
    cpus = [c.cpu for c in costs]
    return Cost(
        sum(c.jobs for c in costs),
        sum(c.seconds for c in costs),
        sum(c.wal for c in costs),
        None if any(c is None for c in cpus) else sum(c for c in cpus if c is not None),
    )


def one_rep(server: Server, steps: int, rep: int) -> dict[str, Cost]:
    name = f"{DB_PREFIX}{os.getpid()}_wf_{rep}"
    dsn = server.create_db(name)
    try:
        with pgqueue.App(dsn=dsn) as app:
            app.migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                meter = Meter(conn)
                enqueue_plain(app, 100)  # warm-up: pool, prepared statements, queue row
                enqueue_workflow(app, 10)
                conn.execute("DELETE FROM pgqueue.jobs")
                out: dict[str, Cost] = {}
                server.conn.execute("CHECKPOINT")
                out["enqueue plain"] = meter.measure(steps, lambda: enqueue_plain(app, steps))
                server.conn.execute("CHECKPOINT")
                out["enqueue workflow"] = meter.measure(
                    steps + 1, lambda: enqueue_workflow(app, steps)
                )
                row = conn.execute(
                    "SELECT max(id) FROM pgqueue.jobs WHERE task = 'callback'"
                ).fetchone()
                callback = row[0] if row else None
                server.conn.execute("CHECKPOINT")
                plain = drain(conn, meter, "plain", None)
                server.conn.execute("CHECKPOINT")
                fan = drain(conn, meter, "wf", callback)
        out["ack plain"] = plain.acks
        out["ack plain: median batch"] = median_cost(plain.batches)
        out["ack leaves + callback"] = fan.acks
        out["ack leaves: median batch"] = median_cost(fan.batches)
        if fan.releasing is not None:
            out["ack leaves: releasing batch"] = fan.releasing
        out["lease plain"] = plain.leases
        out["lease leaves + callback"] = fan.leases
        return out
    finally:
        server.drop_db(name)


def median_cost(costs: list[Cost]) -> Cost:
    cpus = [c.cpu for c in costs if c.cpu is not None]
    return Cost(
        int(statistics.median(c.jobs for c in costs)),
        statistics.median(c.seconds for c in costs),
        int(statistics.median(c.wal for c in costs)),
        statistics.median(cpus) if len(cpus) == len(costs) else None,
    )


def report(reps: list[dict[str, Cost]]) -> str:
    head = f"{'phase':<30} {'jobs':>6} {'ms':>9} {'µs/job':>8} {'WAL B/job':>10}"
    lines = [f"{head} {'srv CPU µs/job':>15}"]
    for phase in reps[0]:
        costs = [r[phase] for r in reps if phase in r]
        ms = statistics.median(c.seconds for c in costs) * 1000
        per = [c.per_job() for c in costs]
        us = statistics.median(p[0] for p in per)
        wal = statistics.median(p[1] for p in per)
        cpus = [p[2] for p in per if p[2] is not None]
        cpu = f"{statistics.median(cpus):>15.1f}" if cpus else f"{'n/a':>15}"
        lines.append(f"{phase:<30} {costs[0].jobs:>6} {ms:>9.1f} {us:>8.1f} {wal:>10.1f} {cpu}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--steps", type=int, default=10_000, help="fan-out width (10000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions, fresh database each (3)")
    args = parser.parse_args(argv)
    server = Server(args.dsn)
    try:
        results = [one_rep(server, args.steps, rep) for rep in range(args.reps)]
    finally:
        server.close()
    print(
        f"workflows benchmark: {args.steps} steps, lease/ack batches of {BATCH}, "
        f"median of {args.reps} reps"
    )
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
