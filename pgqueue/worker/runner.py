"""Entry points: the blocking ``run_worker`` and the awaitable ``run_worker_async``."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import TYPE_CHECKING

import structlog

from pgqueue.logs import configure_logging
from pgqueue.worker.worker import Worker

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.worker.settings import WorkerSettings


def run_worker(app: App, settings: WorkerSettings) -> None:
    """Run a worker until SIGTERM/SIGINT; returns after a graceful stop."""

    async def main() -> None:
        try:
            await run_worker_async(app, settings, None)
        finally:
            await app.database.close_async_pool()

    asyncio.run(main())


async def run_worker_async(app: App, settings: WorkerSettings, stop: asyncio.Event | None) -> None:
    """Run a worker on the running loop until ``stop`` is set (or, when no
    ``stop`` is given, until SIGTERM/SIGINT)."""
    # Respect an application's own structlog setup unless asked to override it.
    if settings.log_level or settings.log_format or not structlog.is_configured():
        configure_logging(settings.log_level or "info", settings.log_format or "auto")
    worker = Worker(app, settings)
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
        await worker.run(stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
