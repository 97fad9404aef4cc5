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
