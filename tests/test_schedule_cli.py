"""``pgqueue schedule ...`` through the installed console script (a subprocess,
as operators and cron run it), checked against the database."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pgqueue
from tests.cli_support import assert_one_line_error, invoke, run_cli, run_json
from tests.fixtures.dbstate import snapshot


def test_schedule_round_trip(db_dsn: str) -> None:
    added = run_json(
        db_dsn,
        *("schedule", "add", "nightly", "--cron", "30 2 * * *", "--task", "report"),
        *("--payload", '{"kind": "daily"}', "--queue", "reports", "--tz", "Europe/Berlin"),
        *("--priority", "4", "--max-attempts", "2"),
    )
    assert {k: added[k] for k in ("name", "cron", "timezone", "task", "queue", "payload")} == {
        "name": "nightly",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "task": "report",
        "queue": "reports",
        "payload": {"kind": "daily"},
    }
    assert (added["priority"], added["max_attempts"], added["enabled"]) == (4, 2, True)
    next_utc = datetime.fromisoformat(added["next_fire_at"])
    next_local = datetime.fromisoformat(added["next_fire_at_local"])
    assert next_utc == next_local
    assert next_local.utcoffset() == next_utc.astimezone(ZoneInfo("Europe/Berlin")).utcoffset()

    with pgqueue.App(dsn=db_dsn) as app:
        stored = app.get_schedule("nightly")
    assert stored.next_fire_at == next_utc
    assert stored.payload == {"kind": "daily"}

    listed = run_json(db_dsn, "schedule", "list")
    assert [s["name"] for s in listed] == ["nightly"]
    assert listed[0]["next_fire_at_local"] == added["next_fire_at_local"]

    table = run_cli(db_dsn, "schedule", "list")
    assert table.returncode == 0, table.stderr
    assert "nightly" in table.stdout
    assert "Europe/Berlin" in table.stdout
    assert next_utc.strftime("%Y-%m-%d %H:%M:%S") in table.stdout  # UTC
    assert next_local.strftime("%Y-%m-%d %H:%M:%S") in table.stdout  # local

    disabled = run_json(db_dsn, "schedule", "disable", "nightly")
    assert (disabled["enabled"], disabled["next_fire_at"]) == (False, None)
    enabled = run_json(db_dsn, "schedule", "enable", "nightly")
    assert enabled["enabled"] is True
    assert enabled["next_fire_at"] is not None

    ran = run_json(db_dsn, "schedule", "run", "nightly")
    assert ran["created"] is True
    with pgqueue.App(dsn=db_dsn) as app:
        job = app.get_job(ran["job_id"])
        assert (job.task, job.queue, job.payload, job.priority) == (
            "report",
            "reports",
            {"kind": "daily"},
            4,
        )
        assert app.get_schedule("nightly").last_job_id == ran["job_id"]

    assert run_json(db_dsn, "schedule", "remove", "nightly") == {"removed": "nightly"}
    assert run_json(db_dsn, "schedule", "list") == []


def test_add_refuses_an_existing_name_unless_replace(db_dsn: str) -> None:
    run_json(db_dsn, "schedule", "add", "s", "--cron", "* * * * *", "--task", "a")
    before = snapshot(db_dsn)
    refused = run_cli(db_dsn, "schedule", "add", "s", "--cron", "0 * * * *", "--task", "b")
    assert_one_line_error(refused, "'s' already exists", "--replace")
    assert snapshot(db_dsn) == before
    replaced = run_json(
        db_dsn, "schedule", "add", "s", "--cron", "0 * * * *", "--task", "b", "--replace"
    )
    assert (replaced["cron"], replaced["task"]) == ("0 * * * *", "b")


def test_add_disabled_and_six_fields(db_dsn: str) -> None:
    added = run_json(
        db_dsn,
        *("schedule", "add", "fast", "--cron", "* * * * * */10", "--task", "t", "--disabled"),
    )
    assert (added["enabled"], added["next_fire_at"], added["cron"]) == (
        False,
        None,
        "* * * * * */10",
    )
    human = run_cli(db_dsn, "schedule", "add", "fast2", "--cron", "* * * * * */10", "--task", "t")
    assert human.returncode == 0, human.stderr
    assert "fast2" in human.stdout


def test_bad_input_is_one_line_and_writes_nothing(db_dsn: str) -> None:
    before = snapshot(db_dsn)
    cases = [
        (("add", "s", "--cron", "* * *", "--task", "t"), "cron expression"),
        (("add", "s", "--cron", "* * * * *", "--task", "t", "--tz", "Mars/Base"), "Mars/Base"),
        (("add", "s", "--cron", "* * * * *", "--task", "t", "--payload", "[1]"), "JSON object"),
        (("add", "s", "--cron", "* * * * *", "--task", "t", "--payload", "{x"), "not valid JSON"),
        (("add", "s", "--cron", "* * * * *", "--task", "t", "--queue", "a b"), "queue name"),
        (("enable", "nope"), "'nope'"),
        (("disable", "nope"), "'nope'"),
        (("remove", "nope"), "'nope'"),
        (("run", "nope"), "'nope'"),
    ]
    for args, fragment in cases:  # in-process: the console script is covered above
        assert_one_line_error(invoke(db_dsn, "schedule", *args), fragment)
        assert_one_line_error(invoke(db_dsn, "schedule", *args, "--json"), fragment)
    assert_one_line_error(run_cli(db_dsn, "schedule", "run", "nope"), "'nope'")
    assert snapshot(db_dsn) == before


def test_human_output(db_dsn: str) -> None:
    added = run_cli(
        db_dsn, "schedule", "add", "s", "--cron", "0 3 * * *", "--task", "t", "--tz", "Asia/Tokyo"
    )
    assert added.returncode == 0, added.stderr
    assert "schedule 's' saved" in added.stdout
    assert "JST" in added.stdout
    assert "saved" not in run_cli(db_dsn, "schedule", "disable", "s").stdout
    assert "removed" in run_cli(db_dsn, "schedule", "remove", "s").stdout
    empty = run_cli(db_dsn, "schedule", "list")
    assert empty.returncode == 0
    assert "no schedules" in empty.stderr
