"""PgQueuer 1.6, with its psycopg driver and with its asyncpg driver.

Tuned as its documentation recommends for throughput: batch_size 500 (short
jobs, "increase batch_size when jobs are short-lived"), several QueueManagers
per process each on its own connection (as PgQueuer's own tools/benchmark.py
does with ``--dequeue``), ``pgq autovac`` settings applied after install,
uvloop as the event loop (what ``pgq run`` uses when uvloop is installed),
durability left at the default ``durable`` (the other systems are durable too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import psycopg

from benchmarks.adapters.base import System, serial_last_value
from benchmarks.common import WorkerControl, as_url

T = TypeVar("T")

# Overridable for tuning exploration; the defaults are what the report states.
BATCH_SIZE = int(os.environ.get("PGQB_PGQUEUER_BATCH", "500"))
MANAGERS_PER_PROCESS = int(os.environ.get("PGQB_PGQUEUER_MANAGERS", "4"))

# The cleanup PgQueuer's maintainer recommends (discussion #621, "Safe
# pruning": a daily schedule deleting aggregated log rows older than a day and
# statistics older than a week), after the log aggregation its workers run
# every 30 s (QueueManager log_aggregation_interval). %s: the age kept.
PRUNE_LOG = "DELETE FROM pgqueuer_log WHERE aggregated AND created < NOW() - INTERVAL '{age}'"
PRUNE_STATISTICS = "DELETE FROM pgqueuer_statistics WHERE created < NOW() - INTERVAL '{age}'"
#: The soak's cron: log rows a minute after aggregation, statistics after a week.
SOAK_LOG_AGE = "1 minute"
SOAK_STATISTICS_AGE = "7 days"


class _PgQueuerBase(System):
    driver_name: ClassVar[str]

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._runner = asyncio.Runner()
        self._queries: Any = None
        self._conn: Any = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import pgqueuer  # noqa: F401
        except ImportError as e:
            return f"pgqueuer not installed ({e})"
        if cls.driver_name == "asyncpg":
            try:
                import asyncpg  # noqa: F401
            except ImportError as e:
                return f"asyncpg not installed ({e})"
        return None

    @classmethod
    def version(cls) -> str:
        import importlib.metadata

        v = f"pgqueuer {importlib.metadata.version('pgqueuer')}"
        if cls.driver_name == "asyncpg":
            import asyncpg

            v += f", asyncpg {asyncpg.__version__}"
        else:
            v += f", psycopg {psycopg.__version__}"
        return v

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        return {
            "driver": cls.driver_name,
            "batch_size": BATCH_SIZE,
            "QueueManagers per process": f"{MANAGERS_PER_PROCESS}, one connection each "
            "(1 in the latency probe, where more only race for each NOTIFY)",
            "max_concurrent_tasks": "unlimited (default)",
            "autovacuum": "pgq autovac (Queries.optimize_autovacuum)",
            "durability": "durable (default)",
            "event loop": "uvloop (as pgq run)",
            "bulk enqueue": "Queries.enqueue(lists) - one statement",
            "single enqueue": "Queries.enqueue(entrypoint, payload)",
        }

    # ---- connections -----------------------------------------------------
    @classmethod
    async def _connect(cls, dsn: str) -> tuple[Any, Any]:
        """Return (driver, raw connection)."""
        if cls.driver_name == "asyncpg":
            import asyncpg
            from pgqueuer.db import AsyncpgDriver

            conn = await asyncpg.connect(dsn=as_url(dsn))
            return AsyncpgDriver(conn), conn
        from pgqueuer.db import PsycopgDriver

        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return PsycopgDriver(aconn), aconn

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def _q(self) -> Any:
        if self._queries is None:
            from pgqueuer.queries import Queries

            driver, self._conn = self._run(self._connect(self.dsn))
            self._queries = Queries(driver)
        return self._queries

    # ---- producer side ---------------------------------------------------
    def setup(self) -> None:
        q = self._q()
        self._run(q.install())
        self._run(q.optimize_autovacuum())

    def bulk_enqueue(self, n: int) -> None:
        q = self._q()
        self._run(q.enqueue(["noop"] * n, [b"{}"] * n, [0] * n))

    def enqueue_one(self) -> int:
        q = self._q()
        ids = self._run(q.enqueue("noop", b"{}"))
        return int(ids[0])

    def single_enqueue(self, n: int) -> None:
        q = self._q()

        async def go() -> None:
            for _ in range(n):
                await q.enqueue("noop", b"{}")

        self._run(go())

    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        # Finished jobs are moved out of the queue table (DELETE + log row).
        if upto_id is None:
            row = mon.execute("SELECT count(*) FROM pgqueuer").fetchone()
        else:
            row = mon.execute(
                "SELECT count(*) FROM pgqueuer WHERE id > %s AND id <= %s", (after_id, upto_id)
            ).fetchone()
        assert row is not None
        return int(row[0])

    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        return serial_last_value(mon, "pgqueuer")

    # ---- cleanup ---------------------------------------------------------
    @staticmethod
    async def _prune(q: Any, log_age: str, statistics_age: str) -> None:
        await q.aggregate_logs()
        await q.driver.execute(PRUNE_LOG.format(age=log_age))
        await q.driver.execute(PRUNE_STATISTICS.format(age=statistics_age))

    def cleanup_plan(self, mon: psycopg.Connection[Any]) -> Any:
        return self._q()  # the producer's connection, open already

    def cleanup(self, plan: Any) -> dict[str, Any]:
        """Once their retention has passed (here: now): fold the log into the
        statistics, as the workers do every 30 s, then the maintainer's
        pruning of aggregated log rows and of statistics."""
        self._run(self._prune(plan, "0 seconds", "0 seconds"))
        return {
            "what": "aggregate_logs(), then "
            + PRUNE_LOG.format(age="0 seconds")
            + "; "
            + PRUNE_STATISTICS.format(age="0 seconds"),
        }

    def finished_storage(self, mon: psycopg.Connection[Any]) -> dict[str, int]:
        row = mon.execute(
            "SELECT (SELECT count(*) FROM pgqueuer_log), (SELECT count(*) FROM pgqueuer_statistics)"
        ).fetchone()
        assert row is not None
        return {"pgqueuer_log": int(row[0]), "pgqueuer_statistics": int(row[1])}

    def soak_maintenance(self) -> Any:
        """The maintainer's pruning as a cron entry: aggregated log rows over a
        minute old, statistics over a week old (the workers aggregate)."""
        runner: list[Any] = []

        def run() -> dict[str, Any]:
            if not runner:
                runner.append(asyncio.Runner())
            loop = runner[0]

            async def go() -> None:
                from pgqueuer.queries import Queries

                driver, conn = await self._connect(self.dsn)
                try:
                    await self._prune(Queries(driver), SOAK_LOG_AGE, SOAK_STATISTICS_AGE)
                finally:
                    await conn.close()

            loop.run(go())
            return {"pruned": f"log > {SOAK_LOG_AGE}, statistics > {SOAK_STATISTICS_AGE}"}

        return run

    def soak_groups(self) -> dict[str, str]:
        return {"jobs": "pgqueuer", "log": "pgqueuer_log", "statistics": "pgqueuer_statistics"}

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._run(self._conn.close())
            self._conn = None
            self._queries = None
        self._runner.close()
        self._runner = asyncio.Runner()

    # ---- worker side -----------------------------------------------------
    @classmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        logging.getLogger("pgqueuer").setLevel(logging.WARNING)
        try:
            import uvloop

            uvloop.run(cls._worker(dsn, ctl))
        except ImportError:
            asyncio.run(cls._worker(dsn, ctl))
        ctl.flush()

    @classmethod
    async def _worker(cls, dsn: str, ctl: WorkerControl) -> None:
        from pgqueuer import QueueManager
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries

        managers: list[Any] = []
        conns: list[Any] = []
        # Several managers raise throughput; for the idle-latency probe they only
        # race each other for every NOTIFY, so that profile runs one.
        managers_n = 1 if ctl.opts.profile == "latency" else MANAGERS_PER_PROCESS
        for _ in range(managers_n):
            driver, conn = await cls._connect(dsn)
            conns.append(conn)
            qm = QueueManager(Queries(driver))

            @qm.entrypoint("noop")
            async def noop(job: Job) -> None:
                ctl.on_task_start(int(job.id))

            managers.append(qm)

        ctl.ready()
        await asyncio.to_thread(ctl.wait_go)
        tasks = [asyncio.create_task(qm.run(batch_size=BATCH_SIZE)) for qm in managers]
        try:
            while not ctl.stop_requested():
                failed = [t for t in tasks if t.done()]
                if failed:
                    failed[0].result()
                    raise RuntimeError("a PgQueuer QueueManager exited before stop")
                await asyncio.sleep(0.05)
        finally:
            for qm in managers:
                qm.shutdown.set()
            try:
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
            finally:
                for conn in conns:
                    with contextlib.suppress(Exception):
                        await conn.close()


class PgQueuerPsycopg(_PgQueuerBase):
    name: ClassVar[str] = "pgqueuer-psycopg"
    label: ClassVar[str] = "PgQueuer 1.6, psycopg driver"
    driver_name: ClassVar[str] = "psycopg"


class PgQueuerAsyncpg(_PgQueuerBase):
    name: ClassVar[str] = "pgqueuer-asyncpg"
    label: ClassVar[str] = "PgQueuer 1.6, asyncpg driver"
    driver_name: ClassVar[str] = "asyncpg"
