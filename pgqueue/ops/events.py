"""The read of the event stream of ``app.subscribe()`` (``sql/queries/events.sql``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgqueue.ops import Execute, Op

__all__ = ["became_due"]


def became_due(since: datetime | None) -> Op[tuple[Any, ...]]:
    """(database clock, next due time, last due time looked at, how many were
    looked at, [(queue, count, job id)]) of the scheduled jobs and retries
    that became due since ``since`` (None: only the clock and next due time)."""
    row = yield Execute("job_became_due", {"since": since}, fetch="one")
    assert row is not None
    return tuple(row)
