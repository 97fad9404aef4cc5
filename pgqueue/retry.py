"""Retry policy and the exceptions a task raises to steer its retries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from pgqueue import validation
from pgqueue.errors import InvalidOption

#: Bounds of a backoff, equal to the database's (sql/schema.sql, jobs_backoff_range).
MAX_BACKOFF_SECONDS = 31_536_000
MAX_BACKOFF_FACTOR = 1000


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: attempt n waits ``min(max, base * factor**(n-1))``
    seconds, then +/- ``jitter`` (a fraction) at random.

    The delay is computed by the database (``retry_delay``) so that a worker's
    failures and the reaper's lease expiries follow the same rule.
    """

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        # The database refuses the same (check_job in sql/schema.sql); NaN fails every test.
        if not (0 <= self.base <= MAX_BACKOFF_SECONDS and 0 <= self.max <= MAX_BACKOFF_SECONDS):
            raise InvalidOption(
                f"Backoff base and max must be from 0 to {MAX_BACKOFF_SECONDS} seconds (one year)"
            )
        if not 1 <= self.factor <= MAX_BACKOFF_FACTOR:
            raise InvalidOption(f"Backoff factor must be from 1 to {MAX_BACKOFF_FACTOR}")
        if not 0 <= self.jitter <= 1:
            raise InvalidOption("Backoff jitter must be between 0 and 1")

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The (lowest, highest) delay in seconds after failed attempt ``attempt``."""
        if self.base <= 0:
            raw = 0.0
        elif self.factor <= 1:
            raw = min(self.max, self.base)
        else:
            # Cap the exponent where the delay passes max: no overflow at any attempt.
            cap = math.log(max(self.max, self.base) / self.base, self.factor) + 1
            raw = min(self.max, self.base * self.factor ** min(max(attempt - 1, 0), cap))
        return max(0.0, raw * (1 - self.jitter)), raw * (1 + self.jitter)

    def as_list(self) -> list[float] | None:
        """The stored form; ``None`` for the default policy (stored as NULLs)."""
        if self == DEFAULT_BACKOFF:
            return None
        # floats: one array type for the driver (Backoff(factor=1) mixes int and float)
        return [float(self.base), float(self.factor), float(self.max), float(self.jitter)]


DEFAULT_BACKOFF = Backoff()


class Retry(Exception):
    """Raise from a task to retry it after ``delay`` (seconds, a timedelta or text like ``"5m"``).

    The attempt counts toward ``max_attempts``; when they are used up the job
    is dead-lettered instead.
    """

    def __init__(self, delay: float | str | timedelta = 0.0, reason: str | None = None) -> None:
        seconds = validation.seconds("Retry delay", delay)
        super().__init__(reason or f"retry requested in {seconds:g}s")
        self.delay = seconds


class Permanent(Exception):
    """Raise from a task to dead-letter the job at once, without retries."""


class Snooze(Exception):
    """Raise from a task to run it again after ``delay`` (seconds, a timedelta or
    text like ``"5m"``) without spending an attempt: "not now".

    The attempt is recorded with outcome ``snoozed``; ``Job.snoozes`` counts
    them; ``max_attempts`` and the backoff of later failures are unaffected.
    """

    def __init__(self, delay: float | str | timedelta = 0.0) -> None:
        seconds = validation.seconds("Snooze delay", delay)
        super().__init__(f"snoozed for {seconds:g}s")
        self.delay = seconds
