"""Procrastinate 3.10 with its psycopg connector.

Tuned: worker ``concurrency`` raised from the default 1 (each job is fetched
and finished by its own statements, so concurrency is the only throughput
knob Procrastinate offers), the connector's pool sized above the concurrency
so fetches never wait for a connection, LISTEN/NOTIFY on (default). Jobs are
kept after completion (``delete_jobs="never"``, the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import psycopg

from benchmarks.adapters.base import System, serial_last_value
from benchmarks.common import WorkerControl

T = TypeVar("T")

# Overridable for tuning exploration; the defaults are what the report states.
CONCURRENCY = int(os.environ.get("PGQB_PROCRASTINATE_CONCURRENCY", "20"))
POOL_MAX = CONCURRENCY + 4


def _make_app(dsn: str, ctl: WorkerControl | None) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=min(4, POOL_MAX), max_size=POOL_MAX
        )
    )

    @app.task(name="noop", pass_context=True)
    async def noop(context: Any) -> None:
        if ctl is not None:
            ctl.on_task_start(int(context.job.id))

    return app, noop


class Procrastinate(System):
    name: ClassVar[str] = "procrastinate"
    label: ClassVar[str] = "Procrastinate 3.10"
    slow_drain: ClassVar[str | None] = (
        "one job per statement, ~500 jobs/s: a 200k backlog takes ~7 min per drain"
    )

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._runner = asyncio.Runner()
        self._app: Any = None
        self._task: Any = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import procrastinate  # noqa: F401
        except ImportError as e:
            return f"procrastinate not installed ({e})"
        return None

    @classmethod
    def version(cls) -> str:
        import importlib.metadata

        return f"procrastinate {importlib.metadata.version('procrastinate')}"

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        return {
            "worker concurrency": CONCURRENCY,
            "connector pool": f"PsycopgConnector min_size=4 max_size={POOL_MAX}",
            "listen_notify": True,
            "delete_jobs": "never (default)",
            "bulk enqueue": "task.batch_defer_async(*kwargs)",
            "single enqueue": "task.defer_async()",
            "event loop": "asyncio (as the procrastinate CLI)",
        }

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def _ensure(self) -> Any:
        if self._app is None:
            self._app, self._task = _make_app(self.dsn, None)
            app = self._app

            async def _open() -> None:
                await app.open_async()

            self._run(_open())
        return self._task

    def setup(self) -> None:
        self._ensure()
        self._run(self._app.schema_manager.apply_schema_async())

    def bulk_enqueue(self, n: int) -> None:
        task = self._ensure()
        self._run(task.batch_defer_async(*({} for _ in range(n))))

    def enqueue_one(self) -> int:
        task = self._ensure()
        return int(self._run(task.defer_async()))

    def single_enqueue(self, n: int) -> None:
        task = self._ensure()

        async def go() -> None:
            for _ in range(n):
                await task.defer_async()

        self._run(go())

    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        if upto_id is None:
            row = mon.execute(sql).fetchone()
        else:
            row = mon.execute(sql + " AND id > %s AND id <= %s", (after_id, upto_id)).fetchone()
        assert row is not None
        return int(row[0])

    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        return serial_last_value(mon, "procrastinate_jobs")

    # ---- cleanup ---------------------------------------------------------
    def cleanup_plan(self, mon: psycopg.Connection[Any]) -> Any:
        self._ensure()  # the producer's App (and its pool), open already
        return self._app

    def cleanup(self, plan: Any) -> dict[str, Any]:
        """``delete_old_jobs``, Procrastinate's cleanup of finished jobs (its
        events go with them), with their retention passed: ``nb_hours=0``."""
        self._run(plan.job_manager.delete_old_jobs(nb_hours=0))
        return {"what": "app.job_manager.delete_old_jobs(nb_hours=0)"}

    def finished_storage(self, mon: psycopg.Connection[Any]) -> dict[str, int]:
        row = mon.execute(
            "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM procrastinate_events)"
        ).fetchone()
        assert row is not None
        return {"procrastinate_jobs (succeeded)": int(row[0]), "procrastinate_events": int(row[1])}

    def soak_maintenance(self) -> Any:
        """``delete_old_jobs(nb_hours=0)`` as a cron entry (hours are its unit)."""

        def run() -> dict[str, Any]:
            app, _ = _make_app(self.dsn, None)

            async def go() -> None:
                async with app.open_async():
                    await app.job_manager.delete_old_jobs(nb_hours=0)

            asyncio.run(go())
            return {"deleted": "succeeded jobs (delete_old_jobs nb_hours=0)"}

        return run

    def soak_groups(self) -> dict[str, str]:
        return {"jobs": "procrastinate_jobs", "events": "procrastinate_events"}

    def close(self) -> None:
        if self._app is not None:
            with contextlib.suppress(Exception):
                self._run(self._app.close_async())
            self._app = None
        self._runner.close()
        self._runner = asyncio.Runner()

    @classmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        asyncio.run(cls._worker(dsn, ctl))
        ctl.flush()

    @classmethod
    async def _worker(cls, dsn: str, ctl: WorkerControl) -> None:
        app, _ = _make_app(dsn, ctl)
        async with app.open_async():
            ctl.ready()
            await asyncio.to_thread(ctl.wait_go)
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=CONCURRENCY, install_signal_handlers=False)
            )
            try:
                while not ctl.stop_requested():
                    if worker.done():
                        worker.result()
                        raise RuntimeError("procrastinate worker exited before stop")
                    await asyncio.sleep(0.05)
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(worker, 30)
