"""pgqueue, driven only through its public API (README).

Skipped cleanly while ``import pgqueue`` fails or the package has no ``App``
(an empty ``pgqueue/`` directory imports as a namespace package).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from datetime import datetime, timedelta
from typing import Any, ClassVar

import psycopg

from benchmarks.adapters.base import System
from benchmarks.common import WorkerControl

SCHEMA = "pgqueue"
CONCURRENCY = 500
BATCH_SIZE = 500
#: PGQB_PGQUEUE_METRICS=1 runs the workers with Prometheus metrics on (any free port).
METRICS = os.environ.get("PGQB_PGQUEUE_METRICS") == "1"
#: PGQB_PGQUEUE_LOOP=asyncio|uvloop|auto (default auto: uvloop when installed, as
#: run_worker does); PGQUEUE_NO_ORJSON=1 keeps orjson out (pgqueue's own switch).
LOOP = os.environ.get("PGQB_PGQUEUE_LOOP", "auto")
#: PGQB_PGQUEUE_TUNE_GC=0 runs the workers with tune_gc=False (for a before/after).
TUNE_GC = os.environ.get("PGQB_PGQUEUE_TUNE_GC", "1") != "0"
#: The soak's retention, for every status: the workers' maintenance drops the
#: one-minute leaves of finished jobs once a minute has passed their end.
SOAK_RETENTION = "1m"
#: The finished partitions (each range-partitioned by finish time into leaves).
FINISHED = ("succeeded", "dead", "cancelled")


def _loop_factory() -> Any:
    """The event loop pgqueue's run_worker would create (None: asyncio's)."""
    try:
        from pgqueue.worker.runner import loop_factory
    except ImportError:  # a pgqueue before pgqueue[speed]
        return None
    return loop_factory(LOOP)


def _json_library() -> str:
    try:
        from pgqueue.payloads import orjson
    except ImportError:
        return "json"
    return "orjson" if orjson() is not None else "json"


#: Optional cheap count of unfinished jobs with ``%(after)s < id <= %(upto)s`` against
#: pgqueue's own tables. While None, :meth:`PgQueue.remaining` uses the public
#: ``app.metrics()`` (queued + scheduled + running), which counts every job.
REMAINING_SQL: str | None = (
    "SELECT count(*) FROM pgqueue.jobs WHERE id > %(after)s AND id <= %(upto)s"
    " AND status IN ('queued', 'scheduled', 'running')"
)


def _make_app(dsn: str, ctl: WorkerControl | None) -> Any:
    import pgqueue

    app = pgqueue.App(dsn=dsn, schema=SCHEMA)
    if ctl is not None and ctl.record:
        # The latency probe needs the job id, hence the context.
        @app.task(name="noop", pass_context=True)
        async def noop_recorded(context: Any) -> None:
            ctl.on_task_start(int(context.job_id))
    else:

        @app.task(name="noop")
        async def noop() -> None:
            return None

    return app


class PgQueue(System):
    name: ClassVar[str] = "pgqueue"
    label: ClassVar[str] = "pgqueue"
    supports_id_range: ClassVar[bool] = REMAINING_SQL is not None

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._app: Any = None
        self._max_id = 0
        # An App whose clock the benchmark sets: a maintenance pass "later".
        self._maint_app: Any = None
        self._clock_at: datetime | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import pgqueue
        except ImportError as e:
            return f"pgqueue not importable ({e})"
        missing = [n for n in ("App", "JobSpec") if not hasattr(pgqueue, n)]
        if missing:
            return f"pgqueue has no {', '.join(missing)} yet"
        return None

    @classmethod
    def version(cls) -> str:
        import importlib.metadata

        try:
            return f"pgqueue {importlib.metadata.version('pgqueue')}"
        except importlib.metadata.PackageNotFoundError:
            return "pgqueue (source tree)"

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        return {
            "worker": f"app.run_worker_async(concurrency={CONCURRENCY}, batch_size={BATCH_SIZE},"
            " log_level='warning')",
            "bulk enqueue": "app.enqueue_many([JobSpec('noop', {})...])",
            "single enqueue": "app.enqueue('noop', {})",
            "remaining count": "custom SQL" if REMAINING_SQL else "app.metrics()",
            "event loop": "uvloop" if _loop_factory() is not None else "asyncio",
            "payload json": _json_library(),
            "gc": "tune_gc" if TUNE_GC else "tune_gc=False",
            "maintenance": "on (worker default): retention applied by the worker",
        }

    @property
    def app(self) -> Any:
        if self._app is None:
            self._app = _make_app(self.dsn, None)
        return self._app

    def setup(self) -> None:
        self.app.migrate()

    def bulk_enqueue(self, n: int) -> None:
        import pgqueue

        res = self.app.enqueue_many([pgqueue.JobSpec("noop", {}) for _ in range(n)])
        if res:
            self._max_id = max(self._max_id, max(int(r.job_id) for r in res))

    def enqueue_one(self) -> int:
        job_id = int(self.app.enqueue("noop", {}).job_id)
        self._max_id = max(self._max_id, job_id)
        return job_id

    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        if REMAINING_SQL is not None:
            row = mon.execute(
                REMAINING_SQL, {"after": after_id, "upto": upto_id or 2**62}
            ).fetchone()
            assert row is not None
            return int(row[0])
        metrics = self.app.metrics()
        return sum(int(m.queued) + int(m.scheduled) + int(m.running) for m in metrics.values())

    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        return self._max_id

    # ---- whole life: retention drops the leaves of finished jobs ------------
    def _maintenance_app(self) -> Any:
        if self._maint_app is None:
            import pgqueue

            # The database honours a passed clock for the schema's owner (the
            # benchmark's role): the pass runs as if at that time.
            self._maint_app = pgqueue.App(
                dsn=self.dsn, schema=SCHEMA, pool_max_size=1, clock=lambda: self._clock_at
            )
        return self._maint_app

    def _pass_at(self, when: datetime | None) -> dict[str, Any]:
        """One maintenance pass, as a worker runs it, at ``when`` (None: now)."""
        from pgqueue.ops import retention

        app = self._maintenance_app()
        self._clock_at = when
        done = app._database.run(retention.run_pass(app.op_context))
        return dataclasses.asdict(done)

    def life_prepare(self) -> dict[str, Any]:
        """The leaves a running fleet has: a pass now (leaves from the current
        one on), then the pass a worker runs just before retention reaches the
        end of the current leaf (it makes the leaves of that time, so that the
        measured pass does what the one that drops the leaf does: the drop,
        plus the one leaf creation due at that moment)."""
        now_pass = self._pass_at(None)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT upper FROM {SCHEMA}.retention_leaves() WHERE status = 'succeeded'"
                " AND lower <= now() AND upper > now()"
            ).fetchone()
        if row is None:
            return {"pass_now": now_pass, "note": "no leaf covers now: jobs go to the default leaf"}
        keep = self.app.get_retention().succeeded
        before = row[0] + keep - timedelta(microseconds=1)
        return {
            "pass_now": now_pass,
            "pass_before_drop": self._pass_at(before),
            "clock_before_drop": before.isoformat(),
        }

    def _finished_rows(self, mon: psycopg.Connection[Any]) -> list[tuple[str, str, int, Any]]:
        """(leaf, status, rows, last finish) of every finished partition's leaf."""
        rows = mon.execute(
            f"""
            SELECT l.leaf, l.status::text, coalesce(c.n, 0), c.last, l.upper
            FROM {SCHEMA}.retention_leaves() l
            LEFT JOIN (SELECT tableoid::regclass::text AS leaf, count(*) AS n,
                              max(finished_at) AS last
                       FROM {SCHEMA}.jobs WHERE status IN ('succeeded', 'dead', 'cancelled')
                       GROUP BY 1) c
              ON c.leaf IN (l.leaf, '{SCHEMA}.' || l.leaf)
            ORDER BY l.status, l.lower NULLS FIRST
            """
        ).fetchall()
        return [(str(r[0]), str(r[1]), int(r[2]), (r[3], r[4])) for r in rows]

    def finished_storage(self, mon: psycopg.Connection[Any]) -> dict[str, int]:
        return {leaf: n for leaf, _, n, _ in self._finished_rows(mon)}

    def cleanup_plan(self, mon: psycopg.Connection[Any]) -> Any:
        """The clock at which retention has passed every leaf holding a
        finished job: the end of the last such leaf + its status's retention
        (a default leaf: its last finish time + retention)."""
        kept = self._maintenance_app().get_retention()  # opens its connection
        keep = {s: getattr(kept, s) for s in FINISHED}
        clock: datetime | None = None
        holding: dict[str, int] = {}
        in_default = 0
        for leaf, status, n, (last, upper) in self._finished_rows(mon):
            if n == 0:
                continue
            holding[leaf] = n
            if upper is None:  # a default leaf: rows go one by one
                in_default += n
                at = last + keep[status] + timedelta(microseconds=1)
            else:
                at = upper + keep[status]
            clock = at if clock is None else max(clock, at)
        return {"clock": clock, "holding": holding, "in_default_leaves": in_default}

    def cleanup(self, plan: Any) -> dict[str, Any]:
        """A maintenance pass (what a worker runs every 10 s) at the moment
        retention has passed the leaves holding these jobs."""
        done = self._pass_at(plan["clock"])
        out: dict[str, Any] = {
            "what": "a retention pass at the end of the jobs' leaf + retention",
            "clock": plan["clock"].isoformat() if plan["clock"] else None,
            "leaves_holding_jobs": plan["holding"],
            **done,
        }
        if plan["in_default_leaves"]:
            out["note"] = (
                f"{plan['in_default_leaves']} jobs finished into a default leaf "
                "(no leaf covered their finish time): deleted row by row"
            )
        return out

    # ---- soak: no cron, the workers apply a one-minute retention -----------
    def soak_prepare(self) -> dict[str, Any]:
        kept = self.app.set_retention(
            succeeded=SOAK_RETENTION, cancelled=SOAK_RETENTION, dead=SOAK_RETENTION
        )
        return {
            "retention": {s: getattr(kept, s).total_seconds() for s in FINISHED},
            "maintenance": "the worker's own (run_worker default), no cron",
        }

    def soak_groups(self) -> dict[str, str]:
        return {"jobs": f"{SCHEMA}.jobs", "jobs_live": f"{SCHEMA}.jobs_live"}

    def soak_ledger(self) -> Any:
        from benchmarks.soak import LeafLedger

        return LeafLedger(SCHEMA)

    def close(self) -> None:
        for attr in ("_app", "_maint_app"):
            app = getattr(self, attr)
            if app is not None:
                with contextlib.suppress(Exception):
                    app.close()
                setattr(self, attr, None)

    @classmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(cls._worker(dsn, ctl))
        ctl.flush()

    @classmethod
    async def _worker(cls, dsn: str, ctl: WorkerControl) -> None:
        app = _make_app(dsn, ctl)
        stop = asyncio.Event()
        ctl.ready()
        await asyncio.to_thread(ctl.wait_go)
        worker = asyncio.create_task(
            app.run_worker_async(
                concurrency=CONCURRENCY,
                batch_size=BATCH_SIZE,
                stop=stop,
                log_level="warning",
                **({"metrics_port": 0} if METRICS else {}),
                **({} if TUNE_GC else {"tune_gc": False}),
            )
        )
        try:
            while not ctl.stop_requested():
                if worker.done():
                    worker.result()
                    raise RuntimeError("pgqueue worker exited before stop")
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker, 30)
            with contextlib.suppress(Exception):
                await app.close_async()


class PgQueueVariant(PgQueue):
    """pgqueue with ``$PGQB_PGQUEUE_VARIANT`` (a SQL file, ``{schema}`` and
    ``{channel}`` rendered as in a migration) run after ``migrate()``: a function
    body tried beside the shipped one in the same run, e.g. the previous body of
    a function as "before" against the checkout's "after"."""

    name: ClassVar[str] = "pgqueue-variant"
    label: ClassVar[str] = "pgqueue + variant SQL"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        path = os.environ.get("PGQB_PGQUEUE_VARIANT")
        if not path:
            return "set PGQB_PGQUEUE_VARIANT=FILE.sql"
        if not os.path.isfile(path):
            return f"PGQB_PGQUEUE_VARIANT: no file {path}"
        return PgQueue.unavailable_reason()

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        return {**PgQueue.tuning(), "variant": os.environ.get("PGQB_PGQUEUE_VARIANT")}

    def setup(self) -> None:
        from pathlib import Path

        from pgqueue.queries import render

        super().setup()
        path = os.environ["PGQB_PGQUEUE_VARIANT"]
        text = render(Path(path).read_text(encoding="utf-8"), SCHEMA)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(text)  # type: ignore[call-overload]
