"""What the roles of one schema share, and the separation
offered where users need it — with real roles made by ``pgqueue grant``.

* ``replay`` copies any job (payload included): an admin action, refused to
  producers and workers (revision 0014's ``replay_job``).
* One schema per tenant: a producer of schema A can neither read nor
  enqueue into schema B, nor steer B's workers through B's channel.
* Dedup keys: what a far-future job holding a key blocks, and for how long.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.grants import grant, grant_statements
from pgqueue.migrate import upgrade
from tests.cli_support import assert_one_line_error, run_cli
from tests.fixtures.dbstate import snapshot
from tests.fixtures.workers import Workers, job_statuses, task_events, wait_until
from tests.test_security_grants import Role, Roles, refused, refused_sql

TENANT = "tenant_b"
TENANT_APP = "tests.apps.tenant_tasks:app"


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def job_row(dsn: str, job_id: int, schema: str = "pgqueue") -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute(
            sql.SQL(
                "SELECT id, task, queue, payload, priority, status::text, run_at, attempts,"
                " max_attempts, lease_seconds, dedup_key, serial_key, backoff_base, result,"
                " created_at, now() AS db_now FROM {}.jobs WHERE id = %s"
            ).format(sql.Identifier(schema)),
            (job_id,),
        ).fetchone()
    assert row is not None, f"no job {job_id} in {schema}.jobs"
    return dict(row)


@pytest.fixture
def made_roles(pg_server_dsn: str) -> Iterator[Roles]:
    """LOGIN roles made for the test, dropped afterwards (roles are cluster-wide)."""
    made = Roles(pg_server_dsn)
    try:
        yield made
    finally:
        made.drop_all()


@pytest.fixture
def producer(db_dsn: str, made_roles: Roles) -> Role:
    return made_roles.create(db_dsn, "pgq_producer", kind="producer")


@pytest.fixture
def worker_role(db_dsn: str, made_roles: Roles) -> Role:
    return made_roles.create(db_dsn, "pgq_worker", kind="worker")


@pytest.fixture
def admin(db_dsn: str, made_roles: Roles) -> Role:
    return made_roles.create(db_dsn, "pgq_admin", kind="admin")


# --- replay: admins only ----------------------------------------------------------------


def finished_and_archived(app: pgqueue.App) -> tuple[int, int]:
    """A dead job in the hot table and a succeeded one moved to the archive."""

    @app.task(
        queue="reports", priority=3, max_attempts=1, lease_seconds=90,
        retry=pgqueue.Backoff(base=2.0, factor=3.0, max=60.0, jitter=0.0),
    )  # fmt: skip
    def report(month: str) -> None: ...

    dead = report.with_options(serial_key="customer:7").enqueue(month="2026-11").job_id
    (leased,) = app.lease("reports", "w0")
    app.fail(leased, "boom")
    archived = app.enqueue("receipt", {"n": 42}, queue="mail", dedup_key="receipt:42").job_id
    (leased,) = app.lease("mail", "w0")
    app.ack(leased, {"sent": True})
    assert app.archive("0s") == 1
    return dead, archived


async def replay_then_close(app: pgqueue.App, job_id: int, **options: Any) -> pgqueue.Replayed:
    """``replay_async`` on a loop of its own (the App's async pool is closed with it)."""
    try:
        return await app.replay_async(job_id, **options)
    finally:
        await app.close_async()


def test_replay_is_refused_to_producers_and_workers(
    app: pgqueue.App, db_dsn: str, producer: Role, worker_role: Role
) -> None:
    dead, archived = finished_and_archived(app)
    for role in (producer, worker_role):
        with pgqueue.App(role.dsn) as other:
            for job_id in (dead, archived):
                refused(
                    lambda job_id=job_id: other.replay(job_id),  # type: ignore[misc]
                    db_dsn,
                    match="replay is an admin action",
                )
                refused(
                    lambda job_id=job_id: other.replay(  # type: ignore[misc]
                        job_id, queue="elsewhere", run_at=datetime.now(UTC)
                    ),
                    db_dsn,
                    match="replay is an admin action",
                )
            with pytest.raises(pgqueue.PermissionDenied) as caught:
                other.replay(dead)
            message = str(caught.value)
            # What was refused and what to do instead, on one line.
            assert "permission denied for function replay_job" in message
            assert f"(role {role.name})" in message
            assert "`pgqueue grant --role ROLE --admin`" in message
            assert "--producer|--worker" not in message
            assert "\n" not in message
            refused(
                lambda: asyncio.run(replay_then_close(other, archived)),
                db_dsn,
                match="replay is an admin action",
            )
            # Reading the job is still allowed: only the copy is refused.
            assert other.get_job(dead).payload == {"month": "2026-11"}
        # The SQL function itself, and the statement the client used to run.
        refused_sql(
            role,
            [
                f"SELECT * FROM pgqueue.replay_job({dead})",
                f"SELECT * FROM pgqueue.replay_job({archived}, 'mail', now())",
            ],
            db_dsn,
        )
        assert not scalar(
            db_dsn,
            "SELECT has_function_privilege(%s, 'pgqueue.replay_job(bigint, text, timestamptz)',"
            " 'EXECUTE')",
            (role.name,),
        )
        # The CLI says the same in one line, and writes nothing.
        before = snapshot(db_dsn)
        result = run_cli(role.dsn, "jobs", "replay", str(dead))
        assert_one_line_error(result, "replay is an admin action", "--admin")
        assert snapshot(db_dsn) == before


def test_no_grant_but_admin_includes_replay_job(db_dsn: str) -> None:
    for kind in ("producer", "worker"):
        text = " ".join(s.as_string() for s in grant_statements("r", kind))
        assert "replay_job" not in text
        assert '"pgqueue"."enqueue_batch"' in text  # the function replay_job calls
    admin_text = " ".join(s.as_string() for s in grant_statements("r", "admin"))
    assert 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "pgqueue"' in admin_text
    # Not for PUBLIC, and it runs as its caller: it gives an admin nothing new.
    definer, public = scalar(
        db_dsn,
        "SELECT ARRAY[p.prosecdef, EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl,"
        " acldefault('f', p.proowner))) WHERE grantee = 0)] FROM pg_proc p"
        " WHERE p.oid = 'pgqueue.replay_job(bigint, text, timestamptz)'::regprocedure",
    )
    assert (definer, public) == (False, False)


def test_admin_replays_from_the_jobs_table_and_the_archive(
    app: pgqueue.App, db_dsn: str, admin: Role
) -> None:
    dead, archived = finished_and_archived(app)
    original = job_row(db_dsn, dead)
    with pgqueue.App(admin.dsn) as adm:
        copy = adm.replay(dead)
        assert (copy.job_id, copy.replayed_from) == (int(copy), dead)
        row = job_row(db_dsn, copy)
        for field in ("task", "queue", "payload", "priority", "max_attempts", "lease_seconds",
                      "dedup_key", "serial_key", "backoff_base"):  # fmt: skip
            assert row[field] == original[field], field
        assert (row["status"], row["attempts"], row["result"]) == ("queued", 0, None)
        assert job_row(db_dsn, dead)["status"] == "dead"  # the original is left alone

        # From the archive, into another queue at another time (async twin).
        run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
        later = asyncio.run(replay_then_close(adm, archived, queue="mail-again", run_at=run_at))
        row = job_row(db_dsn, later)
        assert (row["task"], row["queue"], row["payload"], row["run_at"], row["status"]) == (
            "receipt", "mail-again", {"n": 42}, run_at, "scheduled",
        )  # fmt: skip
        assert adm.get_job(archived).status is pgqueue.JobStatus.SUCCEEDED

        # The copy's dedup key is held by a live job: that job is returned.
        assert adm.replay(archived, queue="mail-again") == later
        assert scalar(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE queue = 'mail-again'") == 1

        # Validation happens in the database too, and a missing job is not found.
        before = snapshot(db_dsn)
        with pytest.raises(pgqueue.InvalidInput, match="run_at must be a finite time"):
            adm.replay(dead, run_at=datetime(2600, 1, 1, tzinfo=UTC))
        with pytest.raises(pgqueue.JobNotFound):
            adm.replay(424_242)
        assert snapshot(db_dsn) == before

    # Any language: the admin calls the SQL function directly.
    with psycopg.connect(admin.dsn, autocommit=True) as conn:
        row2 = conn.execute(
            "SELECT job_id, created, replayed_from FROM pgqueue.replay_job(%s, 'sql')", (dead,)
        ).fetchone()
        assert conn.execute("SELECT * FROM pgqueue.replay_job(424242)").fetchall() == []
    assert row2 is not None
    assert row2[1:] == (True, dead)
    assert job_row(db_dsn, row2[0])["queue"] == "sql"


def test_a_replay_wakes_a_listening_worker_like_any_enqueue(
    app: pgqueue.App, db_dsn: str, admin: Role
) -> None:
    job_id = app.enqueue("t", queue="wake").job_id
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgqueue.pgqueue"')
        with pgqueue.App(admin.dsn) as adm:
            copy = adm.replay(job_id)
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads, "no notification"
    assert payloads[0].startswith("j:wake"), payloads
    assert copy != job_id


# --- one schema per tenant --------------------------------------------------------------


@pytest.fixture
def tenant(db_dsn: str) -> str:
    """A second pgqueue schema in the same database (``pgqueue --schema tenant_b migrate``)."""
    upgrade(db_dsn, schema=TENANT)
    return TENANT


def test_a_producer_of_one_schema_cannot_touch_another(
    app: pgqueue.App, db_dsn: str, tenant: str, producer: Role, made_roles: Roles
) -> None:
    other = made_roles.create(db_dsn, "pgq_tenant_b")
    grant(other.name, "producer", dsn=db_dsn, schema=tenant)
    with pgqueue.App(db_dsn, schema=tenant) as owner_b:
        secret = owner_b.enqueue("invoice", {"card": "4111"}, queue="billing").job_id
    ours = app.enqueue("t", {"a": 1}).job_id

    # The producer of "pgqueue" sees nothing of tenant_b, and writes nothing there.
    before = snapshot(db_dsn, tenant)
    with pgqueue.App(producer.dsn, schema=tenant) as intruder:
        for call in (
            lambda: intruder.enqueue("t", {"x": 1}, queue="billing"),
            lambda: intruder.enqueue_many([pgqueue.JobSpec("t", {})]),
            lambda: intruder.get_job(secret),
            lambda: intruder.list_jobs(),
            lambda: intruder.result(secret, timeout=0),
        ):
            with pytest.raises(pgqueue.PermissionDenied, match=f"denied for schema {tenant}"):
                call()
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        for statement in (
            f"SELECT payload FROM {tenant}.jobs",
            f"SELECT payload FROM {tenant}.jobs_archive",
            f"SELECT {tenant}.enqueue('t', queue => 'billing')",
            f'SELECT * FROM {tenant}.enqueue_batch(\'[{{"task": "t"}}]\')',
            f"SELECT {tenant}.job_status({secret})",
            f"SELECT {tenant}.watch_job({secret})",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert snapshot(db_dsn, tenant) == before
    # ... while in its own schema it works as before.
    with pgqueue.App(producer.dsn) as own:
        assert own.get_job(ours).payload == {"a": 1}

    # And the other way round.
    before = snapshot(db_dsn)
    with pgqueue.App(other.dsn) as intruder:
        with pytest.raises(pgqueue.PermissionDenied, match="permission denied for schema pgqueue"):
            intruder.get_job(ours)
        with pytest.raises(pgqueue.PermissionDenied, match="permission denied for schema pgqueue"):
            intruder.enqueue("t")
    assert snapshot(db_dsn) == before
    with pgqueue.App(other.dsn, schema=tenant) as own_b:
        assert own_b.get_job(secret).payload == {"card": "4111"}


def test_a_producer_of_one_schema_cannot_steer_anothers_workers(
    db_dsn: str, tenant: str, producer: Role, workers: Workers
) -> None:
    worker = workers.spawn(app=TENANT_APP)
    worker.schema = tenant  # where it registers
    worker.wait_registered()
    with pgqueue.App(db_dsn, schema=tenant) as owner_b:
        owner_b.task(name="until_stopped")(lambda key: None)
        job_id = owner_b.enqueue("until_stopped", {"key": "tenant-victim"}).job_id
        wait_until(
            lambda: task_events(db_dsn, "start", "tenant-victim"), 60, "the job to start", [worker]
        )
        # LISTEN and NOTIFY need no grant: the producer of "pgqueue" forges a
        # cancel and wake-ups on tenant_b's channel.
        with psycopg.connect(producer.dsn, autocommit=True) as conn:
            for payload in (f"c:{job_id}", "j:default", f"f:{job_id}:cancelled:default"):
                conn.execute(
                    sql.SQL("NOTIFY {}, {}").format(
                        sql.Identifier(f"pgqueue.{tenant}"), sql.Literal(payload)
                    )
                )
        # Hints only: the worker asked its database, which says the job runs on.
        threading.Event().wait(1.5)
        assert task_events(db_dsn, "stopped", "tenant-victim") == []
        assert job_statuses(db_dsn, [job_id], schema=tenant) == {job_id: "running"}
        assert worker.alive(), worker.describe()

        owner_b.cancel(job_id)  # the tenant's own operator still can
        wait_until(
            lambda: job_statuses(db_dsn, [job_id], schema=tenant)[job_id] == "cancelled",
            60,
            "the real cancel",
            [worker],
        )


# --- dedup keys: squatting and the window -----------------------------------------------


def test_a_far_future_job_holds_its_key_only_for_the_window(
    db_dsn: str, producer: Role, made_roles: Roles, admin: Role
) -> None:
    """A live job holds its (queue, dedup_key) for plain enqueues whatever its
    run_at; ``dedup_window`` bounds the squat (the rule: at most one job per key
    *created within the window*, finished or not): once the squatting job's
    creation is outside the window, a windowed enqueue takes the key from it.
    ``debounce`` takes the squatting job over (the victim's payload, due now)
    but keeps the squatter's task name (keys are per queue, not per task)."""
    victim = made_roles.create(db_dsn, "pgq_victim", kind="producer")
    five_years = datetime.now(UTC) + timedelta(days=5 * 365)
    with pgqueue.App(producer.dsn) as squatter:
        squat = squatter.enqueue(
            "not_a_receipt", {"forged": True}, queue="mail", run_at=five_years,
            dedup_key="receipt:42",
        ).job_id  # fmt: skip

    with pgqueue.App(victim.dsn) as real:
        # Within the window (created just now), plain and windowed enqueues
        # both return the squatting job; nothing is written.
        assert real.enqueue("receipt", {"n": 42}, queue="mail", dedup_key="receipt:42") == (
            squat,
            False,
        )
        assert real.enqueue(
            "receipt", {"n": 42}, queue="mail", dedup_key="receipt:42", dedup_window=60
        ) == (squat, False)
        assert scalar(db_dsn, "SELECT count(*) FROM pgqueue.jobs") == 1
        row = job_row(db_dsn, squat)
        assert (row["task"], row["payload"], row["run_at"], row["dedup_key"]) == (
            "not_a_receipt",
            {"forged": True},
            five_years,
            "receipt:42",
        )

        # debounce=0 takes the queued job over: the victim's payload, due now
        # (so the squat no longer delays the work) ... under the squatter's task.
        assert real.enqueue(
            "receipt", {"n": 42}, queue="mail", dedup_key="receipt:42", debounce=0
        ) == (squat, False)
        row = job_row(db_dsn, squat)
        assert row["payload"] == {"n": 42}
        assert row["run_at"] <= row["db_now"]
        assert row["task"] == "not_a_receipt"

    # A day later (the owner backdates the squat), a one-hour window no longer
    # covers it: the windowed enqueue creates the real job and the squatting
    # job, still live, gives its key up.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET created_at = now() - interval '1 day' WHERE id = %s", (squat,)
        )
    with pgqueue.App(victim.dsn) as real:
        windowed = real.enqueue(
            "receipt", {"n": 42}, queue="mail", dedup_key="receipt:42", dedup_window=3600
        )
        plain = real.enqueue("receipt", {"n": 42}, queue="mail", dedup_key="receipt:42")
    assert windowed.created
    assert windowed.job_id != squat
    assert plain == (windowed.job_id, False)  # the new live job holds the key now
    assert job_row(db_dsn, windowed.job_id)["task"] == "receipt"
    old = job_row(db_dsn, squat)
    assert (old["status"], old["dedup_key"]) == ("queued", None)


def test_the_window_bounds_how_long_an_ended_squat_blocks(
    app: pgqueue.App, db_dsn: str, producer: Role, admin: Role
) -> None:
    with pgqueue.App(producer.dsn) as squatter:
        squat = squatter.enqueue(
            "x", queue="mail", dedup_key="receipt:7",
            run_at=datetime.now(UTC) + timedelta(days=365),
        ).job_id  # fmt: skip
    with pgqueue.App(admin.dsn) as adm:
        adm.cancel(squat)
    # Created within the window: a windowed enqueue still returns it, ended or not.
    assert app.enqueue("receipt", queue="mail", dedup_key="receipt:7", dedup_window=600) == (
        squat,
        False,
    )
    # A window that no longer covers its creation: a new job.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET created_at = now() - interval '11 minutes' WHERE id = %s",
            (squat,),
        )
    fresh = app.enqueue("receipt", queue="mail", dedup_key="receipt:7", dedup_window=600)
    assert fresh.created
    assert fresh.job_id != squat
    assert job_row(db_dsn, fresh.job_id)["status"] == "queued"


def test_a_cancelled_squat_frees_the_key_for_plain_enqueues_at_once(
    app: pgqueue.App, producer: Role, admin: Role
) -> None:
    with pgqueue.App(producer.dsn) as squatter:
        squat = squatter.enqueue(
            "x", queue="mail", dedup_key="receipt:9",
            run_at=datetime.now(UTC) + timedelta(days=365),
        ).job_id  # fmt: skip
    assert app.enqueue("receipt", queue="mail", dedup_key="receipt:9") == (squat, False)
    with pgqueue.App(admin.dsn) as adm:
        adm.cancel(squat)
    fresh = app.enqueue("receipt", queue="mail", dedup_key="receipt:9")
    assert fresh.created
    assert fresh.job_id != squat


def test_the_sql_batch_path_shares_the_key_with_the_python_path(
    db_dsn: str, producer: Role
) -> None:
    """The same holds for producers in any language (enqueue_batch)."""
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        first = conn.execute(
            "SELECT job_id, created FROM pgqueue.enqueue_batch(%s)",
            (Jsonb([{"task": "x", "dedup_key": "k", "run_at": "2030-01-01T00:00:00Z"}]),),
        ).fetchone()
    assert first is not None
    assert first[1]
    with pgqueue.App(db_dsn) as app:
        assert app.enqueue("real", dedup_key="k") == (first[0], False)
