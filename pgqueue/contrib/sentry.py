"""Sentry for pgqueue tasks: ``App(middleware=[SentryMiddleware()])``.

Each attempt runs in its own Sentry isolation scope tagged with the job's id,
task, queue and attempt; an exception the task raises (a snooze, retry
request or cancellation aside) is captured once per attempt and re-raised,
so pgqueue retries or dead-letters the job as usual. Needs ``sentry-sdk``
(``pip install 'pgqueue[sentry]'``) and ``sentry_sdk.init(...)`` in the
worker process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import sentry_sdk

from pgqueue.context import JobContext
from pgqueue.middleware import Middleware
from pgqueue.retry import Retry, Snooze

__all__ = ["SentryMiddleware"]

#: Exceptions that steer a job rather than report a bug.
_NOT_ERRORS: tuple[type[BaseException], ...] = (Snooze, Retry, asyncio.CancelledError)


class SentryMiddleware(Middleware):
    """Report task exceptions to Sentry with the job's tags."""

    def process(self, context: JobContext, call_next: Callable[[], Any]) -> Any:
        with sentry_sdk.isolation_scope() as scope:
            _tag(scope, context)
            try:
                return call_next()
            except _NOT_ERRORS:
                raise
            except Exception as exc:
                scope.capture_exception(exc)
                raise

    async def process_async(
        self, context: JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        with sentry_sdk.isolation_scope() as scope:
            _tag(scope, context)
            try:
                return await call_next()
            except _NOT_ERRORS:
                raise
            except Exception as exc:
                scope.capture_exception(exc)
                raise


def _tag(scope: Any, context: JobContext) -> None:
    scope.set_tag("pgqueue.job_id", str(context.job_id))
    scope.set_tag("pgqueue.task", context.task)
    scope.set_tag("pgqueue.queue", context.queue)
    scope.set_tag("pgqueue.attempt", str(context.attempt))
    scope.set_context(
        "pgqueue",
        {
            "job_id": context.job_id,
            "task": context.task,
            "queue": context.queue,
            "attempt": context.attempt,
            "tags": context.tags,
        },
    )
