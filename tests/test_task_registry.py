"""Task registry (#13.1, #18.2): by-name enqueue gets the task's published
defaults; live task settings apply from the next lease; max_attempts=0 is
unlimited; jobs of a task the worker lacks wait for one that has it
(#13.7); task statistics (#18.3); lost workers (#13.5). In-process, with the
low-level consumer API; worker processes are in test_task_registry_workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.models import AttemptOutcome
from pgqueue.ops import tasks as task_ops
from pgqueue.ops.consume import Failure
from tests.apps.registry import build_app


def publish(dsn: str, worker_id: str = "w-1", *, with_mail: bool = True) -> None:
    """What a worker of tests.apps.registry does at start-up."""
    with build_app(dsn, with_mail=with_mail) as worker_app:
        worker_app._database.run(task_ops.publish(list(worker_app.tasks.values()), worker_id))


def register_worker(dsn: str, worker_id: str, tasks: list[str], age: float = 0.0) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.workers (id, host, pid, concurrency, tasks, last_heartbeat_at)"
            " VALUES (%s, 'h', 1, 1, %s, now() - make_interval(secs => %s))",
            (worker_id, tasks, age),
        )


def row(dsn: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        found = cur.execute("SELECT * FROM pgqueue.jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


# --- #13.1: by-name enqueue applies the published defaults ---------------------


def test_by_name_enqueue_from_a_producer_without_the_task_lands_in_its_queue(
    app: pgqueue.App, db_dsn: str
) -> None:
    assert "reg_mail" not in app.tasks
    before = app.enqueue("reg_mail", {"to": "a@b.c"}).job_id
    assert row(db_dsn, before)["queue"] == "default"  # nobody published it yet

    publish(db_dsn)
    job = row(db_dsn, app.enqueue("reg_mail", {"to": "a@b.c"}).job_id)
    assert (job["queue"], job["priority"], job["max_attempts"], job["lease_seconds"]) == (
        "mail",
        3,
        2,
        120,
    )
    # What the caller gives wins, even when it equals the built-in default.
    explicit = row(db_dsn, app.enqueue("reg_mail", {}, queue="default", priority=0).job_id)
    assert (explicit["queue"], explicit["priority"]) == ("default", 0)
    # enqueue_many and the SQL API read the registry too.
    many = app.enqueue_many([pgqueue.JobSpec("reg_mail", {"to": "x"})])
    assert row(db_dsn, many[0].job_id)["queue"] == "mail"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        sql_id = conn.execute("SELECT pgqueue.enqueue('reg_mail', '{\"to\": \"y\"}')").fetchone()
        sql_queue = conn.execute(
            "SELECT pgqueue.enqueue('reg_mail', '{}', queue => 'other')"
        ).fetchone()
    assert sql_id is not None
    assert sql_queue is not None
    assert row(db_dsn, sql_id[0])["queue"] == "mail"
    assert row(db_dsn, sql_queue[0])["queue"] == "other"
    # A producer that registers the task uses its own code's defaults.
    with build_app(db_dsn) as producer:
        assert row(db_dsn, producer.enqueue("reg_mail", {}).job_id)["queue"] == "mail"


def test_cli_and_schedules_enqueue_by_name_into_the_tasks_queue(
    app: pgqueue.App, db_dsn: str
) -> None:
    publish(db_dsn)
    app.add_schedule("mail-nightly", "0 3 * * *", "reg_mail", {"to": "ops"})
    fired = app.run_schedule_now("mail-nightly")
    assert row(db_dsn, fired.job_id)["queue"] == "mail"


# --- #18.2: live settings ----------------------------------------------------


def test_live_settings_apply_from_the_next_lease_and_unset_restores_code_defaults(
    app: pgqueue.App, db_dsn: str
) -> None:
    publish(db_dsn)
    first = app.enqueue("reg_fail", {"message": "x"}).job_id
    app.set_task_options("reg_fail", max_attempts=2, lease_seconds=300, timeout=12)
    info = app.get_task("reg_fail")
    assert info.settings.max_attempts == 2
    assert info.settings.timeout == 12.0
    assert info.max_attempts == 0  # declared in code: unlimited

    leased = app.lease("default", "w-test", max=1)
    assert [j.job_id for j in leased] == [first]
    assert leased[0].lease_seconds == 300
    stored = row(db_dsn, first)
    assert stored["max_attempts"] == 0  # the job keeps its own; the setting wins when it fails
    assert stored["lease_expires_at"] - stored["attempt_started_at"] == timedelta(seconds=300)
    assert app.fail(leased[0], "boom", retry_at=datetime.now(UTC)) in ("queued", "scheduled")
    again = app.lease("default", "w-test", max=1)
    assert again[0].job_id == first
    assert app.fail(again[0], "boom") == "dead"  # 2 of 2 (the code said unlimited)

    second = app.enqueue("reg_fail", {"message": "x"}).job_id
    app.set_task_options("reg_fail", unset=["max_attempts", "lease_seconds", "timeout"])
    with pytest.raises(pgqueue.TaskNotFound):
        app.get_task("nosuch")
    assert app.get_task("reg_fail").settings == pgqueue.TaskSettings()
    later = app.lease("default", "w-test", max=1)
    assert later[0].job_id == second
    assert later[0].lease_seconds == 60


def test_priority_setting_applies_to_jobs_enqueued_without_one(app: pgqueue.App) -> None:
    app.set_task_options("ranked", priority=7)
    assert app.get_job(app.enqueue("ranked", {}).job_id).priority == 7
    assert app.get_job(app.enqueue("ranked", {}, priority=1).job_id).priority == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "nothing to set"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"timeout": 0}, "timeout"),
        ({"priority": 99999}, "priority"),
        ({"retry": "fast"}, "Backoff"),
        ({"unset": ["colour"]}, "unknown task option"),
        ({"max_attempts": 3, "unset": ["max_attempts"]}, "cannot set and unset"),
    ],
)
def test_bad_task_options_are_refused_and_write_nothing(
    app: pgqueue.App, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(pgqueue.InvalidInput, match=message):
        app.set_task_options("t", **options)
    assert app.list_tasks() == []


# --- #18.5: unlimited attempts -------------------------------------------------


def test_max_attempts_zero_retries_forever(app: pgqueue.App, db_dsn: str) -> None:
    job_id = app.enqueue("forever", {}, max_attempts=0).job_id
    for _ in range(8):
        leased = app.lease("default", "w", max=1)
        assert [j.job_id for j in leased] == [job_id]
        assert app.fail(leased[0], "again", retry_at=datetime.now(UTC)) == "queued"
    job = app.get_job(job_id)
    assert job.attempts == 8
    assert job.max_attempts == 0
    assert job.status == "queued"
    leased = app.lease("default", "w", max=1)
    assert app.fail(leased[0], "stop", permanent=True) == "dead"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        forever = conn.execute("SELECT pgqueue.enqueue('t', max_attempts => 0)").fetchone()
    assert forever is not None
    assert app.get_job(forever[0]).max_attempts == 0
    with pytest.raises(pgqueue.InvalidInput, match="max_attempts"):
        app.enqueue("t", {}, max_attempts=-1)


# --- #13.7: unknown tasks wait -------------------------------------------------


def _unknown(leased: pgqueue.LeasedJob, grace: float) -> Failure:
    return Failure(
        leased.job_id,
        leased.attempt_id,
        AttemptOutcome.FAILED,
        "unknown_task",
        "no task named here",
        permanent=True,
        unknown_task_grace=grace,
    )


def test_unknown_task_is_handed_back_within_the_grace_and_dead_after(
    app: pgqueue.App, db_dsn: str
) -> None:
    from pgqueue.ops import consume

    job_id = app.enqueue("newer_task", {}).job_id
    leased = app.lease("default", "old-worker", max=1)[0]
    statuses = app._database.run(consume.fail_many(app.op_context, [_unknown(leased, 3600)]))
    assert statuses[job_id] == "scheduled"
    job = app.get_job(job_id, history=True)
    assert job.attempts == 0  # not counted
    assert [a.outcome for a in job.attempt_history] == ["released"]
    assert job.last_error is not None
    assert job.last_error.startswith("unknown_task")
    assert "newer_task" in app.explain(job_id)
    register_worker(db_dsn, "old-worker", ["other_task"])
    assert [u.task for u in app.unknown_tasks()] == ["newer_task"]

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET run_at = now(), status = 'queued'")
    leased = app.lease("default", "old-worker", max=1)[0]
    # Past the grace, while a live worker knows the task: still handed back.
    register_worker(db_dsn, "new-worker", ["newer_task"])
    statuses = app._database.run(consume.fail_many(app.op_context, [_unknown(leased, 0)]))
    assert statuses[job_id] == "scheduled"
    assert app.unknown_tasks() == []

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM pgqueue.workers WHERE id = 'new-worker'")
        conn.execute("UPDATE pgqueue.jobs SET run_at = now(), status = 'queued'")
    leased = app.lease("default", "old-worker", max=1)[0]
    statuses = app._database.run(consume.fail_many(app.op_context, [_unknown(leased, 0)]))
    assert statuses[job_id] == "dead"
    assert app.get_job(job_id).last_error.startswith("unknown_task")  # type: ignore[union-attr]


# --- #18.3: statistics -----------------------------------------------------------


def test_task_stats_count_runs_outcomes_retries_and_durations(app: pgqueue.App) -> None:
    ok = [app.enqueue("stat_ok", {}).job_id for _ in range(3)]
    for leased in app.lease("default", "w", max=3):
        app.ack(leased)
    bad = app.enqueue("stat_bad", {}, max_attempts=2).job_id
    first = app.lease("default", "w", max=1)[0]
    app.fail(first, ValueError("first"), retry_at=datetime.now(UTC))
    second = app.lease("default", "w", max=1)[0]
    assert app.fail(second, ValueError("second")) == "dead"

    stats = app.task_stats()
    assert set(stats) == {"stat_ok", "stat_bad"}
    good = stats["stat_ok"]
    assert (good.runs, good.succeeded, good.failed, good.dead, good.retries) == (3, 3, 0, 0, 0)
    assert good.duration_p50 is not None
    assert good.duration_max is not None
    assert good.wait_p95 is not None
    assert good.last_error is None
    failing = stats["stat_bad"]
    assert (failing.runs, failing.succeeded, failing.failed, failing.dead) == (2, 0, 2, 1)
    assert failing.retries == 1
    assert failing.last_error == "ValueError: second"
    assert set(app.task_stats("stat_ok")) == {"stat_ok"}
    assert app.task_stats(since=datetime.now(UTC) + timedelta(hours=1)) == {}
    # sample=: the window starts at the finish of the newest job only.
    everything = app.task_stats()
    newest = app.task_stats(sample=1)
    assert sum(s.succeeded + s.dead for s in newest.values()) == 1
    assert all(s.window_start is not None for s in newest.values())
    assert min(s.window_start for s in newest.values()) > min(  # type: ignore[type-var]
        s.window_start for s in everything.values()
    )
    since = datetime.now(UTC) - timedelta(days=1)
    assert app.task_stats(since=since, sample=1000) == app.task_stats(since=since)
    assert len(ok) == 3
    assert bad


# --- #13.5: lost workers -----------------------------------------------------------


def test_lost_worker_stops_failing_check_once_its_jobs_were_reaped(
    app: pgqueue.App, db_dsn: str, job_factory: Any
) -> None:
    register_worker(db_dsn, "gone", ["t"], age=600)
    job_id = job_factory.insert(status="running", lease_expires_at=-30.0, worker_id="gone")
    report = app.check()
    assert not {c.name: c for c in report.checks}["dead_workers"].ok

    assert app._database.run(task_ops.mark_lost(60)) == ["gone"]
    states = {w.id: w for w in app.list_workers()}
    assert states["gone"].state == "lost"
    assert states["gone"].lost_at is not None
    assert states["gone"].running == 1
    assert app.reap() == 1
    assert app.get_job(job_id).status in ("scheduled", "queued")
    report = app.check()
    assert {c.name: c for c in report.checks}["dead_workers"].ok

    register_worker(db_dsn, "alive", ["t"])
    assert not app.forget_worker("alive")
    assert app.forget_worker("gone")
    assert [w.id for w in app.list_workers()] == ["alive"]
    assert app._database.run(task_ops.prune_lost(0)) == []


def test_sql_worker_api_fail_honours_unlimited_and_live_max_attempts(
    app: pgqueue.App, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:

        def fail_once(job_id: int) -> str:
            leased = conn.execute(
                "SELECT job_id, attempt_id FROM pgqueue.lease(NULL, 'sql-w', 1)"
            ).fetchone()
            assert leased is not None
            assert leased[0] == job_id
            status = conn.execute(
                "SELECT pgqueue.fail(%s, %s, 'boom', retry_at => now())", leased
            ).fetchone()
            assert status is not None
            return str(status[0])

        forever = app.enqueue("sql_forever", {}, max_attempts=0).job_id
        assert [fail_once(forever) for _ in range(6)] == ["queued"] * 6
        conn.execute("UPDATE pgqueue.jobs SET status = 'cancelled' WHERE id = %s", (forever,))

        # An operator's live max_attempts wins over the job's: 0 (unlimited), then 4.
        capped = app.enqueue("sql_capped", {}, max_attempts=1).job_id
        conn.execute(
            "INSERT INTO pgqueue.task_settings (name, max_attempts) VALUES ('sql_capped', 0)"
        )
        assert [fail_once(capped) for _ in range(3)] == ["queued"] * 3
        conn.execute("UPDATE pgqueue.task_settings SET max_attempts = 4 WHERE name = 'sql_capped'")
        assert fail_once(capped) == "dead"
    assert app.get_job(capped).attempts == 4
