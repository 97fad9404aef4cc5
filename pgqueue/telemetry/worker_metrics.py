"""Prometheus metrics of one worker process (``pgqueue[metrics]``).

Off the hot path: a finishing job adds to plain dicts and bucket lists on
the event loop; nothing touches prometheus_client until a scrape, when
:class:`WorkerMetrics` (a custom collector) turns the totals into metric
families. Served by prometheus_client's HTTP server on ``metrics_port``.

Several worker processes on one host: give each its own port (e.g.
``--metrics-port 9100``, ``9101``, ...) and one scrape target each; the
``worker_id`` label of ``pgqueue_worker_info`` tells them apart.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.errors import InvalidOption
from pgqueue.telemetry.errors import DATABASE_ERRORS
from pgqueue.telemetry.observer import WorkerObserver

if TYPE_CHECKING:
    from pgqueue.worker.executor import RunningJob

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0, 900.0, 3600.0)  # fmt: skip
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0, 3600.0, 21600.0, 86400.0)  # fmt: skip


class Histogram:
    """Bucket counts and a sum; buckets are upper bounds (the last, +Inf, implied)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        out: list[tuple[str, float]] = []
        running = 0
        counts = list(self.counts)
        for bound, count in zip(self.bounds, counts, strict=False):
            running += count
            out.append((_bound(bound), running))
        out.append(("+Inf", running + counts[-1]))
        return out, self.total


def _bound(value: float) -> str:
    return repr(float(value))


def _metrics_module() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise InvalidOption(
            "metrics_port needs prometheus_client: pip install 'pgqueue[metrics]'"
        ) from None
    return prometheus_client


class WorkerMetrics(WorkerObserver):
    """Counts jobs as they finish; a prometheus_client collector on scrape."""

    def __init__(self, worker_id: str, version: str) -> None:
        self.worker_id = worker_id
        self.version = version
        self.completed: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.durations: dict[tuple[str, str], Histogram] = {}
        self.waits: dict[str, Histogram] = {}
        self.running: defaultdict[str, int] = defaultdict(int)
        self.server: Any = None
        self.registry: Any = None

    @classmethod
    def serve(cls, port: int, worker_id: str, version: str, host: str = "0.0.0.0") -> WorkerMetrics:
        """Start the HTTP server on ``port`` (0: any free port, see ``.port``)
        with a registry holding only these metrics."""
        prometheus_client = _metrics_module()
        metrics = cls(worker_id, version)
        metrics.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        metrics.registry.register(metrics)
        server, _thread = prometheus_client.start_http_server(
            port, addr=host, registry=metrics.registry
        )
        metrics.server = server
        structlog.get_logger("pgqueue.worker").info(
            "serving metrics", port=metrics.port, host=host, path="/metrics"
        )
        return metrics

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_port)

    # --- hooks (event loop) --------------------------------------------------

    def started(self, rj: RunningJob) -> None:
        job = rj.job
        self.running[job.queue] += 1
        run_at = getattr(job, "run_at", None)
        if run_at is not None:
            leased = job.lease_expires_at.timestamp() - job.lease_seconds
            wait = self.waits.get(job.queue)
            if wait is None:
                wait = self.waits[job.queue] = Histogram(WAIT_BUCKETS)
            wait.observe(max(0.0, leased - run_at.timestamp()))

    def finished(self, rj: RunningJob, outcome: str, error: BaseException | None) -> None:
        job = rj.job
        self.running[job.queue] -= 1
        self.completed[(job.queue, job.task, outcome)] += 1
        key = (job.queue, job.task)
        duration = self.durations.get(key)
        if duration is None:
            duration = self.durations[key] = Histogram(DURATION_BUCKETS)
        duration.observe(time.monotonic() - rj.started)

    wants_lease_details = True

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # --- collector (scrape thread) -----------------------------------------

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        info = GaugeMetricFamily(
            "pgqueue_worker_info", "This worker process.", labels=["worker_id", "version"]
        )
        info.add_metric([self.worker_id, self.version], 1)
        yield info
        completed = CounterMetricFamily(
            "pgqueue_jobs_completed",
            "Attempts ended by this worker, by outcome.",
            labels=["queue", "task", "outcome"],
        )
        for (queue, task, outcome), n in list(self.completed.items()):
            completed.add_metric([queue, task, outcome], n)
        yield completed
        duration = HistogramMetricFamily(
            "pgqueue_job_duration_seconds",
            "Run time of attempts, from start to end.",
            labels=["queue", "task"],
        )
        for (queue, task), hist in list(self.durations.items()):
            buckets, total = hist.cumulative()
            duration.add_metric([queue, task], buckets, total)
        yield duration
        wait = HistogramMetricFamily(
            "pgqueue_job_wait_seconds",
            "Time from a job's run_at to its lease (server clock).",
            labels=["queue"],
        )
        for queue, hist in list(self.waits.items()):
            buckets, total = hist.cumulative()
            wait.add_metric([queue], buckets, total)
        yield wait
        running = GaugeMetricFamily(
            "pgqueue_jobs_running", "Jobs running in this worker.", labels=["queue"]
        )
        for queue, n in list(self.running.items()):
            running.add_metric([queue], n)
        yield running
        errors = CounterMetricFamily(
            "pgqueue_database_errors",
            "Database errors the worker's loops rode out, by kind.",
            labels=["kind"],
        )
        for kind, n in list(DATABASE_ERRORS.items()):
            errors.add_metric([kind], n)
        yield errors
