"""Entry points: the blocking ``run_worker`` and the awaitable ``run_worker_async``."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog

from pgqueue.database import async_pools
from pgqueue.errors import InvalidOption
from pgqueue.logs import configure_logging
from pgqueue.worker.settings import GC_THRESHOLD
from pgqueue.worker.worker import Worker

if TYPE_CHECKING:
    from pgqueue.worker.parts import WorkerHost
    from pgqueue.worker.settings import WorkerSettings


def run_worker(app: WorkerHost, settings: WorkerSettings) -> None:
    """Run a worker until SIGTERM/SIGINT; returns after a graceful stop, or
    raises the error that stopped it (after the same graceful shutdown)."""
    run_workers([Worker(app, settings)])


def run_workers(workers: Sequence[Worker]) -> None:
    """Run workers (one per App: a Router's) on an event loop of their own
    until SIGTERM/SIGINT, as :func:`run_worker` does for one.

    Sync tasks still running in threads at the end (handed back after the
    shutdown timeout, or abandoned after their own timeout) cannot be stopped
    and would hold the interpreter open until they return; their jobs are
    already recorded, so the process exits without waiting for them.
    """
    databases = [w.app.database for w in workers]

    async def main() -> None:
        async with async_pools(*databases):
            await _run(workers, None)

    event_loop = workers[0].settings.event_loop
    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            runner.run(main())
    except BaseException as exc:
        left = _threads_left(workers)
        if left and any(exc is w.fatal for w in workers):
            _exit_now(left, 1, f"error: {' '.join(str(exc).split())}")
        raise
    if left := _threads_left(workers):
        _exit_now(left, 0)


def _threads_left(workers: Sequence[Worker]) -> int:
    return sum(w.threads_left for w in workers)


def loop_factory(event_loop: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What creates the worker's event loop: uvloop's for ``uvloop`` (and for
    ``auto`` when it is installed, e.g. by ``pgqueue[speed]``), None (asyncio's
    default) otherwise. Usable as ``asyncio.Runner(loop_factory=...)``."""
    if event_loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if event_loop == "uvloop":
            raise InvalidOption(
                "event_loop='uvloop' needs uvloop: pip install 'pgqueue[speed]'"
            ) from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


_gc_tuners = 0  # workers running with tune_gc in this process (the first one tunes)
_untuned_threshold = gc.get_threshold()


@contextmanager
def tuned_gc(enabled: bool = True) -> Iterator[None]:
    """While the worker runs: objects alive at start leave the collector's
    generations (``gc.freeze``) and young collections happen every
    ``GC_THRESHOLD`` allocations instead of 700; restored afterwards. With
    several workers in one process, the first to start tunes and the last
    to stop restores."""
    global _gc_tuners, _untuned_threshold
    if not enabled:
        yield
        return
    _gc_tuners += 1
    if _gc_tuners == 1:
        previous = _untuned_threshold = gc.get_threshold()
        # No gc.collect() first: a full collection of everything imported
        # costs tens of ms at each start; garbage frozen now is freed after
        # the worker stops (unfreeze), like the rest.
        gc.freeze()
        gc.set_threshold(max(previous[0], GC_THRESHOLD), *previous[1:])
    try:
        yield
    finally:
        _gc_tuners -= 1
        if _gc_tuners == 0:
            gc.set_threshold(*_untuned_threshold)
            gc.unfreeze()


def _exit_now(threads: int, code: int, message: str | None = None) -> None:
    structlog.get_logger("pgqueue.worker").warning(
        "exiting without waiting for sync tasks still running in threads", threads=threads
    )
    if message:
        print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def run_worker_async(
    app: WorkerHost, settings: WorkerSettings, stop: asyncio.Event | None
) -> int:
    """Run a worker on the running loop until ``stop`` is set (or, when no
    ``stop`` is given, until SIGTERM/SIGINT). Returns how many sync tasks are
    still running in threads; raises the error that stopped the worker."""
    return await run_workers_async([Worker(app, settings)], stop)


async def run_workers_async(workers: Sequence[Worker], stop: asyncio.Event | None) -> int:
    """Run workers on the running loop until ``stop`` is set (or SIGTERM/SIGINT
    when no ``stop`` is given), all stopping together; returns how many sync
    tasks are still running in threads."""
    await _run(workers, stop)
    return _threads_left(workers)


async def _run(workers: Sequence[Worker], stop: asyncio.Event | None) -> None:
    settings = workers[0].settings
    # Respect an application's own structlog setup unless asked to override it.
    # Asked explicitly (pgqueue worker, log_level=...), the loggers are cached
    # for good; a worker that only filled in a default leaves the host
    # process free to configure structlog later (tests capturing logs, say).
    explicit = bool(settings.log_level or settings.log_format)
    if explicit or not structlog.is_configured():
        configure_logging(
            settings.log_level or "info", settings.log_format or "auto", cache=explicit
        )
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if (
        stop is None
        and settings.install_signal_handlers
        and (threading.current_thread() is threading.main_thread())
    ):

        def on_signal(sig: signal.Signals) -> None:
            for worker in workers:  # a second signal: each exits at once
                worker.on_signal(sig)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        with tuned_gc(settings.tune_gc):
            await _together(workers, stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _together(workers: Sequence[Worker], stop: asyncio.Event | None) -> None:
    """Run the workers; when one stops on an error, the others stop too
    (gracefully), and that error is raised."""
    if len(workers) == 1:
        await workers[0].run(stop)
        return
    runs = [asyncio.ensure_future(w.run(stop)) for w in workers]
    try:
        await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for worker in workers:
            worker.request_stop()
        ended = await asyncio.gather(*runs, return_exceptions=True)
    for outcome in ended:
        if isinstance(outcome, BaseException):
            raise outcome
