"""Entry points: the blocking ``run_worker`` and the awaitable ``run_worker_async``."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog

from pgqueue.errors import InvalidOption
from pgqueue.logs import configure_logging
from pgqueue.worker.settings import GC_THRESHOLD
from pgqueue.worker.worker import Worker

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.worker.settings import WorkerSettings


def run_worker(app: App, settings: WorkerSettings) -> None:
    """Run a worker until SIGTERM/SIGINT; returns after a graceful stop, or
    raises the error that stopped it (after the same graceful shutdown).

    Sync tasks still running in threads at that point (handed back after the
    shutdown timeout, or abandoned after their own timeout) cannot be stopped
    and would hold the interpreter open until they return; their jobs are
    already recorded, so the process exits without waiting for them.
    """
    worker = Worker(app, settings)

    async def main() -> None:
        try:
            await _run(worker, None)
        finally:
            await app.database.close_async_pool()

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(main())
    except BaseException as exc:
        if worker.threads_left and exc is worker.fatal:
            _exit_now(worker.threads_left, 1, f"error: {' '.join(str(exc).split())}")
        raise
    if worker.threads_left:
        _exit_now(worker.threads_left, 0)


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


async def run_worker_async(app: App, settings: WorkerSettings, stop: asyncio.Event | None) -> int:
    """Run a worker on the running loop until ``stop`` is set (or, when no
    ``stop`` is given, until SIGTERM/SIGINT). Returns how many sync tasks are
    still running in threads; raises the error that stopped the worker."""
    worker = Worker(app, settings)
    await _run(worker, stop)
    return worker.threads_left


async def _run(worker: Worker, stop: asyncio.Event | None) -> None:
    settings = worker.settings
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
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.on_signal, sig)
            installed.append(sig)
    try:
        with tuned_gc(settings.tune_gc):
            await worker.run(stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
