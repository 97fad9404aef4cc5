"""The consumer side: lease, ack, fail, nack, extend, with attempt-id fencing."""

from __future__ import annotations

import json
import traceback as tb
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue import validation
from pgqueue.errors import InvalidOption, LeaseLost
from pgqueue.models import AttemptOutcome, LeasedJob
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.payloads import RESULT_NOT_STORED, UnstoredResult, loads_many, loads_stored
from pgqueue.queries import QueryName

MAX_ERROR_MESSAGE = 4000
MAX_TRACEBACK = 32000


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt to record (the worker batches these)."""

    job_id: int
    attempt_id: int
    outcome: AttemptOutcome
    error_code: str
    error_message: str
    traceback: str | None = None
    retry_at: datetime | None = None
    retry_delay: float | None = None
    permanent: bool = False
    # Set for a task the worker does not know: within this many seconds of
    # the job's creation (or while a live worker knows the task) the job is
    # handed back after retry_delay, not counted; afterwards it goes dead.
    unknown_task_grace: float | None = None


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: an exception's message may hold a
    NUL or a lone surrogate (undecodable bytes), which the driver refuses, and
    one such failure would fail the worker's whole batch of completions."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not validation.unicode_text(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def describe_error(error: BaseException | str) -> tuple[str, str, str | None]:
    """(error code, message, traceback) of an exception or a plain message."""
    if isinstance(error, str):
        return "error", error[:MAX_ERROR_MESSAGE], None
    code = type(error).__name__
    message = str(error)[:MAX_ERROR_MESSAGE] or code
    trace = None
    if error.__traceback__ is not None:
        trace = "".join(tb.format_exception(error))[-MAX_TRACEBACK:]
    return code, message, trace


def _lost(job_ids: list[int], attempt_ids: list[int], held: set[tuple[int, int]]) -> list[int]:
    """Jobs whose presented attempt did not hold the lease (by (job, attempt):
    the same job may be presented by a stale and a current holder at once)."""
    return list(
        dict.fromkeys(j for j, a in zip(job_ids, attempt_ids, strict=True) if (j, a) not in held)
    )


def lease(
    ctx: OpContext,
    queues: str | Sequence[str] | None,
    worker_id: str,
    limit: int,
    lease_seconds: float | None = None,
    *,
    details: bool = False,
) -> Op[list[LeasedJob]]:
    """Lease up to ``limit`` jobs from ``queues`` (None: every queue);
    ``details``: also read each job's wait time and trace context."""
    batch = yield from lease_batch(
        ctx, queues, worker_id, limit, lease_seconds, details=details, after=None
    )
    return batch.jobs


@dataclass(frozen=True, slots=True)
class LeaseBatch:
    """What one lease took: the jobs, and for each queue it took from, the
    lease order key of the last job taken there ``(queue, priority, run_at,
    job_id, ordered)`` for the worker's cursors (``ordered`` False: task
    limits skipped jobs of that queue, no cursor may pass them)."""

    jobs: list[LeasedJob]
    keys: list[tuple[str, int, int, int, bool]]  # run_at in µs since the epoch


def lease_batch(
    ctx: OpContext,
    queues: str | Sequence[str] | None,
    worker_id: str,
    limit: int,
    lease_seconds: float | None = None,
    *,
    details: bool = False,
    after: dict[str, Any] | None,
) -> Op[LeaseBatch]:
    """:func:`lease` starting after the lease cursors ``after`` (queue ->
    ``[priority, run_at ISO, job_id]`` or None for the head; with ``queues``
    None, ``after``'s queues are the ones leased from; ``after`` None: every
    queue from its head)."""
    valid = validation.queue_list(queues)
    names = list(valid) if valid is not None else None
    validation.positive_int("max", limit, 100_000)
    seconds = None
    if lease_seconds is not None:
        seconds = max(
            1, round(validation.seconds("lease_seconds", lease_seconds, allow_zero=False))
        )
    if (
        not isinstance(worker_id, str)
        or not worker_id
        or "\x00" in worker_id
        or not validation.unicode_text(worker_id)
    ):
        raise InvalidOption(
            "worker_id must be a non-empty string without NUL or lone surrogates, "
            f"got {worker_id!r}"
        )
    query: QueryName = "job_lease_observed" if details else "job_lease"
    rows = yield Execute(
        query,
        {
            "queues": names,
            "worker_id": worker_id,
            "limit": limit,
            "lease_seconds": seconds,
            "now": ctx.clock(),
            "after": json.dumps(after, separators=(",", ":")) if after is not None else None,
        },
        raw_json=True,
    )
    # One JSON decode for the whole batch instead of one per row.
    payloads = loads_many([row[5] for row in rows])
    keys = _last_keys(rows)
    if query == "job_lease":
        jobs = [
            LeasedJob(
                r[0], r[1], r[2], r[3], r[4], payload, r[6], r[7], None, None,
                r[8], r[9] and loads_stored(r[9]), r[10],
            )
            for r, payload in zip(rows, payloads, strict=True)
        ]  # fmt: skip
        return LeaseBatch(jobs, keys)
    traces = loads_many([row[9] for row in rows])
    jobs = [
        LeasedJob(
            r[0], r[1], r[2], r[3], r[4], payload, r[6], r[7], r[8], trace,
            r[10], r[11] and loads_stored(r[11]), r[12],
        )
        for r, payload, trace in zip(rows, payloads, traces, strict=True)
    ]  # fmt: skip
    return LeaseBatch(jobs, keys)


def _last_keys(rows: Sequence[Any]) -> list[tuple[str, int, int, int, bool]]:
    """The lease order key of each queue's last row (rows come in lease order
    per queue); a cursor only needs that one, so no key object per job."""
    unordered = {r[4] for r in rows if not r[-1]}
    left = {r[4] for r in rows}
    keys = []
    for r in reversed(rows):
        if r[4] in left:
            left.discard(r[4])
            keys.append((r[4], r[-3], r[-2], r[0], r[4] not in unordered))
            if not left:
                break
    return keys


def ready_queues() -> Op[list[str]]:
    """The queues holding ready jobs (an every-queue worker's discovery)."""
    rows = yield Execute("job_ready_queues", {})
    return [r[0] for r in rows]


def ack_many(
    ctx: OpContext, leased: Sequence[LeasedJob], results: Sequence[str | None] | None = None
) -> Op[None]:
    """Finish jobs successfully; raises LeaseLost naming those whose lease was lost
    (the others are acked). ``results`` are JSON texts (or None), one per job."""
    return ack_ids(
        ctx,
        [j.job_id for j in leased],
        [j.attempt_id for j in leased],
        list(results) if results is not None else [None] * len(leased),
    )


def ack_ids(
    ctx: OpContext, job_ids: list[int], attempt_ids: list[int], results: list[str | None]
) -> Op[None]:
    """:func:`ack_many` on parallel lists, as the worker's completer keeps them."""
    if not job_ids:
        return
    if results.count(None) == len(results):  # no task returned anything: the usual batch
        stored: Any = _null_array(len(results))
        unstored: Any = stored
    else:
        # A result that could not be stored succeeds without one, with the reason
        # in last_error (result() then raises ResultNotStored).
        unstored = [
            RESULT_NOT_STORED + r if isinstance(r, UnstoredResult) else None for r in results
        ]
        stored = [None if isinstance(r, UnstoredResult) else r for r in results]
    rows = yield Execute(
        "job_ack_many",
        {
            "job_ids": _bigint_array(job_ids),
            "attempt_ids": _bigint_array(attempt_ids),
            "results": stored,
            "result_errors": unstored,
            "now": ctx.clock(),
        },
    )
    # Each held lease returns one row: as many rows as jobs means none was lost.
    if len(rows) != len(job_ids) and (
        lost := _lost(job_ids, attempt_ids, {(r[0], r[1]) for r in rows})
    ):
        raise LeaseLost(lost)


def _bigint_array(values: list[int]) -> str | list[int]:
    """A list of ints as a PostgreSQL array literal: the query casts it
    (``::bigint[]``); psycopg's list dumper costs a few µs per element more.
    Anything but plain ints is left to the dumper (and its errors)."""
    if set(map(type, values)) == {int}:
        return "{" + ",".join(map(str, values)) + "}"
    return values


def _null_array(n: int) -> str:
    return "{" + ",".join(["NULL"] * n) + "}"


def fail_many(ctx: OpContext, failures: Sequence[Failure]) -> Op[dict[int, str]]:
    """Record failed attempts; returns {job_id: new status} of those that held
    their lease and raises LeaseLost for the others after recording the rest."""
    return _fail(ctx, list(failures))


def _fail(ctx: OpContext, failures: list[Failure]) -> Op[dict[int, str]]:
    if not failures:
        return {}
    rows = yield Execute(
        "job_fail_many",
        {
            "job_ids": [f.job_id for f in failures],
            "attempt_ids": [f.attempt_id for f in failures],
            "outcomes": [f.outcome.value for f in failures],
            "retry_ats": [f.retry_at for f in failures],
            "retry_delays": [f.retry_delay for f in failures],
            "permanent": [f.permanent for f in failures],
            "error_codes": [storable(f.error_code) for f in failures],
            "error_messages": [storable(f.error_message) for f in failures],
            "tracebacks": [f.traceback and storable(f.traceback) for f in failures],
            "graces": [f.unknown_task_grace for f in failures],
            "now": ctx.clock(),
        },
    )
    lost = _lost(
        [f.job_id for f in failures], [f.attempt_id for f in failures], {(r[0], r[1]) for r in rows}
    )
    if lost:
        raise LeaseLost(lost)
    return {job_id: status for job_id, _attempt, status in rows}


def fail(
    ctx: OpContext,
    leased: LeasedJob,
    error: BaseException | str,
    retry_at: datetime | None = None,
    permanent: bool = False,
) -> Op[str]:
    """Record a failed attempt: retried (at ``retry_at`` or after the job's
    backoff), or dead when permanent or out of attempts. Returns the new status."""
    if not isinstance(error, BaseException | str):
        raise InvalidOption("error must be an exception or a string")
    code, message, trace = describe_error(error)
    failure = Failure(
        leased.job_id,
        leased.attempt_id,
        AttemptOutcome.FAILED,
        code,
        message,
        trace,
        validation.aware("retry_at", retry_at) if retry_at is not None else None,
        permanent=bool(permanent),
    )
    return _single_status(_fail(ctx, [failure]), leased.job_id)


def _single_status(op: Op[dict[int, str]], job_id: int) -> Op[str]:
    statuses = yield from op
    return statuses[job_id]


def nack_many(ctx: OpContext, leased: Sequence[LeasedJob]) -> Op[None]:
    """Hand jobs back unrun (not counted toward max_attempts)."""
    return _nack(ctx, [j.job_id for j in leased], [j.attempt_id for j in leased])


def _nack(ctx: OpContext, job_ids: list[int], attempt_ids: list[int]) -> Op[None]:
    if not job_ids:
        return
    rows = yield Execute(
        "job_nack_many", {"job_ids": job_ids, "attempt_ids": attempt_ids, "now": ctx.clock()}
    )
    if lost := _lost(job_ids, attempt_ids, {(r[0], r[1]) for r in rows}):
        raise LeaseLost(lost)


def extend_many(ctx: OpContext, leases: Sequence[tuple[int, int, float]]) -> Op[dict[int, bool]]:
    """Extend leases given as (job_id, attempt_id, seconds). Returns
    {job_id: cancel_requested} for those still held; missing ids lost their lease."""
    return _extend(ctx, list(leases))


def _extend(ctx: OpContext, leases: list[tuple[int, int, float]]) -> Op[dict[int, bool]]:
    if not leases:
        return {}
    rows = yield Execute(
        "job_extend_many",
        {
            "job_ids": [x[0] for x in leases],
            "attempt_ids": [x[1] for x in leases],
            "seconds": [float(x[2]) for x in leases],
            "now": ctx.clock(),
        },
    )
    return {job_id: cancel for job_id, cancel in rows}


def extend(ctx: OpContext, leased: LeasedJob, seconds: float) -> Op[bool]:
    """Extend one lease to now + seconds; False when the lease is lost."""
    wait = validation.seconds("seconds", seconds, allow_zero=False)
    return _held(_extend(ctx, [(leased.job_id, leased.attempt_id, wait)]), leased.job_id)


def _held(op: Op[dict[int, bool]], job_id: int) -> Op[bool]:
    held = yield from op
    return job_id in held


def cancel_flags(
    ctx: OpContext, running: Sequence[tuple[int, int]]
) -> Op[list[tuple[int, bool, bool]]]:
    """(job_id, cancel_requested, lease_held) for running (job_id, attempt_id) pairs."""
    return _cancel_flags(list(running))


def _cancel_flags(running: list[tuple[int, int]]) -> Op[list[tuple[int, bool, bool]]]:
    if not running:
        return []
    rows: list[Any] = yield Execute(
        "job_cancel_flags",
        {"job_ids": [r[0] for r in running], "attempt_ids": [r[1] for r in running]},
    )
    return [(job_id, bool(cancel), bool(held)) for job_id, cancel, held in rows]


def next_due(queues: list[str] | None = None) -> Op[float | None]:
    """Seconds until the earliest scheduled job becomes due, or a rate-limited
    queue among ``queues`` (None: all) has a free slot again; None: neither."""
    row = yield Execute("job_next_due", {"queues": queues}, fetch="one")
    return row[0] if row else None


def set_progress(job_id: int, attempt_id: int, progress: str) -> Op[bool]:
    """Store a job's progress (JSON text, validated by
    :func:`pgqueue.validation.progress`); false when the attempt is not the job's."""
    rows = yield Execute(
        "job_set_progress",
        {"job_ids": [job_id], "attempt_ids": [attempt_id], "progress": [progress]},
    )
    return bool(rows)
