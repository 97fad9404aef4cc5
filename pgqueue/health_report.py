"""Health of a pgqueue database: what :meth:`pgqueue.App.check` returns and
``pgqueue check`` prints.

The checks themselves are the operation :func:`pgqueue.ops.health.check`;
this module holds the report types and the report of an unreachable
database. ``App.check_async`` runs the operation on a dedicated connection,
not the pool: the pool refuses to open on an unmigrated schema, which is
exactly a state a health check must report rather than raise, and a probe
should measure a real connect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from pgqueue.durations import parse_duration
from pgqueue.version import SCHEMA_REVISION

if TYPE_CHECKING:
    pass

Age = str | float | timedelta


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Thresholds of the checks, in seconds."""

    max_ready_age: float = 300.0
    worker_timeout: float = 60.0
    max_clock_skew: float = 5.0

    @classmethod
    def build(cls, max_ready_age: Age, worker_timeout: Age, max_clock_skew: Age) -> HealthSettings:
        """Thresholds from durations (``"5m"``, seconds, timedelta); raises InvalidDuration."""
        return cls(
            max_ready_age=parse_duration(max_ready_age).total_seconds(),
            worker_timeout=parse_duration(worker_timeout).total_seconds(),
            max_clock_skew=parse_duration(max_clock_skew).total_seconds(),
        )


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """One check: ``name`` is one of ``connection``, ``clock_skew``, ``schema``,
    ``stuck_jobs``, ``dead_workers``, ``queue_backlog``."""

    name: str
    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class DeadWorker:
    """A registered worker whose heartbeat is older than the threshold."""

    id: str
    host: str
    pid: int
    heartbeat_age_seconds: float


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Every check that ran, and the facts behind them. ``ok`` is true when
    every check passed; checks that could not run (no connection, no schema)
    are left out, and the failed check that stopped them says why."""

    ok: bool = field(init=False)
    checks: list[HealthCheck]
    server_version: str | None = None
    schema_revision: str | None = None
    expected_revision: str = SCHEMA_REVISION
    clock_skew_seconds: float | None = None
    stuck_jobs: int = 0
    stuck_job_ids: list[int] = field(default_factory=list)
    dead_workers: list[DeadWorker] = field(default_factory=list)
    backlogged_queues: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ok", all(check.ok for check in self.checks))

    @property
    def failures(self) -> list[HealthCheck]:
        return [check for check in self.checks if not check.ok]


def unreachable(error: BaseException) -> HealthReport:
    """The report when no connection could be made."""
    return HealthReport(checks=[HealthCheck("connection", False, str(error))])
