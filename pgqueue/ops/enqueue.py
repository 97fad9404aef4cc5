"""Enqueue: validation, task defaults, one statement per batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue import validation
from pgqueue.errors import InvalidOption
from pgqueue.models import Enqueued, JobSpec
from pgqueue.ops import DEFAULT_TASK, Execute, Op, OpContext
from pgqueue.payloads import encode_batch


def job_object(ctx: OpContext, spec: JobSpec) -> dict[str, Any]:
    """The JSON object of one job for ``enqueue_batch``; keys equal to the
    database defaults are left out to keep large batches small."""
    task = validation.task_name(spec.task)
    defaults = ctx.task_defaults(task)
    obj: dict[str, Any] = {"task": task, "payload": validation.payload_object(spec.payload)}
    queue = validation.queue_name(spec.queue if spec.queue is not None else defaults.queue)
    if queue != DEFAULT_TASK.queue:
        obj["queue"] = queue
    priority = validation.priority(
        spec.priority if spec.priority is not None else defaults.priority
    )
    if priority:
        obj["priority"] = priority
    if spec.run_at is not None and spec.delay is not None:
        raise InvalidOption("give run_at or delay, not both")
    if spec.delay is not None:
        if wait := validation.seconds("delay", spec.delay):
            obj["delay"] = wait
    elif spec.run_at is not None:
        obj["run_at"] = validation.aware("run_at", spec.run_at).isoformat()
    max_attempts = validation.positive_int(
        "max_attempts",
        spec.max_attempts if spec.max_attempts is not None else defaults.max_attempts,
    )
    if max_attempts != DEFAULT_TASK.max_attempts:
        obj["max_attempts"] = max_attempts
    if defaults.lease_seconds != DEFAULT_TASK.lease_seconds:
        obj["lease_seconds"] = defaults.lease_seconds
    if defaults.backoff is not None:
        obj["backoff"] = defaults.backoff
    if (dedup_key := validation.key("dedup_key", spec.dedup_key)) is not None:
        obj["dedup_key"] = dedup_key
    if (serial_key := validation.key("serial_key", spec.serial_key)) is not None:
        obj["serial_key"] = serial_key
    return obj


def enqueue_many(ctx: OpContext, specs: Sequence[JobSpec]) -> Op[list[Enqueued]]:
    """Enqueue every spec in one statement (all or nothing). Validates now,
    before any connection is taken."""
    if isinstance(specs, JobSpec | str | bytes) or not isinstance(specs, Sequence):
        raise InvalidOption("enqueue_many takes a list of pgqueue.JobSpec")
    for spec in specs:
        if not isinstance(spec, JobSpec):
            raise InvalidOption(f"enqueue_many takes JobSpec items, got {spec!r}")
    if not specs:
        return _nothing()
    return _insert(encode_batch([job_object(ctx, s) for s in specs], ctx.max_payload_bytes))


def enqueue_one(ctx: OpContext, spec: JobSpec) -> Op[Enqueued]:
    """Enqueue one job."""
    return _first(_insert(encode_batch([job_object(ctx, spec)], ctx.max_payload_bytes)))


def _insert(doc: str) -> Op[list[Enqueued]]:
    rows = yield Execute("job_enqueue_batch", {"jobs": doc})
    return [Enqueued(job_id, created) for job_id, created in rows]


def _first(op: Op[list[Enqueued]]) -> Op[Enqueued]:
    results = yield from op
    return results[0]


def _nothing() -> Op[list[Enqueued]]:
    return []
    yield  # pragma: no cover - makes this a generator
