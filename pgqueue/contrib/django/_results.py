"""A pgqueue job seen as a Django ``TaskResult``: status, return value,
errors (one per failed attempt), worker ids and timestamps."""

from __future__ import annotations

import builtins
import re
from typing import Any

from pgqueue.contrib.django import _framework as fw
from pgqueue.models import Attempt, Job

#: Payload keys of a Django task's job (what ``jobs show`` prints).
PAYLOAD_KEYS = frozenset({"task_path", "args", "kwargs", "backend", "run_after"})

# Attempts that ran the task (Django counts one worker id per attempt);
# "released" (handed back unrun) and "snoozed" are not attempts to Django.
_NOT_RUN = frozenset({"released", "snoozed"})
# Attempts that end with an error worth a TaskError.
_ERRORS = frozenset({"failed", "retry", "timeout", "lease_expired"})
# Exception classes for endings that raised nothing in the task itself.
_SYNTHETIC = {
    "timeout": "builtins.TimeoutError",
    "lease_expired": "pgqueue.errors.LeaseLost",
    "unknown_task": "builtins.ImportError",
}
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def is_django_job(job: Job) -> bool:
    """Whether ``job`` was enqueued by :class:`PgQueueBackend` (a plain
    pgqueue job is not a Django task result)."""
    payload = job.payload
    return (
        isinstance(payload, dict)
        and payload.get("task_path") == job.task
        and isinstance(payload.get("args"), list)
        and isinstance(payload.get("kwargs"), dict)
    )


def status_of(job: Job) -> Any:
    """pgqueue's status as Django's ``TaskResultStatus``."""
    status = str(job.status)
    s = fw.TaskResultStatus
    if status == "running":
        return s.RUNNING
    if status == "succeeded":
        return s.SUCCESSFUL
    if status == "dead":
        return s.FAILED
    if status == "cancelled":
        return fw.cancelled_status()
    return s.READY  # queued, scheduled, waiting: not run yet, or to run again


def exception_class_path(attempt: Attempt) -> str:
    """``module.QualName`` of the exception that ended ``attempt``, read from
    its traceback (``traceback`` leaves out ``builtins.``), as Django's own
    backends record it."""
    code = attempt.error_code or ""
    if code in _SYNTHETIC and not attempt.traceback:
        return _SYNTHETIC[code]
    name = _last_exception_line(attempt.traceback or "")
    if name is None or name.rpartition(".")[2] != code.rpartition(".")[2]:
        name = code or "Exception"
    if "." not in name:
        name = (
            f"builtins.{name}"
            if isinstance(getattr(builtins, name, None), type)
            else (f"__main__.{name}")
        )
    return name


def _last_exception_line(trace: str) -> str | None:
    """The type named on the line after the last traceback's frames."""
    lines = trace.splitlines()
    start = max(
        (i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")),
        default=-1,
    )
    for line in lines[start + 1 :]:
        if line[:1].isspace():
            continue
        match = _EXCEPTION_LINE.match(line)
        return match.group(1) if match else None
    return None


def errors_of(job: Job) -> list[Any]:
    """One ``TaskError`` per attempt that ended in an error, oldest first."""
    out = []
    for attempt in job.attempt_history or ():
        if str(attempt.outcome) not in _ERRORS:
            continue
        trace = attempt.traceback or f"{attempt.error_code}: {attempt.error_message}\n"
        out.append(
            fw.TaskError(exception_class_path=exception_class_path(attempt), traceback=trace)
        )
    return out


def from_job(job: Job, task: Any, backend: str) -> Any:
    """The ``TaskResult`` of ``job`` (loaded with ``history=True``) for ``task``."""
    ran = [a for a in job.attempt_history or () if str(a.outcome) not in _NOT_RUN]
    status = status_of(job)
    payload = job.payload
    return fw.task_result(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=ran[0].started_at if ran else None,
        last_attempted_at=ran[-1].started_at if ran else None,
        finished_at=job.finished_at
        if str(job.status) in ("succeeded", "dead", "cancelled")
        else None,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=backend,
        errors=errors_of(job),
        worker_ids=[a.worker_id or "" for a in ran],
        return_value=job.result if status == fw.TaskResultStatus.SUCCESSFUL else None,
    )
