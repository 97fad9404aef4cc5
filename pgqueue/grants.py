"""Least-privilege database roles for one pgqueue schema (``pgqueue grant``).

Three kinds, each a superset of the one before:

``producer``
    Enqueue (the SQL functions ``enqueue`` and ``enqueue_batch``, which run as
    their owner since revision 0003, and the App's fast paths ``enqueue_job``
    and ``enqueue_payloads``) and read jobs: ``get_job``,
    ``list_jobs``, ``result`` (``watch_job``), ``job_status``. No INSERT,
    UPDATE or DELETE on any table: it can neither lock nor change a job row.
``worker``
    What ``pgqueue worker``, the low-level consumer API and the SQL worker
    API (``lease``, ``ack``, ``ack_many``, ``fail``, ``nack``, ``extend``) do,
    all through SECURITY DEFINER functions fenced by attempt id: it may only
    lease, complete, fail, extend and release jobs it holds, reap expired
    leases, register itself (its own row only: registration, heartbeat and
    deregistration are fenced by a per-process secret), fire due schedules
    and register ``@app.periodic`` ones (never rewrite an operator's
    schedule), publish its tasks to the task registry and read the live
    task settings. No write privilege on any table (workers included): it
    cannot cancel, requeue, forge a result, archive or prune,
    nor change a task's settings or limits.
``admin``
    Every privilege on every object of the schema (cancel, requeue, replay,
    archive, prune, pause, limits, schedules). ``migrate`` and ``maintenance`` (VACUUM)
    need the rights of the schema's *owner*, which no GRANT on objects gives:
    the admin is made a member of the owner role, unless the owner is a
    superuser (membership would hand out superuser; then those two commands
    stay with the owner).

Privileges are granted on the objects that exist now, and the grant is
recorded in the schema (table ``role_grants``): ``pgqueue migrate`` grants
every recorded role its kind again after applying revisions, so objects of
later revisions are covered (with ``migrate --sql``, run ``pgqueue grant``
again yourself). Granting a role again first revokes what it held, so a
role's rights are always exactly its kind's. Every statement is composed with
:mod:`psycopg.sql` from a validated role name and schema name; the statements
run in one transaction, as the connecting role (the schema's owner or a
superuser), so a role gets all of its privileges or none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from psycopg import Connection, sql

from pgqueue import validation
from pgqueue.commands import program
from pgqueue.config import resolve_dsn
from pgqueue.connection import migrate_command, translated
from pgqueue.database import Database
from pgqueue.errors import InvalidName, InvalidOption, PermissionDenied, SchemaNotMigrated
from pgqueue.ops import roles as roles_ops
from pgqueue.queries import queries_for
from pgqueue.version import SCHEMA_REVISION

__all__ = ["KINDS", "Kind", "grant", "grant_statements", "reapply", "role_name"]

Kind = Literal["producer", "worker", "admin"]
KINDS: tuple[Kind, ...] = get_args(Kind)

# PostgreSQL truncates longer identifiers (with a NOTICE) to 63 bytes, which
# could name another role than the one asked for.
MAX_ROLE_BYTES = 63
_CONTROL_OR_SURROGATE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# Quoted or not, "public" in a GRANT means every role; "none" is reserved.
_RESERVED = {"public", "none"}

# (privileges, tables) granted per kind, on top of the previous kind's.
# The privileges are constants of this module, composed as SQL; the tables are
# identifiers. No role but the admin may write to the hot tables (jobs,
# job_attempts, queues, queue_lease_log) or lock their rows: every change
# goes through the SECURITY DEFINER functions below, which check what the
# caller may do.
_PRODUCER_TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The App reads the schema revision before its first statement.
    ("SELECT", ("alembic_version", "jobs", "jobs_archive", "job_attempts")),
    # jobs' partitions, which live-job reads name directly; how long
    # finished jobs are kept.
    ("SELECT", ("jobs_live", "jobs_succeeded", "jobs_dead", "jobs_cancelled", "retention")),
    # Workflows and dependencies: get_workflow, context.dependency_results().
    ("SELECT", ("workflows", "job_waits", "job_dependencies")),
    # Durable tasks: a job's steps (get_job), the events sent.
    ("SELECT", ("job_steps", "events")),
)
_WORKER_TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The worker's "when is the next job due" and the scheduler's "what is due".
    # Its own registration goes through register_worker & co., which
    # write only the row whose secret the caller presents.
    ("SELECT", ("queues", "queue_lease_log", "schedules", "limits", "workers")),
    # Task registry: the worker's cache of live task settings and the
    # registry it publishes to (through publish_tasks). Limited tasks' rows are
    # locked and their leases logged inside lease_jobs (SECURITY DEFINER).
    ("SELECT", ("tasks", "task_settings")),
)
# Explicit EXECUTE (revision 0005 revokes it from PUBLIC). Names are unique
# in the schema: no signatures. A function in neither list is for admins only
# (e.g. replay_job, 0014: a copy of any job, payload included).
_PRODUCER_FUNCTIONS = (
    "enqueue", "enqueue_batch", "enqueue_windowed", "enqueue_batch_traced", "enqueue_job",
    "enqueue_payloads",
    "visible_status", "finished_payload",
    "watch_job", "job_status",
    # Durable tasks: an event releases the jobs waiting for it.
    "send_event",
)  # fmt: skip
_WORKER_FUNCTIONS = (
    # The Python worker's batch statements.
    "lease_jobs", "lease_jobs_observed", "ack_jobs", "fail_jobs", "release_jobs", "extend_jobs",
    "reap_jobs",
    "fire_schedules", "register_periodic", "retry_delay", "queue_oldest_ready",
    "publish_tasks",
    # Durable tasks: a step's result, a sleep, a wait for an event (fenced).
    "store_step", "wait_event",
    # Its own registration, heartbeat and deregistration, and the reaper's
    # bookkeeping of silent workers.
    "register_worker", "heartbeat_worker", "deregister_worker", "mark_lost_workers",
    "prune_lost_workers",
    # The fleet's maintenance: the election, and retention's steps (DDL on the
    # finished partitions' leaves, run as the schema's owner).
    "maintenance_claim", "maintenance_done", "maintenance_release",
    "retention_plan", "retention_create_leaf", "retention_drop_leaf", "retention_purge",
    # The SQL worker API.
    "lease", "ack", "ack_many", "fail", "nack", "extend",
)  # fmt: skip


def role_name(name: object) -> str:
    """A role name to grant to: 1-63 bytes, no control characters, not PUBLIC."""
    if not isinstance(name, str) or not name or _CONTROL_OR_SURROGATE.search(name):
        raise InvalidName(
            f"invalid role name {name!r}: must be a non-empty string without control "
            "characters or lone surrogates"
        )
    if len(name.encode("utf-8")) > MAX_ROLE_BYTES:
        raise InvalidName(
            f"invalid role name {name[:80]!r}: PostgreSQL role names have at most "
            f"{MAX_ROLE_BYTES} bytes"
        )
    if name.lower() in _RESERVED:
        raise InvalidName(f"refusing to grant to {name!r}: in a GRANT it means every role (PUBLIC)")
    if name.lower().startswith("pg_"):
        raise InvalidName(f"refusing to grant to {name!r}: pg_* are PostgreSQL's own roles")
    return name


def kind_name(kind: object) -> Kind:
    for known in KINDS:
        if kind == known:
            return known
    raise InvalidOption(f"unknown role kind {kind!r}: one of {', '.join(KINDS)}")


@dataclass(frozen=True, slots=True)
class Owner:
    """The role owning the schema, and whether it is a superuser."""

    name: str
    superuser: bool


def grant_statements(
    role: str, kind: str, schema: str = "pgqueue", owner: Owner | None = None
) -> list[sql.Composed]:
    """The GRANT statements giving ``role`` the rights of ``kind`` on ``schema``
    (no I/O). ``owner``: the schema's owner, whom an admin becomes a member of."""
    role, kind, schema = role_name(role), kind_name(kind), validation.schema_name(schema)
    grantee = sql.Identifier(role)
    statements: list[sql.Composed] = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), grantee)
    ]
    if kind == "admin":
        for objects, privileges in (
            ("TABLES", "ALL PRIVILEGES"),
            ("SEQUENCES", "ALL PRIVILEGES"),
            ("FUNCTIONS", "EXECUTE"),
        ):
            statements.append(
                sql.SQL("GRANT {} ON ALL {} IN SCHEMA {} TO {}").format(
                    sql.SQL(privileges), sql.SQL(objects), sql.Identifier(schema), grantee
                )
            )
        if owner is not None and not owner.superuser and owner.name != role:
            statements.append(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner.name), grantee))
        return [*statements, _record(schema, role, kind)]
    # Start from nothing, so that granting again (or a narrower kind) also
    # takes back what an earlier grant or revision gave.
    for objects in ("TABLES", "SEQUENCES", "FUNCTIONS"):
        statements.append(
            sql.SQL("REVOKE ALL ON ALL {} IN SCHEMA {} FROM {}").format(
                sql.SQL(objects), sql.Identifier(schema), grantee
            )
        )
    tables = _PRODUCER_TABLES + (_WORKER_TABLES if kind == "worker" else ())
    functions = _PRODUCER_FUNCTIONS + (_WORKER_FUNCTIONS if kind == "worker" else ())
    for privileges, names in tables:
        statements.append(
            sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                sql.SQL(privileges), _qualified(schema, names), grantee
            )
        )
    statements.append(
        sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(_qualified(schema, functions), grantee)
    )
    return [*statements, _record(schema, role, kind)]


def _record(schema: str, role: str, kind: Kind) -> sql.Composed:
    """Remember the grant: ``pgqueue migrate`` re-applies it after a revision
    that adds or replaces objects (see :func:`reapply`)."""
    return sql.SQL(
        "INSERT INTO {} (role, kind) VALUES ({}, {})"
        " ON CONFLICT (role) DO UPDATE SET kind = EXCLUDED.kind, granted_at = now()"
    ).format(sql.Identifier(schema, "role_grants"), sql.Literal(role), sql.Literal(kind))


def reapply(dsn: str, schema: str) -> list[str]:
    """Grant every recorded role its kind again on ``schema`` (after a
    migration), as the connecting role (the one that migrated), in one
    transaction. Roles dropped since are forgotten. Returns the roles."""
    schema = validation.schema_name(schema)
    database = Database(dsn, queries_for(schema))
    with translated(database.translate), database.connect() as conn:
        if not database.run(roles_ops.records_grants(schema), conn):
            return []  # before revision 0005: nothing recorded
        owner = database.run(roles_ops.schema_owner(schema), conn)
        assert owner is not None
        done: list[str] = []
        with conn.transaction():
            database.run(roles_ops.forget_dropped_grants(), conn)
            for role, kind in database.run(roles_ops.all_grants(), conn):
                try:
                    role_name(role)
                except InvalidName:
                    continue  # not one pgqueue grant would have made
                database.run_composed(
                    conn, grant_statements(role, kind_name(kind), schema, Owner(*owner))
                )
                done.append(role)
    return done


def _qualified(schema: str, names: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(schema, name) for name in names)


def _notes(kind: Kind, schema: str, owner: Owner) -> list[str]:
    if kind != "admin":
        return []
    # A role name may hold a line break: it must not end a comment of --sql output.
    owner = Owner(_CONTROL_OR_SURROGATE.sub("?", owner.name), owner.superuser)
    if owner.superuser:
        return [
            "-- migrate and maintenance (VACUUM) need the rights of the owner of schema",
            f'-- "{schema}", "{owner.name}": a superuser, so they stay with it (membership',
            "-- would make the admin a superuser).",
        ]
    return [
        f'-- migrate and maintenance (VACUUM) need the rights of "{owner.name}", the owner of',
        f'-- schema "{schema}": the admin becomes a member of it, with whatever else it owns.',
    ]


def _create_role(role: str, *, login: bool = False) -> sql.Composed:
    """``CREATE ROLE``: NOLOGIN unless ``login`` (a role that connects
    itself, without a password: set one or use another authentication)."""
    return sql.SQL("CREATE ROLE {} {}").format(
        sql.Identifier(role_name(role)), sql.SQL("LOGIN" if login else "NOLOGIN")
    )


def grant(
    role: str,
    kind: str,
    *,
    dsn: str | None = None,
    schema: str = "pgqueue",
    dry_run: bool = False,
    create: bool = False,
    login: bool = False,
) -> list[str]:
    """Give ``role`` (an existing database role) the privileges of ``kind``
    (``"producer"``, ``"worker"`` or ``"admin"``) on ``schema``, in one
    transaction; returns the SQL (``--`` comments, then the statements).
    ``dry_run``: only return it. Run it as the schema's owner or a superuser,
    after ``pgqueue migrate``.

    ``create``: create the role in the same transaction when it does not
    exist (the SQL then starts with ``CREATE ROLE``; that needs CREATEROLE),
    NOLOGIN unless ``login``: a role that a login role is granted or sets
    (``SET ROLE``, as ``pgqueue serve`` does). A role that exists is left as
    it is."""
    role, known, schema = role_name(role), kind_name(kind), validation.schema_name(schema)
    if login and not create:
        raise InvalidOption("login=True goes with create=True (an existing role is left as it is)")
    target = resolve_dsn(dsn)
    hint = f'run {program()} grant as the owner of schema "{schema}" or a superuser'
    database = Database(
        target,
        queries_for(schema),
        permission_hint=hint + (" (creating a role needs CREATEROLE)" if create else ""),
    )
    with translated(database.translate), database.connect() as conn:
        exists, owner = _check(database, conn, role, schema, create=create)
        statements = grant_statements(role, known, schema, owner)
        if not exists:
            statements.insert(0, _create_role(role, login=login))
        text = [
            f'-- pgqueue grant: {known} rights on schema "{schema}" for role "{role}"',
            *_notes(known, schema, owner),
            *(f"{statement.as_string(conn)};" for statement in statements),
        ]
        if not dry_run:
            _execute(database, conn, statements, schema)
    return text


def _check(
    database: Database, conn: Connection[Any], role: str, schema: str, *, create: bool
) -> tuple[bool, Owner]:
    """Whether the role exists (it must, unless ``create``) and the schema's
    owner, once the schema is at this version."""
    exists = database.run(roles_ops.may_become(role), conn) is not None
    if not exists and not create:
        raise InvalidName(
            f'role "{role}" does not exist: create it first (CREATE ROLE "{role}" LOGIN; '
            "NOLOGIN for a role that login roles are granted), or pass --create "
            "(create=True in Python) to create it with the grant"
        )
    owner = database.run(roles_ops.schema_owner(schema), conn)
    revision = None if owner is None else database.revision(conn)
    if owner is None or revision != SCHEMA_REVISION:
        state = "is not migrated" if revision is None else f"is at revision {revision}"
        raise SchemaNotMigrated(
            f'schema "{schema}" {state}; this pgqueue grants on revision {SCHEMA_REVISION}: '
            f"run `{migrate_command(schema)}` first"
        )
    return exists, Owner(*owner)


def _execute(
    database: Database, conn: Connection[Any], statements: list[sql.Composed], schema: str
) -> None:
    """Run the statements in one transaction. A GRANT of privileges the
    connecting role cannot pass on succeeds with a WARNING and grants nothing
    (or part): such warnings roll everything back."""
    with conn.transaction():
        warnings = database.run_composed(conn, statements)
        if warnings:
            raise PermissionDenied(
                f'this role may not grant every privilege on schema "{schema}" '
                f"({warnings[0]}, and {len(warnings) - 1} more): nothing was granted; run "
                f'{program()} grant as the owner of schema "{schema}" or a superuser'
            )


def grant_sql(
    role: str,
    kind: str,
    schema: str = "pgqueue",
    owner: str | None = None,
    *,
    create: bool = False,
    login: bool = False,
) -> list[str]:
    """The SQL of :func:`grant` without connecting (``pgqueue grant --sql``),
    for a DBA to review and run: the role need not exist yet. ``owner``: the
    schema's owner, whom an admin becomes a member of (a comment says so when
    it is not given). ``create``: start with its ``CREATE ROLE`` (NOLOGIN
    unless ``login``)."""
    role, known, schema = role_name(role), kind_name(kind), validation.schema_name(schema)
    if login and not create:
        raise InvalidOption("login=True goes with create=True (an existing role is left as it is)")
    given = Owner(role_name(owner), False) if owner is not None else None
    notes = [f'-- pgqueue grant: {known} rights on schema "{schema}" for role "{role}"']
    if known == "admin":
        notes += (
            _notes(known, schema, given)
            if given is not None
            else [
                "-- migrate and maintenance (VACUUM) need the rights of the owner of schema",
                f'-- "{schema}": also run GRANT <owner> TO "{role}" (or pass --owner), unless',
                "-- the owner is a superuser.",
            ]
        )
    statements = grant_statements(role, known, schema, given)
    if create:
        statements.insert(0, _create_role(role, login=login))
    return [*notes, *(f"{statement.as_string()};" for statement in statements)]
