"""A backend for Django's Tasks framework (``django.tasks`` on Django 6, the
``django-tasks`` backport on Django 4.2-5.x) that stores tasks as pgqueue jobs::

    TASKS = {
        "default": {
            "BACKEND": "pgqueue.contrib.django.tasks.PgQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"schema": "pgqueue"},
        }
    }

``OPTIONS``: ``schema`` (default: the project App's, see
:mod:`pgqueue.contrib.django`), ``database`` (the Django alias whose
transaction an enqueue joins; default ``PGQUEUE_DATABASE`` or ``"default"``)
and ``max_attempts`` (default 1: a task that raises is FAILED, as with
Django's own backends; more lets pgqueue retry it with backoff).

A job is named by the task's module path and its payload holds
``task_path``, ``args``, ``kwargs``, ``backend`` and ``run_after``; the
result id is the job id. ``manage.py pgqueue worker`` runs these tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pgqueue.contrib.django import _framework as fw
from pgqueue.contrib.django import _results, _runner
from pgqueue.errors import JobNotFound

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.models import Job

__all__ = ["PgQueueBackend", "pgqueue_backends", "prepare_backends"]

_OPTIONS = frozenset({"schema", "database", "max_attempts"})

_lock = threading.RLock()
# Backend instances are per thread (Django's connection handler): what they
# share lives here, by backend alias.
_apps: dict[str, App] = {}
_declared: dict[str, dict[str, Any]] = {}  # every task validated, by backend alias
# Settings the Apps are built from: changing one (override_settings) rebuilds them.
_SETTINGS = frozenset({"TASKS", "PGQUEUE_APP", "PGQUEUE_SCHEMA", "PGQUEUE_DATABASE"})


class PgQueueBackend(fw.BaseTaskBackend):  # type: ignore[misc]
    """Django Tasks on pgqueue: enqueue joins the current Django transaction
    (a rolled-back ``atomic()`` leaves no job; workers are woken at commit),
    ``run_after`` is the job's ``run_at``, the priority (-100..100) is the
    job's, ``queue_name`` its queue."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        from django.core.exceptions import ImproperlyConfigured

        super().__init__(alias, params)
        fw.import_checks()  # the backport registers its check only as an installed app
        if unknown := sorted(set(self.options) - _OPTIONS):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}: "
                f"pgqueue knows {sorted(_OPTIONS)}"
            )
        self.schema: str | None = self.options.get("schema")
        self.database: str | None = self.options.get("database")
        max_attempts = self.options.get("max_attempts", 1)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 0:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['max_attempts'] must be a whole number >= 0 "
                f"(0: unlimited), got {max_attempts!r}"
            )
        self.max_attempts: int = max_attempts

    # --- the App -----------------------------------------------------------------

    @property
    def app(self) -> App:
        """The pgqueue App this backend enqueues on: the project's App (see
        :func:`pgqueue.contrib.django.get_app`) unless OPTIONS name another schema."""
        app = _apps.get(self.alias)
        if app is None:
            with _lock:
                app = _apps.get(self.alias) or self._build_app()
                _runner.install(app)
                _apps[self.alias] = app
                for task in _declared.get(self.alias, {}).values():
                    _runner.register(app, task, self.max_attempts)
        return app

    def _build_app(self) -> App:
        from pgqueue.app import App
        from pgqueue.contrib.django import _databases, database_dsn, get_app

        project = get_app()
        if self.schema in (None, project.schema) and self.database is None:
            return project
        dsn = database_dsn(self.database)
        for other in _apps.values():  # one App (one pool) per database and schema
            if other.schema == (self.schema or project.schema) and other.dsn == dsn:
                return other
        app = App(dsn=dsn, schema=self.schema or project.schema)
        _databases.follow(app, self.database_alias, dsn)
        return app

    @property
    def database_alias(self) -> str:
        """The Django database whose transactions this backend's enqueues join."""
        from pgqueue.contrib.django import database_alias

        return self.database or database_alias()

    def _connection(self) -> Any:
        from django.db import connections

        return connections[self.database_alias]

    def __str__(self) -> str:
        return f"TASKS[{self.alias!r}]"

    def __repr__(self) -> str:
        return f"<PgQueueBackend {self.alias!r}>"

    # --- the framework's API ---------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """Django's checks; then the task is registered for this backend's workers."""
        super().validate_task(task)
        with _lock:
            _declared.setdefault(self.alias, {})[task.module_path] = task
            app = _apps.get(self.alias)
        if app is not None:
            _runner.register(app, task, self.max_attempts)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store a job in the current Django transaction of OPTIONS' database."""
        from django.utils import timezone

        self.validate_task(task)
        args, kwargs = fw.normalize_json(list(args)), fw.normalize_json(dict(kwargs))
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)
        payload = {
            "task_path": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "run_after": None if run_after is None else run_after.isoformat(),
        }
        enqueued = self.app.enqueue(
            task.module_path,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            run_at=run_after,
            max_attempts=self.max_attempts,
            conn=self._connection(),
        )
        result = fw.task_result(
            task=task,
            id=str(enqueued.job_id),
            status=fw.TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        fw.signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result as stored now; TaskResultDoesNotExist when no
        job of a Django task has this id."""
        job_id = _job_id(result_id)
        try:
            job = self.app.get_job(job_id, history=True)
        except JobNotFound:
            raise fw.TaskResultDoesNotExist(result_id) from None
        return self._result(result_id, job)

    async def aget_result(self, result_id: str) -> Any:
        """Async twin of :meth:`get_result` (no thread: pgqueue's async pool)."""
        job_id = _job_id(result_id)
        try:
            job = await self.app.get_job_async(job_id, history=True)
        except JobNotFound:
            raise fw.TaskResultDoesNotExist(result_id) from None
        return self._result(result_id, job)

    def _result(self, result_id: str, job: Job) -> Any:
        if not _results.is_django_job(job):
            raise fw.TaskResultDoesNotExist(result_id)
        task = _runner.with_job_options(_runner.import_task(job.task), job)
        return _results.from_job(job, task, job.payload.get("backend") or self.alias)

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """The framework's checks, then: is the pgqueue schema migrated? A
        warning, not an error: ``manage.py migrate`` (which applies it) and
        every other command must still run."""
        from django.core import checks

        yield from super().check(**kwargs)
        report = self.app.check()
        for failed in report.failures:
            if failed.name == "schema":
                yield checks.Warning(
                    failed.message.partition(": run `")[0],
                    hint=f"run `{self._migrate_command()}`",
                    obj=self,
                    id="pgqueue.W002",
                )
            elif failed.name == "connection":
                yield checks.Warning(
                    f"cannot check the pgqueue schema: {failed.message}",
                    obj=self,
                    id="pgqueue.W001",
                )

    def _migrate_command(self) -> str:
        """``manage.py migrate`` while its pgqueue migrations are pending on
        this backend's database, else ``manage.py pgqueue migrate`` (the
        schema was changed outside Django's migrations)."""
        from django.db.migrations.recorder import MigrationRecorder

        from pgqueue.contrib.django.schema import migration_names

        database = self.database_alias
        try:
            applied = MigrationRecorder(self._connection()).applied_migrations()
        except Exception:  # cannot read django_migrations: migrate is still the first step
            applied = {}
        pending = any(("pgqueue", name) not in applied for name in migration_names())
        option = "" if database == "default" else f" --database {database}"
        return f"manage.py migrate{option}" if pending else "manage.py pgqueue migrate"


def _job_id(result_id: object) -> int:
    try:
        job_id = int(str(result_id))
    except ValueError:
        raise fw.TaskResultDoesNotExist(result_id) from None
    if not 0 < job_id < 2**63:
        raise fw.TaskResultDoesNotExist(result_id)
    return job_id


def pgqueue_backends() -> list[PgQueueBackend]:
    """Every PgQueueBackend of ``TASKS``."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    found = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend_class = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, PgQueueBackend):
            fw.import_checks()
            found.append(fw.task_backends[alias])
    return found


def prepare_backends() -> None:
    """Build the App of every configured PgQueueBackend now (called when
    Django is ready), so a worker started next knows their tasks and finds
    others by name; and register the framework's system checks."""
    for backend in pgqueue_backends():
        backend.app  # noqa: B018 (builds and installs it)


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    """Forget the Apps built from settings that changed (they are rebuilt on
    next use), as Django forgets its task backends when TASKS changes."""
    if setting not in _SETTINGS:
        return
    import pgqueue.contrib.django as contrib
    from pgqueue.contrib.django import _databases

    with _lock:
        apps = {id(app): app for app in _apps.values()}
        _apps.clear()
    project = contrib.forget_app()
    if project is not None:
        apps[id(project)] = project
    for app in apps.values():
        _databases.forget(app)
        app.close()  # its pools; they would reopen if someone still used it


def _connect_signals() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_settings_changed, dispatch_uid="pgqueue.contrib.django.tasks")


_connect_signals()
