"""Every operator command through the installed ``pgqueue`` console script,
its ``--json`` output compared with what the database holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pgqueue
from tests.cli_support import rows, run_cli, run_json, value
from tests.fixtures.factory import JobFactory

pytestmark = pytest.mark.timeout(180)


# --- global options ----------------------------------------------------------


def test_version_and_help() -> None:
    version = run_cli(None, "--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"pgqueue {pgqueue.__version__}"

    helped = run_cli(None, "--help")
    assert helped.returncode == 0
    for command in ("enqueue", "status", "jobs", "dlq", "queue", "reap", "archive", "prune"):
        assert command in helped.stdout
    assert run_cli(None, "worker", "--help").returncode == 0


def test_migrate_then_check_on_an_empty_database(empty_db_dsn: str) -> None:
    before = run_cli(empty_db_dsn, "check", "--json")
    assert before.returncode == 1
    report = json.loads(before.stdout)
    assert report["ok"] is False
    assert report["schema_revision"] is None
    schema = next(c for c in report["checks"] if c["name"] == "schema")
    assert "pgqueue migrate" in schema["message"]

    migrated = run_cli(empty_db_dsn, "migrate")
    assert migrated.returncode == 0, migrated.stderr

    after = run_json(empty_db_dsn, "check")
    assert after["ok"] is True
    assert after["schema_revision"] == after["expected_revision"]


@pytest.mark.skipif(
    not os.environ.get("PGQUEUE_WHEEL_BIN"), reason="CI sets PGQUEUE_WHEEL_BIN to a wheel install"
)
def test_the_wheel_ships_every_query_the_cli_runs(db_dsn: str) -> None:
    # Run from a wheel installed outside the checkout: the health and
    # maintenance SQL files must be inside the wheel.
    executable = os.environ["PGQUEUE_WHEEL_BIN"]
    for args in (("check", "--json"), ("maintenance", "--json"), ("status", "--json")):
        done = run_cli(db_dsn, *args, executable=executable)
        assert done.returncode == 0, done.stderr


# --- enqueue -------------------------------------------------------------------


def test_enqueue_one_job_with_every_option(db_dsn: str) -> None:
    out = run_json(
        db_dsn,
        "enqueue",
        "send_email",
        "--payload",
        '{"to": "a@b.c", "n": 1}',
        "--queue",
        "mail",
        "--priority",
        "7",
        "--run-at",
        "2099-01-01T00:00:00+00:00",
        "--dedup-key",
        "mail:1",
        "--serial-key",
        "user:7",
        "--max-attempts",
        "3",
    )
    assert out == {"job_id": out["job_id"], "created": True}
    stored = rows(
        db_dsn,
        "SELECT task, payload, queue, priority, run_at, dedup_key, serial_key, max_attempts,"
        " status::text FROM pgqueue.jobs WHERE id = %s",
        (out["job_id"],),
    )
    assert len(stored) == 1
    task, payload, queue, priority, run_at, dedup, serial, max_attempts, status = stored[0]
    assert (task, payload, queue, priority) == ("send_email", {"to": "a@b.c", "n": 1}, "mail", 7)
    assert run_at.isoformat() == "2099-01-01T00:00:00+00:00"
    assert (dedup, serial, max_attempts, status) == ("mail:1", "user:7", 3, "scheduled")

    again = run_json(db_dsn, "enqueue", "send_email", "--queue", "mail", "--dedup-key", "mail:1")
    assert again == {"job_id": out["job_id"], "created": False}


def test_enqueue_payload_file_and_delay(db_dsn: str, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"report": "monthly"}', encoding="utf-8")
    out = run_json(db_dsn, "enqueue", "report", "--payload-file", str(payload), "--delay", "PT1H")
    payload_db, delay_seconds = rows(
        db_dsn,
        "SELECT payload, extract(epoch FROM run_at - created_at) FROM pgqueue.jobs WHERE id = %s",
        (out["job_id"],),
    )[0]
    assert payload_db == {"report": "monthly"}
    assert 3500 < float(delay_seconds) < 3700


def test_enqueue_batch_from_stdin(db_dsn: str) -> None:
    lines = "\n".join(json.dumps({"user": i}) for i in range(25)) + "\n\n"
    out = run_json(
        db_dsn,
        "enqueue",
        "welcome",
        "--batch",
        "--batch-size",
        "7",
        "--queue",
        "bulk",
        input=lines,
    )
    assert [r["created"] for r in out] == [True] * 25
    stored = rows(
        db_dsn, "SELECT id, payload FROM pgqueue.jobs WHERE queue = 'bulk' AND task = 'welcome'"
    )
    assert sorted(r[0] for r in stored) == sorted(r["job_id"] for r in out)
    by_id = dict(stored)
    assert [by_id[r["job_id"]]["user"] for r in out] == list(range(25))  # input order

    human = run_cli(db_dsn, "enqueue", "welcome", "--batch", input='{"user": 99}\n')
    assert human.returncode == 0
    assert human.stdout.strip() == "enqueued 1 job"


# --- status ------------------------------------------------------------------------


def test_status_json_matches_the_database(db_dsn: str, job_factory: JobFactory) -> None:
    job_factory.insert(queue="mail", status="queued", run_at=-120.0)
    job_factory.insert(queue="mail", status="queued")
    job_factory.insert(queue="mail", status="scheduled", run_at=3600.0)
    job_factory.insert(queue="mail", status="running")
    job_factory.insert(queue="mail", status="dead")
    job_factory.insert(queue="mail", status="succeeded", finished_at=-60.0)
    job_factory.insert(queue="mail", status="succeeded", finished_at=-7200.0)
    job_factory.insert(queue="other", status="cancelled")
    job_factory.ensure_queue("idle")
    run_cli(db_dsn, "queue", "limit", "mail", "--concurrency", "4", "--rate", "100/1m")

    status = run_json(db_dsn, "status")
    assert [m["queue"] for m in status] == ["idle", "mail", "other"]
    mail = status[1]
    assert {k: mail[k] for k in ("queued", "scheduled", "running", "dead", "succeeded")} == {
        "queued": 2,
        "scheduled": 1,
        "running": 1,
        "dead": 1,
        "succeeded": 1,  # the one of two hours ago is not in the last hour
    }
    assert mail["oldest_ready_age_seconds"] >= 120
    assert (mail["paused"], mail["concurrency_limit"], mail["rate_limit"]) == (False, 4, "100/1m")
    assert status[2]["cancelled"] == 1
    assert status[0]["oldest_ready_age_seconds"] is None
    assert set(mail) == {
        "queue",
        "queued",
        "scheduled",
        "running",
        "succeeded",
        "dead",
        "cancelled",
        "oldest_ready_age_seconds",
        "paused",
        "concurrency_limit",
        "rate_limit",
    }

    one = run_json(db_dsn, "status", "--queue", "other")
    assert [m["queue"] for m in one] == ["other"]

    table = run_cli(db_dsn, "status")
    assert table.returncode == 0
    assert "mail" in table.stdout
    assert "100/1m" in table.stdout


def test_status_watch_prints_one_json_line_per_refresh(
    db_dsn: str, job_factory: JobFactory
) -> None:
    job_factory.insert(queue="mail")
    done = run_cli(db_dsn, "status", "--watch", "--json", "--count", "3", "--interval", "0.05s")
    assert done.returncode == 0, done.stderr
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(frames) == 3
    assert all(frame[0]["queue"] == "mail" and frame[0]["queued"] == 1 for frame in frames)

    table = run_cli(db_dsn, "status", "--watch", "--count", "2", "--interval", "0.05s")
    assert table.returncode == 0, table.stderr
    assert "mail" in table.stdout


# --- jobs ----------------------------------------------------------------------------


def test_jobs_list_pages_and_filters(db_dsn: str, job_factory: JobFactory) -> None:
    ids = [job_factory.insert(queue="q1", task="t1") for _ in range(5)]
    job_factory.insert(queue="q2", task="t2", status="dead")

    first = run_json(db_dsn, "jobs", "list", "--queue", "q1", "--limit", "2")
    assert [j["id"] for j in first["jobs"]] == ids[::-1][:2]
    assert first["next_cursor"]
    second = run_json(
        db_dsn, "jobs", "list", "--queue", "q1", "--limit", "2", "--cursor", first["next_cursor"]
    )
    third = run_json(
        db_dsn, "jobs", "list", "--queue", "q1", "--limit", "2", "--cursor", second["next_cursor"]
    )
    assert [j["id"] for j in second["jobs"] + third["jobs"]] == ids[::-1][2:]
    assert third["next_cursor"] is None

    dead = run_json(db_dsn, "jobs", "list", "--status", "dead")
    assert [(j["queue"], j["task"], j["status"]) for j in dead["jobs"]] == [("q2", "t2", "dead")]

    table = run_cli(db_dsn, "jobs", "list", "--task", "t1", "--limit", "2")
    assert table.returncode == 0
    assert str(ids[-1]) in table.stdout
    assert "--cursor" in table.stderr  # where the next page is


def test_jobs_show_returns_the_job_with_every_attempt(db_dsn: str, job_factory: JobFactory) -> None:
    job_id = job_factory.insert(
        task="flaky", status="dead", attempts=2, max_attempts=2, last_error="ValueError: no"
    )
    job_factory.insert_attempt(
        job_id, attempt=1, error_code="ValueError", error_message="first", traceback="Traceback 1"
    )
    job_factory.insert_attempt(
        job_id, attempt=2, error_code="ValueError", error_message="no", traceback="Traceback 2"
    )

    job = run_json(db_dsn, "jobs", "show", str(job_id))
    assert job["id"] == job_id
    assert (job["task"], job["status"], job["attempts"]) == ("flaky", "dead", 2)
    assert [a["error_message"] for a in job["attempt_history"]] == ["first", "no"]
    assert [a["attempt"] for a in job["attempt_history"]] == [1, 2]
    assert set(job) == {
        "id",
        "queue",
        "task",
        "payload",
        "priority",
        "status",
        "run_at",
        "attempts",
        "max_attempts",
        "dedup_key",
        "serial_key",
        "created_at",
        "finished_at",
        "last_error",
        "result",
        "attempt_history",
    }

    human = run_cli(db_dsn, "jobs", "show", str(job_id), "--tracebacks")
    assert human.returncode == 0
    assert "Traceback 2" in human.stdout
    assert "why:" in human.stdout
    assert "dlq requeue" in human.stdout


def test_jobs_cancel_replay_and_explain(db_dsn: str, job_factory: JobFactory) -> None:
    queued = job_factory.insert(task="t", queue="q")
    running = job_factory.insert(task="t", queue="q", status="running")

    assert run_json(db_dsn, "jobs", "cancel", str(queued)) == {
        "job_id": queued,
        "status": "cancelled",
    }
    assert value(db_dsn, "SELECT status::text FROM pgqueue.jobs WHERE id = %s", (queued,)) == (
        "cancelled"
    )
    assert run_json(db_dsn, "jobs", "cancel", str(running)) == {
        "job_id": running,
        "status": "running",
    }
    assert value(db_dsn, "SELECT cancel_requested FROM pgqueue.jobs WHERE id = %s", (running,))

    replayed = run_json(
        db_dsn, "jobs", "replay", str(queued), "--queue", "again", "--run-at", "2099-01-01"
    )
    assert replayed["replayed_from"] == queued
    copy = rows(
        db_dsn,
        "SELECT task, queue, status::text, run_at FROM pgqueue.jobs WHERE id = %s",
        (replayed["job_id"],),
    )[0]
    assert copy[:3] == ("t", "again", "scheduled")
    assert copy[3].isoformat() == "2099-01-01T00:00:00+00:00"

    explained = run_json(db_dsn, "jobs", "explain", str(replayed["job_id"]))
    assert explained["job_id"] == replayed["job_id"]
    assert "scheduled" in explained["explanation"]
    human = run_cli(db_dsn, "jobs", "explain", str(queued))
    assert human.returncode == 0
    assert "cancelled" in human.stdout


# --- dead letters -------------------------------------------------------------------


def test_dlq_list_and_requeue_by_ids(db_dsn: str, job_factory: JobFactory) -> None:
    dead = [
        job_factory.insert(queue="mail", status="dead", attempts=5, max_attempts=5)
        for _ in range(3)
    ]
    job_factory.insert(queue="mail", status="succeeded")

    listed = run_json(db_dsn, "dlq", "list")
    assert sorted(j["id"] for j in listed["jobs"]) == dead

    out = run_json(db_dsn, "dlq", "requeue", str(dead[0]), str(dead[1]))
    assert out == {"requeued": 2, "job_ids": dead[:2]}
    after = dict(
        rows(db_dsn, "SELECT id, status::text FROM pgqueue.jobs WHERE id = ANY(%s)", (dead,))
    )
    assert after == {dead[0]: "queued", dead[1]: "queued", dead[2]: "dead"}
    # Out of attempts: one more is granted, so the requeued job can run.
    assert value(db_dsn, "SELECT max_attempts FROM pgqueue.jobs WHERE id = %s", (dead[0],)) == 6


def test_dlq_requeue_all_with_filters_in_batches(db_dsn: str, job_factory: JobFactory) -> None:
    wanted = [job_factory.insert(queue="mail", task="send", status="dead") for _ in range(7)]
    other_task = job_factory.insert(queue="mail", task="other", status="dead")
    other_queue = job_factory.insert(queue="sms", task="send", status="dead")

    out = run_json(
        db_dsn,
        "dlq",
        "requeue",
        "--all",
        "--queue",
        "mail",
        "--task",
        "send",
        "--batch-size",
        "3",
        "--progress",
    )
    assert out["requeued"] == 7
    assert sorted(out["job_ids"]) == wanted
    still_dead = rows(db_dsn, "SELECT id FROM pgqueue.jobs WHERE status = 'dead' ORDER BY id")
    assert [r[0] for r in still_dead] == [other_task, other_queue]

    human = run_cli(db_dsn, "dlq", "requeue", "--all")
    assert human.returncode == 0
    assert human.stdout.strip() == "requeued 2 dead jobs"
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE status = 'dead'") == 0


# --- queues ----------------------------------------------------------------------------


def test_queue_pause_resume_and_limits(db_dsn: str) -> None:
    def stored() -> tuple[object, ...]:
        return rows(
            db_dsn,
            "SELECT paused, concurrency_limit, rate_limit, extract(epoch FROM rate_period)::int"
            " FROM pgqueue.queues WHERE name = 'mail'",
        )[0]

    assert run_json(db_dsn, "queue", "pause", "mail", "--create") == {
        "queue": "mail",
        "paused": True,
        "concurrency_limit": None,
        "rate_limit": None,
    }
    assert stored() == (True, None, None, None)

    out = run_json(db_dsn, "queue", "limit", "mail", "--concurrency", "5")
    assert (out["concurrency_limit"], out["rate_limit"]) == (5, None)
    # A second limit keeps the first one.
    out = run_json(db_dsn, "queue", "limit", "mail", "--rate", "10/s")
    assert (out["paused"], out["concurrency_limit"], out["rate_limit"]) == (True, 5, "10/1s")
    assert stored() == (True, 5, 10, 1)
    assert run_json(db_dsn, "queue", "limit", "mail") == out  # no options: show

    out = run_json(db_dsn, "queue", "limit", "mail", "--clear", "--rate", "100/1m")
    assert (out["concurrency_limit"], out["rate_limit"]) == (None, "100/1m")
    assert stored() == (True, None, 100, 60)

    resumed = run_cli(db_dsn, "queue", "resume", "mail")
    assert resumed.returncode == 0
    assert "resumed" in resumed.stdout
    assert stored()[0] is False


# --- maintenance ---------------------------------------------------------------------------


def test_reap_reclaims_expired_leases(db_dsn: str, job_factory: JobFactory) -> None:
    expired = job_factory.insert(status="running", lease_expires_at=-30.0)
    alive = job_factory.insert(status="running", lease_expires_at=600.0)

    assert run_json(db_dsn, "reap") == {"reaped": 1}
    states = dict(rows(db_dsn, "SELECT id, status::text FROM pgqueue.jobs"))
    assert states[expired] in ("queued", "scheduled")
    assert states[alive] == "running"
    assert (
        value(
            db_dsn, "SELECT outcome::text FROM pgqueue.job_attempts WHERE job_id = %s", (expired,)
        )
        == "lease_expired"
    )


def test_archive_and_prune(db_dsn: str, job_factory: JobFactory) -> None:
    old_ok = [job_factory.insert(status="succeeded", finished_at=-9 * 86400.0) for _ in range(3)]
    old_dead = job_factory.insert(status="dead", finished_at=-9 * 86400.0)
    job_factory.insert_attempt(old_dead, finished_at=-9 * 86400.0, started_at=-9 * 86400.0 - 1)
    recent = job_factory.insert(status="succeeded", finished_at=-3600.0)

    assert run_json(db_dsn, "archive", "--older-than", "7d") == {"archived": 3}
    archived = rows(db_dsn, "SELECT id FROM pgqueue.jobs_archive ORDER BY id")
    assert [r[0] for r in archived] == old_ok
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE id = %s", (recent,)) == 1

    out = run_cli(db_dsn, "archive", "--older-than", "P7D", "--status", "dead,cancelled")
    assert out.returncode == 0
    assert out.stdout.startswith("archived 1 job")
    # Archived jobs stay visible to `jobs show`.
    assert run_json(db_dsn, "jobs", "show", str(old_dead))["status"] == "dead"

    assert run_json(db_dsn, "prune", "--older-than", "8d", "--limit", "1") == {
        "pruned": 1,
        "attempts": 1,
        "archived_jobs": 0,
    }
    quiet = run_cli(db_dsn, "prune", "--older-than", "8d", "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 0
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs") == 1  # the recent one


def test_maintenance_vacuums_every_queue_table(db_dsn: str, job_factory: JobFactory) -> None:
    job_factory.insert_many(200, status="succeeded", finished=True)
    rows(db_dsn, "DELETE FROM pgqueue.jobs RETURNING 1")

    tables = run_json(db_dsn, "maintenance")
    names = {t["table"] for t in tables}
    assert {"jobs", "job_attempts", "jobs_archive", "queues", "workers"} <= names
    jobs = next(t for t in tables if t["table"] == "jobs")
    assert set(jobs) == {
        "table",
        "live_tuples",
        "dead_tuples_before",
        "dead_tuples_after",
        "total_bytes",
    }
    assert jobs["dead_tuples_after"] == 0
    last_vacuum = value(
        db_dsn,
        "SELECT last_vacuum FROM pg_stat_user_tables WHERE schemaname = 'pgqueue'"
        " AND relname = 'jobs_live'",
    )
    assert last_vacuum is not None

    human = run_cli(db_dsn, "maintenance")
    assert human.returncode == 0
    assert "dead before" in human.stdout


# --- check -----------------------------------------------------------------------------------


def test_check_healthy_then_each_problem_fails_it(db_dsn: str, job_factory: JobFactory) -> None:
    healthy = run_cli(db_dsn, "check")
    assert healthy.returncode == 0, healthy.stdout
    assert healthy.stdout.strip().endswith("healthy")

    stuck = job_factory.insert(status="running", lease_expires_at=-5.0, worker_id="w-gone")
    rows(
        db_dsn,
        "INSERT INTO pgqueue.workers (id, host, pid, concurrency, last_heartbeat_at)"
        " VALUES ('w-gone', 'h1', 4242, 1, now() - interval '5 minutes'),"
        "        ('w-alive', 'h2', 4343, 1, now()) RETURNING 1",
    )
    job_factory.insert(queue="slow", run_at=-1800.0)

    failed = run_cli(db_dsn, "check", "--json", "--max-ready-age", "10m")
    assert failed.returncode == 1
    report = json.loads(failed.stdout)
    assert report["ok"] is False
    verdicts = {c["name"]: c["ok"] for c in report["checks"]}
    assert verdicts == {
        "connection": True,
        "clock_skew": True,
        "schema": True,
        "stuck_jobs": False,
        "dead_workers": False,
        "queue_backlog": False,
    }
    assert (report["stuck_jobs"], report["stuck_job_ids"]) == (1, [stuck])
    assert [w["id"] for w in report["dead_workers"]] == ["w-gone"]
    assert list(report["backlogged_queues"]) == ["slow"]
    assert report["backlogged_queues"]["slow"] >= 1800

    # A generous threshold clears the backlog verdict; --quiet prints nothing.
    lenient = run_cli(db_dsn, "check", "--max-ready-age", "1h", "--quiet")
    assert (lenient.returncode, lenient.stdout) == (1, "")
    human = run_cli(db_dsn, "check", "--max-ready-age", "1h")
    assert "FAIL stuck_jobs" in human.stdout
    assert "ok   queue_backlog" in human.stdout
