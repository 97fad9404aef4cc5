"""Worker options, validated once."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pgqueue import validation
from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidOption

EVENT_LOOPS = ("auto", "asyncio", "uvloop")
#: Allocations between two young-generation collections while a worker runs (tune_gc).
GC_THRESHOLD = 20_000


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker runs.

    - ``queues``: names to serve; None serves every queue (an empty list is refused).
    - ``concurrency``: jobs running at once in this process.
    - ``batch_size``: most jobs leased per statement (default: concurrency, at most 500).
    - ``poll_interval``: seconds between polls when no notification arrives.
    - ``shutdown_timeout``: seconds running jobs get to finish on SIGTERM
      before they are handed back.
    - ``listen``: wake on LISTEN/NOTIFY (False behind a transaction-mode PgBouncer).
    - ``scheduler``: run the cron scheduler in this worker.
    - ``maintenance``: take part in the fleet's maintenance (retention: one
      worker at a time deletes finished jobs past their retention).
    - ``reap_interval``: seconds between reaper runs.
    - ``heartbeat_interval``: seconds between heartbeat ticks.
    - ``unknown_task_grace``: seconds after enqueue during which jobs of a
      task this worker does not know are handed back (for a worker that
      knows it) instead of dead-lettered as ``unknown_task`` (default 1 h).
    - ``metrics_port``: serve Prometheus metrics at ``/metrics`` on this port
      (needs ``pgqueue[metrics]``; 0 picks a free port); None: no metrics.
    - ``metrics_host``: the address the metrics server binds to.
    - ``event_loop``: ``auto`` (uvloop when installed, e.g. by
      ``pgqueue[speed]``), ``asyncio`` or ``uvloop``; only :func:`run_worker`
      (and ``pgqueue worker``) create a loop, ``run_worker_async`` runs on
      the caller's.
    - ``tune_gc``: while the worker runs, freeze the objects that exist at
      start in the garbage collector and collect less often (a threshold of
      ``GC_THRESHOLD`` instead of 700 allocations): a leased batch allocates
      thousands of short-lived objects, and the default threshold made the
      collector a third of the worker's CPU. Restored when the worker stops.
    """

    queues: tuple[str, ...] | None = None
    concurrency: int = 10
    batch_size: int = 10
    poll_interval: float = 2.0
    shutdown_timeout: float = 30.0
    listen: bool = True
    scheduler: bool = True
    maintenance: bool = True
    reap_interval: float = 5.0
    heartbeat_interval: float = 1.0
    worker_id: str = field(default_factory=default_worker_id)
    install_signal_handlers: bool = True
    log_level: str | None = None
    log_format: str | None = None
    unknown_task_grace: float = 3600.0
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    event_loop: str = "auto"
    tune_gc: bool = True

    @classmethod
    def build(
        cls,
        queues: Sequence[str] | None = None,
        *,
        concurrency: int = 10,
        batch_size: int | None = None,
        poll_interval: float = 2.0,
        shutdown_timeout: float = 30.0,
        listen: bool = True,
        scheduler: bool = True,
        maintenance: bool = True,
        reap_interval: float = 5.0,
        heartbeat_interval: float = 1.0,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        log_level: str | None = None,
        log_format: str | None = None,
        unknown_task_grace: float | timedelta | str = 3600.0,
        metrics_port: int | None = None,
        metrics_host: str = "0.0.0.0",
        event_loop: str = "auto",
        tune_gc: bool = True,
    ) -> WorkerSettings:
        names = validation.queue_list(queues)
        concurrency = validation.positive_int("concurrency", concurrency, 100_000)
        if batch_size is None:
            batch_size = min(concurrency, 500)
        batch_size = validation.positive_int("batch_size", batch_size, 100_000)
        if log_format not in (None, "auto", "console", "json"):
            raise InvalidOption(f"log_format must be auto, console or json, got {log_format!r}")
        if metrics_port is not None and (
            isinstance(metrics_port, bool)
            or not isinstance(metrics_port, int)
            or not 0 <= metrics_port <= 65535
        ):
            raise InvalidOption(f"metrics_port must be a TCP port (0-65535), got {metrics_port!r}")
        if not isinstance(metrics_host, str) or not metrics_host:
            raise InvalidOption(f"metrics_host must be an address, got {metrics_host!r}")
        if event_loop not in EVENT_LOOPS:
            raise InvalidOption(
                f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {event_loop!r}"
            )
        return cls(
            queues=names,
            concurrency=concurrency,
            batch_size=min(batch_size, concurrency),
            poll_interval=validation.seconds("poll_interval", poll_interval, allow_zero=False),
            shutdown_timeout=validation.seconds("shutdown_timeout", shutdown_timeout),
            listen=bool(listen),
            scheduler=bool(scheduler),
            maintenance=bool(maintenance),
            reap_interval=validation.seconds("reap_interval", reap_interval, allow_zero=False),
            heartbeat_interval=validation.seconds(
                "heartbeat_interval", heartbeat_interval, allow_zero=False
            ),
            worker_id=worker_id or default_worker_id(),
            install_signal_handlers=bool(install_signal_handlers),
            log_level=log_level,
            log_format=log_format,
            unknown_task_grace=validation.seconds(
                "unknown_task_grace",
                parse_duration(unknown_task_grace)
                if isinstance(unknown_task_grace, str)
                else unknown_task_grace,
            ),
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            event_loop=event_loop,
            tune_gc=bool(tune_gc),
        )


def for_app(
    listen_dsn: str | None, queues: Sequence[str] | None, options: Mapping[str, Any]
) -> WorkerSettings:
    """The settings of ``run_worker(queues, **options)`` on an App whose LISTEN
    connection goes to ``listen_dsn``: with none possible (``listen=False``,
    or a transaction pooler without ``listen_dsn``) the worker polls."""
    rest = dict(options)
    requested = bool(rest.pop("listen", True))
    return WorkerSettings.build(queues=queues, listen=listen_dsn is not None and requested, **rest)
