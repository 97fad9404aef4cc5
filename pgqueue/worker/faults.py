"""How worker loops ride out database errors.

A transient error (timeout, deadlock, failover, lost connection, ...; see
``DatabaseError.transient``) starts an *episode*: the loop logs one warning,
backs off with jitter, tries again, and logs once more when the database
accepts its statements again. Anything else is fatal: the loop lets it
propagate, and the worker stops gracefully (see ``Worker.fail``).
"""

from __future__ import annotations

import random
import time

import structlog

from pgqueue.errors import DatabaseError
from pgqueue.telemetry.errors import count_database_error

log = structlog.get_logger("pgqueue.worker")


def is_transient(exc: BaseException) -> bool:
    """Whether trying the same statement again later may succeed."""
    return isinstance(exc, DatabaseError) and exc.transient


class Episodes:
    """Backoff and once-per-episode logging of one worker loop's database errors."""

    def __init__(
        self,
        loop: str,
        first: float = 0.1,
        cap: float = 5.0,
        message: str = "database error; retrying until it clears",
    ) -> None:
        self.loop = loop
        self.message = message
        self.first = first
        self.cap = cap
        self.failures = 0
        self.since = 0.0
        self.sqlstates: set[str] = set()
        self.last_error = ""

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Note a failed round; returns the seconds to wait before the next.
        Re-raises ``exc`` when it is not transient."""
        if not is_transient(exc):
            raise exc
        count_database_error(exc)  # pgqueue_database_errors_total{kind}
        self.failures += 1
        state = getattr(exc, "sqlstate", None)
        if state:
            self.sqlstates.add(state)
        self.last_error = str(exc)
        if self.failures == 1:
            self.since = time.monotonic()
            log.warning(
                self.message,
                loop=self.loop,
                error=str(exc),
                error_type=type(exc).__name__,
                sqlstate=getattr(exc, "sqlstate", None),
            )
        ceiling: float = min(self.cap, self.first * 2.0 ** min(self.failures - 1, 30))
        # "Equal jitter": half fixed, half random, so that workers hit by the
        # same fault do not come back in step.
        return ceiling / 2 + random.random() * ceiling / 2

    def succeeded(self) -> None:
        """Note a round that got through; ends the current episode."""
        if self.failures:
            log.info(
                "database usable again",
                loop=self.loop,
                failed_rounds=self.failures,
                seconds=round(time.monotonic() - self.since, 3),
                sqlstates=sorted(self.sqlstates),
                last_error=self.last_error,
            )
            self.failures = 0
            self.sqlstates = set()
