"""The web dashboard's own reads (``sql/queries/dashboard.sql``).

Each read is bounded however large the jobs table grows: counts stop at
:data:`COUNT_CAP` (beyond it an estimate is shown, marked approximate: the
counting of ``app.metrics()``, :func:`pgqueue.ops.inspect.queue_counts`),
aggregates sample the newest rows of one partial index. Its job lists are
:func:`pgqueue.ops.inspect.job_page`, the statements of ``list_jobs``. App
runs these operations (``app.queue_rows()``, ``app.throughput()``, ...);
:mod:`pgqueue.dashboard.data` caches what they return.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pgqueue.errors import InvalidOption
from pgqueue.ops import Execute, Op
from pgqueue.ops.inspect import QueueCounts, queue_counts, rate_text

COUNT_CAP = 10_000
"""Counts stop here; past it the dashboard shows "10,000+" or an estimate."""
DEAD_GROUP_SAMPLE = 2_000
"""Newest dead jobs the dead-letter groups are computed over."""

CountKind = Literal["exact", "capped", "estimate"]


@dataclass(frozen=True, slots=True)
class Count:
    """A count that may be capped or estimated (then shown as such)."""

    value: int
    kind: CountKind = "exact"

    def __str__(self) -> str:
        if self.kind == "capped":
            return f"{self.value:,}+"
        if self.kind == "estimate":
            return "≈" + _short(self.value)
        return f"{self.value:,}"


def _short(value: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if value >= size:
            return f"{value / size:.1f}{unit}".replace(".0", "")
    return str(value)


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue on the overview and the queues page (the shape of
    ``pgqueue status --json`` with counts that may be capped)."""

    queue: str
    queued: Count
    scheduled: Count
    running: Count
    succeeded: Count
    dead: Count
    cancelled: Count
    oldest_ready_age_seconds: float | None
    paused: bool
    concurrency_limit: int | None
    rate_limit: str | None

    def as_json(self) -> dict[str, Any]:
        """``pgqueue status --json`` fields, plus which counts are approximate."""
        counts = ("queued", "scheduled", "running", "succeeded", "dead", "cancelled")
        out: dict[str, Any] = {"queue": self.queue}
        out.update({name: getattr(self, name).value for name in counts})
        out["oldest_ready_age_seconds"] = self.oldest_ready_age_seconds
        out["paused"] = self.paused
        out["concurrency_limit"] = self.concurrency_limit
        out["rate_limit"] = self.rate_limit
        out["approximate"] = {
            name: getattr(self, name).kind for name in counts if getattr(self, name).kind != "exact"
        }
        return out


def queue_rows(finished: bool = True) -> Op[list[QueueRow]]:
    """Every queue with its (capped or estimated) counts and controls, as
    ``app.metrics()`` counts them; ``finished=False`` leaves the scheduled
    and finished counts at zero (the queues page shows only what is live)."""
    found = yield from queue_counts(None, COUNT_CAP, finished)

    def count(q: QueueCounts, status: str) -> Count:
        if status in q.capped:
            return Count(COUNT_CAP, "capped")
        return Count(q.counts[status], "estimate" if status in q.estimated else "exact")

    return [
        QueueRow(
            queue=q.queue,
            queued=count(q, "queued"),
            scheduled=count(q, "scheduled"),
            running=count(q, "running"),
            succeeded=count(q, "succeeded"),
            dead=count(q, "dead"),
            cancelled=count(q, "cancelled"),
            oldest_ready_age_seconds=q.row["oldest_ready_age_seconds"],
            paused=q.row["paused"],
            concurrency_limit=q.row["concurrency_limit"],
            rate_limit=rate_text(q.row["rate_limit"], q.row["rate_period_seconds"]),
        )
        for q in found[:1000]
    ]


THROUGHPUT_PER_MINUTE = 100
"""Finished jobs per minute and outcome the throughput chart counts exactly;
a busier minute is estimated from the rate of its first ones."""
THROUGHPUT_HOUR_CAP = COUNT_CAP
"""Finished jobs per outcome the hour's totals count exactly; past it the
total is an estimate (the sum of the minutes), never below the cap."""


class MinuteCount(NamedTuple):
    """Jobs finished in one minute; an outcome that reached
    :data:`THROUGHPUT_PER_MINUTE` is estimated (at least that many)."""

    minute: int  # epoch seconds of its start
    succeeded: int
    dead: int
    succeeded_estimated: bool = False
    dead_estimated: bool = False

    @property
    def estimated(self) -> bool:
        return self.succeeded_estimated or self.dead_estimated


@dataclass(frozen=True, slots=True)
class HourTotal:
    """Jobs of one outcome finished in the last hour: ``value`` is exact
    unless ``estimated``; ``at_least`` is always an exact lower bound."""

    value: int
    at_least: int
    estimated: bool = False

    def __str__(self) -> str:
        if not self.estimated:
            return f"{self.value:,}"
        return f"≈{self.value:,} (at least {self.at_least:,})"

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value, "at_least": self.at_least, "estimated": self.estimated}


@dataclass(frozen=True, slots=True)
class Throughput:
    """The overview's chart (one entry per minute, oldest first) and totals."""

    minutes: list[MinuteCount]
    succeeded: HourTotal
    dead: HourTotal
    hour_cap: int  # the totals are exact below it


def _per_minute(seen: int, span: float | None, seconds: float, cap: int) -> tuple[int, bool]:
    if seen < cap:
        return seen, False
    # The first ``cap`` jobs of the minute took ``span`` seconds from its
    # start: a rough rate (bursts make it wrong either way), never below what
    # was seen.
    return max(seen, round(seen * seconds / max(span or 0.0, 0.001))), True


def _hour_total(
    counted: int, minutes: list[tuple[int, bool]], per_minute: int, hour_cap: int
) -> HourTotal:
    """Exact when the hour's own count stayed below its cap (even if some
    minutes were estimated); else the sum of the minutes, at least the cap."""
    if counted < hour_cap:
        return HourTotal(counted, counted)
    seen = sum(min(n, per_minute) if est else n for n, est in minutes)
    at_least = max(counted, seen)
    return HourTotal(max(at_least, sum(n for n, _ in minutes)), at_least, estimated=True)


def throughput(
    per_minute: int = THROUGHPUT_PER_MINUTE, hour_cap: int = THROUGHPUT_HOUR_CAP
) -> Op[Throughput]:
    """Each of the last 60 minutes (the current one so far) and the hour's
    totals; ``per_minute`` and ``hour_cap`` bound what each range reads."""
    rows = yield Execute(
        "dashboard_throughput", {"per_minute": per_minute, "hour_cap": hour_cap}, rows="dict"
    )
    minutes = []
    for r in rows:
        ok, ok_est = _per_minute(r["succeeded_seen"], r["succeeded_span"], r["seconds"], per_minute)
        dead, dead_est = _per_minute(r["dead_seen"], r["dead_span"], r["seconds"], per_minute)
        minutes.append(MinuteCount(int(r["minute"]), ok, dead, ok_est, dead_est))
    first = rows[0] if rows else {"hour_succeeded": 0, "hour_dead": 0}
    succeeded = [(m.succeeded, m.succeeded_estimated) for m in minutes]
    dead_minutes = [(m.dead, m.dead_estimated) for m in minutes]
    return Throughput(
        minutes,
        _hour_total(first["hour_succeeded"], succeeded, per_minute, hour_cap),
        _hour_total(first["hour_dead"], dead_minutes, per_minute, hour_cap),
        hour_cap,
    )


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead jobs sharing a task, an error code and a message fingerprint."""

    task: str
    error_code: str
    fingerprint: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample_job_id: int
    sample_message: str
    queues: list[str]

    @property
    def key(self) -> str:
        """The group's identity in URLs and forms."""
        return json.dumps([self.task, self.error_code, self.fingerprint], separators=(",", ":"))


def dead_groups(sample: int = DEAD_GROUP_SAMPLE) -> Op[tuple[list[DeadGroup], bool]]:
    """Dead-letter groups over the newest dead jobs; True when the sample was full."""
    rows = yield Execute("dashboard_dead_groups", {"cap": sample}, rows="dict")
    groups = [DeadGroup(**r) for r in rows]
    return groups, sum(g.count for g in groups) >= sample


def parse_group_key(key: str) -> tuple[str, str, str]:
    """(task, error code, fingerprint) from :attr:`DeadGroup.key`."""
    try:
        task, code, fingerprint = json.loads(key)
        if not all(isinstance(v, str) for v in (task, code, fingerprint)):
            raise ValueError(key)
    except (ValueError, TypeError):
        raise InvalidOption(f"invalid dead-letter group {key!r}") from None
    return task, code, fingerprint


def dead_group_batch(
    group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
) -> Op[tuple[list[int], tuple[datetime, int] | None]]:
    """The ids of one group among the next ``scan`` dead jobs of its task, and
    the cursor after them (None when the task has no more dead jobs)."""
    task, code, fingerprint = group
    rows = yield Execute(
        "dashboard_dead_group_ids",
        {
            "task": task,
            "after_finished": cursor[0] if cursor else None,
            "after_id": cursor[1] if cursor else None,
            "limit": scan,
        },
        rows="dict",
    )
    ids = [r["id"] for r in rows if r["error_code"] == code and r["fingerprint"] == fingerprint]
    after = (rows[-1]["finished_at"], rows[-1]["id"]) if len(rows) == scan else None
    return ids, after


def change_mark() -> Op[tuple[Any, ...]]:
    """A tuple that changes whenever jobs, queues or workers change."""
    row = yield Execute("dashboard_change_mark", {}, fetch="one")
    return tuple(row or ())
