"""What a newcomer trips over: durations without units, silent
check --quiet, wrapped pipes, vague migrate output, --app paths, and the
worker's global options."""

from __future__ import annotations

import signal
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
import pgqueue.cron
from pgqueue.durations import parse_duration
from pgqueue.version import SCHEMA_REVISION
from tests.cli_support import assert_one_line_error, invoke
from tests.fixtures.workers import Workers

# --- durations (items 2 and 10) ---------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("archive", "--older-than", "7"),
        ("prune", "--older-than", "30"),
        ("check", "--max-ready-age", "300"),
        ("status", "--watch", "--interval", "2"),
        ("worker", "--app", "x:app", "--shutdown-timeout", "30"),
        ("worker", "--app", "x:app", "--poll-interval", "2"),
    ],
    ids=lambda a: " ".join(a[:1] + a[-2:-1]),
)
def test_a_bare_number_is_refused_where_a_duration_is_expected(args: tuple[str, ...]) -> None:
    result = invoke("postgresql://nobody@127.0.0.1:1/none", *args)
    assert_one_line_error(result, "needs a unit", f"{args[-1]}s", f"{args[-1]}d")


@pytest.mark.parametrize("text", ["99999999d", "P999999999D", "36501d"])
def test_a_huge_duration_gets_a_clear_error(text: str) -> None:
    result = invoke("postgresql://nobody@127.0.0.1:1/none", "prune", "--older-than", text)
    assert_one_line_error(result, "--older-than: duration too long", "36500d")


def test_worker_time_options_take_durations() -> None:
    # Parsed before the App is loaded: the error is about the App, not the durations.
    result = invoke(None, "worker", "--app", "no_such_module_x:app", "--shutdown-timeout", "30s")
    assert_one_line_error(result, "no module named 'no_such_module_x'")


def test_python_api_takes_the_same_durations(app: pgqueue.App) -> None:
    job = app.enqueue("t", delay="5m")
    row = app.get_job(job.job_id)
    assert row.status is pgqueue.JobStatus.SCHEDULED
    assert timedelta(minutes=4) < row.run_at - row.created_at <= timedelta(minutes=5, seconds=1)
    assert pgqueue.Retry("1m").delay == 60
    with pytest.raises(pgqueue.InvalidDuration, match="delay: duration '5' needs a unit"):
        app.enqueue("t", delay="5")
    with pytest.raises(pgqueue.InvalidDuration, match="too long"):
        app.enqueue("t", delay=1e12)
    task = app.task(lease_seconds="2m", timeout="30s")(lambda: None)
    assert (task.lease_seconds, task.timeout) == (120, 30)


def test_numbers_stay_seconds_in_python() -> None:
    assert parse_duration(30) == timedelta(seconds=30)
    with pytest.raises(pgqueue.InvalidDuration, match="needs a unit"):
        parse_duration("30")


# --- check --quiet (item 4) ---------------------------------------------------


def test_check_quiet_says_why_it_fails() -> None:
    done = invoke("postgresql://nobody@127.0.0.1:1/none", "check", "--quiet")
    assert done.exit_code == 1
    assert done.stdout == ""
    assert "error: connection:" in done.stderr or "error: " in done.stderr
    assert "127.0.0.1:1/none" in done.stderr


def test_check_quiet_prints_nothing_when_healthy(db_dsn: str) -> None:
    done = invoke(db_dsn, "check", "--quiet")
    assert (done.exit_code, done.stdout, done.stderr) == (0, "", "")


# --- piped output (item 11) ---------------------------------------------------


def test_piped_tables_are_never_wrapped(
    db_dsn: str, app: pgqueue.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = "q" * 120
    app.enqueue("a_task_with_a_rather_long_name_" + "x" * 60, {"k": "v" * 150}, queue=queue)
    monkeypatch.setenv("COLUMNS", "60")
    for args in (("status",), ("jobs", "list")):
        done = invoke(db_dsn, *args)
        assert done.exit_code == 0, done.stderr
        rows = [line for line in done.stdout.splitlines() if queue in line]
        assert len(rows) == 1, done.stdout
        assert "x" * 60 in rows[0] or args == ("status",)


# --- migrate says what it applied (item 12) -----------------------------------


def test_migrate_says_what_it_did(empty_db_dsn: str) -> None:
    first = invoke(empty_db_dsn, "--schema", "fresh", "migrate")
    assert first.exit_code == 0, first.stderr
    assert first.stdout.strip() == f'created schema "fresh": 0001 → {SCHEMA_REVISION}'
    again = invoke(empty_db_dsn, "--schema", "fresh", "migrate")
    assert again.stdout.strip() == (
        f'schema "fresh" is up to date (revision {SCHEMA_REVISION}): nothing applied'
    )


def test_unmigrated_schema_error_names_the_database(empty_db_dsn: str) -> None:
    done = invoke(empty_db_dsn, "status")
    assert_one_line_error(done, "not migrated", "127.0.0.1:", empty_db_dsn.rsplit("/", 1)[1])


# --- --app paths (item 14) -----------------------------------------------------


def _module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_app_given_as_a_file_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgqueue_cli.apps import load_app

    path = _module(tmp_path, "filetasks_a", "import pgqueue\napp = pgqueue.App(schema='fa')\n")
    monkeypatch.chdir(tmp_path)
    assert load_app("./filetasks_a.py:app").schema == "fa"
    assert load_app(f"{path}:app").schema == "fa"


def test_app_path_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(tmp_path, "filetasks_b", "import pgqueue\nmain = pgqueue.App()\nhelper = len\n")
    monkeypatch.chdir(tmp_path)
    missing = invoke(None, "worker", "--app", "filetasks_b:nope")
    assert_one_line_error(missing, "has no attribute 'nope'", "filetasks_b:main")
    wrong = invoke(None, "worker", "--app", "filetasks_b:helper")
    assert_one_line_error(wrong, "'helper' is a builtin_function_or_method, not a pgqueue.App")
    nofile = invoke(None, "worker", "--app", "./nowhere.py:app")
    assert_one_line_error(nofile, "no such file")


def test_an_import_error_in_the_users_module_is_framed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "filetasks_c", "import pgqueue\nx = 1 / 0\n")
    monkeypatch.chdir(tmp_path)
    result = invoke(None, "worker", "--app", "filetasks_c:app")
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[-1] == (
        "error: error while importing filetasks_c: ZeroDivisionError: division by zero"
    )
    assert "filetasks_c.py" in result.stderr  # the user's own frame is shown
    assert "importlib" not in result.stderr
    assert len(lines) < 8


# --- the worker and the global options (#12 item 3) ---------------------------


def test_worker_refuses_a_schema_the_app_does_not_use(tmp_path: Path) -> None:
    path = _module(tmp_path, "filetasks_d", "import pgqueue\napp = pgqueue.App(schema='mine')\n")
    result = invoke(None, "--schema", "other", "worker", "--app", f"{path}:app")
    assert_one_line_error(result, "--schema 'other' differs from the App's schema 'mine'")


def test_worker_serves_the_apps_own_dsn_despite_pgqueue_dsn(
    workers: Workers, db_dsn: str, tmp_path: Path
) -> None:
    path = _module(
        tmp_path,
        "filetasks_e",
        "import os, pgqueue\napp = pgqueue.App(dsn=os.environ['REAL_DSN'])\n",
    )
    worker = workers.spawn(
        app=f"{path}:app",
        dsn="postgresql://nobody@127.0.0.1:1/elsewhere",
        env={"REAL_DSN": db_dsn},
    )
    started = worker.wait_logged("worker started", timeout=30)
    assert started["schema"] == "pgqueue"
    assert started["database"].endswith("/" + db_dsn.rsplit("/", 1)[1])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
    assert worker.logged("press Ctrl-C again to force")


def test_dsn_on_the_command_line_is_what_an_app_without_dsn_uses(
    workers: Workers, db_dsn: str, tmp_path: Path
) -> None:
    path = _module(tmp_path, "filetasks_f", "import pgqueue\napp = pgqueue.App()\n")
    worker = workers.spawn(
        command=[
            *__import__("tests.fixtures.workers", fromlist=["x"]).pgqueue_command(),
            "--dsn",
            db_dsn,
            "worker",
            "--app",
            f"{path}:app",
            "--log-format",
            "json",
        ],
        dsn="postgresql://nobody@127.0.0.1:1/elsewhere",
    )
    started = worker.wait_logged("worker started", timeout=30)
    assert started["database"].endswith("/" + db_dsn.rsplit("/", 1)[1])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0


# --- help and error wording (items 15 and 16) -----------------------------------------


def _all_commands() -> list[tuple[str, ...]]:
    import typer.main
    from pgqueue_cli.main import app as cli_app

    found: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                walk(child, (*path, name))
        else:
            found.append(path)

    walk(typer.main.get_command(cli_app), ())
    return found


def test_every_command_has_an_example_and_no_python_types_in_help() -> None:
    commands = _all_commands()
    assert ("uninstall",) in commands
    assert ("queue", "purge") in commands
    for command in commands:
        result = invoke(None, *command, "--help")
        assert result.exit_code == 0, (command, result.output)
        text = result.stdout
        assert "Examples:" in text, command
        examples = text.split("Examples:", 1)[1]
        assert "pgqueue " in examples, command
        assert f" {command[-1]}" in examples, command
        for python_type in ("<bool>", "<str>", "<int>", "<float>", "list[", "{"):
            usage = text.split("\n\n", 2)[1] if python_type == "{" else text
            assert python_type not in usage, (command, python_type, usage)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("enqueue", "t", "--delay", "10s", "--run-at", "2099-01-01"), "give --run-at or --delay"),
        (("worker", "--app", "x:app", "--log-format", "yaml"), "--log-format must be auto"),
        (("worker", "--app", "x:app", "--log-level", "loud"), "--log-level must be one of"),
    ],
)
def test_cli_errors_name_flags(args: tuple[str, ...], message: str) -> None:
    assert_one_line_error(invoke("postgresql://nobody@127.0.0.1:1/none", *args), message)


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("61 * * * *", "minute field '61': 61 is out of range 0-59"),
        ("0 24 * * *", "hour field '24': 24 is out of range 0-23"),
        ("0 0 * 13 *", "month field '13': 13 is out of range 1-12"),
        ("*/0 * * * *", "step '0' must be a whole number of at least 1"),
        ("0 0 31 2 *", "it never fires"),
        ("* * * * * * *", "it has 7 fields; use 5"),
        ("5-1 * * * *", "range '5-1' goes backwards"),
        ("0 0 * * funday", "'funday' is not a number or a name (sun..sat)"),
    ],
)
def test_cron_errors_say_which_field_and_why(cron: str, message: str) -> None:
    with pytest.raises(pgqueue.InvalidCron) as caught:
        pgqueue.cron.Cron.parse(cron)
    assert message in str(caught.value)
    for croniter_words in ("not acceptable", "Exactly", "failed to find next date"):
        assert croniter_words not in str(caught.value)


# --- grant --sql offline (item 13) ---------------------------------------------------------


def test_grant_sql_needs_no_database_nor_role() -> None:
    result = invoke(
        "postgresql://nobody@127.0.0.1:1/none",
        "--schema",
        "jobs",
        "grant",
        "--role",
        "not_created_yet",
        "--worker",
        "--sql",
    )
    assert result.exit_code == 0, result.output
    assert 'GRANT USAGE ON SCHEMA "jobs" TO "not_created_yet";' in result.stdout
    assert "lease_jobs" in result.stdout
    admin = invoke(None, "grant", "--role", "ops", "--admin", "--sql", "--owner", "app_owner")
    assert 'GRANT "app_owner" TO "ops";' in admin.stdout
    hint = invoke(None, "grant", "--role", "ops", "--admin", "--sql")
    assert "pass --owner" in hint.stdout


def test_grant_sql_offline_matches_the_online_statements(db_dsn: str) -> None:
    from pgqueue import grants

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS pgq_offline_worker")
        conn.execute("CREATE ROLE pgq_offline_worker")
    try:
        online = grants.grant("pgq_offline_worker", "worker", dsn=db_dsn, dry_run=True)
        offline = grants.grant_sql("pgq_offline_worker", "worker")
        assert [s for s in offline if not s.startswith("--")] == [
            s for s in online if not s.startswith("--")
        ]
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DROP ROLE pgq_offline_worker")
