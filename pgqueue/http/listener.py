"""Long-poll wake-ups: one LISTEN connection per server, only while someone waits.

Waiting lease requests hold no database connection: each waits on an
:class:`asyncio.Event` of its queue. The server LISTENs on the schema's
channel only while a long poll waits (and :data:`LINGER` seconds after the
last one ends, since a worker polls again at once); an idle server reads no
notification, whoever enqueues. Payloads about queues nobody waits on are
dropped with a string test. Notifications are read in batches (a burst
within :data:`BATCH_WINDOW` of its first is one batch, one wake-up of the
loop), and the queues a batch names are woken once each: per queue, the
longest-waiting request.
A request that then leases a full batch wakes the next one (there may be
more work); one that gets less does not. So a burst of enqueues costs one
lease statement per waiting queue, not one per notification or per waiter.
After (re)connecting, one waiter per queue is woken (notifications may have
been missed). Waiters also retry on their own every ``poll_interval``
seconds (jobs that become due later send no notification), and when LISTEN
is unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from pgqueue.events import wake_queue

log = logging.getLogger("pgqueue.http")

#: Seconds the server keeps listening after the last long poll ended.
LINGER = 5.0

#: Seconds the listener waits after a notification for the rest of its burst.
BATCH_WINDOW = 0.02

#: Opens a LISTEN session: yields batches of payloads.
Listen = Callable[[], AbstractAsyncContextManager[AsyncIterator[list[str]]]]


class Waiters:
    """Lease requests waiting for work, per queue, woken by NOTIFY."""

    def __init__(self, listen: Listen, linger: float = LINGER) -> None:
        self._listen_session = listen
        self.linger = linger
        self._queues: dict[str, deque[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        #: LISTEN sessions opened and notifications read, for tests and benchmarks.
        self.connections_opened = 0
        self.notifications = 0
        self.wakeups = 0

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def listening(self) -> bool:
        return self._task is not None and not self._task.done()

    def register(self, queue: str) -> asyncio.Event:
        """An event set when ``queue`` may have work; call :meth:`unregister` after."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self.listening:
            self._task = asyncio.get_running_loop().create_task(self._run())
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
        if not self._queues and self.listening and self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(self.linger, self._stop_idle)

    def _stop_idle(self) -> None:
        self._linger = None
        if not self._queues and self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.wake_all()

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

    def _wake_for(self, batch: list[str]) -> None:
        """Wake, once each, the queues a batch of payloads names that someone waits on."""
        self.notifications += len(batch)
        queues = {wake_queue(payload) for payload in batch}
        for queue in queues:
            if queue is not None and queue in self._queues:
                self.wake(queue)

    async def _run(self) -> None:
        delay = 1.0
        while True:
            try:
                async with self._listen_session() as payloads:
                    self.connections_opened += 1
                    delay = 1.0
                    for queue in list(self._queues):  # notifications may have been missed
                        self.wake(queue)
                    async for batch in payloads:
                        self._wake_for(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # LISTEN unavailable or the database went away
                log.warning("lease wake-ups: %s; waiters poll; retrying in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
