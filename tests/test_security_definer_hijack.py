"""A hostile search_path against every SECURITY DEFINER function a producer or
worker may call.

A definer function runs as the schema's owner. Were one to resolve names
through its caller's search_path (its ``SET search_path`` pin forgotten), a
producer or worker could shadow a function or operator its body uses with
one of its own and run code as the owner. Here the roles shadow many in a
schema of their own, put first on their search_path, and call every definer
function they may execute: each call must work as usual.

The list of functions comes from the catalog (definer functions a producer
or worker role may EXECUTE), so a new one fails
``test_every_definer_function_a_role_may_call_has_a_call`` until it has a
call here. And each shadow set is shown to matter: with one function's pin
removed, its call runs into a shadow, as the owner
(``test_without_its_pin_each_function_is_hijacked``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqueue
from tests.test_security_grants import Role, Roles

HOSTILE_PATH = "evil, pg_catalog, pgqueue"
TOKEN = "t" * 32  # a worker's secret: 16 to 200 characters

#: Functions and operators of pg_catalog that the definer bodies use,
#: shadowed in the roles' schema (same signature: the search_path decides).
SHADOWED_FUNCTIONS = [
    ("now()", "timestamptz"),
    ("clock_timestamp()", "timestamptz"),
    ("btrim(text)", "text"),
    ("length(text)", "integer"),
    ("jsonb_typeof(jsonb)", "text"),
    ("jsonb_array_length(jsonb)", "integer"),
    ("cardinality(anyarray)", "integer"),
    (
        "make_interval(years integer DEFAULT 0, months integer DEFAULT 0,"
        " weeks integer DEFAULT 0, days integer DEFAULT 0, hours integer DEFAULT 0,"
        " mins integer DEFAULT 0, secs double precision DEFAULT 0.0)",
        "interval",
    ),
    ("sha256(bytea)", "bytea"),
    ('"left"(text, integer)', "text"),
    ("random()", "double precision"),
    ("pg_notify(text, text)", "void"),
]
SHADOWED_OPERATORS = [
    ("=", "bigint", "bigint"),
    ("=", "text", "text"),
    (">", "bigint", "integer"),
    (">=", "timestamptz", "timestamptz"),
]


@dataclass
class Context:
    app: pgqueue.App  # as the owner
    dsn: str  # the owner's

    def leased(self) -> tuple[int, int]:
        """A job leased by the owner: (job id, attempt id)."""
        queue = f"q{uuid.uuid4().hex[:8]}"
        self.app.enqueue("t", queue=queue)
        (job,) = self.app.lease(queue, "owner-worker")
        return job.job_id, job.attempt_id

    def queued(self) -> tuple[int]:
        return (self.app.enqueue("t").job_id,)

    def ready(self) -> tuple[()]:
        """A job to lease (the call takes no parameter)."""
        self.app.enqueue("t")
        return ()

    def one(self, query: str, params: Any = None) -> Any:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchone() if cur.description else None


@dataclass(frozen=True)
class Call:
    role: str  # "producer" or "worker": the least role that may call it
    query: str  # run as that role, with the hostile search_path (no shadowed name in it!)
    setup: Callable[[Context], Any] = lambda _: None  # as the owner; the query's parameters


def _expired(ctx: Context) -> tuple[()]:
    job_id, _ = ctx.leased()
    ctx.one(
        "UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
        (job_id,),
    )
    return ()


def _due_schedule(ctx: Context) -> tuple[Any, ...]:
    ctx.app.add_schedule("hijack", "* * * * *", "t")
    due, revision, created = ctx.one(
        "SELECT next_fire_at, revision, created_at FROM pgqueue.schedules WHERE name = 'hijack'"
    )
    return due, revision, created, due + timedelta(minutes=1), due


def _registered(ctx: Context) -> tuple[str]:
    ctx.one(
        "SELECT pgqueue.register_worker('w-gone', %s, 'h', 1, ARRAY['default'], 1, NULL, NULL)",
        (TOKEN,),
    )
    return (TOKEN,)


def _leaf_to_create(ctx: Context) -> tuple[Any, ...]:
    row = ctx.one(
        # Two days on (the owner may pass a clock), leaves ahead are due.
        "SELECT status::text, lower, upper FROM pgqueue.retention_plan(now() + interval '2 days')"
        " WHERE action = 'create' ORDER BY lower LIMIT 1"
    )
    assert row is not None, "retention plans no leaf to create"
    return tuple(row)


def _now(ctx: Context) -> tuple[Any]:
    return (ctx.one("SELECT now()")[0],)


LEASED = "ARRAY[%s]::bigint[], ARRAY[%s]::bigint[]"

CALLS: dict[str, Call] = {
    # --- producer ---------------------------------------------------------------
    # (A windowed enqueue: the plain one only hands its arguments on to enqueue_plain.)
    "enqueue": Call(
        "producer",
        "SELECT pgqueue.enqueue('t', '{\"a\": 1}', dedup_key => 'k', dedup_window => '1 min')",
    ),
    "enqueue_batch": Call("producer", 'SELECT * FROM pgqueue.enqueue_batch(\'[{"task": "t"}]\')'),
    "enqueue_windowed": Call(
        "producer",
        "SELECT * FROM pgqueue.enqueue_windowed("
        '\'[{"task": "t", "dedup_key": "w", "dedup_window": 60}]\')',
    ),
    "enqueue_job": Call("producer", "SELECT * FROM pgqueue.enqueue_job('t', '{\"a\": 1}')"),
    "enqueue_payloads": Call(
        "producer", 'SELECT pgqueue.enqueue_payloads(\'{"task": "t"}\', \'[{"n": 1}]\')'
    ),
    "watch_job": Call("producer", "SELECT pgqueue.watch_job(%s)", Context.queued),
    "job_status": Call("producer", "SELECT * FROM pgqueue.job_status(%s)", Context.queued),
    # Durable tasks: an event releases the jobs waiting for it.
    "send_event": Call("producer", "SELECT pgqueue.send_event('paid:1', '{\"plan\": \"pro\"}')"),
    # --- worker: the batch statements -------------------------------------------
    "lease_jobs": Call(
        "worker", "SELECT * FROM pgqueue.lease_jobs(ARRAY['default'], 'w', 1)", Context.ready
    ),
    "ack_jobs": Call(
        "worker",
        f"SELECT * FROM pgqueue.ack_jobs({LEASED}, ARRAY[NULL]::jsonb[])",
        Context.leased,
    ),
    "fail_jobs": Call(
        "worker",
        f"SELECT * FROM pgqueue.fail_jobs({LEASED}, ARRAY['failed'], ARRAY[NULL]::timestamptz[],"
        " ARRAY[NULL]::float8[], ARRAY[false], ARRAY['error'], ARRAY['boom'], ARRAY[NULL]::text[])",
        Context.leased,
    ),
    "release_jobs": Call("worker", f"SELECT * FROM pgqueue.release_jobs({LEASED})", Context.leased),
    "extend_jobs": Call(
        "worker",
        f"SELECT * FROM pgqueue.extend_jobs({LEASED}, ARRAY[30]::float8[])",
        Context.leased,
    ),
    "reap_jobs": Call("worker", "SELECT * FROM pgqueue.reap_jobs(10)", _expired),
    # --- worker: durable tasks ---------------------------------------------------
    "store_step": Call(
        "worker",
        "SELECT pgqueue.store_step(%s, %s, 'charge', 'step', 'succeeded', '1', NULL)",
        Context.leased,
    ),
    "wait_event": Call(
        "worker",
        "SELECT * FROM pgqueue.wait_event(%s, %s, 'event:k', 'k', 60, NULL)",
        Context.leased,
    ),
    # --- worker: schedules, tasks, registration, maintenance --------------------
    "fire_schedules": Call(
        "worker",
        "SELECT * FROM pgqueue.fire_schedules(ARRAY['hijack'], ARRAY[%s]::timestamptz[],"
        " ARRAY[%s]::bigint[], ARRAY[%s]::timestamptz[], ARRAY[%s]::timestamptz[],"
        ' ARRAY[%s]::timestamptz[], ARRAY[\'[{"task": "t"}]\']::jsonb[])',
        _due_schedule,
    ),
    "register_periodic": Call(
        "worker",
        "SELECT * FROM pgqueue.register_periodic('p', '* * * * *', 'UTC', 't', NULL, '{}',"
        " NULL, NULL, true, %s)",
        _now,
    ),
    "publish_tasks": Call(
        "worker",
        "SELECT pgqueue.publish_tasks('w', ARRAY['t'], ARRAY['default'], ARRAY[0]::smallint[],"
        " ARRAY[5], ARRAY[60], ARRAY[30]::float8[], ARRAY[1]::real[], ARRAY[2]::real[],"
        " ARRAY[60]::real[], ARRAY[0.1]::real[])",
    ),
    "register_worker": Call(
        "worker",
        "SELECT pgqueue.register_worker('w-new', %s, 'h', 1, ARRAY['default'], 1, NULL, NULL)",
        lambda _: (TOKEN,),
    ),
    "heartbeat_worker": Call(
        "worker",
        "SELECT pgqueue.heartbeat_worker('w-beat', %s, 'h', 1, ARRAY['default'], 1, NULL, NULL)",
        lambda _: (TOKEN,),
    ),
    "deregister_worker": Call(
        "worker",
        "SELECT pgqueue.deregister_worker('w-gone', %s)",
        _registered,
    ),
    "mark_lost_workers": Call("worker", "SELECT * FROM pgqueue.mark_lost_workers(60)"),
    "prune_lost_workers": Call("worker", "SELECT * FROM pgqueue.prune_lost_workers(0)"),
    "maintenance_claim": Call("worker", "SELECT pgqueue.maintenance_claim('w-m', 60)"),
    "maintenance_done": Call("worker", "SELECT pgqueue.maintenance_done('w-m', NULL)"),
    "maintenance_release": Call("worker", "SELECT pgqueue.maintenance_release('w-m')"),
    "retention_plan": Call("worker", "SELECT * FROM pgqueue.retention_plan()"),
    "retention_create_leaf": Call(
        "worker",
        "SELECT pgqueue.retention_create_leaf(%s::pgqueue.job_status, %s, %s)",
        _leaf_to_create,
    ),
    "retention_drop_leaf": Call(
        "worker", "SELECT pgqueue.retention_drop_leaf('jobs_succeeded_none', true)"
    ),
    "retention_purge": Call(
        "worker", "SELECT pgqueue.retention_purge('jobs_archive', 'succeeded', %s, 10)", _now
    ),
    # --- worker: the SQL worker API ---------------------------------------------
    "lease": Call("worker", "SELECT * FROM pgqueue.lease(ARRAY['default'], 'w', 1)", Context.ready),
    "ack": Call("worker", "SELECT pgqueue.ack(%s, %s)", Context.leased),
    "ack_many": Call("worker", f"SELECT * FROM pgqueue.ack_many({LEASED})", Context.leased),
    "fail": Call("worker", "SELECT pgqueue.fail(%s, %s, 'boom')", Context.leased),
    "nack": Call("worker", "SELECT pgqueue.nack(%s, %s)", Context.leased),
    "extend": Call("worker", "SELECT pgqueue.extend(%s, %s, 30)", Context.leased),
}


@pytest.fixture
def hostile(db_dsn: str, pg_server_dsn: str) -> Iterator[dict[str, Role]]:
    """A producer and a worker role, with the shadows in a schema of the
    worker's, and function call statistics on for their sessions."""
    made = Roles(pg_server_dsn)
    try:
        roles = {kind: made.create(db_dsn, kind=kind) for kind in ("producer", "worker")}
        database = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
        with psycopg.connect(db_dsn, autocommit=True) as su:
            su.execute(
                sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(
                    sql.Identifier(roles["worker"].name)
                )
            )
            su.execute(
                sql.SQL("GRANT USAGE ON SCHEMA evil TO {}").format(
                    sql.Identifier(roles["producer"].name)
                )
            )
            for role in roles.values():
                su.execute(
                    sql.SQL("ALTER ROLE {} IN DATABASE {} SET track_functions = 'all'").format(
                        sql.Identifier(role.name), sql.Identifier(str(database))
                    )
                )
        with psycopg.connect(roles["worker"].dsn, autocommit=True) as conn:
            raising = "BEGIN RAISE EXCEPTION 'hijacked: {} as %', current_user; END"
            for signature, returns in SHADOWED_FUNCTIONS:
                body = raising.format(signature.split("(")[0])
                conn.execute(
                    f"CREATE FUNCTION evil.{signature} RETURNS {returns}"
                    f" LANGUAGE plpgsql AS $$ {body} $$"
                )
            for n, (op, left, right) in enumerate(SHADOWED_OPERATORS):
                body = raising.format(f"operator {op}")
                conn.execute(
                    f"CREATE FUNCTION evil.op{n}({left}, {right}) RETURNS boolean"
                    f" LANGUAGE plpgsql AS $$ {body} $$"
                )
                conn.execute(
                    f"CREATE OPERATOR evil.{op} (LEFTARG = {left}, RIGHTARG = {right},"
                    f" FUNCTION = evil.op{n})"
                )
        yield roles
    finally:
        made.drop_all()


def hostile_session(role: Role) -> psycopg.Connection[Any]:
    conn = psycopg.connect(role.dsn)
    conn.execute(f"SET search_path = {HOSTILE_PATH}")
    with pytest.raises(psycopg.errors.RaiseException, match="hijacked"):
        conn.execute("SELECT btrim('x')")  # the shadows work for the role's own SQL
    conn.rollback()
    conn.execute(f"SET search_path = {HOSTILE_PATH}")
    conn.commit()
    return conn


def definers(dsn: str, roles: dict[str, Role]) -> dict[str, tuple[int, str]]:
    """Definer functions of the schema some role may execute: name -> (oid, signature)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.oid::int, p.oid::regprocedure::text FROM pg_proc p"
            " WHERE p.pronamespace = 'pgqueue'::regnamespace AND p.prosecdef"
            "   AND (has_function_privilege(%s, p.oid, 'EXECUTE')"
            "        OR has_function_privilege(%s, p.oid, 'EXECUTE'))",
            (roles["producer"].name, roles["worker"].name),
        ).fetchall()
    found = {name: (oid, signature) for name, oid, signature in rows}
    assert len(found) == len(rows), "names of definer functions are unique"
    return found


def test_every_definer_function_a_role_may_call_has_a_call(
    db_dsn: str, hostile: dict[str, Role]
) -> None:
    exposed = definers(db_dsn, hostile)
    assert sorted(exposed) == sorted(CALLS)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for name, call in CALLS.items():
            (may_produce,) = conn.execute(
                "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')",
                (hostile["producer"].name, exposed[name][0]),
            ).fetchone() or (None,)
            assert may_produce == (call.role == "producer"), name


def test_every_definer_function_works_under_a_hostile_search_path(
    app: pgqueue.App, db_dsn: str, hostile: dict[str, Role]
) -> None:
    exposed = definers(db_dsn, hostile)
    ctx = Context(app, db_dsn)
    sessions = {kind: hostile_session(role) for kind, role in hostile.items()}
    try:
        for name, call in CALLS.items():
            params = call.setup(ctx)
            conn = sessions[call.role]
            conn.execute(call.query, params).fetchall()
            # Exercised: the call ran the function itself (this transaction's count).
            row = conn.execute(
                "SELECT calls FROM pg_stat_xact_user_functions WHERE funcid = %s::oid",
                (exposed[name][0],),
            ).fetchone()
            assert row is not None, f"{name} was not called"
            assert row[0] >= 1, f"{name} was not called"
            conn.commit()
    finally:
        for conn in sessions.values():
            conn.close()


def test_without_its_pin_each_function_is_hijacked(
    app: pgqueue.App, db_dsn: str, hostile: dict[str, Role]
) -> None:
    """The calls above would catch a missing pin: with one function's
    ``SET search_path`` removed, its call runs a shadow, as the owner."""
    exposed = definers(db_dsn, hostile)
    ctx = Context(app, db_dsn)
    (owner,) = ctx.one("SELECT current_user")
    safe = []
    hijacked: dict[str, str] = {}
    for name, call in CALLS.items():
        params = call.setup(ctx)
        signature = sql.SQL(exposed[name][1])  # type: ignore[arg-type]
        with psycopg.connect(db_dsn, autocommit=True) as su:
            su.execute(sql.SQL("ALTER FUNCTION {} RESET search_path").format(signature))
        try:
            conn = hostile_session(hostile[call.role])
            try:
                conn.execute(call.query, params)
                safe.append(name)
            except psycopg.errors.RaiseException as exc:
                hijacked[name] = str(exc)
            finally:
                conn.close()
        finally:
            with psycopg.connect(db_dsn, autocommit=True) as su:
                su.execute(
                    sql.SQL("ALTER FUNCTION {} SET search_path = pg_catalog, pg_temp").format(
                        signature
                    )
                )
    assert safe == [], "these calls reach no shadow: shadow what their bodies use"
    # Each ran a shadow as the owner: a privilege escalation.
    assert {n: f"as {owner}" in text for n, text in hijacked.items()} == dict.fromkeys(CALLS, True)
