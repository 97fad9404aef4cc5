"""How a pgqueue worker runs Django tasks.

Each Django task is a pgqueue task named by its module path
(``shop.orders.tasks.ship_order``), so ``status``, ``jobs`` and the dashboard
show it by that name. Its function is one of the two runners below: they
import the Django task the payload names, fire the framework's
``task_started``/``task_finished`` signals around it, pass the framework's
``TaskContext`` to ``takes_context`` tasks and return the JSON-normalised
value (stored as the job's result).

A worker finds these tasks two ways: registered when their module is
imported (``tasks.py`` of installed apps is imported at start-up), and, for
any other module, by :class:`TaskRegistry`, which imports a task by its name
the first time a job of it is leased (as Django's own database worker does).
"""

from __future__ import annotations

import re
import threading
import traceback
from collections.abc import Callable
from datetime import datetime
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.context import JobContext
from pgqueue.contrib.django import _framework as fw
from pgqueue.contrib.django import _results
from pgqueue.models import Job
from pgqueue.retry import Permanent
from pgqueue.task import Task

if TYPE_CHECKING:
    from pgqueue.app import App

log = structlog.get_logger("pgqueue.django")

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class Run:
    """One attempt of a Django task: its TaskResult, kept current for the
    signals and the task's context. Holds no I/O (shared by both runners)."""

    def __init__(self, context: JobContext, task_path: str, backend: str) -> None:
        if task_path != context.task:
            raise Permanent(f"job {context.job_id}: its payload names another task: {task_path!r}")
        self.context = context
        self.alias = backend
        self.django_task = import_task(task_path)
        self.backend = fw.task_backends[backend]
        if not hasattr(self.backend, "app"):
            raise Permanent(f"TASKS[{backend!r}] is not a pgqueue backend")
        self.result: Any = None
        self.max_attempts = 1

    def begin(self, job: Job) -> None:
        """Build the RUNNING result of this attempt from the job as stored."""
        task = with_job_options(self.django_task, job)
        self.result = _results.from_job(job, task, self.alias)
        self.max_attempts = job.max_attempts

    def call_args(self, args: list[Any]) -> list[Any]:
        if self.django_task.takes_context:
            return [fw.TaskContext(task_result=self.result), *args]
        return args

    def succeeded(self, value: Any) -> Any:
        """The normalised return value (a value JSON cannot hold fails the
        attempt, as with Django's own backends)."""
        value = fw.normalize_json(value)
        self._finish(fw.TaskResultStatus.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", value)
        return value

    def failed(self, exc: BaseException) -> bool:
        """Record ``exc``; True when this was the last attempt (the task ends
        FAILED and ``task_finished`` is due), False when pgqueue will retry."""
        if not isinstance(exc, Exception) or self.result is None:
            return False  # cancelled or interrupted: no Django outcome
        last = isinstance(exc, Permanent) or (
            self.max_attempts != 0 and self.context.attempt >= self.max_attempts
        )
        self.result.errors.append(
            fw.TaskError(
                exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
        )
        if last:
            self._finish(fw.TaskResultStatus.FAILED)
        return last

    def _finish(self, status: Any) -> None:
        from django.utils import timezone

        object.__setattr__(self.result, "status", status)
        object.__setattr__(self.result, "finished_at", timezone.now())

    @property
    def sender(self) -> type[Any]:
        return type(self.backend)


def run_sync(
    task_path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str = "default",
    run_after: str | None = None,
    *,
    context: JobContext,
) -> Any:
    """Run a sync Django task (in a worker thread)."""
    from django.db import close_old_connections

    close_old_connections()  # as around a request: this thread's stale connections
    try:
        run = Run(context, task_path, backend)
        run.begin(run.backend.app.get_job(context.job_id, history=True))
        fw.signals.task_started.send(sender=run.sender, task_result=run.result)
        try:
            value = run.succeeded(run.django_task.call(*run.call_args(args), **kwargs))
        except BaseException as exc:
            if run.failed(exc):
                fw.signals.task_finished.send(sender=run.sender, task_result=run.result)
            raise
        fw.signals.task_finished.send(sender=run.sender, task_result=run.result)
        return value
    finally:
        close_old_connections()


async def run_async(
    task_path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str = "default",
    run_after: str | None = None,
    *,
    context: JobContext,
) -> Any:
    """Run an async Django task (on the worker's event loop)."""
    run = Run(context, task_path, backend)
    run.begin(await run.backend.app.get_job_async(context.job_id, history=True))
    await _asend(fw.signals.task_started, run)
    try:
        value = run.succeeded(await run.django_task.acall(*run.call_args(args), **kwargs))
    except BaseException as exc:
        if run.failed(exc):
            await _asend(fw.signals.task_finished, run)
        raise
    await _asend(fw.signals.task_finished, run)
    return value


async def _asend(signal: Any, run: Run) -> None:
    asend = getattr(signal, "asend", None)  # Django >= 5.0: sync receivers in threads
    if asend is not None:
        await asend(sender=run.sender, task_result=run.result)
    else:
        signal.send(sender=run.sender, task_result=run.result)


def import_task(path: str) -> Any:
    """The Django task at ``path``; Permanent when there is none."""
    from django.utils.module_loading import import_string

    try:
        task = import_string(path)
    except ImportError as exc:
        raise Permanent(f"cannot import Django task {path!r}: {exc}") from exc
    if not isinstance(task, fw.Task):
        raise Permanent(f"{path!r} is a {type(task).__name__}, not a Django task")
    return task


def with_job_options(task: Any, job: Job) -> Any:
    """``task`` with the queue, priority, backend and run_after of ``job``."""
    payload = job.payload
    run_after = payload.get("run_after")
    return task.using(
        priority=job.priority,
        queue_name=job.queue,
        backend=payload.get("backend") or task.backend,
        run_after=datetime.fromisoformat(run_after) if run_after else None,
    )


def register(app: App, django_task: Any, max_attempts: int) -> None:
    """Register the pgqueue task that runs ``django_task`` on ``app`` (once)."""
    name = django_task.module_path
    if name in app.tasks:
        return
    func: Callable[..., Any] = run_async if iscoroutinefunction(django_task.func) else run_sync
    app.task(name=name, pass_context=True, max_attempts=max_attempts)(func)


class TaskRegistry(dict[str, Task[Any, Any]]):
    """``app.tasks`` that also finds a Django task by its module path the
    first time a worker meets a job of it, when the task's backend enqueues
    on this App. Names that are not such a task are remembered as unknown."""

    def __init__(self, app: App, tasks: dict[str, Task[Any, Any]]) -> None:
        super().__init__(tasks)
        self.app = app
        self.unknown: set[str] = set()
        self._lock = threading.Lock()

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        task = super().get(name)
        if task is None:
            task = self._resolve(name)
        return default if task is None else task

    def __missing__(self, name: str) -> Task[Any, Any]:
        task = self._resolve(name)
        if task is None:
            raise KeyError(name)
        return task

    def _resolve(self, name: str) -> Task[Any, Any] | None:
        if name in self.unknown or not _DOTTED.fullmatch(name):
            return None
        with self._lock:
            try:
                django_task = import_task(name)
                backend = django_task.get_backend()
                if getattr(backend, "app", None) is self.app:
                    register(self.app, django_task, backend.max_attempts)
            except Exception as exc:
                log.warning("no Django task by this name", task=name, error=str(exc))
            task = dict.get(self, name)
            if task is None:
                self.unknown.add(name)
            return task


def install(app: App) -> None:
    """Let ``app``'s workers find Django tasks by name (see TaskRegistry)."""
    if not isinstance(app.tasks, TaskRegistry):
        app.tasks = TaskRegistry(app, app.tasks)
