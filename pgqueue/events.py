"""The public event type and the wire format of the NOTIFY channel.

One channel per schema (``pgqueue.<schema>``) carries short hints, for the
worker's wake-ups and for :meth:`pgqueue.App.subscribe`:

=========================  ==================================================
payload                    meaning
=========================  ==================================================
``j:<queue>``              new ready jobs in ``queue`` (one or many; a batch
                           may have stored scheduled jobs too)
``j:<queue>#<id>``         one new ready job (the first enqueue of its
                           transaction into that queue; ``#`` never occurs in
                           a queue name)
``w:<queue>``              no new ready job, but workers may want to wake: a
                           scheduled job or retry was stored, or a slot of a
                           concurrency-limited queue freed
``p:<queue>`` /            ``queue`` was paused / resumed
``r:<queue>``
``q:<queue>``              ``queue``'s limits changed
``f:<id>:<status>:<queue>``  a job someone waits on (``result()``) finished
``c:<id>``                 a running job was asked to stop (its worker acts)
``s:<name>``               a schedule was added, changed or removed
=========================  ==================================================

Notifications are hints: whoever receives one reads the database state.
"""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

from pgqueue.models import JobStatus

EventKind = Literal["enqueued", "finished", "paused", "resumed", "resync"]

#: Payload kinds that say a queue may have work for a worker to lease now.
WAKE_KINDS = frozenset("jwpqr")


class JobEvent(NamedTuple):
    """One event of :meth:`pgqueue.App.subscribe`.

    - ``enqueued``: new ready work in ``queue``. Coalesced: one event may
      stand for many jobs of one transaction; ``job_id`` is set when it was
      one job (and for a scheduled job or retry that became due).
    - ``finished``: the job ``job_id`` of ``queue`` ended with ``status``;
      sent for jobs someone waits on (e.g. ``app.result()``).
    - ``paused`` / ``resumed``: ``queue`` was paused or resumed.
    - ``resync``: the stream may have missed events (it reconnected, or the
      consumer fell behind its buffer); re-read the state you care about.

    Events are hints: act on the database state, never on an event alone.
    """

    kind: EventKind
    queue: str | None = None
    job_id: int | None = None
    status: JobStatus | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready fields (what ``pgqueue watch --json`` prints)."""
        return {
            "kind": self.kind,
            "queue": self.queue,
            "job_id": self.job_id,
            "status": None if self.status is None else str(self.status),
        }

    def to_json(self) -> str:
        """One JSON object on one line."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def __str__(self) -> str:
        parts: list[str] = [self.kind]
        if self.queue is not None:
            parts.append(f"queue={self.queue}")
        if self.job_id is not None:
            parts.append(f"job={self.job_id}")
        if self.status is not None:
            parts.append(f"status={self.status}")
        return " ".join(parts)


RESYNC = JobEvent("resync")


def parse(payload: str) -> JobEvent | None:
    """The event a notification payload stands for; None for worker-only
    hints and for payloads this version does not know."""
    kind, _, value = payload.partition(":")
    if not value:
        return None
    if kind == "j":
        queue, _, job = value.partition("#")
        return JobEvent("enqueued", queue, int(job) if job.isdigit() else None)
    if kind == "p":
        return JobEvent("paused", value)
    if kind == "r":
        return JobEvent("resumed", value)
    if kind == "f":
        job, _, rest = value.partition(":")
        status, _, queue = rest.partition(":")
        if not job.isdigit() or not queue:
            return None
        try:
            return JobEvent("finished", queue, int(job), JobStatus(status))
        except ValueError:
            return None
    return None


def wake_queue(payload: str) -> str | None:
    """The queue a notification asks workers to look at again, if any."""
    kind, _, value = payload.partition(":")
    if kind not in WAKE_KINDS or not value:
        return None
    return value.partition("#")[0] if kind == "j" else value
