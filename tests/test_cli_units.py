"""The CLI's pieces that need no database: help texts, JSON encoding, parsing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pgqueue_cli import output, parsing
from pgqueue_cli.main import app

import pgqueue
from tests.cli_support import invoke

COMMANDS = [
    ("enqueue",),
    ("status",),
    ("jobs", "list"),
    ("jobs", "show"),
    ("jobs", "cancel"),
    ("jobs", "replay"),
    ("jobs", "explain"),
    ("dlq", "list"),
    ("dlq", "requeue"),
    ("queue", "pause"),
    ("queue", "resume"),
    ("queue", "limit"),
    ("reap",),
    ("archive",),
    ("prune",),
    ("maintenance",),
    ("check",),
    ("migrate",),
    ("worker",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples(command: tuple[str, ...]) -> None:
    result = invoke(None, *command, "--help")
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.stdout
    assert f"pgqueue {command[0]}" in result.stdout


def test_every_command_is_listed() -> None:
    result = invoke(None, "--help")
    listed = {name for name, *_ in COMMANDS}
    for name in listed:
        assert name in result.stdout
    assert result.exit_code == 0
    assert app.info.name == "pgqueue"


def test_version_flag() -> None:
    result = invoke(None, "--version")
    assert (result.exit_code, result.stdout) == (0, f"pgqueue {pgqueue.__version__}\n")


def test_json_uses_the_field_names_of_the_public_types() -> None:
    when = datetime(2026, 12, 24, 18, 0, tzinfo=UTC)
    job = pgqueue.Job(
        id=1,
        queue="q",
        task="t",
        payload={"a": [1, 2]},
        priority=0,
        status=pgqueue.JobStatus.SCHEDULED,
        run_at=when,
        attempts=0,
        max_attempts=5,
        dedup_key=None,
        serial_key=None,
        created_at=when,
        finished_at=None,
        last_error=None,
        result={"ok": True},
        attempt_history=[
            pgqueue.Attempt(
                attempt=1,
                attempt_id=9,
                worker_id="w",
                started_at=when,
                finished_at=when + timedelta(seconds=1),
                outcome=pgqueue.AttemptOutcome.RETRY,
                error_code="E",
                error_message="m",
                traceback=None,
                latency_ms=1000.0,
            )
        ],
    )
    encoded = json.loads(json.dumps(output.to_jsonable(job)))
    assert encoded["status"] == "scheduled"
    assert encoded["run_at"] == "2026-12-24T18:00:00+00:00"
    assert encoded["attempt_history"][0]["outcome"] == "retry"
    assert encoded["payload"] == {"a": [1, 2]}
    assert output.to_jsonable(pgqueue.Enqueued(3, False)) == {"job_id": 3, "created": False}
    assert output.to_jsonable(timedelta(minutes=1)) == 60.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("7d", 604800), ("1h30m", 5400), ("PT15M", 900), ("P7D", 604800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parsing.duration("--x", text).total_seconds() == seconds


def test_bad_values_name_the_option() -> None:
    with pytest.raises(pgqueue.InvalidDuration, match=r"^--older-than: not a duration"):
        parsing.duration("--older-than", "7 days")
    with pytest.raises(pgqueue.InvalidDuration, match=r"^--run-at: not an ISO-8601 time"):
        parsing.moment("--run-at", "noon")
    with pytest.raises(pgqueue.InvalidPayload, match="stdin line 2 must be a JSON object"):
        parsing.json_lines(['{"a": 1}', "3"], "stdin")


def test_times_without_zone_are_utc() -> None:
    assert parsing.moment("--run-at", "2026-12-24T18:00:00") == datetime(
        2026, 12, 24, 18, tzinfo=UTC
    )
    assert parsing.moment("--run-at", None) is None


def test_statuses_list() -> None:
    assert parsing.csv(" succeeded, dead ,,cancelled") == ["succeeded", "dead", "cancelled"]


def test_progress_only_on_a_terminal_unless_asked() -> None:
    assert output.progress_wanted(True, quiet=False, as_json=False)
    assert not output.progress_wanted(False, quiet=False, as_json=False)
    assert not output.progress_wanted(None, quiet=True, as_json=False)
    assert not output.progress_wanted(None, quiet=False, as_json=True)
    advanced: list[int] = []
    with output.progress("x", 10, False) as advance:
        advance(3)
        advanced.append(3)
    assert advanced == [3]
