"""Operator conveniences: unknown queues, queue delete/purge,
cancelling several jobs or by filter, uninstall, replay's return value and
positional arguments in Task.enqueue."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.cli_support import assert_one_line_error, invoke
from tests.fixtures.factory import JobFactory


def invoke_json(dsn: str, *args: str) -> Any:
    """Run a command in-process with --json; assert success and parse stdout."""
    result = invoke(dsn, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- unknown queues (item 9) ---------------------------------------------------


def test_unknown_queue_is_an_error_unless_create(db_dsn: str, app: pgqueue.App) -> None:
    app.enqueue("t", queue="mail")
    assert_one_line_error(
        invoke(db_dsn, "queue", "pause", "mial"), "unknown queue 'mial'", "mail", "--create"
    )
    assert_one_line_error(invoke(db_dsn, "status", "--queue", "mial"), "unknown queue 'mial'")
    assert_one_line_error(invoke(db_dsn, "queue", "limit", "mial", "--concurrency", "2"), "mial")
    assert "mial" not in app.metrics()
    created = invoke_json(db_dsn, "queue", "pause", "reports", "--create")
    assert created["paused"] is True
    assert app.metrics()["reports"].paused


def test_queue_purge_cancels_queued_jobs(
    db_dsn: str, app: pgqueue.App, job_factory: JobFactory
) -> None:
    queued = [app.enqueue("t", {"i": i}, queue="mail").job_id for i in range(3)]
    later = app.enqueue("t", queue="mail", delay="1h").job_id
    other = app.enqueue("t", queue="other").job_id
    running = job_factory.insert(status="running", queue="mail")
    refused = invoke(db_dsn, "queue", "purge", "mail")
    assert_one_line_error(refused, "Cancel 4 queued/scheduled jobs of queue 'mail'", "--yes")
    assert app.get_job(queued[0]).status is pgqueue.JobStatus.QUEUED
    assert invoke_json(db_dsn, "queue", "purge", "mail", "--yes") == {
        "queue": "mail",
        "cancelled": 4,
    }
    for job_id in [*queued, later]:
        assert app.get_job(job_id).status is pgqueue.JobStatus.CANCELLED
    assert app.get_job(other).status is pgqueue.JobStatus.QUEUED
    assert app.get_job(running).status is pgqueue.JobStatus.RUNNING


def test_queue_delete_refused_while_jobs_exist(db_dsn: str, app: pgqueue.App) -> None:
    job = app.enqueue("t", queue="old").job_id
    app.set_queue_limit("old", concurrency=3)
    assert_one_line_error(invoke(db_dsn, "queue", "delete", "old"), "still holds 1 live or dead")
    assert "old" in app.metrics()
    app.cancel(job)
    assert invoke_json(db_dsn, "queue", "delete", "old") == {"queue": "old", "deleted": True}
    assert "old" not in app.metrics()
    assert app.get_job(job).status is pgqueue.JobStatus.CANCELLED  # jobs stay
    assert_one_line_error(invoke(db_dsn, "queue", "delete", "old"), "unknown queue 'old'")


# --- jobs cancel (items 17 and 18) -------------------------------------------------


def test_cancel_several_ids_and_if_live(
    db_dsn: str, app: pgqueue.App, job_factory: JobFactory
) -> None:
    a, b = app.enqueue("t").job_id, app.enqueue("t").job_id
    done = job_factory.insert(status="succeeded")
    refused = invoke(db_dsn, "jobs", "cancel", str(a), str(done))
    assert_one_line_error(refused, f"job {done} already finished", "nothing was cancelled")
    assert app.get_job(a).status is pgqueue.JobStatus.QUEUED
    assert_one_line_error(invoke(db_dsn, "jobs", "cancel", str(a), "999999"), "999999")
    assert invoke_json(db_dsn, "jobs", "cancel", str(a), str(b), str(done), "--if-live") == [
        {"job_id": a, "status": "cancelled"},
        {"job_id": b, "status": "cancelled"},
        {"job_id": done, "status": "succeeded"},
    ]
    again = invoke_json(db_dsn, "jobs", "cancel", str(a), "--if-live")
    assert again == {"job_id": a, "status": "cancelled"}


def test_cancel_by_filter(db_dsn: str, app: pgqueue.App) -> None:
    target = [app.enqueue("send", queue="mail").job_id for _ in range(3)]
    other_task = app.enqueue("other", queue="mail").job_id
    other_queue = app.enqueue("send", queue="bulk").job_id
    assert_one_line_error(
        invoke(db_dsn, "jobs", "cancel", "--queue", "mail", "--task", "send"), "--yes"
    )
    done = invoke_json(
        db_dsn, "jobs", "cancel", "--queue", "mail", "--task", "send", "--status", "queued", "--yes"
    )
    assert done == {"cancelled": 3}
    assert {app.get_job(j).status for j in target} == {pgqueue.JobStatus.CANCELLED}
    assert app.get_job(other_task).status is pgqueue.JobStatus.QUEUED
    assert app.get_job(other_queue).status is pgqueue.JobStatus.QUEUED
    assert_one_line_error(
        invoke(db_dsn, "jobs", "cancel", "--queue", "mail", "--status", "dead", "--yes"),
        "cannot cancel jobs with status 'dead'",
    )
    assert_one_line_error(invoke(db_dsn, "jobs", "cancel"), "give job ids")


def test_cancel_many_in_python(app: pgqueue.App) -> None:
    ids = [app.enqueue("t", queue="q").job_id for _ in range(5)]
    assert sorted(app.cancel_many(queue="q", limit=3)) == ids[:3]
    assert sorted(app.cancel_many(ids)) == ids[3:]
    assert app.cancel_many(ids) == []


# --- replay (item 17) ---------------------------------------------------------------


def test_replay_returns_the_same_fields_as_the_cli(db_dsn: str, app: pgqueue.App) -> None:
    original = app.enqueue("t").job_id
    copy = app.replay(original)
    assert (copy.job_id, copy.replayed_from) == (int(copy), original)
    assert app.get_job(copy).task == "t"  # still usable as an int id
    cli = invoke_json(db_dsn, "jobs", "replay", str(original))
    assert cli == {"job_id": cli["job_id"], "replayed_from": original}


# --- uninstall (item 18) ---------------------------------------------------------------


def test_uninstall_drops_the_schema(db_dsn: str, app: pgqueue.App) -> None:
    app.enqueue("t")
    refused = invoke(db_dsn, "uninstall", "--yes")
    assert_one_line_error(refused, "1 queued or running jobs", "--force")
    asked = invoke(db_dsn, "uninstall", "--force")
    assert_one_line_error(asked, 'Drop schema "pgqueue"', "1 jobs", "--yes")
    done = invoke(db_dsn, "uninstall", "--force", "--yes", "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["dropped"] is True
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgqueue'"
        ).fetchone() == (0,)
    assert "created schema" in invoke(db_dsn, "migrate").stdout


# --- positional arguments (item 18) ----------------------------------------------------


def test_positional_arguments_take_the_parameter_names(app: pgqueue.App) -> None:
    @app.task
    def send_receipt(order_id: int, email: str, copy: bool = False) -> None: ...

    job = send_receipt.enqueue(42, "a@b.c", copy=True)
    assert app.get_job(job.job_id).payload == {"order_id": 42, "email": "a@b.c", "copy": True}
    later = send_receipt.with_options(delay="1m").enqueue(7, email="x@y.z")
    assert app.get_job(later.job_id).payload == {"order_id": 7, "email": "x@y.z"}
    with pytest.raises(pgqueue.InvalidPayload, match="takes 3 positional arguments"):
        send_receipt.enqueue(1, 2, 3, 4)
    with pytest.raises(pgqueue.InvalidPayload, match="order_id both by position and by name"):
        send_receipt.enqueue(1, order_id=2)
