"""Durable tasks: a job's stored steps, storing one (fenced), waiting for an
event, and sending one (``durable.sql``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pgqueue import validation
from pgqueue.errors import InvalidInput, InvalidPayload, LeaseLost
from pgqueue.models import StepRecord
from pgqueue.ops import Execute, Op

#: The longest step name and event key, in bytes.
MAX_NAME_BYTES = 1000


def step_name(what: str, name: object) -> str:
    """A step name or event key: 1 to 1000 bytes of text without NUL."""
    if (
        not isinstance(name, str)
        or not name
        or "\x00" in name
        or not validation.unicode_text(name)
        or len(name.encode("utf-8")) > MAX_NAME_BYTES
    ):
        raise InvalidInput(
            f"{what} must be a non-empty string of at most {MAX_NAME_BYTES} bytes "
            f"without NUL, got {name!r:.80}"
        )
    return name


def encode_value(what: str, value: Any, max_bytes: int) -> str:
    """``value`` as JSON text (plain JSON types only, so that a later run gets
    back exactly what this one returns), or InvalidPayload saying why not."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise InvalidPayload(f"{what} nests too deeply to store as JSON") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(
            f"{what} must be JSON (dict, list, str, int, float, bool or None) to be stored: {exc}"
        ) from None
    if "\\u0000" in text:
        raise InvalidPayload(f"{what} contains a NUL character, which PostgreSQL cannot store")
    size = len(text.encode("utf-8", "surrogatepass"))
    if not validation.unicode_text(text):
        raise InvalidPayload(f"{what} holds a string that is not valid Unicode")
    if size > max_bytes:
        raise InvalidPayload(f"{what} is {size} bytes of JSON, over the {max_bytes}-byte limit")
    return text


def list_steps(job_id: int) -> Op[list[StepRecord]]:
    """A job's stored steps, sleeps and event waits, oldest first."""
    rows = yield Execute("step_list", {"job_id": job_id}, rows="dict")
    return [StepRecord(**row) for row in rows]


def store_step(
    job_id: int,
    attempt_id: int,
    name: str,
    *,
    kind: str,
    status: str,
    result: str | None,
    started_at: datetime | None,
    wake_at: datetime | None = None,
) -> Op[None]:
    """Store a step (``result``: JSON text) or a sleep for a running job;
    raises LeaseLost when the attempt no longer holds the job."""
    row = yield Execute(
        "step_store",
        {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "name": name,
            "kind": kind,
            "status": status,
            "result": result,
            "started_at": started_at,
            "wake_at": wake_at,
        },
        fetch="one",
    )
    if not (row and row[0]):
        raise LeaseLost([job_id])


def wait_event(
    job_id: int,
    attempt_id: int,
    name: str,
    key: str,
    timeout: float | None,
    started_at: datetime | None,
) -> Op[tuple[str, Any]]:
    """(outcome, payload) of a running job's wait for ``key``: ``received``,
    ``timed_out``, ``waiting`` (the job now waits, its attempt recorded) or
    ``cancelled``; raises LeaseLost when the attempt no longer holds the job."""
    row = yield Execute(
        "step_wait_event",
        {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "name": name,
            "key": key,
            "timeout": timeout,
            "started_at": started_at,
        },
        fetch="one",
    )
    if row is None or row[0] == "lost":
        raise LeaseLost([job_id])
    return row[0], row[1]


def send_event(key: str, payload: Any, max_bytes: int) -> Op[int]:
    """Store the event ``key`` and release the jobs waiting for it; returns
    how many it released."""
    step_name("an event key", key)
    text = None if payload is None else encode_value("the event's payload", payload, max_bytes)
    row = yield Execute("event_send", {"key": key, "payload": text}, fetch="one")
    return int(row[0]) if row else 0
