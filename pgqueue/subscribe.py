"""``app.subscribe()``: the NOTIFY channel as a stream of :class:`JobEvent`.

One listener per App serves every subscription of that App: a thread with a
dedicated autocommit connection that LISTENs, turns payloads into events
(:mod:`pgqueue.events`) and hands each to every subscription's inbox. An
inbox is bounded: when its consumer falls ``buffer`` events behind, the
backlog is dropped and replaced by one ``resync`` event, so memory never
grows with a slow consumer. One listener rather than one connection per
subscription: 100 subscriptions hold 1 server connection instead of 100,
open in ~0.1 ms each instead of ~5 ms, and a notification is read once per
App (figures in the README's "Event stream" section).

The listener also notices when scheduled jobs and retries become due: a
notification ``w:<queue>`` (or a plain ``j:<queue>`` of a batch) says one
may have been stored, and the listener asks the
database (one read of the scheduled-jobs index) when the next one is due
and, at that time, which queues got due work. Nothing on the enqueue path
or in the workers pays for it, and it works with no worker running or every
worker busy. Workers that stage such jobs also send ``j:<queue>``; a second
``enqueued`` hint for the same work is harmless.

After the connection drops, the listener reconnects with the worker's
backoff and, once it LISTENs again, sends ``resync`` to every subscription.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

import psycopg
import structlog
from psycopg.conninfo import make_conninfo

from pgqueue import validation
from pgqueue.connection import connection_params
from pgqueue.database import Database
from pgqueue.errors import DatabaseError, InvalidOption, ListenUnavailable, PermissionDenied
from pgqueue.events import RESYNC, JobEvent, parse
from pgqueue.ops import events as events_ops
from pgqueue.queries import Queries
from pgqueue.worker.listener import KEEPALIVE, RECONNECT_BACKOFF

log = structlog.get_logger("pgqueue.subscribe")

DEFAULT_BUFFER = 1000
#: application_name of the listener connection, unless the DSN sets one.
APPLICATION_NAME = "pgqueue-events"
#: How soon the listener thread notices that no subscription needs it.
STOP_CHECK = 0.5
#: Rechecks of due work after 'w:' notifications are at least this far apart.
DUE_RECHECK_MIN = 0.05
#: A job stored as scheduled whose run_at passed before its transaction
#: committed is due when first seen: rechecks after 'w:' look back this far.
DUE_LOOKBACK = timedelta(seconds=2)
DUE_BATCH = 1000  # keep equal to the LIMIT of job_became_due


def queue_filter(queues: str | Iterable[str] | None) -> frozenset[str] | None:
    """The validated set of queues to keep (None: every queue)."""
    if queues is None:
        return None
    names = (queues,) if isinstance(queues, str) else tuple(queues)
    return frozenset(validation.queue_name(q) for q in names)


class Inbox:
    """The bounded, thread-safe buffer of one subscription."""

    def __init__(
        self, queues: frozenset[str] | None, buffer: int, wake: Callable[[], None]
    ) -> None:
        self.queues = queues
        self.buffer = buffer
        self.dropped = 0  # events replaced by a resync because the consumer lagged
        self.closed = False
        self._wake = wake
        self._events: deque[JobEvent] = deque()
        self._pending: set[JobEvent] = set()  # enqueued/resync events waiting, to coalesce
        self._lock = threading.Lock()

    def put(self, event: JobEvent) -> None:
        if event.queue is not None and self.queues is not None and event.queue not in self.queues:
            return
        # Equal "new work" hints say nothing new while one waits; state
        # changes (paused, resumed, finished) keep their order and count.
        coalesce = event.kind in ("enqueued", "resync")
        with self._lock:
            if self.closed or (coalesce and event in self._pending):
                return
            if len(self._events) >= self.buffer:
                self.dropped += len(self._events) + 1
                self._events.clear()
                self._pending.clear()
                event, coalesce = RESYNC, True
            self._events.append(event)
            if coalesce:
                self._pending.add(event)
        self._wake()

    def pop(self) -> JobEvent | None:
        with self._lock:
            if not self._events:
                return None
            event = self._events.popleft()
            self._pending.discard(event)
            return event

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._events.clear()
            self._pending.clear()
        self._wake()


class Hub:
    """The one LISTEN connection of an App, shared by its subscriptions."""

    def __init__(
        self,
        dsn: str | None,
        queries: Queries,
        unavailable: str,
    ) -> None:
        self.dsn = dsn
        self.queries = queries
        self.unavailable = unavailable
        self._lock = threading.Lock()
        self._inboxes: set[Inbox] = set()
        self._runner: _Runner | None = None

    # --- subscriptions -------------------------------------------------------

    def attach(self, inbox: Inbox) -> None:
        """Deliver events to ``inbox`` from now on. The first subscription
        opens the connection here, so that a wrong DSN or a database that is
        down raises to the caller; a later one joins the running listener
        (while it reconnects, it gets ``resync`` once it is back)."""
        if self.dsn is None:
            raise ListenUnavailable(self.unavailable)
        with self._lock:
            if self._runner is not None:
                self._inboxes.add(inbox)
                return
        runner = _Runner(self)
        conn = runner.connect()  # outside the lock: may take up to connect_timeout
        with self._lock:
            self._inboxes.add(inbox)
            if self._runner is None:
                self._runner = runner
                runner.start(conn)
                return
        conn.close()  # another subscription started the listener meanwhile

    def detach(self, inbox: Inbox) -> None:
        with self._lock:
            self._inboxes.discard(inbox)
        inbox.close()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the listener and end every subscription (App.close())."""
        with self._lock:
            inboxes, self._inboxes = self._inboxes, set()
            runner, self._runner = self._runner, None
        for inbox in inboxes:
            inbox.close()
        if runner is not None:
            runner.stop.set()
            runner.join(timeout)

    @property
    def subscriptions(self) -> int:
        with self._lock:
            return len(self._inboxes)

    def broadcast(self, event: JobEvent) -> None:
        with self._lock:
            inboxes = list(self._inboxes)
        for inbox in inboxes:
            inbox.put(event)

    def release(self, runner: _Runner) -> bool:
        """Whether ``runner`` should end (no subscription left, or stopped);
        if so it is no longer the App's listener."""
        with self._lock:
            if self._inboxes and not runner.stop.is_set():
                return False
            if self._runner is runner:
                self._runner = None
            return True


class _Runner:
    """The listener thread of a :class:`Hub`: connect, LISTEN, dispatch, reconnect."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.stop = threading.Event()
        self.can_read_jobs = True  # False once the role turned out to lack SELECT on jobs
        self._thread: threading.Thread | None = None
        self._since: Any = None  # database clock of the last due check
        self._next_due: float | None = None  # time.monotonic() when work becomes due
        self._last_check = 0.0
        self._lookback = False  # the next due check follows a 'w:' notification
        #: The driver of the listener connection (made on first connect).
        self.database: Database | None = None

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection that LISTENs, with the due-work clock read."""
        assert self.hub.dsn is not None
        if self.database is None:
            dsn = make_conninfo(connection_params(self.hub.dsn, APPLICATION_NAME), **KEEPALIVE)
            self.database = Database(dsn, self.hub.queries)
        conn = self.database.connect()
        try:
            self.database.listen(conn)
            self._since = None
            self._check_due(conn, lookback=False)
        except BaseException:
            conn.close()
            raise
        return conn

    def start(self, conn: psycopg.Connection[Any]) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(conn,), name="pgqueue-events", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self, conn: psycopg.Connection[Any] | None) -> None:
        delay = RECONNECT_BACKOFF[0]
        while True:
            try:
                if conn is None:
                    conn = self.connect()
                    log.info("event stream listening again; subscribers resync")
                    self.hub.broadcast(RESYNC)
                    delay = RECONNECT_BACKOFF[0]
                self._listen(conn)
                return  # no subscription left
            except Exception as exc:
                if self._idle():
                    return
                known = isinstance(exc, DatabaseError | OSError)
                log.warning(
                    "event stream connection lost; reconnecting",
                    error=str(exc).strip() or type(exc).__name__,
                    retry_in=delay,
                    exc_info=not known,
                )
                self.stop.wait(delay)
                if self._idle():
                    return
                delay = min(delay * 2, RECONNECT_BACKOFF[1])
            finally:
                if conn is not None:
                    conn.close()
                    conn = None

    def _idle(self) -> bool:
        return self.hub.release(self)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        assert self.database is not None
        while not self._idle():
            timeout = STOP_CHECK
            if self._next_due is not None:
                timeout = min(timeout, self._next_due - time.monotonic())
            recheck = False
            # stop_after=1: back here after each batch read from the socket (a
            # job stored as scheduled may be due sooner than we wait), never
            # out of the middle of one: leaving the generator early drops the
            # rest of its batch, notifications that are then lost for good.
            for payload in self.database.notifications(conn, max(timeout, 0.001), stop_after=1):
                event = parse(payload)
                if event is not None:
                    self.hub.broadcast(event)
                    # A batch of many jobs may hold scheduled ones too.
                    recheck |= event.kind == "enqueued" and event.job_id is None
                elif payload.startswith("w:"):
                    recheck = True
            now = time.monotonic()
            if recheck:
                self._lookback = True
                soonest = self._last_check + DUE_RECHECK_MIN
                if now < soonest:  # a burst of retries: one check for all of them
                    self._next_due = min(self._next_due or soonest, soonest)
                    continue
            if recheck or (self._next_due is not None and now >= self._next_due):
                self._check_due(conn, lookback=self._lookback)
                self._lookback = False

    def _check_due(self, conn: psycopg.Connection[Any], *, lookback: bool) -> None:
        """Announce queues whose scheduled jobs became due since the last
        check, and note when the next one is due."""
        self._last_check = time.monotonic()
        if not self.can_read_jobs:
            self._next_due = None
            return
        since = self._since
        if since is not None and lookback:
            since = since - DUE_LOOKBACK
        assert self.database is not None
        try:
            row = self.database.run(events_ops.became_due(since), conn)
        except PermissionDenied:
            # A role without SELECT on jobs (a producer) still gets every
            # event the database sends; only due-time hints need the read.
            log.info("event stream cannot read jobs; due-time events come from workers only")
            self.can_read_jobs = False
            self._next_due = None
            return
        db_now, next_due, last_due, looked_at, queues = row
        for queue, count, job_id in queues:
            self.hub.broadcast(JobEvent("enqueued", queue, job_id if count == 1 else None))
        full = looked_at >= DUE_BATCH
        self._since = last_due if full else db_now
        if full:
            self._next_due = time.monotonic()
        elif next_due is not None:
            self._next_due = time.monotonic() + max((next_due - db_now).total_seconds(), 0.0)
        else:
            self._next_due = None


class EventStream:
    """A subscription: ``with app.subscribe() as events: for ev in events: ...``.

    Iterating blocks until the next event and ends when the stream is
    closed; ``get(timeout)`` returns None when nothing came in time.
    """

    def __init__(self, hub: Hub, queues: frozenset[str] | None, buffer: int) -> None:
        self._hub = hub
        self._ready = threading.Event()
        self._inbox = Inbox(queues, buffer, self._ready.set)
        self._open = False

    @property
    def dropped(self) -> int:
        """Events replaced by ``resync`` because this consumer fell behind."""
        return self._inbox.dropped

    def open(self) -> Self:
        """Start receiving events (``with`` does this)."""
        if not self._open and not self._inbox.closed:
            self._hub.attach(self._inbox)
            self._open = True
        return self

    def close(self) -> None:
        """Stop receiving events; iteration ends."""
        self._hub.detach(self._inbox)

    def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event; None after ``timeout`` seconds or once closed."""
        self.open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.clear()
            event = self._inbox.pop()
            if event is not None or self._inbox.closed:
                return event
            remaining = STOP_CHECK if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Bounded waits keep Ctrl-C responsive on every platform.
            self._ready.wait(min(remaining, STOP_CHECK))

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[JobEvent]:
        return self

    def __next__(self) -> JobEvent:
        event = self.get()
        if event is None:
            raise StopIteration
        return event


class AsyncEventStream:
    """Async twin of :class:`EventStream`:
    ``async with app.subscribe_async() as events: async for ev in events: ...``."""

    def __init__(self, hub: Hub, queues: frozenset[str] | None, buffer: int) -> None:
        self._hub = hub
        self._ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox = Inbox(queues, buffer, self._wake)
        self._open = False

    def _wake(self) -> None:  # called from the listener thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    @property
    def dropped(self) -> int:
        """Events replaced by ``resync`` because this consumer fell behind."""
        return self._inbox.dropped

    async def open(self) -> Self:
        """Start receiving events (``async with`` does this)."""
        if not self._open and not self._inbox.closed:
            self._loop = asyncio.get_running_loop()
            await asyncio.to_thread(self._hub.attach, self._inbox)
            self._open = True
        return self

    async def close(self) -> None:
        """Stop receiving events; iteration ends."""
        self._hub.detach(self._inbox)

    async def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event; None after ``timeout`` seconds or once closed."""
        await self.open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.clear()
            event = self._inbox.pop()
            if event is not None or self._inbox.closed:
                return event
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                return None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> JobEvent:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event


def buffer_size(buffer: int) -> int:
    """A validated inbox size."""
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise InvalidOption(f"buffer must be a positive number of events, got {buffer!r}")
    return buffer
