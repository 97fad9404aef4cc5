"""Reads of :func:`pgqueue.testing.drain` (``sql/queries/testing.sql``).

A drain without ``with_scheduled`` runs only the jobs that were due when it
began and those enqueued for now while it runs; these reads tell which
queue holds the next such job and whether a leased job is one of them. The
leases, completions and hand-backs themselves are the worker's statements
(:mod:`pgqueue.ops.consume`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from pgqueue.ops import Execute, Op

__all__ = ["QueueHead", "attempt_outcomes", "clock", "is_due", "queue_heads"]


def clock() -> Op[datetime]:
    """The server's wall clock: when a drain begins."""
    row = yield Execute("drain_clock", fetch="one")
    value: datetime = row[0]
    return value


class QueueHead(NamedTuple):
    """A queue holding a job the drain may run, and its next job in lease order."""

    queue: str
    job_id: int
    due: bool  # whether that next job is one the drain may run


def queue_heads(queues: Sequence[str] | None, since: datetime) -> Op[list[QueueHead]]:
    """The queues of ``queues`` (None: all) holding a ready job due by
    ``since`` or when it was enqueued; those whose next job is one come first."""
    rows = yield Execute(
        "drain_queue_heads",
        {"queues": list(queues) if queues is not None else None, "since": since},
    )
    return [QueueHead(str(r[0]), int(r[1]), bool(r[2])) for r in rows]


def is_due(job_id: int, since: datetime) -> Op[bool]:
    """Whether job ``job_id`` was due by ``since`` or when it was enqueued."""
    row = yield Execute("drain_job_due", {"job_id": job_id, "since": since}, fetch="one")
    return bool(row and row[0])


def attempt_outcomes(attempt_ids: Sequence[int]) -> Op[dict[int, str]]:
    """The recorded outcome of each attempt found (``snoozed``, ``failed``...)."""
    rows = yield Execute("attempt_outcomes", {"attempt_ids": list(attempt_ids)})
    return {int(r[0]): str(r[1]) for r in rows}
