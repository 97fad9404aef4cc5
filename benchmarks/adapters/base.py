"""The one interface every measured system implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg

from benchmarks.common import WorkerControl


def serial_last_value(mon: psycopg.Connection[Any], table: str, column: str = "id") -> int:
    """Last value handed out by ``table.column``'s sequence (0 before the first)."""
    row = mon.execute("SELECT pg_get_serial_sequence(%s, %s)", (table, column)).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError(f"{table}.{column} has no sequence")
    row = mon.execute(f"SELECT last_value * is_called::int FROM {row[0]}").fetchone()
    assert row is not None
    return int(row[0])


class System(ABC):
    """A queue under test, bound to one freshly created database.

    Producer-side methods run in the benchmark's main process and are
    synchronous (adapters over async libraries drive their own event loop).
    :meth:`worker_main` runs in a spawned child process, one per worker
    process, and blocks until the controller asks it to stop.
    """

    #: name used on the command line
    name: ClassVar[str]
    #: one-line description for the report
    label: ClassVar[str]
    #: True when :meth:`remaining` honours ``upto_id`` with a cheap id-range count
    supports_id_range: ClassVar[bool] = True
    #: Why deep drains (``xmin-200k``) are skipped for this system, or None.
    slow_drain: ClassVar[str | None] = None
    #: True when :meth:`worker_main` runs the system's worker in a child process
    #: (another interpreter): the worker CPU then counts that child too.
    worker_subprocess: ClassVar[bool] = False

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    # ---- discovery -------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the system can run here, else why it is skipped."""
        return None

    @classmethod
    def version(cls) -> str:
        return "-"

    @classmethod
    @abstractmethod
    def tuning(cls) -> dict[str, Any]:
        """The settings this adapter uses, stated in the output."""

    # ---- producer side (main process) ------------------------------------
    @abstractmethod
    def setup(self) -> None:
        """Install the system's schema into the (empty) database."""

    @abstractmethod
    def bulk_enqueue(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs (payload ``{}``) with the system's bulk call: one call."""

    @abstractmethod
    def enqueue_one(self) -> int:
        """Enqueue one no-op job in its own transaction; return its id."""

    def single_enqueue(self, n: int) -> None:
        for _ in range(n):
            self.enqueue_one()

    def single_enqueue_variants(self) -> dict[str, Callable[[int], None]]:
        """Extra one-job-per-transaction insert paths measured beside
        :meth:`single_enqueue` in the ``single`` workload (reported as ``rate_<name>``)."""
        return {}

    @abstractmethod
    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        """Jobs with ``after_id < id <= upto_id`` (every job when ``upto_id`` is None)
        not yet completed, as committed. Must be cheap: it is polled during drains."""

    @abstractmethod
    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        """Highest job id enqueued so far (0 when none)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release producer-side resources."""

    # ---- a job's whole life (the `life` workload) ---------------------------
    def life_prepare(self) -> dict[str, Any]:
        """Bring the fresh database to the state of one the system has been
        running in, before the measured window (pgqueue: the workers'
        maintenance has made the time-range leaves). Returns what it did."""
        return {}

    def cleanup_plan(self, mon: psycopg.Connection[Any]) -> Any:
        """After the drain, outside the measured window: everything the cleanup
        needs (connections opened, the clock it runs at), so that
        :meth:`cleanup` measures the cleanup alone."""
        return None

    def cleanup(self, plan: Any) -> dict[str, Any]:
        """The system's own removal of the finished jobs, as its documentation
        has operators (or its workers) run it once their retention has passed.
        Measured. Returns what it did. Default: nothing to do (completion
        deletes the row)."""
        return {"what": "none: completion deletes the row"}

    def finished_storage(self, mon: psycopg.Connection[Any]) -> dict[str, int]:
        """Rows of finished jobs (and their logs) the system keeps, by table
        (or partition), for the report of what :meth:`cleanup` removed."""
        return {}

    # ---- the soak --------------------------------------------------------
    def soak_prepare(self) -> dict[str, Any]:
        """Settings applied before a soak (pgqueue: a one-minute retention).
        Returns what it set."""
        return {}

    def soak_maintenance(self) -> Callable[[], dict[str, Any]] | None:
        """What an operator runs periodically (cron) to keep the tables bounded
        during a long soak, or None when nothing is needed (finished rows are
        deleted, or the system's workers clean up by themselves). The callable
        runs in its own thread with its own connections and returns what it did."""
        return None

    def soak_groups(self) -> dict[str, str]:
        """Relations whose size (table + indexes, every partition of a
        partitioned one) the soak samples, by name; the first is the one
        ``size_growth`` is judged on."""
        return {}

    def soak_ledger(self) -> Any:
        """An object that counts finished jobs before the system deletes them
        (``benchmarks.soak.LeafLedger``), or None: then finished = enqueued -
        still unfinished, as the runner's polls see it."""
        return None

    # ---- worker side (child process) -------------------------------------
    @classmethod
    @abstractmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        """Run one worker process: set up, ``ctl.ready()``, ``ctl.wait_go()``, work
        until ``ctl.stop_requested()``, shut down cleanly."""
