"""Worker options, validated once."""

from __future__ import annotations

import os
import re
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
POOLS = ("thread", "process")
_MEMORY_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "KIB": 1024,
    "M": 1000**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1000**3,
    "GB": 1000**3,
    "GIB": 1024**3,
}
#: Allocations between two young-generation collections while a worker runs (tune_gc).
GC_THRESHOLD = 20_000


def parse_memory(name: str, value: int | str) -> int:
    """A memory size in bytes: an integer of bytes, or text such as ``512MB``,
    ``1.5GiB``, ``800K`` (K/M/G are powers of 1000, KiB/MiB/GiB of 1024)."""
    if isinstance(value, bool):
        raise InvalidOption(f"{name} must be a size such as 512MB, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _MEMORY_UNITS:
            raise InvalidOption(f"{name} must be a size such as 512MB, 1GiB or 800K, got {value!r}")
        size = int(float(match.group(1)) * _MEMORY_UNITS[unit])
    else:
        raise InvalidOption(f"{name} must be a size such as 512MB, got {value!r}")
    if size <= 0:
        raise InvalidOption(f"{name} must be more than 0 bytes, got {value!r}")
    return size


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
    - ``pool``: where sync tasks run: ``thread`` (a thread pool in the worker
      process) or ``process`` (``concurrency`` child processes, each running
      one task at a time, with hard time limits; async tasks stay on the loop).
    - ``app_path``: ``pkg.module:app`` for the children of ``pool="process"``
      to import the App from (found among the imported modules when None).
    - ``kill_grace``: seconds between SIGTERM and SIGKILL of a child past its
      task's timeout, and between a cancel and stopping the child.
    - ``max_tasks_per_child``: replace a child after this many tasks.
    - ``max_memory_per_child``: replace a child after the task that leaves
      its resident memory at or above this many bytes (or ``"512MB"``).
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
    pool: str = "thread"
    app_path: str | None = None
    kill_grace: float = 5.0
    max_tasks_per_child: int | None = None
    max_memory_per_child: int | None = None

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
        pool: str = "thread",
        app_path: str | None = None,
        kill_grace: float | timedelta | str = 5.0,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | str | None = None,
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
        if pool not in POOLS:
            raise InvalidOption(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        if app_path is not None and (not isinstance(app_path, str) or ":" not in app_path):
            raise InvalidOption(f"app_path must look like pkg.module:app, got {app_path!r}")
        if max_tasks_per_child is not None:
            max_tasks_per_child = validation.positive_int(
                "max_tasks_per_child", max_tasks_per_child, 1_000_000_000
            )
        memory = (
            None
            if max_memory_per_child is None
            else parse_memory("max_memory_per_child", max_memory_per_child)
        )
        if pool != "process" and (max_tasks_per_child is not None or memory is not None):
            raise InvalidOption("max_tasks_per_child and max_memory_per_child need pool='process'")
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
            pool=pool,
            app_path=app_path,
            kill_grace=validation.seconds("kill_grace", kill_grace),
            max_tasks_per_child=max_tasks_per_child,
            max_memory_per_child=memory,
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
