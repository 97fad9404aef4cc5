"""The ``soak`` workload: a long run at full drain rate, sizes sampled.

One worker process; the runner keeps 10-20k jobs queued (bulk calls) until
``sizes.soak`` jobs went through (0: no cap) or ``soak_max_seconds`` passed.
pgqueue runs with a one-minute retention for every status and no cron: its
worker's own maintenance drops the leaves of finished jobs. Systems that need
an operator's periodic cleanup get it from a thread of the runner, as cron
would run it (``System.soak_maintenance``). Every ``soak_sample_seconds`` the
sizes (table + indexes, all partitions) of the system's relations are
sampled; ``size_growth`` = largest size of the last quarter ÷ largest of the
second quarter (the first quarter is warm-up).

Every job is accounted for: enqueued = finished + still live. pgqueue's
finished jobs are deleted a minute or two after they end, so the runner
counts them before that: :class:`LeafLedger` counts each time-range leaf once
after its range has ended (no job lands in it any more) and before retention
can drop it, and remembers the ids in the default leaves (rows there go one
by one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.db import MonitorConnection, table_stats
from benchmarks.workers import WorkerGroup

#: The ledger looks at the leaves this often (s); a one-minute leaf is
#: dropped no earlier than a minute after its range ends.
LEDGER_SECONDS = 5.0
#: A leaf is counted once its range ended this long ago: a completion that
#: started before the end has committed by then.
CLOSE_GRACE = "10 seconds"


class LeafLedger:
    """Counts pgqueue's finished jobs before retention deletes them."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.counted: dict[str, tuple[str, int]] = {}  # leaf -> (status, rows)
        self.default_ids: dict[str, set[int]] = {}  # status -> ids seen in its default leaf
        self.seen: dict[str, str] = {}  # leaf -> status, every leaf ever seen
        self.missed: list[str] = []  # dropped before they were counted
        self.polls = 0
        self.seconds = 0.0

    def _leaves(self, mon: psycopg.Connection[Any]) -> list[tuple[str, str, bool, bool]]:
        rows = mon.execute(
            sql.SQL(
                "SELECT leaf, status::text, upper IS NULL, "
                "coalesce(upper <= now() - {}::interval, false) "
                "FROM {}.retention_leaves()"
            ).format(sql.Literal(CLOSE_GRACE), sql.Identifier(self.schema))
        ).fetchall()
        return [(str(r[0]), str(r[1]), bool(r[2]), bool(r[3])) for r in rows]

    def _count(self, mon: psycopg.Connection[Any], leaf: str) -> int:
        row = mon.execute(
            sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(self.schema), sql.Identifier(leaf)
            )
        ).fetchone()
        return int(row[0]) if row else 0

    def poll(self, mon: psycopg.Connection[Any], final: bool = False) -> None:
        """Count the leaves that closed since the last poll (``final``: every
        leaf not counted yet, the workers having stopped)."""
        t = time.perf_counter()
        present = set()
        for leaf, status, no_bounds, closed in self._leaves(mon):
            if no_bounds and not leaf.endswith("_default"):
                continue  # being dropped: its bounds are gone from the catalog already
            present.add(leaf)
            self.seen[leaf] = status
            try:
                if no_bounds:
                    ids = mon.execute(
                        sql.SQL("SELECT id FROM {}.{}").format(
                            sql.Identifier(self.schema), sql.Identifier(leaf)
                        )
                    ).fetchall()
                    self.default_ids.setdefault(status, set()).update(int(r[0]) for r in ids)
                elif leaf not in self.counted and (closed or final):
                    self.counted[leaf] = (status, self._count(mon, leaf))
                elif final and leaf in self.counted:
                    again = self._count(mon, leaf)
                    if again != self.counted[leaf][1]:
                        self.missed.append(f"{leaf}: {self.counted[leaf][1]} counted, {again} now")
            except psycopg.errors.UndefinedTable:
                present.discard(leaf)  # dropped meanwhile
        for leaf in set(self.seen) - present:
            if leaf not in self.counted and leaf not in self.missed:
                self.missed.append(leaf)
        self.polls += 1
        self.seconds += time.perf_counter() - t

    def finished(self) -> dict[str, int]:
        out = {"succeeded": 0, "dead": 0, "cancelled": 0}
        for status, n in self.counted.values():
            out[status] = out.get(status, 0) + n
        for status, ids in self.default_ids.items():
            out[status] = out.get(status, 0) + len(ids)
        return out

    def report(self) -> dict[str, Any]:
        return {
            "leaves_counted": len(self.counted),
            "jobs_in_default_leaves": sum(len(v) for v in self.default_ids.values()),
            "leaves_missed": self.missed,
            "polls": self.polls,
            "poll_seconds": round(self.seconds, 2),
        }


class _Maintainer(threading.Thread):
    """Runs the system's periodic maintenance (what cron would) every ``interval``
    seconds in its own thread, recording what each run did and how long it took."""

    def __init__(self, fn: Callable[[], dict[str, Any]], interval: float, t0: float) -> None:
        super().__init__(daemon=True, name="soak-maintenance")
        self.fn = fn
        self.interval = interval
        self.t0 = t0
        self.runs: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            t = time.perf_counter()
            try:
                did = self.fn()
            except Exception as e:  # recorded, the soak goes on
                self.errors.append(f"{type(e).__name__}: {e}")
                continue
            self.runs.append(
                {"t": round(t - self.t0, 1), "seconds": time.perf_counter() - t, **did}
            )


GROUP_SIZE = """
SELECT coalesce(sum(pg_table_size(t.relid)), 0), coalesce(sum(pg_indexes_size(t.relid)), 0),
       count(*), coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0)
FROM (SELECT relid FROM pg_partition_tree(%(rel)s::regclass) WHERE isleaf
      UNION
      SELECT c.oid FROM pg_class c WHERE c.oid = %(rel)s::regclass AND c.relkind = 'r') t
LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid
"""


def group_sizes(mon: psycopg.Connection[Any], groups: dict[str, str]) -> dict[str, dict[str, int]]:
    """Table and index bytes (every leaf of a partitioned relation), leaves,
    live and dead tuples of each relation in ``groups``."""
    out: dict[str, dict[str, int]] = {}
    for name, rel in groups.items():
        row = mon.execute(GROUP_SIZE, {"rel": rel}).fetchone()
        assert row is not None
        out[name] = {
            "table_bytes": int(row[0]),
            "index_bytes": int(row[1]),
            "size_bytes": int(row[0]) + int(row[1]),
            "relations": int(row[2]),
            "live_tuples": int(row[3]),
            "dead_tuples": int(row[4]),
        }
    return out


def _size_sample(
    dsn: str, mon: psycopg.Connection[Any], groups: dict[str, str], t: float, done: int
) -> dict[str, Any]:
    tab = table_stats(dsn)
    return {
        "t": round(t, 1),
        "jobs_done": done,
        "table_bytes": tab["total"]["table_bytes"],
        "index_bytes": tab["total"]["index_bytes"],
        "live_tuples": tab["total"]["n_live_tup"],
        "dead_tuples": tab["total"]["n_dead_tup"],
        "groups": group_sizes(mon, groups),
        "tables": {
            name: {k: t[k] for k in ("table_bytes", "index_bytes", "n_live_tup", "n_dead_tup")}
            for name, t in tab["tables"].items()
            if t["table_bytes"] + t["index_bytes"] > 64 * 1024
        },
    }


def size_trend(
    samples: list[dict[str, Any]], size: Callable[[dict[str, Any]], int]
) -> dict[str, Any]:
    """Largest size in the last quarter of the run ÷ largest in the second
    quarter (by time; the first quarter is warm-up): ~1 when flat."""
    if len(samples) < 4:
        return {}
    end = samples[-1]["t"]
    second = [size(x) for x in samples if end / 4 <= x["t"] < end / 2]
    last = [size(x) for x in samples if x["t"] >= 3 * end / 4]
    if not second or not last:
        return {}
    early, late = max(second), max(last)
    return {
        "peak_second_quarter": early,
        "peak_last_quarter": late,
        "growth": late / early if early else float("nan"),
    }


def w_soak(ctx: Any) -> dict[str, Any]:
    s = ctx.sizes
    system = ctx.system
    notes: list[str] = []
    chunks: list[tuple[int, int]] = []  # (after_id, upto_id) of outstanding chunks
    enqueued = 0
    rem = 0
    samples: list[dict[str, Any]] = []
    cap = s.soak if s.soak > 0 else None
    prepared = system.soak_prepare()
    groups = system.soak_groups()
    ledger = system.soak_ledger()
    maint_fn = system.soak_maintenance()
    maintainer: _Maintainer | None = None
    with MonitorConnection.connect(ctx.dsn, autocommit=True) as mon:
        group = WorkerGroup(system.name, ctx.dsn, 1)
        group.start()
        try:
            t0 = group.go()
            if maint_fn is not None:
                maintainer = _Maintainer(maint_fn, s.soak_maintenance_seconds, t0)
                maintainer.start()
            next_sample = t0
            next_ledger = t0 + LEDGER_SECONDS
            while True:
                group.check_alive()
                # retire completed chunks from the front
                while chunks and system.supports_id_range:
                    a, b = chunks[0]
                    if system.remaining(mon, b, a) == 0:
                        chunks.pop(0)
                    else:
                        break
                if chunks and system.supports_id_range:
                    rem = system.remaining(mon, chunks[-1][1], chunks[0][0])
                elif not system.supports_id_range:
                    rem = system.remaining(mon, None)
                else:
                    rem = 0
                now = time.perf_counter()
                elapsed = now - t0
                if ledger is not None and now >= next_ledger:
                    ledger.poll(mon)
                    next_ledger = now + LEDGER_SECONDS
                if now >= next_sample:
                    samples.append(_size_sample(ctx.dsn, mon, groups, elapsed, enqueued - rem))
                    ctx.log(_sample_line(samples[-1], groups))
                    next_sample += s.soak_sample_seconds
                if cap is not None and enqueued >= cap and rem == 0:
                    break
                if elapsed > s.soak_max_seconds:
                    notes.append(f"stopped at the {s.soak_max_seconds:.0f}s cap")
                    break
                if (cap is None or enqueued < cap) and rem < 2 * s.soak_chunk:
                    k = s.soak_chunk if cap is None else min(s.soak_chunk, cap - enqueued)
                    a = system.max_job_id(mon)
                    system.bulk_enqueue(k)
                    b = system.max_job_id(mon)
                    chunks.append((a, b))
                    enqueued += k
                    continue
                time.sleep(0.02)
            elapsed = time.perf_counter() - t0
        finally:
            if maintainer is not None:
                maintainer.halt.set()
                maintainer.join(timeout=600)
            group.stop()
            notes.extend(group.notes)
            group.cleanup()
        # The workers have stopped (in-flight jobs finished): what is left.
        live_end = system.remaining(mon, None)
        if ledger is not None:
            ledger.poll(mon, final=True)
        samples.append(_size_sample(ctx.dsn, mon, groups, elapsed, enqueued - live_end))
    done = enqueued - live_end
    if maintainer is not None:
        notes.extend(f"maintenance failed: {e}" for e in maintainer.errors[:5])
    accounting: dict[str, Any] = {"enqueued": enqueued, "live_at_end": live_end}
    if ledger is not None:
        finished = ledger.finished()
        accounting.update(
            finished=finished,
            method=getattr(
                ledger,
                "method",
                "each leaf counted once closed, before retention dropped it; "
                "ids of default-leaf rows remembered",
            ),
            **ledger.report(),
        )
        unaccounted = enqueued - live_end - sum(finished.values())
        accounting["unaccounted"] = unaccounted
        accounting["all_accounted"] = unaccounted == 0 and not ledger.missed
        if not accounting["all_accounted"]:
            notes.append(
                f"jobs not accounted for: {unaccounted} (enqueued {enqueued}, finished "
                f"{sum(finished.values())}, live {live_end}; leaves missed: {ledger.missed})"
            )
        if finished["dead"] or finished["cancelled"]:
            notes.append(f"no-op jobs ended dead or cancelled: {finished}")
    else:
        accounting.update(
            finished=done, method="finished = enqueued - still live (the runner's count)"
        )
    main = next(iter(groups), None)
    trend = size_trend(samples, lambda x: x["groups"][main]["size_bytes"]) if main else {}
    trend_all = size_trend(samples, lambda x: int(x["table_bytes"] + x["index_bytes"]))
    last = samples[-1]
    return {
        "jobs": done,
        "seconds": elapsed,
        "rate": done / elapsed if elapsed else float("nan"),
        "size_bytes": last["groups"][main]["size_bytes"] if main else None,
        "all_tables_size_bytes": last["table_bytes"] + last["index_bytes"],
        "dead_tuples": last["dead_tuples"],
        "live_tuples": last["live_tuples"],
        "size_growth": trend.get("growth"),
        "size_growth_all_tables": trend_all.get("growth"),
        "size_trend": {"group": main, **trend, "all_tables": trend_all},
        "groups": groups,
        "accounting": accounting,
        "all_accounted": accounting.get("all_accounted"),
        "prepared": prepared,
        "samples": samples,
        "maintenance": maintainer.runs if maintainer is not None else [],
        "notes": notes,
    }


def _sample_line(x: dict[str, Any], groups: dict[str, str]) -> str:
    parts = [f"  soak t={x['t']:6.0f}s done={x['jobs_done']:>10}"]
    for name in groups:
        g = x["groups"][name]
        parts.append(
            f"{name}={g['table_bytes'] / 2**20:.1f}+{g['index_bytes'] / 2**20:.1f} MiB"
            f" ({g['relations']} rel, dead {g['dead_tuples']})"
        )
    parts.append(f"all={(x['table_bytes'] + x['index_bytes']) / 2**20:.1f} MiB")
    return " ".join(parts)
