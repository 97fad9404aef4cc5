"""The JobContext a task receives with ``pass_context=True``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class JobContext:
    """What a running task may know and do about its own job.

    ``should_stop()`` turns true once the job is cancelled or the worker is
    shutting down; long tasks should check it and return early.
    ``extend(seconds)`` asks the worker to push this job's lease to now +
    seconds at once (the heartbeat does it; the call does not block).
    """

    job_id: int
    attempt: int
    attempt_id: int
    queue: str
    task: str
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _extend: Callable[[float], None] | None = field(default=None, repr=False)

    def should_stop(self) -> bool:
        """True once the job was cancelled or the worker is shutting down."""
        return self._stop.is_set()

    def extend(self, seconds: float) -> None:
        """Ask for the lease to be extended to now + ``seconds``."""
        if self._extend is not None:
            self._extend(seconds)

    def request_stop(self) -> None:
        """Set by the worker; tasks use :meth:`should_stop`."""
        self._stop.set()
