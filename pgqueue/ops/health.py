"""The health checks: connection and clock, schema revision, stuck jobs, dead
workers and queue backlog (see :mod:`pgqueue.health_report` for the report).

The facts behind them (:func:`server_clock`, :func:`schema_revision`,
:func:`stuck_jobs`, :func:`silent_workers`, :func:`queue_backlog`) are
operations of their own: ``pgqueue doctor`` (:mod:`pgqueue.telemetry.doctor`)
reads the same facts through them and words its own findings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgqueue.commands import command
from pgqueue.errors import SchemaNotMigrated
from pgqueue.explain import fmt_span
from pgqueue.health_report import DeadWorker, HealthCheck, HealthReport, HealthSettings
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.version import SCHEMA_REVISION

#: How many stuck job ids the report lists (the count is exact).
STUCK_SAMPLE = 20

WallClock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ServerClock:
    """The server's version and how far its clock is from this machine's."""

    server_version: str
    skew_seconds: float
    round_trip_seconds: float

    def skew_over(self, limit: float) -> bool:
        """Whether the skew exceeds ``limit`` beyond the measurement error."""
        # The server read its clock somewhere inside the round trip: half of
        # it is forgiven as measurement error.
        return abs(self.skew_seconds) - self.round_trip_seconds / 2 > limit

    def describe(self) -> str:
        side = "ahead of" if self.skew_seconds > 0 else "behind"
        return f"the server clock is {abs(self.skew_seconds):.3f}s {side} this machine's"


@dataclass(frozen=True, slots=True)
class StuckJobs:
    """Running jobs past their lease: the exact count, up to ``STUCK_SAMPLE`` ids."""

    count: int
    job_ids: list[int]
    oldest_expired_seconds: float | None

    @property
    def ids_text(self) -> str:
        return ", ".join(str(i) for i in self.job_ids) + (
            ", ..." if self.count > STUCK_SAMPLE else ""
        )


# --- the facts: one statement each, shared by check() and the doctor ----------


def server_clock(wall_clock: WallClock = _utc_now) -> Op[ServerClock]:
    """Connect-level facts: server version and clock skew."""
    sent = wall_clock()
    server = yield Execute("health_server", fetch="one", rows="dict")
    received = wall_clock()
    # Compare the server's clock with the midpoint of the round trip.
    skew = (server["server_now"] - (sent + (received - sent) / 2)).total_seconds()
    return ServerClock(server["server_version"], skew, (received - sent).total_seconds())


def schema_revision() -> Op[str | None]:
    """The schema's migration revision; None when it is not migrated."""
    try:
        row = yield Execute("health_schema_revision", fetch="one")
    except SchemaNotMigrated:
        return None
    return None if row is None else str(row[0])


def stuck_jobs(now: datetime | None) -> Op[StuckJobs]:
    """Running jobs whose lease expired (``now``: None for the server's clock)."""
    row = yield Execute(
        "health_stuck_jobs", {"now": now, "sample": STUCK_SAMPLE}, fetch="one", rows="dict"
    )
    return StuckJobs(row["stuck"], list(row["job_ids"]), row["oldest_expired_seconds"])


def silent_workers(
    now: datetime | None, seconds: float, *, holding_jobs: bool
) -> Op[list[DeadWorker]]:
    """Registered workers without a heartbeat for over ``seconds`` (only
    those still holding running jobs, with ``holding_jobs``)."""
    rows = yield Execute(
        "health_dead_workers",
        {"now": now, "seconds": seconds, "holding_jobs": holding_jobs},
        rows="dict",
    )
    return [DeadWorker(**row) for row in rows]


def queue_backlog(now: datetime | None, seconds: float) -> Op[dict[str, float]]:
    """Queues whose oldest ready job waits over ``seconds``: its age by queue."""
    rows = yield Execute("health_queue_backlog", {"now": now, "seconds": seconds}, rows="dict")
    return {r["queue"]: r["oldest_ready_age_seconds"] for r in rows}


# --- check(): the quick probe ---------------------------------------------------


def check(
    ctx: OpContext, settings: HealthSettings, wall_clock: WallClock = _utc_now
) -> Op[HealthReport]:
    """Run every check; a failed check is reported, never raised."""
    return _check(ctx, settings, wall_clock)


def _check(ctx: OpContext, settings: HealthSettings, wall_clock: WallClock) -> Op[HealthReport]:
    clock = yield from server_clock(wall_clock)
    checks = [
        HealthCheck(
            "connection",
            True,
            f"connected to PostgreSQL {clock.server_version} "
            f"(round trip {clock.round_trip_seconds * 1000:.0f}ms)",
        ),
        _clock_check(clock, settings.max_clock_skew),
    ]
    facts: dict[str, Any] = {
        "server_version": clock.server_version,
        "clock_skew_seconds": clock.skew_seconds,
    }

    revision = yield from schema_revision()
    facts["schema_revision"] = revision
    checks.append(_schema_check(ctx.schema, revision))
    if revision is None:
        return HealthReport(checks=checks, **facts)

    now = ctx.clock()
    try:
        stuck = yield from stuck_jobs(now)
        facts["stuck_jobs"], facts["stuck_job_ids"] = stuck.count, stuck.job_ids
        checks.append(_stuck_check(stuck))

        dead = yield from silent_workers(now, settings.worker_timeout, holding_jobs=True)
        facts["dead_workers"] = dead
        checks.append(_workers_check(dead, settings.worker_timeout))

        backlog = yield from queue_backlog(now, settings.max_ready_age)
        facts["backlogged_queues"] = backlog
        checks.append(_backlog_check(backlog, settings.max_ready_age))
    except SchemaNotMigrated as exc:
        # An older or newer schema may lack what these queries read; the schema
        # check already failed and says what to run.
        checks.append(HealthCheck("queue_state", False, f"could not read the queue state: {exc}"))
    return HealthReport(checks=checks, **facts)


def _clock_check(clock: ServerClock, limit: float) -> HealthCheck:
    text = clock.describe()
    if clock.skew_over(limit):
        return HealthCheck(
            "clock_skew",
            False,
            f"{text}, over the {limit:g}s limit: delays, schedules and archive "
            "cutoffs computed here will be off; sync the clocks (NTP)",
        )
    return HealthCheck("clock_skew", True, text)


def _schema_check(schema: str, revision: str | None) -> HealthCheck:
    fix = f"run `{command('migrate', schema)}`"
    if revision is None:
        return HealthCheck("schema", False, f'schema "{schema}" is not migrated: {fix}')
    if revision != SCHEMA_REVISION:
        return HealthCheck(
            "schema",
            False,
            f'schema "{schema}" is at revision {revision} but this pgqueue needs '
            f"{SCHEMA_REVISION}: {fix}",
        )
    return HealthCheck("schema", True, f'schema "{schema}" is at revision {revision}')


def _stuck_check(stuck: StuckJobs) -> HealthCheck:
    count = stuck.count
    if not count:
        return HealthCheck("stuck_jobs", True, "no running job has an expired lease")
    return HealthCheck(
        "stuck_jobs",
        False,
        f"{count} running job{'s' if count != 1 else ''} with an expired lease "
        f"(oldest expired {fmt_span(stuck.oldest_expired_seconds or 0)} ago): {stuck.ids_text}; "
        f"no worker reaps them: start a worker or run `{command('reap')}`",
    )


def _workers_check(dead: list[DeadWorker], timeout: float) -> HealthCheck:
    if not dead:
        return HealthCheck(
            "dead_workers",
            True,
            f"no worker silent for over {timeout:g}s holds running jobs "
            "(lost workers whose jobs were reaped do not count)",
        )
    names = ", ".join(
        f"{w.id} ({w.host} pid {w.pid}, silent {fmt_span(w.heartbeat_age_seconds)})" for w in dead
    )
    return HealthCheck(
        "dead_workers",
        False,
        f"{len(dead)} worker{'s' if len(dead) != 1 else ''} silent for over {timeout:g}s "
        f"still holding running jobs (the reaper reclaims them when their lease ends): {names}",
    )


def _backlog_check(backlog: dict[str, float], limit: float) -> HealthCheck:
    if not backlog:
        return HealthCheck(
            "queue_backlog", True, f"no queue has a ready job waiting over {fmt_span(limit)}"
        )
    names = ", ".join(f"{queue!r} ({fmt_span(age)})" for queue, age in backlog.items())
    return HealthCheck(
        "queue_backlog",
        False,
        f"oldest ready job waiting over {fmt_span(limit)} in queue"
        f"{'s' if len(backlog) != 1 else ''} {names}",
    )
