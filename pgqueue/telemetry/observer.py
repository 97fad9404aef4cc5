"""The worker's observation hooks: what the executor and producer tell
metrics and tracing, and nothing more.

The executor calls :meth:`WorkerObserver.leased` once per leased batch,
:meth:`WorkerObserver.started` when a job starts and
:meth:`WorkerObserver.finished` once when its attempt ends; all are plain
bookkeeping on the event loop (no I/O, no locks). With the default observer
(no metrics, no tracing) the executor makes none of these calls.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from pgqueue.models import LeasedJob


class ObservedJob(Protocol):
    """What observers read of a running job (the worker's
    :class:`pgqueue.worker.executor.RunningJob`); named here so that
    telemetry imports nothing of the worker above it."""

    #: The observer's per-job state (a span), kept on the job.
    observed: Any

    @property
    def job(self) -> LeasedJob: ...
    @property
    def started(self) -> float: ...
    @property
    def handle(self) -> asyncio.Future[Any] | None: ...


class ChildCounts(Protocol):
    """What the metrics read of a process pool (``--pool process``) at scrape time."""

    @property
    def alive(self) -> int: ...
    @property
    def replaced(self) -> Mapping[str, int]: ...


class WorkerObserver:
    """No-op base: subclasses override what they need."""

    #: Whether leases must also return each job's run_at and trace context.
    wants_lease_details = False

    def observes_starts(self) -> bool:
        """Whether :meth:`started` does anything (else the executor skips it)."""
        return type(self).started is not WorkerObserver.started

    def leased(self, jobs: Sequence[LeasedJob]) -> None:
        """A batch was leased (called once per batch, before its jobs start)."""

    def started(self, rj: ObservedJob) -> None:
        """A leased job is about to run (or be failed without running)."""

    def run_context(self, rj: ObservedJob) -> contextvars.Context | None:
        """The context the task should run in (None: the current one)."""
        return None

    def finished(self, rj: ObservedJob, outcome: str, error: BaseException | None) -> None:
        """The job's attempt ended with ``outcome`` (an attempt outcome, or
        ``lease_lost`` / ``released`` when its outcome is not recorded)."""

    def close(self) -> None:
        """The worker stopped."""


NULL_OBSERVER = WorkerObserver()


class Observers(WorkerObserver):
    """Several observers as one (metrics and tracing)."""

    def __init__(self, observers: list[WorkerObserver]) -> None:
        self.observers = observers
        self.wants_lease_details = any(o.wants_lease_details for o in observers)

    def leased(self, jobs: Sequence[LeasedJob]) -> None:
        for o in self.observers:
            o.leased(jobs)

    def observes_starts(self) -> bool:
        return any(o.observes_starts() for o in self.observers)

    def started(self, rj: ObservedJob) -> None:
        for o in self.observers:
            o.started(rj)

    def run_context(self, rj: ObservedJob) -> contextvars.Context | None:
        for o in self.observers:
            ctx = o.run_context(rj)
            if ctx is not None:
                return ctx
        return None

    def finished(self, rj: ObservedJob, outcome: str, error: BaseException | None) -> None:
        for o in self.observers:
            o.finished(rj, outcome, error)

    def close(self) -> None:
        for o in self.observers:
            o.close()


def build_observer(
    settings: Any,
    version: str,
    running: Mapping[int, ObservedJob],
    children: ChildCounts | None = None,
) -> WorkerObserver:
    """The observer for a worker's settings: metrics when ``metrics_port`` is
    set, tracing when opentelemetry is installed and a tracer provider is
    configured; the no-op observer otherwise. ``running`` is the executor's
    table of jobs not yet recorded (read, never changed); ``children`` counts
    the child processes of ``--pool process``."""
    observers: list[WorkerObserver] = []
    port = getattr(settings, "metrics_port", None)
    if port is not None:
        from pgqueue.telemetry.worker_metrics import WorkerMetrics

        observers.append(
            WorkerMetrics.serve(
                port,
                settings.worker_id,
                version,
                getattr(settings, "metrics_host", "0.0.0.0"),
                running,
                children,
                getattr(settings, "pool", "thread"),
            )
        )
    from pgqueue.telemetry import tracing

    if tracing.enabled():
        observers.append(tracing.TracingObserver())
    if not observers:
        return NULL_OBSERVER
    return observers[0] if len(observers) == 1 else Observers(observers)
