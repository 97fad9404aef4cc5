"""Tasks: functions registered with ``@app.task`` and how they are enqueued."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack

from pgqueue import validation
from pgqueue._adapters import ConnectionLike
from pgqueue.errors import InvalidOption, InvalidPayload
from pgqueue.models import Enqueued, EnqueueOptions, JobSpec
from pgqueue.ops import TaskDefaults
from pgqueue.retry import DEFAULT_BACKOFF, Backoff

if TYPE_CHECKING:
    from pgqueue.app import App

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered task. Calling it runs the function directly; ``enqueue``
    stores a job whose payload is the keyword arguments."""

    def __init__(
        self,
        app: App,
        func: Callable[P, R],
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        retry: Backoff = DEFAULT_BACKOFF,
        lease_seconds: float | str = 60,
        timeout: float | str | timedelta | None = None,
        pass_context: bool = False,
    ) -> None:
        if not isinstance(retry, Backoff):
            raise InvalidOption("retry must be a pgqueue.Backoff")
        self.app = app
        self.func = func
        self.name = validation.task_name(name or getattr(func, "__name__", ""))
        self.queue = validation.queue_name(queue)
        self.priority = validation.priority(priority)
        self.max_attempts = validation.max_attempts(max_attempts)
        self.retry = retry
        self.lease_seconds = max(
            1, round(validation.seconds("lease_seconds", lease_seconds, allow_zero=False))
        )
        self.timeout = (
            validation.seconds("timeout", timeout, allow_zero=False)
            if timeout is not None
            else None
        )
        self.pass_context = bool(pass_context)
        self.is_async = inspect.iscoroutinefunction(func)
        self.defaults = TaskDefaults(
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
            lease_seconds=self.lease_seconds,
            backoff=retry.as_list(),
        )
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pgqueue.Task {self.name!r} queue={self.queue!r}>"

    def with_options(
        self, *, conn: ConnectionLike | None = None, **options: Unpack[EnqueueOptions]
    ) -> TaskCall:
        """Options for the next enqueue, e.g. ``task.with_options(delay=30).enqueue(...)``:
        the fields of :class:`pgqueue.JobSpec`. ``conn``: see :meth:`pgqueue.App.enqueue`."""
        return TaskCall(self, JobSpec(self.name, None, **options), conn)

    def enqueue(self, *args: Any, **payload: Any) -> Enqueued:
        """Enqueue a job with the task's defaults; the arguments are its payload
        (positional ones are stored under the function's parameter names:
        ``send(42, "a@b.c")`` is ``send(order_id=42, email="a@b.c")``)."""
        return TaskCall(self, JobSpec(self.name), None).enqueue(*args, **payload)

    async def enqueue_async(self, *args: Any, **payload: Any) -> Enqueued:
        """Async twin of :meth:`enqueue`."""
        return await TaskCall(self, JobSpec(self.name), None).enqueue_async(*args, **payload)

    def payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The payload (a JSON object of keyword arguments) for a call with
        ``args`` and ``kwargs``; positional arguments take their parameter's name."""
        if not args:
            return kwargs
        params = list(inspect.signature(self.func).parameters.values())
        named = [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and not (self.pass_context and p.name == "context")
        ]
        if len(args) > len(named):
            raise InvalidPayload(
                f"task {self.name!r} takes {len(named)} positional argument"
                f"{'s' if len(named) != 1 else ''} ({', '.join(named) or 'none'}), "
                f"got {len(args)}: a payload holds named values only"
            )
        mapped = dict(zip(named, args, strict=False))
        if twice := sorted(set(mapped) & set(kwargs)):
            raise InvalidPayload(
                f"task {self.name!r} got {', '.join(twice)} both by position and by name"
            )
        return {**mapped, **kwargs}


class TaskCall:
    """A task with per-call options; see :meth:`Task.with_options`."""

    __slots__ = ("conn", "spec", "task")

    def __init__(self, task: Task[Any, Any], spec: JobSpec, conn: Any) -> None:
        self.task, self.spec, self.conn = task, spec, conn

    def _spec(self, payload: dict[str, Any]) -> JobSpec:
        return self.spec._replace(payload=payload)

    def enqueue(self, *args: Any, **payload: Any) -> Enqueued:
        """Enqueue with these options (in ``conn``'s transaction when given)."""
        spec = self._spec(self.task.payload(args, payload))
        return self.task.app.enqueue_spec(spec, conn=self.conn)

    async def enqueue_async(self, *args: Any, **payload: Any) -> Enqueued:
        """Async twin of :meth:`enqueue` (``conn`` must be an async connection)."""
        spec = self._spec(self.task.payload(args, payload))
        return await self.task.app.enqueue_spec_async(spec, conn=self.conn)
