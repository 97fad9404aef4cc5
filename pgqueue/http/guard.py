"""Connection limits of ``pgqueue serve``: no one locks the server out
without a token.

A connection costs a file descriptor from the moment it is accepted,
before any token is seen. Uvicorn closes a keep-alive connection idle
between requests (``--keep-alive-timeout``), but not one that never
finishes sending a request's headers, so 400 silent connections used to
exhaust a 256-descriptor limit and lock every client out. Here, per
connection:

- **header timeout**: a connection must finish a request's headers within
  ``header_timeout`` seconds of opening, or of its previous response;
  otherwise it is closed.
- **a cap on open connections** (by default 1,000, or what fits the
  process's open-file limit with room for the pool and one burst of
  accepts): past ``max_connections``, a new
  connection evicts the oldest one that has no request in progress (a
  silent or idle one); only when every connection is busy with a request
  is the new one refused. So idle connections can never keep a client
  with a request out.

- **at shutdown**, a connection accepted a moment before with no request
  yet is given :data:`FRESH_GRACE` seconds to send it (it is served, then
  closed) instead of being closed unanswered: with a listening socket kept
  across restarts (systemd socket activation) no client sees a reset.

The request body has its own deadline (``Api.read_timeout``), and requests
and long polls their caps (``pgqueue.http.limits``). Accept failures (out of
descriptors) are logged at most once per :data:`ACCEPT_LOG_EVERY` seconds,
with a count of the ones not shown.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pgqueue.http")

#: Descriptors kept for the pool, LISTEN and files when the cap is derived from the limit.
RESERVED_FDS = 64
#: The listen backlog, which is also how many connections the event loop
#: accepts in one go before any of them is admitted (or evicts another): the
#: cap leaves room for one such burst.
ACCEPT_BURST = 128
DEFAULT_MAX_CONNECTIONS = 1000
#: Seconds between two log lines about failing accepts.
ACCEPT_LOG_EVERY = 10.0
#: At shutdown, how long a just-accepted connection may take to send its request.
FRESH_GRACE = 1.0


def default_max_connections() -> int:
    """``DEFAULT_MAX_CONNECTIONS``, lowered to fit the process's descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft - RESERVED_FDS - ACCEPT_BURST))


class ConnectionGuard:
    """The open connections of one server, oldest first."""

    def __init__(self, *, max_connections: int, header_timeout: float) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self._open: dict[Any, None] = {}  # protocol -> None, in order of opening
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, protocol: Any) -> bool:
        """Whether ``protocol`` (just connected) may stay; makes room by
        closing the oldest connection with no request in progress."""
        if len(self._open) >= self.max_connections:
            victim = next((p for p in self._open if not busy(p)), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            self.forget(victim)
            victim.transport.close()
        self._open[protocol] = None
        return True

    def forget(self, protocol: Any) -> None:
        self._open.pop(protocol, None)


def busy(protocol: Any) -> bool:
    """Whether a request is in progress on the connection of ``protocol``."""
    cycle = getattr(protocol, "cycle", None)
    return cycle is not None and not cycle.response_complete


def guarded_protocol(
    base: type[asyncio.Protocol], guard: ConnectionGuard
) -> type[asyncio.Protocol]:
    """Uvicorn's HTTP protocol class ``base``, under ``guard``'s limits."""
    base_cls: Any = base

    class Guarded(base_cls):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None
        _fresh = True  # accepted, no request served yet
        _stopping = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if not guard.admit(self):
                transport.close()
                return
            self._arm()

        def shutdown(self) -> None:
            # A connection accepted a moment ago carries a request on its
            # way: closing it now (what uvicorn does) answers nothing, and the
            # client cannot tell whether it was served. Serve that request,
            # then close; close it if none comes within FRESH_GRACE.
            if self._fresh and not busy(self) and not self.transport.is_closing():
                self._stopping = True
                self.loop.call_later(FRESH_GRACE, self._close_if_idle)
                return
            super().shutdown()

        def _close_if_idle(self) -> None:
            if not busy(self):
                super().shutdown()

        def connection_lost(self, exc: Exception | None) -> None:
            guard.forget(self)
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if busy(self):  # the headers are in: the request has its own deadlines
                self._disarm()
                if self._stopping:
                    self.cycle.keep_alive = False  # served, then closed

        def on_response_complete(self) -> None:
            self._fresh = False
            super().on_response_complete()
            if not busy(self):  # the next request's headers: from now
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(guard.header_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if not busy(self) and not self.transport.is_closing():
                guard.timed_out += 1
                guard.forget(self)
                self.transport.close()

    Guarded.__name__ = f"Guarded{base.__name__}"
    return Guarded


class AcceptLogLimit(logging.Filter):
    """Lets through one log record about failing accepts (``Too many open
    files`` and the like) per ``every`` seconds, telling how many it held back."""

    MARKERS = ("accept", "Too many open files", "EMFILE", "ENFILE")

    def __init__(
        self, every: float = ACCEPT_LOG_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.every = every
        self.clock = clock
        self._last = -float("inf")
        self.held_back = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]}"
        if not any(marker in text for marker in self.MARKERS):
            return True
        now = self.clock()
        if now - self._last < self.every:
            self.held_back += 1
            return False
        if self.held_back:
            record.msg = f"{record.getMessage()} ({self.held_back} more like it not logged)"
            record.args = None
            self.held_back = 0
        self._last = now
        return True
