"""Prometheus text of the database view (dashboard ``/metrics``):
``pgqueue_queue_jobs{queue,status}``, ``pgqueue_queue_oldest_ready_age_seconds{queue}``,
``pgqueue_queue_paused{queue}`` and ``pgqueue_workers_alive``. Counts past the
dashboard's cap are the planner's estimates (see :mod:`pgqueue.dashboard.data`)."""

from __future__ import annotations

from collections.abc import Sequence

from pgqueue.dashboard.data import QueueRow

_STATUSES = ("queued", "scheduled", "running", "succeeded", "dead", "cancelled")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(queues: Sequence[QueueRow], workers_alive: int) -> str:
    """The exposition text (format 0.0.4)."""
    lines = [
        "# HELP pgqueue_queue_jobs Jobs per queue and status (succeeded: last hour).",
        "# TYPE pgqueue_queue_jobs gauge",
    ]
    for q in queues:
        for status in _STATUSES:
            count = getattr(q, status)
            lines.append(
                f'pgqueue_queue_jobs{{queue="{_label(q.queue)}",status="{status}"}} {count.value}'
            )
    lines += [
        "# HELP pgqueue_queue_oldest_ready_age_seconds Age of the oldest ready job per queue.",
        "# TYPE pgqueue_queue_oldest_ready_age_seconds gauge",
    ]
    for q in queues:
        age = q.oldest_ready_age_seconds or 0.0
        lines.append(f'pgqueue_queue_oldest_ready_age_seconds{{queue="{_label(q.queue)}"}} {age}')
    lines += [
        "# HELP pgqueue_queue_paused 1 when the queue is paused.",
        "# TYPE pgqueue_queue_paused gauge",
    ]
    for q in queues:
        lines.append(f'pgqueue_queue_paused{{queue="{_label(q.queue)}"}} {int(q.paused)}')
    lines += [
        "# HELP pgqueue_workers_alive Workers with a recent heartbeat.",
        "# TYPE pgqueue_workers_alive gauge",
        f"pgqueue_workers_alive {workers_alive}",
    ]
    return "\n".join(lines) + "\n"
