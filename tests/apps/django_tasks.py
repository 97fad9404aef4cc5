"""Django tasks (``django.tasks`` or the ``django-tasks`` backport) for
tests/test_django_tasks*.py; import once Django's settings name their backends
(see tests/apps/django_settings.py)."""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from django.tasks import TaskContext, task
except ImportError:
    from django_tasks import TaskContext, task


class Boom(Exception):
    """Raised by :func:`explode`."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=50)
def send(to: str, subject: str = "hi") -> dict[str, str]:
    return {"to": to, "subject": subject}


@task
def explode(message: str) -> None:
    raise Boom(message)


@task
def unstorable() -> Any:
    return object()


@task(takes_context=True)
def attempt_info(context: TaskContext, tag: str) -> dict[str, Any]:
    result = context.task_result
    return {
        "tag": tag,
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "worker_ids": result.worker_ids,
    }


@task
async def double(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


@task(takes_context=True, backend="retrying")
def flaky(context: TaskContext) -> int:
    if context.attempt < 2:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt
