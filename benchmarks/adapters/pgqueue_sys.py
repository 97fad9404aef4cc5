"""pgqueue, driven only through its public API (README).

Skipped cleanly while ``import pgqueue`` fails or the package has no ``App``
(an empty ``pgqueue/`` directory imports as a namespace package).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
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
#: The soak's periodic maintenance: archive succeeded jobs finished over a minute
#: ago, prune archived jobs and attempts over two minutes old.
SOAK_ARCHIVE_AGE = 60.0
SOAK_PRUNE_AGE = 120.0
SOAK_BATCH = 5_000


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

    def soak_maintenance(self) -> Callable[[], dict[str, Any]] | None:
        """``pgqueue archive --older-than 1m`` then ``pgqueue prune --older-than 2m``,
        as cron would run them, on an App of their own."""
        holder: list[Any] = []

        def run() -> dict[str, Any]:
            import pgqueue

            if not holder:
                holder.append(pgqueue.App(dsn=self.dsn, schema=SCHEMA))
            app = holder[0]
            archived = app.archive(older_than=SOAK_ARCHIVE_AGE, batch_size=SOAK_BATCH)
            pruned = app.prune(older_than=SOAK_PRUNE_AGE, batch_size=SOAK_BATCH)
            return {"archived": archived, **{f"pruned_{k}": v for k, v in pruned.items()}}

        return run

    def close(self) -> None:
        if self._app is not None:
            with contextlib.suppress(Exception):
                self._app.close()
            self._app = None

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
