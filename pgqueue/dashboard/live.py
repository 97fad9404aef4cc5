"""Live updates: one database listener per dashboard process, fanned out.

The hub reads the App's event stream (``app.subscribe_async()``: the
process's one LISTEN connection; enqueues, finishes, pauses) and, every ``mark_interval``
seconds, reads a cheap change mark (newest id, newest finish per outcome,
queue and worker updates: a few index probes) to catch what does not notify
(a plain ack). Whatever it sees is coalesced: browsers get at most one
``refresh`` event per ``min_interval`` seconds, however busy the queue and
however many browsers are connected. The hub starts with the first browser
and stops with the last. A stream opens once the hub listens and has read
its first mark (:meth:`LiveHub.wait_ready`): a change made after the browser
saw the stream open is never folded into that first mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.dashboard.data import Data

log = logging.getLogger("pgqueue.dashboard")


class LiveHub:
    """Fans one LISTEN connection out to any number of browser streams."""

    def __init__(
        self,
        data: Data,
        *,
        min_interval: float = 0.5,
        mark_interval: float = 2.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.data = data
        self.on_change = on_change  # e.g. drop cached page data before browsers refetch
        self.min_interval = min_interval
        self.mark_interval = mark_interval
        self._clients: set[asyncio.Queue[str]] = set()
        self._task: asyncio.Task[None] | None = None
        self.refreshes = 0  # events sent (per browser once), for tests and benchmarks
        self.connections_opened = 0
        self._ready = asyncio.Event()  # listening, first mark read

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def subscribe(self) -> asyncio.Queue[str]:
        """A queue that receives "refresh" (at most one pending at a time)."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._clients.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return queue

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the hub listens and has read its first change mark, or
        ``timeout`` seconds (the database may be down: the hub keeps trying)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        self._clients.discard(queue)
        if not self._clients and self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        self._clients.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _broadcast(self) -> None:
        if self.on_change is not None:
            self.on_change()
        for queue in self._clients:
            if queue.empty():  # coalesce: one pending refresh is enough
                queue.put_nowait("refresh")
                self.refreshes += 1

    async def _run(self) -> None:
        delay = 1.0
        while self._clients:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: retry, browsers keep their page
                log.warning("dashboard live updates: %s; retrying in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _listen(self) -> None:
        # The App's event stream (app.subscribe_async) holds the process's one
        # LISTEN connection; the change mark, read through the pool, catches
        # what does not notify.
        try:
            async with self.data.app.subscribe_async() as events:
                self.connections_opened += 1
                await self._follow(events)
        finally:
            self._ready.clear()

    async def _follow(self, events: Any) -> None:
        loop = asyncio.get_running_loop()
        mark: Any = await self.data.change_mark()
        self._ready.set()
        next_mark = loop.time() + self.mark_interval
        while self._clients:
            changed = False
            deadline = loop.time() + self.min_interval
            while (left := deadline - loop.time()) > 0:
                if await events.get(timeout=left) is None:
                    break
                changed = True
            if loop.time() >= next_mark:
                new_mark = await self.data.change_mark()
                changed = changed or new_mark != mark
                mark, next_mark = new_mark, loop.time() + self.mark_interval
            if changed:
                self._broadcast()
                await asyncio.sleep(self.min_interval)
