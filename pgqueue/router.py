"""Routing across databases: several Apps behind one producer and one worker.

``pgqueue.Router({"default": app1, "eu": app2}, route=...)`` sends each job
to ``apps[route(task, payload)]`` when ``route`` is given, else to the App
chosen by a stable hash of the job's ``shard_key`` (required then): the
same key always lands on the same App, as long as the Apps and their order
stay the same. ``pgqueue worker --app mod:router`` serves every App in one
process (one worker per App on one event loop).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pgqueue.app import App
from pgqueue.errors import InvalidName, InvalidOption
from pgqueue.models import Enqueued, Job, JobSpec
from pgqueue.task import Task

if TYPE_CHECKING:
    from pgqueue.worker.worker import Worker

Route = Callable[[str, dict[str, Any]], str]


def shard_index(shard_key: str, shards: int) -> int:
    """The stable shard of ``shard_key`` among ``shards`` (blake2b, not
    Python's per-process ``hash``)."""
    digest = hashlib.blake2b(shard_key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


class Router:
    """Producers enqueue through the router; workers serve all of its Apps."""

    def __init__(self, apps: Mapping[str, App], route: Route | None = None) -> None:
        if not isinstance(apps, Mapping) or not apps:
            raise InvalidOption("Router takes a non-empty dict of {name: pgqueue.App}")
        for key, app in apps.items():
            if not isinstance(key, str) or not key:
                raise InvalidName(f"Router keys must be non-empty strings, got {key!r}")
            if not isinstance(app, App):
                raise InvalidOption(f"Router value for {key!r} is not a pgqueue.App: {app!r}")
        if route is not None and not callable(route):
            raise InvalidOption("route must be a function (task, payload) -> app key")
        self.apps: dict[str, App] = dict(apps)
        self.route = route
        self.tasks: dict[str, RoutedTask] = {}
        self._keys = list(self.apps)

    def __repr__(self) -> str:
        return f"<pgqueue.Router apps={self._keys!r}>"

    # --- where a job goes ----------------------------------------------------

    def key_for(
        self, task: str, payload: dict[str, Any] | None = None, shard_key: str | None = None
    ) -> str:
        """The key of the App that gets a job of ``task`` with ``payload``."""
        if self.route is not None:
            if shard_key is not None:
                raise InvalidOption("give shard_key only to a Router without route")
            key = self.route(task, dict(payload or {}))
            if key not in self.apps:
                raise InvalidName(f"route({task!r}, ...) returned {key!r}, not one of {self._keys}")
            return key
        if not isinstance(shard_key, str) or not shard_key:
            raise InvalidOption(
                "this Router has no route: give shard_key= (a non-empty string) to pick an App"
            )
        return self._keys[shard_index(shard_key, len(self._keys))]

    def app_for(
        self, task: str, payload: dict[str, Any] | None = None, shard_key: str | None = None
    ) -> App:
        """The App that gets a job of ``task`` with ``payload``."""
        return self.apps[self.key_for(task, payload, shard_key)]

    # --- producing -----------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        shard_key: str | None = None,
        **options: Any,
    ) -> tuple[str, Enqueued]:
        """Enqueue on the routed App (options as :meth:`App.enqueue`);
        returns (app key, Enqueued)."""
        key = self.key_for(task, payload, shard_key)
        return key, self.apps[key].enqueue(task, payload, **options)

    async def enqueue_async(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        shard_key: str | None = None,
        **options: Any,
    ) -> tuple[str, Enqueued]:
        """Async twin of :meth:`enqueue`."""
        key = self.key_for(task, payload, shard_key)
        return key, await self.apps[key].enqueue_async(task, payload, **options)

    def enqueue_many(
        self, specs: Sequence[JobSpec], shard_keys: Sequence[str] | None = None
    ) -> list[tuple[str, Enqueued]]:
        """Enqueue each spec on its App: one statement per App (all or
        nothing per App, not across Apps); results in input order."""
        if shard_keys is not None and len(shard_keys) != len(specs):
            raise InvalidOption("shard_keys must have one key per spec")
        groups: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            if not isinstance(spec, JobSpec):
                raise InvalidOption(f"enqueue_many takes JobSpec items, got {spec!r}")
            key = self.key_for(
                spec.task, spec.payload, shard_keys[i] if shard_keys is not None else None
            )
            groups.setdefault(key, []).append(i)
        out: list[tuple[str, Enqueued] | None] = [None] * len(specs)
        for key, positions in groups.items():
            results = self.apps[key].enqueue_many([specs[i] for i in positions])
            for i, result in zip(positions, results, strict=True):
                out[i] = (key, result)
        return [r for r in out if r is not None]

    def get_job(self, app_key: str, job_id: int, history: bool = False) -> Job:
        """A job of the App ``app_key`` (as returned by enqueue)."""
        return self._app(app_key).get_job(job_id, history)

    async def get_job_async(self, app_key: str, job_id: int, history: bool = False) -> Job:
        """Async twin of :meth:`get_job`."""
        return await self._app(app_key).get_job_async(job_id, history)

    def _app(self, key: str) -> App:
        try:
            return self.apps[key]
        except KeyError:
            raise InvalidName(f"no App named {key!r} in this Router ({self._keys})") from None

    # --- tasks ---------------------------------------------------------------

    def task(self, func: Any = None, /, **options: Any) -> Any:
        """Register a task on every App of the router (so each App's worker
        runs it): ``@router.task`` or ``@router.task(queue="mail")``. The
        result's ``enqueue`` routes like :meth:`enqueue`."""

        def register(f: Callable[..., Any]) -> RoutedTask:
            per_app = {key: app.task(**options)(f) for key, app in self.apps.items()}
            routed = RoutedTask(self, per_app)
            self.tasks[routed.name] = routed
            return routed

        return register(func) if func is not None else register

    # --- serving -------------------------------------------------------------

    def run_worker(self, queues: Sequence[str] | None = None, **options: Any) -> None:
        """Serve every App in this process until SIGTERM/SIGINT, as
        ``App.run_worker`` serves one (one worker per App, one event loop)."""
        from pgqueue.worker.runner import run_workers

        run_workers(self._workers(queues, options))

    async def run_worker_async(
        self,
        queues: Sequence[str] | None = None,
        *,
        stop: asyncio.Event | None = None,
        **options: Any,
    ) -> None:
        """One worker per App on this loop; all stop gracefully when ``stop``
        is set (or on SIGTERM/SIGINT when no ``stop`` is given), and all stop
        when one stops on an error."""
        from pgqueue.worker.runner import run_workers_async

        await run_workers_async(self._workers(queues, options), stop)

    def _workers(self, queues: Sequence[str] | None, options: dict[str, Any]) -> list[Worker]:
        from pgqueue.worker.settings import for_app
        from pgqueue.worker.worker import Worker

        return [Worker(app, for_app(app.listen_dsn, queues, options)) for app in self.apps.values()]

    def close(self) -> None:
        """Close every App's pools."""
        for app in self.apps.values():
            app.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RoutedTask:
    """A task registered on every App of a Router."""

    def __init__(self, router: Router, per_app: dict[str, Task[Any, Any]]) -> None:
        self.router = router
        self.per_app = per_app
        first = next(iter(per_app.values()))
        self.name = first.name
        self.func = first.func
        self.__doc__ = first.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pgqueue.RoutedTask {self.name!r} apps={list(self.per_app)!r}>"

    def with_options(self, *, shard_key: str | None = None, **options: Any) -> RoutedCall:
        """Per-call options (``shard_key`` and those of Task.with_options)."""
        return RoutedCall(self, shard_key, options)

    def enqueue(self, **payload: Any) -> tuple[str, Enqueued]:
        """Enqueue on the routed App (needs the Router's route)."""
        return RoutedCall(self, None, {}).enqueue(**payload)

    async def enqueue_async(self, **payload: Any) -> tuple[str, Enqueued]:
        """Async twin of :meth:`enqueue`."""
        return await RoutedCall(self, None, {}).enqueue_async(**payload)


class RoutedCall:
    """A routed task with per-call options."""

    def __init__(self, task: RoutedTask, shard_key: str | None, options: dict[str, Any]) -> None:
        self.task, self.shard_key, self.options = task, shard_key, options

    def _target(self, payload: dict[str, Any]) -> tuple[str, Task[Any, Any]]:
        key = self.task.router.key_for(self.task.name, payload, self.shard_key)
        return key, self.task.per_app[key]

    def enqueue(self, **payload: Any) -> tuple[str, Enqueued]:
        key, task = self._target(payload)
        return key, task.with_options(**self.options).enqueue(**payload)

    async def enqueue_async(self, **payload: Any) -> tuple[str, Enqueued]:
        key, task = self._target(payload)
        return key, await task.with_options(**self.options).enqueue_async(**payload)


__all__ = ["RoutedTask", "Router", "shard_index"]
