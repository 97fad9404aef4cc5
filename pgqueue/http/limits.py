"""Fair use of one HTTP API: requests and long polls in flight, and
per-token request rates.

- ``max_requests``: requests being served at once; past it, ``503 busy``
  (with ``Retry-After``) before any work is done.
- ``max_long_polls``: lease requests waiting for work at once (each holds a
  connection, though no database session); past it, ``503 busy``.
- ``max_long_polls_per_token``: the same, per token, so that one client
  cannot take every slot; past it, ``429 rate_limited``.
- ``rates``: per token and per kind of request (``enqueue``: jobs and
  events, ``lease``,
  ``complete``: ack/fail/nack/extend, ``read``: get/metrics/openapi,
  ``admin``: cancel/requeue), ``COUNT/PERIOD`` such as ``100/1s``: a token
  bucket of COUNT requests refilled over PERIOD. Past it, ``429
  rate_limited`` with ``Retry-After``. Off by default.

Limits are per server process, in memory: a fleet of servers behind a
proxy multiplies them.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pgqueue.errors import InvalidOption
from pgqueue.http.schemas import ApiError
from pgqueue.ops.admin import parse_rate

Category = Literal["enqueue", "lease", "complete", "read", "admin"]
CATEGORIES: tuple[Category, ...] = ("enqueue", "lease", "complete", "read", "admin")

DEFAULT_MAX_REQUESTS = 1000
DEFAULT_MAX_LONG_POLLS = 500


class Busy(ApiError):
    """503: the server is at a capacity limit; retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(503, "busy", message)
        self.retry_after = retry_after


class RateLimited(ApiError):
    """429: this token is past one of its limits; retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(429, "rate_limited", message)
        self.retry_after = retry_after


def parse_rates(given: Mapping[str, str] | None) -> dict[Category, tuple[int, float]]:
    """``{"enqueue": "100/1s"}`` -> ``{"enqueue": (100, 1.0)}``, checked."""
    out: dict[Category, tuple[int, float]] = {}
    for name, rate in (given or {}).items():
        category = next((c for c in CATEGORIES if c == name), None)
        if category is None:
            raise InvalidOption(
                f"unknown request kind {name!r} for a rate limit: one of {', '.join(CATEGORIES)}"
            )
        out[category] = parse_rate(rate)
    return out


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Limits:
    """The limits of one HTTP API and what is in flight against them."""

    max_requests: int = DEFAULT_MAX_REQUESTS
    max_long_polls: int = DEFAULT_MAX_LONG_POLLS
    max_long_polls_per_token: int | None = None
    rates: dict[Category, tuple[int, float]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    requests: int = field(default=0, init=False)
    long_polls: int = field(default=0, init=False)
    _polls_by_token: dict[int, int] = field(default_factory=dict, init=False)
    _buckets: dict[tuple[int, Category], _Bucket] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_long_polls", "max_long_polls_per_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidOption(f"{name} must be a whole number of at least 1, got {value!r}")

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One request in flight; :class:`Busy` past ``max_requests``."""
        if self.requests >= self.max_requests:
            raise Busy(f"the server is serving {self.max_requests} requests; retry")
        self.requests += 1
        try:
            yield
        finally:
            self.requests -= 1

    @contextlib.contextmanager
    def long_poll(self, token: int) -> Iterator[None]:
        """One waiting lease of ``token``; :class:`Busy` / :class:`RateLimited` past the caps."""
        held = self._polls_by_token.get(token, 0)
        if self.max_long_polls_per_token is not None and held >= self.max_long_polls_per_token:
            raise RateLimited(
                f"this token already holds {held} long polls (at most "
                f"{self.max_long_polls_per_token}); retry",
                1.0,
            )
        if self.long_polls >= self.max_long_polls:
            raise Busy(f"{self.max_long_polls} long polls wait already; retry")
        self.long_polls += 1
        self._polls_by_token[token] = held + 1
        try:
            yield
        finally:
            self.long_polls -= 1
            left = self._polls_by_token[token] - 1
            if left:
                self._polls_by_token[token] = left
            else:
                del self._polls_by_token[token]

    def charge(self, token: int, category: Category) -> None:
        """Count one request of ``category`` against ``token``'s rate, if it has one."""
        rate = self.rates.get(category)
        if rate is None:
            return
        count, period = rate
        now = self.clock()
        key = (token, category)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(count), now)
        else:
            bucket.tokens = min(float(count), bucket.tokens + (now - bucket.at) * count / period)
            bucket.at = now
        if bucket.tokens < 1.0:
            wait = (1.0 - bucket.tokens) * period / count
            raise RateLimited(
                f"this token may make {count} {category} requests per {period:g}s; "
                f"retry in {wait:.2f}s",
                wait,
            )
        bucket.tokens -= 1.0


def retry_after(error: ApiError) -> str | None:
    """The ``Retry-After`` header (whole seconds) of a limit's answer."""
    seconds = getattr(error, "retry_after", None)
    return None if seconds is None else str(max(1, math.ceil(seconds)))
