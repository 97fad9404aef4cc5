"""Plain-words explanation of a job's state (no I/O: the facts come in as rows)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pgqueue.commands import command


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "?"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{int(seconds // size)}{unit}")
            seconds %= size
    if seconds >= 1 and len(parts) < 2:
        parts.append(f"{int(seconds)}s")
    return " ".join(parts) or "0s"


def _attempts(row: dict[str, Any]) -> str:
    n = row["attempts"]
    snoozes = row.get("snoozes") or 0
    snoozed = f" (and {snoozes} snooze{'s' if snoozes != 1 else ''})" if snoozes else ""
    return f"{n} attempt{'s' if n != 1 else ''}{snoozed}"


def _unknown_task(row: dict[str, Any], context: dict[str, Any]) -> str | None:
    """Why a job of a task no live worker knows waits, or None."""
    live = context.get("live_workers") or 0
    if live and not context.get("live_workers_with_task"):
        return (
            f"no live worker knows task {row['task']!r} ({live} live worker"
            f"{'s' if live != 1 else ''}): it waits for one that does, and is dead-lettered "
            "as unknown_task once the workers' grace period (default 1h) has passed"
        )
    return None


def _cancel_reason(row: dict[str, Any], attempts: Sequence[dict[str, Any]]) -> str:
    """What a cancelled job's ``last_error`` says, and as what: the reason it
    was cancelled (``dependency 12 ended dead``, ``workflow cancelled``), or
    the error of one of its attempts (a cancel without a reason leaves the
    last one there, ``ValueError: boom``)."""
    reason = row["last_error"]
    if not reason:
        return ""
    for attempt in reversed(attempts):  # last_error is "<error_code>: <message>"
        code = attempt.get("error_code")
        if code and reason.startswith(f"{code}:"):
            if attempt["outcome"] == "cancelled":  # the attempt the cancel stopped
                return f"; the attempt ended with {reason}"
            return f", after attempt {attempt['attempt']} failed: {reason}"
    return f": {reason}"


def explain_job(
    row: dict[str, Any], context: dict[str, Any], attempts: Sequence[dict[str, Any]] = ()
) -> str:
    """Why the job in ``row`` (a ``job_get`` row) is where it is.

    ``context`` is a ``job_wait_context`` row for live jobs; ``attempts`` the
    attempts of dead and cancelled jobs, oldest first.
    """
    last_attempt = attempts[-1] if attempts else None
    now: datetime = row["db_now"]
    status = row["status"]
    prefix = "archived; " if row["archived"] else ""
    job = f"job {row['id']} ({row['task']}, queue {row['queue']!r})"

    if status == "succeeded":
        return (
            f"{prefix}{job} succeeded at {fmt_time(row['finished_at'])} after "
            f"{_attempts(row)}, on worker {row['worker_id'] or '?'}"
        )
    if status == "dead":
        why = (
            "a permanent error" if row["attempts"] < row["max_attempts"] else "its attempts ran out"
        )
        if (
            last_attempt
            and last_attempt["outcome"] == "lease_expired"
            and row["attempts"] >= row["max_attempts"]
        ):
            why = "its last lease expired and its attempts ran out"
        return (
            f"{prefix}{job} is dead after {_attempts(row)} of {row['max_attempts']} "
            f"({why}): last error {row['last_error'] or 'none recorded'}; "
            f"requeue it with `{command('dlq requeue ' + str(row['id']))}`"
        )
    if status == "cancelled":
        during = ""
        if last_attempt and last_attempt["outcome"] == "cancelled":
            attempt, worker = last_attempt["attempt"], last_attempt["worker_id"]
            during = f" while attempt {attempt} ran on worker {worker}"
        return (
            f"{prefix}{job} was cancelled at {fmt_time(row['finished_at'])}{during}"
            f"{_cancel_reason(row, attempts)}"
        )

    if status == "running":
        lines = [
            f"{job} is running on worker {row['worker_id']}"
            + (f" ({context['worker_host']})" if context.get("worker_host") else "")
            + f", attempt {row['attempts']} of {row['max_attempts']}, "
            f"lease until {fmt_time(row['lease_expires_at'])}"
        ]
        expires: datetime | None = row["lease_expires_at"]
        if expires is not None and expires < now:
            lines.append(
                f"its lease expired {fmt_span((now - expires).total_seconds())} ago: "
                "the reaper will count the attempt as failed and retry the job"
            )
        beat = context.get("worker_heartbeat_at")
        if beat is not None and (now - beat).total_seconds() > 60:
            lines.append(
                f"worker {row['worker_id']} last sent a heartbeat "
                f"{fmt_span((now - beat).total_seconds())} ago"
            )
        if row["cancel_requested"]:
            lines.append("a cancel was requested: it ends cancelled when this attempt ends")
        return "; ".join(lines)

    retry = ""
    if row["attempts"] > 0:
        retry = (
            f" (retry {row['attempts'] + 1} of {row['max_attempts']} after: "
            f"{row['last_error'] or 'an error'})"
        )
    if row.get("snoozes"):
        n = row["snoozes"]
        retry += f" (snoozed {n} time{'s' if n != 1 else ''}: no attempt spent)"
    unknown = _unknown_task(row, context)
    if status == "scheduled":
        return (
            f"{job} is scheduled for {fmt_time(row['run_at'])}, in "
            f"{fmt_span((row['run_at'] - now).total_seconds())}{retry}"
            + (f"; {unknown}" if unknown else "")
        )

    waits = []
    if context.get("paused"):
        waits.append(
            f"queue {row['queue']!r} is paused (resume it with "
            f"`{command('queue resume ' + str(row['queue']))}`)"
        )
    if context.get("serial_blocker_id") is not None:
        waits.append(
            f"waiting behind job {context['serial_blocker_id']} "
            f"({context['serial_blocker_status']}) with the same serial key "
            f"{row['serial_key']!r}"
        )
    limit = context.get("concurrency_limit")
    if limit is not None and context.get("running_in_queue", 0) >= limit:
        waits.append(f"queue at its concurrency limit {context['running_in_queue']}/{limit}")
    rate = context.get("rate_limit")
    if rate is not None and context.get("leases_in_window", 0) >= rate:
        waits.append(
            f"rate limit: {context['leases_in_window']}/{rate} leases in the window, "
            f"next slot at {fmt_time(context.get('rate_next_slot'))}"
        )
    task_limit = context.get("concurrency_limit_of_task")
    if task_limit is not None and context.get("running_of_task", 0) >= task_limit:
        waits.append(
            f"task {row['task']!r} at its concurrency limit "
            f"{context['running_of_task']}/{task_limit} (other tasks of the queue still run)"
        )
    task_rate = context.get("rate_limit_of_task")
    if task_rate is not None and context.get("task_leases_in_window", 0) >= task_rate:
        waits.append(
            f"task {row['task']!r} rate limit: {context['task_leases_in_window']}/{task_rate} "
            "leases in the window"
        )
    if unknown:
        waits.append(unknown)
    if not waits:
        ahead = context.get("jobs_ahead") or 0
        count = ahead if ahead < 10000 else "over 10000"
        where = (
            "next in line" if ahead == 0 else f"{count} job{'s' if ahead != 1 else ''} ahead of it"
        )
        waits.append(
            f"ready since {fmt_time(row['run_at'])}, {where} in queue {row['queue']!r}, "
            "waiting for a free worker"
        )
    return f"{job} is queued{retry}: " + "; ".join(waits)


def durable_state(job: str, row: dict[str, Any], steps: Sequence[Any]) -> str | None:
    """What a durable task's job sleeps until or waits for, when it does
    (``steps``: its :class:`pgqueue.StepRecord` list), else None."""
    now: datetime = row["db_now"]
    if row["stored_status"] == "waiting":
        for step in reversed(steps):
            if step.kind == "event" and step.status == "waiting":
                until = (
                    f"until {fmt_time(step.wake_at)} (then EventTimeout)"
                    if step.wake_at is not None
                    else "with no timeout"
                )
                return (
                    f"{job} waits for event {step.event_key!r} {until}, holding no worker "
                    f"slot; `{command('event send ' + str(step.event_key))}` releases it"
                )
    if row["stored_status"] in ("queued", "scheduled"):
        for step in reversed(steps):
            if step.kind == "sleep" and step.wake_at is not None and step.wake_at > now:
                return (
                    f"{job} sleeps until {fmt_time(step.wake_at)} "
                    f"(in {fmt_span((step.wake_at - now).total_seconds())}, {step.name}), "
                    "holding no worker slot"
                )
    return None


def durable_steps(steps: Sequence[Any]) -> str:
    """The stored steps of a durable task's job, as a trailing clause ("" for none)."""
    done = [s.name for s in steps if s.kind == "step"]
    if not done:
        return ""
    shown = ", ".join(done[:10]) + (f" and {len(done) - 10} more" if len(done) > 10 else "")
    return f"; {len(done)} step{'s' if len(done) != 1 else ''} stored: {shown}"
