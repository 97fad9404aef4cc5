"""Bad input to the CLI: a one-line error naming the problem, exit code 1, no
traceback, and nothing written (the database snapshot is unchanged).

Most run in-process through CliRunner; a few through the console script to
show that the installed entry point behaves the same."""

from __future__ import annotations

import pytest

from tests.cli_support import assert_one_line_error, invoke, run_cli, value
from tests.fixtures.dbstate import snapshot
from tests.fixtures.factory import JobFactory

pytestmark = pytest.mark.timeout(120)

WRONG_PORT_DSN = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=5"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("archive", "--older-than", "7x"), "--older-than: not a duration: '7x'"),
        (("archive", "--older-than", "-3d"), "--older-than"),
        (("archive", "--older-than", "PT"), "not an ISO-8601 duration"),
        (("prune", "--older-than", "soon"), "--older-than: not a duration"),
        (("enqueue", "t", "--delay", "5 minutes"), "--delay: not a duration"),
        (("enqueue", "t", "--run-at", "tomorrow"), "--run-at: not an ISO-8601 time"),
        (("jobs", "replay", "1", "--run-at", "12/24/2026"), "not an ISO-8601 time"),
        (("status", "--watch", "--interval", "0s"), "--interval must be longer than zero"),
        (("check", "--max-ready-age", "forever"), "--max-ready-age: not a duration"),
        (("check", "--worker-timeout", "1y"), "--worker-timeout: not a duration"),
    ],
)
def test_bad_durations_and_times(db_dsn: str, args: tuple[str, ...], fragment: str) -> None:
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, *args), fragment)
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "show", "424242"),
        ("jobs", "cancel", "424242"),
        ("jobs", "replay", "424242"),
        ("jobs", "explain", "424242"),
        ("dlq", "requeue", "424242"),
    ],
)
def test_unknown_job_ids(db_dsn: str, args: tuple[str, ...]) -> None:
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, *args), "job 424242 does not exist")
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize("text", ["abc", "0", "1.5"])
def test_job_ids_that_are_not_ids(db_dsn: str, text: str) -> None:
    assert_one_line_error(invoke(db_dsn, "jobs", "show", text), "job id must be a positive integer")


def test_requeue_of_many_ids_writes_nothing_when_one_is_wrong(
    db_dsn: str, job_factory: JobFactory
) -> None:
    dead = job_factory.insert(status="dead")
    queued = job_factory.insert()
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, "dlq", "requeue", str(dead), "424242"), "424242")
    assert_one_line_error(
        invoke(db_dsn, "dlq", "requeue", str(dead), str(queued)), f"job {queued} is queued"
    )
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize(
    ("args", "stdin", "fragment"),
    [
        (("--payload", "{bad"), None, "--payload is not valid JSON"),
        (("--payload", "[1, 2]"), None, "--payload must be a JSON object, got an array"),
        (("--payload", '"text"'), None, "must be a JSON object, got a string"),
        (("--payload", "null"), None, "must be a JSON object, got null"),
        (("--payload-file", "/nonexistent/payload.json"), None, "cannot read --payload-file"),
        (("--payload-file", "-"), "{", "the payload on stdin is not valid JSON"),
        (("--batch",), '{"ok": 1}\n{"ok": 2}\n{"broken": \n', "stdin line 3 is not valid JSON"),
        (("--batch",), '{"ok": 1}\n\n[3]\n', "stdin line 3 must be a JSON object"),
        (("--batch", "--payload", "{}"), "{}\n", "--batch reads payloads from stdin"),
        (("--payload", "{}", "--payload-file", "x"), None, "not both"),
        (("--delay", "10s", "--run-at", "2099-01-01"), None, "give --run-at or --delay, not both"),
        (("--queue", "bad queue"), None, "invalid queue name"),
        (("--priority", "99999"), None, "priority must be between"),
    ],
)
def test_malformed_payloads_and_options_write_nothing(
    db_dsn: str, args: tuple[str, ...], stdin: str | None, fragment: str
) -> None:
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, "enqueue", "task", *args, input=stdin), fragment)
    assert snapshot(db_dsn) == before


def test_a_batch_is_all_or_nothing_even_when_a_late_batch_fails(db_dsn: str) -> None:
    # The oversized payload is only seen by the third statement: the two
    # batches before it were already sent, and must roll back with it.
    big = '{"blob": "' + "x" * (2 << 20) + '"}'
    lines = '{"n": 1}\n{"n": 2}\n{"n": 3}\n{"n": 4}\n' + big + "\n"
    before = snapshot(db_dsn)
    result = invoke(db_dsn, "enqueue", "task", "--batch", "--batch-size", "2", input=lines)
    assert_one_line_error(result, "over the")
    after = snapshot(db_dsn)
    # Sequences are not transactional: ids the rolled-back batches drew stay used.
    del before["(sequences)"], after["(sequences)"]
    assert after == before


def test_wrong_dsn(db_dsn: str) -> None:
    for args in (
        ("status",),
        ("jobs", "list"),
        ("enqueue", "t"),
        ("archive", "--older-than", "1d"),
    ):
        assert_one_line_error(invoke(WRONG_PORT_DSN, *args), "PostgreSQL at 127.0.0.1:1/nowhere")
    assert_one_line_error(invoke("no_such_option=1", "status"), "invalid DSN")


def test_wrong_dsn_through_the_console_script() -> None:
    done = run_cli(WRONG_PORT_DSN, "enqueue", "t", "--payload", "{}")
    assert_one_line_error(done, "PostgreSQL at 127.0.0.1:1/nowhere", "Connection refused")

    report = run_cli(WRONG_PORT_DSN, "check", "--json")
    assert report.returncode == 1
    assert '"connection"' in report.stdout
    assert '"ok": false' in report.stdout


def test_unmigrated_schema_says_which_command_fixes_it(empty_db_dsn: str) -> None:
    for args in (("status",), ("jobs", "show", "1"), ("enqueue", "t"), ("maintenance",)):
        assert_one_line_error(invoke(empty_db_dsn, *args), "not migrated", "pgqueue migrate")
    done = run_cli(empty_db_dsn, "archive", "--older-than", "7d")
    assert_one_line_error(done, "not migrated", "pgqueue migrate")
    assert value(empty_db_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgqueue'") == 0


def test_bad_schema_name(db_dsn: str) -> None:
    assert_one_line_error(invoke(db_dsn, "--schema", "Robert'); DROP", "status"), "schema name")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("archive", "--older-than", "1d", "--status", "queued"), "cannot archive status 'queued'"),
        (("archive", "--older-than", "1d", "--status", ","), "at least one status"),
        (("dlq", "requeue"), "give dead job ids or --all"),
        (("dlq", "requeue", "1", "--all"), "give dead job ids or --all"),
        (("dlq", "requeue", "1", "--queue", "q"), "--queue and --task narrow --all"),
        (("queue", "limit", "q", "--rate", "lots"), "invalid rate 'lots'"),
        (("queue", "limit", "q", "--concurrency", "0"), "concurrency must be"),
        (("queue", "pause", "no spaces"), "invalid queue name"),
        (("jobs", "list", "--status", "sleeping"), "unknown status 'sleeping'"),
        (("jobs", "list", "--cursor", "@@@"), "invalid cursor"),
    ],
)
def test_other_rejected_options_write_nothing(
    db_dsn: str, job_factory: JobFactory, args: tuple[str, ...], fragment: str
) -> None:
    job_factory.insert(status="succeeded", finished_at=-3 * 86400.0)
    job_factory.insert(status="dead", finished_at=-3 * 86400.0)
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, *args), fragment)
    assert snapshot(db_dsn) == before


def test_job_state_errors(db_dsn: str, job_factory: JobFactory) -> None:
    finished = job_factory.insert(status="succeeded")
    before = snapshot(db_dsn)
    assert_one_line_error(invoke(db_dsn, "jobs", "cancel", str(finished)), "already finished")
    assert_one_line_error(invoke(db_dsn, "dlq", "requeue", str(finished)), "not dead")
    assert snapshot(db_dsn) == before


def test_usage_errors_keep_exit_code_two(db_dsn: str) -> None:
    # Typer's own usage errors (missing argument, unknown option) exit 2.
    assert invoke(db_dsn, "jobs", "show").exit_code == 2
    assert invoke(db_dsn, "archive").exit_code == 2
    assert invoke(db_dsn, "status", "--bogus").exit_code == 2
