"""What a worker is made of: what it uses of its App (:class:`WorkerApp`,
read once) and the parts that run leased jobs (:class:`JobParts`), each
given what it uses in its constructor.

The worker and :func:`pgqueue.testing.drain` both build their parts with
``JobParts.build(WorkerApp.of(app), settings, ...)``: everything a job's run
takes from the App (tasks, middleware, dependency results, result limit)
reaches the executor from the one :class:`WorkerApp`, so a part added here
serves both, and neither can run jobs without it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pgqueue.errors import InvalidOption
from pgqueue.telemetry.observer import WorkerObserver, build_observer
from pgqueue.version import __version__
from pgqueue.worker.completer import Completer
from pgqueue.worker.durable import DurableSource
from pgqueue.worker.executor import Executor
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.process_pool import ChildSpec, ProcessPool
from pgqueue.worker.progress import ProgressWriter
from pgqueue.worker.task_settings import LiveTaskSettings
from pgqueue.worker.task_transaction import TaskTransactionSource

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.middleware import Middleware
    from pgqueue.ops import OpContext
    from pgqueue.ops.schedules import ScheduleSpec
    from pgqueue.worker.executor import Dependencies, RunnableTask, RunningJob
    from pgqueue.worker.settings import WorkerSettings


class WorkerHost(Protocol):
    """What :meth:`WorkerApp.of` reads of an App (a :class:`pgqueue.App`):
    named here so that the worker imports nothing of the App above it."""

    @property
    def _database(self) -> Database: ...
    @property
    def _listen_database(self) -> Database: ...
    @property
    def op_context(self) -> OpContext: ...
    @property
    def tasks(self) -> Mapping[str, RunnableTask]: ...
    @property
    def middleware(self) -> Sequence[Middleware]: ...
    @property
    def max_result_bytes(self) -> int: ...
    @property
    def periodic_schedules(self) -> Sequence[ScheduleSpec]: ...
    @property
    def dsn(self) -> str: ...
    @property
    def schema(self) -> str: ...
    @property
    def listen_dsn(self) -> str | None: ...
    @property
    def pooler(self) -> str | None: ...

    def job_dependencies(self, job_id: int) -> tuple[int | None, list[tuple[str, str, Any]]]: ...


@dataclass(frozen=True, slots=True)
class WorkerApp:
    """What a worker uses of its App, read once when the Worker is made; the
    worker changes nothing in the App (its live task settings, say, are a
    :class:`LiveTaskSettings` of its own)."""

    database: Database
    listen_database: Database  # for the LISTEN connection
    ctx: OpContext
    tasks: Mapping[str, RunnableTask]
    middleware: Sequence[Middleware]
    dependencies: Dependencies  # context.dependency_results()
    max_result_bytes: int
    periodic_schedules: Sequence[ScheduleSpec]  # @app.periodic
    # What the start-up lines say.
    dsn: str
    schema: str
    listen_dsn: str | None
    pooler: str | None

    @classmethod
    def of(cls, app: WorkerHost) -> WorkerApp:
        return cls(
            database=app._database,
            listen_database=app._listen_database,
            ctx=app.op_context,
            tasks=app.tasks,
            middleware=app.middleware,
            dependencies=app.job_dependencies,
            max_result_bytes=app.max_result_bytes,
            periodic_schedules=app.periodic_schedules,
            dsn=app.dsn,
            schema=app.schema,
            listen_dsn=app.listen_dsn,
            pooler=app.pooler,
        )


@dataclass(frozen=True, slots=True)
class JobParts:
    """The parts that run leased jobs and record their attempts.

    ``running`` is the table of jobs whose attempt is not yet recorded: the
    executor adds to it, the completer removes what it recorded, the
    heartbeat extends what is in it. ``connected`` is set while a LISTEN
    connection is up (else the heartbeat polls for cancel requests).
    ``observer`` (metrics, tracing) and ``progress`` (``set_progress``
    writes) are closed and drained by whoever built the parts."""

    running: dict[int, RunningJob]
    connected: asyncio.Event
    live_settings: LiveTaskSettings
    completer: Completer
    transactions: TaskTransactionSource
    executor: Executor
    heartbeat: Heartbeat
    observer: WorkerObserver
    progress: ProgressWriter

    @classmethod
    def build(
        cls,
        app: WorkerApp,
        settings: WorkerSettings,
        *,
        on_fatal: Callable[[str, BaseException], None],
        stopped: asyncio.Event,
    ) -> JobParts:
        """The parts for ``app`` under ``settings`` (queues, concurrency,
        metrics...). ``on_fatal`` is told of an error the completer cannot
        ride out; the heartbeat runs until ``stopped``. Everything else comes
        from ``app``: there is no way to build parts that leave out the
        App's middleware or its dependency results."""
        database, ctx = app.database, app.ctx
        running: dict[int, RunningJob] = {}
        connected = asyncio.Event()
        extend_now = asyncio.Event()  # context.extend() wakes the heartbeat
        pool = None
        if settings.pool == "process":
            if settings.app_path is None:
                raise InvalidOption("pool='process' needs the App's import path (app_path)")
            pool = ProcessPool(
                ChildSpec(settings.app_path, app.dsn, app.schema),
                settings.concurrency,
                kill_grace=settings.kill_grace,
                max_tasks_per_child=settings.max_tasks_per_child,
                max_memory_per_child=settings.max_memory_per_child,
                on_fatal=on_fatal,
            )
        # Metrics and tracing hooks (the no-op observer when neither is on).
        observer = build_observer(settings, __version__, running, pool)
        progress = ProgressWriter(database)
        live_settings = LiveTaskSettings(database)
        completer = Completer(database, ctx, running, on_fatal)
        transactions = TaskTransactionSource(database, ctx, settings.concurrency)
        executor = Executor(
            app.tasks,
            settings.concurrency,
            completer,
            app.max_result_bytes,
            running=running,
            worker_id=settings.worker_id,
            transactions=transactions,
            observer=observer,
            progress=progress,
            middleware=app.middleware,
            dependencies=app.dependencies,
            live_settings=live_settings.current,
            unknown_task_grace=settings.unknown_task_grace,
            heartbeat_wake=extend_now.set,
            pool=pool,
            durable=DurableSource(
                database, transactions.connections, app.max_result_bytes, ctx.clock
            ),
        )
        heartbeat = Heartbeat(
            database,
            ctx,
            settings,
            executor,
            stopped,
            lambda: settings.listen and connected.is_set(),
            extend_now,
        )
        return cls(
            running,
            connected,
            live_settings,
            completer,
            transactions,
            executor,
            heartbeat,
            observer,
            progress,
        )
