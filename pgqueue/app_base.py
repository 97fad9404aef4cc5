"""What both halves of :class:`pgqueue.App` share: its settings, connection
pools and the helpers of its operations (:mod:`pgqueue.app_async` and the
generated :mod:`pgqueue.app_sync`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgqueue import validation
from pgqueue.config import resolve_dsn, resolve_listen_dsn, resolve_pooler
from pgqueue.database import Database
from pgqueue.errors import InvalidOption, InvalidPayload
from pgqueue.middleware import Middleware
from pgqueue.ops import DEFAULT_TASK, Op, OpContext, TaskDefaults, inspect, schedules
from pgqueue.ops import tasks as task_ops
from pgqueue.payloads import UnstoredResult, encode_result
from pgqueue.queries import Queries, queries_for
from pgqueue.telemetry.doctor import DoctorSettings

if TYPE_CHECKING:
    from pgqueue.subscribe import Hub
    from pgqueue.task import Task

Age = str | float | timedelta


class AppBase:
    """An App's settings and pools (see :class:`pgqueue.App` for the arguments)."""

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
        self.periodic_schedules: list[schedules.ScheduleSpec] = []  # from @app.periodic
        self._queries = queries_for(self.schema)
        self._database = Database(
            self.dsn,
            self._queries,
            min_size=validation.positive_int("pool_min_size", pool_min_size)
            if pool_min_size
            else 0,
            max_size=validation.positive_int("pool_max_size", pool_max_size),
            timeout=validation.seconds("pool_timeout", pool_timeout, allow_zero=False),
            transaction_pooler=self.pooler == "transaction",
        )
        #: Dedicated LISTEN connections (the worker's listener) open through this.
        self._listen_database = self._make_listen_database(
            self._database, self.dsn, self.listen_dsn
        )
        self._hub: Hub | None = None
        self.op_context = OpContext(
            schema=self.schema,
            queries=self._queries,
            max_payload_bytes=self.max_payload_bytes,
            max_result_bytes=self.max_result_bytes,
            task_defaults=self._task_defaults,
            clock=clock or _no_clock,
            middleware=self.middleware,
        )

    # The connection pools and statements are the App's own: every use goes
    # through its methods. These names stay readable for one release, for
    # code written when they were public.
    @property
    def database(self) -> Database:
        """Deprecated: private (use the App's methods)."""
        _warn_private("database")
        return self._database

    @property
    def listen_database(self) -> Database:
        """Deprecated: private (use the App's methods)."""
        _warn_private("listen_database")
        return self._listen_database

    @property
    def queries(self) -> Queries:
        """Deprecated: private (use the App's methods)."""
        _warn_private("queries")
        return self._queries

    @staticmethod
    def _make_listen_database(database: Database, dsn: str, listen_dsn: str | None) -> Database:
        """Where dedicated LISTEN connections of an App on ``database`` open."""
        if listen_dsn in (None, dsn):
            return database
        return Database(listen_dsn or "", database.queries, min_size=0, max_size=1)

    def __repr__(self) -> str:
        return f"<pgqueue.App schema={self.schema!r} tasks={len(self.tasks)}>"

    def add_middleware(self, middleware: Middleware) -> None:
        """Add a middleware inside those already added (the first is outermost)."""
        if not isinstance(middleware, Middleware):
            raise InvalidOption(
                f"middleware must be a pgqueue.Middleware, got {type(middleware).__name__}"
            )
        self.middleware.append(middleware)

    def _task_defaults(self, name: str) -> TaskDefaults:
        task = self.tasks.get(name)
        return task.defaults if task is not None else DEFAULT_TASK

    def _result_op(self, job_id: int, timeout: float | None) -> Op[Any]:
        # Waits hold no pooled connection; with listen=True on one LISTEN
        # connection of their own (see the drivers' run_released).
        poll = 1.0 if self.listen else 0.2
        return inspect.result(job_id, timeout, poll, listen=self.listen)

    def _doctor_settings(self, thresholds: dict[str, Any]) -> DoctorSettings:
        declared = not self.listen or self.pooler == "transaction"
        known = set(DoctorSettings.__dataclass_fields__) - {"pooler_declared"}
        if unknown := set(thresholds) - known:
            raise InvalidOption(f"unknown doctor threshold(s): {', '.join(sorted(unknown))}")
        return DoctorSettings.build(pooler_declared=declared, **thresholds)


def _no_clock() -> datetime | None:
    return None


def task_options(args: dict[str, Any]) -> dict[str, Any]:
    """The task options among a set_task_options call's arguments."""
    return {k: args[k] for k in task_ops.OPTION_FIELDS}


def storable_result(result: Any, max_bytes: int) -> str | None:
    value = encode_result(result, max_bytes)
    if isinstance(value, UnstoredResult):
        raise InvalidPayload(f"cannot store the result: {value}")
    return value


def _warn_private(name: str) -> None:
    warnings.warn(
        f"App.{name} is private and will be removed: use the App's methods",
        DeprecationWarning,
        stacklevel=3,
    )
