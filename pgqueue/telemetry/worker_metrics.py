"""Prometheus metrics of one worker process (``pgqueue[metrics]``).

Off the hot path: a leased batch adds its wait times to a histogram in one
pass, a finishing job adds to a few plain ints and floats on the event loop;
nothing touches prometheus_client until a scrape,
when :class:`WorkerMetrics` (a custom collector) turns the totals into metric
families. The running gauge is counted from the executor's own table at
scrape time. Served by prometheus_client's HTTP server on ``metrics_port``.

Several worker processes on one host: give each its own port (e.g.
``--metrics-port 9100``, ``9101``, ...) and one scrape target each; the
``worker_id`` label of ``pgqueue_worker_info`` tells them apart.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Any

import structlog

from pgqueue.errors import InvalidOption
from pgqueue.telemetry.errors import DATABASE_ERRORS
from pgqueue.telemetry.observer import ChildCounts, ObservedJob, WorkerObserver

if TYPE_CHECKING:
    from pgqueue.models import LeasedJob

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0, 900.0, 3600.0)  # fmt: skip
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0, 3600.0, 21600.0, 86400.0)  # fmt: skip


class Histogram:
    """Bucket counts and a sum; ``bounds`` are upper bounds (+Inf implied)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Prometheus buckets (``le`` label, cumulative count) and the sum."""
        out: list[tuple[str, float]] = []
        counts, running = list(self.counts), 0
        for bound, count in zip(self.bounds, counts, strict=False):
            running += count
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + counts[-1]))
        return out, self.total


class TaskStats:
    """What finished attempts of one (queue, task) add up to."""

    __slots__ = ("durations", "outcomes")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.durations = Histogram(DURATION_BUCKETS)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise InvalidOption(
            "metrics_port needs prometheus_client: pip install 'pgqueue[metrics]'"
        ) from None
    return prometheus_client


class WorkerMetrics(WorkerObserver):
    """Counts jobs as they start and finish; a prometheus_client collector on scrape."""

    wants_lease_details = True

    def __init__(
        self,
        worker_id: str,
        version: str,
        running: Mapping[int, ObservedJob] | None = None,
        children: ChildCounts | None = None,
        pool: str = "thread",
    ) -> None:
        self.children = children  # --pool process: its child processes
        self.pool = pool  # where sync tasks run: thread or process
        self.worker_id = worker_id
        self.version = version
        self.tasks: dict[tuple[str, str], TaskStats] = {}
        self.waits: dict[str, Histogram] = {}
        #: The executor's table of jobs not yet recorded (read, never changed).
        self.running: Mapping[int, ObservedJob] = {} if running is None else running
        self.server: Any = None

    @classmethod
    def serve(
        cls,
        port: int,
        worker_id: str,
        version: str,
        host: str = "0.0.0.0",
        running: Mapping[int, ObservedJob] | None = None,
        children: ChildCounts | None = None,
        pool: str = "thread",
    ) -> WorkerMetrics:
        """Start the HTTP server on ``port`` (0: any free port, see ``.port``)
        with a registry holding only these metrics."""
        prometheus_client = _prometheus()
        metrics = cls(worker_id, version, running, children, pool)
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(metrics)
        metrics.server, _thread = prometheus_client.start_http_server(
            port, addr=host, registry=registry
        )
        structlog.get_logger("pgqueue.worker").info(
            "serving metrics", port=metrics.port, host=host, path="/metrics"
        )
        return metrics

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_port)

    # --- hooks (event loop) --------------------------------------------------

    def leased(self, jobs: Sequence[LeasedJob]) -> None:
        # One pass per batch; most batches come from one queue.
        waits = self.waits
        queue, hist = None, None
        for job in jobs:
            wait = job.wait_seconds
            if wait is None:
                continue
            if job.queue != queue:
                queue = job.queue
                hist = waits.get(queue)
                if hist is None:
                    hist = waits[queue] = Histogram(WAIT_BUCKETS)
            assert hist is not None
            hist.observe(wait if wait > 0.0 else 0.0)

    def finished(self, rj: ObservedJob, outcome: str, error: BaseException | None) -> None:
        # Plain arithmetic on the event loop: a dict lookup, two additions
        # and a bisection; prometheus_client sees these totals only on scrape.
        job = rj.job
        key = (job.queue, job.task)
        stats = self.tasks.get(key)
        if stats is None:
            stats = self.tasks[key] = TaskStats()
        outcomes = stats.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        hist = stats.durations
        duration = _monotonic() - rj.started
        hist.counts[bisect_left(hist.bounds, duration)] += 1
        hist.total += duration

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # --- collector (the scrape thread) ---------------------------------------

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
        pool = GaugeMetricFamily(
            "pgqueue_worker_pool_info",
            "Where this worker runs sync tasks (--pool): thread or process.",
            labels=["pool"],
        )
        pool.add_metric([self.pool], 1)
        yield pool
        tasks = list(self.tasks.items())
        completed = CounterMetricFamily(
            "pgqueue_jobs_completed",
            "Attempts ended by this worker, by outcome.",
            labels=["queue", "task", "outcome"],
        )
        duration = HistogramMetricFamily(
            "pgqueue_job_duration_seconds",
            "Run time of attempts, from start to end.",
            labels=["queue", "task"],
        )
        for (queue, task), stats in tasks:
            for outcome, n in list(stats.outcomes.items()):
                completed.add_metric([queue, task, outcome], n)
            buckets, total = stats.durations.cumulative()
            duration.add_metric([queue, task], buckets, total)
        yield completed
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
        counts = Counter(
            rj.job.queue for rj in list(self.running.values()) if rj.handle is not None
        )
        queues = set(counts) | set(self.waits) | {key[0] for key, _ in tasks}
        for name in sorted(queues):
            running.add_metric([name], counts.get(name, 0))
        yield running
        errors = CounterMetricFamily(
            "pgqueue_database_errors",
            "Database errors the worker's loops rode out, by kind.",
            labels=["kind"],
        )
        for kind, n in list(DATABASE_ERRORS.items()):
            errors.add_metric([kind], n)
        yield errors
        if self.children is not None:
            alive = GaugeMetricFamily(
                "pgqueue_worker_children", "Child processes alive (--pool process)."
            )
            alive.add_metric([], self.children.alive)
            yield alive
            replaced = CounterMetricFamily(
                "pgqueue_worker_children_replaced",
                "Child processes replaced, by reason (crashed, timeout, cancel, max_tasks, "
                "max_memory, lease_lost, shutdown).",
                labels=["reason"],
            )
            for reason, n in sorted(self.children.replaced.items()):
                replaced.add_metric([reason], n)
            yield replaced
