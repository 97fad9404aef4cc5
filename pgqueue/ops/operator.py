"""Operator actions: cancel jobs (one, by ids or by filters: the one
``job_cancel`` statement), delete a queue, and what ``pgqueue uninstall``
drops (SQL in ``sql/queries/operator.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue import validation
from pgqueue.commands import command
from pgqueue.errors import InvalidJobState, InvalidName, InvalidOption, JobNotFound
from pgqueue.models import JobStatus
from pgqueue.ops import Execute, Op
from pgqueue.ops.inspect import _job_id

#: Visible statuses a bulk cancel may pick.
CANCELLABLE = ("queued", "scheduled", "running", "waiting")


def _statuses(statuses: Sequence[str] | str) -> list[str]:
    chosen = [statuses] if isinstance(statuses, str) else list(statuses)
    if not chosen:
        raise InvalidOption(
            "give at least one status to cancel: queued, scheduled, running or waiting"
        )
    for status in chosen:
        if status not in CANCELLABLE:
            raise InvalidOption(
                f"cannot cancel jobs with status {status!r}: only queued, scheduled, running "
                "or waiting jobs are live"
            )
    return chosen


def cancel_params(
    job_ids: Sequence[int] | None,
    queue: str | None,
    task: str | None,
    statuses: Sequence[str] | str,
    limit: int = 1000,
    *,
    reask: bool = False,
    workflow_id: int | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Validated parameters of a bulk cancel (shared by the count and the batches)."""
    return {
        "job_ids": [_job_id(i) for i in job_ids] if job_ids is not None else None,
        "queue": validation.queue_name(queue) if queue is not None else None,
        "task": validation.task_name(task) if task is not None else None,
        "statuses": _statuses(statuses),
        "limit": validation.positive_int("limit", limit, 100_000),
        "reask": reask,  # ask a running job already asked to stop again
        "workflow_id": workflow_id,
        "reason": reason,  # the last_error of the jobs it cancels
    }


def cancel(job_id: int) -> Op[JobStatus]:
    """Cancel a job: queued/scheduled end cancelled now (returned status
    ``cancelled``); running ones are asked to stop (returned ``running``)."""
    return _cancel(_job_id(job_id))


def _cancel(job_id: int) -> Op[JobStatus]:
    params = cancel_params([job_id], None, None, CANCELLABLE, 1, reask=True)
    rows = yield Execute("job_cancel", params)
    if rows:
        return JobStatus(rows[0][2])
    current = yield Execute("job_status", {"job_id": job_id}, fetch="one")
    if current is None:
        raise JobNotFound(job_id)
    raise InvalidJobState(f"job {job_id} already finished ({current[0]}): nothing to cancel")


def cancel_batch(params: dict[str, Any]) -> Op[list[tuple[int, str, str]]]:
    """Cancel one batch; returns (job id, status before, status after) per job."""
    rows = yield Execute("job_cancel", params)
    return [(int(r[0]), r[1], r[2]) for r in rows]


def count_cancellable(params: dict[str, Any]) -> Op[int]:
    row = yield Execute("job_cancel_count", params, fetch="one")
    return int(row[0]) if row else 0


def job_statuses(job_ids: Sequence[int]) -> Op[dict[int, str]]:
    """The visible status of each job found (live or archived)."""
    ids = [_job_id(i) for i in job_ids]
    rows = yield Execute("job_status_many", {"job_ids": ids})
    return {int(r[0]): r[1] for r in rows}


def queue_names() -> Op[list[str]]:
    rows = yield Execute("queue_list")
    return [r[0] for r in rows]


def delete_queue(queue: str) -> Op[None]:
    """Delete a queue's row and settings; refused while it holds live or dead jobs."""
    return _delete_queue(validation.queue_name(queue))


def _delete_queue(queue: str) -> Op[None]:
    row = yield Execute("queue_delete", {"queue": queue}, fetch="one")
    existed, deleted, blocking = row
    if not existed:
        raise InvalidName(f"unknown queue {queue!r}: nothing to delete")
    if not deleted:
        raise InvalidJobState(
            f"queue {queue!r} still holds {blocking} live or dead job"
            f"{'s' if blocking != 1 else ''}: cancel them (`{command('queue purge ' + queue)}`) "
            "and wait for running ones to end, and requeue or archive dead ones first"
        )


def schema_summary() -> Op[dict[str, int]]:
    """Counts shown before ``uninstall`` drops the schema."""
    row = yield Execute("schema_summary", fetch="one", rows="dict")
    return {k: int(v) for k, v in dict(row).items()}


def drop_schema() -> Op[None]:
    yield Execute("schema_drop", fetch="none")


def drop_scratch_schema() -> Op[None]:
    """Drop the schema if it exists (a scratch schema for a dump)."""
    yield Execute("schema_drop_scratch", fetch="none")


def create_schema() -> Op[None]:
    """Create the empty schema."""
    yield Execute("schema_create", fetch="none")
