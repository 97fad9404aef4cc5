"""Attacks by a hostile producer, worker or bystander, with the
roles ``pgqueue grant`` creates (connected as them) and a role with no grant.

Each test reproduces one attack of the security review and shows that it is
refused with a clear error and writes nothing, or that it no longer stops
anyone else (the worker, the reaper, the operator's commands).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.migrate import upgrade
from tests.cli_support import assert_one_line_error, run_cli
from tests.fixtures.dbstate import snapshot
from tests.fixtures.workers import Workers, job_statuses, task_events, wait_until
from tests.test_security_grants import Role, Roles, roles  # noqa: F401 (fixture)

SECURITY_APP = "tests.apps.security_tasks:app"


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def refused_by_validation(dsn: str, statement: str, fragment: str, params: Any = None) -> str:
    """``statement`` (run as the role of ``dsn``) fails with pgqueue's
    invalid-input error naming ``fragment``, and writes nothing."""
    before = snapshot(dsn) if "user=" not in dsn else None
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue) as caught,
    ):
        conn.execute(statement, params)
    message = caught.value.diag.message_primary or ""
    assert message.startswith("pgqueue: "), message
    assert fragment in message, message
    if before is not None:
        assert snapshot(dsn) == before
    return message


@pytest.fixture
def producer(db_dsn: str, roles: Roles) -> Role:  # noqa: F811
    return roles.create(db_dsn, "pgq_producer", kind="producer")


@pytest.fixture
def worker_role(db_dsn: str, roles: Roles) -> Role:  # noqa: F811
    return roles.create(db_dsn, "pgq_worker", kind="worker")


# --- 1. times ---------------------------------------------------------------------------


@pytest.mark.parametrize("run_at", ["infinity", "-infinity", "20000-01-01", "0001-01-01"])
def test_producer_cannot_store_a_time_no_reader_can_read(
    producer: Role, db_dsn: str, run_at: str
) -> None:
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue('t', '{}', queue => 'mail', run_at => %s::timestamptz)",
        "run_at must be a finite time",
        (run_at,),
    )
    refused_by_validation(
        producer.dsn,
        "SELECT * FROM pgqueue.enqueue_batch(%s)",
        "run_at must be a finite time",
        (Jsonb([{"task": "ok"}, {"task": "t", "run_at": run_at}]),),
    )
    assert snapshot(db_dsn) == before


def test_huge_delays_are_refused_not_overflowed(producer: Role) -> None:
    message = refused_by_validation(
        producer.dsn,
        "SELECT * FROM pgqueue.enqueue_batch(%s)",
        "delay must be between 0 and",
        (Jsonb([{"task": "t", "delay": 1e300}]),),
    )
    assert "job #" not in message  # a single job: no position


def test_python_and_cli_paths_refuse_out_of_range_times(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidInput, match="run_at must be a finite time"):
        app.enqueue("t", run_at=datetime(2600, 1, 1, tzinfo=UTC))
    with pytest.raises(pgqueue.InvalidInput, match="run_at must be a finite time"):
        app.enqueue("t", run_at=datetime(1, 1, 2, tzinfo=UTC))
    assert app.list_jobs().jobs == []


def test_no_statement_can_store_an_unreadable_time(db_dsn: str) -> None:
    """Even the schema's owner, writing directly, is held to the ranges."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for statement in (
            "INSERT INTO pgqueue.jobs (status, run_at, queue, task, payload)"
            " VALUES ('queued', 'infinity', 'q', 't', '{}')",
            "INSERT INTO pgqueue.jobs (status, run_at, queue, task, payload, lease_seconds)"
            " VALUES ('queued', now(), 'q', 't', '{}', -1)",
            "INSERT INTO pgqueue.schedules (name, cron, task, next_fire_at)"
            " VALUES ('x', '* * * * *', 't', 'infinity')",
        ):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(statement)


# --- 2 and 4. every field, every path ---------------------------------------------------


def deep(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


POISONED_FIELDS = [
    ({"task": "t", "lease_seconds": -3600}, "lease_seconds must be at least 1"),
    ({"task": "t", "lease_seconds": 0}, "lease_seconds must be at least 1"),
    ({"task": "t", "backoff": [1e30, 2, 1e38, 0]}, "backoff must be"),
    ({"task": "t", "backoff": ["NaN", 2, 10, 0]}, "backoff must be"),
    ({"task": "t", "backoff": [1, 2, 10, 0, 5]}, "backoff must be"),
    ({"task": "t", "max_attempts": -1}, "max_attempts must be at least 0"),
    ({"task": "bad\x1b[31mname"}, "invalid task name"),
    ({"task": "line\nbreak"}, "invalid task name"),
    ({"task": " "}, "invalid task name"),
    ({"task": "t", "queue": ""}, "invalid queue name"),
    ({"task": "t", "queue": "q\x1b]0;pwned\x07"}, "invalid queue name"),
    ({"task": "t", "payload": [1, 2]}, "payload must be a JSON object"),
    ({"task": "t", "payload": "text"}, "payload must be a JSON object"),
    ({"task": "t", "payload": {"d": deep(300)}}, "nested deeper than 256"),
    ({"task": "t", "payload": {"big": "x" * (1 << 20)}}, "over the 1048576-byte limit"),
    ({"task": "t", "dedup_key": ""}, "dedup_key and serial_key"),
    ({"task": "t", "priority": 40000}, "priority must be between"),
]


@pytest.mark.parametrize(("job", "fragment"), POISONED_FIELDS)
def test_enqueue_batch_validates_every_field_like_enqueue(
    producer: Role, db_dsn: str, job: dict[str, Any], fragment: str
) -> None:
    before = snapshot(db_dsn)
    message = refused_by_validation(
        producer.dsn,
        "SELECT * FROM pgqueue.enqueue_batch(%s)",
        fragment,
        (Jsonb([{"task": "innocent"}, job]),),
    )
    assert "(job #2 of the batch)" in message
    assert "\x1b" not in message
    assert "\n" not in message
    assert snapshot(db_dsn) == before


def _enqueue_job_call(job: dict[str, Any]) -> tuple[str, list[Any]]:
    """The statement calling enqueue_job (0012) with ``job``'s fields as named arguments."""
    args, params = [], []
    for key, value in job.items():
        if key == "payload":
            args.append("p_payload => %s")
            params.append(Jsonb(value))
        elif key == "backoff":
            args.append("p_backoff => %s::real[]")
            params.append("{" + ",".join(str(v) for v in value) + "}")
        else:
            args.append(f"p_{key} => %s")
            params.append(value)
    return f"SELECT * FROM pgqueue.enqueue_job({', '.join(args)})", params


@pytest.mark.parametrize(("job", "fragment"), POISONED_FIELDS)
def test_enqueue_job_validates_every_field_like_enqueue(
    producer: Role, db_dsn: str, job: dict[str, Any], fragment: str
) -> None:
    """0012's single-job path (the App's enqueue) refuses what enqueue_batch refuses."""
    before = snapshot(db_dsn)
    statement, params = _enqueue_job_call(job)
    message = refused_by_validation(producer.dsn, statement, fragment, params)
    assert "of the batch" not in message
    assert "\x1b" not in message
    assert "\n" not in message
    assert snapshot(db_dsn) == before


def test_a_producer_enqueues_one_job_through_enqueue_job(producer: Role, db_dsn: str) -> None:
    """The producer holds no write privilege on jobs, yet its single enqueue
    (the App's fast path) works, with dedup as in enqueue_batch."""
    producer_app = pgqueue.App(dsn=producer.dsn)
    try:
        first = producer_app.enqueue("t", {"n": 1}, dedup_key="once", priority=3)
        again = producer_app.enqueue("t", {"n": 2}, dedup_key="once")
    finally:
        producer_app.close()
    assert first.created
    assert again == pgqueue.Enqueued(first.job_id, False)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT payload, priority, status::text FROM pgqueue.jobs WHERE id = %s",
            (first.job_id,),
        ).fetchone()
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (1,)
    assert row == ({"n": 1}, 3, "queued")


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ([1, 2], "payload must be a JSON object (job #3 of the batch)"),
        ("text", "payload must be a JSON object (job #3 of the batch)"),
        ({"d": deep(300)}, "nested deeper than 256"),
        ({"big": "x" * (1 << 20)}, "over the 1048576-byte limit (job #3 of the batch)"),
    ],
)
def test_enqueue_payloads_validates_every_payload(
    producer: Role, db_dsn: str, payload: Any, fragment: str
) -> None:
    """0012's bulk path (jobs that differ only in payload), as a producer:
    refused with the job named, nothing written."""
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue_payloads(%s, %s)",
        fragment,
        (Jsonb({"task": "t"}), Jsonb([{}, {"a": 1}, payload, {}])),
    )
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize(("job", "fragment"), [(dict(j), f) for j, f in POISONED_FIELDS[:11]])
def test_enqueue_payloads_validates_the_shared_fields(
    producer: Role, db_dsn: str, job: dict[str, Any], fragment: str
) -> None:
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn, "SELECT pgqueue.enqueue_payloads(%s, %s)", fragment,
        (Jsonb(job), Jsonb([{}, {}])),
    )  # fmt: skip
    refused_by_validation(
        producer.dsn, "SELECT pgqueue.enqueue_payloads(%s, %s)", "without payload, dedup_key",
        (Jsonb({"task": "t", "dedup_key": "k"}), Jsonb([{}, {}])),
    )  # fmt: skip
    assert snapshot(db_dsn) == before


def test_a_producer_enqueues_many_payloads(producer: Role, db_dsn: str) -> None:
    producer_app = pgqueue.App(dsn=producer.dsn)
    try:
        results = producer_app.enqueue_many([pgqueue.JobSpec("t", {"i": i}) for i in range(5)])
    finally:
        producer_app.close()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, payload FROM pgqueue.jobs ORDER BY id").fetchall()
    assert rows == [(r.job_id, {"i": i}) for i, r in enumerate(results)]


# --- the debounce path (0007) holds payloads to the same rules (0012) ---------------------


def _debounced(dsn: str, payload: Any, debounce: str = "1 minute") -> Any:
    return scalar(
        dsn,
        "SELECT pgqueue.enqueue('t', %s, dedup_key => 'dk', debounce => %s::interval)",
        (Jsonb(payload), debounce),
    )


def test_debounce_cannot_replace_a_payload_with_one_over_the_limit(
    producer: Role, db_dsn: str
) -> None:
    """A hostile producer debounced a queued job into a 3 MB payload: every
    other path refuses it, and now this one does too (SQL API and batches)."""
    job_id = _debounced(producer.dsn, {"v": 1})
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue('t', %s, dedup_key => 'dk', debounce => interval '1 minute')",
        "over the 1048576-byte limit",
        (Jsonb({"big": "x" * 3_000_000}),),
    )
    refused_by_validation(
        producer.dsn,
        "SELECT * FROM pgqueue.enqueue_windowed(%s)",
        "over the 1048576-byte limit",
        (Jsonb([{"task": "t", "dedup_key": "dk", "debounce": 60,
                 "payload": {"big": "x" * 3_000_000}}]),),
    )  # fmt: skip
    # The operator's limit holds for the debounce path too.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.limits SET max_payload_bytes = 100")
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue('t', %s, dedup_key => 'dk', debounce => interval '1 minute')",
        "over the 100-byte limit",
        (Jsonb({"big": "x" * 200}),),
    )
    assert snapshot(db_dsn) == before
    assert scalar(db_dsn, "SELECT payload FROM pgqueue.jobs WHERE id = %s", (job_id,)) == {"v": 1}
    # Within the limit the debounce still replaces the payload (same job).
    assert _debounced(producer.dsn, {"v": 2}) == job_id
    assert scalar(db_dsn, "SELECT payload FROM pgqueue.jobs WHERE id = %s", (job_id,)) == {"v": 2}
    assert scalar(db_dsn, "SELECT count(*) FROM pgqueue.jobs") == 1


def test_debounce_cannot_move_a_job_out_of_the_time_range(producer: Role, db_dsn: str) -> None:
    job_id = _debounced(producer.dsn, {"v": 1})
    before = snapshot(db_dsn)
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue('t', '{}', dedup_key => 'dk', debounce => interval '1000 years')",
        "debounce must be at most",
    )
    assert snapshot(db_dsn) == before
    run_at = scalar(db_dsn, "SELECT run_at FROM pgqueue.jobs WHERE id = %s", (job_id,))
    assert run_at < datetime.now(UTC) + timedelta(minutes=2)


def test_a_nesting_depth_of_5000_is_refused(producer: Role) -> None:
    payload = '{"a":' * 4999 + "{}" + "}" * 4999
    refused_by_validation(
        producer.dsn,
        "SELECT * FROM pgqueue.enqueue_batch("
        '(\'[{"task": "t", "payload": \' || %s || \'}]\')::jsonb)',
        "nested deeper than 256",
        (payload,),
    )


def test_sql_enqueue_enforces_the_payload_limit(producer: Role, db_dsn: str) -> None:
    """#13 item 6: one limit, in the database, for every path (3 MB refused)."""
    refused_by_validation(
        producer.dsn,
        "SELECT pgqueue.enqueue('t', %s)",
        "over the 1048576-byte limit",
        (Jsonb({"big": "x" * 3_000_000}),),
    )
    # The limit is the database's: an operator changes it in one place.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.limits SET max_payload_bytes = 100")
    refused_by_validation(
        producer.dsn, "SELECT pgqueue.enqueue('t', %s)", "over the 100-byte limit",
        (Jsonb({"big": "x" * 200}),),
    )  # fmt: skip
    assert scalar(producer.dsn, "SELECT pgqueue.enqueue('t', %s)", (Jsonb({"small": 1}),)) > 0


def test_zero_max_attempts_is_accepted(producer: Role) -> None:
    job_id = scalar(producer.dsn, "SELECT pgqueue.enqueue('t', max_attempts => 0)")
    assert (
        scalar(producer.dsn, "SELECT max_attempts FROM pgqueue.jobs WHERE id = %s", (job_id,)) == 0
    )


def test_a_bad_value_in_a_completion_batch_does_not_fail_the_batch(
    app: pgqueue.App, db_dsn: str
) -> None:
    """fail_jobs bounds retry times and delays: an absurd one lands in range and
    the innocent job of the same batch is recorded too."""
    for _ in range(3):
        app.enqueue("t", max_attempts=5)
    a, b, c = app.lease("default", "w", max=3)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT job_id, status FROM pgqueue.fail_jobs(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                [a.job_id, b.job_id, c.job_id], [a.attempt_id, b.attempt_id, c.attempt_id],
                ["failed", "nonsense", "failed"],
                [datetime(9999, 1, 1, tzinfo=UTC), None, None], [None, 1e300, float("nan")],
                [False, False, False], ["E", None, "E"], ["m", "m", "m"], [None, None, None],
            ),
        ).fetchall()  # fmt: skip
        run_at = dict(conn.execute("SELECT id, run_at FROM pgqueue.jobs").fetchall())
    assert sorted(r[0] for r in rows) == sorted([a.job_id, b.job_id, c.job_id])
    assert all(s == "scheduled" for _, s in rows)
    assert max(run_at.values()) < datetime(2500, 1, 1, tzinfo=UTC)
    app.reap()
    assert len(app.list_jobs().jobs) == 3


def test_the_reaper_survives_the_largest_backoff_and_lease(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT * FROM pgqueue.enqueue_batch(%s)",
            (Jsonb([{"task": "t", "lease_seconds": 1, "max_attempts": 0,
                     "backoff": [31536000, 1000, 31536000, 1]}]),),
        )  # fmt: skip
    (leased,) = app.lease("default", "w")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 s'")
    assert app.reap() == 1
    got = app.get_job(leased.job_id)
    assert got.status == "scheduled"


# --- 3. forged notifications ------------------------------------------------------------


def test_a_forged_cancel_notification_does_not_stop_a_running_job(
    db_dsn: str,
    workers: Workers,
    roles: Roles,  # noqa: F811
) -> None:
    nobody = roles.create(db_dsn, "pgq_nobody")  # no grant at all
    worker = workers.spawn(app=SECURITY_APP)
    worker.wait_registered()
    with pgqueue.App(db_dsn) as app:
        app.task(name="until_stopped")(lambda key: None)
        job_id = app.enqueue("until_stopped", {"key": "victim"}).job_id
        wait_until(lambda: task_events(db_dsn, "start", "victim"), 60, "the job to start", [worker])

        with psycopg.connect(nobody.dsn, autocommit=True) as conn:
            for _ in range(3):
                conn.execute(
                    sql.SQL("NOTIFY {}, {}").format(
                        sql.Identifier("pgqueue.pgqueue"), sql.Literal(f"c:{job_id}")
                    )
                )
        # The worker asked the database, which says no: the task keeps running.
        # (Before the fix it stopped within milliseconds.)
        threading.Event().wait(1.5)
        assert task_events(db_dsn, "stopped", "victim") == []
        job = app.get_job(job_id)
        assert job.status == "running"

        # A real cancel (by a role allowed to) still stops it at once.
        app.cancel(job_id)
        wait_until(lambda: task_events(db_dsn, "stopped", "victim"), 60, "the cancel", [worker])
        wait_until(
            lambda: job_statuses(db_dsn, [job_id])[job_id] == "cancelled", 60, "cancelled", [worker]
        )
    assert scalar(db_dsn, "SELECT cancel_requested FROM pgqueue.jobs WHERE id = %s", (job_id,))


# --- 5 and 6. no direct writes ----------------------------------------------------------


def test_a_producer_cannot_lock_or_flag_job_rows(app: pgqueue.App, producer: Role) -> None:
    job_id = app.enqueue("t").job_id
    with psycopg.connect(producer.dsn) as conn:
        for statement in (
            "SELECT id FROM pgqueue.jobs FOR UPDATE",
            "SELECT id FROM pgqueue.jobs FOR NO KEY UPDATE",
            "SELECT id FROM pgqueue.jobs FOR SHARE",
            "SELECT id FROM pgqueue.jobs FOR KEY SHARE",
            "UPDATE pgqueue.jobs SET notify_finish = true",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()
    # A lease is never held up by a producer.
    assert [j.job_id for j in app.lease("default", "w")] == [job_id]


def test_a_worker_cannot_forge_outcomes_cancel_requeue_or_rewrite_schedules(
    app: pgqueue.App, worker_role: Role, db_dsn: str
) -> None:
    app.add_schedule("nightly", "0 3 * * *", "report")
    dead = app.enqueue("t", max_attempts=1, queue="d").job_id
    (leased_dead,) = app.lease("d", "w")
    app.fail(leased_dead, "boom")
    other = app.enqueue("t").job_id
    before = snapshot(db_dsn)
    with psycopg.connect(worker_role.dsn) as conn:
        for statement in (
            f"UPDATE pgqueue.jobs SET status = 'queued', max_attempts = 9 WHERE id = {dead}",
            f"UPDATE pgqueue.jobs SET cancel_requested = true WHERE id = {other}",
            f"UPDATE pgqueue.jobs SET status = 'succeeded', result = '1' WHERE id = {other}",
            "UPDATE pgqueue.schedules"
            " SET task = 'evil', payload = '{\"x\": 1}', cron = '* * * * *'",
            "INSERT INTO pgqueue.schedules (name, cron, task, next_fire_at)"
            " VALUES ('x', '* * * * *', 't', 'infinity')",
            "INSERT INTO pgqueue.job_attempts (id, job_id, attempt, outcome, started_at,"
            " finished_at) VALUES (1, 1, 1, 'failed', now(), now())",
            "DELETE FROM pgqueue.queue_lease_log",
            "UPDATE pgqueue.queues SET paused = true",
            "SELECT id FROM pgqueue.jobs FOR UPDATE SKIP LOCKED",
            "SELECT nextval('pgqueue.attempt_id_seq')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()
        # Re-registering "nightly" as if it were periodic leaves the operator's schedule alone.
        rows = conn.execute(
            "SELECT * FROM pgqueue.register_periodic('nightly', '* * * * *', 'UTC', 'evil',"
            " NULL, '{}', NULL, NULL, true, now() + interval '1 minute')"
        ).fetchall()
        conn.commit()
    assert rows == []
    assert snapshot(db_dsn) == before
    assert app.get_schedule("nightly").task == "report"


def test_a_worker_may_only_complete_the_attempts_it_holds(
    app: pgqueue.App, worker_role: Role
) -> None:
    app.enqueue("t")
    with psycopg.connect(worker_role.dsn, autocommit=True) as conn:
        job_id, attempt_id = conn.execute(
            "SELECT job_id, attempt_id FROM pgqueue.lease(NULL, 'w1', 1)"
        ).fetchone() or (0, 0)
        assert job_id
        # A stale or guessed attempt id changes nothing.
        assert conn.execute("SELECT pgqueue.ack(%s, %s)", (job_id, attempt_id + 1)).fetchone() == (
            False,
        )
        assert conn.execute(
            "SELECT pgqueue.fail(%s, %s, 'x')", (job_id, attempt_id - 1)
        ).fetchone() == (None,)
        assert conn.execute("SELECT pgqueue.nack(%s, 0)", (job_id,)).fetchone() == (False,)
        assert conn.execute("SELECT pgqueue.extend(%s, 0, 60)", (job_id,)).fetchone() == (False,)
        # The test clock is the owner's: a worker claiming next year reaps nothing.
        assert conn.execute(
            "SELECT count(*) FROM pgqueue.reap_jobs(100, now() + interval '1 year')"
        ).fetchone() == (0,)
        assert conn.execute("SELECT status FROM pgqueue.job_status(%s)", (job_id,)).fetchone() == (
            "running",
        )
        assert conn.execute(
            "SELECT pgqueue.ack(%s, %s, '{\"ok\": true}')", (job_id, attempt_id)
        ).fetchone() == (True,)  # fmt: skip
    assert app.result(job_id, timeout=5) == {"ok": True}


def test_the_sql_worker_api_has_the_python_workers_outcomes_and_history(
    app: pgqueue.App, worker_role: Role
) -> None:
    ids = [app.enqueue("t", {"n": n}, max_attempts=2, queue="sql").job_id for n in range(5)]
    with psycopg.connect(worker_role.dsn, autocommit=True) as conn:
        leased = conn.execute(
            "SELECT job_id, attempt_id, attempt, task, queue, payload"
            " FROM pgqueue.lease(ARRAY['sql'], 'node-1', 5)"
        ).fetchall()
        assert [row[0] for row in leased] == ids
        assert leased[0][2:] == (1, "t", "sql", {"n": 0})
        (j0, a0), (j1, a1), (j2, a2), (j3, a3), (j4, a4) = [(r[0], r[1]) for r in leased]
        assert conn.execute("SELECT pgqueue.ack(%s, %s, '[1, 2]')", (j0, a0)).fetchone() == (True,)
        assert conn.execute("SELECT * FROM pgqueue.ack_many(%s, %s)", ([j1], [a1])).fetchall() == [
            (j1,)
        ]
        assert conn.execute("SELECT pgqueue.fail(%s, %s, 'boom')", (j2, a2)).fetchone() == (
            "scheduled",
        )
        assert conn.execute(
            "SELECT pgqueue.fail(%s, %s, 'never', permanent => true)", (j3, a3)
        ).fetchone() == ("dead",)
        assert conn.execute("SELECT pgqueue.extend(%s, %s, 120)", (j4, a4)).fetchone() == (True,)
        assert conn.execute("SELECT pgqueue.nack(%s, %s)", (j4, a4)).fetchone() == (True,)
        statuses = {
            job_id: conn.execute(
                "SELECT status, attempts, result FROM pgqueue.job_status(%s)", (job_id,)
            ).fetchone()
            for job_id in ids
        }  # fmt: skip
    assert statuses[j0] == ("succeeded", 1, [1, 2])
    assert statuses[j1] == ("succeeded", 1, None)
    assert statuses[j2][:2] == ("scheduled", 1)
    assert statuses[j3][:2] == ("dead", 1)
    assert statuses[j4][:2] == ("queued", 0)  # released: the attempt does not count
    assert [a.outcome for a in app.get_job(j2, history=True).attempt_history] == ["failed"]
    assert [a.outcome for a in app.get_job(j4, history=True).attempt_history] == ["released"]
    assert app.get_job(j3).last_error == "error: never"
    with psycopg.connect(worker_role.dsn, autocommit=True) as conn:
        for statement, fragment in (
            ("SELECT * FROM pgqueue.lease(NULL, '', 1)", "worker_id"),
            ("SELECT * FROM pgqueue.lease(NULL, 'w', 0)", "max must be"),
            ("SELECT * FROM pgqueue.ack_many(ARRAY[1, 2], ARRAY[1])", "same length"),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=fragment):
                conn.execute(statement)


def test_producers_cannot_use_the_worker_api(producer: Role) -> None:
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        for statement in (
            "SELECT * FROM pgqueue.lease(NULL, 'w', 1)",
            "SELECT pgqueue.ack(1, 1)",
            "SELECT * FROM pgqueue.reap_jobs(10)",
            "SELECT * FROM pgqueue.lease_jobs(NULL, 'w', 1)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


# --- 7. cost and quotas -----------------------------------------------------------------


def ready_index_scans(conn: psycopg.Connection[Any]) -> int:
    """Scans of the ready index in the current transaction."""
    return int(
        scalar_conn(conn, "SELECT pg_stat_get_xact_numscans('pgqueue.jobs_ready_idx'::regclass)")
    )


def scalar_conn(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_the_lease_does_not_visit_idle_queues(app: pgqueue.App, db_dsn: str) -> None:
    job_id = app.enqueue("t", queue="busy").job_id
    with psycopg.connect(db_dsn) as conn:
        # 3000 queue names a producer made (their jobs finished since).
        conn.execute(
            "INSERT INTO pgqueue.queues (name) SELECT 'idle' || g FROM generate_series(1, 3000) g"
        )
        conn.commit()
        start = ready_index_scans(conn)
        rows = conn.execute("SELECT job_id FROM pgqueue.lease_jobs(NULL, 'w', 10)").fetchall()
        scans = ready_index_scans(conn) - start
        conn.commit()
    assert rows == [(job_id,)]
    # One probe per queue holding ready jobs (and one for the end), not one per queue.
    assert scans < 10, scans


def test_optional_quotas_refuse_with_a_clear_error(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("t", queue="a")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.limits SET max_queues = 2, max_queued_per_queue = 3")
    app.enqueue("t", queue="b")
    with pytest.raises(pgqueue.InvalidInput, match="quota exceeded: at most 2 queues"):
        app.enqueue("t", queue="c")
    for _ in range(2):
        app.enqueue("t", queue="a")
    with pytest.raises(pgqueue.InvalidInput, match="queue 'a' holds more than 3 queued jobs"):
        app.enqueue("t", queue="a")
    assert {q for q in app.metrics()} == {"a", "b"}


# --- 10. grants survive migrations ------------------------------------------------------


def test_migrate_reapplies_recorded_grants(db_dsn: str, worker_role: Role) -> None:
    # A later revision that re-creates a function drops its grants.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "REVOKE EXECUTE ON FUNCTION pgqueue.lease(text[], text, integer) FROM {}"
            ).format(sql.Identifier(worker_role.name))
        )
    with (
        psycopg.connect(worker_role.dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM pgqueue.lease(NULL, 'w', 1)")
    upgrade(db_dsn)  # nothing to apply, but the recorded grants are applied again
    with psycopg.connect(worker_role.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM pgqueue.lease(NULL, 'w', 1)").fetchall() == []


# --- 11, 12. locks ----------------------------------------------------------------------


@pytest.fixture
def holder(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_dsn) as conn:
        yield conn
        conn.rollback()


def test_a_lease_skips_a_locked_ready_job_without_waiting(
    app: pgqueue.App, db_dsn: str, holder: psycopg.Connection[Any]
) -> None:
    first = app.enqueue("t", priority=10).job_id
    second = app.enqueue("t").job_id
    holder.execute("SELECT id FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (first,))
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SET lock_timeout = '200ms'")
        rows = conn.execute("SELECT job_id FROM pgqueue.lease_jobs(NULL, 'w', 1)").fetchall()
        conn.commit()
    assert rows == [(second,)]
    holder.rollback()
    assert [j.job_id for j in app.lease("default", "w")] == [first]


def test_the_reaper_skips_a_job_an_ack_is_writing(
    app: pgqueue.App, db_dsn: str, holder: psycopg.Connection[Any]
) -> None:
    app.enqueue("t")
    (leased,) = app.lease("default", "w")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 minute'")
    # The worker's ack, in flight: its row lock is held until it commits.
    holder.execute(
        "SELECT * FROM pgqueue.ack_jobs(%s, %s, %s)",
        ([leased.job_id], [leased.attempt_id], [Jsonb("done")]),
    )
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SET lock_timeout = '200ms'")
        assert conn.execute("SELECT * FROM pgqueue.reap_jobs(100)").fetchall() == []
        conn.commit()
    holder.commit()
    assert app.reap() == 0
    job = app.get_job(leased.job_id, history=True)
    assert (job.status, job.result, job.attempts) == ("succeeded", "done", 1)
    assert job.attempt_history == [] or all(
        a.outcome != "lease_expired" for a in job.attempt_history
    )


def test_the_reaper_races_ack_fail_and_extend(app: pgqueue.App, db_dsn: str) -> None:
    """Completions and the reaper on expired leases at once, from threads:
    every job ends in exactly one state, with one attempt record per outcome."""
    for n in range(60):
        app.enqueue("t", {"n": n}, max_attempts=1)
    leased = app.lease("default", "w", max=60)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 s'")
    acked: list[int] = []

    def complete() -> None:
        for i, job in enumerate(leased):
            try:
                if i % 3 == 0:
                    app.ack(job, "ok")
                elif i % 3 == 1:
                    app.fail(job, "boom")
                else:
                    app.extend(job, 60)
            except pgqueue.LeaseLost:
                continue  # the reaper was first
            acked.append(job.job_id)

    def reap() -> None:
        for _ in range(20):
            app.reap()

    threads = [threading.Thread(target=complete), threading.Thread(target=reap)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    app.reap()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT j.id, j.status, j.lease_expires_at > now(), count(a.id)"
            " FROM pgqueue.jobs j LEFT JOIN pgqueue.job_attempts a ON a.job_id = j.id"
            " GROUP BY j.id, j.status, j.lease_expires_at ORDER BY j.id"
        ).fetchall()
    assert len(rows) == 60
    for i, (_, status, extended, attempts) in enumerate(rows):
        if status == "running":  # the extension won: its lease is in the future
            assert i % 3 == 2
            assert extended
            assert attempts == 0
        elif status == "succeeded":
            assert i % 3 == 0
            assert attempts == 0
        else:  # dead, by the completer or the reaper: exactly one attempt record
            assert (status, attempts) == ("dead", 1), i


# --- 13. context.extend -----------------------------------------------------------------


def test_a_task_extends_its_own_lease_past_the_original_expiry(
    db_dsn: str, workers: Workers
) -> None:
    worker = workers.spawn(app=SECURITY_APP)
    worker.wait_registered()
    with pgqueue.App(db_dsn) as app:
        app.task(name="extend_then_sleep", lease_seconds=2)(lambda key, extend_to, seconds: None)
        job_id = app.enqueue(
            "extend_then_sleep", {"key": "ext", "extend_to": 120, "seconds": 4}
        ).job_id
        wait_until(lambda: task_events(db_dsn, "extended", "ext"), 60, "the extension", [worker])

        def far_lease() -> bool:
            left = scalar(
                db_dsn,
                "SELECT extract(epoch FROM lease_expires_at - now())"
                " FROM pgqueue.jobs WHERE id = %s",
                (job_id,),
            )
            return left is not None and left > 60  # the heartbeat alone gives at most 2 s

        wait_until(far_lease, 30, "the task's extension to reach the database", [worker])
        assert app.reap() == 0
        wait_until(
            lambda: job_statuses(db_dsn, [job_id])[job_id] == "succeeded", 60, "success", [worker]
        )
        job = app.get_job(job_id, history=True)
    assert job.attempts == 1
    assert [a.outcome for a in job.attempt_history] == ["succeeded"]
    assert json.loads(json.dumps(job.result)) == 1
    assert datetime.now(UTC) - job.finished_at < timedelta(minutes=5)  # type: ignore[operator]


# --- 4. terminal output, 8. DSNs ----------------------------------------------------------


def test_cli_output_escapes_control_characters_whatever_is_stored(
    app: pgqueue.App, db_dsn: str
) -> None:
    job_id = app.enqueue("t", queue="esc").job_id
    (leased,) = app.lease("esc", "w")
    app.fail(leased, "boom \x1b]0;owned\x07 \x1b[2J done", permanent=True)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # As stored before revision 0005 (or by an admin writing directly).
        conn.execute("UPDATE pgqueue.jobs SET task = 'evil\x1b[31m\nname' WHERE id = %s", (job_id,))
    for args in (("jobs", "list"), ("jobs", "show", str(job_id)), ("status",), ("dlq", "list")):
        done = run_cli(db_dsn, *args)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout, args
        assert "\x07" not in done.stdout, args
    assert "\\x1b" in run_cli(db_dsn, "jobs", "list").stdout


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("check", "--json"),
        ("enqueue", "t"),
        ("grant", "--role", "x", "--producer"),
        ("migrate",),
        ("jobs", "list"),
    ],
)
def test_a_malformed_dsn_is_never_echoed(args: tuple[str, ...]) -> None:
    done = run_cli("postgresql://u:S3cret%zz@127.0.0.1:1/db", *args)
    assert done.returncode != 0
    assert "S3cret" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    if args != ("check", "--json"):
        assert_one_line_error(done, "invalid DSN")


def test_migrate_without_a_server_is_one_line() -> None:
    done = run_cli("postgresql://u:S3cret@127.0.0.1:1/db", "migrate")
    assert_one_line_error(done, "127.0.0.1:1/db")
    assert "S3cret" not in done.stderr
