"""``pgqueue doctor`` / ``App.doctor()``: what is wrong with the database.

Each check returns one :class:`Finding` with a severity, the evidence
(pids, application names, ages, sizes) and the fix (a command or SQL).
``check()`` stays the quick liveness probe; the doctor is what an on-call
engineer runs when the queue is slow.

The checks are one operation on a dedicated connection (:func:`diagnose`).
The facts it shares with ``check()`` (server clock, schema revision, stuck
jobs, silent workers, queue backlog) are read by the operations of
:mod:`pgqueue.ops.health`; this module words them as findings. Whether a
transaction pooler is in the path takes two client connections:
``App.doctor_async`` opens them and asks each :func:`backend`, and
:func:`pooler_probe` compares the answers.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from psycopg.conninfo import conninfo_to_dict

from pgqueue.commands import command
from pgqueue.connection import migrate_command
from pgqueue.durations import parse_duration
from pgqueue.errors import SchemaNotMigrated
from pgqueue.explain import fmt_span
from pgqueue.ops import Execute, Op, OpContext, health
from pgqueue.ops import tasks as task_ops
from pgqueue.version import SCHEMA_REVISION

if TYPE_CHECKING:
    pass

Severity = Literal["ok", "warn", "error"]
Age = str | float | timedelta
SEVERITY_ORDER = {"ok": 0, "warn": 1, "error": 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict. ``check`` names the check, ``summary`` is one
    line, ``detail`` the evidence in words, ``fix`` the command or SQL that
    fixes it (empty when ok), ``evidence`` the same facts as data."""

    check: str
    severity: Severity
    summary: str
    detail: str = ""
    fix: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def exit_code(findings: Sequence[Finding]) -> int:
    """0 when all ok, 1 with a warning, 2 with an error."""
    return max((SEVERITY_ORDER[f.severity] for f in findings), default=0)


@dataclass(frozen=True, slots=True)
class DoctorSettings:
    """Thresholds, in seconds unless named otherwise."""

    max_transaction_age: float = 300.0
    error_transaction_age: float = 3600.0
    worker_timeout: float = 60.0
    max_ready_age: float = 300.0
    max_clock_skew: float = 5.0
    notify_queue_warn: float = 0.5
    dead_tuples_min: int = 10_000
    archive_after: float = 7 * 86400.0
    archive_backlog: int = 10_000
    #: Share of usable connections in use that warns, and that is an error.
    connections_warn: float = 0.8
    connections_error: float = 0.95
    #: Jobs of an unknown task older than this are past the workers' default
    #: grace (dead-lettered as unknown_task): an error.
    unknown_task_grace: float = 3600.0
    #: Whether the App declared a transaction pooler (then the pooler check is ok).
    pooler_declared: bool = False

    @classmethod
    def build(cls, pooler_declared: bool = False, **ages: Any) -> DoctorSettings:
        values: dict[str, Any] = {"pooler_declared": pooler_declared}
        for name, value in ages.items():
            if value is None:
                continue
            if name in ("dead_tuples_min", "archive_backlog"):
                values[name] = int(value)
            elif name in ("notify_queue_warn", "connections_warn", "connections_error"):
                values[name] = float(value)
            else:
                values[name] = parse_duration(value).total_seconds()
        return cls(**values)


@dataclass(frozen=True, slots=True)
class PoolerProbe:
    """What two client connections saw of the server behind the DSN."""

    dsn_port: int | None
    server_port: int | None
    local_port: int | None
    seen_client_port: int | None
    same_backend: bool
    pid: int


def _finding(
    check: str, severity: Severity, summary: str, detail: str = "", fix: str = "", **evidence: Any
) -> Finding:
    return Finding(check, severity, summary, detail, fix, evidence)


def diagnose(
    ctx: OpContext,
    settings: DoctorSettings,
    probe: PoolerProbe | None,
    wall_clock: Callable[[], datetime] | None = None,
) -> Op[list[Finding]]:
    """Every check, in order; a check that cannot run says why."""
    findings: list[Finding] = []
    server = yield from health.server_clock(wall_clock or (lambda: datetime.now(UTC)))
    findings.append(
        _finding("connection", "ok", f"connected to PostgreSQL {server.server_version}")
    )
    findings.append(_clock(server, settings))
    findings.append(_pooler(probe, settings))
    revision = yield from health.schema_revision()
    findings.append(_schema(ctx.schema, revision))
    findings.append((yield from _transactions(settings)))
    findings.append((yield from _prepared(settings)))
    findings.append((yield from _slots()))
    findings.append((yield from _notify(settings)))
    findings.append((yield from _connections(settings)))
    if revision is None:
        return findings
    try:
        findings.append((yield from _tables(ctx, settings)))
        findings.append((yield from _stale_workers(settings)))
        findings.append((yield from _expired_leases()))
        findings.append((yield from _backlog(settings)))
        findings.append((yield from _unknown_tasks(settings)))
        findings.extend((yield from _archive(ctx, settings)))
    except SchemaNotMigrated as exc:
        findings.append(
            _finding(
                "queue_state",
                "error",
                "could not read the queue tables",
                str(exc),
                f"run `{migrate_command(ctx.schema)}`",
            )
        )
    return findings


def _schema(schema: str, revision: str | None) -> Finding:
    fix = f"run `{migrate_command(schema)}`"
    if revision is None:
        return _finding(
            "migrations",
            "error",
            f'schema "{schema}" is not migrated',
            f"no pgqueue tables in schema {schema!r}; this pgqueue needs revision "
            f"{SCHEMA_REVISION}",
            fix,
            revision=None,
            expected=SCHEMA_REVISION,
        )
    if revision != SCHEMA_REVISION:
        return _finding(
            "migrations",
            "error",
            f'schema "{schema}" is at revision {revision}, this pgqueue needs {SCHEMA_REVISION}',
            "the schema and this code disagree: workers and producers may fail",
            f"{fix} (or, if a newer pgqueue migrated the database, upgrade this one)",
            revision=revision,
            expected=SCHEMA_REVISION,
        )
    return _finding(
        "migrations", "ok", f'schema "{schema}" is at head ({revision})', revision=revision
    )


def _clock(server: health.ServerClock, s: DoctorSettings) -> Finding:
    skew = server.skew_seconds
    summary = server.describe()
    if server.skew_over(s.max_clock_skew):
        return _finding(
            "clock_skew",
            "warn",
            summary,
            f"over the {s.max_clock_skew:g}s limit: delays, schedules and archive cutoffs "
            "computed on this host will be off",
            "sync both clocks with NTP (e.g. `timedatectl set-ntp true`, chrony)",
            skew_seconds=skew,
        )
    return _finding("clock_skew", "ok", summary, skew_seconds=skew)


def _pooler(probe: PoolerProbe | None, s: DoctorSettings) -> Finding:
    if probe is None:
        return _finding("pooler", "ok", "not probed (no second connection)")
    proxied = (
        probe.dsn_port is not None
        and probe.server_port is not None
        and probe.dsn_port != probe.server_port
    ) or (
        probe.local_port is not None
        and probe.seen_client_port is not None
        and probe.local_port != probe.seen_client_port
    )
    evidence = asdict(probe)
    if probe.same_backend:
        if s.pooler_declared:
            return _finding(
                "pooler",
                "ok",
                "a transaction pooler is in the path and the App declares it",
                **evidence,
            )
        return _finding(
            "pooler",
            "warn",
            "a transaction-mode pooler (e.g. PgBouncer) is in front of the database",
            f"two client connections were served by the same server process (pid {probe.pid})"
            + (
                f"; the DSN's port {probe.dsn_port} is not the server's {probe.server_port}"
                if proxied
                else ""
            )
            + ": LISTEN/NOTIFY wake-ups and session state do not work through it",
            "declare it: App(..., listen=False) (workers then poll) or point workers at the "
            "server directly; keep producers on the pooler",
            **evidence,
        )
    if proxied:
        return _finding(
            "pooler",
            "ok",
            "a proxy or session-mode pooler is in the path (session features work)",
            f"the DSN's port {probe.dsn_port} is not the server's {probe.server_port}",
            **evidence,
        )
    return _finding("pooler", "ok", "direct connection to the server", **evidence)


def _session(row: dict[str, Any]) -> str:
    who = row["application_name"] or "no application_name"
    return (
        f"pid {row['pid']} ({who}, user {row['user_name']}"
        + (f", from {row['client_addr']}" if row["client_addr"] else "")
        + f") {row['state']} for {fmt_span(row['state_seconds'] or 0)}, transaction open "
        f"{fmt_span(row['transaction_seconds'] or 0)}, xmin age {row['xmin_age']}"
    )


def _transactions(s: DoctorSettings) -> Op[Finding]:
    rows = yield Execute("doctor_transactions", rows="dict")
    old = [r for r in rows if (r["transaction_seconds"] or 0) > s.max_transaction_age]
    if not old:
        oldest = rows[0]["transaction_seconds"] if rows else 0.0
        return _finding(
            "xmin_horizon",
            "ok",
            f"no transaction open longer than {fmt_span(s.max_transaction_age)}"
            + (f" (oldest {fmt_span(oldest)})" if rows else ""),
            oldest_transaction_seconds=oldest,
        )
    worst = old[0]
    idle = [r for r in old if (r["state"] or "").startswith("idle in transaction")]
    severity: Severity = (
        "error" if (worst["transaction_seconds"] or 0) > s.error_transaction_age else "warn"
    )
    pids = ", ".join(str(r["pid"]) for r in old)
    return _finding(
        "xmin_horizon",
        severity,
        f"{len(old)} session{'s' if len(old) != 1 else ''} "
        f"{'idle in transaction' if idle else 'with a long transaction'} hold"
        f"{'s' if len(old) == 1 else ''} back the xmin horizon "
        f"(oldest open {fmt_span(worst['transaction_seconds'])})",
        "; ".join(_session(r) for r in old)
        + ". Until they end, VACUUM cannot remove the dead rows of finished jobs: the "
        "queue tables bloat and leases slow down.",
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid IN ({pids}); "
        "and fix the client (commit or roll back; set idle_in_transaction_session_timeout)",
        sessions=old,
    )


def _prepared(s: DoctorSettings) -> Op[Finding]:
    rows = yield Execute("doctor_prepared_transactions", rows="dict")
    old = [r for r in rows if (r["age_seconds"] or 0) > s.max_transaction_age]
    if not old:
        return _finding("prepared_transactions", "ok", "no forgotten prepared transaction")
    gids = ", ".join(
        f"{r['gid']!r} (owner {r['owner_name']}, prepared "
        f"{fmt_span(r['age_seconds'])} ago, xmin age {r['xmin_age']})"
        for r in old
    )
    return _finding(
        "prepared_transactions",
        "error",
        f"{len(old)} prepared transaction{'s' if len(old) != 1 else ''} older than "
        f"{fmt_span(s.max_transaction_age)} hold{'s' if len(old) == 1 else ''} back the "
        "xmin horizon and keep their locks, even across restarts",
        gids,
        "; ".join(f"ROLLBACK PREPARED '{r['gid']}'" for r in old)
        + " (or COMMIT PREPARED, if its transaction manager wants it committed)",
        prepared=old,
    )


def _slots() -> Op[Finding]:
    rows = yield Execute("doctor_replication_slots", rows="dict")
    bad = [r for r in rows if not r["active"]]
    if not bad:
        return _finding(
            "replication_slots",
            "ok",
            f"{len(rows)} replication slot{'s' if len(rows) != 1 else ''}, all active",
        )
    holding = [r for r in bad if r["xmin"] is not None or r["catalog_xmin"] is not None]
    detail = "; ".join(
        f"{r['slot_name']} ({r['slot_type']}, inactive"
        + (f", retains {_size(r['retained_wal_bytes'])} of WAL" if r["retained_wal_bytes"] else "")
        + (f", xmin age {r['xmin_age']}" if r["xmin_age"] is not None else "")
        + ")"
        for r in bad
    )
    return _finding(
        "replication_slots",
        "error" if holding else "warn",
        f"{len(bad)} inactive replication slot{'s' if len(bad) != 1 else ''}: "
        + ", ".join(r["slot_name"] for r in bad),
        detail
        + ". An inactive slot keeps WAL on disk without bound"
        + (" and holds back the xmin horizon" if holding else ""),
        "; ".join(f"SELECT pg_drop_replication_slot('{r['slot_name']}')" for r in bad)
        + " (if no replica or consumer will come back for it)",
        slots=bad,
    )


def _notify(s: DoctorSettings) -> Op[Finding]:
    row = yield Execute("doctor_notify_queue", fetch="one", rows="dict")
    usage = float(row["usage"])
    if usage <= s.notify_queue_warn:
        return _finding("notify_queue", "ok", f"NOTIFY queue {usage:.2%} full", usage=usage)
    return _finding(
        "notify_queue",
        "error" if usage > 0.9 else "warn",
        f"the NOTIFY queue is {usage:.2%} full",
        "a session that LISTENs but does not read (often one left idle in transaction) "
        "stops the queue from emptying; at 100% every NOTIFY fails, and so does every "
        "enqueue. The server log names it: 'server process ... is lagging'",
        "find it in the server log or among sessions idle in transaction "
        "(pg_stat_activity), then SELECT pg_terminate_backend(pid)",
        usage=usage,
    )


def _connections(s: DoctorSettings) -> Op[Finding]:
    row = yield Execute("doctor_connections", fetch="one", rows="dict")
    usable = max(1, row["max_connections"] - row["reserved"])
    share = row["in_use"] / usable
    top = ", ".join(
        f"{t['connections']} {t['user_name']}@{t['database']} ({t['application_name'] or '-'})"
        for t in row["top"]
    )
    summary = f"{row['in_use']} of {usable} connections in use ({share:.0%})"
    evidence = {
        "in_use": row["in_use"],
        "max_connections": row["max_connections"],
        "reserved": row["reserved"],
        "top": row["top"],
    }
    if share < s.connections_warn:
        return _finding("connections", "ok", summary, **evidence)
    return _finding(
        "connections",
        "error" if share >= s.connections_error else "warn",
        summary,
        f"heaviest: {top}. New connections (workers reconnecting, producers) will be refused "
        "at the limit",
        "lower pool sizes (App(pool_max_size=...)), put a pooler in front of producers, or "
        "raise max_connections",
        **evidence,
    )


def _size(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def _tables(ctx: OpContext, s: DoctorSettings) -> Op[Finding]:
    rows = yield Execute("doctor_tables", {"schema": ctx.schema}, rows="dict")
    bloated = [r for r in rows if r["dead_tuples"] > max(s.dead_tuples_min, 0.2 * r["live_tuples"])]
    if not bloated:
        return _finding(
            "dead_tuples",
            "ok",
            "queue tables have few dead tuples",
            tables={r["table_name"]: r["dead_tuples"] for r in rows},
        )

    def last(r: dict[str, Any]) -> str:
        when = max((t for t in (r["last_autovacuum"], r["last_vacuum"]) if t), default=None)
        return "never vacuumed" if when is None else f"last vacuum {when:%Y-%m-%d %H:%M:%S%z}"

    return _finding(
        "dead_tuples",
        "warn",
        "dead tuples pile up in " + ", ".join(r["table_name"] for r in bloated),
        "; ".join(
            f"{r['table_name']}: {r['dead_tuples']} dead / {r['live_tuples']} live, "
            f"{_size(r['total_bytes'])}, {last(r)}"
            for r in bloated
        )
        + ". If vacuum runs but cannot remove them, see the xmin_horizon, "
        "prepared_transactions and replication_slots checks",
        f"{command('maintenance')} (VACUUM ANALYZE of the queue tables), after ending whatever "
        "holds the xmin horizon",
        tables=bloated,
    )


def _stale_workers(s: DoctorSettings) -> Op[Finding]:
    silent = yield from health.silent_workers(None, s.worker_timeout, holding_jobs=False)
    if not silent:
        return _finding(
            "workers",
            "ok",
            f"every registered worker sent a heartbeat in the last {fmt_span(s.worker_timeout)}",
        )
    return _finding(
        "workers",
        "warn",
        f"{len(silent)} worker{'s' if len(silent) != 1 else ''} without a heartbeat for over "
        f"{fmt_span(s.worker_timeout)}",
        "; ".join(
            f"{w.id} (host {w.host}, pid {w.pid}, silent {fmt_span(w.heartbeat_age_seconds)})"
            for w in silent
        )
        + ": stopped (SIGSTOP), hung, or killed; its jobs are reclaimed only when their "
        "leases expire",
        "on that host: `kill -CONT <pid>` if stopped, else restart it (`kill -TERM <pid>`); "
        "killed workers' rows disappear after an hour",
        workers=[asdict(w) for w in silent],
    )


def _expired_leases() -> Op[Finding]:
    stuck = yield from health.stuck_jobs(None)
    if not stuck.count:
        return _finding("expired_leases", "ok", "no running job is past its lease")
    return _finding(
        "expired_leases",
        "error",
        f"{stuck.count} running job{'s' if stuck.count != 1 else ''} past their lease "
        f"(worst by {fmt_span(stuck.oldest_expired_seconds or 0)})",
        f"jobs {stuck.ids_text}: their worker died or "
        "froze and no worker's reaper has reclaimed them",
        f"start a worker (its reaper reclaims them) or run `{command('reap')}`",
        stuck=stuck.count,
        job_ids=stuck.job_ids,
    )


def _backlog(s: DoctorSettings) -> Op[Finding]:
    backlog = yield from health.queue_backlog(None, s.max_ready_age)
    if not backlog:
        return _finding(
            "backlog", "ok", f"no queue has a ready job older than {fmt_span(s.max_ready_age)}"
        )
    return _finding(
        "backlog",
        "warn",
        f"{len(backlog)} queue{'s' if len(backlog) != 1 else ''} with ready jobs waiting over "
        f"{fmt_span(s.max_ready_age)}: " + ", ".join(backlog),
        "; ".join(
            f"{queue}: oldest ready job waiting {fmt_span(age)}" for queue, age in backlog.items()
        ),
        f"add workers for these queues (`{command('worker --queue NAME')}`), raise "
        f"--concurrency, or check their limits (`{command('status')}`)",
        queues=backlog,
    )


def _unknown_tasks(s: DoctorSettings) -> Op[Finding]:
    unknown = yield from task_ops.unknown_tasks()
    if not unknown:
        return _finding("unknown_tasks", "ok", "every waiting job's task is known to a live worker")
    oldest = max(u.oldest_age_seconds for u in unknown)
    jobs = sum(u.jobs for u in unknown)
    names = ", ".join(u.task for u in unknown)
    return _finding(
        "unknown_tasks",
        "error" if oldest >= s.unknown_task_grace else "warn",
        f"{jobs} job{'s' if jobs != 1 else ''} wait for task{'s' if len(unknown) != 1 else ''} "
        f"no live worker has: {names}",
        "; ".join(
            f"{u.task}: {u.jobs} job{'s' if u.jobs != 1 else ''}, "
            f"oldest {fmt_span(u.oldest_age_seconds)}"
            for u in unknown
        )
        + ". Workers without the task hand these jobs back; once the grace period (default "
        f"{fmt_span(s.unknown_task_grace)}) has passed they are dead-lettered as unknown_task",
        f"start a worker whose App registers the task (`{command('worker --app module:app')}`; "
        f"`{command('tasks --app module:app')}` lists them), fix a misspelt task name in the "
        f"producer, or cancel the jobs: `{command(f'jobs cancel --task {unknown[0].task}')}`",
        tasks=[
            {"task": u.task, "jobs": u.jobs, "oldest_age_seconds": u.oldest_age_seconds}
            for u in unknown
        ],
    )


def _archive(ctx: OpContext, s: DoctorSettings) -> Op[list[Finding]]:
    """Finished jobs past their retention still stored ("archive", named for
    the cron job it replaces), and whether the workers' maintenance runs."""
    cap = max(s.archive_backlog, 1) * 10
    row = yield Execute("doctor_archive_backlog", {"cap": cap}, fetch="one", rows="dict")
    waiting = row["waiting"]
    if waiting < s.archive_backlog:
        backlog = _finding(
            "archive",
            "ok",
            f"{waiting} finished job{'s' if waiting != 1 else ''} past their retention",
            waiting=waiting,
        )
    else:
        backlog = _finding(
            "archive",
            "warn",
            f"{waiting}{'+' if waiting >= cap else ''} finished jobs are past their retention "
            "and still stored",
            f"the oldest finished {fmt_span(row['oldest_seconds'] or 0)} ago; workers delete "
            "them (one at a time runs maintenance) unless they run with --no-maintenance",
            f"run a worker with maintenance, or from cron `{_prune_command(row)}` (or "
            f"`{command(f'archive --older-than {_duration(s.archive_after)}')}` to keep them "
            "in jobs_archive)",
            waiting=waiting,
        )
    return [backlog, _maintenance(row, s)]


def _maintenance(row: dict[str, Any], s: DoctorSettings) -> Finding:
    age = row["last_run_age_seconds"]
    late = max(s.worker_timeout * 5, 300.0)
    if age is not None and age <= late:
        detail = f"last pass by {row['last_run_by']}"
        if row["last_error"]:
            return _finding(
                "maintenance",
                "warn",
                f"the last maintenance pass {fmt_span(age)} ago failed",
                f"{detail}: {row['last_error']}",
                "see the worker's log; the next pass tries again",
                last_run_age_seconds=age,
            )
        return _finding(
            "maintenance",
            "ok",
            f"workers apply retention (last pass {fmt_span(age)} ago)",
            detail,
            last_run_age_seconds=age,
        )
    if age is None and not row["any_finished"]:
        return _finding("maintenance", "ok", "no finished job yet: nothing to maintain")
    when = "ever" if age is None else f"for {fmt_span(age)}"
    return _finding(
        "maintenance",
        "warn",
        f"no worker has applied retention {when}",
        "finished jobs stay until a worker with maintenance runs (pgqueue worker, without "
        "--no-maintenance) or an operator prunes them",
        f"start a worker, or run `{_prune_command(row)}` from cron",
        last_run_age_seconds=age,
    )


def _prune_command(row: dict[str, Any]) -> str:
    """`pgqueue prune` with the succeeded jobs' retention as its cutoff."""
    return command(f"prune --older-than {_duration(max(row['succeeded_seconds'], 1.0))}")


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# --- the shell: connections --------------------------------------------------------


def _dsn_port(dsn: str) -> int | None:
    try:
        port = conninfo_to_dict(dsn).get("port")
        return int(str(port).split(",")[0]) if port else 5432
    except Exception:
        return None


def _local_port(conn: Any) -> int | None:
    try:
        with socket.socket(fileno=conn.pgconn.socket) as sock:
            try:
                name = sock.getsockname()
            finally:
                sock.detach()  # the socket stays libpq's
    except OSError:
        return None
    return int(name[1]) if isinstance(name, tuple) else None


def backend() -> Op[Any]:
    """The server process serving this connection, and the ports it sees."""
    row = yield Execute("doctor_backend", fetch="one")
    return row


def pooler_probe(dsn: str, first: Any, a: Any, b: Any) -> PoolerProbe:
    """What two autocommit client connections (``first`` and another one,
    asked one after the other: ``a`` and ``b`` are what :func:`backend`
    returned on each) saw of the server: the same server process means a
    transaction pooler."""
    return PoolerProbe(
        dsn_port=_dsn_port(dsn),
        server_port=a[1],
        local_port=_local_port(first),
        seen_client_port=a[3],
        same_backend=a[0] == b[0],
        pid=a[0],
    )


def unreachable(exc: BaseException) -> list[Finding]:
    return [
        _finding(
            "connection",
            "error",
            "cannot connect to the database",
            str(exc),
            "check the DSN (--dsn, PGQUEUE_DSN), that the server runs and accepts this host",
        )
    ]
