"""Long-poll wake-ups: one LISTEN connection per server process, fanned out.

Waiting lease requests hold no database connection: each waits on an
:class:`asyncio.Event` of its queue. One task reads the App's event stream
(``app.subscribe_async()``, the process's one LISTEN connection) and, per
event about a queue, wakes the longest-waiting request of that queue. A
request that then leases a full batch wakes the next one (there may be more
work); one that gets less does not. So a notification costs one lease
statement, not one per waiting request, however many wait. A ``resync``
(the stream may have missed events) wakes one waiter per queue. Waiters also
retry on their own every ``poll_interval`` seconds (jobs that become due
later send no notification), and when LISTEN is unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgqueue.app import App

log = logging.getLogger("pgqueue.http")


class Waiters:
    """Lease requests waiting for work, per queue, woken by NOTIFY."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._queues: dict[str, deque[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.connections_opened = 0  # LISTEN sessions opened, for tests and benchmarks
        self.wakeups = 0

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def start(self) -> None:
        """Start the listener task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.wake_all()

    def register(self, queue: str) -> asyncio.Event:
        """An event set when ``queue`` may have work; call :meth:`unregister` after."""
        self.start()
        event = asyncio.Event()
        self._queues.setdefault(queue, deque()).append(event)
        return event

    def unregister(self, queue: str, event: asyncio.Event) -> None:
        waiting = self._queues.get(queue)
        if waiting is None:
            return
        with contextlib.suppress(ValueError):
            waiting.remove(event)
        if not waiting:
            del self._queues[queue]

    def wake_all(self) -> None:
        """Wake every waiting request (the server is shutting down)."""
        for waiting in self._queues.values():
            for event in waiting:
                event.set()

    def wake(self, queue: str) -> None:
        """Wake the longest-waiting request of ``queue`` not yet woken."""
        for event in self._queues.get(queue, ()):
            if not event.is_set():
                event.set()
                self.wakeups += 1
                return

    async def _run(self) -> None:
        delay = 1.0
        while True:
            try:
                await self._listen()
                delay = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # LISTEN unavailable or the database went away
                log.warning("lease wake-ups: %s; waiters poll; retrying in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _listen(self) -> None:
        async with self.app.subscribe_async() as events:
            self.connections_opened += 1
            async for event in events:
                if event.kind == "resync" or event.queue is None:
                    for queue in list(self._queues):
                        self.wake(queue)
                elif event.kind != "paused":
                    self.wake(event.queue)
