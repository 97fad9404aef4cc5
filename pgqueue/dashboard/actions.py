"""Bulk actions in bounded batches: each HTTP request does at most a few
short transactions (``BATCH`` jobs each, within ``TIME_BUDGET`` seconds) and
returns its progress with a cursor; the browser (or API client) posts again
with that cursor until ``done``. No request holds locks on, or waits for,
more than one batch of jobs.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgqueue.dashboard.data import Data, JobFilter
from pgqueue.errors import InvalidOption
from pgqueue.ops.operator import CANCELLABLE

if TYPE_CHECKING:
    from pgqueue.app import App

BATCH = 500
TIME_BUDGET = 1.0
ACTIONS = ("cancel", "replay", "requeue")


@dataclass(frozen=True, slots=True)
class Progress:
    """What one request of a bulk action did, and where the next one starts."""

    action: str
    processed: int  # jobs acted on by this request
    total: int  # ... and by the whole run so far
    skipped: int  # matched but not applicable (finished job to cancel, ...)
    done: bool
    cursor: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "processed": self.processed,
            "total": self.total,
            "skipped": self.skipped,
            "done": self.done,
            "cursor": self.cursor,
        }


async def act_on_ids(app: App, action: str, job_ids: list[int]) -> tuple[int, int]:
    """Apply ``action`` to these jobs; (acted, skipped)."""
    if action == "cancel":
        cancelled = await app.cancel_many_async(
            job_ids, statuses=CANCELLABLE, limit=max(len(job_ids), 1)
        )
        return len(cancelled), len(job_ids) - len(cancelled)
    if action == "requeue":
        requeued = await app.requeue_dead_many_async(job_ids, limit=max(len(job_ids), 1))
        return len(requeued), len(job_ids) - len(requeued)
    if action == "replay":
        done = 0
        for job_id in job_ids:
            await app.replay_async(job_id)
            done += 1
        return done, 0
    raise InvalidOption(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")


def _effective_filter(action: str, flt: JobFilter) -> JobFilter:
    # requeue only ever applies to dead jobs: select them and nothing else.
    if action == "requeue":
        if flt.status not in (None, "dead"):
            raise InvalidOption("requeue applies to dead jobs: filter status=dead or none")
        return JobFilter(flt.queue, "dead", flt.task, flt.q, flt.tag)
    return flt


async def act_on_filter(
    data: Data,
    action: str,
    flt: JobFilter,
    cursor: str | None,
    total: int,
    *,
    batch: int | None = None,
) -> Progress:
    """Apply ``action`` to the jobs the filter matches, newest first, from
    ``cursor`` on, for at most TIME_BUDGET seconds."""
    if action not in ACTIONS:
        raise InvalidOption(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    flt = _effective_filter(action, flt)
    batch = batch or BATCH
    deadline = time.monotonic() + TIME_BUDGET
    processed = skipped = 0
    while True:
        page = await data.jobs_batch(flt, cursor, batch)
        ids = [job.id for job in page.jobs]
        if ids:
            acted, missed = await act_on_ids(data.app, action, ids)
            processed, skipped = processed + acted, skipped + missed
        cursor = page.next_cursor
        if cursor is None or time.monotonic() >= deadline:
            return Progress(action, processed, total + processed, skipped, cursor is None, cursor)


def _encode_group_cursor(value: tuple[datetime, int] | None) -> str | None:
    if value is None:
        return None
    text = json.dumps([value[0].isoformat(), value[1]])
    return base64.urlsafe_b64encode(text.encode()).decode()


def _decode_group_cursor(value: str | None) -> tuple[datetime, int] | None:
    if not value:
        return None
    try:
        finished, job_id = json.loads(base64.urlsafe_b64decode(value.encode()))
        return datetime.fromisoformat(finished), int(job_id)
    except (ValueError, TypeError):
        raise InvalidOption(f"invalid cursor {value!r}") from None


async def requeue_group(
    data: Data,
    group: tuple[str, str, str],
    cursor: str | None,
    total: int,
    *,
    batch: int | None = None,
) -> Progress:
    """Requeue the dead jobs of one dead-letter group, newest first."""
    after = _decode_group_cursor(cursor)
    batch = batch or BATCH
    deadline = time.monotonic() + TIME_BUDGET
    processed = skipped = 0
    while True:
        ids, after = await data.dead_group_batch(group, after, batch)
        if ids:
            acted, missed = await act_on_ids(data.app, "requeue", ids)
            processed, skipped = processed + acted, skipped + missed
        if after is None or time.monotonic() >= deadline:
            return Progress(
                "requeue",
                processed,
                total + processed,
                skipped,
                after is None,
                _encode_group_cursor(after),
            )
