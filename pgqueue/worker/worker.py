"""The worker process: starts the loops, and stops them gracefully.

Shutdown: stop leasing; tell running tasks to stop (``should_stop()``); wait
up to ``shutdown_timeout`` for them; hand the unfinished ones back (nack);
write every buffered outcome; deregister.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.telemetry.observer import build_observer
from pgqueue.version import __version__
from pgqueue.worker.completer import Completer
from pgqueue.worker.executor import Executor
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.listener import Listener
from pgqueue.worker.producer import Producer
from pgqueue.worker.reaper import reap_periodically
from pgqueue.worker.scheduler import run_scheduler
from pgqueue.worker.wakeup import wait_any

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.worker.settings import WorkerSettings

log = structlog.get_logger("pgqueue.worker")

DRAIN_TIMEOUT = 15.0
STARTUP_BACKOFF = (0.5, 10.0)


class Worker:
    def __init__(self, app: App, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.stopping = asyncio.Event()  # stop leasing, begin the graceful shutdown
        self.stopped = asyncio.Event()  # background loops end
        self.schedules_changed = asyncio.Event()  # set by NOTIFY 's:': wake the scheduler
        self.signals = 0
        self.threads_left = 0  # sync tasks still running when the worker stopped

    def request_stop(self) -> None:
        self.stopping.set()

    def on_signal(self, signum: int) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            log.info(
                "shutting down: finishing running jobs",
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
        # Metrics and tracing hooks (the no-op observer when neither is on).
        self.observer = observer = build_observer(settings, __version__)
        completer = Completer(app)
        executor = Executor(app, settings.concurrency, completer, observer)
        observer.watch(executor.running)
        completer.executor = executor
        producer = Producer(
            app, settings, executor, self.stopping, lease_details=observer.wants_lease_details
        )
        listener = Listener(app, self._dispatch_to(producer, executor), producer.wake.set)
        heartbeat = Heartbeat(
            app,
            settings,
            executor,
            self.stopped,
            lambda: settings.listen and listener.connected.is_set(),
        )
        self._producer = producer
        await self._register(heartbeat)
        background = [
            self._supervise("heartbeat", heartbeat.run),
            self._supervise(
                "reaper", lambda: reap_periodically(app, settings.reap_interval, self.stopped)
            ),
        ]
        if settings.scheduler:
            background.append(
                self._supervise(
                    "scheduler",
                    # Stops firing as soon as the graceful shutdown begins.
                    lambda: run_scheduler(
                        app, self.stopping, self.schedules_changed if settings.listen else None
                    ),
                )
            )
        if settings.listen:
            background.append(asyncio.create_task(listener.run(), name="pgqueue-listener"))
        log.info(
            "worker started",
            worker_id=settings.worker_id,
            queues=list(settings.queues) if settings.queues else "all",
            concurrency=settings.concurrency,
            batch_size=settings.batch_size,
            listen=settings.listen,
            scheduler=settings.scheduler,
            tasks=sorted(app.tasks),
        )
        producing = asyncio.create_task(producer.run(), name="pgqueue-producer")
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
            await heartbeat.deregister()
            self.threads_left = executor.close()
            observer.close()
            log.info("worker stopped", worker_id=settings.worker_id)

    async def _relay(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopping.set()

    async def _register(self, heartbeat: Heartbeat) -> None:
        delay = STARTUP_BACKOFF[0]
        while True:
            try:
                await heartbeat.register()
                return
            except DatabaseError as exc:
                if self.stopping.is_set():
                    raise
                log.warning(
                    "cannot register the worker yet; retrying", error=str(exc), retry_in=delay
                )
                await wait_any(self.stopping, timeout=delay)
                delay = min(delay * 2, STARTUP_BACKOFF[1])

    async def _shutdown(
        self, producing: asyncio.Task[None], executor: Executor, completer: Completer
    ) -> None:
        try:
            await asyncio.wait_for(producing, timeout=5.0)
        except (TimeoutError, DatabaseError):
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
        if not await completer.drain(DRAIN_TIMEOUT):
            log.error(
                "could not write every job outcome before exiting; "
                "the reaper reclaims those jobs after their lease"
            )

    def _dispatch_to(self, producer: Producer, executor: Executor) -> Callable[[str], None]:
        def dispatch(payload: str) -> None:
            kind, _, value = payload.partition(":")
            if kind in ("j", "q"):
                producer.notify(value)
            elif kind == "s":
                self.schedules_changed.set()
            elif kind == "c":
                try:
                    executor.cancel(int(value))
                except ValueError:
                    pass

        return dispatch

    def _supervise(
        self, name: str, loop_factory: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def supervised() -> None:
            while not self.stopped.is_set():
                try:
                    await loop_factory()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("worker loop crashed; restarting it", loop=name)
                    await asyncio.sleep(1.0)

        return asyncio.create_task(supervised(), name=f"pgqueue-{name}")
