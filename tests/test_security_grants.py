"""Least privilege: ``pgqueue grant --role R --producer|--worker|--admin``.

Every test connects *as* the granted role (a LOGIN role created for the test,
dropped afterwards: roles are cluster-wide) and shows what it can do and what
is refused, with the database unchanged after each refusal.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.grants import grant, grant_sql, grant_statements, role_name
from pgqueue.migrate import current, downgrade, upgrade
from pgqueue.version import SCHEMA_REVISION
from tests.apps import least_privilege
from tests.cli_support import assert_one_line_error, invoke, run_cli
from tests.fixtures.dbstate import snapshot
from tests.fixtures.workers import Workers

# --- roles ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    name: str
    dsn: str  # the test database, logged in as this role


class Roles:
    """LOGIN roles with unique names (roles are shared by every database of the
    cluster, and by parallel test runs); each is dropped after the test."""

    def __init__(self, server_dsn: str) -> None:
        self.server_dsn = server_dsn
        self.created: list[tuple[str, list[str]]] = []  # (role, databases it may hold rights in)

    def create(self, dsn: str, prefix: str = "pgq_role", *, kind: str | None = None) -> Role:
        """A new role that logs in to ``dsn``'s database, granted ``kind`` there."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        password = uuid.uuid4().hex  # the server may not trust local connections
        with psycopg.connect(self.server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
        self.created.append((name, [dsn]))
        role = Role(name, make_conninfo(dsn, user=name, password=password))
        if kind is not None:
            grant(name, kind, dsn=dsn)
        return role

    def drop_all(self) -> None:
        for name, dsns in reversed(self.created):
            for dsn in dsns:
                try:
                    with psycopg.connect(dsn, autocommit=True) as db:
                        db.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE usename = %s",
                            (name,),
                        )
                        # Revokes its privileges (and drops what it owns) in this database.
                        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                except psycopg.OperationalError:
                    pass  # that database is gone already
            with psycopg.connect(self.server_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def roles(pg_server_dsn: str) -> Iterator[Roles]:
    made = Roles(pg_server_dsn)
    try:
        yield made
    finally:
        made.drop_all()


def refused(call: Callable[[], object], dsn: str, match: str = "permission denied") -> None:
    """``call`` raises PermissionDenied naming the refusal, and nothing was written."""
    before = snapshot(dsn)
    with pytest.raises(pgqueue.PermissionDenied, match=match) as caught:
        call()
    assert "pgqueue grant" in str(caught.value) or "owner" in str(caught.value)
    assert snapshot(dsn) == before


def refused_sql(role: Role, statements: list[str], db_dsn: str) -> None:
    """Each statement, run directly as ``role``, fails with insufficient privilege."""
    before = snapshot(db_dsn)
    with psycopg.connect(role.dsn, autocommit=True) as conn:
        for statement in statements:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert snapshot(db_dsn) == before


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# --- the statements ---------------------------------------------------------------------


def test_statements_quote_every_name() -> None:
    text = [s.as_string() for s in grant_statements('we"ird ro;le', "worker", "my_schema")]
    assert text[0] == 'GRANT USAGE ON SCHEMA "my_schema" TO "we""ird ro;le"'
    assert all(t.endswith(' TO "we""ird ro;le"') for t in text if t.startswith("GRANT"))
    assert all(t.endswith(' FROM "we""ird ro;le"') for t in text if t.startswith("REVOKE"))
    assert text[-1].startswith('INSERT INTO "my_schema"."role_grants"')
    assert "'we\"ird ro;le'" in text[-1]
    assert any('"my_schema"."jobs"' in t for t in text)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "public",
        "PUBLIC",
        "none",
        "pg_monitor",
        "a\x00b",
        "tab\there",
        "x\udc80",
        "r" * 64,
        "é" * 32,
        42,
        None,
    ],
)
def test_role_names_that_are_refused(name: Any) -> None:
    with pytest.raises(pgqueue.InvalidName):
        role_name(name)


def test_unknown_kind_and_role(db_dsn: str, roles: Roles) -> None:
    with pytest.raises(pgqueue.InvalidOption, match="one of producer, worker, admin"):
        grant("someone", "superuser", dsn=db_dsn)
    with pytest.raises(pgqueue.InvalidName, match="does not exist: create it first"):
        grant(f"pgq_missing_{uuid.uuid4().hex[:8]}", "producer", dsn=db_dsn)


def test_grant_needs_the_current_schema(empty_db_dsn: str, roles: Roles) -> None:
    role = roles.create(empty_db_dsn)
    with pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"):
        grant(role.name, "producer", dsn=empty_db_dsn)


def test_dry_run_writes_nothing_and_grant_is_idempotent(db_dsn: str, roles: Roles) -> None:
    role = roles.create(db_dsn)
    acl = "SELECT relacl::text FROM pg_class WHERE oid = 'pgqueue.jobs'::regclass"
    before = scalar(db_dsn, acl)

    text = grant(role.name, "worker", dsn=db_dsn, dry_run=True)

    assert scalar(db_dsn, acl) == before
    assert text[0].startswith("-- pgqueue grant: worker rights")
    assert all(line.endswith(";") for line in text if not line.startswith("--"))
    with pgqueue.App(db_dsn) as app:
        assert app.grant(role.name, "worker", dry_run=True) == text
    assert scalar(db_dsn, acl) == before
    assert grant(role.name, "worker", dsn=db_dsn) == text
    assert grant(role.name, "worker", dsn=db_dsn) == text  # again: the same, no error
    assert scalar(db_dsn, acl) != before


def test_only_the_owner_or_a_superuser_can_grant(db_dsn: str, roles: Roles) -> None:
    worker = roles.create(db_dsn, kind="worker")
    other = roles.create(db_dsn)
    # The worker may not pass on its privileges, nor take more for itself.
    for kind in ("worker", "admin"):
        before = scalar(db_dsn, "SELECT count(*) FROM information_schema.role_table_grants")
        with pytest.raises(pgqueue.PermissionDenied, match="owner of schema"):
            grant(other.name, kind, dsn=worker.dsn)
        after = scalar(db_dsn, "SELECT count(*) FROM information_schema.role_table_grants")
        assert after == before


# --- the SECURITY DEFINER functions ----------------------------------------------------------


def test_enqueue_functions_run_as_owner_with_a_pinned_search_path(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            """
            SELECT p.proname, p.prosecdef, p.proconfig,
                   EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner)))
                           WHERE grantee = 0) AS public_execute
            FROM pg_proc p WHERE p.pronamespace = 'pgqueue'::regnamespace
            ORDER BY p.proname"""
        ).fetchall()
    functions = {name: (definer, config, public) for name, definer, config, public in rows}
    pinned = ["search_path=pg_catalog, pg_temp"]
    assert functions["enqueue"] == (True, pinned, False)
    # 0004 adds plan settings (cached plans pinned to the indexes) after the pin.
    definer, config, public = functions["enqueue_batch"]
    assert (definer, config[:1], public) == (True, pinned, False)
    assert "search_path" not in " ".join(config[1:])
    assert functions["enqueue_rows"] == (False, None, False)
    # 0007: enqueue() gained dedup_window/debounce; the previous signature
    # lives on as enqueue_plain, and enqueue_windowed serves Python's batches.
    assert functions["enqueue_plain"] == (True, pinned, False)
    assert functions["enqueue_windowed"] == (True, pinned, False)
    assert functions["dedup_claim"] == (False, None, False)
    definer, config, public = functions["enqueue_job"]
    assert (definer, config[:1], public) == (True, pinned, False)
    definers = {name for name, (definer, _, _) in functions.items() if definer}
    # 0005: every change a producer or worker makes goes through a definer function.
    assert definers == {
        "enqueue", "enqueue_batch", "enqueue_plain", "enqueue_windowed",
        "lease_jobs", "ack_jobs", "fail_jobs", "release_jobs", "extend_jobs", "reap_jobs",
        "watch_job", "fire_schedules", "register_periodic",
        "lease", "ack", "ack_many", "fail", "nack", "extend", "job_status",
        # 0006: workers publish their tasks.
        "publish_tasks",
        # 0013: workers write only their own registration; the reaper's bookkeeping.
        "register_worker", "heartbeat_worker", "deregister_worker", "mark_lost_workers",
        "prune_lost_workers",
        # 0010: the partitioned archive's functions create and drop tables as the owner.
        "archive_partitions_ensure", "archive_partitions_drop",
        "archive_partition_prepare", "archive_partition_switch",
        # 0012: one job from scalar arguments (the App's single enqueue), and
        # many jobs that differ only in their payload.
        "enqueue_job", "enqueue_payloads",
        # Retention: the workers' maintenance creates and drops the finished
        # partitions' leaves as the owner; operators change retention.
        "retention_plan", "retention_create_leaf", "retention_drop_leaf", "retention_purge",
        "set_retention", "maintenance_claim", "maintenance_done", "maintenance_release",
        # Durable tasks: steps and event waits fenced by the attempt id, and
        # events that release waiting jobs.
        "store_step", "wait_event", "send_event",
    }  # fmt: skip
    for name in definers:
        assert functions[name][1][0] == pinned[0], name
    # Nothing is executable by PUBLIC any more.
    assert not any(public for _, _, public in functions.values())


def test_a_producer_cannot_hijack_the_definer_functions(
    db_dsn: str, roles: Roles, pg_server_dsn: str
) -> None:
    producer = roles.create(db_dsn, kind="producer")
    with psycopg.connect(db_dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(sql.Identifier(producer.name))
        )
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        # Functions the enqueue bodies call, shadowed in the producer's own
        # schema, put before pg_catalog on its search_path: were the
        # definer functions to resolve names through it, these would run as
        # the owner.
        for signature in ("btrim(text)", "jsonb_typeof(jsonb)"):
            conn.execute(
                f"CREATE FUNCTION evil.{signature} RETURNS text LANGUAGE plpgsql"
                " AS $$ BEGIN RAISE EXCEPTION 'hijacked: running as %', current_user; END $$"
            )
        conn.execute("SET search_path = evil, pg_catalog, pgqueue")
        with pytest.raises(psycopg.errors.RaiseException, match="hijacked"):
            conn.execute("SELECT btrim('x')")  # the shadowing works for the producer's own SQL
        row = conn.execute("SELECT pgqueue.enqueue('t', '{\"a\": 1}', queue => 'safe')").fetchone()
        assert row is not None
        job = conn.execute(
            "SELECT task, payload, queue FROM pgqueue.jobs WHERE id = %s", (row[0],)
        ).fetchone()
    assert job == ("t", {"a": 1}, "safe")


# --- producer ---------------------------------------------------------------------------


def test_producer_enqueues_and_reads_its_jobs(app: pgqueue.App, db_dsn: str, roles: Roles) -> None:
    producer = roles.create(db_dsn, kind="producer")
    with pgqueue.App(producer.dsn) as prod:
        first = prod.enqueue("t", {"a": 1}, queue="q1", dedup_key="k1")
        assert prod.enqueue("t", {"a": 2}, queue="q1", dedup_key="k1") == pgqueue.Enqueued(
            first.job_id, False
        )
        batch = prod.enqueue_many([pgqueue.JobSpec("t", {"n": n}, queue="q1") for n in range(3)])
        with psycopg.connect(producer.dsn) as conn:
            from_sql = conn.execute("SELECT pgqueue.enqueue('t', queue => 'q1')").fetchone()
            assert from_sql is not None
            conn.commit()
        job = prod.get_job(first.job_id, history=True)
        assert (job.task, job.payload, job.status) == ("t", {"a": 1}, pgqueue.JobStatus.QUEUED)
        assert len(prod.list_jobs(queue="q1").jobs) == 5

        # result(): waits via NOTIFY until a worker (here the owner) finishes the job.
        leased = app.lease("q1", "w1", max=10)
        target = next(j for j in leased if j.job_id == batch[0].job_id)
        finisher = threading.Timer(0.3, lambda: app.ack(target, {"done": True}))
        finisher.start()
        started = time.monotonic()
        assert prod.result(target.job_id, timeout=10) == {"done": True}
        assert time.monotonic() - started < 5
        finisher.join()


def test_producer_is_refused_everything_else(app: pgqueue.App, db_dsn: str, roles: Roles) -> None:
    producer = roles.create(db_dsn, kind="producer")
    dead_id = app.enqueue("t", max_attempts=1, queue="d").job_id
    (leased_dead,) = app.lease("d", "w0")
    app.fail(leased_dead, "boom")
    job_id = app.enqueue("t", {"a": 1}).job_id
    (leased,) = app.lease("default", "w1")
    with pgqueue.App(producer.dsn) as prod:
        for call in (
            lambda: prod.lease("default", "w2"),
            lambda: prod.ack(leased),
            lambda: prod.fail(leased, "no"),
            lambda: prod.nack(leased),
            lambda: prod.extend(leased, 30),
            lambda: prod.reap(),
            lambda: prod.cancel(job_id),
            lambda: prod.requeue_dead(dead_id),
            lambda: prod.archive("0s", statuses=("dead",)),
            lambda: prod.prune("0s"),
            lambda: prod.pause_queue("default"),
            lambda: prod.add_schedule("s", "* * * * *", "t"),
            lambda: prod.metrics(),
        ):
            refused(call, db_dsn)
        refused(prod.migrate, db_dsn, match="cannot migrate")
    refused_sql(
        producer,
        [
            "INSERT INTO pgqueue.jobs (status, run_at, queue, task, payload)"
            " VALUES ('queued', now(), 'default', 'x', '{}')",
            f"UPDATE pgqueue.jobs SET status = 'succeeded' WHERE id = {job_id}",
            f"UPDATE pgqueue.jobs SET payload = '{{}}' WHERE id = {job_id}",
            f"DELETE FROM pgqueue.jobs WHERE id = {job_id}",
            "DELETE FROM pgqueue.jobs_archive",
            "TRUNCATE pgqueue.jobs",
            "INSERT INTO pgqueue.job_attempts (id, job_id, attempt, outcome, started_at,"
            " finished_at) VALUES (1, 1, 1, 'failed', now(), now())",
            'SELECT * FROM pgqueue.enqueue_rows(\'[{"task": "x"}]\')',
            "SELECT * FROM pgqueue.lease_jobs(NULL, 'w', 1)",
            "SELECT nextval('pgqueue.jobs_id_seq')",
            "UPDATE pgqueue.queues SET paused = true",
            "SELECT * FROM pgqueue.workers",
            "DELETE FROM pgqueue.alembic_version",
            # 0005: not even notify_finish, nor a row lock that would stall leases.
            f"UPDATE pgqueue.jobs SET notify_finish = true WHERE id = {job_id}",
            "SELECT id FROM pgqueue.jobs FOR UPDATE",
            "SELECT id FROM pgqueue.jobs FOR SHARE",
        ],
        db_dsn,
    )
    # Asking to be told when a job ends goes through a function.
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgqueue.watch_job(%s)", (job_id,)).fetchone()
        assert row == ("running",)


def test_a_role_without_grants_is_told_what_to_run(db_dsn: str, roles: Roles) -> None:
    nobody = roles.create(db_dsn)
    with pgqueue.App(nobody.dsn) as app, pytest.raises(pgqueue.PermissionDenied) as caught:
        app.enqueue("t")
    assert "permission denied for schema pgqueue" in str(caught.value)
    assert f"pgqueue grant --role {nobody.name}" in str(caught.value)


# --- worker -----------------------------------------------------------------------------


def test_worker_role_runs_a_worker(
    app: pgqueue.App, db_dsn: str, roles: Roles, workers: Workers
) -> None:
    worker_role = roles.create(db_dsn, kind="worker")
    with pgqueue.App(db_dsn) as owner:
        ids = [
            owner.enqueue("ok", {"n": 1}, queue="lp").job_id,
            owner.enqueue("flaky", queue="lp", max_attempts=3).job_id,
            owner.enqueue("hopeless", queue="lp", max_attempts=1).job_id,
            owner.enqueue("spawn", {"n": 7}, queue="lp").job_id,
        ]
    worker = workers.spawn(
        "--concurrency", "4", "--reap-interval", "0.5s",
        app="tests.apps.least_privilege:app", dsn=worker_role.dsn,
    )  # fmt: skip
    worker.wait_registered()
    statuses = workers.wait_statuses(ids, timeout=60)
    assert [statuses[i] for i in ids] == ["succeeded", "succeeded", "dead", "succeeded"]
    assert app.get_job(ids[1], history=True).attempts == 2  # failed, retried, succeeded
    child = app.get_job(ids[3]).result
    assert app.get_job(child).payload == {"n": 7}  # enqueued by a task, as the worker role
    workers.wait_statuses([child], timeout=30)

    # The scheduler upserted its periodic schedule and fired it, as the worker role.
    def fired() -> int:
        return int(scalar(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE queue = 'lp-ticks'"))

    deadline = time.monotonic() + 30
    while fired() < 2:
        assert worker.alive(), worker.describe()
        assert time.monotonic() < deadline, worker.describe()
        time.sleep(0.2)
    assert app.get_schedule(least_privilege.PERIODIC).enabled
    assert "ermission denied" not in worker.log_text()


def test_worker_role_uses_the_consumer_api_but_no_admin_operation(
    app: pgqueue.App, db_dsn: str, roles: Roles
) -> None:
    worker_role = roles.create(db_dsn, kind="worker")
    app.add_schedule("nightly", "0 3 * * *", "t")
    with pgqueue.App(worker_role.dsn) as w:
        ids = [w.enqueue("t", {"n": n}).job_id for n in range(4)]
        a, b, c, d = w.lease("default", "w1", max=4, lease_seconds=1)
        w.ack(a, {"r": 1})
        assert w.fail(b, "again") in (pgqueue.JobStatus.SCHEDULED, pgqueue.JobStatus.QUEUED)
        w.nack(c)
        assert w.extend(d, 60)
        (e,) = w.lease("default", "w1", max=1, lease_seconds=1)
        time.sleep(1.2)
        assert w.reap() == 1
        assert w.get_job(e.job_id).attempts == 1
        assert w.metrics()["default"].running == 1
        assert w.check(worker_timeout=3600).ok

        dead_id = app.enqueue("t", max_attempts=1, queue="x").job_id
        (x,) = app.lease("x", "w0")
        app.fail(x, "boom")
        app.set_queue_limit("default", concurrency=5)  # the lease locks a limited queue's row
        assert [j.job_id for j in w.lease("default", "w1", max=5)] != []
        for call in (
            lambda: w.cancel(ids[1]),
            lambda: w.requeue_dead(dead_id),
            lambda: w.requeue_dead_many(queue="x"),
            lambda: w.archive("0s", statuses=("dead", "succeeded")),
            lambda: w.prune("0s"),
            lambda: w.pause_queue("default"),
            lambda: w.set_queue_limit("default", concurrency=1),
            lambda: w.remove_schedule("nightly"),
        ):
            refused(call, db_dsn)
        refused(w.migrate, db_dsn, match="cannot migrate")
    refused_sql(
        worker_role,
        [
            f"UPDATE pgqueue.jobs SET max_attempts = 100 WHERE id = {dead_id}",
            f"UPDATE pgqueue.jobs SET cancel_requested = true WHERE id = {ids[1]}",
            f"UPDATE pgqueue.jobs SET payload = '{{}}', task = 'other' WHERE id = {ids[1]}",
            "DELETE FROM pgqueue.jobs",
            "DELETE FROM pgqueue.job_attempts",
            "INSERT INTO pgqueue.jobs_archive (id, status, run_at, queue, task, payload) "
            "SELECT id, status, run_at, queue, task, payload FROM pgqueue.jobs",
            "UPDATE pgqueue.queues SET paused = true",
            "DELETE FROM pgqueue.schedules",
            "TRUNCATE pgqueue.workers",
            "SELECT nextval('pgqueue.jobs_id_seq')",
        ],
        db_dsn,
    )


def _register(
    conn: psycopg.Connection[Any], worker_id: str, token: str, fn: str = "register"
) -> Any:
    row = conn.execute(
        sql.SQL("SELECT pgqueue.{}(%s, %s, 'host-a', 4242, NULL, 4, ARRAY['t'], '9.9')").format(
            sql.Identifier(f"{fn}_worker")
        ),
        (worker_id, token),
    ).fetchone()
    assert row is not None
    return row[0]


def test_a_worker_role_writes_only_its_own_worker_row(
    db_dsn: str, roles: Roles, workers: Workers
) -> None:
    """#20: registration, heartbeat and deregistration go through definer
    functions fenced by the worker process's secret (0013); the worker role
    holds no write privilege on workers."""
    mine, other = roles.create(db_dsn, kind="worker"), roles.create(db_dsn, kind="worker")
    their_token, my_token = "b" * 48, "a" * 48
    with psycopg.connect(other.dsn, autocommit=True) as conn:
        _register(conn, "w-other", their_token)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.workers SET last_heartbeat_at = now() - interval '10 minutes'")
    before = snapshot(db_dsn)
    with psycopg.connect(mine.dsn, autocommit=True) as conn:
        # Another worker's row: no heartbeat, no re-registration, no removal.
        assert _register(conn, "w-other", my_token, "heartbeat") is False
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="another worker process"):
            _register(conn, "w-other", my_token)
        assert conn.execute(
            "SELECT pgqueue.deregister_worker('w-other', %s)", (my_token,)
        ).fetchone() == (False,)
        # Declaring a live worker lost: refused below the alive window.
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="60 seconds"):
            conn.execute("SELECT pgqueue.mark_lost_workers(0)")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="worker_id"):
            _register(conn, "bad\nid", my_token)
    refused_sql(
        mine,
        [
            "INSERT INTO pgqueue.workers (id, host, pid, concurrency) VALUES ('x', 'h', 1, 1)",
            "UPDATE pgqueue.workers SET last_heartbeat_at = now()",
            "UPDATE pgqueue.workers SET tasks = ARRAY['evil'] WHERE id = 'w-other'",
            "DELETE FROM pgqueue.workers WHERE id = 'w-other'",
            "SELECT * FROM pgqueue.workers FOR UPDATE",
        ],
        db_dsn,
    )
    assert snapshot(db_dsn) == before

    # Its own row: register, heartbeat, deregister.
    with psycopg.connect(mine.dsn, autocommit=True) as conn:
        _register(conn, "w-mine", my_token)
        conn.execute("SELECT pg_sleep(0.01)")
        assert _register(conn, "w-mine", my_token, "heartbeat") is True
        row = conn.execute(
            "SELECT version, host, pid, tasks, last_heartbeat_at > started_at FROM pgqueue.workers"
            " WHERE id = 'w-mine'"
        ).fetchone()
        assert row == ("9.9", "host-a", 4242, ["t"], True)
        assert conn.execute(
            "SELECT pgqueue.deregister_worker('w-mine', %s)", (my_token,)
        ).fetchone() == (True,)
    assert scalar(db_dsn, "SELECT array_agg(id) FROM pgqueue.workers") == ["w-other"]

    # A real worker as that role: registered with its version, gone after a clean exit.
    worker = workers.spawn("--concurrency", "2", app="tests.apps.least_privilege:app", dsn=mine.dsn)
    registered = worker.wait_registered()
    assert registered["version"] == pgqueue.__version__
    assert registered["token_hash"] is not None
    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
    assert worker.registration() is None
    assert "ermission denied" not in worker.log_text()


# --- admin ------------------------------------------------------------------------------


@pytest.fixture
def owned_db(empty_db_dsn: str, roles: Roles) -> Role:
    """The empty database migrated by a dedicated non-superuser owner role (the
    setup where migrations can be delegated to an admin)."""
    owner = roles.create(empty_db_dsn, "pgq_owner")
    database = scalar(empty_db_dsn, "SELECT current_database()")
    with psycopg.connect(empty_db_dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(owner.name)
            )
        )
    upgrade(owner.dsn)
    return owner


def test_admin_can_do_everything_including_migrate(
    owned_db: Role, empty_db_dsn: str, roles: Roles
) -> None:
    admin = roles.create(empty_db_dsn, "pgq_admin")
    worker_role = roles.create(empty_db_dsn, kind="worker")
    producer = roles.create(empty_db_dsn, kind="producer")
    text = grant(admin.name, "admin", dsn=empty_db_dsn)
    assert f'GRANT "{owned_db.name}" TO "{admin.name}";' in text

    for role in (producer, worker_role):
        with pytest.raises(pgqueue.PermissionDenied, match="cannot migrate"):
            upgrade(role.dsn)
    downgrade(owned_db.dsn, revision="base")
    upgrade(admin.dsn)  # the admin migrates (as a member of the owner role)
    assert current(empty_db_dsn) == SCHEMA_REVISION
    for kind, role in (("worker", worker_role), ("producer", producer)):
        grant(role.name, kind, dsn=admin.dsn)  # and may grant

    with pgqueue.App(admin.dsn) as adm:
        done = adm.enqueue("t", {"a": 1}).job_id
        cancelled = adm.enqueue("t").job_id
        dead = adm.enqueue("t", max_attempts=1, queue="d").job_id
        (leased,) = adm.lease("default", "a1")
        adm.ack(leased)
        adm.cancel(cancelled)
        (bad,) = adm.lease("d", "a1")
        adm.fail(bad, "boom")
        adm.requeue_dead(dead)
        adm.pause_queue("default")
        adm.set_queue_limit("default", concurrency=2, rate="10/1m")
        adm.add_schedule("nightly", "0 3 * * *", "t")
        adm.remove_schedule("nightly")
        assert adm.replay(done) > dead
        assert adm.archive("0s", statuses=("succeeded", "cancelled")) == 2
        assert adm.prune("0s")["archived_jobs"] == 2
        with pytest.raises(pgqueue.JobNotFound):
            adm.get_job(done)
        vacuumed = adm.vacuum()  # VACUUM needs the owner's rights
        assert {t.table for t in vacuumed} >= {"jobs", "job_attempts"}


def test_admin_of_a_superuser_owned_schema_cannot_migrate(
    app: pgqueue.App, db_dsn: str, roles: Roles
) -> None:
    admin = roles.create(db_dsn, "pgq_admin")
    text = grant(admin.name, "admin", dsn=db_dsn)
    # Membership in a superuser would make the admin a superuser: not granted.
    assert not any(line.startswith('GRANT "') for line in text)
    assert any("a superuser, so they stay with it" in line for line in text)
    assert not scalar(db_dsn, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (admin.name,))
    assert (
        scalar(
            db_dsn,
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member"
            " WHERE r.rolname = %s",
            (admin.name,),
        )
        == 0
    )

    dead = app.enqueue("t", max_attempts=1).job_id
    (leased,) = app.lease("default", "w")
    app.fail(leased, "boom")
    with pgqueue.App(admin.dsn) as adm:
        adm.requeue_dead(dead)
        adm.cancel(dead)
        assert adm.archive("0s", statuses=("cancelled",)) == 1
        assert adm.prune("0s")["archived_jobs"] == 1
        refused(adm.migrate, db_dsn, match="cannot migrate")


# --- the command ----------------------------------------------------------------------


def test_grant_command(db_dsn: str, roles: Roles) -> None:
    role = roles.create(db_dsn)
    acl = "SELECT relacl::text FROM pg_class WHERE oid = 'pgqueue.jobs'::regclass"
    before = scalar(db_dsn, acl)

    printed = run_cli(db_dsn, "grant", "--role", role.name, "--worker", "--sql")
    assert printed.returncode == 0, printed.stderr
    assert scalar(db_dsn, acl) == before
    statements = [line for line in printed.stdout.splitlines() if not line.startswith("--")]
    assert statements[0] == f'GRANT USAGE ON SCHEMA "pgqueue" TO "{role.name}";'
    assert any("lease_jobs" in line for line in statements)

    done = run_cli(db_dsn, "grant", "--role", role.name, "--producer")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip() == f'granted producer rights on schema "pgqueue" to role "{role.name}"'
    )
    with pgqueue.App(role.dsn) as prod:
        assert prod.enqueue("t").created


def _role_attributes(dsn: str, name: str) -> tuple[bool, bool] | None:
    """(rolcanlogin, rolsuper) of a role, or None when it does not exist."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", (name,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


def test_grant_create_makes_a_missing_role_nologin_unless_told(db_dsn: str, roles: Roles) -> None:
    producer, worker = (f"pgq_made_{uuid.uuid4().hex[:8]}" for _ in range(2))
    roles.created += [(producer, [db_dsn]), (worker, [db_dsn])]  # dropped after the test

    missing = invoke(db_dsn, "grant", "--role", producer, "--producer")
    assert_one_line_error(missing, "does not exist", "--create", "CREATE ROLE")
    assert _role_attributes(db_dsn, producer) is None

    done = run_cli(db_dsn, "grant", "--role", producer, "--producer", "--create")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(f'created role "{producer}" (NOLOGIN:')
    assert f'granted producer rights on schema "pgqueue" to role "{producer}"' in done.stdout
    assert _role_attributes(db_dsn, producer) == (False, False)
    # It holds the producer grant: a session that takes the role enqueues.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(producer)))
        conn.execute("SELECT pgqueue.enqueue('t')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgqueue.lease(ARRAY['default'], 'w', 1)")

    again = run_cli(db_dsn, "grant", "--role", producer, "--worker", "--create")
    assert again.returncode == 0, again.stderr
    assert f'role "{producer}" exists: left as it is' in again.stdout
    assert _role_attributes(db_dsn, producer) == (False, False)

    text = grant(worker, "worker", dsn=db_dsn, create=True, login=True)
    assert text[1] == f'CREATE ROLE "{worker}" LOGIN;'
    assert _role_attributes(db_dsn, worker) == (True, False)
    assert scalar(db_dsn, "SELECT kind FROM pgqueue.role_grants WHERE role = %s", (worker,)) == (
        "worker"
    )
    assert_one_line_error(
        invoke(db_dsn, "grant", "--role", worker, "--worker", "--login"), "goes with --create"
    )


def test_grant_create_needs_createrole_and_writes_nothing_without_it(
    db_dsn: str, roles: Roles
) -> None:
    admin = roles.create(db_dsn, kind="admin")  # every right on the schema, no CREATEROLE
    name = f"pgq_never_{uuid.uuid4().hex[:8]}"
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.PermissionDenied, match="create role") as refused:
        grant(name, "producer", dsn=admin.dsn, create=True)
    assert "CREATEROLE" in str(refused.value)
    assert _role_attributes(db_dsn, name) is None
    assert snapshot(db_dsn) == before


def test_grant_sql_create_prints_the_create_role_first() -> None:
    text = grant_sql("pgq_later", "producer", create=True)
    assert next(line for line in text if not line.startswith("--")) == (
        'CREATE ROLE "pgq_later" NOLOGIN;'
    )
    printed = invoke(
        None, "grant", "--role", "pgq_later", "--worker", "--sql", "--create", "--login"
    )
    assert printed.exit_code == 0, printed.output
    assert 'CREATE ROLE "pgq_later" LOGIN;' in printed.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--role", "x"), "exactly one of"),
        (("--role", "x", "--worker", "--admin"), "exactly one of"),
        (("--role", "public", "--producer"), "every role (PUBLIC)"),
        (("--role", "pgq_no_such_role_here", "--admin"), "does not exist"),
        (("--role", 'x"; DROP TABLE pgqueue.jobs; --', "--admin"), "does not exist"),
    ],
)
def test_grant_command_errors(db_dsn: str, args: tuple[str, ...], fragment: str) -> None:
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, "grant", *args), fragment)
    assert snapshot(db_dsn) == before


def test_migrate_command_as_a_worker_is_a_one_line_error(db_dsn: str, roles: Roles) -> None:
    worker_role = roles.create(db_dsn, kind="worker")
    assert_one_line_error(run_cli(worker_role.dsn, "migrate"), "cannot migrate", "owner")
    assert_one_line_error(
        run_cli(worker_role.dsn, "archive", "--older-than", "1d"),
        "permission denied for table",
        f"pgqueue grant --role {worker_role.name}",
    )


def test_a_worker_role_keeps_the_task_registry_through_definer_functions(
    app: pgqueue.App, db_dsn: str, roles: Roles
) -> None:
    from pgqueue.ops import tasks as task_ops
    from tests.apps.registry import build_app

    worker = roles.create(db_dsn, kind="worker")
    with build_app(worker.dsn) as worker_app:
        worker_app._database.run(task_ops.publish(list(worker_app.tasks.values()), "w-role"))
        assert worker_app._database.run(task_ops.all_settings()) == {}
    with psycopg.connect(db_dsn) as conn:
        published = conn.execute("SELECT name, published_by FROM pgqueue.tasks").fetchall()
    assert published
    assert {by for _, by in published} == {"w-role"}
    # Leasing a limited task (its settings row locked, its leases logged) as the worker.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.task_settings (name, concurrency_limit, rate_limit, rate_period)"
            " VALUES ('limited', 1, 5, interval '1 minute')"
        )
    app.enqueue("limited", {})
    app.enqueue("limited", {})
    with psycopg.connect(worker.dsn, autocommit=True) as conn:
        leased = conn.execute("SELECT job_id FROM pgqueue.lease(NULL, 'w-role', 10)").fetchall()
        assert len(leased) == 1
        # No direct writes to the registry, settings or lease log.
        for statement in (
            "INSERT INTO pgqueue.tasks (name, queue) VALUES ('evil', 'default')",
            "UPDATE pgqueue.task_settings SET concurrency_limit = 100",
            "DELETE FROM pgqueue.task_lease_log",
            "SELECT name FROM pgqueue.task_settings FOR UPDATE",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # What it publishes is checked like a job.
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="queue"):
            conn.execute(
                "SELECT pgqueue.publish_tasks('w-role', ARRAY['t'], ARRAY['bad queue!'],"
                " ARRAY[0]::smallint[], ARRAY[5], ARRAY[60], ARRAY[NULL::float8],"
                " ARRAY[1::real], ARRAY[2::real], ARRAY[60::real], ARRAY[0.1::real])"
            )
    with psycopg.connect(db_dsn) as conn:
        logged = conn.execute("SELECT count(*) FROM pgqueue.task_lease_log").fetchone()
    assert logged == (1,)
