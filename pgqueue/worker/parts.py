"""What a worker is made of: what it uses of its App (:class:`WorkerApp`,
read once) and the parts that run leased jobs (:class:`JobParts`), each
given what it uses in its constructor. The worker and
:func:`pgqueue.testing.drain` build their parts here, the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgqueue.telemetry.observer import NULL_OBSERVER, WorkerObserver
from pgqueue.worker.completer import Completer
from pgqueue.worker.executor import Executor
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.task_settings import LiveTaskSettings
from pgqueue.worker.task_transaction import TaskTransactionSource

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.database import Database
    from pgqueue.middleware import Middleware
    from pgqueue.ops import OpContext
    from pgqueue.ops.schedules import ScheduleSpec
    from pgqueue.task import Task
    from pgqueue.worker.executor import Dependencies, RunningJob
    from pgqueue.worker.progress import ProgressWriter
    from pgqueue.worker.settings import WorkerSettings


@dataclass(frozen=True, slots=True)
class WorkerApp:
    """What a worker uses of its App, read once when the Worker is made; the
    worker changes nothing in the App (its live task settings, say, are a
    :class:`LiveTaskSettings` of its own)."""

    database: Database
    listen_database: Database  # for the LISTEN connection
    ctx: OpContext
    tasks: Mapping[str, Task[Any, Any]]
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
    def of(cls, app: App) -> WorkerApp:
        return cls(
            database=app.database,
            listen_database=app.listen_database,
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
    connection is up (else the heartbeat polls for cancel requests)."""

    running: dict[int, RunningJob]
    connected: asyncio.Event
    live_settings: LiveTaskSettings
    completer: Completer
    transactions: TaskTransactionSource
    executor: Executor
    heartbeat: Heartbeat

    @classmethod
    def build(
        cls,
        database: Database,
        ctx: OpContext,
        settings: WorkerSettings,
        tasks: Mapping[str, Task[Any, Any]],
        max_result_bytes: int,
        *,
        running: dict[int, RunningJob],
        on_fatal: Callable[[str, BaseException], None],
        stopped: asyncio.Event,
        observer: WorkerObserver = NULL_OBSERVER,
        progress: ProgressWriter | None = None,
        middleware: Sequence[Middleware] = (),
        dependencies: Dependencies | None = None,
    ) -> JobParts:
        """``on_fatal`` is told of an error the completer cannot ride out;
        the heartbeat runs until ``stopped``."""
        connected = asyncio.Event()
        extend_now = asyncio.Event()  # context.extend() wakes the heartbeat
        live_settings = LiveTaskSettings(database)
        completer = Completer(database, ctx, running, on_fatal)
        transactions = TaskTransactionSource(database, ctx, settings.concurrency)
        executor = Executor(
            tasks,
            settings.concurrency,
            completer,
            max_result_bytes,
            running=running,
            worker_id=settings.worker_id,
            transactions=transactions,
            observer=observer,
            progress=progress,
            middleware=middleware,
            dependencies=dependencies,
            live_settings=live_settings.current,
            unknown_task_grace=settings.unknown_task_grace,
            heartbeat_wake=extend_now.set,
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
        return cls(running, connected, live_settings, completer, transactions, executor, heartbeat)
