"""Lease cursors: where the worker's next lease of each queue starts.

A lease that scans the ready index from its head walks past the entries of
every job leased and finished since vacuum last ran. While a long
transaction elsewhere holds the xmin horizon back (an analytics query, a
``pg_dump``), vacuum can remove none of them and every lease walks further:
the drain slows down more the longer the transaction lasts. So the worker
remembers, per queue, the lease-order key ``(priority, run_at, id)`` of the
last job it leased, and its next lease of that queue starts after it
(``lease_jobs``' ``p_after``).

A job can become ready behind a cursor: a transaction that began before the
last lease commits its enqueue after it, a job of a higher priority arrives,
a retry, a nack, a released serial key or workflow step. Every such write
announces the job's key on the schema's key channel (``announce_ready``), and
:meth:`LeaseCursors.rewind` moves the cursor back to just before it. A key
announced while a lease is in flight is applied after that lease's result,
so the lease cannot move the cursor past a job it did not see.

What no announcement covers (a concurrent lease that locked jobs and then
rolled back) is caught by :meth:`LeaseCursors.reset`, after every LISTEN
reconnection and every ``RESET_SECONDS``: the queues are discovered again and
scanned from their heads once.

No I/O here: the producer asks :meth:`request` what to send, and hands the
result to :meth:`advance`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

__all__ = ["RESET_SECONDS", "LeaseCursors", "LeaseKey", "parse_announcement"]

#: How often the cursors are dropped and every queue is scanned from its head
#: once (a bound on how long a job no announcement covered can wait).
RESET_SECONDS = 300.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LeaseKey(NamedTuple):
    """A job's position in lease order: priority (higher first), run_at, id."""

    priority: int
    run_at: datetime
    job_id: int

    def order(self) -> tuple[int, datetime, int]:
        """Sorts as the lease takes jobs."""
        return (-self.priority, self.run_at, self.job_id)

    def just_before(self) -> LeaseKey:
        """The cursor whose scan starts with this very job."""
        return LeaseKey(self.priority, self.run_at, self.job_id - 1)

    @classmethod
    def at(cls, priority: int, run_at_us: int, job_id: int) -> LeaseKey:
        """The key with run_at given in microseconds since the epoch."""
        return cls(priority, _EPOCH + timedelta(microseconds=run_at_us), job_id)

    def to_json(self) -> list[Any]:
        return [self.priority, self.run_at.isoformat(), self.job_id]


def parse_announcement(payload: str) -> tuple[str, LeaseKey] | None:
    """``'queue priority run_at_us id'`` (announce_ready) as (queue, key);
    None for anything else (anyone may NOTIFY on the channel)."""
    parts = payload.split(" ")
    if len(parts) != 4 or not parts[0]:
        return None
    try:
        return parts[0], LeaseKey.at(int(parts[1]), int(parts[2]), int(parts[3]))
    except (ValueError, OverflowError):
        return None


class LeaseCursors:
    """The cursors of one worker (``queues``: the queues it serves, None:
    every queue, learnt from a discovery and from the announcements).

    A queue without a key is scanned from its head: for a worker of given
    queues, every queue it has not leased from yet; for an every-queue
    worker, ``keys`` lists the queues it leases from at all (the lease reads
    no other queue)."""

    def __init__(self, queues: Sequence[str] | None, *, clock: Any = time.monotonic) -> None:
        self.queues = frozenset(queues) if queues is not None else None
        self.clock = clock
        self.keys: dict[str, LeaseKey | None] = {}
        self.active = False  # only while the key channel is listened to
        self.discovered = False  # every-queue workers: the ready queues are known
        self.reset_at = clock()
        # Announcements received while a lease is in flight (None: no lease).
        self.pending: dict[str, LeaseKey | None] | None = None

    # --- state changes ------------------------------------------------------------

    def activate(self) -> None:
        """The key channel is listened to (again): start from the heads."""
        self.active = True
        self.reset()

    def deactivate(self) -> None:
        """Announcements may be missed from now on: lease from the heads."""
        self.active = False
        self.reset()

    def reset(self) -> None:
        """Scan every queue from its head once; an every-queue worker also
        discovers the ready queues again."""
        self.keys = dict.fromkeys(self.keys) if self.queues is None else {}
        self.discovered = False
        self.reset_at = self.clock()
        self.pending = None  # the lease in flight must not set a cursor

    def maybe_reset(self) -> None:
        """Reset once every :data:`RESET_SECONDS`."""
        if self.clock() - self.reset_at >= RESET_SECONDS:
            self.reset()

    def rewind(self, queue: str, key: LeaseKey | None) -> None:
        """A job became ready in ``queue`` at ``key`` (None: somewhere)."""
        if self.queues is not None and queue not in self.queues:
            return
        target = None if key is None else key.just_before()
        self._lower(queue, target)
        if self.pending is not None:
            known = self.pending.get(queue, target)
            if known is not None and (target is None or target.order() < known.order()):
                known = target
            self.pending[queue] = known

    def know(self, queue: str) -> None:
        """``queue`` may hold ready jobs: an every-queue worker leases from it
        from now on (from its head, unless a key is announced for it)."""
        if self.queues is None and queue not in self.keys:
            self.keys[queue] = None

    def discovered_queues(self, queues: Iterable[str]) -> None:
        """The queues an every-queue worker found holding ready jobs."""
        for queue in queues:
            self.keys[queue] = None  # ready jobs may precede any key announced meanwhile
        self.discovered = True

    # --- one lease ----------------------------------------------------------------

    def needs_discovery(self) -> bool:
        """An every-queue worker must learn which queues hold ready jobs first."""
        return self.active and self.queues is None and not self.discovered

    def request(self) -> dict[str, Any] | None:
        """``p_after`` for the next lease (None: no cursors, scan from the
        heads), and begin collecting what is announced while it runs."""
        if not self.active or self.needs_discovery():
            return None
        self.pending = {}
        return {q: (k.to_json() if k is not None else None) for q, k in self.keys.items()}

    def advance(self, leased: Iterable[tuple[str, LeaseKey, bool]]) -> None:
        """The lease sent with :meth:`request` returned these (queue, key,
        ordered), in lease order; ordered is False where task limits skipped
        jobs, which no cursor may pass."""
        pending, self.pending = self.pending, None
        if pending is None:  # reset meanwhile
            return
        last: dict[str, LeaseKey | None] = {}
        unordered: set[str] = set()
        for queue, key, ordered in leased:
            if not ordered:
                unordered.add(queue)
            last[queue] = None if queue in unordered else key
        self.keys.update(last)
        for queue, announced in pending.items():
            self._lower(queue, announced)

    def abandon(self) -> None:
        """The lease failed: keep the cursors, apply what was announced."""
        pending, self.pending = self.pending, None
        for queue, key in (pending or {}).items():
            self._lower(queue, key)

    def _lower(self, queue: str, key: LeaseKey | None) -> None:
        """Move ``queue``'s cursor back to ``key`` (None: the head) if it is
        further on."""
        if queue not in self.keys:
            if self.queues is None:  # an every-queue worker learns of a queue
                self.keys[queue] = key
            return  # not leased from yet: scanned from the head anyway
        current = self.keys[queue]
        if current is not None and (key is None or key.order() < current.order()):
            self.keys[queue] = key
