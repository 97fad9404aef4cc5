"""What is enqueued: ``enqueued_jobs``, ``assert_enqueued``, ``refute_enqueued``.

A failed assertion lists what is enqueued, closest to the expectation
first, with what differs from it, so the test's output says what happened.
"""

from __future__ import annotations

import pprint
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgqueue.models import Job, JobStatus

if TYPE_CHECKING:
    from pgqueue.app import App
    from pgqueue.task import Task

__all__ = ["assert_enqueued", "enqueued_jobs", "refute_enqueued"]

#: Statuses of a job that has not run yet (``waiting``: once workflows exist).
ENQUEUED = tuple(s for s in JobStatus if s.value in ("queued", "scheduled", "waiting"))
PAGE = 1000
SHOWN = 10  # jobs listed in a failed assertion's message


def enqueued_jobs(
    app: App,
    task: Task[Any, Any] | str | None = None,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Jobs not run yet (queued, scheduled or waiting), oldest first, of
    ``task`` (a Task or a name) and ``queue``, whose payload contains
    ``payload`` (a subset: nested objects match as subsets too)."""
    expected = _Expected.of(task, queue, payload)
    jobs = _all_enqueued(app, expected.task, expected.queue)
    return [job for job in jobs if not expected.differences(job)]


def assert_enqueued(
    app: App,
    task: Task[Any, Any] | str | None = None,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that jobs like this are enqueued (at least one, or exactly
    ``count``) and return them::

        [job] = assert_enqueued(app, send_receipt, payload={"order_id": 42}, count=1)

    Raises AssertionError listing what is enqueued, closest first.
    """
    expected = _Expected.of(task, queue, payload)
    jobs = _all_enqueued(app)  # all of them: the closest may be in another queue
    found = [job for job in jobs if not expected.differences(job)]
    if (count is None and found) or len(found) == count:
        return found
    wanted = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {wanted} enqueued job{'' if count in (None, 1) else 's'} {expected}, "
        f"found {len(found)}\n{_listing(app, jobs, expected)}"
    )


def refute_enqueued(
    app: App,
    task: Task[Any, Any] | str | None = None,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> None:
    """Assert that no job like this is enqueued; the AssertionError lists the ones that are."""
    expected = _Expected.of(task, queue, payload)
    found = [
        job
        for job in _all_enqueued(app, expected.task, expected.queue)
        if not expected.differences(job)
    ]
    if found:
        raise AssertionError(
            f"expected no enqueued job {expected}, found {len(found)}\n"
            f"{_listing(app, found, expected)}"
        )


@dataclass(frozen=True, slots=True)
class _Expected:
    task: str | None
    queue: str | None
    payload: Mapping[str, Any] | None

    @classmethod
    def of(
        cls,
        task: Task[Any, Any] | str | None,
        queue: str | None,
        payload: Mapping[str, Any] | None,
    ) -> _Expected:
        name = task if task is None or isinstance(task, str) else task.name
        if payload is not None and not isinstance(payload, Mapping):
            raise TypeError(f"payload must be a mapping to match as a subset, got {payload!r}")
        return cls(name, queue, payload)

    def __str__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in (("task", self.task), ("queue", self.queue)) if v]
        if self.payload is not None:
            parts.append(f"payload ⊇ {dict(self.payload)!r}")
        return "with " + ", ".join(parts) if parts else "(any)"

    def differences(self, job: Job) -> list[str]:
        """What about ``job`` does not match, in words (empty: it matches)."""
        found = []
        if self.task is not None and job.task != self.task:
            found.append(f"task is {job.task!r}, not {self.task!r}")
        if self.queue is not None and job.queue != self.queue:
            found.append(f"queue is {job.queue!r}, not {self.queue!r}")
        if self.payload is not None:
            found.extend(_payload_differences(self.payload, job.payload, "payload"))
        return found


def _payload_differences(expected: Mapping[str, Any], actual: Any, path: str) -> list[str]:
    if not isinstance(actual, Mapping):
        return [f"{path} is {actual!r}, not an object"]
    found = []
    for key, want in expected.items():
        where = f"{path}[{key!r}]"
        if key not in actual:
            found.append(f"{where} is missing (expected {want!r})")
        elif isinstance(want, Mapping):
            found.extend(_payload_differences(want, actual[key], where))
        elif actual[key] != want:
            found.append(f"{where} is {actual[key]!r}, not {want!r}")
    return found


def _all_enqueued(app: App, task: str | None = None, queue: str | None = None) -> list[Job]:
    """Every enqueued job (of ``task`` and ``queue`` when given), oldest first."""
    jobs: list[Job] = []
    for status in ENQUEUED:
        cursor = None
        while True:
            page = app.list_jobs(queue, status, task, limit=PAGE, cursor=cursor)
            jobs.extend(page.jobs)
            if (cursor := page.next_cursor) is None:
                break
    return sorted(jobs, key=lambda job: job.id)


def _listing(app: App, jobs: list[Job], expected: _Expected) -> str:
    if not jobs:
        return f"nothing is enqueued (queued, scheduled or waiting) in schema {app.schema!r}"
    ranked = sorted(jobs, key=lambda job: (len(expected.differences(job)), job.id))
    lines = [f"enqueued ({len(jobs)}, closest first):"]
    for job in ranked[:SHOWN]:
        lines.append(f"  {_describe(job)}")
        lines.extend(f"      - {why}" for why in expected.differences(job))
    if len(jobs) > SHOWN:
        lines.append(f"  ... and {len(jobs) - SHOWN} more")
    return "\n".join(lines)


def _describe(job: Job) -> str:
    payload = pprint.pformat(job.payload, width=10_000, compact=True)
    if len(payload) > 200:
        payload = payload[:197] + "..."
    when = f", run_at {job.run_at:%Y-%m-%d %H:%M:%S%z}" if job.status != "queued" else ""
    return f"job {job.id} {job.task}(queue={job.queue!r}) {job.status}{when} payload={payload}"
