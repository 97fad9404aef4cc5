"""The database view of the queues: what ``pgqueue metrics`` prints and a
dashboard serves at ``/metrics``.

Cheap by construction: every count stops at ``cap`` rows (an index range
scan of a partial index); a status whose sample hit the cap is scaled to the
planner's estimate of that status's rows and flagged ``estimated``. A status
the planner already puts far past the cap is only sampled (``SHARE_SAMPLE``
rows, for the per-queue shares of the estimate): at 1M jobs the view costs
a few milliseconds, not a read of 100,000 rows per status.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from pgqueue.ops import Execute, Op, OpContext

STATUSES = ("queued", "scheduled", "running", "succeeded", "dead", "cancelled")
DEFAULT_CAP = 10_000
#: Rows read for the per-queue shares of a status estimated far past the cap.
SHARE_SAMPLE = 1_000
#: A worker counts as alive while its heartbeat is younger than this (seconds).
WORKER_ALIVE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """One queue: jobs per status, oldest ready age (None: no ready job), paused."""

    queue: str
    jobs: dict[str, int]
    oldest_ready_age_seconds: float | None
    paused: bool
    #: Statuses whose count passed the cap and is an estimate.
    estimated: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueView:
    """Every queue's gauges and the number of live workers."""

    queues: list[QueueGauges]
    workers_alive: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def prometheus_text(self) -> str:
        """The view in the Prometheus text exposition format (version 0.0.4)."""
        lines = [
            "# HELP pgqueue_queue_jobs Jobs in the live table by queue and status "
            "(exact up to the cap, estimated beyond).",
            "# TYPE pgqueue_queue_jobs gauge",
        ]
        for q in self.queues:
            for status in STATUSES:
                lines.append(
                    f'pgqueue_queue_jobs{{queue="{_label(q.queue)}",status="{status}"}} '
                    f"{q.jobs.get(status, 0)}"
                )
        lines += [
            "# HELP pgqueue_queue_oldest_ready_age_seconds Age of the oldest ready job "
            "(0 when none is ready).",
            "# TYPE pgqueue_queue_oldest_ready_age_seconds gauge",
        ]
        for q in self.queues:
            age = q.oldest_ready_age_seconds or 0.0
            lines.append(
                f'pgqueue_queue_oldest_ready_age_seconds{{queue="{_label(q.queue)}"}} {age:.3f}'
            )
        lines += [
            "# HELP pgqueue_queue_paused 1 when the queue is paused.",
            "# TYPE pgqueue_queue_paused gauge",
        ]
        for q in self.queues:
            lines.append(f'pgqueue_queue_paused{{queue="{_label(q.queue)}"}} {int(q.paused)}')
        lines += [
            "# HELP pgqueue_workers_alive Registered workers with a recent heartbeat.",
            "# TYPE pgqueue_workers_alive gauge",
            f"pgqueue_workers_alive {self.workers_alive}",
        ]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def collect(
    ctx: OpContext, cap: int = DEFAULT_CAP, worker_alive_seconds: float = WORKER_ALIVE_SECONDS
) -> Op[QueueView]:
    """Read the view (a handful of bounded statements)."""
    live = yield Execute("metrics_queue_live", {"cap": cap}, rows="dict")
    rows = yield Execute("metrics_status_estimates", {})
    estimates: dict[str, int] = {status: n for status, n in rows}
    # Far past the cap: a small sample gives the shares, the planner the total.
    caps = {
        status: SHARE_SAMPLE if estimates.get(status, 0) > 4 * cap > SHARE_SAMPLE else cap
        for status in ("scheduled", "succeeded", "dead", "cancelled")
    }
    sample = yield Execute("metrics_status_sample", {f"cap_{k}": v for k, v in caps.items()})
    alive = yield Execute("metrics_workers_alive", {"seconds": worker_alive_seconds}, fetch="one")
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    capped: set[str] = set()
    for row in live:
        counts[row["queue"]]["queued"] = row["queued"]
        counts[row["queue"]]["running"] = row["running"]
        for status in ("queued", "running"):
            if row[status] >= cap:
                capped.add(status)
    sampled: dict[str, int] = defaultdict(int)
    for status, queue, n in sample:
        sampled["scheduled" if status == "queued" else status] += n
        counts[queue][status] = counts[queue].get(status, 0) + n
    for status in ("scheduled", "succeeded", "dead", "cancelled"):
        if sampled[status] >= caps[status]:
            capped.add(status)
    estimated: dict[str, list[str]] = defaultdict(list)
    for status in capped:
        total = sum(c.get(status, 0) for c in counts.values())
        estimate = estimates.get(status)
        if not total or estimate is None or estimate <= total:
            continue
        for queue, c in counts.items():
            if c.get(status):
                c[status] = round(c[status] * estimate / total)
                estimated[queue].append(status)
    queues = [
        QueueGauges(
            queue=row["queue"],
            jobs={s: counts[row["queue"]].get(s, 0) for s in STATUSES},
            oldest_ready_age_seconds=row["oldest_ready_age_seconds"],
            paused=row["paused"],
            estimated=sorted(estimated.get(row["queue"], [])),
        )
        for row in live
    ]
    return QueueView(queues=queues, workers_alive=int(alive[0]) if alive else 0)
