"""The App: task registry, lifecycle, subscriptions and workers, over every
public operation.

The operations come from two classes: :class:`~pgqueue.app_async.AsyncAppOperations`
(``enqueue_async``, ...), written once, and
:class:`~pgqueue.app_sync.AppOperations` (``enqueue``, ...), generated from it
by ``tools/async_to_sync.py``. Settings and pools are in
:class:`~pgqueue.app_base.AppBase`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pgqueue.app_async import AsyncAppOperations
from pgqueue.app_sync import AppOperations
from pgqueue.errors import InvalidName, InvalidOption
from pgqueue.ops import schedules, workflows
from pgqueue.retry import DEFAULT_BACKOFF, Backoff
from pgqueue.task import Task
from pgqueue.workflow import Workflow

if TYPE_CHECKING:
    from pgqueue.subscribe import AsyncEventStream, EventStream, Hub
    from pgqueue.worker.settings import WorkerSettings

F = TypeVar("F", bound=Callable[..., Any])
TaskT = TypeVar("TaskT", bound=Task[Any, Any])


class App(AppOperations, AsyncAppOperations):
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

    # --- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close the connection pools (they reopen on next use) and end every
        subscription."""
        if self._hub is not None:
            self._hub.close()
        self._database.close()

    async def close_async(self) -> None:
        """Async twin of :meth:`close`."""
        if self._hub is not None:
            await asyncio.to_thread(self._hub.close)
        await self._database.close_async()

    async def close_async_pool(self) -> None:
        """Close only the async pool, which belongs to the event loop now
        ending (it reopens in the next one); the sync pool and the
        subscriptions stay open."""
        await self._database.close_async_pool()

    def point_at(self, dsn: str | None = None, *, schema: str | None = None) -> None:
        """Point this App, in place, at the database ``dsn`` and/or the schema
        ``schema`` (None: keep it). Its tasks, middleware, settings and every
        reference to it stay; its pools and subscriptions close first and
        reopen there on next use, and its LISTEN connections follow a new
        ``dsn``. Not while a worker of this App runs. Django's integration
        uses it to follow Django to its test database."""
        from pgqueue import validation
        from pgqueue.config import resolve_dsn
        from pgqueue.database import Database
        from pgqueue.queries import queries_for

        # Everything is built (and so checked) before anything changes.
        new_schema = self.schema if schema is None else validation.schema_name(schema)
        new_dsn = self.dsn if dsn is None else resolve_dsn(dsn)
        queries = self._queries if new_schema == self.schema else queries_for(new_schema)
        old = self._database
        database = Database(
            new_dsn,
            queries,
            min_size=old.min_size,
            max_size=old.max_size,
            timeout=old.timeout,
            transaction_pooler=old.transaction_pooler,
        )
        listen_dsn = self.listen_dsn if new_dsn == self.dsn else (new_dsn if self.listen else None)
        listen_database = self._make_listen_database(database, new_dsn, listen_dsn)
        self.close()
        self.schema, self.dsn, self._queries = new_schema, new_dsn, queries
        self._database, self.listen_dsn, self._listen_database = (
            database,
            listen_dsn,
            listen_database,
        )
        self._hub = None
        if queries is not self.op_context.queries:
            self.op_context = replace(self.op_context, schema=new_schema, queries=queries)

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

    def grant(
        self,
        role: str,
        kind: str,
        *,
        dry_run: bool = False,
        create: bool = False,
        login: bool = False,
    ) -> list[str]:
        """Give the database role ``role`` what a ``"producer"``, ``"worker"`` or
        ``"admin"`` needs on this schema (same as ``pgqueue grant``; see
        :mod:`pgqueue.grants`). Returns the SQL; ``dry_run=True`` runs none of it.
        ``create``: create the role first when it does not exist (NOLOGIN
        unless ``login``)."""
        from pgqueue.grants import grant

        return grant(
            role,
            kind,
            dsn=self.dsn,
            schema=self.schema,
            dry_run=dry_run,
            create=create,
            login=login,
        )

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

    # --- workflows -------------------------------------------------------------

    def workflow(self, name: str) -> Workflow:
        """A new workflow: ``add`` steps, then ``enqueue()`` them in one statement."""
        return Workflow(self, name)

    def job_dependencies(self, job_id: int) -> tuple[int | None, list[tuple[str, str, Any]]]:
        """A job's workflow id and direct dependencies as (name, status, result)
        (what ``context.dependency_results()`` reads)."""
        return self._database.run(workflows.dependencies(job_id))

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
                self._queries,
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
        from pgqueue.worker.settings import for_app

        return for_app(self.listen_dsn, queues, options)
