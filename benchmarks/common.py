"""Shared helpers: DSN handling, worker-process control, small statistics."""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_PREFIX = "pgqb_"


def with_dbname(dsn: str, dbname: str) -> str:
    """Return ``dsn`` (URL or key=value) pointing at ``dbname``, as a key=value string."""
    return make_conninfo(dsn, dbname=dbname)


def as_url(dsn: str) -> str:
    """Render a libpq DSN as a ``postgresql://`` URL (asyncpg takes URLs only)."""
    d = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    user = quote(d.pop("user", ""), safe="")
    password = d.pop("password", None)
    host = d.pop("host", "")
    port = d.pop("port", "")
    dbname = quote(d.pop("dbname", ""), safe="")
    auth = user + (":" + quote(password, safe="") if password else "")
    netloc = (auth + "@" if auth else "") + (
        f"[{host}]" if ":" in host and not host.startswith("/") else host
    )
    if port:
        netloc += f":{port}"
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in d.items())
    url = f"postgresql://{netloc}/{dbname}"
    if host.startswith("/"):
        # Unix socket: asyncpg reads host from the query string.
        url = f"postgresql://{auth + '@' if auth else ''}/{dbname}?host={quote(host, safe='')}"
        if port:
            url += f"&port={port}"
        if query:
            url += "&" + query
        return url
    return url + ("?" + query if query else "")


@dataclass
class WorkerOptions:
    """What a worker process is asked to do. Plain data: it crosses a process boundary."""

    record_starts: bool = False  # latency probe: note time.time() at every task start
    out_path: str | None = None  # where recorded starts are written at exit
    index: int = 0  # worker process number, 0-based
    profile: str = "throughput"  # or "latency": the idle-latency probe
    extra: dict[str, Any] = field(default_factory=dict)


class WorkerControl:
    """Handed to an adapter's worker entry point inside the child process.

    The adapter does all its setup (imports, connections, task registration),
    then calls :meth:`ready` and :meth:`wait_go`; it runs until
    :meth:`stop_requested` turns true (or :meth:`wait_stop` returns), and must
    call :meth:`on_task_start` as the first thing a task body does.
    """

    def __init__(
        self,
        opts: WorkerOptions,
        ready: Any,
        go: Any,
        stop: Any,
    ) -> None:
        self.opts = opts
        self._ready = ready
        self._go = go
        self._stop = stop
        self._starts: list[tuple[int, float]] = []
        self._lock = threading.Lock()
        self.record = opts.record_starts

    def ready(self) -> None:
        self._ready.set()

    def wait_go(self, timeout: float = 600.0) -> None:
        if not self._go.wait(timeout):
            raise TimeoutError("worker was never told to start")

    def stop_requested(self) -> bool:
        return bool(self._stop.is_set())

    def wait_stop(self, timeout: float | None = None) -> bool:
        return bool(self._stop.wait(timeout))

    def on_task_start(self, job_id: int) -> None:
        if self.record:
            t = time.time()
            with self._lock:
                self._starts.append((int(job_id), t))

    def flush(self) -> None:
        if self.opts.out_path:
            Path(self.opts.out_path).write_text(json.dumps(self._starts))


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def percentile(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``xs``."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return float(s[k])


def fmt_num(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    ax = abs(x)
    if ax >= 100_000:
        s = f"{x / 1000:,.0f}k"
    elif ax >= 10_000:
        s = f"{x / 1000:.1f}k"
    elif ax >= 100:
        s = f"{x:,.0f}"
    elif ax >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.2f}"
    return s + unit
