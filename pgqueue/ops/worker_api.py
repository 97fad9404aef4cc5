"""The SQL worker API as the HTTP API calls it (``sql/queries/http.sql``).

Each op runs on the caller's connection: the HTTP API's session as the
role of the request's token, so the database checks what that role may do
(the functions are the ones any language's worker calls: ``lease``,
``ack``, ``fail``, ``nack``, ``extend``). Results and errors are the
functions' own; the HTTP API words its answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from pgqueue.ops import Execute, Op

__all__ = [
    "JobState",
    "ack",
    "ack_many",
    "extend",
    "extend_many",
    "fail",
    "job_state",
    "lease",
    "nack",
]


def lease(queue: str, worker_id: str, count: int) -> Op[list[dict[str, Any]]]:
    """Up to ``count`` jobs of ``queue``, leased to ``worker_id``."""
    rows = yield Execute("worker_api_lease", {"queue": queue, "worker_id": worker_id, "max": count})
    return [
        {"job_id": r[0], "attempt_id": r[1], "attempt": r[2], "task": r[3],
         "payload": r[4], "lease_expires_at": r[5]}
        for r in rows
    ]  # fmt: skip


def extend_many(
    job_ids: Sequence[int], attempt_ids: Sequence[int], seconds: int
) -> Op[dict[int, datetime]]:
    """The new lease expiry of each held lease extended by ``seconds``
    (counted from the transaction's start)."""
    rows = yield Execute(
        "worker_api_extend_many",
        {"job_ids": list(job_ids), "attempt_ids": list(attempt_ids), "seconds": seconds},
    )
    return {r[0]: r[1] for r in rows}


def extend(job_id: int, attempt_id: int, seconds: int) -> Op[datetime | None]:
    """The new lease expiry, None when the attempt no longer holds the job."""
    row = yield Execute(
        "worker_api_extend",
        {"job_id": job_id, "attempt_id": attempt_id, "seconds": seconds},
        fetch="one",
    )
    return row[1] if row and row[0] else None


class JobState(NamedTuple):
    status: str
    cancel_requested: bool


def job_state(job_id: int) -> Op[JobState | None]:
    """The job's status and whether a cancel was asked; None: no such job."""
    row = yield Execute("worker_api_job_status", {"job_id": job_id}, fetch="one")
    return None if row is None else JobState(row[0], bool(row[1]))


def ack(job_id: int, attempt_id: int, result: str | None) -> Op[bool]:
    """Ack one attempt (``result``: JSON text or None); False when not held."""
    row = yield Execute(
        "worker_api_ack",
        {"job_id": job_id, "attempt_id": attempt_id, "result": result},
        fetch="one",
    )
    return bool(row and row[0])


def fail(
    job_id: int, attempt_id: int, error: str, retry_at: datetime | None, permanent: bool
) -> Op[str | None]:
    """Record a failed attempt: the job's status after it, None when not held."""
    row = yield Execute(
        "worker_api_fail",
        {"job_id": job_id, "attempt_id": attempt_id, "error": error,
         "retry_at": retry_at, "permanent": permanent},
        fetch="one",
    )  # fmt: skip
    return row[0] if row and row[0] else None


def nack(job_id: int, attempt_id: int) -> Op[bool]:
    """Hand an attempt back unrun; False when not held."""
    row = yield Execute(
        "worker_api_nack", {"job_id": job_id, "attempt_id": attempt_id}, fetch="one"
    )
    return bool(row and row[0])


def ack_many(
    job_ids: Sequence[int], attempt_ids: Sequence[int], results: Sequence[str | None]
) -> Op[set[int]]:
    """Ack attempts (``results``: JSON texts or None) in one statement: the
    ids of the jobs still held."""
    if all(r is None for r in results):
        rows = yield Execute(
            "worker_api_ack_many", {"job_ids": list(job_ids), "attempt_ids": list(attempt_ids)}
        )
    else:
        rows = yield Execute(
            "worker_api_ack_results",
            {"job_ids": list(job_ids), "attempt_ids": list(attempt_ids), "results": list(results)},
        )
    return {r[0] for r in rows}
