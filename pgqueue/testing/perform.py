"""``perform``: call one task's function as a worker would, without a database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
    """Run ``task``'s function on ``payload`` and return what it returns;
    its exceptions (``Retry``, ``Permanent``, ...) propagate::

        assert perform(send_receipt, {"order_id": 42}) == "sent"

    The payload goes through JSON first, as an enqueued one does (a tuple
    arrives as a list; what JSON cannot hold raises InvalidPayload). With
    ``pass_context=True`` the task gets a :class:`pgqueue.JobContext` with
    ``job_id`` 0, this ``attempt``, and ``should_stop()`` False;
    ``context.transaction()`` needs a worker (use :func:`drain`). No timeout
    applies. Async tasks run to completion on a new event loop; in async code
    use :func:`perform_async`.
    """
    result = _call(task, payload, attempt)
    if not task.is_async:
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(result)
    result.close()
    raise RuntimeError(f"task {task.name!r} is async: in async code use `await perform_async(...)`")


async def perform_async(
    task: Task[Any, Any], payload: Mapping[str, Any] | None = None, *, attempt: int = 1
) -> Any:
    """Async twin of :func:`perform`: awaits an async task on the running
    loop; a sync task runs in a thread, as in a worker."""
    if task.is_async:
        return await _call(task, payload, attempt)
    kwargs = _kwargs(task, payload, attempt)
    return await asyncio.to_thread(task.func, **kwargs)


def _call(task: Task[Any, Any], payload: Mapping[str, Any] | None, attempt: int) -> Any:
    return task.func(**_kwargs(task, payload, attempt))


def _kwargs(
    task: Task[Any, Any], payload: Mapping[str, Any] | None, attempt: int
) -> dict[str, Any]:
    attempt = validation.positive_int("attempt", attempt)
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise InvalidPayload(f"payload must be a mapping (a JSON object), got {payload!r}")
    kwargs: dict[str, Any] = json.loads(encode_payload(dict(payload), task.app.max_payload_bytes))
    if task.pass_context:
        kwargs["context"] = JobContext(0, attempt, 0, task.queue, task.name)
    return kwargs
