"""Middleware: hooks around every task run and every enqueue.

Subclass :class:`Middleware` and override what you need; the defaults pass
through. ``App(middleware=[outer, inner])``: the first is outermost. A
task's timeout covers its middleware, and an exception a middleware raises
counts as the task's (retried, dead-lettered as usual).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.context import JobContext
    from pgqueue.models import JobSpec

__all__ = ["Middleware"]


class Middleware:
    """Pass-through hooks; override any of them."""

    def process(self, context: JobContext, call_next: Callable[[], Any]) -> Any:
        """Wrap a sync task's run (in the task's thread); return its result."""
        return call_next()

    async def process_async(
        self, context: JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Wrap an async task's run; return its result."""
        return await call_next()

    def before_enqueue(self, spec: JobSpec) -> JobSpec:
        """Change a job's options, tags or meta before it is written (return
        the spec to write), or raise to refuse it: nothing is written."""
        return spec


def run_sync(middleware: Sequence[Middleware], context: JobContext, call: Callable[[], Any]) -> Any:
    """``call`` inside every middleware's ``process``, the first outermost."""

    def step(i: int) -> Any:
        if i == len(middleware):
            return call()
        return middleware[i].process(context, lambda: step(i + 1))

    return step(0)


async def run_async(
    middleware: Sequence[Middleware],
    context: JobContext,
    call: Callable[[], Awaitable[Any]],
) -> Any:
    """``call`` inside every middleware's ``process_async``, the first outermost."""

    async def step(i: int) -> Any:
        if i == len(middleware):
            return await call()
        return await middleware[i].process_async(context, lambda: step(i + 1))

    return await step(0)
