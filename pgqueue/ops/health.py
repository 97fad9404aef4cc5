"""The health checks: connection and clock, schema revision, stuck jobs, dead
workers and queue backlog (see :mod:`pgqueue.health` for the report)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pgqueue.errors import SchemaNotMigrated
from pgqueue.explain import fmt_span
from pgqueue.health import DeadWorker, HealthCheck, HealthReport, HealthSettings
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.version import SCHEMA_REVISION

#: How many stuck job ids the report lists (the count is exact).
STUCK_SAMPLE = 20

WallClock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def check(
    ctx: OpContext, settings: HealthSettings, wall_clock: WallClock = _utc_now
) -> Op[HealthReport]:
    """Run every check; a failed check is reported, never raised."""
    return _check(ctx, settings, wall_clock)


def _check(ctx: OpContext, settings: HealthSettings, wall_clock: WallClock) -> Op[HealthReport]:
    sent = wall_clock()
    server = yield Execute("health_server", fetch="one", rows="dict")
    received = wall_clock()
    round_trip = (received - sent).total_seconds()
    # The server read its clock somewhere inside the round trip: compare it with
    # the midpoint, and forgive half the round trip as measurement error.
    skew = (server["server_now"] - (sent + (received - sent) / 2)).total_seconds()
    checks = [
        HealthCheck(
            "connection",
            True,
            f"connected to PostgreSQL {server['server_version']} "
            f"(round trip {round_trip * 1000:.0f}ms)",
        ),
        _clock_check(skew, round_trip, settings.max_clock_skew),
    ]
    facts: dict[str, Any] = {
        "server_version": server["server_version"],
        "clock_skew_seconds": skew,
    }

    revision = yield from _revision()
    facts["schema_revision"] = revision
    checks.append(_schema_check(ctx.schema, revision))
    if revision is None:
        return HealthReport(checks=checks, **facts)

    now = ctx.clock()
    try:
        stuck = yield Execute(
            "health_stuck_jobs", {"now": now, "sample": STUCK_SAMPLE}, fetch="one", rows="dict"
        )
        facts["stuck_jobs"], facts["stuck_job_ids"] = stuck["stuck"], list(stuck["job_ids"])
        checks.append(_stuck_check(stuck))

        workers = yield Execute(
            "health_dead_workers",
            {"now": now, "seconds": settings.worker_timeout, "holding_jobs": True},
            rows="dict",
        )
        facts["dead_workers"] = [DeadWorker(**row) for row in workers]
        checks.append(_workers_check(facts["dead_workers"], settings.worker_timeout))

        backlog = yield Execute(
            "health_queue_backlog", {"now": now, "seconds": settings.max_ready_age}, rows="dict"
        )
        facts["backlogged_queues"] = {r["queue"]: r["oldest_ready_age_seconds"] for r in backlog}
        checks.append(_backlog_check(facts["backlogged_queues"], settings.max_ready_age))
    except SchemaNotMigrated as exc:
        # An older or newer schema may lack what these queries read; the schema
        # check already failed and says what to run.
        checks.append(HealthCheck("queue_state", False, f"could not read the queue state: {exc}"))
    return HealthReport(checks=checks, **facts)


def _revision() -> Op[str | None]:
    try:
        row = yield Execute("health_schema_revision", fetch="one")
    except SchemaNotMigrated:
        return None
    return None if row is None else str(row[0])


def _clock_check(skew: float, round_trip: float, limit: float) -> HealthCheck:
    side = "ahead of" if skew > 0 else "behind"
    text = f"the server clock is {abs(skew):.3f}s {side} this machine's"
    if abs(skew) - round_trip / 2 > limit:
        return HealthCheck(
            "clock_skew",
            False,
            f"{text}, over the {limit:g}s limit: delays, schedules and archive "
            "cutoffs computed here will be off; sync the clocks (NTP)",
        )
    return HealthCheck("clock_skew", True, text)


def _schema_check(schema: str, revision: str | None) -> HealthCheck:
    fix = "run `pgqueue " + ("" if schema == "pgqueue" else f"--schema {schema} ") + "migrate`"
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


def _stuck_check(row: dict[str, Any]) -> HealthCheck:
    count = row["stuck"]
    if not count:
        return HealthCheck("stuck_jobs", True, "no running job has an expired lease")
    ids = ", ".join(str(i) for i in row["job_ids"]) + (", ..." if count > STUCK_SAMPLE else "")
    return HealthCheck(
        "stuck_jobs",
        False,
        f"{count} running job{'s' if count != 1 else ''} with an expired lease "
        f"(oldest expired {fmt_span(row['oldest_expired_seconds'])} ago): {ids}; "
        "no worker reaps them: start a worker or run `pgqueue reap`",
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
