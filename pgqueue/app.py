"""The App: task registry, connection pools and every public operation.

Each method and its ``_async`` twin are one line over the same operation in
:mod:`pgqueue.ops`; the sync twin runs on a psycopg ``ConnectionPool``, the
async twin on an ``AsyncConnectionPool``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

import psycopg

from pgqueue import health, validation
from pgqueue._adapters import ConnectionLike, async_connection, sync_connection
from pgqueue.config import resolve_dsn, resolve_listen_dsn, resolve_pooler
from pgqueue.database import Database
from pgqueue.errors import InvalidName, InvalidOption, InvalidPayload
from pgqueue.health import HealthReport, HealthSettings
from pgqueue.middleware import Middleware
from pgqueue.models import (
    ArchiveLayout,
    Enqueued,
    Job,
    JobSpec,
    JobStatus,
    LeasedJob,
    Page,
    QueueMetrics,
    Replayed,
    Schedule,
    TableVacuum,
    TaskInfo,
    TaskSettings,
    TaskStats,
    UnknownTaskJobs,
    WorkerInfo,
)
from pgqueue.ops import (
    DEFAULT_TASK,
    Op,
    OpContext,
    TaskDefaults,
    admin,
    consume,
    enqueue,
    inspect,
    maintenance,
    operator,
    partitions,
    schedules,
    workflows,
)
from pgqueue.ops import health as health_ops
from pgqueue.ops import tasks as task_ops
from pgqueue.payloads import UnstoredResult, encode_result
from pgqueue.queries import queries_for
from pgqueue.retry import DEFAULT_BACKOFF, Backoff
from pgqueue.task import Task
from pgqueue.telemetry import database_view, doctor
from pgqueue.telemetry.database_view import QueueView
from pgqueue.telemetry.doctor import DoctorSettings, Finding
from pgqueue.workflow import Workflow, WorkflowInfo, WorkflowRun

if TYPE_CHECKING:
    from pgqueue.subscribe import AsyncEventStream, EventStream, Hub
    from pgqueue.worker.settings import WorkerSettings

F = TypeVar("F", bound=Callable[..., Any])
TaskT = TypeVar("TaskT", bound=Task[Any, Any])
SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
Age = str | float | timedelta


class App:
    """A pgqueue application: one database, one schema, a registry of tasks.

    ``dsn``: argument, else ``PGQUEUE_DSN``, else ``DATABASE_URL``, else libpq's
    defaults (PGHOST, ...). The DSN's own parameters (``application_name``,
    ...) are kept. Pools open on first use; ``close()`` (or ``with App(...)``)
    releases them. Set ``listen=False`` behind a transaction-mode PgBouncer:
    workers and ``result()`` then poll instead of waiting on LISTEN.

    ``pooler``: ``None`` (a direct connection), ``"session"`` or
    ``"transaction"`` (PgBouncer's pool modes; default ``PGQUEUE_POOLER``).
    Behind a transaction pooler LISTEN cannot work through ``dsn``: workers
    and :meth:`subscribe` LISTEN on ``listen_dsn`` (default
    ``PGQUEUE_LISTEN_DSN``; a direct connection to PostgreSQL) when given,
    else workers poll and :meth:`subscribe` raises ListenUnavailable.
    """

    def __init__(
        self,
        dsn: str | None = None,
        schema: str = "pgqueue",
        *,
        max_payload_bytes: int = 1 << 20,
        max_result_bytes: int = 1 << 20,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        pool_timeout: float = 10.0,
        listen: bool = True,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        clock: Callable[[], datetime | None] | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self.schema = validation.schema_name(schema)
        #: Hooks around task runs and enqueues (see :class:`pgqueue.Middleware`).
        self.middleware: list[Middleware] = []
        for m in middleware:
            self.add_middleware(m)
        self.dsn = resolve_dsn(dsn)
        self.max_payload_bytes = validation.positive_int("max_payload_bytes", max_payload_bytes)
        self.max_result_bytes = validation.positive_int("max_result_bytes", max_result_bytes)
        self.pooler = resolve_pooler(pooler)
        # LISTEN on pooled connections (result()) needs a session of its own.
        self.listen = listen and self.pooler != "transaction"
        explicit_listen_dsn = resolve_listen_dsn(listen_dsn)
        #: Where dedicated LISTEN connections go (worker, subscribe()); None: nowhere.
        self.listen_dsn: str | None = explicit_listen_dsn or (self.dsn if self.listen else None)
        self.tasks: dict[str, Task[Any, Any]] = {}
        # Operators' live task settings, as a worker of this App last read them.
        self.live_task_settings: dict[str, TaskSettings] = {}
        self.periodic_schedules: list[schedules.ScheduleSpec] = []  # from @app.periodic
        self.queries = queries_for(self.schema)
        self.database = Database(
            self.dsn,
            self.queries,
            min_size=validation.positive_int("pool_min_size", pool_min_size)
            if pool_min_size
            else 0,
            max_size=validation.positive_int("pool_max_size", pool_max_size),
            timeout=validation.seconds("pool_timeout", pool_timeout, allow_zero=False),
            transaction_pooler=self.pooler == "transaction",
        )
        #: Dedicated LISTEN connections (the worker's listener) open through this.
        self.listen_database = (
            self.database
            if self.listen_dsn in (None, self.dsn)
            else Database(self.listen_dsn or "", self.queries, min_size=0, max_size=1)
        )
        self._hub: Hub | None = None
        self.op_context = OpContext(
            schema=self.schema,
            queries=self.queries,
            max_payload_bytes=self.max_payload_bytes,
            max_result_bytes=self.max_result_bytes,
            task_defaults=self._task_defaults,
            clock=clock or _no_clock,
            middleware=self.middleware,
        )

    def __repr__(self) -> str:
        return f"<pgqueue.App schema={self.schema!r} tasks={len(self.tasks)}>"

    def add_middleware(self, middleware: Middleware) -> None:
        """Add a middleware inside those already added (the first is outermost)."""
        if not isinstance(middleware, Middleware):
            raise InvalidOption(
                f"middleware must be a pgqueue.Middleware, got {type(middleware).__name__}"
            )
        self.middleware.append(middleware)

    # --- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close the connection pools (they reopen on next use) and end every
        subscription."""
        if self._hub is not None:
            self._hub.close()
        self.database.close()

    async def close_async(self) -> None:
        """Async twin of :meth:`close`."""
        if self._hub is not None:
            await asyncio.to_thread(self._hub.close)
        await self.database.close_async()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    def migrate(self) -> None:
        """Create or upgrade the schema to this version (same as ``pgqueue migrate``)."""
        from pgqueue.migrate import upgrade

        upgrade(self.dsn, self.schema)

    def grant(self, role: str, kind: str, *, dry_run: bool = False) -> list[str]:
        """Give the database role ``role`` what a ``"producer"``, ``"worker"`` or
        ``"admin"`` needs on this schema (same as ``pgqueue grant``; see
        :mod:`pgqueue.grants`). Returns the SQL; ``dry_run=True`` runs none of it."""
        from pgqueue.grants import grant

        return grant(role, kind, dsn=self.dsn, schema=self.schema, dry_run=dry_run)

    # --- tasks ---------------------------------------------------------------

    @overload
    def task(self, func: F, /) -> Task[Any, Any]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Backoff = DEFAULT_BACKOFF,
        lease_seconds: float | str = 60,
        timeout: float | str | timedelta | None = None,
        pass_context: bool = False,
    ) -> Callable[[F], Task[Any, Any]]: ...

    def task(self, func: Any = None, /, **options: Any) -> Any:
        """Register a sync or async function as a task: ``@app.task`` or
        ``@app.task(queue="mail", max_attempts=3, retry=pgqueue.Backoff(base=5))``."""

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            task: Task[Any, Any] = Task(self, f, **options)
            if task.name in self.tasks and self.tasks[task.name].func is not f:
                raise InvalidName(f"a task named {task.name!r} is already registered")
            self.tasks[task.name] = task
            return task

        return register(func) if func is not None else register

    def _task_defaults(self, name: str) -> TaskDefaults:
        task = self.tasks.get(name)
        return task.defaults if task is not None else DEFAULT_TASK

    def periodic(
        self,
        *,
        cron: str,
        name: str | None = None,
        timezone: str = "UTC",
        payload: dict[str, Any] | None = None,
    ) -> Callable[[TaskT], TaskT]:
        """Run a task on a cron schedule; goes above ``@app.task``::

            @app.periodic(cron="0 3 * * *", timezone="Europe/Berlin")
            @app.task(queue="reports")
            def nightly_report() -> None: ...

        Each worker running the scheduler creates or updates the schedule
        (named after the task unless ``name`` is given) when it starts. A bad
        cron expression or time zone raises here, at import time."""

        def register(task: TaskT) -> TaskT:
            if not isinstance(task, Task) or task.app is not self:
                raise InvalidOption("@app.periodic goes above @app.task(...) of the same App")
            spec = schedules.ScheduleSpec.build(
                self.op_context, name or task.name, cron, task.name, payload, timezone=timezone
            )
            if any(s.name == spec.name for s in self.periodic_schedules):
                raise InvalidName(f"a periodic schedule named {spec.name!r} is already declared")
            self.periodic_schedules.append(spec)
            return task

        return register

    # --- enqueue -------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        delay: float | str | timedelta | None = None,
        max_attempts: int | None = None,
        dedup_key: str | None = None,
        serial_key: str | None = None,
        conn: ConnectionLike | None = None,
        dedup_window: float | timedelta | None = None,
        debounce: float | timedelta | None = None,
        tags: Sequence[str] | None = None,
        meta: dict[str, Any] | None = None,
        depends_on: Sequence[int] | None = None,
        allow_failed: bool = False,
    ) -> Enqueued:
        """Enqueue one job by task name (the task need not be registered here);
        in ``conn``'s transaction when given (a psycopg connection, a SQLAlchemy
        Connection/Session, or Django's connection). ``dedup_window``: no new
        job if one with this dedup_key was created within that many seconds;
        ``debounce``: postpone and update the queued job holding the key.
        ``tags`` (up to 16 labels) and ``meta`` (a JSON object up to 8 KiB)
        are stored with the job. ``depends_on``: ids of jobs this one waits for
        (status ``waiting``) until they succeeded; with ``allow_failed`` until
        they ended, whatever their end."""
        spec = JobSpec(
            task,
            payload,
            queue,
            priority,
            run_at,
            delay,
            max_attempts,
            dedup_key,
            serial_key,
            dedup_window,
            debounce,
            tags,
            meta,
            depends_on,
            allow_failed,
        )
        return self.database.run(enqueue.enqueue_one(self.op_context, spec), sync_connection(conn))

    async def enqueue_async(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        delay: float | str | timedelta | None = None,
        max_attempts: int | None = None,
        dedup_key: str | None = None,
        serial_key: str | None = None,
        conn: ConnectionLike | None = None,
        dedup_window: float | timedelta | None = None,
        debounce: float | timedelta | None = None,
        tags: Sequence[str] | None = None,
        meta: dict[str, Any] | None = None,
        depends_on: Sequence[int] | None = None,
        allow_failed: bool = False,
    ) -> Enqueued:
        """Async twin of :meth:`enqueue` (``conn``: an async connection or session)."""
        spec = JobSpec(
            task,
            payload,
            queue,
            priority,
            run_at,
            delay,
            max_attempts,
            dedup_key,
            serial_key,
            dedup_window,
            debounce,
            tags,
            meta,
            depends_on,
            allow_failed,
        )
        return await self.database.run_async(
            enqueue.enqueue_one(self.op_context, spec), await async_connection(conn)
        )

    def enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: ConnectionLike | None = None
    ) -> list[Enqueued]:
        """Enqueue many jobs in one statement and one transaction (all or
        nothing); dedup hits return the live job's id, in input order."""
        return self.database.run(
            enqueue.enqueue_many(self.op_context, specs), sync_connection(conn)
        )

    async def enqueue_many_async(
        self, specs: Sequence[JobSpec], *, conn: ConnectionLike | None = None
    ) -> list[Enqueued]:
        """Async twin of :meth:`enqueue_many`."""
        return await self.database.run_async(
            enqueue.enqueue_many(self.op_context, specs), await async_connection(conn)
        )

    # --- low-level consumer API ----------------------------------------------


    # --- workflows -------------------------------------------------------------

    def workflow(self, name: str) -> Workflow:
        """A new workflow: ``add`` steps, then ``enqueue()`` them in one statement."""
        return Workflow(self, name)

    def enqueue_workflow(
        self, workflow: Workflow, *, conn: ConnectionLike | None = None
    ) -> WorkflowRun:
        """Write ``workflow``'s steps (what :meth:`Workflow.enqueue` calls)."""
        return self.database.run(
            workflows.enqueue_workflow(self.op_context, workflow), sync_connection(conn)
        )

    async def enqueue_workflow_async(
        self, workflow: Workflow, *, conn: ConnectionLike | None = None
    ) -> WorkflowRun:
        """Async twin of :meth:`enqueue_workflow`."""
        return await self.database.run_async(
            workflows.enqueue_workflow(self.op_context, workflow), await async_connection(conn)
        )

    def job_dependencies(self, job_id: int) -> tuple[int | None, list[tuple[str, str, Any]]]:
        """A job's workflow id and direct dependencies as (name, status, result)
        (what ``context.dependency_results()`` reads)."""
        return self.database.run(workflows.dependencies(job_id))

    def get_workflow(self, workflow_id: int) -> WorkflowInfo:
        """A workflow with each step's job and what it waits for."""
        return self.database.run(workflows.get_workflow(workflow_id))

    async def get_workflow_async(self, workflow_id: int) -> WorkflowInfo:
        """Async twin of :meth:`get_workflow`."""
        return await self.database.run_async(workflows.get_workflow(workflow_id))

    def cancel_workflow(self, workflow_id: int) -> int:
        """Cancel the workflow's live steps (running ones are asked to stop);
        returns how many were cancelled or asked to stop."""
        return self.database.run(workflows.cancel_workflow(workflow_id))

    async def cancel_workflow_async(self, workflow_id: int) -> int:
        """Async twin of :meth:`cancel_workflow`."""
        return await self.database.run_async(workflows.cancel_workflow(workflow_id))

    def list_workflows(self, status: str | None = None, limit: int = 50) -> list[WorkflowInfo]:
        """Workflows, newest first (``status``: running, succeeded or failed)."""
        return self.database.run(workflows.list_workflows(status, limit))

    async def list_workflows_async(
        self, status: str | None = None, limit: int = 50
    ) -> list[WorkflowInfo]:
        """Async twin of :meth:`list_workflows`."""
        return await self.database.run_async(workflows.list_workflows(status, limit))

    def lease(
        self,
        queue: str | Sequence[str] | None,
        worker_id: str,
        max: int = 1,
        lease_seconds: float | None = None,
    ) -> list[LeasedJob]:
        """Lease up to ``max`` ready jobs of ``queue`` (a name, names, or None
        for every queue) in DESIGN order; ``lease_seconds`` overrides the jobs' own."""
        return self.database.run(
            consume.lease(self.op_context, queue, worker_id, max, lease_seconds)
        )

    async def lease_async(
        self,
        queue: str | Sequence[str] | None,
        worker_id: str,
        max: int = 1,
        lease_seconds: float | None = None,
    ) -> list[LeasedJob]:
        """Async twin of :meth:`lease`."""
        return await self.database.run_async(
            consume.lease(self.op_context, queue, worker_id, max, lease_seconds)
        )

    def ack(self, leased: LeasedJob, result: Any = None) -> None:
        """Mark a leased job succeeded, storing ``result`` (JSON, with the
        encoding of :func:`pgqueue.payloads.encode_result`). Raises LeaseLost,
        changing nothing, when this lease is no longer valid, and
        InvalidPayload, changing nothing, for a result that cannot be stored."""
        value = _storable_result(result, self.max_result_bytes)
        self.database.run(consume.ack_many(self.op_context, [leased], [value]))

    async def ack_async(self, leased: LeasedJob, result: Any = None) -> None:
        """Async twin of :meth:`ack`."""
        value = _storable_result(result, self.max_result_bytes)
        await self.database.run_async(consume.ack_many(self.op_context, [leased], [value]))

    def ack_many(self, leased: Sequence[LeasedJob]) -> None:
        """Ack many jobs in one statement; LeaseLost names any that were stale
        (the others are acked)."""
        self.database.run(consume.ack_many(self.op_context, leased))

    async def ack_many_async(self, leased: Sequence[LeasedJob]) -> None:
        """Async twin of :meth:`ack_many`."""
        await self.database.run_async(consume.ack_many(self.op_context, leased))

    def fail(
        self,
        leased: LeasedJob,
        error: BaseException | str,
        retry_at: datetime | None = None,
        permanent: bool = False,
    ) -> JobStatus:
        """Record a failed attempt: retry at ``retry_at`` or after the job's
        backoff, or dead-letter when ``permanent`` or out of attempts. Returns
        the job's new status; raises LeaseLost for a stale lease."""
        return JobStatus(
            self.database.run(consume.fail(self.op_context, leased, error, retry_at, permanent))
        )

    async def fail_async(
        self,
        leased: LeasedJob,
        error: BaseException | str,
        retry_at: datetime | None = None,
        permanent: bool = False,
    ) -> JobStatus:
        """Async twin of :meth:`fail`."""
        return JobStatus(
            await self.database.run_async(
                consume.fail(self.op_context, leased, error, retry_at, permanent)
            )
        )

    def nack(self, leased: LeasedJob) -> None:
        """Hand a leased job back to its queue now, unrun (the attempt is
        recorded as ``released`` and does not count)."""
        self.database.run(consume.nack_many(self.op_context, [leased]))

    async def nack_async(self, leased: LeasedJob) -> None:
        """Async twin of :meth:`nack`."""
        await self.database.run_async(consume.nack_many(self.op_context, [leased]))

    def extend(self, leased: LeasedJob, seconds: float) -> bool:
        """Extend the lease to now + ``seconds``; False when the lease is lost."""
        return self.database.run(consume.extend(self.op_context, leased, seconds))

    async def extend_async(self, leased: LeasedJob, seconds: float) -> bool:
        """Async twin of :meth:`extend`."""
        return await self.database.run_async(consume.extend(self.op_context, leased, seconds))

    # --- inspection ------------------------------------------------------------

    def get_job(self, job_id: int, history: bool = False) -> Job:
        """A job by id (live or archived); ``history=True`` loads every attempt."""
        return self.database.run(inspect.get_job(job_id, history))

    async def get_job_async(self, job_id: int, history: bool = False) -> Job:
        """Async twin of :meth:`get_job`."""
        return await self.database.run_async(inspect.get_job(job_id, history))

    def list_jobs(
        self,
        queue: str | None = None,
        status: str | JobStatus | None = None,
        task: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        *,
        tags: Sequence[str] | None = None,
    ) -> Page:
        """A page of jobs, newest first; pass ``page.next_cursor`` for the next one.
        ``tags``: only jobs having every one of them."""
        return self.database.run(inspect.list_jobs(queue, status, task, limit, cursor, tags))

    async def list_jobs_async(
        self,
        queue: str | None = None,
        status: str | JobStatus | None = None,
        task: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        *,
        tags: Sequence[str] | None = None,
    ) -> Page:
        """Async twin of :meth:`list_jobs`."""
        return await self.database.run_async(
            inspect.list_jobs(queue, status, task, limit, cursor, tags)
        )

    def metrics(self, queue: str | None = None) -> dict[str, QueueMetrics]:
        """Counts per queue: queued, scheduled, running, succeeded (last hour),
        dead, cancelled, oldest ready age, paused."""
        return self.database.run(inspect.metrics(queue))

    async def metrics_async(self, queue: str | None = None) -> dict[str, QueueMetrics]:
        """Async twin of :meth:`metrics`."""
        return await self.database.run_async(inspect.metrics(queue))

    def explain(self, job_id: int) -> str:
        """Why a job is where it is, in plain words."""
        return self.database.run(inspect.explain(job_id))

    async def explain_async(self, job_id: int) -> str:
        """Async twin of :meth:`explain`."""
        return await self.database.run_async(inspect.explain(job_id))

    def result(self, job_id: int, timeout: float | None = None) -> Any:
        """The job's stored return value, waiting (via NOTIFY, or polling when
        the App has ``listen=False``) until it finishes; no pooled connection
        is held while waiting. Raises JobFailed (dead), JobCancelled,
        ResultTimeout, or ResultNotStored (it succeeded, but its return value
        could not be stored)."""
        return self.database.run_released(self._result_op(job_id, timeout))

    async def result_async(self, job_id: int, timeout: float | None = None) -> Any:
        """Async twin of :meth:`result`."""
        return await self.database.run_released_async(self._result_op(job_id, timeout))

    def _result_op(self, job_id: int, timeout: float | None) -> Op[Any]:
        # Waits hold no pooled connection; with listen=True on one LISTEN
        # connection of their own (see Database.run_released).
        poll = 1.0 if self.listen else 0.2
        return inspect.result(job_id, timeout, poll, listen=self.listen)

    # --- administration ----------------------------------------------------------

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a job: queued or scheduled ones end ``cancelled`` now (returns
        cancelled); a running one is asked to stop and ends cancelled when its
        attempt ends (returns running). Cancelling a finished job is an error."""
        return self.database.run(admin.cancel(job_id))

    async def cancel_async(self, job_id: int) -> JobStatus:
        """Async twin of :meth:`cancel`."""
        return await self.database.run_async(admin.cancel(job_id))

    def cancel_many(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        statuses: Sequence[str] = ("queued", "scheduled"),
        limit: int = 1000,
    ) -> list[int]:
        """Cancel up to ``limit`` live jobs in one short statement, chosen by
        ``job_ids`` and/or the filters (``statuses``: queued, scheduled,
        running; running ones are asked to stop); returns the ids. Call again
        until it returns fewer than ``limit``."""
        params = operator.cancel_params(job_ids, queue, task, statuses, limit)
        return [r[0] for r in self.database.run(operator.cancel_batch(params))]

    async def cancel_many_async(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        statuses: Sequence[str] = ("queued", "scheduled"),
        limit: int = 1000,
    ) -> list[int]:
        """Async twin of :meth:`cancel_many`."""
        params = operator.cancel_params(job_ids, queue, task, statuses, limit)
        return [r[0] for r in await self.database.run_async(operator.cancel_batch(params))]

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and its settings (pause, limits); refused with
        InvalidJobState while it holds live or dead jobs."""
        self.database.run(operator.delete_queue(queue))

    async def delete_queue_async(self, queue: str) -> None:
        """Async twin of :meth:`delete_queue`."""
        await self.database.run_async(operator.delete_queue(queue))

    def replay(
        self, job_id: int, queue: str | None = None, run_at: datetime | None = None
    ) -> Replayed:
        """Enqueue a copy of any job (e.g. a succeeded or dead one); returns
        the new id as a :class:`Replayed` (an int with ``job_id`` and
        ``replayed_from``, the fields of ``pgqueue jobs replay --json``).
        An admin action: a producer or worker role gets PermissionDenied."""
        op = admin.replay(job_id, queue, run_at, schema=self.schema)
        return Replayed(self.database.run(op), job_id)

    async def replay_async(
        self, job_id: int, queue: str | None = None, run_at: datetime | None = None
    ) -> Replayed:
        """Async twin of :meth:`replay`."""
        op = admin.replay(job_id, queue, run_at, schema=self.schema)
        return Replayed(await self.database.run_async(op), job_id)

    def requeue_dead(self, job_id: int) -> None:
        """Put a dead job back in its queue (with one more attempt if needed)."""
        self.database.run(admin.requeue_dead(job_id))

    async def requeue_dead_async(self, job_id: int) -> None:
        """Async twin of :meth:`requeue_dead`."""
        await self.database.run_async(admin.requeue_dead(job_id))

    def requeue_dead_many(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 1000,
    ) -> list[int]:
        """Requeue up to ``limit`` dead jobs in one short statement, chosen by
        ``job_ids`` or else by the queue/task filters; returns the ids requeued.
        Call again until it returns fewer than ``limit``. Jobs whose dedup key
        is live again are skipped."""
        return self.database.run(admin.requeue_dead_batch(job_ids, queue, task, limit))

    async def requeue_dead_many_async(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 1000,
    ) -> list[int]:
        """Async twin of :meth:`requeue_dead_many`."""
        return await self.database.run_async(admin.requeue_dead_batch(job_ids, queue, task, limit))

    def count_dead(self, queue: str | None = None, task: str | None = None) -> int:
        """How many dead jobs match the filters."""
        return self.database.run(admin.count_dead(queue, task))

    async def count_dead_async(self, queue: str | None = None, task: str | None = None) -> int:
        """Async twin of :meth:`count_dead`."""
        return await self.database.run_async(admin.count_dead(queue, task))

    def pause_queue(self, queue: str) -> None:
        """Stop every worker from leasing jobs of ``queue`` (enqueue still works)."""
        self.database.run(admin.set_paused(queue, True))

    async def pause_queue_async(self, queue: str) -> None:
        """Async twin of :meth:`pause_queue`."""
        await self.database.run_async(admin.set_paused(queue, True))

    def resume_queue(self, queue: str) -> None:
        """Let workers lease jobs of ``queue`` again."""
        self.database.run(admin.set_paused(queue, False))

    async def resume_queue_async(self, queue: str) -> None:
        """Async twin of :meth:`resume_queue`."""
        await self.database.run_async(admin.set_paused(queue, False))

    def set_queue_limit(
        self, queue: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit ``queue`` across all workers: at most ``concurrency`` jobs
        running, at most ``rate`` (e.g. ``"100/1m"``) lease starts per sliding
        window. None lifts that limit."""
        self.database.run(admin.set_limits(queue, concurrency, rate))

    async def set_queue_limit_async(
        self, queue: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Async twin of :meth:`set_queue_limit`."""
        await self.database.run_async(admin.set_limits(queue, concurrency, rate))

    # --- schedules ---------------------------------------------------------------

    def add_schedule(
        self,
        name: str,
        cron: str,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        timezone: str = "UTC",
        priority: int | None = None,
        max_attempts: int | None = None,
        enabled: bool = True,
        replace: bool = True,
    ) -> Schedule:
        """Create or update the cron schedule ``name`` (``replace=False``: raise
        DuplicateSchedule instead of updating). ``cron`` has 5 fields, or 6 with
        seconds last (croniter's order); fire times follow ``timezone``'s DST.
        ``queue``, ``priority`` and ``max_attempts`` left None take the task's
        defaults when the job is enqueued. Each job's run_at is its fire time."""
        return self.database.run(
            schedules.add_schedule(
                self.op_context,
                name,
                cron,
                task,
                payload,
                queue=queue,
                timezone=timezone,
                priority=priority,
                max_attempts=max_attempts,
                enabled=enabled,
                replace=replace,
            )
        )

    async def add_schedule_async(
        self,
        name: str,
        cron: str,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        timezone: str = "UTC",
        priority: int | None = None,
        max_attempts: int | None = None,
        enabled: bool = True,
        replace: bool = True,
    ) -> Schedule:
        """Async twin of :meth:`add_schedule`."""
        return await self.database.run_async(
            schedules.add_schedule(
                self.op_context,
                name,
                cron,
                task,
                payload,
                queue=queue,
                timezone=timezone,
                priority=priority,
                max_attempts=max_attempts,
                enabled=enabled,
                replace=replace,
            )
        )

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self.database.run(schedules.list_schedules())

    async def list_schedules_async(self) -> list[Schedule]:
        """Async twin of :meth:`list_schedules`."""
        return await self.database.run_async(schedules.list_schedules())

    def get_schedule(self, name: str) -> Schedule:
        """One schedule by name; raises ScheduleNotFound."""
        return self.database.run(schedules.get_schedule(name))

    async def get_schedule_async(self, name: str) -> Schedule:
        """Async twin of :meth:`get_schedule`."""
        return await self.database.run_async(schedules.get_schedule(name))

    def enable_schedule(self, name: str) -> Schedule:
        """Enable a schedule; it next fires at its first slot after now."""
        return self.database.run(schedules.enable_schedule(self.op_context, name))

    async def enable_schedule_async(self, name: str) -> Schedule:
        """Async twin of :meth:`enable_schedule`."""
        return await self.database.run_async(schedules.enable_schedule(self.op_context, name))

    def disable_schedule(self, name: str) -> Schedule:
        """Disable a schedule: it does not fire (nor catch up) until enabled."""
        return self.database.run(schedules.disable_schedule(name))

    async def disable_schedule_async(self, name: str) -> Schedule:
        """Async twin of :meth:`disable_schedule`."""
        return await self.database.run_async(schedules.disable_schedule(name))

    def remove_schedule(self, name: str) -> None:
        """Delete a schedule; the jobs it already enqueued stay."""
        self.database.run(schedules.remove_schedule(name))

    async def remove_schedule_async(self, name: str) -> None:
        """Async twin of :meth:`remove_schedule`."""
        await self.database.run_async(schedules.remove_schedule(name))

    def run_schedule_now(self, name: str) -> Enqueued:
        """Enqueue one job of the schedule now (its fire times do not change)."""
        return self.database.run(schedules.run_schedule_now(self.op_context, name))

    async def run_schedule_now_async(self, name: str) -> Enqueued:
        """Async twin of :meth:`run_schedule_now`."""
        return await self.database.run_async(schedules.run_schedule_now(self.op_context, name))

    # --- maintenance -----------------------------------------------------------

    def reap(self) -> int:
        """Reclaim jobs whose lease expired (as workers do periodically); returns how many."""
        return self.database.run(maintenance.reap(self.op_context))

    async def reap_async(self) -> int:
        """Async twin of :meth:`reap`."""
        return await self.database.run_async(maintenance.reap(self.op_context))

    def archive(
        self,
        older_than: Age,
        limit: int | None = None,
        statuses: Sequence[str] = ("succeeded",),
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Move finished jobs older than ``older_than`` (``"7d"``, seconds, a
        timedelta) to the archive table in short batches; returns how many."""
        return self.database.run(
            maintenance.archive(self.op_context, older_than, limit, statuses, batch_size, progress)
        )

    async def archive_async(
        self,
        older_than: Age,
        limit: int | None = None,
        statuses: Sequence[str] = ("succeeded",),
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Async twin of :meth:`archive`."""
        return await self.database.run_async(
            maintenance.archive(self.op_context, older_than, limit, statuses, batch_size, progress)
        )

    def prune(
        self,
        older_than: Age,
        limit: int | None = None,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, int]:
        """Delete attempt history and archived jobs finished before the cutoff;
        returns ``{"attempts": n, "archived_jobs": m}``."""
        return self.database.run(
            maintenance.prune(self.op_context, older_than, limit, batch_size, progress)
        )

    async def prune_async(
        self,
        older_than: Age,
        limit: int | None = None,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, int]:
        """Async twin of :meth:`prune`."""
        return await self.database.run_async(
            maintenance.prune(self.op_context, older_than, limit, batch_size, progress)
        )

    def archive_count(self, older_than: Age, statuses: Sequence[str] = ("succeeded",)) -> int:
        """How many jobs :meth:`archive` with these arguments would move now."""
        return self.database.run(maintenance.archive_count(self.op_context, older_than, statuses))

    async def archive_count_async(
        self, older_than: Age, statuses: Sequence[str] = ("succeeded",)
    ) -> int:
        """Async twin of :meth:`archive_count`."""
        return await self.database.run_async(
            maintenance.archive_count(self.op_context, older_than, statuses)
        )

    def prune_count(self, older_than: Age) -> int:
        """How many rows (attempts plus archived jobs) :meth:`prune` would delete now."""
        return self.database.run(maintenance.prune_count(self.op_context, older_than))

    async def prune_count_async(self, older_than: Age) -> int:
        """Async twin of :meth:`prune_count`."""
        return await self.database.run_async(maintenance.prune_count(self.op_context, older_than))

    def vacuum(self) -> list[TableVacuum]:
        """VACUUM (ANALYZE) the queue tables; returns each table's dead tuples
        before and after. Runs on a dedicated autocommit connection, since
        VACUUM refuses a transaction block and may hold a connection for long."""
        with self.database.connect() as conn:
            return self.database.run(maintenance.vacuum(self.schema), conn)

    async def vacuum_async(self) -> list[TableVacuum]:
        """Async twin of :meth:`vacuum`."""
        async with await self.database.connect_async() as conn:
            return await self.database.run_async(maintenance.vacuum(self.schema), conn)

    def partition_archive(self, period: str = "day") -> ArchiveLayout:
        """Range-partition the archive by finish time, one partition per
        ``period`` (``"day"``, ``"week"`` or ``"month"``), online: reads and
        archive runs go on. ``prune`` then drops whole partitions instead of
        deleting rows. A no-op when already partitioned by that period. Runs
        as the schema's owner (or ``pgqueue grant --admin``), on a dedicated
        autocommit connection (one step builds an index CONCURRENTLY)."""
        with self.database.connect() as conn:
            layout, _ = self.database.run(partitions.partition_archive(period), conn)
        return layout

    async def partition_archive_async(self, period: str = "day") -> ArchiveLayout:
        """Async twin of :meth:`partition_archive`."""
        async with await self.database.connect_async() as conn:
            layout, _ = await self.database.run_async(partitions.partition_archive(period), conn)
        return layout

    def archive_layout(self) -> ArchiveLayout:
        """Whether the archive is partitioned, by which period, in how many partitions."""
        return self.database.run(partitions.layout())

    async def archive_layout_async(self) -> ArchiveLayout:
        """Async twin of :meth:`archive_layout`."""
        return await self.database.run_async(partitions.layout())

    def check(
        self, max_ready_age: Age = 300, worker_timeout: Age = 60, max_clock_skew: Age = 5
    ) -> HealthReport:
        """Check connectivity, clock skew, schema revision, stuck jobs (running
        with an expired lease), dead workers (no heartbeat for ``worker_timeout``)
        and queues whose oldest ready job waited over ``max_ready_age``.
        ``report.ok`` is the verdict; an unreachable database or unmigrated
        schema is a failed check in the report, not an exception."""
        settings = HealthSettings.build(max_ready_age, worker_timeout, max_clock_skew)
        return health.run(self.database, health_ops.check(self.op_context, settings))

    async def check_async(
        self, max_ready_age: Age = 300, worker_timeout: Age = 60, max_clock_skew: Age = 5
    ) -> HealthReport:
        """Async twin of :meth:`check`."""
        settings = HealthSettings.build(max_ready_age, worker_timeout, max_clock_skew)
        return await health.run_async(self.database, health_ops.check(self.op_context, settings))

    # --- task registry, settings, limits, statistics, workers -----------------

    def set_task_options(
        self,
        task: str,
        *,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        lease_seconds: float | None = None,
        priority: int | None = None,
        retry: Backoff | None = None,
        unset: Sequence[str] = (),
    ) -> None:
        """Override a task's settings in the database, for every worker from
        its next lease (no restart): ``max_attempts`` (0: unlimited),
        ``timeout``, ``lease_seconds``, ``priority`` (for jobs enqueued
        without one) and ``retry``. None leaves a field as it is; name fields
        in ``unset`` to go back to the code's defaults."""
        self.database.run(task_ops.set_options(task, _options(locals()), unset))

    async def set_task_options_async(
        self,
        task: str,
        *,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        lease_seconds: float | None = None,
        priority: int | None = None,
        retry: Backoff | None = None,
        unset: Sequence[str] = (),
    ) -> None:
        """Async twin of :meth:`set_task_options`."""
        await self.database.run_async(task_ops.set_options(task, _options(locals()), unset))

    def set_task_limit(
        self, task: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit how many jobs of ``task`` run at once across all workers and
        how many start per period (``rate="100/1m"``); None lifts a limit.
        Other tasks of the same queue are not held back."""
        self.database.run(task_ops.set_limit(task, concurrency, rate))

    async def set_task_limit_async(
        self, task: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Async twin of :meth:`set_task_limit`."""
        await self.database.run_async(task_ops.set_limit(task, concurrency, rate))

    def get_task(self, name: str) -> TaskInfo:
        """A task as the database knows it (published defaults, settings,
        live workers); raises TaskNotFound."""
        return self.database.run(task_ops.get_task(name))

    async def get_task_async(self, name: str) -> TaskInfo:
        """Async twin of :meth:`get_task`."""
        return await self.database.run_async(task_ops.get_task(name))

    def list_tasks(self) -> list[TaskInfo]:
        """Every task published by a worker or with settings."""
        return self.database.run(task_ops.list_tasks())

    async def list_tasks_async(self) -> list[TaskInfo]:
        """Async twin of :meth:`list_tasks`."""
        return await self.database.run_async(task_ops.list_tasks())

    def task_stats(
        self,
        task: str | None = None,
        since: datetime | timedelta | str | float | None = None,
        *,
        sample: int | None = None,
    ) -> dict[str, TaskStats]:
        """Run statistics per task for jobs and attempts finished since
        ``since`` (a datetime, or an age such as ``"1h"``; default 24 h).
        ``sample``: when more jobs than that finished in the window, start it
        at the finish of the ``sample``-th newest instead (bounded cost on a
        busy system; each TaskStats' ``window_start`` says where it began)."""
        return self.database.run(task_ops.task_stats(task, since, sample=sample))

    async def task_stats_async(
        self,
        task: str | None = None,
        since: datetime | timedelta | str | float | None = None,
        *,
        sample: int | None = None,
    ) -> dict[str, TaskStats]:
        """Async twin of :meth:`task_stats`."""
        return await self.database.run_async(task_ops.task_stats(task, since, sample=sample))

    def unknown_tasks(self) -> list[UnknownTaskJobs]:
        """Tasks of waiting jobs that no live worker knows (status, doctor)."""
        return self.database.run(task_ops.unknown_tasks())

    async def unknown_tasks_async(self) -> list[UnknownTaskJobs]:
        """Async twin of :meth:`unknown_tasks`."""
        return await self.database.run_async(task_ops.unknown_tasks())

    def list_workers(self) -> list[WorkerInfo]:
        """Registered workers with their state: alive, stale or lost."""
        return self.database.run(task_ops.list_workers())

    async def list_workers_async(self) -> list[WorkerInfo]:
        """Async twin of :meth:`list_workers`."""
        return await self.database.run_async(task_ops.list_workers())

    def forget_worker(self, worker_id: str, force: bool = False) -> bool:
        """Remove a worker's registration (refused, False, while it is alive
        unless ``force``); its jobs are left to the reaper."""
        return self.database.run(task_ops.forget_worker(worker_id, force))

    async def forget_worker_async(self, worker_id: str, force: bool = False) -> bool:
        """Async twin of :meth:`forget_worker`."""
        return await self.database.run_async(task_ops.forget_worker(worker_id, force))

    # --- telemetry: database view, doctor -------------------------------------------

    def queue_view(self, cap: int = database_view.DEFAULT_CAP) -> QueueView:
        """Jobs per queue and status (exact up to ``cap``, estimated beyond),
        oldest ready age, paused, live workers: the data of ``pgqueue metrics``."""
        return self.database.run(database_view.collect(self.op_context, cap))

    async def queue_view_async(self, cap: int = database_view.DEFAULT_CAP) -> QueueView:
        """Async twin of :meth:`queue_view`."""
        return await self.database.run_async(database_view.collect(self.op_context, cap))

    def metrics_text(self, cap: int = database_view.DEFAULT_CAP) -> str:
        """:meth:`queue_view` as Prometheus text: ``pgqueue_queue_jobs{queue,status}``,
        ``pgqueue_queue_oldest_ready_age_seconds{queue}``, ``pgqueue_queue_paused{queue}``,
        ``pgqueue_workers_alive`` (serve it at ``/metrics``)."""
        return self.queue_view(cap).prometheus_text()

    async def metrics_text_async(self, cap: int = database_view.DEFAULT_CAP) -> str:
        """Async twin of :meth:`metrics_text`."""
        return (await self.queue_view_async(cap)).prometheus_text()

    def doctor(self, **thresholds: Any) -> list[Finding]:
        """Diagnose the database (see :mod:`pgqueue.telemetry.doctor`): one
        :class:`Finding` per check with severity, evidence and fix. Thresholds
        (durations like ``"5m"`` or seconds): ``max_transaction_age``,
        ``error_transaction_age``, ``worker_timeout``, ``max_ready_age``,
        ``max_clock_skew``, ``archive_after``; counts: ``dead_tuples_min``,
        ``archive_backlog``; ``notify_queue_warn`` (0-1). Never raises for
        what it finds (an unreachable database is an error finding)."""
        return doctor.run(self.database, self.op_context, self._doctor_settings(thresholds))

    async def doctor_async(self, **thresholds: Any) -> list[Finding]:
        """Async twin of :meth:`doctor`."""
        return await doctor.run_async(
            self.database, self.op_context, self._doctor_settings(thresholds)
        )

    def _doctor_settings(self, thresholds: dict[str, Any]) -> DoctorSettings:
        declared = not self.listen or getattr(self, "pooler", None) == "transaction"
        known = set(DoctorSettings.__dataclass_fields__) - {"pooler_declared"}
        if unknown := set(thresholds) - known:
            raise InvalidOption(f"unknown doctor threshold(s): {', '.join(sorted(unknown))}")
        return DoctorSettings.build(pooler_declared=declared, **thresholds)

    # --- event stream -------------------------------------------------------------

    def subscribe(
        self, queues: str | Sequence[str] | None = None, *, buffer: int = 1000
    ) -> EventStream:
        """Stream :class:`pgqueue.JobEvent` hints from LISTEN/NOTIFY::

            with app.subscribe(queues=["mail"]) as events:
                for ev in events:          # or events.get(timeout=5)
                    ...                    # re-read the state ev points at

        ``queues``: only events of these queues (None: all; ``resync`` always
        comes). All subscriptions of an App share one LISTEN connection. A
        consumer that falls ``buffer`` events behind gets one ``resync``
        instead of the backlog. Raises ListenUnavailable behind a
        transaction-mode pooler without ``listen_dsn``."""
        from pgqueue.subscribe import EventStream, buffer_size, queue_filter

        return EventStream(self._event_hub(), queue_filter(queues), buffer_size(buffer))

    def subscribe_async(
        self, queues: str | Sequence[str] | None = None, *, buffer: int = 1000
    ) -> AsyncEventStream:
        """Async twin of :meth:`subscribe`: ``async with app.subscribe_async() as
        events: async for ev in events: ...`` (or ``await events.get(timeout=5)``)."""
        from pgqueue.subscribe import AsyncEventStream, buffer_size, queue_filter

        return AsyncEventStream(self._event_hub(), queue_filter(queues), buffer_size(buffer))

    def _event_hub(self) -> Hub:
        from pgqueue.subscribe import Hub

        if self._hub is None:
            self._hub = Hub(
                self.listen_dsn,
                self.queries,
                self.listen_database.translate,
                "cannot LISTEN: "
                + (
                    "a transaction-mode pooler (pooler='transaction') does not keep "
                    "LISTEN; pass listen_dsn= (or set PGQUEUE_LISTEN_DSN) to a direct "
                    "connection to PostgreSQL"
                    if self.pooler == "transaction"
                    else "this App was created with listen=False; pass listen_dsn= to stream events"
                ),
            )
        return self._hub

    # --- worker -----------------------------------------------------------------

    def run_worker(self, queues: Sequence[str] | None = None, **options: Any) -> None:
        """Run a worker in this process until SIGTERM/SIGINT (see
        :class:`pgqueue.worker.settings.WorkerSettings` for the options)."""
        from pgqueue.worker.runner import run_worker

        run_worker(self, self._worker_settings(queues, options))

    async def run_worker_async(
        self,
        queues: Sequence[str] | None = None,
        *,
        stop: asyncio.Event | None = None,
        **options: Any,
    ) -> None:
        """Run a worker on the current event loop; returns after a graceful
        stop once ``stop`` is set."""
        from pgqueue.worker.runner import run_worker_async

        await run_worker_async(self, self._worker_settings(queues, options), stop)

    def _worker_settings(
        self, queues: Sequence[str] | None, options: dict[str, Any]
    ) -> WorkerSettings:
        from pgqueue.worker.settings import WorkerSettings

        # No LISTEN connection possible (listen=False, or a transaction pooler
        # without listen_dsn): the worker polls.
        requested = options.pop("listen", True)
        listen = self.listen_dsn is not None and requested
        return WorkerSettings.build(queues=queues, listen=listen, **options)


def _no_clock() -> datetime | None:
    return None


def _options(args: dict[str, Any]) -> dict[str, Any]:
    """The task options among a set_task_options call's arguments."""
    return {k: args[k] for k in task_ops.OPTION_FIELDS}


def _storable_result(result: Any, max_bytes: int) -> str | None:
    value = encode_result(result, max_bytes)
    if isinstance(value, UnstoredResult):
        raise InvalidPayload(f"cannot store the result: {value}")
    return value
