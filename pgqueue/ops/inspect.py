"""Reading jobs and queues: get, list, metrics, explain, result."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgqueue import validation
from pgqueue.errors import (
    InvalidOption,
    JobCancelled,
    JobFailed,
    JobNotFound,
    ResultNotStored,
    ResultTimeout,
)
from pgqueue.explain import durable_state, durable_steps, explain_job
from pgqueue.models import Attempt, AttemptOutcome, Job, JobStatus, Page, QueueMetrics, StepRecord
from pgqueue.ops import Execute, Listen, Op, WaitNotify
from pgqueue.ops.durable import list_steps
from pgqueue.payloads import RESULT_NOT_STORED

_JOB_FIELDS = (
    "id",
    "queue",
    "task",
    "payload",
    "priority",
    "status",
    "run_at",
    "attempts",
    "max_attempts",
    "dedup_key",
    "serial_key",
    "created_at",
    "finished_at",
    "last_error",
    "result",
)


#: Read when the statement selects them (get_job, list_jobs); defaults otherwise.
_OPTIONAL_FIELDS = ("tags", "meta", "progress", "snoozes", "group_key")


def job_from_row(
    row: dict[str, Any], history: list[Attempt] | None = None, steps: list[StepRecord] | None = None
) -> Job:
    values = {k: row[k] for k in _JOB_FIELDS}
    values["status"] = JobStatus(values["status"])
    values.update({k: row[k] for k in _OPTIONAL_FIELDS if row.get(k) is not None})
    if steps:
        values["steps"] = steps
    return Job(**values, attempt_history=history)


def attempt_from_row(row: dict[str, Any]) -> Attempt:
    return Attempt(**{**row, "outcome": AttemptOutcome(row["outcome"])})


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"job id must be a positive integer, got {value!r}")
    return value


def get_job(job_id: int, history: bool = False) -> Op[Job]:
    """One job (live or archived), with its attempts when ``history``."""
    return _get_job(_job_id(job_id), history)


def _get_job(job_id: int, history: bool) -> Op[Job]:
    row = yield Execute("job_get", {"job_id": job_id}, fetch="one", rows="dict")
    if row is None:
        raise JobNotFound(job_id)
    attempts = None
    if history:
        rows = yield Execute("job_attempt_history", {"job_id": job_id}, rows="dict")
        attempts = [attempt_from_row(r) for r in rows]
    steps = yield from list_steps(job_id)
    return job_from_row(row, attempts, steps)


_STORED = {
    "queued": (["queued", "scheduled"], True),
    "scheduled": (["queued", "scheduled"], False),
    "running": (["running"], None),
    "succeeded": (["succeeded"], None),
    "dead": (["dead"], None),
    "cancelled": (["cancelled"], None),
    "waiting": (["waiting"], None),
}


def stages(stored: list[str] | None) -> list[str] | None:
    """The ``stage`` values of these stored statuses: the copy of ``status``
    the indexes use, which a lease does not change (running is stage queued)."""
    return None if stored is None else sorted({"queued" if s == "running" else s for s in stored})


def encode_cursor(job_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, value = text.partition(":")
        if kind != "id":
            raise ValueError(kind)
        return int(value)
    except (ValueError, UnicodeDecodeError):
        raise InvalidOption(
            f"invalid cursor {cursor!r}: pass a next_cursor from list_jobs"
        ) from None


def _stored(status: str | JobStatus | None) -> tuple[list[str] | None, bool | None]:
    if status is None:
        return None, None
    key = status.value if isinstance(status, JobStatus) else str(status)
    if key not in _STORED:
        raise InvalidOption(f"unknown status {status!r}: one of {', '.join(_STORED)}")
    return _STORED[key]


def _list_params(
    queue: str | None,
    task: str | None,
    status: str | JobStatus | None,
    tags: Sequence[str] | None,
    before_id: int | None,
    limit: int,
    group_key: str | None = None,
) -> dict[str, Any]:
    """The parameters of ``job_list``: every filter, none of the search."""
    stored, due = _stored(status)
    return {
        "queue": validation.queue_name(queue) if queue is not None else None,
        "task": validation.task_name(task) if task is not None else None,
        "group_key": validation.group_key(group_key),
        "tags": validation.tags(tags),
        "stored_statuses": stored,
        "stored_stages": stages(stored),
        "due": due,
        "pattern": None,
        "before_id": before_id,
        "min_id": None,
        "limit": validation.positive_int("limit", limit, 10_000) + 1,
    }


def list_jobs(
    queue: str | None = None,
    status: str | JobStatus | None = None,
    task: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
    tags: Sequence[str] | None = None,
    group_key: str | None = None,
) -> Op[Page]:
    """A page of jobs, newest first; pass ``next_cursor`` for the next page.
    ``tags``: only jobs having every one of them; ``group_key``: only that
    group's jobs."""
    before_id = decode_cursor(cursor) if cursor else None
    return _list_jobs(_list_params(queue, task, status, tags, before_id, limit, group_key), limit)


def _list_jobs(params: dict[str, Any], limit: int) -> Op[Page]:
    rows = yield Execute("job_list", params, rows="dict")
    jobs = [job_from_row(r) for r in rows[:limit]]
    return Page(jobs, encode_cursor(jobs[-1].id) if len(rows) > limit else None)


# --- the dashboard's job lists: the same statements, more ways in ---------------

SEARCH_WINDOW = 5_000
"""Rows a free-text search page reads at most (newest ids first)."""

_FINISHED = ("succeeded", "dead", "cancelled")


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The filters of the dashboard's jobs list (and of bulk actions on what
    it matches): those of :func:`list_jobs` with one tag, plus ``q``, free
    text over payload and last error."""

    queue: str | None = None
    status: str | None = None
    task: str | None = None
    q: str | None = None
    tag: str | None = None

    @classmethod
    def parse(cls, values: Any) -> JobFilter:
        """From query or form values; empty strings mean "any". Raises
        InvalidOption naming a bad value."""

        def get(name: str) -> str | None:
            value = values.get(name)
            return value.strip() or None if isinstance(value, str) else None

        queue, status, task, q = get("queue"), get("status"), get("task"), get("q")
        tag = get("tag")
        if tag is not None:
            validation.tags([tag])
        if queue is not None:
            validation.queue_name(queue)
        if task is not None:
            validation.task_name(task)
        if status is not None and status not in _STORED:
            raise InvalidOption(f"unknown status {status!r}: one of {', '.join(_STORED)}")
        if q is not None and len(q) > 200:
            raise InvalidOption("search text is longer than 200 characters")
        return cls(queue, status, task, q, tag)

    def params(self) -> dict[str, str]:
        """The non-empty filters, for links and hidden form fields."""
        return {
            k: v
            for k, v in (
                ("queue", self.queue),
                ("status", self.status),
                ("task", self.task),
                ("q", self.q),
                ("tag", self.tag),
            )
            if v
        }


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of the jobs list; ``next_cursor`` continues it (None: the end).
    A search page also says how far down it looked (``searched_to_id``)."""

    jobs: list[Job]
    next_cursor: str | None
    searched_to_id: int | None = None


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _encode_finished_cursor(finished_at: datetime | None, job_id: int) -> str:
    text = f"f:{finished_at.isoformat() if finished_at else ''}|{job_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_finished_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, rest = text.partition(":")
        when, _, job_id = rest.partition("|")
        if kind != "f":
            raise ValueError(kind)
        return datetime.fromisoformat(when), int(job_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidOption(
            f"invalid cursor {cursor!r}: pass a next_cursor of the same listing"
        ) from None


def job_page(flt: JobFilter, cursor: str | None, limit: int) -> Op[JobPage]:
    """A keyset page of the jobs ``flt`` matches, newest first, read as the
    jobs list shows them: with a tag, :func:`list_jobs`' pages; a finished
    status, most recently finished first (``job_list_finished``); another
    status, ``job_list``; free text or filters without a status, a search of
    ``job_list`` over a window of at most :data:`SEARCH_WINDOW` ids below the
    cursor, so a page never reads more however rare its matches are."""
    if flt.tag is not None:
        page = yield from list_jobs(flt.queue, flt.status, flt.task, limit, cursor, [flt.tag])
        return JobPage(page.jobs, page.next_cursor)
    if flt.status in _FINISHED and flt.q is None:
        return (yield from _finished_page(flt, cursor, limit))
    before_id = decode_cursor(cursor) if cursor else None
    params = _list_params(flt.queue, flt.task, flt.status, None, before_id, limit)
    if flt.status is not None and flt.q is None:
        rows = yield Execute("job_list", params, rows="dict")
        jobs = [job_from_row(r) for r in rows[:limit]]
        return JobPage(jobs, encode_cursor(jobs[-1].id) if len(rows) > limit else None)
    return (yield from _search_page(flt, params, before_id, limit))


def _finished_page(flt: JobFilter, cursor: str | None, limit: int) -> Op[JobPage]:
    after = _decode_finished_cursor(cursor) if cursor else None
    rows = yield Execute(
        "job_list_finished",
        {
            "status": flt.status,
            "queue": flt.queue,
            "task": flt.task,
            "before_finished": after[0] if after else None,
            "before_id": after[1] if after else None,
            "limit": limit + 1,
        },
        rows="dict",
    )
    jobs = [job_from_row(r) for r in rows[:limit]]
    more = len(rows) > limit and jobs[-1].finished_at is not None
    return JobPage(
        jobs, _encode_finished_cursor(jobs[-1].finished_at, jobs[-1].id) if more else None
    )


def _search_page(
    flt: JobFilter, params: dict[str, Any], before_id: int | None, limit: int
) -> Op[JobPage]:
    searching = flt.q is not None or flt.queue is not None or flt.task is not None
    window: Any = None
    if searching:
        # Filters that no index serves read the window below the cursor only.
        window = yield Execute(
            "job_list_window", {"before_id": before_id, "window": SEARCH_WINDOW}, fetch="one"
        )
        floor, ceiling, _ = window or (None, None, 0)
        if floor is None or ceiling is None:  # no job below the cursor
            return JobPage([], None, None)
        params = {
            **params,
            "pattern": _like(flt.q) if flt.q else None,
            "before_id": ceiling + 1,
            "min_id": floor,
        }
    # (No filter at all: the newest ids below the cursor, the window's head.)
    rows = yield Execute("job_list", params, rows="dict")
    jobs = [job_from_row(r) for r in rows[:limit]]
    if len(rows) > limit:
        return JobPage(jobs, encode_cursor(jobs[-1].id))
    if window is None:
        window = yield Execute(
            "job_list_window", {"before_id": before_id, "window": SEARCH_WINDOW}, fetch="one"
        )
    lowest, _, examined = window if window else (None, None, 0)
    if lowest is None or examined < SEARCH_WINDOW or lowest <= 1:
        return JobPage(jobs, None, lowest)
    return JobPage(jobs, encode_cursor(lowest), lowest)


def rate_text(limit: int | None, period_seconds: float | None) -> str | None:
    """A queue's rate limit as ``pgqueue queue limit`` takes it (``10/1m``)."""
    if limit is None or period_seconds is None:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if period_seconds >= size and period_seconds % size == 0:
            return f"{limit}/{int(period_seconds // size)}{unit}"
    return f"{limit}/{period_seconds:g}s"


#: Counts of ``metrics()`` are exact below this; a queue's queued or running
#: count stops here (``pgqueue status`` shows "10,000+"), and the other
#: statuses past it are estimates (shown as "≈N"): no statement reads more
#: than this many rows per status however big the table grows.
METRICS_CAP = 10_000
#: Rows read for the per-queue shares of a status the planner puts far past
#: the cap (its total then comes from the statistics or the sampled rate).
SHARE_SAMPLE = 1_000
_SAMPLED = ("scheduled", "succeeded", "dead", "cancelled")


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """One queue's counts (``QueueMetrics`` fields) before they become
    ``QueueMetrics``: which stopped at the cap and which are estimates, and
    the queue's controls (``row``). Shared by ``metrics()`` and the dashboard."""

    queue: str
    counts: dict[str, int]
    capped: frozenset[str]
    estimated: frozenset[str]
    row: dict[str, Any]


def queue_counts(
    queue: str | None = None, cap: int = METRICS_CAP, finished: bool = True
) -> Op[list[QueueCounts]]:
    """Every queue's (or one queue's) counts, bounded: queued and running
    stop at ``cap`` (index ranges of queue-led partial indexes); the other
    statuses come from one sample of at most ``cap`` rows each (fewer where
    the planner expects far more), scaled to an estimate when it was cut
    off. ``finished=False``: only the live counts (the others stay 0)."""
    rows = yield Execute("queue_metrics", {"queue": queue, "cap": cap}, rows="dict")
    if not rows:
        return []
    estimates: dict[str, int] = {}
    sample: list[dict[str, Any]] = []
    caps = dict.fromkeys(_SAMPLED, cap)
    if finished:
        stats = yield Execute("metrics_status_estimates", {})
        estimates = {status: int(n) for status, n in stats}
        for status in _SAMPLED:
            if estimates.get(status, 0) > 4 * cap > SHARE_SAMPLE:
                caps[status] = SHARE_SAMPLE
        sample = yield Execute(
            "queue_status_sample", {f"cap_{k}": v for k, v in caps.items()}, rows="dict"
        )
    seen: dict[str, int] = {}
    oldest: dict[str, datetime] = {}
    newest: dict[str, datetime] = {}
    for r in sample:
        kind = "scheduled" if r["status"] == "due" else r["status"]
        seen[kind] = seen.get(kind, 0) + r["n"]
        if r["oldest"] is not None and (kind not in oldest or r["oldest"] < oldest[kind]):
            oldest[kind] = r["oldest"]
        if r["newest"] is not None and (kind not in newest or r["newest"] > newest[kind]):
            newest[kind] = r["newest"]
    # A status whose sample stopped at its cap: scale its per-queue shares to
    # an estimate of the whole (the planner's statistics; for succeeded in
    # the last hour, the rate at which the sampled jobs finished).
    scale: dict[str, float] = {}
    for kind, n in seen.items():
        if n < caps[kind]:
            continue
        if kind == "succeeded" and kind in oldest:
            span = (newest[kind] - oldest[kind]).total_seconds()
            rest = 3600.0 - (datetime.now(UTC) - oldest[kind]).total_seconds()
            total = n * (1.0 + max(rest, 0.0) / max(span, 0.001))
        else:
            total = float(estimates.get(kind, 0))
        if total > n:
            scale[kind] = total / n
    counts: dict[tuple[str, str], int] = {}
    estimated: dict[str, set[str]] = {}
    for r in sample:
        kind = "scheduled" if r["status"] == "due" else r["status"]
        factor = scale.get(kind, 1.0)
        counts[(r["queue"], r["status"])] = round(r["n"] * factor)
        if kind in scale:
            estimated.setdefault(r["queue"], set()).add(
                "queued" if r["status"] == "due" else r["status"]
            )
    out = []
    for r in rows:
        name = r["queue"]
        out.append(
            QueueCounts(
                queue=name,
                counts={
                    "queued": r["queued"] + counts.get((name, "due"), 0),
                    "scheduled": counts.get((name, "scheduled"), 0),
                    "running": r["running"],
                    "succeeded": counts.get((name, "succeeded"), 0),
                    "dead": counts.get((name, "dead"), 0),
                    "cancelled": counts.get((name, "cancelled"), 0),
                    "waiting": r["waiting"],
                },
                capped=frozenset(s for s in ("queued", "running") if r[s] >= cap),
                estimated=frozenset(estimated.get(name, ())),
                row=r,
            )
        )
    return out


def metrics(queue: str | None = None, cap: int = METRICS_CAP) -> Op[dict[str, QueueMetrics]]:
    """Per-queue counts, keyed by queue name (exact below ``cap``)."""
    return _metrics(validation.queue_name(queue) if queue is not None else None, cap)


def _metrics(queue: str | None, cap: int) -> Op[dict[str, QueueMetrics]]:
    found = yield from queue_counts(queue, cap)
    return {
        q.queue: QueueMetrics(
            **q.counts,
            oldest_ready_age_seconds=q.row["oldest_ready_age_seconds"],
            paused=q.row["paused"],
            concurrency_limit=q.row["concurrency_limit"],
            rate_limit=rate_text(q.row["rate_limit"], q.row["rate_period_seconds"]),
            event_waiting=q.row["event_waiting"],
            sleeping=q.row["sleeping"],
        )
        for q in found
    }


def explain(job_id: int) -> Op[str]:
    """Why a job is where it is, in plain words."""
    return _explain(_job_id(job_id))


_ENDED = ("succeeded", "dead", "cancelled")


def _explain(job_id: int) -> Op[str]:
    row = yield Execute("job_get", {"job_id": job_id}, fetch="one", rows="dict")
    if row is None:
        raise JobNotFound(job_id)
    steps = yield from list_steps(job_id)
    text = yield from _explain_row(job_id, row, steps)
    return text + durable_steps(steps)


def _explain_row(job_id: int, row: dict[str, Any], steps: list[StepRecord]) -> Op[str]:
    if steps and not row["archived"]:
        job = f"job {job_id} ({row['task']}, queue {row['queue']!r})"
        durable = durable_state(job, row, steps)
        if durable is not None:
            return durable
    context: dict[str, Any] = {}
    if row["stored_status"] in ("queued", "scheduled", "running") and not row["archived"]:
        context = (
            yield Execute("job_wait_context", {"job_id": job_id}, fetch="one", rows="dict")
        ) or {}
        # The task's limits and whether a live worker knows it.
        task_context = yield Execute(
            "task_wait_context",
            {"task": row["task"], "alive_seconds": 60.0},
            fetch="one",
            rows="dict",
        )
        context = {**context, **(task_context or {})}
    if row["stored_status"] == "waiting":
        from pgqueue.ops.workflows import dependencies

        _, deps = yield from dependencies(job_id)
        pending = [f"{name} ({status})" for name, status, _ in deps if status not in _ENDED]
        ended = [name for name, status, _ in deps if status in _ENDED]
        return (
            f"job {job_id} ({row['task']}, queue {row['queue']!r}) is waiting for "
            f"{len(pending)} of its {len(deps)} dependencies to end: {', '.join(pending)}"
            + (f"; already ended: {', '.join(ended)}" if ended else "")
        )
    history = []
    if row["stored_status"] in ("dead", "cancelled"):
        history = yield Execute("job_attempt_history", {"job_id": job_id}, rows="dict")
    return explain_job(row, context, history)


def result(
    job_id: int,
    timeout: float | None = None,
    poll_interval: float = 1.0,
    monotonic: Callable[[], float] = time.monotonic,
    listen: bool = True,
) -> Op[Any]:
    """Wait for a job to finish and return its stored result; raise JobFailed
    (dead) or JobCancelled, or ResultTimeout after ``timeout`` seconds.
    ``listen=False``: poll every ``poll_interval`` without LISTEN."""
    _job_id(job_id)
    if timeout is not None:
        validation.seconds("timeout", timeout)
    return _result(job_id, timeout, poll_interval, monotonic, listen)


def _finished(job_id: int, row: Any) -> tuple[bool, Any]:
    status, value, last_error = row
    if status == "succeeded":
        if value is None and (last_error or "").startswith(RESULT_NOT_STORED):
            raise ResultNotStored(job_id, last_error[len(RESULT_NOT_STORED) :])
        return True, value
    if status == "dead":
        raise JobFailed(job_id, status, last_error)
    if status == "cancelled":
        raise JobCancelled(job_id, status, last_error)
    return False, None


def _result(
    job_id: int,
    timeout: float | None,
    poll: float,
    monotonic: Callable[[], float],
    listen: bool,
) -> Op[Any]:
    deadline = None if timeout is None else monotonic() + timeout
    if listen:
        yield Listen()
    while True:
        # Flag first, then read in a new statement: a finish that commits in
        # between either sees the flag (and notifies) or is seen by the read.
        yield Execute("job_watch_finish", {"job_id": job_id}, fetch="one")
        row = yield Execute("job_result", {"job_id": job_id}, fetch="one")
        if row is None:
            raise JobNotFound(job_id)
        done, value = _finished(job_id, row)
        if done:
            return value
        remaining = poll if deadline is None else min(poll, deadline - monotonic())
        if remaining <= 0:
            raise ResultTimeout(f"job {job_id} did not finish within {timeout:g}s")
        yield WaitNotify(remaining, f"f:{job_id}")
