"""``perform``: call one task's function (inside its App's middleware) as a
worker would, without a database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from pgqueue import middleware as mw
from pgqueue import validation
from pgqueue.context import JobContext
from pgqueue.errors import InvalidPayload
from pgqueue.payloads import encode_payload

if TYPE_CHECKING:
    from pgqueue.task import Task

__all__ = ["perform", "perform_async"]


def perform(
    task: Task[Any, Any], payload: Mapping[str, Any] | None = None, *, attempt: int = 1
) -> Any:
    """Run ``task`` on ``payload`` inside its App's middleware, as a worker
    would, and return what that returns; exceptions (``Retry``,
    ``Permanent``, ...) propagate::

        assert perform(send_receipt, {"order_id": 42}) == "sent"

    The payload goes through JSON first, as an enqueued one does (a tuple
    arrives as a list; what JSON cannot hold raises InvalidPayload). The
    task and its middleware get a :class:`pgqueue.JobContext` with
    ``job_id`` 0, this ``attempt``, no tags or meta, and ``should_stop()``
    False; a sync task runs inside each middleware's ``process``, an async
    one inside ``process_async``, the first middleware outermost (a
    middleware that rewrites the result rewrites what ``perform`` returns).
    Nothing is written: ``before_enqueue`` does not run (no job is
    enqueued), ``context.transaction()`` needs a worker and
    ``context.dependency_results()`` is empty (use :func:`drain` for both).
    No timeout applies. Async tasks run to completion on a new event loop;
    in async code use :func:`perform_async`.
    """
    if task.is_async:
        coro = perform_async(task, payload, attempt=attempt)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        coro.close()
        raise RuntimeError(
            f"task {task.name!r} is async: in async code use `await perform_async(...)`"
        )
    return _run_sync(task, payload, attempt)


async def perform_async(
    task: Task[Any, Any], payload: Mapping[str, Any] | None = None, *, attempt: int = 1
) -> Any:
    """Async twin of :func:`perform`: awaits an async task (inside the
    middleware's ``process_async``) on the running loop; a sync task runs
    (inside ``process``) in a thread, as in a worker."""
    if not task.is_async:
        return await asyncio.to_thread(_run_sync, task, payload, attempt)
    context, kwargs = _prepare(task, payload, attempt)
    call = partial(task.func, **kwargs)
    middleware = tuple(task.app.middleware)
    if not middleware:
        return await call()
    return await mw.run_async(middleware, context, call)


def _run_sync(task: Task[Any, Any], payload: Mapping[str, Any] | None, attempt: int) -> Any:
    context, kwargs = _prepare(task, payload, attempt)
    call = partial(task.func, **kwargs)
    middleware = tuple(task.app.middleware)
    return mw.run_sync(middleware, context, call) if middleware else call()


def _prepare(
    task: Task[Any, Any], payload: Mapping[str, Any] | None, attempt: int
) -> tuple[JobContext, dict[str, Any]]:
    """The context and the keyword arguments of one run (payload validated first)."""
    attempt = validation.positive_int("attempt", attempt)
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise InvalidPayload(f"payload must be a mapping (a JSON object), got {payload!r}")
    kwargs: dict[str, Any] = json.loads(encode_payload(dict(payload), task.app.max_payload_bytes))
    context = JobContext(0, attempt, 0, task.queue, task.name)
    if task.pass_context:
        kwargs["context"] = context
    return context, kwargs
