"""The worker process: starts the loops, and stops them gracefully.

Shutdown: stop leasing; tell running tasks to stop (``should_stop()``); wait
up to ``shutdown_timeout`` for them; hand the unfinished ones back (nack);
write every buffered outcome; deregister.

Every loop rides out transient database errors itself (see
:mod:`pgqueue.worker.faults`). Anything else that escapes a loop is fatal:
the worker logs it once, shuts down the same graceful way, and ``run``
raises it (``pgqueue worker`` then exits non-zero).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.connection import describe_target
from pgqueue.errors import InvalidOption, PgQueueError
from pgqueue.events import wake_queue
from pgqueue.worker.app_path import CHILD_ENV, find_app_path
from pgqueue.worker.faults import Episodes
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.listener import Listener
from pgqueue.worker.maintenance import maintain_periodically
from pgqueue.worker.parts import JobParts, WorkerApp
from pgqueue.worker.producer import Producer
from pgqueue.worker.reaper import reap_periodically
from pgqueue.worker.scheduler import run_scheduler
from pgqueue.worker.wakeup import wait_any

if TYPE_CHECKING:
    from pgqueue.worker.completer import Completer
    from pgqueue.worker.executor import Executor
    from pgqueue.worker.parts import WorkerHost
    from pgqueue.worker.settings import WorkerSettings
    from pgqueue.worker.task_settings import LiveTaskSettings

log = structlog.get_logger("pgqueue.worker")

DRAIN_TIMEOUT = 15.0
STARTUP_BACKOFF = (0.5, 10.0)


class Worker:
    def __init__(self, app: WorkerHost, settings: WorkerSettings) -> None:
        if os.environ.get(CHILD_ENV):
            raise InvalidOption(
                "a worker cannot start inside a --pool process child: the App's module "
                "starts a worker when imported; guard that with if __name__ == '__main__':"
            )
        if settings.pool == "process" and settings.app_path is None:
            settings = replace(settings, app_path=find_app_path(app))
        self.app = WorkerApp.of(app)
        self.settings = settings
        self.stopping = asyncio.Event()  # stop leasing, begin the graceful shutdown
        self.stopped = asyncio.Event()  # background loops end
        self.schedules_changed = asyncio.Event()  # set by NOTIFY 's:': wake the scheduler
        self.signals = 0
        self.threads_left = 0  # sync tasks still running when the worker stopped
        self.fatal: BaseException | None = None  # what stopped the worker, if not a request

    def request_stop(self) -> None:
        self.stopping.set()

    def fail(self, loop: str, exc: BaseException) -> None:
        """A loop met an error it cannot ride out: stop the worker gracefully."""
        if self.fatal is not None:
            return
        self.fatal = exc
        log.error(
            "stopping the worker: a worker loop failed on an error that retrying cannot fix",
            loop=loop,
            error=str(exc),
            error_type=type(exc).__name__,
            sqlstate=getattr(exc, "sqlstate", None),
            exc_info=not isinstance(exc, PgQueueError),
        )
        self.stopping.set()

    def on_signal(self, signum: int) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            log.info(
                "shutting down: finishing running jobs (press Ctrl-C again to force)",
                signal=name,
                timeout_seconds=self.settings.shutdown_timeout,
            )
            self.request_stop()
        else:
            log.warning(
                "second signal: exiting now; the reaper reclaims leases of unfinished jobs",
                signal=name,
            )
            os._exit(1)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        settings, app = self.settings, self.app
        database, ctx = app.database, app.ctx
        parts = JobParts.build(app, settings, on_fatal=self.fail, stopped=self.stopped)
        observer = parts.observer
        executor, completer, heartbeat = parts.executor, parts.completer, parts.heartbeat
        live_settings = parts.live_settings
        producer = Producer(
            database,
            ctx,
            settings,
            executor,
            live_settings,
            self.stopping,
            lease_details=observer.wants_lease_details,
        )
        listener = Listener(  # on listen_dsn when a transaction pooler is in the path
            app.listen_database,
            self._dispatch_to(producer, heartbeat, live_settings),
            partial(self._connected, producer, live_settings),
            parts.connected,
            on_announce=producer.announced,
            on_lost=producer.cursors.deactivate,
        )
        try:
            await executor.start_pool()  # --pool process: children import the App first
        except BaseException:
            observer.close()
            raise
        try:
            await self._register(heartbeat, live_settings)
        except BaseException:
            await executor.close_pool()
            observer.close()
            raise
        background = [
            self._supervise("heartbeat", heartbeat.run),
            self._supervise(
                "task settings", lambda: live_settings.refresh_periodically(self.stopped)
            ),
            self._supervise(
                "reaper",
                lambda: reap_periodically(database, ctx, settings.reap_interval, self.stopped),
            ),
        ]
        if settings.scheduler:
            background.append(
                self._supervise(
                    "scheduler",
                    # Stops firing as soon as the graceful shutdown begins.
                    lambda: run_scheduler(
                        database,
                        ctx,
                        app.periodic_schedules,
                        self.stopping,
                        self.schedules_changed if settings.listen else None,
                    ),
                )
            )
        if settings.maintenance:
            background.append(
                self._supervise(
                    "maintenance",
                    # Hands its turn on as soon as the graceful shutdown begins.
                    lambda: maintain_periodically(database, ctx, settings.worker_id, self.stopping),
                )
            )
        if settings.listen:
            background.append(self._supervise("listener", listener.run))
        log.info(
            "worker started",
            worker_id=settings.worker_id,
            database=describe_target(app.dsn),
            schema=app.schema,
            queues=list(settings.queues) if settings.queues else "all",
            concurrency=settings.concurrency,
            pool=settings.pool,
            batch_size=settings.batch_size,
            listen=settings.listen,
            scheduler=settings.scheduler,
            tasks=sorted(app.tasks),
        )
        if not settings.listen and app.listen_dsn is None:
            log.warning(
                "not listening for notifications: polling every poll_interval"
                + (
                    "; behind a transaction-mode pooler pass listen_dsn= (PGQUEUE_LISTEN_DSN)"
                    " to wake at once"
                    if app.pooler == "transaction"
                    else ""
                ),
                poll_interval=settings.poll_interval,
            )
        producing = self._supervise("producer", producer.run)
        relay = asyncio.create_task(self._relay(stop)) if stop is not None else None
        stopper = asyncio.ensure_future(self.stopping.wait())
        try:
            watched: list[asyncio.Future[Any]] = [producing, stopper]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            self.stopping.set()
            await self._shutdown(producing, executor, completer)
        finally:
            self.stopped.set()
            stopper.cancel()
            if relay is not None:
                relay.cancel()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await executor.close_pool()
            await heartbeat.deregister()
            await parts.transactions.close()
            self.threads_left = executor.close()
            observer.close()
            log.info("worker stopped", worker_id=settings.worker_id)
        if self.fatal is not None:
            raise self.fatal

    async def _relay(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopping.set()

    async def _register(self, heartbeat: Heartbeat, live_settings: LiveTaskSettings) -> None:
        """Register before leasing; waits out a database that is not usable yet
        (down, starting, read-only, out of connections)."""
        episodes = Episodes(
            "registry", *STARTUP_BACKOFF, message="cannot register the worker yet; retrying"
        )
        while True:
            try:
                await heartbeat.register()
                await live_settings.publish(self.app.tasks.values(), self.settings.worker_id)
                episodes.succeeded()
                return
            except Exception as exc:
                if self.stopping.is_set():
                    raise
                await wait_any(self.stopping, timeout=episodes.failed(exc))

    async def _shutdown(
        self, producing: asyncio.Task[None], executor: Executor, completer: Completer
    ) -> None:
        try:
            await asyncio.wait_for(producing, timeout=5.0)
        except TimeoutError:
            producing.cancel()
        executor.stop_all()
        if not executor.idle.is_set():
            log.info(
                "waiting for running jobs",
                running=executor.busy,
                timeout_seconds=self.settings.shutdown_timeout,
            )
            await wait_any(executor.idle, timeout=self.settings.shutdown_timeout)
        leftovers = executor.unfinished()
        if leftovers:
            log.warning(
                "handing unfinished jobs back to the queue",
                job_ids=[rj.job.job_id for rj in leftovers],
            )
            executor.abandon(leftovers)
            completer.nack(leftovers)
        if executor.progress is not None:
            await executor.progress.drain()
        if not await completer.drain(DRAIN_TIMEOUT):
            log.error(
                "could not write every job outcome before exiting; "
                "the reaper reclaims those jobs after their lease"
            )

    def _connected(self, producer: Producer, live_settings: LiveTaskSettings) -> None:
        """LISTEN (re)connected: catch up with what its notifications missed."""
        producer.cursors.activate()  # from the heads: announcements may have been missed
        producer.wake.set()
        live_settings.refresh_soon()  # task settings changed while not listening

    def _dispatch_to(
        self, producer: Producer, heartbeat: Heartbeat, live_settings: LiveTaskSettings
    ) -> Callable[[str], None]:
        def dispatch(payload: str) -> None:
            queue = wake_queue(payload)  # see pgqueue.events for every payload
            if queue is not None:
                producer.notify(queue)
                return
            kind, _, value = payload.partition(":")
            if kind == "s":
                self.schedules_changed.set()
            elif kind == "t":  # a task's live settings or limits changed
                live_settings.refresh_soon()
                producer.wake.set()
            elif kind == "c":
                # Anyone who may connect can NOTIFY: a cancel notice is only a
                # hint to ask the database at once (the heartbeat confirms
                # cancel_requested before stopping the task).
                try:
                    job_id = int(value)
                except ValueError:
                    return
                heartbeat.confirm_cancel(job_id)

        return dispatch

    def _supervise(
        self, name: str, loop_factory: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[None]:
        """Run a loop as a task; what escapes it stops the worker (see ``fail``)."""

        async def supervised() -> None:
            try:
                await loop_factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.fail(name, exc)

        return asyncio.create_task(supervised(), name=f"pgqueue-{name}")
