"""Long-poll wake-ups: one LISTEN connection per server, only while someone waits.

Waiting lease requests hold no database connection: each waits on an
:class:`asyncio.Event` of its queue. The server LISTENs on the schema's
channel only while a long poll waits (and :data:`LINGER` seconds after the
last one ends, since a worker polls again at once); an idle server reads no
notification, whoever enqueues. Payloads about queues nobody waits on are
dropped with a string test. The queues named in one batch of notifications
are woken once each, after the batch: per queue, the longest-waiting request.
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

#: Opens a LISTEN session: yields (announcement?, payload) pairs.
Listen = Callable[[], AbstractAsyncContextManager[AsyncIterator[tuple[bool, str]]]]


class Waiters:
    """Lease requests waiting for work, per queue, woken by NOTIFY."""

    def __init__(self, listen: Listen, linger: float = LINGER) -> None:
        self._listen_session = listen
        self.linger = linger
        self._queues: dict[str, deque[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._pending: set[str] = set()  # queues named in the batch being read
        self._flush_scheduled = False
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

    def _note(self, payload: str) -> None:
        """Remember the queue a payload names, if someone waits on it; the
        batch's queues are woken once each, after it (one loop turn)."""
        self.notifications += 1
        queue = wake_queue(payload)
        if queue is None or queue not in self._queues:
            return
        self._pending.add(queue)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, set()
        for queue in pending:
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
                    async for announcement, payload in payloads:
                        if not announcement:
                            self._note(payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # LISTEN unavailable or the database went away
                log.warning("lease wake-ups: %s; waiters poll; retrying in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
